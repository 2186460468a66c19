//! Running for a year: what the writer does between groups to keep the
//! store within its bounds, and what an operator watches.
//!
//! | file | what |
//! |---|---|
//! | `retention.rs` | `--retain-for`, `--max-store-bytes`, roll-ups and their retention: what the writer does between groups; the gauges `/metrics` reads |
//! | `metrics.rs` | `GET /metrics`, the Prometheus text format |
//! | `partitions.rs` | Parquet partitions past retention, removed |
//! | `trend.rs` | `GET /v1/trend`, an endpoint's trend from the roll-ups |
//! | `errlog.rs` | failure details for the operator's log, rate-limited |

pub(super) mod errlog;
pub(super) mod metrics;
pub(super) mod partitions;
pub(super) mod retention;
pub(super) mod trend;
