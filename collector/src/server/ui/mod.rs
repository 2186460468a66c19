//! The collector's web pages, served on `cpt serve`'s HTTP port beside the
//! API: a browser is all an operator or an engineer needs to read what the
//! collector holds.
//!
//! | path | page |
//! |---|---|
//! | `/` | entry services and endpoints (requests, mean, p50, p99, last seen), the services on their paths, the latest forced requests ([`index`]) |
//! | `/ui/profile?SELECTION` | the average critical path: flame graph, top stacks, pprof download ([`profile`]) |
//! | `/ui/flame.svg?SELECTION` | that flame graph alone (inferno's SVG: zoom, search) |
//! | `/ui/request?id=ID` | one request's path as `cpt show`'s tree beside its endpoint's average; `wait=30s` refreshes until the record arrives ([`request`]) |
//! | `/ui/diff?base=SELECTION&test=SELECTION` | two selections compared, changes larger than noise marked ([`diff`]) |
//! | `/ui/diff.svg?…` | the differential flame graph alone |
//! | `/ui/trend?service=S&endpoint=E&last=30d` | an endpoint's mean and p99 per hour (per day past the hourly roll-ups) with its top frames stacked below, from the roll-ups ([`trend`]) |
//! | `/ui/login`, `/ui/logout` | the read-token form and its cookie ([`login`]) |
//! | `/ui/style.css` | the one stylesheet, compiled in |
//!
//! A `SELECTION` is the key=value query of `GET /profile`
//! ([`Selection::from_query`](crate::records::selection::Selection::from_query)),
//! plus `last=DURATION` (e.g. `last=1h`: since that long before now).
//! Profiles and comparisons fold the selection's newest records, 5 000 by
//! default (`sample=N`, `sample=all`: [`fold`]).
//!
//! Every page is rendered on the server from the store (tables work
//! without JavaScript); the only script is the one inside inferno's flame
//! graph SVG (zoom on click, search), loaded as a document of its own.
//! Nothing here writes to the store. Who may read what is the collector's
//! one read policy, applied to every route by the route guard
//! (`server/edge/routes.rs`): a page handler gets the caller's
//! [`Reader`](super::edge::access::Reader) and reads the store only through
//! selections it narrowed ([`Reader::restrict`](super::edge::access::Reader::restrict)).

use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use http::header;

mod diff;
mod figure;
mod fold;
mod index;
mod login;
mod page;
mod profile;
mod request;
mod trend;

/// Who may read the pages: the collector's one read check
/// ([`ReadAccess`](super::edge::access::ReadAccess)), the bearer header or the
/// cookie [`READ_COOKIE`] the login form sets, as for every other read.
pub(crate) use super::edge::access::{READ_COOKIE, ReadAccess as ReadGate};

/// What every page handler gets.
#[derive(Clone, Debug)]
pub(crate) struct UiState {
    /// The store, opened read-only per page.
    pub(crate) store_path: PathBuf,
    /// The read check.
    pub(crate) gate: ReadGate,
    /// Recent folds, shared by a page and its flame graph.
    folds: Arc<fold::FoldCache>,
    /// The pages are served over TLS: the sign-in cookie is `Secure`, so a
    /// browser never sends the read token over plain HTTP.
    pub(crate) tls: bool,
}

impl UiState {
    /// The pages of the store at `store_path`, behind `gate`.
    pub(crate) fn new(store_path: PathBuf, gate: ReadGate) -> UiState {
        UiState {
            store_path,
            gate,
            folds: Arc::default(),
            tls: false,
        }
    }

    /// Whether the pages are served over TLS (see [`UiState::tls`]).
    #[must_use]
    pub(crate) fn with_tls(mut self, tls: bool) -> UiState {
        self.tls = tls;
        self
    }
}

/// The pages' routes, to be merged into the collector's HTTP router (each
/// also a row of `routes::ROUTES`).
pub(crate) fn router(state: UiState) -> Router {
    Router::new()
        .route("/", get(index::page))
        .route("/ui", get(|| async { page::redirect("/") }))
        .route("/ui/", get(|| async { page::redirect("/") }))
        .route("/ui/profile", get(profile::page))
        .route("/ui/flame.svg", get(profile::svg))
        .route("/ui/request", get(request::page))
        .route("/ui/diff", get(diff::page))
        .route("/ui/diff.svg", get(diff::svg))
        .route("/ui/trend", get(trend::page))
        .route("/ui/login", get(login::form).post(login::submit))
        .route("/ui/logout", axum::routing::post(login::logout))
        .route("/ui/style.css", get(stylesheet))
        .with_state(state)
}

async fn stylesheet() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=3600"),
        ],
        include_str!("style.css"),
    )
        .into_response()
}

#[cfg(test)]
mod figures_tests;
#[cfg(test)]
mod http_tests;
#[cfg(test)]
mod policy_tests;
#[cfg(test)]
mod security_tests;
