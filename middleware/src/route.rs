//! [`Route`]: the route template an HTTP request names its node after, and
//! the bounded default when none is known.
//!
//! A node name is a profile frame; naming nodes after raw paths
//! (`GET /items/0`, `GET /items/1`, …) makes one frame per id, unbounded.
//! HTTP nodes are therefore named, in this order, after
//!
//! 1. the layer's naming function (`ServerLayer::with_endpoint_fn`,
//!    `ClientLayer::with_name_fn`), when set;
//! 2. axum's `MatchedPath` (feature `axum`, server side);
//! 3. a [`Route`] in the request extensions;
//! 4. else the method and the path's first segment, with `/*` when more
//!    segments follow: `GET /items/*` for `/items/0`, `GET /health` for
//!    `/health`, `GET /` for `/`.

use std::fmt;
use std::sync::Arc;

/// The route template of an HTTP request (OpenTelemetry's `http.route`,
/// e.g. `/items/{id}`): put it in the request's extensions and the
/// middleware names the request's node `METHOD route`.
///
/// # Examples
///
/// ```
/// use cpt_middleware::Route;
/// let mut req = http::Request::get("/items/42").body(()).unwrap();
/// req.extensions_mut().insert(Route::new("/items/{id}"));
/// // a `ClientLayer::http("items")` names this call `items GET /items/{id}`
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Route(Arc<str>);

impl Route {
    /// The route `route` (a template such as `/items/{id}`, not a path with
    /// ids in it).
    pub fn new(route: impl Into<Arc<str>>) -> Route {
        Route(route.into())
    }

    /// The route template.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `METHOD route` from a [`Route`] extension, else the bounded default
/// `METHOD /first-segment[/*]`.
pub(crate) fn http_name(
    method: &http::Method,
    uri: &http::Uri,
    extensions: &http::Extensions,
) -> String {
    http_name_of_path(method, uri.path(), extensions.get::<Route>())
}

/// [`http_name`] from the path alone and the route, if known.
pub(crate) fn http_name_of_path(
    method: &http::Method,
    path: &str,
    route: Option<&Route>,
) -> String {
    // Assembled in one `String` of the exact size (no formatting machinery,
    // no intermediate string for the bounded path).
    let method = method.as_str();
    if let Some(route) = route {
        return concat(&[method, " ", route.as_str()]);
    }
    let [slash, first, tail] = bounded_parts(path);
    concat(&[method, " ", slash, first, tail])
}

/// The path's first segment, with `/*` when more segments follow.
#[cfg(test)]
pub(crate) fn bounded_path(path: &str) -> String {
    concat(&bounded_parts(path))
}

/// The bounded form of `path` in three pieces: `/`, the first segment, and
/// `/*` when more segments follow (`/` when the path ends there).
fn bounded_parts(path: &str) -> [&str; 3] {
    let rest = path.trim_start_matches('/');
    match rest.split_once('/') {
        None => ["/", rest, ""],
        Some((first, "")) => ["/", first, "/"],
        Some((first, _)) => ["/", first, "/*"],
    }
}

/// `parts` joined, in a string of exactly their length.
pub(crate) fn concat(parts: &[&str]) -> String {
    let mut s = String::with_capacity(parts.iter().map(|p| p.len()).sum());
    for p in parts {
        s.push_str(p);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_path_keeps_only_the_first_segment() {
        assert_eq!(bounded_path("/items/0"), "/items/*");
        assert_eq!(bounded_path("/items/1"), "/items/*");
        assert_eq!(bounded_path("/items/1/reviews/7"), "/items/*");
        assert_eq!(bounded_path("/health"), "/health");
        assert_eq!(bounded_path("/items/"), "/items/");
        assert_eq!(bounded_path("/"), "/");
        assert_eq!(bounded_path(""), "/");
    }

    #[test]
    fn a_route_extension_names_the_request() {
        let mut ext = http::Extensions::new();
        let uri: http::Uri = "/items/42?x=1".parse().unwrap();
        assert_eq!(http_name(&http::Method::GET, &uri, &ext), "GET /items/*");
        ext.insert(Route::new("/items/{id}"));
        assert_eq!(http_name(&http::Method::GET, &uri, &ext), "GET /items/{id}");
    }
}
