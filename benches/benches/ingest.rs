//! Ingest throughput of `cpt serve` over loopback with durable
//! acknowledgement (each measured call returns only after the batch's SQLite
//! transaction committed with `synchronous = FULL`), in records/s, for batch
//! sizes 1, 100 and 1000.
//!
//! Side by side in one run:
//! - `store-direct`: the baseline, `Store::insert` in-process (the same
//!   commit and fsync, no network, no decoding);
//! - `grpc`: `Collector/Export` through a stock tonic client;
//! - `http-protobuf` / `http-jsonl`: `POST /v1/records` through hyper;
//! - `grpc-16-clients`: 16 concurrent gRPC clients, where group commit puts
//!   many batches under one fsync.
//!
//! Run: `cargo bench -p cpt-benches --bench ingest`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cpt_collector::ingest::{self, proto};
use cpt_collector::serve::{Collector, ServeConfig};
use cpt_collector::store::Store;
use cpt_sdk::{CriticalPath, Frame, Record, SegmentKind, Trigger};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

const BATCH_SIZES: [usize; 3] = [1, 100, 1000];
const CLIENTS: usize = 16;

/// A record shaped like the Figure 1 demo's: 12 segments over three services.
fn record(i: usize) -> Record {
    let us = Duration::from_micros;
    let mut p = CriticalPath::new();
    let a1 = Frame::new("A", "A1").with_location("a/src/main.rs", 40);
    let a2 = Frame::new("A", "A2");
    let b1 = Frame::new("B", "B1");
    let b2 = Frame::new("B", "B2");
    let c1 = Frame::new("C", "C1").with_location("c/src/db.rs", 7);
    for k in 0..3u64 {
        p.push_frames([a1.clone()], us(100 + k), SegmentKind::Busy);
        p.push_frames(
            [a1.clone(), a2.clone(), c1.clone()],
            us(900 + k),
            SegmentKind::Busy,
        );
        p.push_frames(
            [a1.clone(), b1.clone(), b2.clone()],
            us(300 + k),
            SegmentKind::Busy,
        );
        p.push_frames(
            [a1.clone(), b1.clone(), b2.clone(), c1.clone()],
            us(700 + k),
            SegmentKind::Network,
        );
    }
    let mut r = Record::new("A", Trigger::Sampled, p);
    r.endpoint = Some("/a.A/Run".into());
    r.start_unix_nanos = Some(1_700_000_000_000_000_000 + i as u64);
    r.request_id = Some(format!("req-{i}"));
    r.labels.insert(
        "arm".into(),
        if i.is_multiple_of(2) { "a" } else { "b" }.into(),
    );
    r
}

struct Bench {
    rt: tokio::runtime::Runtime,
    collector: Option<Collector>,
    grpc: tonic::client::Grpc<tonic::transport::Channel>,
    http: Client<HttpConnector, Full<Bytes>>,
    http_url: String,
    _dir: tempfile::TempDir,
}

impl Bench {
    fn start() -> Bench {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap();
        let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let config = ServeConfig::new(dir.path().join("store.db"))
            .with_grpc(loopback)
            .with_http(loopback)
            .with_max_pending_batches(4 * CLIENTS);
        let collector = rt.block_on(Collector::start(config)).unwrap();
        let grpc_url = format!("http://{}", collector.grpc_addr().unwrap());
        let channel = rt.block_on(async {
            tonic::transport::Endpoint::from_shared(grpc_url)
                .unwrap()
                .tcp_nodelay(true)
                .connect()
                .await
                .unwrap()
        });
        let http = {
            let _g = rt.enter();
            Client::builder(TokioExecutor::new()).build_http()
        };
        Bench {
            http_url: format!(
                "http://{}{}",
                collector.http_addr().unwrap(),
                ingest::HTTP_RECORDS_PATH
            ),
            grpc: tonic::client::Grpc::new(channel),
            http,
            collector: Some(collector),
            rt,
            _dir: dir,
        }
    }

    async fn export(
        mut grpc: tonic::client::Grpc<tonic::transport::Channel>,
        batch: proto::RecordBatch,
    ) {
        grpc.ready().await.unwrap();
        let codec = tonic_prost::ProstCodec::<proto::RecordBatch, proto::ExportResponse>::default();
        let path = http::uri::PathAndQuery::from_static(ingest::GRPC_EXPORT_PATH);
        let n = batch.records.len() as u64;
        let ack = grpc
            .unary(tonic::Request::new(batch), path, codec)
            .await
            .expect("acknowledged");
        assert_eq!(ack.into_inner().accepted_records, n);
    }

    async fn post(&self, content_type: &str, body: Bytes) {
        let req = http::Request::post(&self.http_url)
            .header(http::header::CONTENT_TYPE, content_type)
            .body(Full::new(body))
            .unwrap();
        let resp = self.http.request(req).await.unwrap();
        let status = resp.status();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert!(
            status.is_success(),
            "{status}: {}",
            String::from_utf8_lossy(&body)
        );
    }
}

impl Drop for Bench {
    fn drop(&mut self) {
        if let Some(c) = self.collector.take() {
            self.rt.block_on(c.shutdown()).unwrap();
        }
    }
}

fn ingest_throughput(c: &mut Criterion) {
    let bench = Bench::start();
    for &n in &BATCH_SIZES {
        let records: Vec<Record> = (0..n).map(record).collect();
        let batch = proto::RecordBatch::from_records(&records);
        let pb = Bytes::from(prost::Message::encode_to_vec(&batch));
        let jsonl = Bytes::from(
            records
                .iter()
                .map(|r| r.to_json() + "\n")
                .collect::<String>(),
        );

        let mut g = c.benchmark_group(format!("ingest/batch={n}"));
        g.throughput(Throughput::Elements(n as u64));
        g.sample_size(10)
            .warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(4));

        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let mut store = Store::open(dir.path().join("direct.db")).unwrap();
        g.bench_function(BenchmarkId::new("store-direct", n), |b| {
            b.iter(|| store.insert(&records).unwrap())
        });
        g.bench_function(BenchmarkId::new("grpc", n), |b| {
            b.iter(|| {
                bench
                    .rt
                    .block_on(Bench::export(bench.grpc.clone(), batch.clone()))
            })
        });
        g.bench_function(BenchmarkId::new("http-protobuf", n), |b| {
            b.iter(|| {
                bench
                    .rt
                    .block_on(bench.post(ingest::CONTENT_TYPE_PROTOBUF, pb.clone()))
            })
        });
        g.bench_function(BenchmarkId::new("http-jsonl", n), |b| {
            b.iter(|| {
                bench
                    .rt
                    .block_on(bench.post(ingest::CONTENT_TYPE_JSON_LINES, jsonl.clone()))
            })
        });
        g.bench_function(
            BenchmarkId::new(format!("grpc-{CLIENTS}-clients"), n),
            |b| {
                b.iter_custom(|iters| {
                    bench.rt.block_on(async {
                        let t0 = Instant::now();
                        for _ in 0..iters {
                            let calls: Vec<_> = (0..CLIENTS)
                                .map(|_| {
                                    tokio::spawn(Bench::export(bench.grpc.clone(), batch.clone()))
                                })
                                .collect();
                            for call in calls {
                                call.await.unwrap();
                            }
                        }
                        // Per batch: the group of CLIENTS batches counts as CLIENTS batches.
                        t0.elapsed() / CLIENTS as u32
                    })
                })
            },
        );
        g.finish();
    }
}

criterion_group!(benches, ingest_throughput);
criterion_main!(benches);
