//! The HTTP edge: what every connection and request meets before any
//! handler runs, and the read endpoints behind it.
//!
//! | file | what |
//! |---|---|
//! | `listen.rs` | accepting connections: header-read and idle timeouts, HTTP/2 stream limit |
//! | `connections.rs` | connections open, bounded in total and per peer address; the open-file limit |
//! | `tls.rs` | the TLS certificate and key of both ports |
//! | `routes.rs` | every route in one table, and the guard in front of them all: allowed hosts, query limit, same-origin POSTs, the read policy |
//! | `authority.rs` | the names the HTTP port answers to (DNS rebinding), trusted proxies' forwarded host, the origin a sign-in must come from |
//! | `access.rs` | the read policy: who may read (the read token) and what (forced records), bearer parsing |
//! | `headers.rs` | the security headers of every answer, the flame graphs' policy |
//! | `http_api.rs` | `POST /v1/records`, `GET /v1/records`, `GET /profile`, `GET /v1/stats`, `GET /healthz` |
//! | `reads.rs` | the threads reads run on, below ingest's priority |

pub(super) mod access;
pub(super) mod authority;
pub(super) mod connections;
pub(super) mod headers;
pub(super) mod http_api;
pub(super) mod listen;
pub(super) mod reads;
pub(super) mod routes;
pub(super) mod tls;
