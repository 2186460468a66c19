//! Trace import and CRISP critical paths.
//!
//! Data: `testdata/crisp` (34 Jaeger traces from uber-research/CRISP and their conformance goldens),
//! `testdata/traces/traceweaver-{media,hotel}` (DeathStarBench) and
//! `testdata/traces/zipkin-lens` and `testdata/traces/nezha-trainticket`.

mod async_children;
mod crisp_files;
mod crisp_goldens;
mod dsb;
mod edge;
mod flows_table1;
mod import_edges;
mod importers;
mod mutated;
mod mystery;
mod support;
mod zipkin_lens;
