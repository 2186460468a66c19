//! Benchmarks; see `benches/`.
