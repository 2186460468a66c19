//! Trace import and CRISP critical paths.
//!
//! Data: `testdata/crisp` (33 Jaeger traces from uber-research/CRISP),
//! `testdata/traces/traceweaver-{media,hotel}` (DeathStarBench) and
//! `testdata/traces/zipkin-lens`.

mod async_children;
mod crisp_files;
mod dsb;
mod edge;
mod importers;
mod mystery;
mod support;
mod zipkin_lens;
