//! pprof's `profile.proto` (package `perftools.profiles`), written by hand
//! with `prost` derives and the same field numbers as
//! `github.com/google/pprof/proto/profile.proto`.
//!
//! Why not the `pprof` crate's `protos` module: it is generated for prost
//! 0.12, while the rest of the workspace (tonic 0.14) uses prost 0.14, so
//! depending on it would build two prost versions and two sets of derive
//! macros for eight small messages. protoc is not available to generate
//! them, and there is nothing to generate at build time: the schema has
//! been stable for years. Only the fields cpt writes or reads matter, but
//! all are declared so profiles from other tools decode losslessly.

/// A profile: samples, their stacks and the string table everything indexes.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Profile {
    /// What each value in `Sample::value` measures.
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    /// The samples.
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    /// Binary mappings (cpt writes none).
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    /// Locations referenced by samples.
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    /// Functions referenced by locations.
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    /// All strings; index 0 must be `""`.
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    /// Regexp (string index) of frames to drop.
    #[prost(int64, tag = "7")]
    pub drop_frames: i64,
    /// Regexp (string index) of frames to keep.
    #[prost(int64, tag = "8")]
    pub keep_frames: i64,
    /// Time of collection, Unix nanoseconds.
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    /// Duration of collection, nanoseconds.
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    /// The kind of events between sampled occurrences.
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    /// Events between sampled occurrences.
    #[prost(int64, tag = "12")]
    pub period: i64,
    /// Free-form comments (string indices); `go tool pprof -comments` prints them.
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
    /// Index into the string table of the sample type viewers open on.
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
    /// Documentation link (string index).
    #[prost(int64, tag = "15")]
    pub doc_url: i64,
}

/// A (type, unit) pair of string indices, e.g. ("critical_path", "nanoseconds").
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct ValueType {
    /// String index of the type.
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    /// String index of the unit.
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

/// One stack and its values.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Sample {
    /// Location ids, **leaf first**.
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    /// One value per `Profile::sample_type`.
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    /// Labels.
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

/// A sample label.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct Label {
    /// String index of the key.
    #[prost(int64, tag = "1")]
    pub key: i64,
    /// String index of the value (or 0).
    #[prost(int64, tag = "2")]
    pub str: i64,
    /// Numeric value (when `str` is 0).
    #[prost(int64, tag = "3")]
    pub num: i64,
    /// String index of the unit of `num`.
    #[prost(int64, tag = "4")]
    pub num_unit: i64,
}

/// A binary mapping.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct Mapping {
    /// Unique nonzero id.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// Load address start.
    #[prost(uint64, tag = "2")]
    pub memory_start: u64,
    /// Load address end.
    #[prost(uint64, tag = "3")]
    pub memory_limit: u64,
    /// File offset.
    #[prost(uint64, tag = "4")]
    pub file_offset: u64,
    /// String index of the file name.
    #[prost(int64, tag = "5")]
    pub filename: i64,
    /// String index of the build id.
    #[prost(int64, tag = "6")]
    pub build_id: i64,
    /// Symbolization already done.
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
    /// File names present.
    #[prost(bool, tag = "8")]
    pub has_filenames: bool,
    /// Line numbers present.
    #[prost(bool, tag = "9")]
    pub has_line_numbers: bool,
    /// Inline frames present.
    #[prost(bool, tag = "10")]
    pub has_inline_frames: bool,
}

/// A code location: one or more (inlined) lines.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Location {
    /// Unique nonzero id.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// Mapping id (0 = none).
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    /// Instruction address.
    #[prost(uint64, tag = "3")]
    pub address: u64,
    /// Lines, callee-most first (the last is the caller).
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
    /// Folded by a symbolizer.
    #[prost(bool, tag = "5")]
    pub is_folded: bool,
}

/// A line in a function.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct Line {
    /// Function id.
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    /// Line number (0 = unknown).
    #[prost(int64, tag = "2")]
    pub line: i64,
    /// Column number (0 = unknown).
    #[prost(int64, tag = "3")]
    pub column: i64,
}

/// A function.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct Function {
    /// Unique nonzero id.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// String index of the display name.
    #[prost(int64, tag = "2")]
    pub name: i64,
    /// String index of the system (e.g. mangled) name.
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    /// String index of the source file.
    #[prost(int64, tag = "4")]
    pub filename: i64,
    /// First line of the function.
    #[prost(int64, tag = "5")]
    pub start_line: i64,
}
