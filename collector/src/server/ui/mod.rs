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
//! Nothing here writes to the store. The one check of who may read is
//! [`ReadGate::allows`], applied to every page but the login form and the
//! stylesheet by [`require_read`].

use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use http::{StatusCode, header};

mod diff;
mod fold;
mod index;
mod login;
mod page;
mod profile;
mod request;
mod trend;

/// Who may read the pages: the collector's one read check
/// ([`ReadAccess`](super::access::ReadAccess)), the bearer header or the
/// cookie [`READ_COOKIE`] the login form sets, as for every other read.
pub(crate) use super::access::{READ_COOKIE, ReadAccess as ReadGate};

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

/// The pages' routes, to be merged into the collector's HTTP router.
pub(crate) fn router(state: UiState) -> Router {
    let gated = Router::new()
        .route("/", get(index::page))
        .route("/ui", get(|| async { page::redirect("/") }))
        .route("/ui/", get(|| async { page::redirect("/") }))
        .route("/ui/profile", get(profile::page))
        .route("/ui/flame.svg", get(profile::svg))
        .route("/ui/request", get(request::page))
        .route("/ui/diff", get(diff::page))
        .route("/ui/diff.svg", get(diff::svg))
        .route("/ui/trend", get(trend::page))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_read));
    Router::new()
        .merge(gated)
        .route("/ui/login", get(login::form).post(login::submit))
        .route("/ui/logout", axum::routing::post(login::logout))
        .route("/ui/style.css", get(stylesheet))
        .with_state(state)
}

/// The gate in front of every page: a browser without the token is sent to
/// the login form (and back after it); a program gets 401.
async fn require_read(State(state): State<UiState>, req: Request, next: Next) -> Response {
    if state.gate.allows(req.headers()) {
        return next.run(req).await;
    }
    let wants_html = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("text/html"));
    let here = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    if wants_html {
        page::redirect(&format!("/ui/login?next={}", page::enc(&here)))
    } else {
        (
            StatusCode::UNAUTHORIZED,
            [
                (header::WWW_AUTHENTICATE, "Bearer"),
                (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            ],
            "this collector's pages need its read token: send Authorization: Bearer TOKEN, \
             or sign in at /ui/login\n",
        )
            .into_response()
    }
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
mod http_tests;
