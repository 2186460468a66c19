//! Every route of the HTTP port, in one table ([`ROUTES`]), and the guard
//! in front of all of them ([`guard`]).
//!
//! The guard is a layer on the whole router, so it sees every request,
//! whatever route answers it. For each one it:
//!
//! 0. refuses a request for a name the port does not answer to with 421
//!    ([`crate::server::edge::authority`]: an IP address, `localhost` or an
//!    `--allowed-host` name; DNS rebinding is refused here);
//! 1. looks the path and method up in [`ROUTES`]: a path the table does not
//!    list is 404 and a method it does not list 405, even when a handler
//!    exists (a route added to the router but not to the table fails
//!    closed, and its own tests say so);
//! 2. refuses a target longer than [`MAX_TARGET_BYTES`] with 414 and a
//!    query of more than [`MAX_QUERY_PARAMS`] parameters with 400, each
//!    naming the limit, the same on every route;
//! 3. for a sign-in form ([`Access::SignIn`]), refuses a request another
//!    site sent (`Sec-Fetch-Site`, else an `Origin` other than the one
//!    step 0 found) with 403;
//! 4. for a read ([`Access::Read`]), asks the read policy
//!    ([`ReadAccess::decide`]) what the caller may see: 401 (or the sign-in
//!    form for a browser on a page) without the read token where one is
//!    needed, else the [`Reader`] goes to the handler as a request
//!    extension and, when it withholds forced records, the answer says so
//!    in [`FORCED_HEADER`];
//! 5. adds the security headers to the answer ([`crate::server::edge::headers`]).
//!
//! Every answer the guard gives itself is JSON, `{"error": "…"}`, as the
//! API's are.
//!
//! A new route joins by one row in [`ROUTES`] (its path, methods, access and
//! kind) beside its handler in the router; a read handler takes
//! `Extension<Reader>` and passes every selection through
//! [`Reader::restrict`]. The route test (`ui/policy_tests.rs`) walks the
//! table for an open collector and for one with a read token.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};

use crate::records::query;
use crate::server::edge::access::{ReadAccess, Reader};
use crate::server::edge::authority::{Authorities, Origin};
use crate::server::edge::headers;
use crate::server::ingest::receiving::PeerIp;

/// Most parameters one query may have, on every route (400 beyond, naming
/// this limit). A profile's selection needs a handful; a query of
/// thousands is a mistake or an attack on the store.
pub const MAX_QUERY_PARAMS: usize = 64;

/// Longest request target (path and query), in bytes, on every route (414
/// beyond, naming this limit). The longest selection a page links to is a
/// few hundred bytes.
pub const MAX_TARGET_BYTES: usize = 32 * 1024;

/// On every read answer of a collector without a read token:
/// `withheld`, forced records were left out.
pub(crate) const FORCED_HEADER: &str = "x-cpt-forced-records";

/// Who may call a route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// Anyone: it shows nothing of the records (health, the sign-in form,
    /// the stylesheet).
    Open,
    /// Records or what is made of them: the read policy decides.
    Read,
    /// Sending records: the ingest token, checked by the handler
    /// (admission); programs, not browsers.
    Ingest,
    /// The sign-in and sign-out forms: same-origin POSTs only.
    SignIn,
    /// `/metrics`: counters that say nothing of any one request; the read
    /// policy decides, unless `cpt serve --metrics-open`.
    Metrics,
}

/// What answers a route: a program (JSON, protobuf) or a browser (HTML,
/// SVG, CSS). A browser without the read token is sent to the sign-in form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The API.
    Api,
    /// The web pages and their assets.
    Page,
}

/// One row of [`ROUTES`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Route {
    pub(crate) path: &'static str,
    /// `GET` also answers `HEAD`.
    pub(crate) methods: &'static [Method],
    pub(crate) access: Access,
    pub(crate) kind: Kind,
}

const fn route(
    path: &'static str,
    methods: &'static [Method],
    access: Access,
    kind: Kind,
) -> Route {
    Route {
        path,
        methods,
        access,
        kind,
    }
}

const GET: &[Method] = &[Method::GET];
const POST: &[Method] = &[Method::POST];

/// Every route of the HTTP port.
#[rustfmt::skip]
pub(crate) const ROUTES: &[Route] = &[
    route("/v1/records",   POST, Access::Ingest, Kind::Api),
    route("/v1/records",   GET,  Access::Read,   Kind::Api),
    route("/profile",      GET,  Access::Read,   Kind::Api),
    route("/v1/stats",     GET,  Access::Read,   Kind::Api),
    route("/v1/trend",     GET,  Access::Read,   Kind::Api),
    route("/metrics",      GET,  Access::Metrics, Kind::Api),
    route("/healthz",      GET,  Access::Open,   Kind::Api),
    route("/",             GET,  Access::Read,   Kind::Page),
    route("/ui",           GET,  Access::Read,   Kind::Page),
    route("/ui/",          GET,  Access::Read,   Kind::Page),
    route("/ui/profile",   GET,  Access::Read,   Kind::Page),
    route("/ui/flame.svg", GET,  Access::Read,   Kind::Page),
    route("/ui/request",   GET,  Access::Read,   Kind::Page),
    route("/ui/diff",      GET,  Access::Read,   Kind::Page),
    route("/ui/diff.svg",  GET,  Access::Read,   Kind::Page),
    route("/ui/trend",     GET,  Access::Read,   Kind::Page),
    route("/ui/login",     GET,  Access::Open,   Kind::Page),
    route("/ui/login",     POST, Access::SignIn, Kind::Page),
    route("/ui/logout",    POST, Access::SignIn, Kind::Page),
    route("/ui/style.css", GET,  Access::Open,   Kind::Page),
];

/// What the guard needs.
#[derive(Clone, Debug)]
pub(crate) struct Guard {
    pub(crate) read: ReadAccess,
    /// The names the port answers to, and the trusted proxies.
    pub(crate) authorities: Authorities,
    /// `/metrics` is open to anyone (`cpt serve --metrics-open`).
    pub(crate) metrics_open: bool,
}

/// The row of `method path`; else the methods the path takes (none: no
/// such path).
fn find(method: &Method, path: &str) -> Result<&'static Route, Vec<&'static str>> {
    let method = if method == Method::HEAD {
        &Method::GET
    } else {
        method
    };
    let rows = || ROUTES.iter().filter(|r| r.path == path);
    rows().find(|r| r.methods.contains(method)).ok_or_else(|| {
        rows()
            .flat_map(|r| r.methods.iter().map(Method::as_str))
            .collect()
    })
}

fn not_allowed(path: &str, method: &Method, allow: &[&str]) -> Response {
    let mut resp = error(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{path} takes {}, not {method}", allow.join(", ")),
    );
    if let Ok(v) = HeaderValue::from_str(&allow.join(", ")) {
        resp.headers_mut().insert(header::ALLOW, v);
    }
    resp
}

fn not_found(path: &str) -> Response {
    error(
        StatusCode::NOT_FOUND,
        format!("no such page or API: {path} (the collector's pages start at /)"),
    )
}

/// The router's fallback: a row of [`ROUTES`] with no handler behind it
/// (a bug the route tests catch) gets the guard's own 404.
pub(crate) async fn fallback(uri: http::Uri) -> Response {
    not_found(uri.path())
}

/// An error answer: `{"error": msg}`.
pub(crate) fn error(status: StatusCode, msg: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        format!("{}\n", serde_json::json!({ "error": msg })),
    )
        .into_response()
}

/// The 414 every route gives a target over [`MAX_TARGET_BYTES`].
fn too_long(target: usize) -> Option<Response> {
    (target > MAX_TARGET_BYTES).then(|| {
        error(
            StatusCode::URI_TOO_LONG,
            format!(
                "request target of {target} bytes, over the limit of {MAX_TARGET_BYTES} bytes; \
                 narrow the selection"
            ),
        )
    })
}

/// The 400 every route gives a query over [`MAX_QUERY_PARAMS`].
fn over_limit(params: usize) -> Option<Response> {
    (params > MAX_QUERY_PARAMS).then(|| {
        error(
            StatusCode::BAD_REQUEST,
            format!(
                "bad query: {params} parameters, over the limit of {MAX_QUERY_PARAMS} \
                 parameters per query; narrow the selection"
            ),
        )
    })
}

/// Whether a browser's POST comes from this collector's own pages:
/// `Sec-Fetch-Site: same-origin` when the browser sends it (every current
/// one does), else an `Origin` equal to `own`, the allowed origin the
/// request was sent to ([`Authorities::origin`]: `Host`, HTTP/2's
/// `:authority`, or what a trusted proxy forwarded). A request with
/// neither is refused too: a form post from a browser always carries one.
pub(crate) fn same_origin(headers: &HeaderMap, own: &Origin) -> bool {
    if let Some(site) = headers.get("sec-fetch-site") {
        return site.as_bytes() == b"same-origin";
    }
    headers
        .get(header::ORIGIN)
        .is_some_and(|origin| own.is(origin.as_bytes()))
}

/// The answer to a caller the read policy turned away.
fn denied(kind: Kind, req: &Request) -> Response {
    let wants_html = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("text/html"));
    if kind == Kind::Page && wants_html {
        let here = req.uri().path_and_query().map_or("/", |p| p.as_str());
        return see_other(&format!("/ui/login?{}", query::encode([("next", here)])));
    }
    let msg = match kind {
        Kind::Api => {
            "reading needs the collector's read token: send `Authorization: Bearer <token>` \
             (cpt show/profile: --read-token-file FILE or CPT_READ_TOKEN); the ingest token does not read"
        }
        Kind::Page => {
            "this collector's pages need its read token: send Authorization: Bearer TOKEN, \
             or sign in at /ui/login"
        }
    };
    let mut resp = error(StatusCode::UNAUTHORIZED, msg.to_owned());
    resp.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    resp
}

/// A 303 to `to` (a local path).
pub(crate) fn see_other(to: &str) -> Response {
    let mut r = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = HeaderValue::from_str(to) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

/// The guard in front of every route (see the module docs).
pub(crate) async fn guard(State(g): State<Guard>, mut req: Request, next: Next) -> Response {
    let mut resp = match admit(&g, &mut req) {
        Admit::Pass(reader) => {
            let mut resp = next.run(req).await;
            if reader.is_some_and(|r| !r.sees_forced()) {
                resp.headers_mut()
                    .insert(FORCED_HEADER, HeaderValue::from_static("withheld"));
            }
            resp
        }
        Admit::Refuse(resp) => resp,
    };
    headers::secure(resp.headers_mut());
    resp
}

/// What the guard makes of a request.
enum Admit {
    /// On to the handler: with the reader of a read route, `None` for
    /// another route.
    Pass(Option<Reader>),
    /// Refused with this answer.
    Refuse(Response),
}

/// Steps 0–4 of the module docs.
fn admit(g: &Guard, req: &mut Request) -> Admit {
    let peer = req.extensions().get::<PeerIp>().map(|p| p.0);
    let origin = match g.authorities.origin(req.uri(), req.headers(), peer) {
        Ok(origin) => origin,
        Err(e) => return Admit::Refuse(error(StatusCode::MISDIRECTED_REQUEST, e.0)),
    };
    let target = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if let Some(resp) = too_long(target) {
        return Admit::Refuse(resp);
    }
    let path = req.uri().path();
    let route = match find(req.method(), path) {
        Ok(route) => route,
        Err(allow) if allow.is_empty() => return Admit::Refuse(not_found(path)),
        Err(allow) => return Admit::Refuse(not_allowed(path, req.method(), &allow)),
    };
    if let Some(resp) = over_limit(req.uri().query().map_or(0, query::count)) {
        return Admit::Refuse(resp);
    }
    match route.access {
        Access::Open | Access::Ingest => Admit::Pass(None),
        Access::SignIn => {
            if same_origin(req.headers(), &origin) {
                // The form's handler sets a `Secure` cookie for an HTTPS origin.
                req.extensions_mut().insert(origin);
                Admit::Pass(None)
            } else {
                Admit::Refuse(error(
                    StatusCode::FORBIDDEN,
                    "this form only takes posts from this collector's own pages \
                     (Sec-Fetch-Site or Origin of another site, or neither)"
                        .to_owned(),
                ))
            }
        }
        Access::Metrics if g.metrics_open => Admit::Pass(None),
        Access::Read | Access::Metrics => match g.read.decide(req.headers()) {
            Some(reader) => {
                req.extensions_mut().insert(reader);
                Admit::Pass(Some(reader))
            }
            None => Admit::Refuse(denied(route.kind, req)),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        m
    }

    /// (case, request headers, served over TLS, same origin)
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], bool, bool);

    #[test]
    fn a_post_is_same_origin_only_by_fetch_metadata_or_origin() {
        // The origin the request was sent to (its allowed `Host`).
        let own = |tls| Origin::new(if tls { "https" } else { "http" }, "127.0.0.1:7071");
        #[rustfmt::skip]
        let cases: &[Case<'_>] = &[
            ("same-origin fetch",   &[("sec-fetch-site", "same-origin")], false, true),
            ("cross-site fetch",    &[("sec-fetch-site", "cross-site"), ("origin", "http://127.0.0.1:7071")], false, false),
            ("same-site fetch",     &[("sec-fetch-site", "same-site")], false, false),
            ("typed url",           &[("sec-fetch-site", "none")], false, false),
            ("own origin",          &[("origin", "http://127.0.0.1:7071")], false, true),
            ("own origin over tls", &[("origin", "https://127.0.0.1:7071")], true, true),
            ("http origin on tls",  &[("origin", "http://127.0.0.1:7071")], true, false),
            ("other origin",        &[("origin", "https://evil.example")], false, false),
            ("null origin",         &[("origin", "null")], false, false),
            ("origin prefix",       &[("origin", "http://127.0.0.1:70711")], false, false),
            ("neither",             &[], false, false),
        ];
        for (case, headers, tls, want) in cases {
            assert_eq!(same_origin(&h(headers), &own(*tls)), *want, "{case}");
        }
    }

    #[test]
    fn the_table_lists_each_path_and_method_once() {
        for (i, a) in ROUTES.iter().enumerate() {
            for b in &ROUTES[i + 1..] {
                assert!(
                    a.path != b.path || a.methods.iter().all(|m| !b.methods.contains(m)),
                    "{} twice",
                    a.path
                );
            }
        }
    }

    #[test]
    fn over_the_query_limit_names_the_limit() {
        assert!(over_limit(MAX_QUERY_PARAMS).is_none());
        let r = over_limit(MAX_QUERY_PARAMS + 1).unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        assert!(too_long(MAX_TARGET_BYTES).is_none());
        let r = too_long(MAX_TARGET_BYTES + 1).unwrap();
        assert_eq!(r.status(), StatusCode::URI_TOO_LONG);
    }
}
