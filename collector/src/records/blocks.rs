//! JSON Lines input as blocks of whole lines, read (and gunzipped) on a
//! thread of their own, for readers that parse the lines of a block in
//! parallel.
//!
//! [`LineBlocks::start`] takes an [`Opened`] input and reads it in blocks of
//! about [`Chunking::block_bytes`], each ending at a line break (a line
//! longer than a block makes its block longer), one block ahead of the
//! consumer. [`Block::chunks`] cuts a block into pieces of about
//! [`Chunking::chunk_bytes`], again at line breaks, each with the number of
//! its first line. A gzip stream that breaks off ends the input after the
//! last complete line, as [`RecordReader`](super::RecordReader) does.

use std::io::{self, Read};
use std::path::PathBuf;
use std::sync::mpsc;
use std::thread;

use super::error::InputError;
use super::input::Opened;

/// How input is cut for parallel parsing: the sizes are targets, a block or
/// chunk always ends at a line break.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunking {
    /// Bytes per block read ahead.
    pub block_bytes: usize,
    /// Bytes per parallel work item within a block.
    pub chunk_bytes: usize,
}

impl Default for Chunking {
    /// Blocks of 2 MiB: each is a fresh buffer, and the allocator serves
    /// buffers of 8 MiB with new mappings every time (page faults and
    /// zeroing: `cpt profile` over a 2.5 GB file took a sixth longer and
    /// twice the memory).
    fn default() -> Self {
        Chunking {
            block_bytes: 2 << 20,
            chunk_bytes: 128 << 10,
        }
    }
}

/// Whole lines of an input.
#[derive(Debug)]
pub struct Block {
    /// The lines, each ending with `\n` except perhaps the input's last.
    pub bytes: Vec<u8>,
    /// The 1-based number of the first line.
    pub first_line: u64,
}

impl Block {
    /// The block cut at line breaks into pieces of about `bytes`, each with
    /// the number of its first line.
    pub fn chunks(&self, bytes: usize) -> Vec<(u64, &[u8])> {
        let mut line = self.first_line;
        self.pieces(bytes)
            .into_iter()
            .map(|(_, piece)| {
                let first = line;
                line += newlines(piece);
                (first, piece)
            })
            .collect()
    }

    /// The block cut at line breaks into pieces of about `bytes`, each with
    /// its offset in the block (no line counted: a reader that numbers the
    /// lines as it parses them counts them once).
    pub fn pieces(&self, bytes: usize) -> Vec<(usize, &[u8])> {
        let bytes = bytes.max(1);
        let mut out = Vec::with_capacity(self.bytes.len() / bytes + 1);
        let mut at = 0;
        let mut rest: &[u8] = &self.bytes;
        while !rest.is_empty() {
            let cut = if rest.len() <= bytes {
                rest.len()
            } else {
                match memchr::memchr(b'\n', &rest[bytes - 1..]) {
                    Some(i) => bytes + i,
                    None => rest.len(),
                }
            };
            let (piece, tail) = rest.split_at(cut);
            out.push((at, piece));
            at += cut;
            rest = tail;
        }
        out
    }
}

/// The number of line breaks in `b`.
pub fn newlines(b: &[u8]) -> u64 {
    memchr::memchr_iter(b'\n', b).count() as u64
}

/// The least read from the input at a time.
const READ_BYTES: usize = 1 << 16;

/// How an input ended.
#[derive(Debug)]
pub enum End {
    /// At its end.
    Done,
    /// The gzip stream broke off after `line` complete lines (the partial
    /// line after them is dropped).
    Truncated {
        /// Complete lines read.
        line: u64,
        /// The decompressor's error.
        error: io::Error,
    },
}

/// The blocks of an input, read on their own thread.
#[derive(Debug)]
pub struct LineBlocks {
    rx: mpsc::Receiver<Result<Block, Result<End, InputError>>>,
    end: Option<Result<End, InputError>>,
    path: PathBuf,
}

impl LineBlocks {
    /// Start reading `input` in blocks of about `block_bytes`.
    pub fn start(input: Opened, block_bytes: usize) -> LineBlocks {
        let (tx, rx) = mpsc::sync_channel(1);
        let path = input.path.clone();
        let spawned = thread::Builder::new()
            .name("cpt-read".into())
            .spawn(move || read_blocks(input, block_bytes.max(1), &tx));
        let end = spawned.err().map(|error| {
            Err(InputError::Read {
                path: path.clone(),
                line: 1,
                error,
            })
        });
        LineBlocks { rx, end, path }
    }

    /// The path read.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// The next block, or `None` once the input has ended (then see
    /// [`LineBlocks::end`]).
    pub fn next_block(&mut self) -> Option<Block> {
        if self.end.is_some() {
            return None;
        }
        match self.rx.recv() {
            Ok(Ok(b)) => Some(b),
            Ok(Err(end)) => {
                self.end = Some(end);
                None
            }
            Err(_) => {
                self.end = Some(Ok(End::Done));
                None
            }
        }
    }

    /// How the input ended, after [`LineBlocks::next_block`] returned `None`.
    ///
    /// # Errors
    ///
    /// An I/O error reading a plain file ([`InputError::Read`]).
    pub fn end(&mut self) -> Result<End, InputError> {
        self.end.take().unwrap_or(Ok(End::Done))
    }
}

fn read_blocks(
    mut input: Opened,
    block_bytes: usize,
    tx: &mpsc::SyncSender<Result<Block, Result<End, InputError>>>,
) {
    let mut carry: Vec<u8> = Vec::new();
    let mut line = 1u64;
    loop {
        let mut block = std::mem::take(&mut carry);
        block.reserve(block_bytes + READ_BYTES);
        let mut eof = false;
        let mut broken = None;
        let mut has_line = memchr::memchr(b'\n', &block).is_some();
        while block.len() < block_bytes || !has_line {
            // Straight into the block (no copy through a buffer); what was
            // read before an error is kept.
            let at = block.len();
            let want = block_bytes.saturating_sub(at).max(READ_BYTES) as u64;
            let read = (&mut input.reader).take(want).read_to_end(&mut block);
            has_line = has_line || memchr::memchr(b'\n', &block[at..]).is_some();
            match read {
                Ok(0) => {
                    eof = true;
                    break;
                }
                Ok(_) => {}
                Err(e) if input.gzip => {
                    broken = Some(e);
                    break;
                }
                Err(error) => {
                    let done = newlines(&block);
                    let _ = tx.send(Err(Err(InputError::Read {
                        path: input.path.clone(),
                        line: line + done,
                        error,
                    })));
                    return;
                }
            }
        }
        // Whole lines go now; the rest waits for more bytes (or, at the end,
        // is the last line; after a break, it is dropped).
        let cut = if eof {
            block.len()
        } else {
            memchr::memrchr(b'\n', &block).map_or(0, |i| i + 1)
        };
        carry = block.split_off(cut);
        let lines = newlines(&block);
        let first = line;
        line += lines;
        if !block.is_empty()
            && tx
                .send(Ok(Block {
                    bytes: block,
                    first_line: first,
                }))
                .is_err()
        {
            return;
        }
        if let Some(error) = broken {
            let _ = tx.send(Err(Ok(End::Truncated {
                line: line - 1,
                error,
            })));
            return;
        }
        if eof {
            let _ = tx.send(Err(Ok(End::Done)));
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufReader;

    fn blocks(text: &[u8], block: usize) -> Vec<Block> {
        let mut b = LineBlocks::start(
            Opened {
                reader: Box::new(BufReader::new(io::Cursor::new(text.to_vec()))),
                gzip: false,
                path: "t".into(),
            },
            block,
        );
        let mut out = Vec::new();
        while let Some(x) = b.next_block() {
            out.push(x);
        }
        assert!(matches!(b.end(), Ok(End::Done)));
        out
    }

    #[test]
    fn blocks_and_chunks_end_at_line_breaks_and_number_their_lines() {
        let text = b"a\nbb\n\nccc\ndddd\ne";
        for size in [1, 2, 3, 5, 100] {
            let got = blocks(text, size);
            let joined: Vec<u8> = got.iter().flat_map(|b| b.bytes.clone()).collect();
            assert_eq!(joined, text, "{size}");
            let mut lines = Vec::new();
            for b in &got {
                for chunk in [1, 4, 1000] {
                    let mut n = 0;
                    for (first, piece) in b.chunks(chunk) {
                        assert!(piece.ends_with(b"\n") || piece.ends_with(b"e"));
                        if chunk == 1 {
                            lines.push((first, piece.to_vec()));
                        }
                        n += piece.len();
                    }
                    assert_eq!(n, b.bytes.len());
                }
            }
            assert_eq!(
                lines,
                vec![
                    (1, b"a\n".to_vec()),
                    (2, b"bb\n".to_vec()),
                    (3, b"\n".to_vec()),
                    (4, b"ccc\n".to_vec()),
                    (5, b"dddd\n".to_vec()),
                    (6, b"e".to_vec()),
                ],
                "{size}"
            );
        }
    }
}
