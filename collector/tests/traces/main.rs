//! Trace import and CRISP critical paths (issue 5).
//!
//! Data: `shared/testdata/crisp` (33 Jaeger traces from uber-research/CRISP),
//! `shared/testdata/traces/traceweaver-{media,hotel}` (DeathStarBench) and
//! `shared/testdata/traces/zipkin-lens`.

mod crisp_files;
mod dsb;
mod edge;
mod support;
mod zipkin_lens;
