//! The protobuf messages of the wire form, written by hand for prost (no
//! `protoc` needed). The equivalent `.proto`:
//!
//! ```proto
//! syntax = "proto3";
//! package cpt.path.v1;
//!
//! message Path {
//!   uint32 version = 1;                    // codec::SINGLE_VERSION, or VERSION (2) when split
//!   repeated string strings = 2;           // string table
//!   // Frame tree, one entry per distinct stack prefix, parents first.
//!   repeated uint32 tree_parent = 3;       // 0: a root; d >= 1: entry i - d
//!   repeated uint32 tree_service = 4;      // string index
//!   repeated uint32 tree_name = 5;         // string index
//!   repeated uint32 tree_file = 6;         // 0: no location; else string index + 1
//!   repeated uint32 tree_line = 7;         // 0 when tree_file is 0
//!   // Segments in critical-path order.
//!   repeated uint32 segment_entry_kind = 8; // (entry ref << 3) | kind; ref 0: empty stack, else entry + 1
//!   repeated uint64 segment_duration_nanos = 9;
//!   Accounting accounting = 10;
//!   // Split form (version 2) only, in the segments message: the
//!   // fingerprint of the frame dictionary it refers to.
//!   fixed64 frames_fingerprint = 11;
//!   // Named waits: indices of the segments (ascending) whose kind is
//!   // unattributed (2) on the wire and whose leaf frame names what the
//!   // node waited on. A decoder that does not know this field reads them
//!   // as unattributed waits whose leaf is the wait frame.
//!   repeated uint32 segment_wait = 12;
//! }
//!
//! message Accounting {
//!   uint64 network_nanos = 1;
//!   uint64 overcount_nanos = 2;
//!   uint64 blind_spot_nanos = 3;
//!   uint64 unattributed_nanos = 4;
//!   uint64 queueing_nanos = 5;
//!   uint64 truncated_nanos = 6;
//!   uint64 clock_skew_nanos = 7;
//! }
//! ```
//!
//! Repeated scalars are packed (proto3's default), so each column costs one
//! tag and one length, not one per element. `tree_file` and `tree_line` are
//! either both empty (no entry has a location) or as long as `tree_parent`.
//!
//! The split form (version 2) writes the same message as two: the frame
//! dictionary (fields 1–7) and the segments (fields 1 and 8–11).
//!
//! `PathProto` is the message as prost derives it (the tests build hostile
//! messages with it). The codec itself reads into [`PathIn`] and writes from
//! [`PathOut`]: the same fields with the same protobuf semantics, but strings
//! read straight into the `Arc<str>` the decoded frames share and written
//! from the frames' own `&str`, columns sized before they are filled, and
//! the encoded length computed once. The golden tests (`tests/golden.rs`) check
//! that the bytes written and the paths and errors read never change.

use std::sync::Arc;
use std::time::Duration;

use prost::DecodeError;
use prost::bytes::{Buf, BufMut};
use prost::encoding::{
    DecodeContext, WireType, check_wire_type, decode_key, encoded_len_varint, fixed64, key_len,
    message, skip_field, string, uint32, uint64,
};

/// One critical path on the wire. The codec reads [`PathIn`] and writes
/// [`PathOut`]; this derived form is the reference they are tested against.
#[cfg(test)]
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct PathProto {
    /// `super::SINGLE_VERSION`, or `super::VERSION` in the split form.
    #[prost(uint32, tag = "1")]
    pub(crate) version: u32,
    /// The string table.
    #[prost(string, repeated, tag = "2")]
    pub(crate) strings: Vec<String>,
    /// Per tree entry: 0 for a root, else the distance back to its parent.
    #[prost(uint32, repeated, tag = "3")]
    pub(crate) tree_parent: Vec<u32>,
    /// Per tree entry: string index of the frame's service.
    #[prost(uint32, repeated, tag = "4")]
    pub(crate) tree_service: Vec<u32>,
    /// Per tree entry: string index of the frame's name.
    #[prost(uint32, repeated, tag = "5")]
    pub(crate) tree_name: Vec<u32>,
    /// Per tree entry: 0 for no location, else string index + 1 of the file.
    #[prost(uint32, repeated, tag = "6")]
    pub(crate) tree_file: Vec<u32>,
    /// Per tree entry: the location's line (0 without a location).
    #[prost(uint32, repeated, tag = "7")]
    pub(crate) tree_line: Vec<u32>,
    /// Per segment: `(entry ref << 3) | kind`.
    #[prost(uint32, repeated, tag = "8")]
    pub(crate) segment_entry_kind: Vec<u32>,
    /// Per segment: its duration in nanoseconds (never zero).
    #[prost(uint64, repeated, tag = "9")]
    pub(crate) segment_duration_nanos: Vec<u64>,
    /// The path's accounting.
    #[prost(message, optional, tag = "10")]
    pub(crate) accounting: Option<AccountingProto>,
    /// Split form only: the fingerprint of the frame dictionary.
    #[prost(fixed64, optional, tag = "11")]
    pub(crate) frames_fingerprint: Option<u64>,
    /// Indices of the named-wait segments, ascending.
    #[prost(uint32, repeated, tag = "12")]
    pub(crate) segment_wait: Vec<u32>,
}

use crate::path::{Accounting, Cause};

/// [`crate::path::Accounting`] on the wire, in nanoseconds: one `uint64`
/// field per [`Cause`], numbered [`Cause::field_number`] (the same bytes and
/// errors as a prost-derived message with the seven fields).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct AccountingProto {
    /// Indexed by `field_number - 1`.
    pub(crate) nanos: [u64; Cause::ALL.len()],
}

impl AccountingProto {
    pub(crate) fn from_accounting(a: &Accounting) -> AccountingProto {
        let mut out = AccountingProto::default();
        for (c, d) in a.iter() {
            out.nanos[c as usize] = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        }
        out
    }

    /// The nanoseconds of `cause`.
    pub(crate) fn get_mut(&mut self, cause: Cause) -> &mut u64 {
        &mut self.nanos[cause as usize]
    }

    pub(crate) fn to_accounting(self) -> Accounting {
        Accounting::from_causes(
            Cause::ALL
                .into_iter()
                .map(|c| (c, Duration::from_nanos(self.nanos[c as usize]))),
        )
    }
}

impl prost::Message for AccountingProto {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        for c in Cause::ALL {
            let v = self.nanos[c as usize];
            if v != 0 {
                uint64::encode(c.field_number(), &v, buf);
            }
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        match Cause::from_field_number(tag) {
            Some(c) => {
                uint64::merge(wire_type, &mut self.nanos[c as usize], buf, ctx).map_err(|mut e| {
                    e.push("AccountingProto", c.proto_field_name());
                    e
                })
            }
            None => skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        Cause::ALL
            .into_iter()
            .filter(|c| self.nanos[*c as usize] != 0)
            .map(|c| uint64::encoded_len(c.field_number(), &self.nanos[c as usize]))
            .sum()
    }

    fn clear(&mut self) {
        *self = AccountingProto::default();
    }
}

/// The name prost gives decode errors of [`PathIn`]'s fields, so that they
/// read exactly as `PathProto`'s did.
const MESSAGE_NAME: &str = "PathProto";

/// `PathProto` as the decoder reads it.
///
/// Every field is merged with prost's own function for its type (so unknown
/// fields, repeated and split fields, packed and unpacked columns and every
/// error are as in the derived message), except on two fast paths for
/// well-formed fields, which read what prost would read: a string goes
/// straight from the input into its `Arc<str>` (`read_string`), and a
/// packed column is scanned by a plain loop into an exactly reserved `Vec`
/// (`read_packed`; its values are counted by their last bytes, so the
/// reservation never exceeds the input's length). Whatever they do not
/// accept, prost reads, or rejects with its own error.
///
/// `DecodeError::push` names the field in the error as prost-derive's
/// generated code does (it is public but hidden in prost's docs, for that
/// code).
#[derive(Debug, Default)]
pub(crate) struct PathIn {
    pub(crate) version: u32,
    pub(crate) strings: Vec<Arc<str>>,
    pub(crate) tree_parent: Vec<u32>,
    pub(crate) tree_service: Vec<u32>,
    pub(crate) tree_name: Vec<u32>,
    pub(crate) tree_file: Vec<u32>,
    pub(crate) tree_line: Vec<u32>,
    pub(crate) segment_entry_kind: Vec<u32>,
    pub(crate) segment_duration_nanos: Vec<u64>,
    pub(crate) accounting: Option<AccountingProto>,
    pub(crate) frames_fingerprint: Option<u64>,
    pub(crate) segment_wait: Vec<u32>,
}

impl PathIn {
    /// Read a whole message, as `<PathProto as prost::Message>::decode` does,
    /// into `msg`'s columns (emptied first), so that a caller can keep them
    /// from one message to the next.
    pub(crate) fn decode_into(mut buf: &[u8], mut msg: PathIn) -> Result<Self, DecodeError> {
        msg.clear();
        let mut text = String::new();
        let ctx = DecodeContext::default();
        while !buf.is_empty() {
            let (tag, wire_type) = decode_key(&mut buf)?;
            msg.merge_field(tag, wire_type, &mut buf, ctx.clone(), &mut text)?;
        }
        Ok(msg)
    }

    /// Empty every field, keeping the allocations.
    pub(crate) fn clear(&mut self) {
        self.version = 0;
        self.strings.clear();
        for column in [
            &mut self.tree_parent,
            &mut self.tree_service,
            &mut self.tree_name,
            &mut self.tree_file,
            &mut self.tree_line,
            &mut self.segment_entry_kind,
        ] {
            column.clear();
        }
        self.segment_duration_nanos.clear();
        self.accounting = None;
        self.frames_fingerprint = None;
        self.segment_wait.clear();
    }

    /// The largest capacity of its columns.
    pub(crate) fn capacity(&self) -> usize {
        [
            self.strings.capacity(),
            self.tree_parent.capacity(),
            self.tree_service.capacity(),
            self.tree_name.capacity(),
            self.tree_file.capacity(),
            self.tree_line.capacity(),
            self.segment_entry_kind.capacity(),
            self.segment_duration_nanos.capacity(),
        ]
        .into_iter()
        .max()
        .unwrap_or(0)
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut &[u8],
        ctx: DecodeContext,
        text: &mut String,
    ) -> Result<(), DecodeError> {
        let field = |name: &'static str| {
            move |mut e: DecodeError| {
                e.push(MESSAGE_NAME, name);
                e
            }
        };
        match tag {
            1 => uint32::merge(wire_type, &mut self.version, buf, ctx).map_err(field("version")),
            2 => {
                let s = match read_string(wire_type, buf) {
                    Some(s) => s,
                    None => {
                        // `string::merge_repeated`, for what `read_string`
                        // leaves to prost (and its errors).
                        check_wire_type(WireType::LengthDelimited, wire_type)
                            .and_then(|()| string::merge(wire_type, text, buf, ctx))
                            .map_err(field("strings"))?;
                        text.as_str()
                    }
                };
                self.strings.push(Arc::from(s));
                Ok(())
            }
            3 => {
                merge_u32s(wire_type, &mut self.tree_parent, buf, ctx).map_err(field("tree_parent"))
            }
            4 => merge_u32s(wire_type, &mut self.tree_service, buf, ctx)
                .map_err(field("tree_service")),
            5 => merge_u32s(wire_type, &mut self.tree_name, buf, ctx).map_err(field("tree_name")),
            6 => merge_u32s(wire_type, &mut self.tree_file, buf, ctx).map_err(field("tree_file")),
            7 => merge_u32s(wire_type, &mut self.tree_line, buf, ctx).map_err(field("tree_line")),
            8 => merge_u32s(wire_type, &mut self.segment_entry_kind, buf, ctx)
                .map_err(field("segment_entry_kind")),
            9 => merge_u64s(wire_type, &mut self.segment_duration_nanos, buf, ctx)
                .map_err(field("segment_duration_nanos")),
            10 => message::merge(
                wire_type,
                self.accounting.get_or_insert_with(Default::default),
                buf,
                ctx,
            )
            .map_err(field("accounting")),
            // Read only in its own wire type: version 1 knew no field 11 and
            // skipped it whatever its type, and still does.
            11 if wire_type == WireType::SixtyFourBit => fixed64::merge(
                wire_type,
                self.frames_fingerprint.get_or_insert(0),
                buf,
                ctx,
            )
            .map_err(field("frames_fingerprint")),
            12 => merge_u32s(wire_type, &mut self.segment_wait, buf, ctx)
                .map_err(field("segment_wait")),
            _ => skip_field(wire_type, tag, buf, ctx),
        }
    }
}

fn merge_u32s(
    wire_type: WireType,
    values: &mut Vec<u32>,
    buf: &mut &[u8],
    ctx: DecodeContext,
) -> Result<(), DecodeError> {
    // `as u32`: what prost's `uint32` does with a wider varint.
    if read_packed(wire_type, values, buf, |v| v as u32) {
        return Ok(());
    }
    uint32::merge_repeated(wire_type, values, buf, ctx)
}

fn merge_u64s(
    wire_type: WireType,
    values: &mut Vec<u64>,
    buf: &mut &[u8],
    ctx: DecodeContext,
) -> Result<(), DecodeError> {
    if read_packed(wire_type, values, buf, |v| v) {
        return Ok(());
    }
    uint64::merge_repeated(wire_type, values, buf, ctx)
}

/// Read a well-formed packed column at the start of `buf` into `values`,
/// or return false having changed neither, for prost to read (or reject)
/// instead; so every malformed column gets prost's own error.
///
/// Well-formed here: a declared length within the input, then varints of
/// at most 9 bytes that end exactly at that length. On those prost's
/// `merge_loop` reads exactly the same values; this loop is a plain scan
/// of the slice where prost's goes through `Buf` and a closure per value.
/// The column is reserved exactly first: a varint ends in its one byte
/// below 0x80.
fn read_packed<T>(
    wire_type: WireType,
    values: &mut Vec<T>,
    buf: &mut &[u8],
    convert: impl Fn(u64) -> T,
) -> bool {
    if wire_type != WireType::LengthDelimited {
        return false;
    }
    let mut rest = *buf;
    let Some(len) = short_varint(&mut rest) else {
        return false;
    };
    let Some((mut packed, after)) = usize::try_from(len)
        .ok()
        .and_then(|len| rest.split_at_checked(len))
    else {
        return false;
    };
    let start = values.len();
    values.reserve(packed.iter().filter(|b| **b < 0x80).count());
    while !packed.is_empty() {
        match short_varint(&mut packed) {
            Some(v) => values.push(convert(v)),
            None => {
                values.truncate(start);
                return false;
            }
        }
    }
    *buf = after;
    true
}

/// A well-formed string field's text at the start of `buf`, advancing past
/// it: a declared length within the input and valid UTF-8, which prost's
/// `string::merge` would read as the same text. `None`, with `buf`
/// untouched, for anything else, for prost to read or reject.
fn read_string<'b>(wire_type: WireType, buf: &mut &'b [u8]) -> Option<&'b str> {
    if wire_type != WireType::LengthDelimited {
        return None;
    }
    let mut rest = *buf;
    let len = usize::try_from(short_varint(&mut rest)?).ok()?;
    let (bytes, after) = rest.split_at_checked(len)?;
    let s = std::str::from_utf8(bytes).ok()?;
    *buf = after;
    Some(s)
}

/// A varint of at most 9 bytes (any value below 2^63) at the start of
/// `buf`, advancing past it; `None` for anything else (longer, or cut off
/// by the end of `buf`), leaving `buf` unspecified.
fn short_varint(buf: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for (i, &byte) in buf.iter().take(9).enumerate() {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte < 0x80 {
            *buf = &buf[i + 1..];
            return Some(value);
        }
    }
    None
}

/// `PathProto` as the encoder writes it: strings borrowed from the path's
/// frames, and the length computed once ([`PathOut::sizes`]) for both the
/// limit check and the write. Writes the bytes prost writes for the equal
/// `PathProto` (fields in tag order, proto3 defaults omitted, columns
/// packed).
#[derive(Debug, Default)]
pub(crate) struct PathOut<'a> {
    pub(crate) version: u32,
    pub(crate) strings: Vec<&'a str>,
    pub(crate) tree_parent: Vec<u32>,
    pub(crate) tree_service: Vec<u32>,
    pub(crate) tree_name: Vec<u32>,
    pub(crate) tree_file: Vec<u32>,
    pub(crate) tree_line: Vec<u32>,
    pub(crate) segment_entry_kind: Vec<u32>,
    pub(crate) segment_duration_nanos: Vec<u64>,
    pub(crate) accounting: Option<AccountingProto>,
    /// Indices of the named-wait segments, ascending (field 12).
    pub(crate) segment_wait: Vec<u32>,
}

/// The encoded length of a [`PathOut`] and of its packed columns' payloads.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sizes {
    /// Payload bytes of columns 3..=9, in tag order.
    columns: [usize; 7],
    /// Payload bytes of `segment_wait` (field 12).
    wait: usize,
    /// The whole message.
    pub(crate) total: usize,
    /// Its version field.
    version: usize,
    /// Its fields 1–7: the split form's frame dictionary.
    frames: usize,
}

/// The split form's `frames_fingerprint` field: a key and 8 bytes.
const FINGERPRINT_LEN: usize = 9;

impl Sizes {
    /// Both messages of the split form: the fields of the single message,
    /// plus the segments message's version and fingerprint.
    pub(crate) fn split_total(&self) -> usize {
        self.total + self.version + FINGERPRINT_LEN
    }
}

impl PathOut<'_> {
    /// Empty every field, keeping the allocations.
    pub(crate) fn clear(&mut self) {
        self.version = 0;
        self.strings.clear();
        for column in self.u32_columns_mut() {
            column.clear();
        }
        self.segment_duration_nanos.clear();
        self.accounting = None;
        self.segment_wait.clear();
    }

    fn u32_columns(&self) -> [&[u32]; 6] {
        [
            &self.tree_parent,
            &self.tree_service,
            &self.tree_name,
            &self.tree_file,
            &self.tree_line,
            &self.segment_entry_kind,
        ]
    }

    fn u32_columns_mut(&mut self) -> [&mut Vec<u32>; 6] {
        [
            &mut self.tree_parent,
            &mut self.tree_service,
            &mut self.tree_name,
            &mut self.tree_file,
            &mut self.tree_line,
            &mut self.segment_entry_kind,
        ]
    }

    /// The encoded length.
    pub(crate) fn sizes(&self) -> Sizes {
        let mut columns = [0; 7];
        for (size, column) in columns.iter_mut().zip(self.u32_columns()) {
            *size = column
                .iter()
                .map(|v| encoded_len_varint(u64::from(*v)))
                .sum();
        }
        columns[6] = self
            .segment_duration_nanos
            .iter()
            .map(|v| encoded_len_varint(*v))
            .sum();
        let mut total = 0;
        if self.version != 0 {
            total += key_len(1) + encoded_len_varint(u64::from(self.version));
        }
        let version = total;
        total += self
            .strings
            .iter()
            .map(|s| key_len(2) + encoded_len_varint(s.len() as u64) + s.len())
            .sum::<usize>();
        let mut frames = 0;
        for (size, tag) in columns.iter().zip(3..) {
            if tag == 8 {
                frames = total;
            }
            if *size > 0 {
                total += key_len(tag) + encoded_len_varint(*size as u64) + size;
            }
        }
        if let Some(accounting) = &self.accounting {
            total += message::encoded_len(10, accounting);
        }
        let wait: usize = self
            .segment_wait
            .iter()
            .map(|v| encoded_len_varint(u64::from(*v)))
            .sum();
        if wait > 0 {
            total += key_len(12) + encoded_len_varint(wait as u64) + wait;
        }
        Sizes {
            wait,
            columns,
            total,
            version,
            frames,
        }
    }

    /// The split form's frame dictionary: fields 1–7.
    pub(crate) fn encode_frames(&self, sizes: &Sizes) -> Vec<u8> {
        let mut buf = Vec::with_capacity(sizes.frames);
        self.encode_version(&mut buf);
        self.encode_dictionary_fields(&mut buf, sizes);
        debug_assert_eq!(buf.len(), sizes.frames);
        buf
    }

    /// The split form's segments: fields 1 and 8–11.
    pub(crate) fn encode_segments(&self, sizes: &Sizes, fingerprint: u64) -> Vec<u8> {
        let len = sizes.total - sizes.frames + sizes.version + FINGERPRINT_LEN;
        let mut buf = Vec::with_capacity(len);
        self.encode_version(&mut buf);
        self.encode_segment_fields(&mut buf, sizes);
        key(&mut buf, 11, WireType::SixtyFourBit);
        buf.extend_from_slice(&fingerprint.to_le_bytes());
        debug_assert_eq!(buf.len(), len);
        buf
    }

    fn encode_version(&self, buf: &mut Vec<u8>) {
        if self.version != 0 {
            key(buf, 1, WireType::Varint);
            varint(buf, u64::from(self.version));
        }
    }

    /// Fields 2–7.
    fn encode_dictionary_fields(&self, buf: &mut Vec<u8>, sizes: &Sizes) {
        for s in &self.strings {
            key(buf, 2, WireType::LengthDelimited);
            varint(buf, s.len() as u64);
            buf.extend_from_slice(s.as_bytes());
        }
        let columns = self.u32_columns();
        for ((column, size), tag) in columns.iter().zip(&sizes.columns).zip(3..8) {
            packed(buf, tag, *size, column.iter().map(|v| u64::from(*v)));
        }
    }

    /// Fields 8–10 and 12.
    fn encode_segment_fields(&self, buf: &mut Vec<u8>, sizes: &Sizes) {
        packed(
            buf,
            8,
            sizes.columns[5],
            self.segment_entry_kind.iter().map(|v| u64::from(*v)),
        );
        packed(
            buf,
            9,
            sizes.columns[6],
            self.segment_duration_nanos.iter().copied(),
        );
        if let Some(accounting) = &self.accounting {
            message::encode(10, accounting, buf);
        }
        packed(
            buf,
            12,
            sizes.wait,
            self.segment_wait.iter().map(|v| u64::from(*v)),
        );
    }

    /// The encoding, `sizes` being [`PathOut::sizes`] of `self`.
    pub(crate) fn encode(&self, sizes: &Sizes) -> Vec<u8> {
        let mut buf = Vec::with_capacity(sizes.total);
        self.encode_version(&mut buf);
        self.encode_dictionary_fields(&mut buf, sizes);
        self.encode_segment_fields(&mut buf, sizes);
        debug_assert_eq!(buf.len(), sizes.total);
        buf
    }
}

/// A packed column of `size` payload bytes (nothing when empty).
fn packed(buf: &mut Vec<u8>, tag: u32, size: usize, values: impl Iterator<Item = u64>) {
    if size == 0 {
        return;
    }
    key(buf, tag, WireType::LengthDelimited);
    varint(buf, size as u64);
    for v in values {
        varint(buf, v);
    }
}

/// A field key, as `prost::encoding::encode_key` writes it.
fn key(buf: &mut Vec<u8>, tag: u32, wire_type: WireType) {
    varint(buf, u64::from((tag << 3) | wire_type as u32));
}

/// A varint, as `prost::encoding::encode_varint` writes it, straight into
/// the `Vec` (prost's goes through `BufMut` one checked byte at a time).
fn varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push(v as u8 | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}
