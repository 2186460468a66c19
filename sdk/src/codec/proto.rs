//! The protobuf messages of the wire form, written by hand for prost (no
//! `protoc` needed). The equivalent `.proto`:
//!
//! ```proto
//! syntax = "proto3";
//! package cpt.path.v1;
//!
//! message Path {
//!   uint32 version = 1;                    // codec::VERSION
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

/// One critical path on the wire.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct PathProto {
    /// Must equal [`super::VERSION`].
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
}

/// [`crate::path::Accounting`] on the wire, in nanoseconds.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub(crate) struct AccountingProto {
    #[prost(uint64, tag = "1")]
    pub(crate) network_nanos: u64,
    #[prost(uint64, tag = "2")]
    pub(crate) overcount_nanos: u64,
    #[prost(uint64, tag = "3")]
    pub(crate) blind_spot_nanos: u64,
    #[prost(uint64, tag = "4")]
    pub(crate) unattributed_nanos: u64,
    #[prost(uint64, tag = "5")]
    pub(crate) queueing_nanos: u64,
    #[prost(uint64, tag = "6")]
    pub(crate) truncated_nanos: u64,
    #[prost(uint64, tag = "7")]
    pub(crate) clock_skew_nanos: u64,
}
