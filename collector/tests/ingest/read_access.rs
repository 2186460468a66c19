//! Reads (`GET /v1/records`, `/profile`, `/v1/stats`) behind the read token,
//! a role separate from the ingest token; forced records never served
//! without it; `limit` capped; the answer streamed; the CLI's read client.

use std::net::SocketAddr;
use std::process::Command;

use cpt_collector::ingest::CONTENT_TYPE_JSON_LINES;
use cpt_collector::serve::MAX_RECORDS_LIMIT;
use cpt_sdk::{Record, Trigger};

use crate::support::{
    HttpResponse, TestCollector, http_with_headers, json_lines, post_records, record, records,
};

const INGEST: &str = "ingest-t0ken";
const READ: &str = "r3ad-t0ken";

/// A forced record of a customer (the label reads want to protect).
fn forced(i: usize) -> Record {
    let mut r = record("forced", i);
    r.trigger = Trigger::Forced;
    r.request_id = Some(format!("forced-req-{i}"));
    r.labels
        .insert("customer".into(), "alice@example.com".into());
    r
}

fn send(addr: SocketAddr, token: Option<&str>, records: &[Record]) -> HttpResponse {
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("Content-Type", CONTENT_TYPE_JSON_LINES)];
    if let Some(a) = &auth {
        headers.push(("Authorization", a));
    }
    http_with_headers(addr, "POST", "/v1/records", &headers, &json_lines(records)).unwrap()
}

fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> HttpResponse {
    http_with_headers(addr, "GET", path, headers, b"").unwrap()
}

/// The JSON Lines of a (chunked) `GET /v1/records` answer.
fn lines(r: &HttpResponse) -> Vec<String> {
    let body = if r.header("transfer-encoding") == Some("chunked") {
        dechunk(&r.body)
    } else {
        r.body.clone()
    };
    String::from_utf8(body)
        .unwrap()
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

/// A profile answer's sample count and the sum of its values.
fn samples(r: &HttpResponse) -> (usize, i64) {
    let p = cpt_collector::profile::decode(&r.body).expect("a profile");
    (
        p.sample.len(),
        p.sample.iter().flat_map(|s| s.value.iter()).sum(),
    )
}

fn bearer(t: &str) -> String {
    format!("Bearer {t}")
}

fn with_both_tokens() -> TestCollector {
    let c = TestCollector::start(|c| c.with_ingest_token(INGEST).with_read_token(READ));
    let mut batch = crate::support::records("sampled", 5);
    batch.push(forced(0));
    assert_eq!(send(c.http(), Some(INGEST), &batch).status, 200);
    c
}

#[test]
fn reads_need_the_read_token_and_the_ingest_token_does_not_read() {
    let c = with_both_tokens();
    let addr = c.http();
    let (read, ingest) = (bearer(READ), bearer(INGEST));
    let lower = format!("bearer {READ}");
    let cookie = format!("theme=dark; cpt_read_token={READ}");
    for path in ["/v1/records?trigger=all", "/profile?service=A", "/v1/stats"] {
        let none = get(addr, path, &[]);
        assert_eq!(none.status, 401, "{path} without a token: {}", none.text());
        assert_eq!(none.header("www-authenticate"), Some("Bearer"), "{path}");
        assert!(none.text().contains("read token"), "{}", none.text());
        let wrong = get(addr, path, &[("Authorization", &ingest)]);
        assert_eq!(wrong.status, 401, "{path} with the ingest token");
        for (how, h) in [
            ("bearer", ("Authorization", read.as_str())),
            ("lowercase scheme", ("Authorization", lower.as_str())),
            ("cookie", ("Cookie", cookie.as_str())),
        ] {
            let ok = get(addr, path, &[h]);
            assert_eq!(
                ok.status,
                200,
                "{path} with the read token as {how}: {}",
                ok.text()
            );
        }
    }
    // Health stays open.
    assert_eq!(get(addr, "/healthz", &[]).status, 200);
    // With the read token, forced records are served, labels and ids and all.
    let all = get(addr, "/v1/records?trigger=all", &[("Authorization", &read)]);
    assert_eq!(lines(&all).len(), 6, "{}", all.text());
    assert!(all.text().contains("alice@example.com"));
    assert_eq!(all.header("x-cpt-forced-records"), None);
    // The read token does not send.
    let sent = send(addr, Some(READ), &[record("x", 0)]);
    assert_eq!(sent.status, 401, "{}", sent.text());
}

#[test]
fn an_open_collector_serves_no_forced_record_label_or_id() {
    let c = TestCollector::start(|c| c);
    let addr = c.http();
    let mut batch = crate::support::records("sampled", 5);
    batch.push(forced(0));
    assert_eq!(send(addr, None, &batch).status, 200);

    let all = get(addr, "/v1/records?trigger=all", &[]);
    assert_eq!(all.status, 200);
    assert_eq!(all.header("x-cpt-forced-records"), Some("withheld"));
    assert_eq!(lines(&all).len(), 5, "{}", all.text());
    assert!(!all.text().contains("alice"), "{}", all.text());
    assert!(!all.text().contains("forced-req"), "{}", all.text());

    let by_id = get(addr, "/v1/records?request_id=forced-req-0", &[]);
    assert_eq!(by_id.status, 200);
    assert!(lines(&by_id).is_empty(), "{}", by_id.text());

    let forced_only = get(addr, "/v1/records?trigger=forced", &[]);
    assert_eq!(forced_only.status, 403, "{}", forced_only.text());
    assert!(forced_only.text().contains("--read-token-file"));
    assert_eq!(get(addr, "/profile?trigger=forced", &[]).status, 403);

    // /profile answers no yes/no question about a forced record's label or
    // id: the answer for alice is the answer for nobody.
    let alice = get(addr, "/profile?label=customer=alice%40example.com", &[]);
    let nobody = get(addr, "/profile?label=customer=nobody", &[]);
    assert_eq!((alice.status, nobody.status), (200, 200));
    assert_eq!(samples(&alice), samples(&nobody));
    assert_eq!(samples(&nobody), (0, 0));
    let id = get(addr, "/profile?request_id=forced-req-0", &[]);
    let no_id = get(addr, "/profile?request_id=no-such-req", &[]);
    assert_eq!(samples(&id), samples(&no_id));
    // Sampled ones are still found.
    let sampled = get(addr, "/profile?request_id=sampled%2F1", &[]);
    assert_ne!(samples(&sampled), samples(&no_id));
}

#[test]
fn records_limit_is_capped_and_the_answer_is_streamed() {
    let c = TestCollector::start(|c| c.with_read_token(READ));
    let addr = c.http();
    let read = bearer(READ);
    let n = 3000;
    assert_eq!(
        send(addr, None, &crate::support::records("many", n)).status,
        200
    );

    let over = get(
        addr,
        &format!("/v1/records?limit={}", MAX_RECORDS_LIMIT + 1),
        &[("Authorization", &read)],
    );
    assert_eq!(over.status, 400, "{}", over.text());
    assert!(
        over.text().contains(&MAX_RECORDS_LIMIT.to_string()),
        "{}",
        over.text()
    );
    let huge = get(
        addr,
        "/v1/records?limit=1000000000",
        &[("Authorization", &read)],
    );
    assert_eq!(huge.status, 400);

    let at_max = get(
        addr,
        &format!("/v1/records?limit={MAX_RECORDS_LIMIT}"),
        &[("Authorization", &read)],
    );
    assert_eq!(at_max.status, 200);
    assert_eq!(at_max.header("transfer-encoding"), Some("chunked"));
    assert_eq!(lines(&at_max).len(), n);

    // The default limit.
    let default = get(addr, "/v1/records", &[("Authorization", &read)]);
    assert_eq!(
        lines(&default).len() as u64,
        cpt_collector::serve::DEFAULT_RECORDS_LIMIT
    );
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let eol = b
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("chunk size line");
        let size =
            usize::from_str_radix(std::str::from_utf8(&b[..eol]).unwrap().trim(), 16).unwrap();
        b = &b[eol + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&b[..size]);
        b = &b[size + 2..];
    }
}

fn cpt(args: &[&str], env_token: Option<&str>) -> (bool, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cpt"));
    cmd.args(args).env_remove("CPT_READ_TOKEN");
    if let Some(t) = env_token {
        cmd.env("CPT_READ_TOKEN", t);
    }
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn cli_show_and_profile_take_the_read_token_from_a_file_or_cpt_read_token() {
    let c = with_both_tokens();
    let url = format!("http://{}", c.http());
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("read-token");
    std::fs::write(&token_file, format!("{READ}\n")).unwrap();
    let token_file = token_file.to_str().unwrap();
    let show = ["show", "--collector", &url, "--request-id", "forced-req-0"];

    let (ok, _, err) = cpt(&show, None);
    assert!(!ok);
    assert!(
        err.contains("--read-token-file") && err.contains("CPT_READ_TOKEN"),
        "{err}"
    );

    let (ok, _, err) = cpt(&show, Some(INGEST));
    assert!(!ok);
    assert!(
        err.contains("refused the read token from CPT_READ_TOKEN"),
        "{err}"
    );

    let (ok, out, err) = cpt(&show, Some(READ));
    assert!(ok, "{err}");
    assert!(out.contains("forced-req-0"), "{out}");

    let (ok, out, err) = cpt(
        &[&show[..], &["--read-token-file", token_file]].concat(),
        None,
    );
    assert!(ok, "{err}");
    assert!(out.contains("forced-req-0"), "{out}");

    let profile = dir.path().join("p.pb.gz");
    let profile = profile.to_str().unwrap();
    let args = [
        "profile",
        "--collector",
        &url,
        "--service",
        "A",
        "-o",
        profile,
    ];
    let (ok, _, err) = cpt(&args, None);
    assert!(!ok);
    assert!(err.contains("--read-token-file"), "{err}");
    let (ok, _, err) = cpt(
        &[&args[..], &["--read-token-file", token_file]].concat(),
        None,
    );
    assert!(ok, "{err}");
    let gz = std::fs::read(profile).unwrap();
    assert_eq!(&gz[..2], &[0x1f, 0x8b], "a gzipped profile");
}

#[test]
fn cli_show_against_the_grpc_port_names_the_http_port() {
    let c = TestCollector::start(|c| c);
    let url = format!("http://{}", c.grpc());
    let (ok, _, err) = cpt(&["show", "--collector", &url, "--request-id", "r"], None);
    assert!(!ok);
    assert!(err.contains("gRPC port"), "{err}");
    assert!(err.contains("cpt serve --http"), "{err}");
    assert!(!err.contains("no record"), "{err}");
}

#[test]
fn cli_show_checks_trace_and_request_ids() {
    for (args, want) in [
        (&["--trace-id", "xyz"][..], "expected 32 hex digits"),
        (
            &["--trace-id", "4bf92f3577b34da6a3ce929d0e0e47"],
            "expected 32 hex digits",
        ),
        (&["--request-id", ""], "request id is empty"),
        (&["--request-id", "a\tb"], "x-request-id"),
    ] {
        let (ok, _, err) = cpt(
            &[&["show", "--collector", "http://127.0.0.1:9"][..], args].concat(),
            None,
        );
        assert!(!ok);
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

#[test]
fn an_open_collector_tells_show_why_a_forced_record_is_not_found() {
    let c = TestCollector::start(|c| c);
    assert_eq!(send(c.http(), None, &[forced(1)]).status, 200);
    let url = format!("http://{}", c.http());
    let (ok, _, err) = cpt(
        &["show", "--collector", &url, "--request-id", "forced-req-1"],
        None,
    );
    assert!(!ok);
    assert!(err.contains("no read token"), "{err}");
}

#[test]
fn show_compare_against_a_collector_averages_what_its_store_holds() {
    let c = TestCollector::start(|c| c);
    // Sampled requests of one endpoint (several batches' worth), the one to
    // show among them.
    let mut batch = records("cmp", 3000);
    batch[1234].request_id = Some("the-one".into());
    for part in batch.chunks(1000) {
        assert_eq!(
            post_records(c.http(), CONTENT_TYPE_JSON_LINES, &json_lines(part)).status,
            200
        );
    }
    let url = format!("http://{}", c.http());
    let store = c.store.to_str().unwrap();
    let args = |source: &[&str]| -> Vec<String> {
        let mut a = vec!["show", "--request-id", "the-one", "--compare"];
        a.extend_from_slice(source);
        a.into_iter().map(String::from).collect()
    };
    let run = |a: Vec<String>| {
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        let (ok, out, err) = cpt(&a, None);
        assert!(ok, "{a:?}: {err}");
        out
    };
    let remote = run(args(&["--collector", &url]));
    assert!(
        remote.contains("compared with the mean of 3000 sampled requests"),
        "{remote}"
    );
    assert_eq!(remote, run(args(&["--store", store])));
}

/// `cpt show --compare --collector` for endpoints and services whose names
/// hold what a hand-built query breaks on (a space and braces as in
/// `GET /quote/{item}`, `&`, `%`, `+`, `#`, non-ASCII): the collector
/// answers for exactly those records, as the store does.
#[test]
fn show_compare_against_a_collector_takes_any_endpoint_name() {
    let c = TestCollector::start(|c| c);
    #[rustfmt::skip]
    let names: &[(&str, &str)] = &[
        ("gateway",          "GET /quote/{item}"),
        ("shop & co",        "POST /cart?x=1&y=2"),
        ("100% svc",         "a+b #frag"),
        ("Zürich 東京",      "/ü/{id}%2F"),
    ];
    let mut batch = Vec::new();
    for (n, (service, endpoint)) in names.iter().enumerate() {
        for i in 0..5 {
            let mut r = record("names", n * 10 + i);
            r.service = (*service).into();
            r.endpoint = Some((*endpoint).into());
            r.request_id = Some(format!("op-{n}-{i}"));
            batch.push(r);
        }
    }
    assert_eq!(
        post_records(c.http(), CONTENT_TYPE_JSON_LINES, &json_lines(&batch)).status,
        200
    );
    let url = format!("http://{}", c.http());
    let store = c.store.to_str().unwrap();
    for (n, (service, endpoint)) in names.iter().enumerate() {
        let id = format!("op-{n}-2");
        let show = |source: &[&str]| {
            let mut a = vec!["show", "--request-id", &id, "--compare"];
            a.extend_from_slice(source);
            let (ok, out, err) = cpt(&a, None);
            assert!(ok, "{service} {endpoint}: {err}");
            out
        };
        let remote = show(&["--collector", &url]);
        assert!(
            remote.contains("compared with the mean of 5 sampled requests"),
            "{service} {endpoint}: {remote}"
        );
        assert_eq!(remote, show(&["--store", store]), "{service} {endpoint}");
        let (ok, _, err) = cpt(
            &[
                "profile",
                "--collector",
                &url,
                "--service",
                service,
                "--endpoint",
                endpoint,
                "-o",
                "-",
            ],
            None,
        );
        assert!(ok, "{service} {endpoint}: {err}");
    }
}
