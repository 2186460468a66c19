//! The web pages' defences over HTTP, one test per attack: where a
//! sign-in sends the browser, the headers every answer carries, posts from
//! other sites, queries too large for the store, and names no page may
//! write raw or link wrongly. (Who sees which records, route by route:
//! `policy_tests.rs`.)

use std::time::Duration;

use cpt_sdk::path::{CriticalPath, Frame, SegmentKind};
use cpt_sdk::record::Record;
use cpt_sdk::trigger::Trigger;

use super::http_tests::{SAME_ORIGIN, get, h2_request, request, serve, version};
use crate::server::MAX_QUERY_PARAMS;

const PAGES: &[&str] = &[
    "/",
    "/ui/profile?service=A",
    "/ui/flame.svg?service=A",
    "/ui/request?id=v1-0",
    "/ui/diff?base=service%3DA&test=service%3DA",
    "/ui/diff.svg?base=service%3DA&test=service%3DA",
    "/ui/login",
    "/ui/style.css",
    "/profile?service=A",
    "/v1/records?service=A",
    "/v1/stats",
    "/healthz",
];

#[test]
fn sign_in_never_sends_the_browser_to_another_site() {
    let s = serve(&version("v1", 4), Some("tok3n"));
    // (as the form posts `next`, where the browser is sent)
    #[rustfmt::skip]
    let cases: &[(&str, &str)] = &[
        ("%2Fui%2Fprofile%3Fservice%3DA", "/ui/profile?service=A"),
        ("%2F%09%2Fevil.example",         "/"),
        ("%2F%0A%2Fevil.example",         "/"),
        ("%2F%20%2Fevil.example",         "/"),
        ("%2F%2Fevil.example",            "/"),
        ("%2F%5Cevil.example",            "/"),
        ("https%3A%2F%2Fevil.example",    "/"),
        ("%2F%00%2Fevil.example",         "/"),
        ("%252F%252Fevil.example",        "/"),
    ];
    for (next, want) in cases {
        let a = request(
            &s,
            "POST",
            "/ui/login",
            &[SAME_ORIGIN],
            &format!("token=tok3n&next={next}"),
        );
        assert_eq!(a.status, 303, "{next}");
        assert_eq!(a.header("location"), Some(*want), "{next}");
        // The form carries the same `next` only when it is local.
        let form = get(&s, &format!("/ui/login?next={next}"), &[]);
        let carried = format!(r#"name="next" value="{}""#, want.replace('&', "&amp;"));
        assert!(form.body.contains(&carried), "{next}: {}", form.body);
    }
}

#[test]
fn every_answer_forbids_framing_sniffing_and_referrers() {
    let s = serve(&version("v1", 4), None);
    for page in PAGES {
        let a = get(&s, page, &[]);
        assert!(a.status < 400, "{page}: {} {}", a.status, a.body);
        assert_eq!(
            a.header("x-content-type-options"),
            Some("nosniff"),
            "{page}"
        );
        assert_eq!(a.header("referrer-policy"), Some("no-referrer"), "{page}");
        let csp = a.header("content-security-policy").unwrap();
        let svg = page.contains(".svg");
        if svg {
            // The collector's own pages frame the graphs; nothing else does.
            assert!(csp.contains("frame-ancestors 'self'"), "{page}: {csp}");
            assert_eq!(a.header("x-frame-options"), Some("SAMEORIGIN"), "{page}");
        } else {
            assert!(csp.contains("frame-ancestors 'none'"), "{page}: {csp}");
            assert_eq!(a.header("x-frame-options"), Some("DENY"), "{page}");
        }
        assert!(csp.starts_with("default-src 'none'"), "{page}: {csp}");
        assert!(
            !csp.contains("unsafe") && !csp.contains('*'),
            "{page}: {csp}"
        );
        // No page carries an inline style or script its policy would block.
        if a.header("content-type")
            .is_some_and(|c| c.starts_with("text/html"))
        {
            assert!(
                !a.body.contains("style=\"") && !a.body.contains("<script"),
                "{page}"
            );
        }
    }
    // The flame graph's script and style are allowed by hash, nothing more.
    let svg = get(&s, "/ui/flame.svg?service=A", &[]);
    let csp = svg.header("content-security-policy").unwrap();
    assert!(
        csp.contains("script-src 'sha256-") && csp.contains("style-src 'sha256-"),
        "{csp}"
    );
    assert!(!svg.body.contains("onload="));
    // A graph that cannot be drawn says why in the same frame.
    let none = get(&s, "/ui/flame.svg?service=Nobody", &[]);
    assert_eq!(none.status, 404, "{}", none.body);
    assert_eq!(none.header("x-frame-options"), Some("SAMEORIGIN"));
    let csp = none.header("content-security-policy").unwrap();
    assert!(
        csp.contains("frame-ancestors 'self'") && !csp.contains("script-src"),
        "{csp}"
    );
}

#[test]
fn posts_from_another_site_neither_sign_in_nor_out() {
    let s = serve(&version("v1", 4), Some("tok3n"));
    let body = "token=tok3n&next=%2F";
    for (case, headers) in [
        ("other origin", &["Origin: https://evil.example"][..]),
        (
            "cross-site fetch",
            &["Sec-Fetch-Site: cross-site", "Origin: http://localhost"][..],
        ),
        ("same-site fetch", &["Sec-Fetch-Site: same-site"][..]),
        ("null origin", &["Origin: null"][..]),
        ("neither", &[][..]),
    ] {
        for path in ["/ui/login", "/ui/logout"] {
            let a = request(&s, "POST", path, headers, body);
            assert_eq!(a.status, 403, "{case} {path}: {}", a.body);
            assert!(a.header("set-cookie").is_none(), "{case} {path}");
        }
    }
    // The collector's own form (the test client's Host is `localhost`).
    for headers in [&[SAME_ORIGIN][..], &["Origin: http://localhost"][..]] {
        let a = request(&s, "POST", "/ui/login", headers, body);
        assert_eq!(a.status, 303, "{headers:?}");
        assert!(a.header("set-cookie").is_some());
    }
}

#[test]
fn sign_in_over_http2_compares_the_origin_with_the_authority() {
    // A browser over HTTP/2 sends `:authority`, no `Host`; one without
    // Fetch Metadata sends only `Origin` with its form.
    let s = serve(&version("v1", 4), Some("tok3n"));
    let own = s.authority();
    let body = "token=tok3n&next=%2F";
    let form = ("content-type", "application/x-www-form-urlencoded");
    // (case, :authority, Origin, status)
    let cases = [
        ("own origin", own.clone(), format!("http://{own}"), 303),
        (
            "localhost",
            "localhost:1".to_owned(),
            "http://localhost:1".to_owned(),
            303,
        ),
        (
            "other origin",
            own.clone(),
            "http://evil.example".to_owned(),
            403,
        ),
        (
            "other port",
            own.clone(),
            "http://127.0.0.1:1".to_owned(),
            403,
        ),
    ];
    for (case, authority, origin, want) in cases {
        let a = h2_request(
            &s,
            "POST",
            &authority,
            "/ui/login",
            &[form, ("origin", &origin)],
            body,
        );
        assert_eq!(a.status, want, "{case}: {}", a.body);
        assert_eq!(a.header("set-cookie").is_some(), want == 303, "{case}");
    }
    // A page of another site that resolved its name to the collector.
    let a = h2_request(&s, "GET", "rebind.attacker.example", "/", &[], "");
    assert_eq!(a.status, 421, "{}", a.body);
}

#[test]
fn a_query_too_large_is_the_same_400_naming_the_limit_on_every_route() {
    let s = serve(&version("v1", 4), None);
    let labels = |n: usize| {
        (0..n)
            .map(|i| format!("label=k{i}%3Dv"))
            .collect::<Vec<_>>()
            .join("&")
    };
    let limit = format!("over the limit of {MAX_QUERY_PARAMS}");
    for page in PAGES {
        let path = page.split('?').next().unwrap();
        for n in [MAX_QUERY_PARAMS + 1, 1000] {
            let a = get(&s, &format!("{path}?{}", labels(n)), &[]);
            assert_eq!(a.status, 400, "{path} with {n}: {}", a.body);
            assert!(a.body.contains(&limit), "{path}: {}", a.body);
        }
    }
    // Inside one parameter (a comparison's arm) the selection's own limit
    // answers, never the store.
    let arm = crate::records::query::encode_value(&labels(1000));
    for path in ["/ui/diff", "/ui/diff.svg"] {
        let a = get(&s, &format!("{path}?base={arm}&test=service%3DA"), &[]);
        assert_eq!(a.status, 400, "{path}: {}", a.body);
        assert!(a.body.contains(&limit), "{path}: {}", a.body);
    }
    // A full selection within the limit still answers.
    let ok = get(
        &s,
        &format!("/ui/profile?{}", labels(MAX_QUERY_PARAMS - 1)),
        &[],
    );
    assert_eq!(ok.status, 200, "{}", ok.body);
}

/// A record whose service names hold a NUL and a space.
fn odd_names() -> Record {
    let mut p = CriticalPath::new();
    let root = Frame::new("edge\0gw", "handle");
    p.push_frames([root.clone()], Duration::from_millis(2), SegmentKind::Busy);
    p.push_frames(
        [root, Frame::new("quote service", "price")],
        Duration::from_millis(3),
        SegmentKind::Busy,
    );
    let mut r = Record::new("edge\0gw", Trigger::Sampled, p);
    r.endpoint = Some("GET /quote/{item}".into());
    r.request_id = Some("odd-1".into());
    r.start_unix_nanos = Some(1_700_000_000_000_000_000);
    r
}

#[test]
fn names_with_nul_and_spaces_are_shown_escaped_and_linked_whole() {
    let s = serve(&[odd_names()], None);
    let q = "service=edge%00gw&endpoint=GET+%2Fquote%2F%7Bitem%7D";
    for page in [
        "/".to_owned(),
        format!("/ui/profile?{q}"),
        "/ui/request?id=odd-1".to_owned(),
    ] {
        let a = get(&s, &page, &[]);
        assert_eq!(a.status, 200, "{page}: {}", a.body);
        assert!(!a.body.contains('\0'), "{page} writes a raw NUL");
        assert!(a.body.contains("edge\u{2400}gw"), "{page}: {}", a.body);
    }
    let index = get(&s, "/", &[]);
    // Both tables link to the entry service's profile with its whole name
    // and endpoint, each encoded once.
    let link = format!(r#"href="/ui/profile?{}""#, q.replace('&', "&amp;"));
    assert_eq!(index.body.matches(&link).count(), 4, "{}", index.body);
    assert!(index.body.contains(r#"<tr data-service="quote service">"#));
    // The link answers for the record it names.
    let profile = get(&s, &format!("/ui/profile?{q}"), &[]);
    assert!(
        profile.body.contains("all 1 matching requests"),
        "{}",
        profile.body
    );
}
