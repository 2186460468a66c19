//! The read policy, route by route: every row of the route table
//! (`server/edge/routes.rs`) is asked for a forced record every way a route
//! could take it, on an open collector and on one with a read token, and
//! every answer is checked for what it must not show and for the security
//! headers. A route added to the table that skips the policy (an `Open`
//! row that shows records, a `Read` handler that does not narrow its
//! selection) shows the forced record or, without the token, a sampled one,
//! and fails here; a route added to the router but not to the table is
//! never reached (the guard answers 404).

use super::http_tests::{Answer, SAME_ORIGIN, forced, request, serve, version};
use crate::server::edge::routes::{Access, ROUTES, Route};

/// What only the forced record holds and no probe names (an error may echo
/// the query): a label and its callee.
const FORCED_MARKS: &[&str] = &["ACME-7", "B1 (B)"];
/// What only the sampled records hold (ids of `version("v1", …)`).
const SAMPLED_MARKS: &[&str] = &["v1-0", "C1 (C)"];

/// Queries that ask for the forced record: by id, by trigger, by label,
/// in a comparison's arms, or nothing at all.
const PROBES: &[&str] = &[
    "",
    "id=forced-1",
    "request_id=forced-1",
    "request_id=forced-1&trigger=all",
    "trigger=forced",
    "trigger=all",
    "trigger=all&label=ticket%3DINC-42&sample=all",
    "service=A&trigger=all",
    "base=request_id%3Dforced-1&test=trigger%3Dall",
    "base=trigger%3Dforced&test=label%3Dticket%3DINC-42%26trigger%3Dall",
];

fn records() -> Vec<cpt_sdk::record::Record> {
    let mut r = version("v1", 4);
    r.push(forced());
    r
}

fn shows(a: &Answer, marks: &[&str]) -> Option<String> {
    marks
        .iter()
        .find(|m| a.body.contains(*m) || a.head.contains(*m))
        .map(|m| (*m).to_owned())
}

fn assert_secure(a: &Answer, what: &str) {
    assert_eq!(
        a.header("x-content-type-options"),
        Some("nosniff"),
        "{what}"
    );
    assert_eq!(a.header("referrer-policy"), Some("no-referrer"), "{what}");
    let csp = a
        .header("content-security-policy")
        .unwrap_or_else(|| panic!("{what}: no CSP"));
    assert!(csp.contains("default-src 'none'"), "{what}: {csp}");
    assert!(!csp.contains("unsafe"), "{what}: {csp}");
    assert!(csp.contains("frame-ancestors"), "{what}: {csp}");
}

/// The router has a handler for the row (the guard's own 404 says "no such
/// page"; a handler's 404 is about the records), and it did not fail.
fn assert_routed(a: &Answer, what: &str) {
    assert!(
        !a.body.contains("no such page or API"),
        "{what}: the table lists a route the router lacks"
    );
    assert_ne!(a.status, 500, "{what}: {}", a.body);
}

/// One request of the walk: a route with a probe.
struct Call {
    route: &'static Route,
    method: &'static str,
    target: String,
    /// A browser's form post from the collector's own page, for POSTs.
    body: &'static str,
}

impl Call {
    fn what(&self) -> String {
        format!("{} {}", self.method, self.target)
    }

    fn send(&self, s: &super::http_tests::Served, extra: &[&str]) -> Answer {
        let mut headers = vec![SAME_ORIGIN];
        headers.extend_from_slice(extra);
        request(s, self.method, &self.target, &headers, self.body)
    }
}

/// Each route of the table with each probe.
fn calls() -> Vec<Call> {
    let mut out = Vec::new();
    for route in ROUTES {
        for method in route.methods {
            for probe in PROBES {
                let target = if probe.is_empty() {
                    route.path.to_owned()
                } else {
                    format!("{}?{probe}", route.path)
                };
                let body = if *method == http::Method::POST {
                    "x=1"
                } else {
                    ""
                };
                out.push(Call {
                    route,
                    method: method.as_str(),
                    target,
                    body,
                });
            }
        }
    }
    out
}

#[test]
fn an_open_collector_withholds_forced_records_from_every_route() {
    let s = serve(&records(), None);
    let mut answered = 0;
    for call in calls() {
        let what = call.what();
        let a = call.send(&s, &[]);
        assert_routed(&a, &what);
        if let Some(m) = shows(&a, FORCED_MARKS) {
            panic!(
                "{what} shows the forced record ({m}) on an open collector:\n{}",
                a.body
            );
        }
        assert_secure(&a, &what);
        if call.route.access == Access::Read {
            assert_eq!(a.header("x-cpt-forced-records"), Some("withheld"), "{what}");
        }
        answered += usize::from(a.status == 200);
    }
    assert!(
        answered > ROUTES.len(),
        "the probes mostly answered: {answered}"
    );
    // The records are there: the same pages show the sampled ones.
    let index = request(&s, "GET", "/", &[], "");
    assert!(
        index.body.contains(r#"<tr data-service="A">"#),
        "{}",
        index.body
    );
    let sampled = request(&s, "GET", "/ui/request?id=v1-0", &[], "");
    assert_eq!(sampled.status, 200, "{}", sampled.body);
}

#[test]
fn with_a_read_token_no_route_shows_a_record_without_it_and_every_one_with_it() {
    let s = serve(&records(), Some("tok3n"));
    for call in calls() {
        let what = call.what();
        let without = call.send(&s, &[]);
        if let Some(m) = shows(&without, FORCED_MARKS).or_else(|| shows(&without, SAMPLED_MARKS)) {
            panic!(
                "{what} shows a record ({m}) without the read token:\n{}",
                without.body
            );
        }
        assert_secure(&without, &what);
        if matches!(call.route.access, Access::Read | Access::Metrics) {
            assert_eq!(without.status, 401, "{what}");
        }
        let a = call.send(&s, &["Authorization: Bearer tok3n"]);
        assert_routed(&a, &what);
        assert_eq!(a.header("x-cpt-forced-records"), None, "{what}");
        assert_secure(&a, &what);
    }
    // With the token, forced records are there on the pages that list them.
    let auth = ["Authorization: Bearer tok3n"];
    for target in [
        "/",
        "/ui/request?id=forced-1",
        "/v1/records?request_id=forced-1",
    ] {
        let a = request(&s, "GET", target, &auth, "");
        assert!(a.body.contains("forced-1"), "{target}: {}", a.body);
    }
    let profile = request(&s, "GET", "/profile?trigger=forced", &auth, "");
    assert!(
        profile.body.contains("B1 (B)"),
        "the pprof profile folds the forced record"
    );
}

#[test]
fn a_path_or_method_outside_the_table_is_refused_with_the_same_headers() {
    let s = serve(&records(), None);
    let a = request(&s, "GET", "/nope", &[], "");
    assert_eq!(a.status, 404);
    assert_secure(&a, "GET /nope");
    let a = request(&s, "DELETE", "/ui/profile", &[], "");
    assert_eq!(a.status, 405);
    assert_eq!(a.header("allow"), Some("GET"));
}
