//! `cpt show`: one request's critical path as a readable tree.
//!
//! The record is found by request id or trace id in a store (`--store`,
//! through its id index), JSON Lines files, or a running collector
//! (`--collector URL`, its `GET /v1/records`). Each frame shows its service,
//! its time on the path (inclusive) and its share of the latency; the time
//! the path could not explain in detail (network, blind spot, unattributed,
//! queueing) appears as marked leaves; the slowest leaves are flagged. The
//! leaves' times sum to the latency exactly.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use cpt_sdk::record::Record;

use super::profile::fold_sources;
use super::remote::{Remote, RemoteArgs, check_request_id, check_trace_id, selection_query};
use crate::format::fmt_ns;
use crate::profile::aggregate::{Aggregate, Aggregator};
use crate::profile::flame::{FlameOptions, flame_svg};
pub use crate::profile::tree::{Baseline, Node, tree};
use crate::profile::tree::{PathKey, collect_leaves};
use crate::records::selection::{Selection, TriggerFilter};
use crate::records::{ReadOptions, RecordReader};

/// Show one request's critical path as a tree: each frame's service, time on the path and share
/// of the latency, accounting time (network, blind spot, unattributed, queueing) marked, the
/// slowest leaves flagged.
#[derive(Debug, Clone, clap::Args)]
pub struct ShowArgs {
    /// The request id (the x-request-id the request carried, as `cpt force` printed it).
    #[arg(long, value_name = "ID", required_unless_present = "trace_id", value_parser = parse_request_id)]
    pub request_id: Option<String>,
    /// The OpenTelemetry trace id instead (32 hex digits).
    #[arg(long, value_name = "HEX", conflicts_with = "request_id", value_parser = parse_trace_id)]
    pub trace_id: Option<String>,
    /// JSON Lines record files (`-` = stdin; gzip is recognised by its content).
    #[arg(value_name = "INPUT")]
    pub inputs: Vec<PathBuf>,
    /// Read from this SQLite store (as `cpt serve` / `cpt import` write it).
    #[arg(long, value_name = "PATH", conflicts_with = "inputs")]
    pub store: Option<PathBuf>,
    /// Ask a running collector (`cpt serve --http`), e.g. http://127.0.0.1:7071.
    #[arg(long, value_name = "URL", conflicts_with_all = ["inputs", "store"])]
    pub collector: Option<String>,
    /// How to read from the collector (its read token).
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Keep looking until the record arrives or this time has passed (e.g. 10s, 500ms).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub wait: Option<Duration>,
    /// Also draw the request's path as a flame graph SVG here.
    #[arg(long, value_name = "OUT.svg")]
    pub flame: Option<PathBuf>,
    /// Print a link to the full distributed trace: `{trace_id}` (and `{request_id}`) are
    /// replaced, e.g. http://jaeger:16686/trace/{trace_id}.
    #[arg(long, value_name = "TEMPLATE")]
    pub trace_url: Option<String>,
    /// Put each frame's time next to the same endpoint's sampled average from the same source.
    #[arg(long)]
    pub compare: bool,
    /// How many of the slowest leaves to flag.
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub top: usize,
}

fn parse_request_id(s: &str) -> Result<String, String> {
    check_request_id(s).map(|()| s.to_owned())
}

fn parse_trace_id(s: &str) -> Result<String, String> {
    check_trace_id(s).map(|()| s.to_ascii_lowercase())
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{s:?}: {e} (expected e.g. 10s, 500ms, 1m)"))
}

/// Where records are looked up.
#[derive(Debug)]
enum Source<'a> {
    Store(&'a std::path::Path),
    Files(&'a [PathBuf]),
    Collector(Box<Remote>),
}

impl Source<'_> {
    fn describe(&self) -> String {
        match self {
            Source::Store(p) => format!("store {}", p.display()),
            Source::Files(f) => f
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            Source::Collector(r) => format!("collector {}", r.url()),
        }
    }

    /// The records `sel` selects (at most `limit`), oldest first.
    /// The profile of every record `sel` selects, folded the way `cpt
    /// profile` folds them (the collector's `/profile`).
    fn profile(&self, sel: &Selection) -> anyhow::Result<Aggregate> {
        match self {
            Source::Collector(remote) => {
                let answer = remote.get("/profile", &selection_query(sel))?;
                crate::profile::pprof::read_aggregate(&answer.body).with_context(|| {
                    format!(
                        "the collector {} sent a profile that does not decode",
                        remote.url()
                    )
                })
            }
            Source::Store(path) => {
                let mut agg = Aggregator::new(sel.clone());
                fold_sources(&[], Some(path), &mut agg)?;
                Ok(agg.finish())
            }
            Source::Files(files) => {
                let mut agg = Aggregator::new(sel.clone());
                fold_sources(files, None, &mut agg)?;
                Ok(agg.finish())
            }
        }
    }

    fn fetch(&self, sel: &Selection, limit: u64) -> anyhow::Result<Vec<Record>> {
        match self {
            #[cfg(feature = "server")]
            Source::Store(path) => {
                let store = crate::server::store::Store::open_read_only(path)?;
                let mut q = crate::server::store::StoreQuery::from_selection(sel);
                q.limit = Some(limit);
                Ok(store.query(&q)?.collect::<Result<_, _>>()?)
            }
            #[cfg(not(feature = "server"))]
            Source::Store(_) => bail!("this cpt was built without the store (feature `server`)"),
            Source::Files(files) => {
                let mut out = Vec::new();
                for path in *files {
                    let mut reader = RecordReader::open(path, ReadOptions::default())?;
                    while let Some(batch) = reader.next_batch(&mut |w| {
                        eprintln!("cpt: warning: {w}");
                    })? {
                        out.extend(batch.into_iter().filter(|r| sel.matches(r)));
                    }
                }
                out.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
                Ok(out)
            }
            Source::Collector(remote) => {
                let mut pairs = sel.pairs();
                pairs.push(("limit", limit.to_string()));
                let answer = remote.get("/v1/records", &crate::records::query::encode(pairs))?;
                let url = remote.url();
                let body = String::from_utf8(answer.body)
                    .context("the collector's answer is not UTF-8")?;
                body.lines()
                    .filter(|l| !l.trim().is_empty())
                    .map(|l| {
                        Record::from_json(l)
                            .with_context(|| format!("the collector {url} sent a bad record"))
                    })
                    .collect()
            }
        }
    }
}

/// Render a record's tree (see the module docs).
pub fn render(r: &Record, top: usize, baseline: Option<&Baseline>) -> String {
    let root = tree(r);
    let latency = root.total_ns;
    let mut out = String::new();
    let _ = write!(
        out,
        "request {} · {}{} · {} · latency {}",
        r.request_id.as_deref().unwrap_or("(no request id)"),
        r.service,
        r.endpoint
            .as_deref()
            .map(|e| format!(" {e}"))
            .unwrap_or_default(),
        r.trigger.as_str(),
        fmt_ns(latency)
    );
    if let Some(t) = r.start_unix_nanos {
        let _ = write!(
            out,
            " · started {}",
            crate::records::selection::format_time(t)
        );
    }
    if let Some(t) = &r.trace_id {
        let _ = write!(out, " · trace {t}");
    }
    out.push('\n');
    if let Some(b) = baseline {
        let _ = writeln!(
            out,
            "compared with the mean of {} sampled requests of the same endpoint (mean latency {})",
            b.requests,
            fmt_ns(b.mean_latency_ns)
        );
    }
    // The slowest leaves: (own time, id) over frames' busy self time and accounting leaves.
    let mut leaves = Vec::new();
    collect_leaves(&root, &mut leaves);
    leaves.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let flagged: Vec<usize> = leaves.iter().take(top).map(|l| l.1).collect();
    let mut ctx = Render {
        latency,
        flagged,
        next_id: 0,
        baseline,
        key: Vec::new(),
    };
    for (i, c) in root.children.iter().enumerate() {
        ctx.node(&mut out, c, "", i + 1 == root.children.len());
    }
    let _ = writeln!(
        out,
        "leaves sum to {} = latency; ★ marks the {} slowest leaves (own time); [..] is time the path could not explain in detail",
        fmt_ns(root.leaf_sum()),
        top.min(leaves.len())
    );
    out
}

struct Render<'a> {
    latency: u64,
    flagged: Vec<usize>,
    next_id: usize,
    baseline: Option<&'a Baseline>,
    key: PathKey,
}

impl Render<'_> {
    fn node(&mut self, out: &mut String, n: &Node, prefix: &str, last: bool) {
        let id = self.next_id;
        self.next_id += 1;
        self.key.push((n.service.clone(), n.name.clone(), n.kind));
        let branch = if last { "└─ " } else { "├─ " };
        let share = if self.latency == 0 {
            0.0
        } else {
            n.total_ns as f64 * 100.0 / self.latency as f64
        };
        let label = match n.kind {
            Some(k) => format!("[{}]", k.as_str().replace('_', " ")),
            None => format!("{} ({})", n.name, n.service),
        };
        let _ = write!(
            out,
            "{prefix}{branch}{label:<w$} {:>10} {share:>5.1}%",
            fmt_ns(n.total_ns),
            w = 36usize.saturating_sub(prefix.chars().count())
        );
        if n.kind.is_none() && n.self_ns > 0 && !n.children.is_empty() {
            let _ = write!(out, "  self {}", fmt_ns(n.self_ns));
        }
        if let Some(b) = self.baseline {
            let avg = b.mean_at(&self.key);
            let delta = n.total_ns as i128 - avg as i128;
            let sign = if delta >= 0 { "+" } else { "-" };
            let _ = write!(
                out,
                "  avg {} ({sign}{})",
                fmt_ns(avg),
                fmt_ns(delta.unsigned_abs() as u64)
            );
        }
        if let Some(rank) = self.flagged.iter().position(|f| *f == id) {
            let _ = write!(out, "  ★ slowest #{}", rank + 1);
        }
        out.push('\n');
        let child_prefix = format!("{prefix}{}", if last { "   " } else { "│  " });
        for (i, c) in n.children.iter().enumerate() {
            self.node(out, c, &child_prefix, i + 1 == n.children.len());
        }
        self.key.pop();
    }
}

/// Find the records `args` ask for, waiting as long as `--wait` allows.
fn find(args: &ShowArgs, source: &Source<'_>, sel: &Selection) -> anyhow::Result<Vec<Record>> {
    let deadline = args.wait.map(|w| Instant::now() + w);
    loop {
        let found = source.fetch(sel, 100)?;
        if !found.is_empty() {
            return Ok(found);
        }
        match deadline {
            Some(d) if Instant::now() < d => std::thread::sleep(Duration::from_millis(100)),
            _ => {
                let what = match (&args.request_id, &args.trace_id) {
                    (Some(id), _) => format!("request id {id:?}"),
                    (_, Some(id)) => format!("trace id {id:?}"),
                    _ => unreachable!("clap requires one"),
                };
                let mut hint = match args.wait {
                    Some(w) => format!("(waited {})", humantime::format_duration(w)),
                    None => "(records reach the collector milliseconds to seconds after the response: try --wait 10s; \
                         was the request traced? A force with a wrong credential is ignored)"
                        .to_owned(),
                };
                if let Source::Collector(remote) = source
                    && remote.forced_withheld()
                {
                    hint.push_str(
                        "; the collector has no read token, so it serves no forced record: \
                         start it with --read-token-file and read with that token",
                    );
                }
                bail!("no record with {what} in {} {hint}", source.describe());
            }
        }
    }
}

/// Run `cpt show`.
///
/// # Errors
///
/// As [`show`].
pub fn run(args: ShowArgs) -> anyhow::Result<()> {
    let out = show(&args)?;
    std::io::stdout().write_all(out.as_bytes())?;
    Ok(())
}

/// What `cpt show` prints (and the `--flame` file it writes, only once the
/// record is found).
///
/// # Errors
///
/// No source, an unknown id (after `--wait`), an unreadable source, a
/// collector that is down, an old store without the id index, an unwritable
/// `--flame` file.
pub fn show(args: &ShowArgs) -> anyhow::Result<String> {
    let source = match (&args.store, &args.collector) {
        (Some(s), _) => Source::Store(s),
        (_, Some(u)) => Source::Collector(Box::new(Remote::new(u, &args.remote)?)),
        _ if !args.inputs.is_empty() => Source::Files(&args.inputs),
        _ => bail!(
            "no input: give --store PATH, --collector http://HOST:PORT, or JSON Lines record files"
        ),
    };
    let mut sel = Selection::new().with_triggers(TriggerFilter::All);
    if let Some(id) = &args.request_id {
        sel = sel.with_request_id(id);
    }
    if let Some(id) = &args.trace_id {
        sel = sel.with_trace_id(id);
    }
    let records = find(args, &source, &sel)?;
    let mut out = String::new();
    if records.len() > 1 {
        let _ = writeln!(out, "{} records match; each in turn\n", records.len());
    }
    for r in &records {
        let baseline = if args.compare {
            let mut base = Selection::new()
                .with_service(&r.service)
                .with_triggers(TriggerFilter::Sampled);
            if let Some(e) = &r.endpoint {
                base = base.with_endpoint(e);
            }
            let sampled = source.profile(&base)?;
            if sampled.requests() == 0 {
                eprintln!(
                    "cpt: warning: no sampled records of {} {} in {} to compare with",
                    r.service,
                    r.endpoint.as_deref().unwrap_or(""),
                    source.describe()
                );
                None
            } else {
                Some(Baseline::of_aggregate(&sampled))
            }
        } else {
            None
        };
        out.push_str(&render(r, args.top, baseline.as_ref()));
        if let Some(t) = &args.trace_url {
            match &r.trace_id {
                Some(id) => {
                    let url = t
                        .replace("{trace_id}", id)
                        .replace("{request_id}", r.request_id.as_deref().unwrap_or_default());
                    let _ = writeln!(out, "trace: {url}");
                }
                None => {
                    let _ = writeln!(
                        out,
                        "trace: this record has no OpenTelemetry trace id (the service ran without it)"
                    );
                }
            }
        }
        out.push('\n');
    }
    if let Some(path) = &args.flame {
        let r = &records[0];
        let agg = Aggregate::from_records(&sel, std::slice::from_ref(r));
        let opts = FlameOptions {
            title: Some(format!(
                "cpt critical path of request {}: {}",
                r.request_id.as_deref().unwrap_or("?"),
                fmt_ns(u64::try_from(r.latency.as_nanos()).unwrap_or(u64::MAX))
            )),
            ..FlameOptions::default()
        };
        let svg = flame_svg(&agg, &opts)?;
        std::fs::write(path, svg).with_context(|| format!("writing {}", path.display()))?;
        let _ = writeln!(out, "flame graph: {}", path.display());
    }
    Ok(out)
}
