//! The Mystery Machine (Chow, Meisner, Flinn, Peek, Wenisch, *The Mystery
//! Machine: End-to-end Performance Analysis of Large-scale Internet
//! Services*, OSDI 2014): infer the causal model from many traces instead
//! of assuming it, then compute critical paths, slack and outliers over it.
//!
//! - [`events`]: requests (a selected root and its subtree, clock skew
//!   repaired) and their segments `CALLPATH#K` with events `.start` /
//!   `.end` (MM §3: unique names within a request).
//! - [`model`]: hypotheses (happens-before between events, mutual
//!   exclusion between segments, pipeline between repeated siblings) and
//!   their refinement request by request, the convergence curve (MM
//!   §4.1–4.3, Figures 1–3), the model as relations and as Graphviz
//!   (transitive reduction).
//! - [`slack`]: per request, the critical path as the longest path through
//!   the model with the request's timings and the slack of every span (MM
//!   §4.4.1–4.4.2, Figure 2); per call path slack percentiles; the
//!   correlation-vs-slack validation (MM Figures 9–10).
//! - [`versus`]: where the model's critical path and CRISP's
//!   last-finishing-child walk disagree, and why.
//! - [`anomaly`]: CRISP-style anomaly scores (PCA reconstruction error of
//!   the critical-path vector) and precision/recall at the top k.
//! - [`outliers`](mod@outliers): the top-latency split and the differential ranking of
//!   call paths (MM §4.4.3).
//!
//! The model is per endpoint (the root's `service:operation`): requests of
//! different endpoints share no segments.

pub mod anomaly;
pub mod events;
pub mod model;
pub mod outliers;
pub mod slack;
pub mod versus;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod versus_tests;

pub use events::{CallPaths, ReqSpan, Request, requests, requests_with};
pub use model::{Kind, Model, Models, Relation};
pub use outliers::{Differential, Outliers, outliers};
pub use slack::{
    Bucket, PathSlack, RequestSlack, SpanSlack, analyse, correlation_by_slack, per_call_path,
};
