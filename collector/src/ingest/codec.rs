//! The server's tonic codec for the ingest messages (`cpt_exporter::proto`):
//! answers are encoded with prost, received batches are passed through as
//! bytes and decoded off the async workers, where a malformed batch (the
//! client's fault) is `INVALID_ARGUMENT` with prost's message naming the
//! field, rather than tonic-prost's `INTERNAL`.

use std::io;
use std::marker::PhantomData;

use bytes::Buf;
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

/// Encodes `E` (the server's answers).
#[derive(Debug)]
pub(crate) struct WireEncoder<E>(PhantomData<fn(E)>);

impl<E: prost::Message> Encoder for WireEncoder<E> {
    type Item = E;
    type Error = Status;

    fn encode(&mut self, item: E, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.reserve(item.encoded_len());
        item.encode(dst)
            .map_err(|e| Status::internal(format!("encoding failed: {e}")))
    }
}

/// Encodes `E`; passes each received message's bytes through undecoded, so
/// the server decodes them off the async workers, under its limits, and
/// counts what it rejects.
#[derive(Debug)]
pub(crate) struct RawCodec<E>(PhantomData<fn(E)>);

impl<E> Default for RawCodec<E> {
    fn default() -> Self {
        RawCodec(PhantomData)
    }
}

impl<E: prost::Message + Send + 'static> Codec for RawCodec<E> {
    type Encode = E;
    type Decode = bytes::Bytes;
    type Encoder = WireEncoder<E>;
    type Decoder = RawDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        WireEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawDecoder
    }
}

#[derive(Debug)]
pub(crate) struct RawDecoder;

impl Decoder for RawDecoder {
    type Item = bytes::Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<bytes::Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

// Encoder/Decoder need `Error: From<io::Error>`; Status has it.
const _: fn(io::Error) -> Status = Status::from;
