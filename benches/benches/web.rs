//! The collector's web pages over 10⁵ stored records: how long each page
//! takes to answer, side by side with the API call that does the same work
//! for a program (the baseline): `/ui/profile` and `/ui/flame.svg` against
//! `GET /profile` (the same fold, as pprof), `/ui/request` against
//! `GET /v1/records?request_id=` (the same lookup, as JSON), `/ui/diff`
//! against two `GET /profile`s one after the other, `/` against
//! `GET /healthz` (nothing: the cost of an HTTP round trip).
//!
//! `cargo bench -p cpt-benches --bench web` (records: `CPT_WEB_RECORDS`,
//! default 100 000; rounds per page: `CPT_WEB_ROUNDS`, default 7). The
//! records are Figure-1-shaped (~200 stacks over services A–F, 25–35
//! segments each), half of them `version=v1`, half `version=v2`, one in a
//! thousand forced. Prints each page's median and max time over the rounds
//! for a first view (a selection not folded before: pages fold the newest
//! 5 000 matching records, see `server/ui/fold.rs`) and for a repeat view
//! (the same page again: its fold is kept while the store is unchanged),
//! and the first view's ratio to its baseline's median. The baselines fold
//! every matching record.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use cpt_collector::serve::{Collector, ServeConfig};
use cpt_collector::store::{Durability, Store};
use cpt_sdk::testing::SplitMix64 as Rng;
use cpt_sdk::{Record, Trigger};

#[path = "support/records.rs"]
#[allow(dead_code)]
mod records;

use records::{figure1_path, stack_pool};

/// The collector's read token: its pages show the forced request only to a
/// reader holding it.
const READ_TOKEN: &str = "bench-read-token";

fn get(addr: SocketAddr, target: &str) -> (u16, usize) {
    let mut c = TcpStream::connect(addr).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    write!(
        c,
        "GET {target} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {READ_TOKEN}\r\n\
         Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    c.read_to_end(&mut raw).expect("read");
    let head = String::from_utf8_lossy(&raw[..raw.len().min(64)]).into_owned();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, raw.len())
}

/// Median and max of `rounds` fetches of `target(round)` (after one
/// warm-up fetch of `target(usize::MAX)`).
fn time(
    addr: SocketAddr,
    target: impl Fn(usize) -> String,
    rounds: usize,
) -> (Duration, Duration, usize) {
    let (status, bytes) = get(addr, &target(usize::MAX));
    assert_eq!(status, 200, "{}", target(usize::MAX));
    let mut t: Vec<Duration> = (0..rounds)
        .map(|i| {
            let s = Instant::now();
            let (status, _) = get(addr, &target(i));
            assert_eq!(status, 200, "{}", target(i));
            s.elapsed()
        })
        .collect();
    t.sort();
    (t[t.len() / 2], t[t.len() - 1], bytes)
}

/// `target` with an `until=` far in the future that differs per round: the
/// same records, but a selection the pages have not folded yet (a first
/// view); `in_arms` puts it inside a diff's `base=` and `test=`.
fn cold(target: &str, round: usize, in_arms: bool) -> String {
    let until = 4_000_000_000_000_000_000u64 + (round % 1_000_000) as u64;
    if in_arms {
        target
            .replace("&test=", &format!("%26until%3D{until}&test="))
            .to_owned()
            + &format!("%26until%3D{until}")
    } else {
        format!("{target}&until={until}")
    }
}

fn main() {
    let n: u64 = std::env::var("CPT_WEB_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let rounds: usize = std::env::var("CPT_WEB_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(7)
        .max(1);
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("web.db");
    let mut rng = Rng::new(28);
    let stacks = stack_pool(&mut rng);
    let t = Instant::now();
    {
        let mut store = Store::open_with(&path, Durability::Normal).expect("store");
        let mut i = 0;
        while i < n {
            let end = (i + 20_000).min(n);
            let batch: Vec<Record> = (i..end)
                .map(|i| {
                    let trigger = if i % 1000 == 7 {
                        Trigger::Forced
                    } else {
                        Trigger::Sampled
                    };
                    let mut r =
                        Record::new("A", trigger, figure1_path(&mut rng, &stacks, Clone::clone));
                    r.endpoint = Some("/cpt.example.ServiceA/Run".into());
                    r.start_unix_nanos = Some(1_700_000_000_000_000_000 + i * 1_000_000);
                    r.request_id = Some(format!("req-{i}"));
                    r.labels.insert(
                        "version".into(),
                        if i % 2 == 0 { "v1" } else { "v2" }.into(),
                    );
                    r
                })
                .collect();
            store.insert(&batch).expect("insert");
            i = end;
        }
    }
    println!("web: stored {n} records in {:.1?}", t.elapsed());

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let collector = rt
        .block_on(Collector::start(
            ServeConfig::new(&path)
                .with_http("127.0.0.1:0".parse().unwrap())
                .with_read_token(READ_TOKEN),
        ))
        .expect("collector");
    let addr = collector.http_addr().unwrap();
    let forced = format!("req-{}", 1000 * (n / 2000) + 7);
    let diff =
        "/ui/diff?base=service%3DA%26label%3Dversion%3Dv1&test=service%3DA%26label%3Dversion%3Dv2";
    let pages: [(&str, String, &[String]); 6] = [
        ("/", "/".into(), &["/healthz".into()]),
        (
            "/ui/profile",
            "/ui/profile?service=A".into(),
            &["/profile?service=A".into()],
        ),
        (
            "/ui/flame.svg",
            "/ui/flame.svg?service=A".into(),
            &["/profile?service=A".into()],
        ),
        (
            "/ui/request (forced)",
            format!("/ui/request?id={forced}"),
            &[format!("/v1/records?request_id={forced}")],
        ),
        (
            "/ui/diff",
            diff.into(),
            &[
                "/profile?service=A&label=version%3Dv1".into(),
                "/profile?service=A&label=version%3Dv2".into(),
            ],
        ),
        (
            "/ui/diff.svg",
            diff.replace("/ui/diff?", "/ui/diff.svg?"),
            &[
                "/profile?service=A&label=version%3Dv1".into(),
                "/profile?service=A&label=version%3Dv2".into(),
            ],
        ),
    ];
    println!(
        "{:<22} {:>10} {:>10} {:>10} {:>9}   {:>12} {:>7}  baseline",
        "page", "first view", "max", "repeat", "bytes", "base median", "ratio"
    );
    for (name, target, baseline) in &pages {
        let in_arms = target.contains("&test=");
        let foldless = name.starts_with('/') && (name == &"/" || name.contains("request"));
        let (med, max, bytes) = if foldless {
            time(addr, |_| target.clone(), rounds)
        } else {
            time(addr, |i| cold(target, i, in_arms), rounds)
        };
        let (repeat, _, _) = time(addr, |_| target.clone(), rounds);
        let base: Duration = baseline
            .iter()
            .map(|b| time(addr, |_| b.clone(), rounds).0)
            .sum();
        println!(
            "{name:<22} {:>10.1?} {:>10.1?} {:>10.1?} {bytes:>9}   {:>12.1?} {:>7.3}  {}",
            med,
            max,
            repeat,
            base,
            med.as_secs_f64() / base.as_secs_f64(),
            baseline.join(" + ")
        );
    }
    rt.block_on(collector.shutdown()).expect("shutdown");
}
