//! The pages over HTTP from a running collector: what they show for known
//! records (CPT Table 1, an injected change), the read gate and the login
//! cookie, and the errors a wrong query gets. (The same pages in a real
//! browser, with screenshots: `tests/browser/`.)

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use cpt_sdk::path::{CriticalPath, Frame, SegmentKind};
use cpt_sdk::record::Record;
use cpt_sdk::testing::fixtures::table1;
use cpt_sdk::trigger::Trigger;

use crate::server::store::Store;
use crate::server::{Collector, ServeConfig};

pub(super) struct Served {
    rt: tokio::runtime::Runtime,
    collector: Option<Collector>,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(c) = self.collector.take() {
            let _ = self.rt.block_on(c.shutdown());
        }
    }
}

pub(super) struct Answer {
    pub(super) status: u16,
    pub(super) head: String,
    /// The body, gunzipped when it was gzip (the pprof download).
    pub(super) body: String,
}

impl Answer {
    pub(super) fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A forced request with an id and a label, path {A1 3 ms, A1→B1 5 ms
/// network, A1 1 ms}: 9 ms.
pub(super) fn forced() -> Record {
    let mut p = CriticalPath::new();
    let a1 = Frame::new("A", "A1");
    p.push_frames([a1.clone()], ms(3), SegmentKind::Busy);
    p.push_frames(
        [a1.clone(), Frame::new("B", "B1")],
        ms(5),
        SegmentKind::Network,
    );
    p.push_frames([a1], ms(1), SegmentKind::Busy);
    let mut r = Record::new("A", Trigger::Forced, p);
    r.request_id = Some("forced-1".into());
    r.endpoint = Some("/run".into());
    r.labels.insert("ticket".into(), "INC-42".into());
    r.labels.insert("customer".into(), "ACME-7".into());
    r.start_unix_nanos = Some(1_700_000_000_500_000_000);
    r
}

/// Requests of one version: A1 2 ms then C1 `c1` ms, 20 of them.
pub(super) fn version(v: &str, c1: u64) -> Vec<Record> {
    (0..20)
        .map(|i| {
            let mut p = CriticalPath::new();
            let a1 = Frame::new("A", "A1");
            // A little spread so the intervals are not zero-width.
            p.push_frames(
                [a1.clone()],
                ms(2) + Duration::from_micros(i * 10),
                SegmentKind::Busy,
            );
            p.push_frames([a1, Frame::new("C", "C1")], ms(c1), SegmentKind::Busy);
            let mut r = Record::new("A", Trigger::Sampled, p);
            r.endpoint = Some("/run".into());
            r.labels.insert("version".into(), v.into());
            r.request_id = Some(format!("{v}-{i}"));
            r.start_unix_nanos = Some(1_700_000_001_000_000_000 + i * 1000);
            r
        })
        .collect()
}

pub(super) fn serve(records: &[Record], token: Option<&str>) -> Served {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    Store::open(&path).unwrap().insert(records).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut config = ServeConfig::new(&path).with_http("127.0.0.1:0".parse().unwrap());
    if let Some(t) = token {
        config = config.with_read_token(t);
    }
    let collector = rt.block_on(Collector::start(config)).unwrap();
    let addr = collector.http_addr().unwrap();
    Served {
        rt,
        collector: Some(collector),
        addr,
        _dir: dir,
    }
}

pub(super) fn request(
    s: &Served,
    method: &str,
    target: &str,
    headers: &[&str],
    body: &str,
) -> Answer {
    let mut c = TcpStream::connect(s.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut req = format!("{method} {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    for h in headers {
        req.push_str(h);
        req.push_str("\r\n");
    }
    if !body.is_empty() {
        req.push_str(&format!(
            "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    req.push_str("\r\n");
    req.push_str(body);
    c.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    c.read_to_end(&mut raw).unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8(raw[..split].to_vec()).unwrap();
    let mut body = raw[split + 4..].to_vec();
    if body.starts_with(&[0x1f, 0x8b]) {
        let mut plain = Vec::new();
        flate2::read::GzDecoder::new(&body[..])
            .read_to_end(&mut plain)
            .unwrap();
        body = plain;
    }
    Answer {
        status: head.split(' ').nth(1).unwrap().parse().unwrap(),
        head,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

impl Served {
    /// `IP:PORT` of the collector's HTTP port.
    pub(super) fn authority(&self) -> String {
        self.addr.to_string()
    }
}

/// One request over HTTP/2 (prior knowledge, as a browser's TLS
/// connection negotiates it): `authority` goes in `:authority`, and no
/// `Host` header is sent.
pub(super) fn h2_request(
    s: &Served,
    method: &str,
    authority: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    use http_body_util::BodyExt as _;
    s.rt.block_on(async {
        let tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
        let (mut send, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(tcp),
        )
        .await
        .unwrap();
        tokio::spawn(conn);
        let mut req = http::Request::builder()
            .method(method)
            .uri(format!("http://{authority}{target}"));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req
            .body(http_body_util::Full::new(bytes::Bytes::from(
                body.to_owned(),
            )))
            .unwrap();
        let resp = send.send_request(req).await.unwrap();
        assert_eq!(resp.version(), http::Version::HTTP_2);
        let status = resp.status().as_u16();
        let head = resp
            .headers()
            .iter()
            .map(|(k, v)| format!("{k}: {}\n", v.to_str().unwrap_or("")))
            .collect();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        Answer {
            status,
            head,
            body: String::from_utf8_lossy(&body).into_owned(),
        }
    })
}

pub(super) fn get(s: &Served, target: &str, headers: &[&str]) -> Answer {
    request(s, "GET", target, headers, "")
}

/// A collector read with its read token `tok3n`.
struct Authorized<'a>(&'a Served);

impl Authorized<'_> {
    fn get(&self, target: &str) -> Answer {
        get(self.0, target, &["Authorization: Bearer tok3n"])
    }
}

/// What a browser sends with a form its own page posted.
pub(super) const SAME_ORIGIN: &str = "Sec-Fetch-Site: same-origin";

/// Every `data-leaf-ns="N"` of the page, summed.
fn leaf_sum(body: &str) -> u64 {
    body.split("data-leaf-ns=\"")
        .skip(1)
        .map(|s| s[..s.find('"').unwrap()].parse::<u64>().unwrap())
        .sum()
}

#[test]
fn cpt_table1_profile_page_shows_the_mean_and_every_frame() {
    let s = serve(&table1(), None);
    let a = get(&s, "/ui/profile?service=A", &[]);
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(a.header("content-type").unwrap().starts_with("text/html"));
    // CPT Table 1: 16 ms and 8 ms, mean 12 ms; A1/self 5, A1/A2 5, A1/B1 2.
    assert!(
        a.body.contains(r#"<b id="mean-latency">12.00ms</b>"#),
        "{}",
        a.body
    );
    for cell in [
        "<b>A1 (A)</b></td><td class=\"num\">5.00ms",
        "<b>A2 (A)</b></td><td class=\"num\">5.00ms",
        "<b>B1 (B)</b></td><td class=\"num\">2.00ms",
    ] {
        assert!(a.body.contains(cell), "no {cell:?} in {}", a.body);
    }
    assert!(
        a.body.contains("/profile?service=A&amp;trigger=sampled"),
        "pprof link"
    );
    assert!(a.body.contains("all 2 matching requests"), "{}", a.body);
    // A sample folds the newest records only, and says so: Table 1's second
    // request is 8 ms.
    let newest = get(&s, "/ui/profile?service=A&sample=1", &[]);
    assert!(
        newest.body.contains("the newest 1 of 2 matching requests"),
        "{}",
        newest.body
    );
    assert!(newest.body.contains(r#"<b id="mean-latency">8.00ms</b>"#));
    assert!(
        newest.body.contains("&amp;sample=1\""),
        "the graph folds the same sample"
    );
    let svg = get(&s, "/ui/flame.svg?service=A", &[]);
    assert_eq!(svg.status, 200);
    assert_eq!(svg.header("content-type"), Some("image/svg+xml"));
    assert!(svg.body.contains("A1 (A)") && svg.body.contains("prefers-color-scheme: dark"));
    let index = get(&s, "/", &[]);
    assert!(
        index.body.contains(r#"<tr data-service="A">"#),
        "{}",
        index.body
    );
    assert!(
        index.body.contains(r#"<tr data-service="B">"#),
        "B is on A's paths"
    );
}

#[test]
fn request_page_tree_leaves_sum_to_the_latency_beside_the_endpoint_mean() {
    let mut records = version("v1", 4);
    records.push(forced());
    let s = serve(&records, Some("tok3n"));
    let s = Authorized(&s);
    let a = s.get("/ui/request?id=forced-1");
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(a.body.contains(r#"data-ns="9000000""#), "latency 9 ms");
    assert_eq!(leaf_sum(&a.body), 9_000_000);
    assert!(a.body.contains("[network]") && a.body.contains("INC-42"));
    assert!(a.body.contains("mean of 20 sampled requests"), "{}", a.body);
    // By trace id too when no request id matches; unknown ids are a 404
    // that offers to wait; waiting refreshes the page.
    let missing = s.get("/ui/request?id=nope");
    assert_eq!(missing.status, 404);
    assert!(missing.body.contains("wait=30s"));
    let waiting = s.get("/ui/request?id=nope&wait=10s");
    assert_eq!(waiting.status, 200);
    assert!(
        waiting.body.contains(r#"http-equiv="refresh""#) && waiting.body.contains("deadline_ms=")
    );
    let over = s.get("/ui/request?id=nope&deadline_ms=1");
    assert_eq!(over.status, 404);
    assert!(over.body.contains("the wait is over"));
}

#[test]
fn diff_page_flags_an_injected_change_and_nothing_else() {
    let mut records = version("v1", 4);
    records.extend(version("v2", 9));
    let s = serve(&records, None);
    let a = get(
        &s,
        "/ui/diff?base=service%3DA%26label%3Dversion%3Dv1&test=service%3DA%26label%3Dversion%3Dv2",
        &[],
    );
    assert_eq!(a.status, 200, "{}", a.body);
    let flagged: Vec<&str> = a
        .body
        .split(r#"<tr class="flagged"#)
        .skip(1)
        .map(|r| &r[..r.find("</tr>").unwrap()])
        .collect();
    assert_eq!(flagged.len(), 1, "{}", a.body);
    assert!(
        flagged[0].contains(r#"data-stack="A1 (A);C1 (C)""#),
        "{}",
        flagged[0]
    );
    assert!(flagged[0].contains("+5.00ms") && flagged[0].contains("slower"));
    assert!(a.body.contains(r#"id="flagged-count">1<"#));
    let svg = get(
        &s,
        "/ui/diff.svg?base=service%3DA%26label%3Dversion%3Dv1&test=service%3DA%26label%3Dversion%3Dv2",
        &[],
    );
    assert_eq!(svg.status, 200);
    assert!(svg.body.contains("C1 (C)"));
}

#[test]
fn bad_queries_say_what_was_wrong() {
    let s = serve(&table1(), None);
    let a = get(&s, "/ui/profile?colour=red", &[]);
    assert_eq!(a.status, 400);
    assert!(a.body.contains("colour"), "{}", a.body);
    let a = get(&s, "/ui/profile?service=A&last=soon", &[]);
    assert_eq!(a.status, 400);
    assert!(a.body.contains("15m, 1h"), "{}", a.body);
    let a = get(&s, "/ui/diff?base=service%3DA&test=percentile%3D99", &[]);
    assert_eq!(a.status, 400);
    assert!(a.body.contains("test:"), "{}", a.body);
    let a = get(&s, "/ui/profile?service=Nobody", &[]);
    assert_eq!(a.status, 200);
    assert!(a.body.contains("No request matches"));
    // Pages only read: no page takes a POST but the sign-in form.
    assert_eq!(
        request(&s, "POST", "/ui/profile?service=A", &[], "x=1").status,
        405
    );
}

#[test]
fn read_token_gates_every_page_and_sends_browsers_to_sign_in() {
    let mut records = table1();
    records.push(forced());
    let s = serve(&records, Some("tok3n"));
    for page in [
        "/",
        "/ui/profile?service=A",
        "/ui/request?id=forced-1",
        "/ui/flame.svg?request_id=forced-1",
        "/ui/diff?base=service%3DA&test=service%3DA",
    ] {
        let program = get(&s, page, &[]);
        assert_eq!(program.status, 401, "{page}");
        let browser = get(&s, page, &["Accept: text/html"]);
        assert_eq!(browser.status, 303, "{page}");
        assert!(
            browser
                .header("location")
                .unwrap()
                .starts_with("/ui/login?next=%2F")
        );
        let wrong = get(
            &s,
            page,
            &["Cookie: cpt_read_token=nope", "Authorization: Bearer nope"],
        );
        assert_eq!(wrong.status, 401, "{page}");
    }
    let bearer = get(&s, "/", &["Authorization: Bearer tok3n"]);
    assert_eq!(bearer.status, 200);
    assert!(bearer.body.contains("forced-1") && bearer.body.contains("INC-42"));
    assert!(!bearer.body.contains("no read token"));
    // The stylesheet and the form itself are open.
    assert_eq!(get(&s, "/ui/style.css", &[]).status, 200);
    assert_eq!(get(&s, "/ui/login?next=%2F", &[]).status, 200);
}

#[test]
fn login_sets_an_httponly_samesite_cookie_and_returns_to_the_page() {
    let s = serve(&table1(), Some("tok3n"));
    let wrong = request(
        &s,
        "POST",
        "/ui/login",
        &[SAME_ORIGIN],
        "token=nope&next=%2Fui%2Fprofile%3Fservice%3DA",
    );
    assert_eq!(wrong.status, 401);
    assert!(wrong.header("set-cookie").is_none());
    assert!(wrong.body.contains("not this collector&#39;s read token"));
    let ok = request(
        &s,
        "POST",
        "/ui/login",
        &[SAME_ORIGIN],
        "token=tok3n&next=%2Fui%2Fprofile%3Fservice%3DA",
    );
    assert_eq!(ok.status, 303);
    assert_eq!(ok.header("location"), Some("/ui/profile?service=A"));
    let cookie = ok.header("set-cookie").unwrap();
    assert_eq!(
        cookie,
        "cpt_read_token=tok3n; HttpOnly; SameSite=Strict; Path=/"
    );
    let page = get(
        &s,
        "/ui/profile?service=A",
        &["Cookie: cpt_read_token=tok3n"],
    );
    assert_eq!(page.status, 200);
    // Only local paths: never back to another site.
    for next in [
        "%2F%2Fevil.example%2F",
        "%2F%09%2Fevil.example",
        "%2F%5Cevil.example",
    ] {
        let away = request(
            &s,
            "POST",
            "/ui/login",
            &[SAME_ORIGIN],
            &format!("token=tok3n&next={next}"),
        );
        assert_eq!(away.header("location"), Some("/"), "{next}");
    }
    let out = request(&s, "POST", "/ui/logout", &[SAME_ORIGIN], "x=1");
    assert!(out.header("set-cookie").unwrap().contains("Max-Age=0"));
}
