//! Every framework pair that can meet: a tower client over HTTP in a tonic
//! service calling actix-web, reqwest calling axum and actix-web, and an
//! actix-web entry service calling tonic. Each pair: the callee's path
//! merged under the RPC frame with exact sums, an untrusted caller, a
//! callee that returns no path, and errors (connection refused, timeout)
//! whose RPC node still ends, with its time on the path.
//!
//! actix-web runs its workers on threads of its own, so this binary
//! installs its subscriber globally (one `CriticalPathLayer` for every
//! test); each test names its services apart and reads only their paths.

mod actix_tonic;
mod reqwest_order;
mod reqwest_pairs;
mod support;
mod tonic_actix;
