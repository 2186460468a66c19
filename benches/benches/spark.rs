//! `cpt profile` (one process) against the Spark job
//! `collector/spark/cpt_aggregate.py` in `local[2]` mode, on the same
//! Parquet directory, and optionally against another version of the job.
//!
//! Generates `CPT_BENCH_RECORDS` (default 10⁶) Figure-1-shaped records of
//! 25–35 segments (services A–F, ~200 stacks of depth 2–7, some network /
//! queueing / unattributed / blind-spot time, labels `arm=a|b`, 5 % forced,
//! 12 ms apart: four hourly partitions per 10⁶), writes them with the
//! collector's Parquet writer (or reads `CPT_BENCH_PARQUET`, a directory
//! `cpt export --parquet-dir` wrote, without writing to it), then times and
//! measures (peak RSS: of `cpt`; of the Python driver plus its JVM for
//! Spark), for two selections:
//!
//! - `band`: `--label arm=b --percentile p0-p99` (the exact band ranks every
//!   selected record);
//! - `one-hour`: `--since/--until` the middle `date=/hour=` partition's hour
//!   (the job opens that partition's files only);
//!
//! 1. `cpt profile DIR SELECTION -o cpt.pb.gz`
//! 2. `cpt_aggregate.py DIR SELECTION --master local[2]`, then
//!    `cpt profile --from-aggregate` (the profiles must be byte-identical);
//! 3. with `CPT_BENCH_SPARK_BASELINE=FILE`, that version of the job too.
//!
//! `CPT_BENCH_ROUNDS` (default 1) repeats the runs, alternating their order,
//! and the summary gives medians and ratios. The Spark job's first band run
//! is split by stage from its event log: task time (executorRunTime, summed
//! over tasks), and inside the stages that read the Parquet files, Spark's
//! own "scan time" metric versus the rest (exploding segments, stack keys
//! and hashes, map-side aggregation), shuffle bytes and write time.
//!
//! `CPT_SPARK_PYTHON` names the Python with pyspark (default
//! `.venv-spark/bin/python`), `CPT_BENCH_DIR` keeps the outputs (and a
//! generated Parquet directory; otherwise a temporary one),
//! `CPT_BENCH_SPARK_MEMORY` is the driver's memory (default 4g). Run:
//! `cargo bench -p cpt-benches --bench spark`
//! (needs ~0.5 GB of disk per 10⁶ records).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use clap::Parser as _;
use cpt_collector::records::parquet::PartitionedWriter;
#[path = "support/records.rs"]
#[allow(dead_code)] // short_path is for the soak and store benches
mod records;
use cpt_sdk::path::Frame;
use cpt_sdk::record::Record;
use cpt_sdk::testing::SplitMix64 as Rng;
use cpt_sdk::trigger::Trigger;
use records::{figure1_path, stack_pool};

fn record(rng: &mut Rng, stacks: &[Vec<Frame>], i: u64) -> Record {
    let p = figure1_path(rng, stacks, Frame::clone);
    let trigger = if rng.below(20) == 0 {
        Trigger::Forced
    } else {
        Trigger::Sampled
    };
    let mut r = Record::new("A", trigger, p);
    r.endpoint = Some("/frontend".into());
    r.request_id = Some(format!("req-{i}"));
    // 12 ms apart: 300 000 records an hour, four hourly partitions per 10⁶.
    r.start_unix_nanos = Some(1_700_000_000_000_000_000 + i * 3_600_000_000_000 / 300_000);
    r.labels.insert(
        "arm".into(),
        if rng.below(2) == 0 { "a" } else { "b" }.into(),
    );
    r
}

fn generate(dir: &Path, n: u64) -> u64 {
    let mut rng = Rng::new(42);
    let stacks = stack_pool(&mut rng);
    let mut w = PartitionedWriter::new(dir).expect("parquet dir");
    let mut batch = Vec::with_capacity(10_000);
    for i in 0..n {
        batch.push(record(&mut rng, &stacks, i));
        if batch.len() == 10_000 {
            w.write(&batch).expect("write parquet");
            batch.clear();
        }
    }
    w.write(&batch).expect("write parquet");
    w.finish().expect("finish parquet");
    dir_bytes(dir)
}

fn dir_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        total += if p.is_dir() {
            dir_bytes(&p)
        } else {
            e.metadata().map_or(0, |m| m.len())
        };
    }
    total
}

/// VmRSS (kB) of `pid` and all its descendants.
fn tree_rss_kb(pid: u32) -> u64 {
    let mut parent: BTreeMap<u32, u32> = BTreeMap::new();
    let mut rss: BTreeMap<u32, u64> = BTreeMap::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(e.path().join("status")) else {
            continue;
        };
        for line in status.lines() {
            let num = |l: &str| -> u64 {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0)
            };
            if line.starts_with("PPid:") {
                parent.insert(p, num(line) as u32);
            } else if line.starts_with("VmRSS:") {
                rss.insert(p, num(line));
            }
        }
    }
    let in_tree = |mut p: u32| loop {
        if p == pid {
            return true;
        }
        match parent.get(&p) {
            Some(&q) if q != 0 && q != p => p = q,
            _ => return false,
        }
    };
    rss.iter()
        .filter(|(p, _)| in_tree(**p))
        .map(|(_, r)| r)
        .sum()
}

/// Run a command, sampling the RSS of its process tree every 50 ms:
/// (wall time, peak kB, stderr).
fn measure(mut cmd: Command) -> (Duration, u64, String) {
    let t = Instant::now();
    let mut child = cmd
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = child.id();
    let err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || std::io::read_to_string(err).unwrap_or_default());
    let mut peak = 0;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let stderr = reader.join().unwrap();
            assert!(status.success(), "{cmd:?} failed: {stderr}");
            return (t.elapsed(), peak, stderr);
        }
        peak = peak.max(tree_rss_kb(pid));
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Per-stage totals from a Spark event log.
#[derive(Default, Debug)]
struct Stage {
    name: String,
    tasks: u64,
    wall_ms: u64,
    metrics: BTreeMap<String, u64>,
}

fn event_log_stages(dir: &Path) -> Vec<(u64, Stage)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        for line in text.lines() {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            if v["Event"] != "SparkListenerStageCompleted" {
                continue;
            }
            let si = &v["Stage Info"];
            let mut st = Stage {
                name: si["Stage Name"].as_str().unwrap_or("").to_owned(),
                tasks: si["Number of Tasks"].as_u64().unwrap_or(0),
                wall_ms: si["Completion Time"]
                    .as_u64()
                    .unwrap_or(0)
                    .saturating_sub(si["Submission Time"].as_u64().unwrap_or(0)),
                ..Stage::default()
            };
            for acc in si["Accumulables"].as_array().into_iter().flatten() {
                let name = acc["Name"].as_str().unwrap_or("");
                let val = acc["Value"]
                    .as_u64()
                    .or_else(|| acc["Value"].as_str().and_then(|s| s.parse().ok()));
                if let Some(val) = val {
                    *st.metrics.entry(name.to_owned()).or_default() += val;
                }
            }
            out.push((si["Stage ID"].as_u64().unwrap_or(0), st));
        }
    }
    out.sort_by_key(|(id, _)| *id);
    out
}

fn python() -> PathBuf {
    std::env::var_os("CPT_SPARK_PYTHON").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv-spark/bin/python"),
        PathBuf::from,
    )
}

fn mb(kb: u64) -> String {
    format!("{:.0} MB", kb as f64 / 1024.0)
}

/// The `date=YYYY-MM-DD/hour=HH` partition directories under `dir`, sorted.
fn partitions(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for d in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let date = d.file_name().to_string_lossy().into_owned();
        let Some(date) = date.strip_prefix("date=") else {
            continue;
        };
        for h in std::fs::read_dir(d.path()).into_iter().flatten().flatten() {
            if let Some(hour) = h.file_name().to_string_lossy().strip_prefix("hour=") {
                out.push((date.to_owned(), hour.to_owned()));
            }
        }
    }
    out.sort();
    out
}

/// One timed run.
struct Run {
    case: &'static str,
    who: &'static str,
    wall: Duration,
    rss_kb: u64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn main() {
    // Child mode: this binary runs `cpt` itself, so the bench needs no
    // separately built binary and measures only the command.
    if std::env::var_os("CPT_BENCH_CPT_CHILD").is_some() {
        let args = std::env::args().skip_while(|a| a != "--").skip(1);
        let cli =
            cpt_collector::cli::Cli::parse_from(std::iter::once("cpt".to_owned()).chain(args));
        cpt_collector::cli::run(cli).expect("cpt");
        return;
    }
    let n: u64 = std::env::var("CPT_BENCH_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let rounds: usize = std::env::var("CPT_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .max(1);
    let baseline = std::env::var_os("CPT_BENCH_SPARK_BASELINE").map(PathBuf::from);
    let tmp = tempfile::tempdir().unwrap();
    let work =
        std::env::var_os("CPT_BENCH_DIR").map_or_else(|| tmp.path().to_owned(), PathBuf::from);
    std::fs::create_dir_all(&work).unwrap();
    let t = Instant::now();
    let (pq, bytes) = match std::env::var_os("CPT_BENCH_PARQUET") {
        Some(dir) => {
            let pq = PathBuf::from(dir);
            println!("reading {} (not written to)", pq.display());
            let bytes = dir_bytes(&pq);
            (pq, bytes)
        }
        None => {
            let pq = work.join("parquet");
            if pq.exists() {
                println!("reusing {}", pq.display());
                let bytes = dir_bytes(&pq);
                (pq, bytes)
            } else {
                let bytes = generate(&pq, n);
                (pq, bytes)
            }
        }
    };
    println!(
        "records: {n} as Parquet ({:.1?}): {:.1} MB, {:.0} bytes/record",
        t.elapsed(),
        bytes as f64 / 1e6,
        bytes as f64 / n as f64
    );
    // One hour: the middle date=/hour= partition.
    let parts = partitions(&pq);
    let hour = parts.get(parts.len() / 2).cloned();
    let (since, until) = hour
        .as_ref()
        .map_or((String::new(), String::new()), |(d, h)| {
            let since = cpt_collector::selection::parse_time(&format!("{d}T{h}:00:00Z"))
                .expect("partition hour");
            (since.to_string(), (since + 3_600_000_000_000).to_string())
        });
    println!(
        "{} hour partitions; one-hour case: {:?} (--since {since} --until {until})",
        parts.len(),
        hour
    );
    let mut cases: Vec<(&'static str, Vec<&str>)> =
        vec![("band", vec!["--label", "arm=b", "--percentile", "p0-p99"])];
    if hour.is_some() {
        cases.push(("one-hour", vec!["--since", &since, "--until", &until]));
    }

    let py = python();
    let job = Path::new(env!("CARGO_MANIFEST_DIR")).join("../collector/spark/cpt_aggregate.py");
    let mut jobs: Vec<(&'static str, PathBuf)> = vec![("cpt_aggregate.py", job)];
    if let Some(b) = &baseline {
        jobs.push(("baseline job", b.clone()));
    }
    let events = work.join("spark-events");
    let mut runs: Vec<Run> = Vec::new();
    for round in 0..rounds {
        for (case, sel) in &cases {
            let want = work.join(format!("{case}.cpt.pb.gz"));
            // cpt first in even rounds, last in odd ones; the jobs alternate too.
            let mut order: Vec<Option<usize>> = std::iter::once(None)
                .chain((0..jobs.len()).map(Some))
                .collect();
            if round % 2 == 1 {
                order.reverse();
            }
            let mut spark_aggs = Vec::new();
            for who in order {
                match who {
                    None => {
                        let mut cmd = Command::new(std::env::current_exe().unwrap());
                        cmd.env("CPT_BENCH_CPT_CHILD", "1")
                            .arg("--")
                            .arg("profile")
                            .arg(&pq)
                            .args(sel)
                            .arg("-o")
                            .arg(&want);
                        let (wall, rss_kb, _) = measure(cmd);
                        println!(
                            "round {round} {case}: cpt profile {wall:.2?}, peak RSS {}",
                            mb(rss_kb)
                        );
                        runs.push(Run {
                            case,
                            who: "cpt profile",
                            wall,
                            rss_kb,
                        });
                    }
                    Some(j) => {
                        let (who, script) = &jobs[j];
                        let agg = work.join(format!("{case}-{j}.agg"));
                        let timings = work.join(format!("{case}-{j}.timings.json"));
                        // The event log of this job's first band run, for the stage split.
                        let log = round == 0 && j == 0 && *case == "band";
                        let mut submit = format!(
                            "--driver-memory {}",
                            std::env::var("CPT_BENCH_SPARK_MEMORY").unwrap_or_else(|_| "4g".into())
                        );
                        if log {
                            let _ = std::fs::remove_dir_all(&events);
                            std::fs::create_dir_all(&events).unwrap();
                            submit += &format!(
                                " --conf spark.eventLog.enabled=true --conf spark.eventLog.dir=file://{}",
                                events.display()
                            );
                        }
                        let mut cmd = Command::new(&py);
                        cmd.arg(script)
                            .arg(&pq)
                            .args(sel)
                            .args(["--master", "local[2]", "--output"])
                            .arg(&agg)
                            .arg("--timings")
                            .arg(&timings)
                            .env("PYSPARK_SUBMIT_ARGS", format!("{submit} pyspark-shell"));
                        let (wall, rss_kb, _) = measure(cmd);
                        println!(
                            "round {round} {case}: {who} local[2] {wall:.2?}, peak RSS {} (python \
                             driver + JVM); phases {}",
                            mb(rss_kb),
                            std::fs::read_to_string(&timings).unwrap_or_default()
                        );
                        runs.push(Run {
                            case,
                            who,
                            wall,
                            rss_kb,
                        });
                        spark_aggs.push((*who, agg));
                    }
                }
            }
            for (who, agg) in spark_aggs {
                let got = work.join(format!("{case}.spark.pb.gz"));
                let mut cmd = Command::new(std::env::current_exe().unwrap());
                cmd.env("CPT_BENCH_CPT_CHILD", "1")
                    .arg("--")
                    .arg("profile")
                    .arg("--from-aggregate")
                    .arg(&agg)
                    .arg("-o")
                    .arg(&got);
                measure(cmd);
                let same = std::fs::read(&want).unwrap() == std::fs::read(&got).unwrap();
                assert!(same, "{case}: {who}'s profile differs from cpt profile's");
            }
        }
    }

    println!("\nmedians over {rounds} round(s), local[2] against one cpt process:");
    for (case, _) in &cases {
        let wall = |who: &str| {
            median(
                runs.iter()
                    .filter(|r| r.case == *case && r.who == who)
                    .map(|r| r.wall.as_secs_f64())
                    .collect(),
            )
        };
        let rss = |who: &str| {
            runs.iter()
                .filter(|r| r.case == *case && r.who == who)
                .map(|r| r.rss_kb)
                .max()
                .unwrap_or(0)
        };
        let cpt = wall("cpt profile");
        let job = wall("cpt_aggregate.py");
        print!(
            "{case:>9}: cpt profile {cpt:.1} s ({}), cpt_aggregate.py {job:.1} s ({}) = {:.2}x cpt",
            mb(rss("cpt profile")),
            mb(rss("cpt_aggregate.py")),
            job / cpt
        );
        if baseline.is_some() {
            let base = wall("baseline job");
            print!(
                ", baseline job {base:.1} s ({}) = {:.2}x cpt; cpt_aggregate.py / baseline = {:.2}",
                mb(rss("baseline job")),
                base / cpt,
                job / base
            );
        }
        println!();
    }

    println!(
        "\nSpark stages of the band run (event log): task time = executorRunTime summed over tasks"
    );
    println!(
        "{:>5} {:>6} {:>9} {:>10} {:>10} {:>11} {:>11} {:>10}  name",
        "stage", "tasks", "wall ms", "task ms", "scan ms", "input MB", "shuffle MB", "shufw ms"
    );
    let mut totals = (0u64, 0u64, 0u64, 0u64);
    for (id, st) in event_log_stages(&events) {
        let m = |k: &str| st.metrics.get(k).copied().unwrap_or(0);
        let task = m("internal.metrics.executorRunTime");
        let scan = m("scan time");
        let shuffle = m("internal.metrics.shuffle.write.bytesWritten");
        let shufw = m("internal.metrics.shuffle.write.writeTime") / 1_000_000;
        let input = m("internal.metrics.input.bytesRead");
        totals.0 += task;
        totals.1 += scan;
        totals.2 += shuffle;
        if input > 0 {
            totals.3 += task;
        }
        println!(
            "{id:>5} {:>6} {:>9} {task:>10} {scan:>10} {:>11.1} {:>11.1} {shufw:>10}  {}",
            st.tasks,
            st.wall_ms,
            input as f64 / 1e6,
            shuffle as f64 / 1e6,
            st.name.chars().take(60).collect::<String>()
        );
    }
    println!(
        "task time {} ms in all: {} ms in stages reading Parquet (of which scan {} ms; the \
         rest is explode, stack keys, map-side aggregation), {} ms in the others; {:.1} MB \
         shuffled",
        totals.0,
        totals.3,
        totals.1,
        totals.0 - totals.3,
        totals.2 as f64 / 1e6
    );
}
