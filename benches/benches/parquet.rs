//! Records as Parquet at scale: Figure-1-shaped records
//! (~30 segments, the generator of `aggregate.rs`) written as JSON Lines, as
//! a SQLite store and as Parquet, then `cpt profile` run over each, side by
//! side: bytes per record, and the profile's wall time and peak RSS.
//!
//! `cpt profile` runs as a child process (the release binary next to this
//! bench's, so build it first); its peak RSS is its `VmHWM`, polled from
//! `/proc` while it runs (Linux). The three profiles must be byte-identical.
//!
//! `CPT_BENCH_RECORDS=N` sets the record count (10⁶ by default; 10⁷ needs
//! ~25 GB of scratch space for the JSON Lines and the store),
//! `CPT_BENCH_DIR` the scratch directory (a temporary one by default). Run:
//! `cargo build --release -p cpt-collector && cargo bench -p cpt-benches --bench parquet`.

use std::io::{BufWriter, Write as _};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use cpt_collector::records::parquet::PartitionedWriter;
use cpt_collector::store::{Durability, EncodedBatch, Store};
#[path = "support/records.rs"]
#[allow(dead_code)] // short_path is for the soak and store benches
mod records;
use cpt_sdk::path::Frame;
use cpt_sdk::record::Record;
use cpt_sdk::testing::SplitMix64 as Rng;
use cpt_sdk::trigger::Trigger;
use records::{figure1_path, stack_pool};

/// `distinct` records of 25–35 segments (as `aggregate.rs`), with request
/// ids and an A/B label, so the columns Parquet stores are all exercised.
fn distinct_records(distinct: usize) -> Vec<Record> {
    let mut rng = Rng::new(42);
    let stacks = stack_pool(&mut rng);
    (0..distinct)
        .map(|i| {
            let p = figure1_path(&mut rng, &stacks, Frame::clone);
            let mut r = Record::new("A", Trigger::Sampled, p);
            r.endpoint = Some("/a.A/Run".into());
            r.labels
                .insert("arm".into(), if i % 2 == 0 { "a" } else { "b" }.into());
            r
        })
        .collect()
}

/// Record `i` of the set: a distinct record with its own id and start time
/// (one request per 3.6 ms: 10⁶ records span an hour, two partitions).
fn nth(pool: &[Record], i: usize, rng: &mut Rng) -> Record {
    let mut r = pool[i % pool.len()].clone();
    r.start_unix_nanos = Some(1_700_000_000_000_000_000 + i as u64 * 3_600_000);
    r.request_id = Some(format!("{:016x}", rng.next_u64()));
    r
}

fn dir_bytes(dir: &Path) -> u64 {
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        n += if p.is_dir() {
            dir_bytes(&p)
        } else {
            std::fs::metadata(&p).unwrap().len()
        };
    }
    n
}

fn file_bytes(p: &Path) -> u64 {
    // the store's WAL is checkpointed when it closes; count any leftovers
    let mut n = std::fs::metadata(p).unwrap().len();
    for ext in ["-wal", "-shm"] {
        let mut q = p.as_os_str().to_owned();
        q.push(ext);
        n += std::fs::metadata(&q).map(|m| m.len()).unwrap_or(0);
    }
    n
}

/// The release `cpt` next to this bench binary (target/release/deps/..).
fn cpt_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("cpt"))
        .unwrap();
    assert!(
        bin.exists(),
        "{} missing: run `cargo build --release -p cpt-collector` first",
        bin.display()
    );
    bin
}

fn vm_hwm_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Run `cpt profile ARGS -o OUT`; wall time and peak RSS (MiB).
fn profile(cpt: &Path, args: &[&str], out: &Path) -> (Duration, f64) {
    let t0 = Instant::now();
    let mut child = Command::new(cpt)
        .arg("profile")
        .args(args)
        .arg("-o")
        .arg(out)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut peak = 0;
    loop {
        if let Some(kib) = vm_hwm_kib(child.id()) {
            peak = peak.max(kib);
        }
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let wall = t0.elapsed();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "cpt profile {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    (wall, peak as f64 / 1024.0)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` asks for a list
    }
    let n: usize = std::env::var("CPT_BENCH_RECORDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let cpt = cpt_binary();
    let tmp;
    let dir = match std::env::var_os("CPT_BENCH_DIR") {
        Some(d) => PathBuf::from(d),
        None => {
            tmp = tempfile::tempdir().unwrap();
            tmp.path().to_path_buf()
        }
    };
    std::fs::create_dir_all(&dir).unwrap();
    let (jsonl, store_path, pq) = (
        dir.join("records.jsonl"),
        dir.join("store.db"),
        dir.join("parquet"),
    );
    let pool = distinct_records(10_000);
    let mut rng = Rng::new(7);

    println!(
        "parquet bench: {n} records, ~30 segments each, in {}",
        dir.display()
    );
    let t = Instant::now();
    {
        let mut out = BufWriter::with_capacity(1 << 20, std::fs::File::create(&jsonl).unwrap());
        let mut store = Store::open_with(&store_path, Durability::Normal).unwrap();
        let mut writer = PartitionedWriter::new(&pq).unwrap();
        let mut batch = Vec::with_capacity(8192);
        for i in 0..n {
            let r = nth(&pool, i, &mut rng);
            out.write_all(r.to_json().as_bytes()).unwrap();
            out.write_all(b"\n").unwrap();
            batch.push(r);
            if batch.len() == 8192 || i + 1 == n {
                store.insert_encoded(&EncodedBatch::new(&batch)).unwrap();
                writer.write(&batch).unwrap();
                batch.clear();
            }
        }
        out.flush().unwrap();
        writer.finish().unwrap();
    }
    println!("  written in {:.1} s", t.elapsed().as_secs_f64());

    let (jb, sb, pb) = (
        std::fs::metadata(&jsonl).unwrap().len(),
        file_bytes(&store_path),
        dir_bytes(&pq),
    );
    let per = |b: u64| b as f64 / n as f64;
    println!("\n| source | bytes | bytes/record | vs JSON Lines |");
    println!("|---|---:|---:|---:|");
    for (name, b) in [
        ("JSON Lines", jb),
        ("SQLite store", sb),
        ("Parquet (Snappy)", pb),
    ] {
        println!(
            "| {name} | {b} | {:.0} | {:.3}× |",
            per(b),
            b as f64 / jb as f64
        );
    }

    let jsonl_s = jsonl.to_str().unwrap();
    let store_s = store_path.to_str().unwrap();
    let pq_s = pq.to_str().unwrap();
    let cases: [(&str, Vec<&str>); 3] = [
        ("JSON Lines", vec![jsonl_s]),
        ("SQLite store", vec!["--store", store_s]),
        ("Parquet dir", vec![pq_s]),
    ];
    let mut results = Vec::new();
    let mut profiles = Vec::new();
    for (name, args) in &cases {
        let out = dir.join(format!("{}.pb.gz", name.replace(' ', "_")));
        let (wall, rss) = profile(&cpt, args, &out);
        profiles.push(std::fs::read(&out).unwrap());
        results.push((*name, wall, rss));
    }
    assert!(
        profiles.windows(2).all(|w| w[0] == w[1]),
        "the three sources gave different profiles"
    );
    let (_, store_wall, store_rss) = results[1];
    println!("\n`cpt profile` over each source (identical profiles):\n");
    println!("| source | wall | peak RSS | wall vs store | RSS vs store |");
    println!("|---|---:|---:|---:|---:|");
    for (name, wall, rss) in &results {
        println!(
            "| {name} | {:.2} s | {rss:.0} MiB | {:.2}× | {:.2}× |",
            wall.as_secs_f64(),
            wall.as_secs_f64() / store_wall.as_secs_f64(),
            rss / store_rss
        );
    }
}
