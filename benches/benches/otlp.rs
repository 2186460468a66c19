//! `cpt serve`'s OTLP receiver against the batch import of the same spans.
//!
//! The DeathStarBench media set (6 files, 6,500 traces, 175,500 spans) is
//! turned into OTLP export requests: each trace's spans grouped by service
//! and clock domain into `ResourceSpans`, about 1,000 spans a request, the
//! way SDK exporters batch them. Then, in one run:
//!
//! - **batch**: the same requests written as an OTLP JSON file (one request
//!   a line), converted as `cpt traces convert --from otlp` does
//!   (`import_files`, then the records written as JSON Lines): read,
//!   clock-skew repair, critical path, records out.
//! - **live**: `cpt serve --otlp-grpc` in this process (durable store,
//!   `synchronous = FULL`), 8 stock tonic clients replaying the requests,
//!   encoded beforehand, as fast as they are acknowledged; measured until
//!   every record is stored. The trace wait is 1 s (`--otlp-trace-wait`),
//!   so traces complete while the replay runs.
//!
//! It prints spans/s of both and the live path's cost per span relative to
//! the batch import, twice: in wall time (the wait subtracted) and in CPU
//! time (the process's, less the senders' threads: what the collector
//! spent), and how long after the last acknowledgement the last record was
//! stored (at most the wait + 1 s is the goal). Run: `cargo bench -p
//! cpt-benches --bench otlp`.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cpt_collector::serve::{Collector, OtlpConfig, ServeConfig};
use cpt_collector::store::Store;
use cpt_collector::traces::import::read_traces;
use cpt_collector::traces::otlp::pb;
use cpt_collector::traces::{BuildOptions, Format, ImportOptions, SpanKind, import_files};

const SPANS_PER_REQUEST: usize = 1000;
const CLIENTS: usize = 8;
const WAIT: Duration = Duration::from_secs(1);

fn kv(k: &str, v: &str) -> pb::KeyValue {
    pb::KeyValue {
        key: k.into(),
        value: Some(pb::AnyValue {
            value: Some(pb::any_value::Value::StringValue(v.into())),
        }),
        ..Default::default()
    }
}

fn kind(k: SpanKind) -> i32 {
    match k {
        SpanKind::Unspecified => 0,
        SpanKind::Internal => 1,
        SpanKind::Server => 2,
        SpanKind::Client => 3,
        SpanKind::Producer => 4,
        SpanKind::Consumer => 5,
    }
}

/// The media set as OTLP export requests, and its span and root counts.
fn requests() -> (Vec<pb::ExportTraceServiceRequest>, usize, usize) {
    let set = read_traces(
        &support::media_all(),
        Format::Jaeger,
        BuildOptions::default(),
    );
    let (mut out, mut current, mut in_current) = (Vec::new(), Vec::new(), 0);
    let (mut spans, mut roots) = (0, 0);
    for (n, t) in set.traces.iter().enumerate() {
        let mut trace_id = vec![0u8; 16];
        trace_id[..8].copy_from_slice(&(n as u64 + 1).to_be_bytes());
        trace_id[8] = 0xcc;
        let span_id = |i: usize| ((i as u64) + 1).to_be_bytes().to_vec();
        let mut groups: Vec<((String, u32), Vec<pb::Span>)> = Vec::new();
        for (i, s) in t.spans.iter().enumerate() {
            let key = (s.service.to_string(), s.clock);
            let at = match groups.iter().position(|(k, _)| *k == key) {
                Some(at) => at,
                None => {
                    groups.push((key, Vec::new()));
                    groups.len() - 1
                }
            };
            roots += usize::from(s.parent.is_none());
            groups[at].1.push(pb::Span {
                trace_id: trace_id.clone(),
                span_id: span_id(i),
                parent_span_id: s.parent.map(|p| span_id(p as usize)).unwrap_or_default(),
                name: s.operation.to_string(),
                kind: kind(s.kind),
                start_time_unix_nano: s.start_ns as u64,
                end_time_unix_nano: (s.start_ns + s.duration_ns) as u64,
                ..Default::default()
            });
        }
        spans += t.spans.len();
        for ((service, clock), s) in groups {
            in_current += s.len();
            current.push(pb::ResourceSpans {
                resource: Some(pb::Resource {
                    attributes: vec![
                        kv("service.name", &service),
                        kv("host.name", &format!("{service}-{clock}")),
                    ],
                    ..Default::default()
                }),
                scope_spans: vec![pb::ScopeSpans {
                    spans: s,
                    ..Default::default()
                }],
                ..Default::default()
            });
        }
        if in_current >= SPANS_PER_REQUEST {
            out.push(pb::ExportTraceServiceRequest {
                resource_spans: std::mem::take(&mut current),
            });
            in_current = 0;
        }
    }
    if !current.is_empty() {
        out.push(pb::ExportTraceServiceRequest {
            resource_spans: current,
        });
    }
    (out, spans, roots)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A request in the OTLP JSON mapping (one line of the file exporter).
fn json(req: &pb::ExportTraceServiceRequest) -> String {
    use serde_json::json;
    let rs: Vec<_> = req
        .resource_spans
        .iter()
        .map(|rs| {
            let attrs: Vec<_> = rs
                .resource
                .as_ref()
                .unwrap()
                .attributes
                .iter()
                .map(|kv| {
                    let Some(pb::any_value::Value::StringValue(v)) =
                        kv.value.as_ref().and_then(|v| v.value.as_ref())
                    else {
                        unreachable!("string attributes only")
                    };
                    json!({"key": kv.key, "value": {"stringValue": v}})
                })
                .collect();
            let spans: Vec<_> = rs.scope_spans[0]
                .spans
                .iter()
                .map(|s| {
                    json!({
                        "traceId": hex(&s.trace_id),
                        "spanId": hex(&s.span_id),
                        "parentSpanId": hex(&s.parent_span_id),
                        "name": s.name,
                        "kind": s.kind,
                        "startTimeUnixNano": s.start_time_unix_nano.to_string(),
                        "endTimeUnixNano": s.end_time_unix_nano.to_string(),
                    })
                })
                .collect();
            json!({"resource": {"attributes": attrs}, "scopeSpans": [{"spans": spans}]})
        })
        .collect();
    json!({ "resourceSpans": rs }).to_string()
}

/// Sends request bodies encoded beforehand: the senders' cost is not the
/// collector's.
#[derive(Clone, Copy, Default)]
struct Encoded;

impl tonic::codec::Encoder for Encoded {
    type Item = bytes::Bytes;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: bytes::Bytes,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        bytes::BufMut::put(dst, item);
        Ok(())
    }
}

impl tonic::codec::Decoder for Encoded {
    type Item = pb::ExportTraceServiceResponse;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Self::Item>, tonic::Status> {
        prost::Message::decode(src)
            .map(Some)
            .map_err(|e| tonic::Status::internal(e.to_string()))
    }
}

impl tonic::codec::Codec for Encoded {
    type Encode = bytes::Bytes;
    type Decode = pb::ExportTraceServiceResponse;
    type Encoder = Encoded;
    type Decoder = Encoded;
    fn encoder(&mut self) -> Encoded {
        Encoded
    }
    fn decoder(&mut self) -> Encoded {
        Encoded
    }
}

/// Whose CPU time [`cpu`] reads.
#[derive(Clone, Copy)]
enum Of<'a> {
    /// The whole process.
    Process,
    /// The calling thread.
    ThisThread,
    /// The threads whose name starts with this.
    ThreadsNamed(&'a str),
}

/// CPU time (user + system) of `of`, from `/proc`.
fn cpu(of: Of<'_>) -> Duration {
    let ticks = |stat: &str| -> u64 {
        // Fields after the parenthesised name: utime and stime are the
        // 12th and 13th.
        let rest = &stat[stat.rfind(')').map_or(0, |i| i + 2)..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
    };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let total = match of {
        Of::Process => ticks(&std::fs::read_to_string("/proc/self/stat").unwrap()),
        Of::ThisThread => ticks(&std::fs::read_to_string("/proc/thread-self/stat").unwrap()),
        Of::ThreadsNamed(prefix) => std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(Result::ok)
            .filter(|t| {
                std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with(prefix))
            })
            .filter_map(|t| std::fs::read_to_string(t.path().join("stat")).ok())
            .map(|s| ticks(&s))
            .sum(),
    };
    Duration::from_nanos(total * 1_000_000_000 / hz)
}

async fn client(addr: SocketAddr) -> tonic::client::Grpc<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    tonic::client::Grpc::new(channel).max_decoding_message_size(64 << 20)
}

fn main() {
    let (reqs, spans, roots) = requests();
    println!(
        "media set as OTLP: {} requests, {spans} spans, {roots} roots",
        reqs.len()
    );
    let dir = tempfile::tempdir().unwrap();

    // Batch: the same requests as an OTLP JSON file, imported.
    let file = dir.path().join("media.otlp.jsonl");
    let mut text = String::new();
    for r in &reqs {
        text.push_str(&json(r));
        text.push('\n');
    }
    std::fs::write(&file, text).unwrap();
    let (t0, c0) = (Instant::now(), cpu(Of::Process));
    let imp = import_files(&[file], Format::Otlp, &ImportOptions::default(), &|_| {});
    let out = dir.path().join("records.jsonl");
    {
        use std::io::Write;
        let mut w = std::io::BufWriter::new(std::fs::File::create(&out).unwrap());
        for r in imp.records() {
            w.write_all(r.to_json().as_bytes()).unwrap();
            w.write_all(b"\n").unwrap();
        }
        w.flush().unwrap();
    }
    let (batch, batch_cpu) = (t0.elapsed(), cpu(Of::Process) - c0);
    let records = imp.records().count();
    assert_eq!(imp.stats.spans as usize, spans, "every span imported");
    let bodies: Arc<Vec<bytes::Bytes>> = Arc::new(
        reqs.iter()
            .map(|r| prost::Message::encode_to_vec(r).into())
            .collect(),
    );

    // Live: cpt serve's OTLP/gRPC receiver, durable store.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = dir.path().join("store.db");
    let config = ServeConfig::new(&store).with_otlp(OtlpConfig {
        grpc: Some("127.0.0.1:0".parse().unwrap()),
        trace_wait: WAIT,
        ..OtlpConfig::default()
    });
    let collector = rt.block_on(Collector::start(config)).unwrap();
    let addr = collector.otlp_grpc_addr().unwrap();
    // The senders run on threads of their own, so that their CPU time can
    // be told from the collector's.
    let senders = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("otlp-sender")
        .enable_all()
        .build()
        .unwrap();
    let next = Arc::new(AtomicUsize::new(0));
    let refused = Arc::new(AtomicUsize::new(0));
    let (t0, c0, main0) = (Instant::now(), cpu(Of::Process), cpu(Of::ThisThread));
    senders.block_on(async {
        let mut tasks = Vec::new();
        for _ in 0..CLIENTS {
            let (reqs, next, refused) = (bodies.clone(), next.clone(), refused.clone());
            tasks.push(tokio::spawn(async move {
                let mut grpc = client(addr).await;
                let path = http::uri::PathAndQuery::from_static(
                    "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                );
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(req) = reqs.get(i) else { return };
                    loop {
                        grpc.ready().await.unwrap();
                        match grpc
                            .unary(tonic::Request::new(req.clone()), path.clone(), Encoded)
                            .await
                        {
                            Ok(r) => {
                                let r = r.into_inner();
                                if let Some(p) = r.partial_success {
                                    refused.fetch_add(p.rejected_spans as usize, Ordering::Relaxed);
                                }
                                break;
                            }
                            // Pushed back: retry, as exporters do.
                            Err(s) if s.code() == tonic::Code::Unavailable => {
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                            Err(s) => panic!("export failed: {s}"),
                        }
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    let acked = t0.elapsed();
    let reader = Store::open_read_only(&store).unwrap();
    let stored_all = loop {
        if reader.len().unwrap() as usize >= records {
            break t0.elapsed();
        }
        assert!(
            t0.elapsed() < acked + WAIT * 30,
            "records not stored: {} of {records}",
            reader.len().unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    // The senders' threads, and this thread (which drove them and polled
    // the store for the records): not the collector's.
    let sender_cpu = cpu(Of::ThreadsNamed("otlp-sender")) + (cpu(Of::ThisThread) - main0);
    let live_cpu = (cpu(Of::Process) - c0).saturating_sub(sender_cpu);
    rt.block_on(collector.shutdown()).unwrap();
    let stored_n = Store::open_read_only(&store).unwrap().len().unwrap() as usize;

    let per_s = |d: Duration| spans as f64 / d.as_secs_f64();
    let live_work = stored_all.saturating_sub(WAIT);
    println!(
        "spans refused by the receiver: {}",
        refused.load(Ordering::Relaxed)
    );
    println!("| path | time | spans/s |");
    println!("|---|---|---|");
    println!(
        "| batch import (`cpt traces convert --from otlp`'s code), {records} records | {:.2} s | {:.0} |",
        batch.as_secs_f64(),
        per_s(batch)
    );
    println!(
        "| live: all {spans} spans received, held durably and acknowledged | {:.2} s | {:.0} |",
        acked.as_secs_f64(),
        per_s(acked)
    );
    println!(
        "| live: all {stored_n} records stored, minus the 1 s wait | {:.2} s | {:.0} |",
        live_work.as_secs_f64(),
        per_s(live_work)
    );
    println!(
        "live cost per span / batch import's: {:.2}x in wall time, {:.2}x in CPU time \
         (batch {:.2} s CPU; live {:.2} s CPU, the senders' and this thread's {:.2} s left out)",
        live_work.as_secs_f64() / batch.as_secs_f64(),
        live_cpu.as_secs_f64() / batch_cpu.as_secs_f64(),
        batch_cpu.as_secs_f64(),
        live_cpu.as_secs_f64(),
        sender_cpu.as_secs_f64()
    );
    println!(
        "last record stored {:.2} s after the last acknowledgement (wait {} s)",
        stored_all.saturating_sub(acked).as_secs_f64(),
        WAIT.as_secs()
    );
    assert_eq!(
        stored_n, records,
        "the live path stores the batch import's records"
    );
}
