//! Helpers shared by the ingest tests: records, a blocking HTTP/1.1 client,
//! an in-process collector and a gRPC export call.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use cpt_collector::ingest::proto;
use cpt_collector::serve::{Collector, ServeConfig};
use cpt_collector::store::{Store, StoreQuery};
use cpt_sdk::{CriticalPath, Frame, Record, SegmentKind, Trigger};

/// A CPT Fig. 2a-shaped record tagged with `batch` and `i`.
pub(crate) fn record(batch: &str, i: usize) -> Record {
    use cpt_sdk::testing::ms;
    let mut p = CriticalPath::new();
    let a1 = Frame::new("A", "A1").with_location("a/src/main.rs", 10);
    p.push_frames([a1.clone()], ms(5), SegmentKind::Busy);
    p.push_frames(
        [a1.clone(), Frame::new("B", "B1")],
        ms(20 + i as u64 % 7),
        SegmentKind::Busy,
    );
    p.push_frames([a1.clone()], ms(8), SegmentKind::Busy);
    p.push_frames(
        [a1, Frame::new("A", "A2")],
        ms(2),
        SegmentKind::Unattributed,
    );
    p.accounting.unattributed = ms(2);
    let mut r = Record::new("A", Trigger::Sampled, p);
    r.endpoint = Some("/a.A/Run".into());
    // An hour ago: inside `cpt serve`'s default raw window (7 days), so
    // these records are stored raw.
    r.start_unix_nanos = Some(an_hour_ago() + i as u64);
    r.request_id = Some(format!("{batch}/{i}"));
    r.labels.insert("batch".into(), batch.into());
    r
}

/// An hour before the first call, in ns since the Unix epoch: the same for
/// every record of a test run.
pub(crate) fn an_hour_ago() -> u64 {
    static T: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *T.get_or_init(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        u64::try_from(now.as_nanos()).unwrap() - 3_600_000_000_000
    })
}

pub(crate) fn records(batch: &str, n: usize) -> Vec<Record> {
    (0..n).map(|i| record(batch, i)).collect()
}

pub(crate) fn json_lines(records: &[Record]) -> Vec<u8> {
    let mut out = String::new();
    for r in records {
        out.push_str(&r.to_json());
        out.push('\n');
    }
    out.into_bytes()
}

pub(crate) fn protobuf(records: &[Record]) -> Vec<u8> {
    prost::Message::encode_to_vec(&proto::RecordBatch::from_records(records))
}

/// A response of the blocking HTTP client.
#[derive(Debug)]
pub(crate) struct HttpResponse {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
}

impl HttpResponse {
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One HTTP/1.1 request on a fresh connection (`Connection: close`).
pub(crate) fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    content_type: &str,
    body: &[u8],
) -> std::io::Result<HttpResponse> {
    http_with_headers(addr, method, path, &[("Content-Type", content_type)], body)
}

/// [`http`] with any request headers.
pub(crate) fn http_with_headers(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<HttpResponse> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    ));
    s.write_all(head.as_bytes())?;
    // The server may answer (e.g. 429) without reading the body.
    let _ = s.write_all(body);
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| {
            std::io::Error::other(format!(
                "no header end in {:?}",
                String::from_utf8_lossy(&raw)
            ))
        })?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line in {head:?}")))?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    Ok(HttpResponse {
        status,
        headers,
        body: raw[split + 4..].to_vec(),
    })
}

pub(crate) fn post_records(addr: SocketAddr, content_type: &str, body: &[u8]) -> HttpResponse {
    http(addr, "POST", "/v1/records", content_type, body).expect("HTTP request failed")
}

/// Every record in the store at `path`, in insertion order.
pub(crate) fn stored(path: &Path) -> Vec<Record> {
    // Read-only: a writable open would take the write lock (and run a
    // checkpointer) beside the collector's writer, and hold it up.
    let store = Store::open_read_only(path).expect("reopen the store");
    store
        .query(&StoreQuery::default())
        .expect("query")
        .map(|r| r.expect("stored record parses"))
        .collect()
}

/// A collector running in this process on its own runtime.
pub(crate) struct TestCollector {
    pub(crate) rt: tokio::runtime::Runtime,
    pub(crate) collector: Option<Collector>,
    pub(crate) store: PathBuf,
    _dir: tempfile::TempDir,
}

impl TestCollector {
    pub(crate) fn start(configure: impl FnOnce(ServeConfig) -> ServeConfig) -> TestCollector {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store.db");
        let config = configure(
            ServeConfig::new(&store)
                .with_grpc("127.0.0.1:0".parse().unwrap())
                .with_http("127.0.0.1:0".parse().unwrap()),
        );
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let collector = rt
            .block_on(Collector::start(config))
            .expect("collector starts");
        TestCollector {
            rt,
            collector: Some(collector),
            store,
            _dir: dir,
        }
    }

    pub(crate) fn http(&self) -> SocketAddr {
        self.collector.as_ref().unwrap().http_addr().unwrap()
    }

    pub(crate) fn grpc(&self) -> SocketAddr {
        self.collector.as_ref().unwrap().grpc_addr().unwrap()
    }

    pub(crate) fn stats(&self) -> cpt_collector::serve::Stats {
        self.collector.as_ref().unwrap().stats()
    }

    pub(crate) fn export(
        &self,
        batch: proto::RecordBatch,
    ) -> Result<proto::ExportResponse, tonic::Status> {
        self.rt.block_on(grpc_export(self.grpc(), batch))
    }

    pub(crate) fn stored(&self) -> Vec<Record> {
        stored(&self.store)
    }
}

impl Drop for TestCollector {
    fn drop(&mut self) {
        if let Some(c) = self.collector.take() {
            let _ = self.rt.block_on(c.shutdown());
        }
    }
}

/// `Collector/Export` through a stock tonic client and tonic-prost codec.
pub(crate) async fn grpc_export(
    addr: SocketAddr,
    batch: proto::RecordBatch,
) -> Result<proto::ExportResponse, tonic::Status> {
    grpc_unary(addr, cpt_collector::ingest::GRPC_EXPORT_PATH, batch).await
}

/// One unary call of `path` through a stock tonic client and tonic-prost
/// codec.
pub(crate) async fn grpc_unary<Req, Resp>(
    addr: SocketAddr,
    path: &'static str,
    req: Req,
) -> Result<Resp, tonic::Status>
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
    let path = http::uri::PathAndQuery::from_static(path);
    grpc.unary(tonic::Request::new(req), path, codec)
        .await
        .map(tonic::Response::into_inner)
}

/// The load of the `kill -9` tests: four threads POST batches of `batch`
/// records (labelled `batch=t{thread}-{seq}`) over HTTP to `addr` until the
/// collector is gone; once `min_acked` batches are acknowledged, `kill`
/// runs. Returns the names of the batches acknowledged.
pub(crate) fn load_until_killed(
    addr: SocketAddr,
    batch: usize,
    min_acked: usize,
    kill: impl FnOnce(),
) -> std::collections::BTreeSet<String> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let acked = Arc::new(Mutex::new(std::collections::BTreeSet::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let senders: Vec<_> = (0..4)
        .map(|t| {
            let (acked, stop) = (acked.clone(), stop.clone());
            std::thread::spawn(move || {
                for seq in 0.. {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let name = format!("t{t}-{seq}");
                    let body = json_lines(&records(&name, batch));
                    let json = cpt_collector::ingest::CONTENT_TYPE_JSON_LINES;
                    match http(addr, "POST", "/v1/records", json, &body) {
                        Ok(r) if r.status == 200 => {
                            acked.lock().unwrap().insert(name);
                        }
                        Ok(r) if r.status == 429 => {}
                        Ok(r) => panic!("unexpected {}: {}", r.status, r.text()),
                        Err(_) => return, // the collector is gone
                    }
                }
            })
        })
        .collect();
    let t0 = std::time::Instant::now();
    while acked.lock().unwrap().len() < min_acked {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "too few acknowledgements"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    kill();
    stop.store(true, Ordering::Relaxed);
    for s in senders {
        s.join().unwrap();
    }
    let acked = acked.lock().unwrap();
    acked.clone()
}

/// After a `kill -9`: every acknowledged batch is whole in `found` (where
/// the records survived: `place`), and every batch there is whole (all or
/// nothing, and only once). Returns the records per batch found.
pub(crate) fn assert_batches_whole(
    acked: &std::collections::BTreeSet<String>,
    found: impl IntoIterator<Item = Record>,
    batch: usize,
    place: &str,
) -> std::collections::BTreeMap<String, usize> {
    let mut per_batch = std::collections::BTreeMap::<String, usize>::new();
    for r in found {
        *per_batch.entry(r.labels["batch"].clone()).or_default() += 1;
    }
    for name in acked {
        assert_eq!(
            per_batch.get(name),
            Some(&batch),
            "acknowledged batch {name} lost or partial in {place}"
        );
    }
    for (name, n) in &per_batch {
        assert_eq!(
            *n, batch,
            "batch {name} is half-written or duplicated in {place}"
        );
    }
    per_batch
}

/// `cpt serve` as a child process, with the addresses it printed.
pub(crate) struct Served {
    pub(crate) child: std::process::Child,
    /// `None` when started with `--grpc off`.
    pub(crate) grpc: Option<SocketAddr>,
    pub(crate) http: SocketAddr,
    /// What it printed until it listened.
    pub(crate) log: Vec<String>,
}

/// `cpt serve --store STORE` with HTTP on a free port, gRPC on a free port
/// when `grpc` (else `--grpc off`), and `args` after those; returns once it
/// printed every address it listens on.
pub(crate) fn serve_child(store: &Path, grpc: bool, args: &[&std::ffi::OsStr]) -> Served {
    serve_command(
        std::process::Command::new(env!("CARGO_BIN_EXE_cpt")),
        store,
        grpc,
        args,
    )
}

/// [`serve_child`] run by `command` (the `cpt` binary, or a shell that
/// execs it), with `serve` and the arguments appended.
pub(crate) fn serve_command(
    mut command: std::process::Command,
    store: &Path,
    grpc: bool,
    args: &[&std::ffi::OsStr],
) -> Served {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let mut child = command
        .args(["serve", "--store"])
        .arg(store)
        .args(["--grpc", if grpc { "127.0.0.1:0" } else { "off" }])
        .args(["--http", "127.0.0.1:0"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start cpt serve");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let (mut grpc_addr, mut http) = (None, None);
    let mut log = Vec::new();
    while (grpc && grpc_addr.is_none()) || http.is_none() {
        let line = lines
            .next()
            .expect("cpt serve exited before listening")
            .unwrap();
        log.push(line.clone());
        if let Some(a) = line.strip_prefix("cpt serve: grpc listening on ") {
            grpc_addr = Some(a.parse().unwrap());
        }
        if let Some(a) = line.strip_prefix("cpt serve: http listening on http://") {
            http = Some(a.parse().unwrap());
        }
    }
    // Keep draining stderr so the child never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Served {
        child,
        grpc: grpc_addr,
        http: http.unwrap(),
        log,
    }
}

/// Kill `served` with SIGKILL (`Child::kill` on Unix): no shutdown code runs.
pub(crate) fn kill_9(mut served: Served) {
    served.child.kill().unwrap();
    served.child.wait().unwrap();
}

/// Whether promtool (Debian's prometheus package) runs here; without it,
/// fails when CPT_REQUIRE_PROMTOOL is set (CI), else the caller skips.
pub(crate) fn promtool_installed() -> bool {
    let there = std::process::Command::new("promtool")
        .arg("--version")
        .output()
        .is_ok();
    assert!(
        there || std::env::var_os("CPT_REQUIRE_PROMTOOL").is_none(),
        "CPT_REQUIRE_PROMTOOL is set but promtool is not installed (Debian: prometheus)"
    );
    there
}
