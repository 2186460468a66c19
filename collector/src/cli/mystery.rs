//! `cpt traces model`, `cpt traces slack`, `cpt traces outliers`: the
//! Mystery Machine (Chow et al., OSDI 2014) over imported traces.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use serde_json::json;

use crate::format::fmt_ns;
use crate::format::plural;
use crate::traces::analysis::mystery::{self, Model, Models, Request, RequestSlack};
use crate::traces::{Endpoint, Format, RepairOptions, RootSelector};

/// Input files and choices shared by the Mystery Machine's commands.
#[derive(Debug, clap::Args)]
pub struct MysteryInput {
    /// Trace file format.
    #[arg(long = "from", value_name = "jaeger|zipkin|otlp|nezha", value_parser = |s: &str| s.parse::<Format>())]
    pub from: Format,
    /// Trace files (gzipped or not).
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Requests are spans of this endpoint, `SERVICE[:OPERATION]`
    /// (repeatable); default: every root span.
    #[arg(long = "root", value_name = "SERVICE[:OPERATION]")]
    pub roots: Vec<Endpoint>,
    /// Keep spans whose parent is missing as extra roots.
    #[arg(long)]
    pub orphans_as_roots: bool,
    /// Do not shift server spans by the client/server round trip; only
    /// truncate and drop (as `cpt traces convert --no-shift`).
    #[arg(long)]
    pub no_shift: bool,
    /// No summary of the import on stderr.
    #[arg(long, short)]
    pub quiet: bool,
}

impl MysteryInput {
    /// Read the traces and cut them into requests.
    fn requests(&self) -> anyhow::Result<Vec<Request>> {
        self.requests_of(&self.files)
    }

    /// Read `files` with these choices and cut them into requests.
    fn requests_of(&self, files: &[PathBuf]) -> anyhow::Result<Vec<Request>> {
        let set = super::load::load_traces("", files, self.from, self.orphans_as_roots)?;
        let sel = if self.roots.is_empty() {
            RootSelector::AllRoots
        } else {
            RootSelector::Endpoints(self.roots.clone())
        };
        let repair = RepairOptions {
            shift_rpc: !self.no_shift,
        };
        let mut paths = mystery::CallPaths::default();
        let reqs: Vec<Request> = set
            .traces
            .iter()
            .flat_map(|t| mystery::requests_with(t, &sel, &repair, &mut paths))
            .collect();
        if reqs.is_empty() {
            bail!(
                "no span of the {} matches --root {}; `cpt traces bottomup` lists the operations",
                plural(set.traces.len() as u64, "trace"),
                self.roots
                    .iter()
                    .map(|e| match &e.operation {
                        Some(o) => format!("{}:{o}", e.service),
                        None => e.service.clone(),
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        if !self.quiet {
            eprintln!(
                "{} read, {} analysed",
                plural(set.traces.len() as u64, "trace"),
                plural(reqs.len() as u64, "request")
            );
        }
        Ok(reqs)
    }
}

fn learn(reqs: &[Request]) -> Models {
    let mut ms = Models::default();
    for r in reqs {
        ms.observe(r);
    }
    ms.finish();
    ms
}

fn write_bytes(path: &std::path::Path, bytes: &[u8]) -> anyhow::Result<()> {
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

fn write(path: &PathBuf, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// Infer the causal model (happens-before, mutual exclusion, pipeline) from
/// the traces by hypothesis refinement (MM §4.1–4.3).
#[derive(Debug, clap::Args)]
pub struct ModelArgs {
    #[command(flatten)]
    input: MysteryInput,
    /// Write `{"traces_used", "relations": [{"kind", "a", "b",
    /// "endpoint"}], "convergence": [[requests, hypotheses_left]], "endpoints": [...]}` here.
    #[arg(long, value_name = "OUT.json")]
    json: Option<PathBuf>,
    /// Write the model as Graphviz (transitive reduction; one graph per
    /// endpoint) here: `dot -Tsvg OUT.dot > model.svg`.
    #[arg(long, value_name = "OUT.dot")]
    dot: Option<PathBuf>,
}

/// Run `cpt traces model`.
///
/// # Errors
///
/// Unreadable inputs, no trace or no request in them, unwritable outputs.
pub fn model(args: ModelArgs) -> anyhow::Result<()> {
    let reqs = args.input.requests()?;
    let ms = learn(&reqs);
    drop(reqs);
    let mut out = String::new();
    let mut endpoints = Vec::new();
    for (ep, m) in &ms.by_endpoint {
        let [hb, me, pl] = m.relation_counts();
        let _ = writeln!(
            out,
            "{ep}: {}, {} ({} events); {} hypotheses left: {hb} happens-before, {me} mutual exclusion, {pl} pipeline; last changed at request {} of {}",
            plural(m.requests as u64, "request"),
            plural(m.segments.len() as u64, "segment"),
            m.events(),
            m.hypotheses(),
            m.last_change,
            m.requests
        );
        if let Some(last) = m.novel.last() {
            let _ = writeln!(
                out,
                "  {} brought segments never seen before (their relations are tested by fewer requests); the last: trace {} after {} ({}, e.g. {})",
                plural(m.novel.len() as u64, "request"),
                last.trace_id,
                plural(last.after as u64, "request"),
                plural(last.new_segments.len() as u64, "new segment"),
                short(&last.new_segments[0])
            );
        }
        endpoints.push(json!({
            "endpoint": &**ep,
            "requests": m.requests,
            "segments": m.segments.len(),
            "events": m.events(),
            "hypotheses_left": m.hypotheses(),
            "last_change": m.last_change,
            "novel": m.novel.iter().map(|n| json!({
                "trace_id": &*n.trace_id, "after": n.after, "new_segments": n.new_segments
            })).collect::<Vec<_>>(),
        }));
    }
    let _ = write!(out, "convergence (requests → hypotheses left):");
    for (n, h) in &ms.convergence {
        let _ = write!(out, " {n}→{h}");
    }
    out.push('\n');
    print!("{out}");
    if let Some(p) = &args.json {
        write_model_json(p, &ms, &endpoints).with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &args.dot {
        let text: String = ms.by_endpoint.values().map(Model::to_dot).collect();
        write(p, &text)?;
    }
    Ok(())
}

/// `model.json`, written a relation at a time: the relations of a model of
/// deep call paths take hundreds of megabytes as JSON values (their names
/// are the call paths), a few kilobytes as the model's bitsets.
fn write_model_json(
    path: &std::path::Path,
    ms: &Models,
    endpoints: &[serde_json::Value],
) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut w = std::io::BufWriter::new(std::fs::File::create(path)?);
    writeln!(
        w,
        "{{\n  \"traces_used\": {},\n  \"relations\": [",
        ms.requests
    )?;
    let mut first = true;
    for (ep, m) in &ms.by_endpoint {
        m.for_each_relation(|kind, a, b| -> std::io::Result<()> {
            w.write_all(if first { b"    " } else { b",\n    " })?;
            first = false;
            serde_json::to_writer(
                &mut w,
                &json!({"kind": kind.as_str(), "a": a, "b": b, "endpoint": &**ep}),
            )?;
            Ok(())
        })?;
    }
    writeln!(
        w,
        "\n  ],\n  \"convergence\": {},\n  \"endpoints\": {}\n}}",
        serde_json::to_string(&ms.convergence)?,
        serde_json::to_string_pretty(endpoints)?
    )?;
    w.flush()
}

/// Learn the model, then per request the critical path through it and the
/// slack of every span (MM §4.4.1–4.4.2); per call path slack percentiles
/// and the correlation-vs-slack validation (MM Figures 9–10).
#[derive(Debug, clap::Args)]
pub struct SlackArgs {
    #[command(flatten)]
    input: MysteryInput,
    /// Write `{"traces": [{"trace_id", "latency_us", "spans": [{"span_id",
    /// "call_path", "slack_us", "critical"}]}]}` here.
    #[arg(long, value_name = "OUT.json")]
    json: Option<PathBuf>,
    /// Validate on this segment (`CALLPATH#K`; default: the longest segment
    /// in at least half of the largest endpoint's requests that has slack).
    #[arg(long, value_name = "CALLPATH#K")]
    validate: Option<String>,
    /// Equal-size slack buckets of the validation (MM Figure 10: 20).
    #[arg(long, default_value_t = 10, value_name = "N")]
    buckets: usize,
    /// Call paths shown on stdout (most spans first; the JSON has all).
    #[arg(long, default_value_t = 25, value_name = "N")]
    top: usize,
    /// Write `slack-cdf.svg` (MM Figure 8) and `slack-correlation.svg` (MM
    /// Figure 10) into this directory.
    #[arg(long, value_name = "DIR")]
    svg: Option<PathBuf>,
}

fn analyse_all<'a>(ms: &Models, reqs: &'a [Request]) -> Vec<(&'a Request, RequestSlack)> {
    reqs.iter()
        .map(|r| (r, mystery::analyse(&ms.by_endpoint[&r.endpoint], r)))
        .collect()
}

/// A call path for a table: the last three frames (the JSON has it whole).
fn short(call_path: &str) -> String {
    let frames: Vec<&str> = call_path.split(';').collect();
    if frames.len() <= 3 {
        call_path.to_owned()
    } else {
        format!("…;{}", frames[frames.len() - 3..].join(";"))
    }
}

fn us(ns: i64) -> f64 {
    ns as f64 / 1e3
}

/// The validation segment chosen by default (see `--validate`).
fn default_segment(reqs: &[(&Request, &RequestSlack)]) -> Option<String> {
    let mut per_ep: BTreeMap<&str, usize> = BTreeMap::new();
    for (r, _) in reqs {
        *per_ep.entry(&r.endpoint).or_default() += 1;
    }
    let (ep, n) = per_ep.iter().max_by_key(|e| *e.1)?;
    // segment → (durations, slack > 0 seen)
    let mut seg: BTreeMap<String, (Vec<i64>, bool)> = BTreeMap::new();
    for (r, s) in reqs.iter().filter(|r| &*r.0.endpoint == *ep) {
        for (i, sp) in r.spans.iter().enumerate().skip(1) {
            let e = seg.entry(sp.segment()).or_default();
            e.0.push(sp.duration());
            e.1 |= s.spans[i].slack_ns > 0;
        }
    }
    seg.into_iter()
        .filter(|(_, (d, slack))| *slack && 2 * d.len() >= *n)
        .max_by_key(|(_, (d, _))| {
            let mut d = d.clone();
            d.sort_unstable();
            d[d.len() / 2]
        })
        .map(|(s, _)| s)
}

/// Run `cpt traces slack`.
///
/// # Errors
///
/// Unreadable inputs, no request, a `--validate` segment no request has,
/// unwritable output.
pub fn slack(args: SlackArgs) -> anyhow::Result<()> {
    if let Some(dir) = &args.svg {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let reqs = args.input.requests()?;
    let ms = learn(&reqs);
    let results = analyse_all(&ms, &reqs);
    let pairs: Vec<(&Request, &RequestSlack)> = results.iter().map(|(r, s)| (*r, s)).collect();
    let mut paths = mystery::per_call_path(&pairs);
    paths.sort_by(|a, b| b.count.cmp(&a.count).then(a.call_path.cmp(&b.call_path)));
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>7} {:>6} {:>10} {:>10} {:>10}  call path (slack)",
        "spans", "crit%", "p10", "p50", "p90"
    );
    for p in paths.iter().take(args.top) {
        let _ = writeln!(
            out,
            "{:>7} {:>5.1}% {:>10} {:>10} {:>10}  {}",
            p.count,
            100.0 * p.critical as f64 / p.count as f64,
            fmt_ns(p.p10.max(0) as u64),
            fmt_ns(p.p50.max(0) as u64),
            fmt_ns(p.p90.max(0) as u64),
            short(&p.call_path)
        );
    }
    if paths.len() > args.top {
        let _ = writeln!(
            out,
            "… {} more call paths (see --json)",
            paths.len() - args.top
        );
    }
    let [both, model_only, crisp_only, neither] = mystery::versus::compare_with_crisp(&pairs);
    let all = (both + model_only + crisp_only + neither).max(1);
    let _ = writeln!(
        out,
        "\ncritical path through the model vs CRISP's last-finishing-child walk: {:.1}% of spans agree; {} critical only through the model, {} only in CRISP's walk. Why, by where the two paths join again:",
        100.0 * (both + neither) as f64 / all as f64,
        plural(model_only as u64, "span"),
        plural(crisp_only as u64, "span"),
    );
    let tally = mystery::versus::tally(|ep| &ms.by_endpoint[ep], &pairs);
    let _ = writeln!(
        out,
        "{:>10} {:>10}  {:<22} example (trace, span: join ← model's step | CRISP's step)",
        "model only", "CRISP only", "cause"
    );
    for row in &tally.rows {
        let example = row.example.as_ref().map_or(String::new(), |e| {
            format!(
                "{} {} {}: {} ← {} | {}",
                e.trace_id,
                e.span_id,
                short(&e.segment),
                short(&e.join),
                e.model_step.as_deref().map_or("—".to_owned(), short),
                e.crisp_step.as_deref().map_or("—".to_owned(), short),
            )
        });
        let _ = writeln!(
            out,
            "{:>10} {:>10}  {:<22} {example}",
            row.model_only,
            row.crisp_only,
            row.cause.as_str()
        );
        if let Some((cp, n)) = &row.top_call_path {
            let _ = writeln!(out, "{:>46}most: {} ({n})", "", short(cp));
        }
    }
    let segment = match &args.validate {
        Some(s) => Some(s.clone()),
        None => default_segment(&pairs),
    };
    if let Some(seg) = segment {
        let b = mystery::correlation_by_slack(&pairs, &seg, args.buckets);
        if b.is_empty() {
            bail!(
                "no request has segment {seg} (names are CALLPATH#K as --json spells call paths)"
            );
        }
        let _ = writeln!(
            out,
            "\ncorrelation of {seg}'s duration with end-to-end latency per slack bucket (MM Figure 10):"
        );
        let _ = writeln!(
            out,
            "{:>6} {:>12} {:>12} {:>7}",
            "n", "slack from", "to", "r"
        );
        if let Some(dir) = &args.svg {
            plot_correlation(&dir.join("slack-correlation.svg"), &seg, &b)?;
        }
        for x in &b {
            let _ = writeln!(
                out,
                "{:>6} {:>12} {:>12} {:>7}",
                x.n,
                fmt_ns(x.slack_min.max(0) as u64),
                fmt_ns(x.slack_max.max(0) as u64),
                x.r.map_or("—".to_owned(), |r| format!("{r:.3}"))
            );
        }
    }
    if let Some(dir) = &args.svg {
        plot_cdf(&dir.join("slack-cdf.svg"), &pairs, &paths)?;
    }
    print!("{out}");
    if let Some(p) = &args.json {
        // One trace at a time: the whole document as a JSON value would
        // take several times the memory of the analysis.
        let file = std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?;
        let mut w = std::io::BufWriter::new(file);
        let mut put = || -> std::io::Result<()> {
            use std::io::Write as _;
            w.write_all(b"{\"traces\": [")?;
            for (n, (r, s)) in results.iter().enumerate() {
                if n > 0 {
                    w.write_all(b",\n")?;
                }
                let t = json!({
                    "trace_id": &*r.trace_id,
                    "endpoint": &*r.endpoint,
                    "latency_us": us(s.latency_ns),
                    "spans": s.spans.iter().map(|x| {
                        let sp = &r.spans[x.span as usize];
                        json!({
                            "span_id": &*sp.span_id,
                            "call_path": &*sp.call_path,
                            "k": sp.k,
                            "slack_us": us(x.slack_ns),
                            "critical": x.critical,
                        })
                    }).collect::<Vec<_>>(),
                });
                serde_json::to_writer(&mut w, &t)?;
            }
            w.write_all(b"]}\n")?;
            w.flush()
        };
        put().with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

/// Split requests at the top latency fraction and rank call paths by how
/// much larger their share of the critical path is among the outliers
/// (MM §4.4.3).
#[derive(Debug, clap::Args)]
pub struct OutliersArgs {
    #[command(flatten)]
    input: MysteryInput,
    /// Outliers are the slowest fraction of each endpoint's requests (MM: 0.05).
    #[arg(long, default_value_t = 0.05, value_name = "FRACTION")]
    top: f64,
    /// Call paths shown per endpoint.
    #[arg(long, default_value_t = 10, value_name = "N")]
    rows: usize,
    /// Write `{"endpoints": [{"endpoint", "threshold_us", "outliers",
    /// "normal", "ranking": [{"call_path", "outlier_share", "normal_share",
    /// "outlier_slack_us", "normal_slack_us"}]}]}` here.
    #[arg(long, value_name = "OUT.json")]
    json: Option<PathBuf>,
    /// Write each endpoint's two sides as gzipped pprof profiles of
    /// critical-path time per call path into this directory
    /// (`N.others.pb.gz`, `N.outliers.pb.gz`, N the endpoint's position):
    /// `go tool pprof -diff_base 0.others.pb.gz 0.outliers.pb.gz`.
    #[arg(long, value_name = "DIR")]
    pprof: Option<PathBuf>,
}

/// Run `cpt traces outliers`.
///
/// # Errors
///
/// A `--top` outside (0, 1), unreadable inputs, no request, unwritable output.
pub fn outliers(args: OutliersArgs) -> anyhow::Result<()> {
    if !(args.top > 0.0 && args.top < 1.0) {
        bail!(
            "--top {} must be a fraction between 0 and 1 (0.05: the slowest 5 %)",
            args.top
        );
    }
    let reqs = args.input.requests()?;
    let ms = learn(&reqs);
    let results = analyse_all(&ms, &reqs);
    let mut by_ep: BTreeMap<Arc<str>, Vec<(&Request, &RequestSlack)>> = BTreeMap::new();
    for (r, s) in &results {
        by_ep.entry(r.endpoint.clone()).or_default().push((*r, s));
    }
    let mut out = String::new();
    let mut eps = Vec::new();
    if let Some(dir) = &args.pprof {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    for (n, (ep, pairs)) in by_ep.iter().enumerate() {
        let o = mystery::outliers(pairs, args.top);
        if let Some(dir) = &args.pprof {
            let (others, slow) = mystery::outliers::side_profiles(pairs, o.threshold_ns);
            for (name, agg) in [("others", &others), ("outliers", &slow)] {
                let path = dir.join(format!("{n}.{name}.pb.gz"));
                write_bytes(&path, &crate::profile::pprof::encode_gzip(agg))?;
            }
            let _ = writeln!(out, "{ep}: profiles {n}.others.pb.gz, {n}.outliers.pb.gz");
        }
        let _ = writeln!(
            out,
            "{ep}: {} outliers (latency ≥ {}) against {}",
            o.outliers,
            fmt_ns(o.threshold_ns.max(0) as u64),
            o.normal
        );
        let _ = writeln!(
            out,
            "  {:>9} {:>9} {:>9}  call path (share of the critical path: outliers, others, difference)",
            "outliers", "others", "diff"
        );
        for d in o.ranking.iter().take(args.rows) {
            let _ = writeln!(
                out,
                "  {:>8.1}% {:>8.1}% {:>+8.1}%  {}",
                100.0 * d.outlier_share,
                100.0 * d.normal_share,
                100.0 * d.excess(),
                short(&d.call_path)
            );
        }
        eps.push(json!({
            "endpoint": &**ep,
            "threshold_us": us(o.threshold_ns),
            "outliers": o.outliers,
            "normal": o.normal,
            "ranking": o.ranking.iter().map(|d| json!({
                "call_path": &*d.call_path,
                "outlier_share": d.outlier_share,
                "normal_share": d.normal_share,
                "outlier_slack_us": d.outlier_slack_ns / 1e3,
                "normal_slack_us": d.normal_slack_ns / 1e3,
            })).collect::<Vec<_>>(),
        }));
    }
    print!("{out}");
    if let Some(p) = &args.json {
        write(
            p,
            &(serde_json::to_string_pretty(&json!({ "endpoints": eps }))? + "\n"),
        )?;
    }
    Ok(())
}

/// The slack CDF of a few call paths (MM Figure 8): the most common ones
/// with the most slack, distributions that repeat (a client and its
/// server span) drawn once.
fn plot_cdf(
    path: &std::path::Path,
    pairs: &[(&Request, &RequestSlack)],
    paths: &[mystery::PathSlack],
) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let most = paths.iter().map(|p| p.count).max().unwrap_or(0);
    let mut pick: Vec<&mystery::PathSlack> = paths
        .iter()
        .filter(|p| 2 * p.count >= most && p.p90 > 0)
        .collect();
    pick.sort_by(|a, b| b.p90.cmp(&a.p90).then(a.call_path.cmp(&b.call_path)));
    let mut chosen: Vec<&mystery::PathSlack> = Vec::new();
    for p in pick {
        if chosen.len() < 6
            && !chosen
                .iter()
                .any(|c| (c.p10, c.p50, c.p90) == (p.p10, p.p50, p.p90))
        {
            chosen.push(p);
        }
    }
    let mut series: Vec<(String, Vec<f64>)> = Vec::new();
    for c in &chosen {
        let mut v: Vec<f64> = Vec::new();
        for (r, s) in pairs {
            for x in &s.spans {
                if r.spans[x.span as usize].call_path == c.call_path {
                    v.push(x.slack_ns as f64 / 1e6);
                }
            }
        }
        v.sort_by(f64::total_cmp);
        series.push((short(&c.call_path), v));
    }
    let xmax = series
        .iter()
        .filter_map(|s| s.1.get(s.1.len() * 99 / 100).copied())
        .fold(0.1f64, f64::max);
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut chart = ChartBuilder::on(&root)
        .caption("Slack CDF per call path (MM Figure 8)", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0f64..xmax, 0f64..1f64)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    chart
        .configure_mesh()
        .x_desc("slack (ms)")
        .y_desc("fraction of spans")
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    for (i, (name, v)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        // At most ~400 points a line: the CDF at evenly spaced ranks.
        let n = v.len().max(1);
        let step = n.div_ceil(400);
        let pts = (0..n)
            .filter(|k| k % step == 0 || k + 1 == n)
            .map(|k| (v[k].min(xmax), (k + 1) as f64 / n as f64));
        chart
            .draw_series(LineSeries::new(pts, color.stroke_width(2)))
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .label(name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

/// Correlation between a segment's duration and latency per slack bucket
/// as bars (MM Figure 10).
fn plot_correlation(
    path: &std::path::Path,
    segment: &str,
    b: &[mystery::Bucket],
) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (900, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "Duration–latency correlation vs slack of {} (MM Figure 10)",
                short(segment)
            ),
            ("sans-serif", 16),
        )
        .margin(12)
        .x_label_area_size(50)
        .y_label_area_size(50)
        .build_cartesian_2d((0..b.len()).into_segmented(), -0.2f64..1f64)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let labels: Vec<String> = b
        .iter()
        .map(|x| fmt_ns(x.slack_max.max(0) as u64))
        .collect();
    chart
        .configure_mesh()
        .x_desc("slack bucket (equal counts; label: largest slack in it)")
        .y_desc("Pearson r")
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => labels.get(*i).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    chart
        .draw_series(b.iter().enumerate().map(|(i, x)| {
            let r = x.r.unwrap_or(0.0);
            let mut bar = Rectangle::new(
                [
                    (SegmentValue::Exact(i), 0.0),
                    (SegmentValue::Exact(i + 1), r),
                ],
                BLUE.mix(0.6).filled(),
            );
            bar.set_margin(0, 0, 6, 6);
            bar
        }))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

/// CRISP's anomaly detection over the Mystery Machine's critical paths:
/// score each test request by how badly a low-rank model (PCA) of the
/// training requests' critical-path vectors reconstructs its own.
#[derive(Debug, clap::Args)]
pub struct AnomaliesArgs {
    #[command(flatten)]
    input: MysteryInput,
    /// Test traces to score (the positional FILEs are the training window).
    #[arg(long, required = true, num_args = 1.., value_name = "FILE")]
    test: Vec<PathBuf>,
    /// Keep the smallest rank that explains this fraction of the training variance.
    #[arg(long, default_value_t = 0.9, value_name = "FRACTION")]
    variance: f64,
    /// ... but at most this rank.
    #[arg(long, default_value_t = 10, value_name = "N")]
    max_rank: usize,
    /// Requests listed, highest score first.
    #[arg(long, default_value_t = 10, value_name = "N")]
    top: usize,
    /// Which critical-path time makes a request's vector: `cpt` (the
    /// critical path through the inferred model) or `crisp` (CRISP's
    /// reference exclusive times, as `--accounting crisp` of the importing
    /// commands: the vectors CRISP's own anomaly detection uses).
    #[arg(long, default_value = "cpt", value_name = "cpt|crisp")]
    accounting: crate::traces::Accounting,
    /// A labelled fault, `SERVICE@TIME` (RFC 3339 or Unix ns): test requests
    /// starting at or after TIME with a span of SERVICE are positives;
    /// prints precision and recall at the top k next to a latency-only
    /// ranking (repeatable).
    #[arg(long, value_name = "SERVICE@TIME")]
    fault: Vec<String>,
}

/// Run `cpt traces anomalies`.
///
/// # Errors
///
/// Unreadable inputs, no request, a malformed `--fault`, fewer than two
/// training requests of every tested endpoint.
pub fn anomalies(args: AnomaliesArgs) -> anyhow::Result<()> {
    use mystery::anomaly::{Pca, precision_recall_at, profile};
    let mut faults = Vec::new();
    for f in &args.fault {
        let Some((svc, t)) = f.rsplit_once('@') else {
            bail!(
                "--fault {f:?}: expected SERVICE@TIME (e.g. currencyservice@2022-08-23T13:37:08Z)"
            );
        };
        let t = crate::records::selection::parse_time(t)
            .with_context(|| format!("--fault {f:?}: the time"))?;
        faults.push((
            format!("{svc}:"),
            i64::try_from(t).context("--fault time is past 2262")?,
        ));
    }
    let train = args.input.requests()?;
    let test = args.input.requests_of(&args.test)?;
    // The causal model learns from all traffic; the PCA only from training.
    let mut ms = Models::default();
    for r in train.iter().chain(&test) {
        ms.observe(r);
    }
    let prof = |r: &Request| match args.accounting {
        crate::traces::Accounting::Cpt => {
            profile(r, &mystery::analyse(&ms.by_endpoint[&r.endpoint], r))
        }
        crate::traces::Accounting::Crisp => mystery::anomaly::crisp_profile(r, 0.01),
    };
    let mut by_ep: BTreeMap<Arc<str>, Vec<mystery::anomaly::Profile>> = BTreeMap::new();
    for r in &train {
        by_ep.entry(r.endpoint.clone()).or_default().push(prof(r));
    }
    let models: BTreeMap<Arc<str>, Pca> = by_ep
        .into_iter()
        .filter_map(|(ep, rows)| Pca::fit(&rows, args.variance, args.max_rank).map(|p| (ep, p)))
        .collect();
    let mut scored = Vec::new();
    let mut skipped = 0usize;
    for r in &test {
        match models.get(&r.endpoint) {
            Some(p) => scored.push((r, p.score(&prof(r), 3))),
            None => skipped += 1,
        }
    }
    if scored.is_empty() {
        bail!("no test request has an endpoint with at least two training requests");
    }
    let mut out = String::new();
    for (ep, p) in &models {
        let _ = writeln!(
            out,
            "{ep}: rank {} of {} call paths",
            p.rank(),
            p.features.len()
        );
    }
    if skipped > 0 {
        let _ = writeln!(
            out,
            "{} of endpoints not in training skipped",
            plural(skipped as u64, "test request")
        );
    }
    let mut order: Vec<usize> = (0..scored.len()).collect();
    order.sort_by(|&a, &b| scored[b].1.score.total_cmp(&scored[a].1.score));
    let _ = writeln!(
        out,
        "{:>10} {:>10}  trace (call paths with the largest residuals)",
        "score", "latency"
    );
    for &i in order.iter().take(args.top) {
        let (r, s) = &scored[i];
        let _ = writeln!(
            out,
            "{:>10.1} {:>10}  {} ({})",
            s.score,
            fmt_ns(r.latency().max(0) as u64),
            r.trace_id,
            s.top
                .iter()
                .map(|(c, _)| short(c))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if !faults.is_empty() {
        let labels: Vec<bool> = scored
            .iter()
            .map(|(r, _)| {
                faults.iter().any(|(svc, t)| {
                    r.spans[0].start >= *t
                        && r.spans.iter().any(|s| {
                            s.call_path
                                .rsplit(';')
                                .next()
                                .is_some_and(|f| f.starts_with(svc.as_str()))
                        })
                })
            })
            .collect();
        let pos = labels.iter().filter(|l| **l).count();
        let pca: Vec<f64> = scored.iter().map(|s| s.1.score).collect();
        let lat: Vec<f64> = scored.iter().map(|s| s.0.latency() as f64).collect();
        let _ = writeln!(
            out,
            "\n{} of {} test requests labelled faulty; precision / recall at the top k:",
            pos,
            scored.len()
        );
        let _ = writeln!(out, "{:>6} {:>17} {:>17}", "k", "PCA", "latency");
        for k in [pos / 2, pos, 2 * pos] {
            if k == 0 {
                continue;
            }
            let (p1, r1) = precision_recall_at(&pca, &labels, k);
            let (p2, r2) = precision_recall_at(&lat, &labels, k);
            let _ = writeln!(out, "{k:>6} {p1:>8.3} / {r1:<6.3} {p2:>8.3} / {r2:<6.3}");
        }
    }
    print!("{out}");
    Ok(())
}
