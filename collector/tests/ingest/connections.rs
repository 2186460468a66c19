//! Connections are bounded in total and per peer address: one address
//! holding thousands of idle connections cannot take the descriptors
//! another address needs, and a collector whose open-file limit cannot
//! hold its bounds says so at start and lowers them.
//!
//! Two loopback addresses are two peers: 127.0.0.2 floods, 127.0.0.1 (the
//! address the test's HTTP client connects from) sends and reads.
#![cfg(target_os = "linux")]

use std::net::SocketAddr;
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cpt_collector::ingest::CONTENT_TYPE_JSON_LINES;

use crate::support::*;

/// `cpt serve` with its open-file limit (soft and hard) set to `limit`.
fn serve_with_descriptors(store: &std::path::Path, limit: u64, args: &[&str]) -> Served {
    let mut sh = Command::new("sh");
    sh.args([
        "-c",
        &format!("ulimit -n {limit} && exec \"$0\" \"$@\""),
        env!("CARGO_BIN_EXE_cpt"),
    ]);
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_ref()).collect();
    serve_command(sh, store, false, &args)
}

/// Kills the collector however the test ends.
struct Killed(Option<Served>);

impl Drop for Killed {
    fn drop(&mut self) {
        if let Some(s) = self.0.take() {
            kill_9(s);
        }
    }
}

/// This process's soft open-file limit, raised to its hard limit.
fn raise_own_descriptor_limit() -> u64 {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let _ = setrlimit(
        Resource::Nofile,
        Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        },
    );
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// Open up to `n` connections from 127.0.0.2 to `addr`, 256 at a time,
/// and hold them until `stop` says so. Stops opening after 60 s, or once
/// connects time out (the collector no longer accepts). Sends how many
/// connects reached the collector (connected, or reset by it) once it
/// stops opening.
fn flood(addr: SocketAddr, n: usize, opened: mpsc::Sender<usize>, stop: mpsc::Receiver<()>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let mut held = Vec::with_capacity(n);
        let deadline = Instant::now() + Duration::from_secs(60);
        let (mut timed_out, mut reached) = (0, 0);
        while reached < n && Instant::now() < deadline && timed_out < 256 {
            let mut set = tokio::task::JoinSet::new();
            for _ in 0..(n - reached).min(256) {
                set.spawn(async move {
                    let socket = tokio::net::TcpSocket::new_v4()?;
                    socket.bind("127.0.0.2:0".parse().unwrap())?;
                    tokio::time::timeout(Duration::from_secs(2), socket.connect(addr))
                        .await
                        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))?
                });
            }
            while let Some(r) = set.join_next().await {
                reached += 1;
                match r.unwrap() {
                    Ok(s) => held.push(s),
                    // Accepted, then closed by the collector at once.
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
                    Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                        reached -= 1;
                        timed_out += 1;
                    }
                    Err(e) => panic!("connect from 127.0.0.2: {e}"),
                }
            }
        }
        let _ = opened.send(reached);
        let _ = tokio::task::spawn_blocking(move || stop.recv()).await;
        drop(held);
    });
}

/// `f` on another thread; its result if it came within `limit`.
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit).ok()
}

fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{series} missing from\n{text}"))
}

/// 20 000 idle connections from one address (fewer when this process's
/// own open-file limit cannot hold them: the count is that limit less 200)
/// to a collector with the default bounds and an open-file limit of
/// 10 000: another address still sends a batch and reads /healthz, each
/// answered within 10 s, and the refused connections are counted by
/// reason.
#[test]
fn idle_connections_from_one_address_leave_room_for_another() {
    let n = 20_000.min(raise_own_descriptor_limit().saturating_sub(200) as usize);
    let dir = tempfile::tempdir().unwrap();
    let served = Killed(Some(serve_with_descriptors(
        &dir.path().join("s.db"),
        10_000,
        &[],
    )));
    let http = served.0.as_ref().unwrap().http;
    let (opened_tx, opened) = mpsc::channel();
    let (stop, stop_rx) = mpsc::channel();
    let flooder = std::thread::spawn(move || flood(http, n, opened_tx, stop_rx));
    let t = Instant::now();
    let opened = opened.recv().unwrap();
    eprintln!(
        "{opened} of {n} connects reached the collector in {:?}",
        t.elapsed()
    );
    assert!(opened > 10_000, "only {opened} of {n} connections opened");

    let sent = records("other-peer", 20);
    let body = json_lines(&sent);
    let posted = within(Duration::from_secs(10), move || {
        post_records(http, CONTENT_TYPE_JSON_LINES, &body).status
    });
    assert_eq!(
        posted,
        Some(200),
        "a batch from 127.0.0.1 (None: no answer in 10 s)"
    );
    let health = within(Duration::from_secs(10), move || {
        http_with_headers(http, "GET", "/healthz", &[], b"")
            .map(|r| r.status)
            .ok()
    });
    assert_eq!(health, Some(Some(200)), "/healthz from 127.0.0.1");

    let metrics = http_with_headers(http, "GET", "/metrics", &[], b"").unwrap();
    let text = metrics.text();
    let per_peer = metric(&text, "cpt_open_connections_per_peer_max");
    assert_eq!(per_peer, 512.0, "a sixteenth of the default 8192");
    assert!(
        metric(&text, "cpt_open_connections") <= per_peer + 2.0,
        "{text}"
    );
    let refused = metric(&text, "cpt_connections_refused_total{reason=\"peer\"}");
    // Every connection beyond the peer's share was refused, but for a few
    // let in when its idle ones were closed by the header-read timeout.
    assert!(
        refused + 1024.0 >= opened as f64,
        "{refused} of {opened} refused\n{text}"
    );
    assert_eq!(
        metric(&text, "cpt_connections_refused_total{reason=\"total\"}"),
        0.0
    );
    stop.send(()).unwrap();
    flooder.join().unwrap();
}

/// An open-file limit below what the default bounds need: a warning at
/// start that names the limit and what to do, and bounds lowered to fit.
#[test]
fn a_descriptor_limit_below_the_bounds_warns_and_lowers_them() {
    let dir = tempfile::tempdir().unwrap();
    let served = Killed(Some(serve_with_descriptors(
        &dir.path().join("s.db"),
        1024,
        &[],
    )));
    let s = served.0.as_ref().unwrap();
    let warning = s
        .log
        .iter()
        .find(|l| l.starts_with("cpt serve: warning: the open-file limit (RLIMIT_NOFILE) is 1024"))
        .unwrap_or_else(|| panic!("no warning in {:#?}", s.log));
    assert!(warning.contains("at most 768 connections"), "{warning}");
    assert!(warning.contains("ulimit -n"), "{warning}");
    let text = http_with_headers(s.http, "GET", "/metrics", &[], b"")
        .unwrap()
        .text();
    assert_eq!(metric(&text, "cpt_open_connections_max"), 768.0);
    assert_eq!(metric(&text, "cpt_open_connections_per_peer_max"), 48.0);
}
