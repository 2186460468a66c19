//! `cpt traces predict`: Mann et al.'s Table 1 on imported traces.

use std::path::PathBuf;

use anyhow::{Context, bail};

use super::load::load_traces;
use crate::traces::Format;
use crate::traces::analysis::flows::{self, Invocation, KeyInterner};
use crate::traces::import::TraceSet;

/// Train the six latency estimators of Mann et al. (serial, parallel,
/// linear regression, best critical path, aggregate flow, nearest-neighbour
/// flow) per parent `service:operation` and report their relative errors
/// on test invocations (Mann Table 1).
#[derive(Debug, clap::Args)]
pub struct PredictArgs {
    /// Trace file format.
    #[arg(long = "from", value_name = "jaeger|zipkin|otlp|nezha", value_parser = |s: &str| s.parse::<Format>())]
    pub from: Format,
    /// Training traces.
    #[arg(long, required = true, num_args = 1.., value_name = "FILE")]
    pub train: Vec<PathBuf>,
    /// Test traces. Without them the training traces are split in time:
    /// at `--split-at`, or else at the median trace start (the first half
    /// trains, the second tests, like the paper's two hours).
    #[arg(long, num_args = 1.., value_name = "FILE")]
    pub test: Vec<PathBuf>,
    /// Split the training traces here (RFC 3339 like 2023-09-20T16:00:00Z, or Unix ns):
    /// traces starting before train, the others test.
    #[arg(long, value_name = "TIME", conflicts_with = "test")]
    pub split_at: Option<String>,
    /// Only parents with at least this many children (Mann §5: 5).
    #[arg(long, default_value_t = 5, value_name = "N")]
    pub min_children: usize,
    /// How the nearest-neighbour flow is chosen: `likelihood` (the most
    /// probable flow, its frequency a prior: rare noisy flows cannot
    /// capture ordinary invocations), `mann` (Mann §4's variance-scaled
    /// distance as published) or `min-support` (Mann's distance over flows
    /// seen in at least 1 % of training invocations).
    #[arg(
        long = "nn",
        default_value = "likelihood",
        value_name = "likelihood|mann|min-support"
    )]
    pub nn: flows::NnChoice,
    /// Keep spans whose parent is missing as extra roots.
    #[arg(long)]
    pub orphans_as_roots: bool,
    /// Write the table as JSON here (`{"methods": {"serial": {"n", "p50",
    /// "p90", "p95", "p99"}, …}}`; null means ∞).
    #[arg(long, value_name = "OUT.json")]
    pub json: Option<PathBuf>,
    /// Write the learned flows as Graphviz (per parent: the aggregate flow
    /// and the three most frequent nearest-neighbour flows; `dot -Tsvg`).
    #[arg(long, value_name = "OUT.dot")]
    pub dot: Option<PathBuf>,
    /// Draw Mann Figure 2 (estimated/actual sorted; discrepancy CDF) as SVG.
    #[arg(long, value_name = "OUT.svg")]
    pub plot: Option<PathBuf>,
}

fn trace_start(t: &crate::traces::model::Trace) -> i64 {
    t.spans.iter().map(|s| s.start_ns).min().unwrap_or(0)
}

/// Run `cpt traces predict`.
///
/// # Errors
///
/// Unreadable inputs, no trace in them, a bad `--split-at`, or no test
/// invocation with a trained parent.
pub fn predict(args: PredictArgs) -> anyhow::Result<()> {
    let mut keys = KeyInterner::default();
    let invocations = |set: &TraceSet, keys: &mut KeyInterner| -> Vec<Invocation> {
        set.traces
            .iter()
            .flat_map(|t| flows::invocations(t, keys))
            .collect()
    };
    let (train, test) = if args.test.is_empty() {
        let set = load_traces("training", &args.train, args.from, args.orphans_as_roots)?;
        let (mut before, mut after) = (TraceSet::default(), TraceSet::default());
        match &args.split_at {
            Some(t) => {
                let split = i64::try_from(crate::records::selection::parse_time(t)?)
                    .context("--split-at is past 2262")?;
                for t in set.traces {
                    if trace_start(&t) < split {
                        before.traces.push(t);
                    } else {
                        after.traces.push(t);
                    }
                }
            }
            None => {
                // The first half in time trains (ties keep file order, so
                // traces that all start together still split in two).
                let mut traces = set.traces;
                traces.sort_by_key(trace_start);
                after.traces = traces.split_off(traces.len() / 2);
                before.traces = traces;
            }
        }
        eprintln!(
            "split in time: {} train, {} test",
            crate::format::plural(before.traces.len() as u64, "trace"),
            crate::format::plural(after.traces.len() as u64, "trace")
        );
        (
            invocations(&before, &mut keys),
            invocations(&after, &mut keys),
        )
    } else {
        let train = load_traces("training", &args.train, args.from, args.orphans_as_roots)?;
        let test = load_traces("test", &args.test, args.from, args.orphans_as_roots)?;
        (
            invocations(&train, &mut keys),
            invocations(&test, &mut keys),
        )
    };
    let models = flows::Models::train_with(&train, args.min_children, args.nn);
    let eval = flows::evaluate_models(&models, &test, args.min_children);
    if let Some(path) = &args.dot {
        std::fs::write(path, models.to_dot(3))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    eprintln!(
        "{} trained on {}; {} scored ({} of parents never seen in training skipped)",
        crate::format::plural(eval.parents_trained as u64, "parent"),
        crate::format::plural(eval.train_invocations as u64, "invocation"),
        crate::format::plural(eval.test_invocations as u64, "test invocation"),
        eval.unseen_parent
    );
    if eval.test_invocations == 0 {
        bail!("{}", why_nothing_scored(&train, &test, args.min_children));
    }
    print!("{}", eval.to_table());
    if let Some(path) = &args.plot {
        let title = format!(
            "Mann Figure 2: {} test invocations, parents with ≥ {} children",
            eval.test_invocations, args.min_children
        );
        let svg = flows::plot::figure2_svg(&eval, &title)
            .map_err(|e| anyhow::anyhow!("drawing {}: {e}", path.display()))?;
        std::fs::write(path, svg).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&eval.to_json())?;
        std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Why no test invocation was scored: no invocation at all, too few
/// children for `--min-children` (naming the largest count seen), or no
/// parent that appears in both the training and the test invocations.
pub(crate) fn why_nothing_scored(
    train: &[Invocation],
    test: &[Invocation],
    min_children: usize,
) -> String {
    let children = |n: usize| {
        if n == 1 {
            "1 child".to_owned()
        } else {
            format!("{n} children")
        }
    };
    if train.is_empty() || test.is_empty() {
        let side = if train.is_empty() { "training" } else { "test" };
        return format!(
            "no test invocation to score: no span of the {side} traces has a child it waits for \
             (every trace is a lone span, or its children are all detached consumers or \
             FOLLOWS_FROM spans); execution flows need parents with children"
        );
    }
    let most = |invs: &[Invocation]| invs.iter().map(|i| i.children.len()).max().unwrap_or(0);
    for (side, invs) in [("training", train), ("test", test)] {
        let m = most(invs);
        if m < min_children {
            return format!(
                "no test invocation to score: no parent in the {side} traces has at least {} \
                 (the most any has is {}); rerun with --min-children {m}",
                children(min_children),
                children(m),
            );
        }
    }
    let parents = |invs: &[Invocation]| -> std::collections::BTreeSet<std::sync::Arc<str>> {
        invs.iter()
            .filter(|i| i.children.len() >= min_children)
            .map(|i| i.parent.clone())
            .collect()
    };
    let (tr, te) = (parents(train), parents(test));
    let names: Vec<&str> = te.iter().take(3).map(|p| &**p).collect();
    format!(
        "no test invocation to score: no parent recurs: the test traces' parents with at least \
         {} ({}{}) never appear in the {} training parents; train on traces of the same \
         endpoints",
        children(min_children),
        names.join(", "),
        if te.len() > 3 { ", …" } else { "" },
        tr.len(),
    )
}

/// Replay traces through models learned from training traces with one or
/// more operations' latencies scaled, and report the roots' latency before
/// and after (Mann §6: the impact of a change).
#[derive(Debug, clap::Args)]
pub struct WhatifArgs {
    /// Trace file format.
    #[arg(long = "from", value_name = "jaeger|zipkin|otlp|nezha", value_parser = |s: &str| s.parse::<Format>())]
    pub from: Format,
    /// Traces the models learn from.
    #[arg(long, required = true, num_args = 1.., value_name = "FILE")]
    pub train: Vec<PathBuf>,
    /// Traces to replay (default: the training traces).
    #[arg(long, num_args = 1.., value_name = "FILE")]
    pub test: Vec<PathBuf>,
    /// `SERVICE:OPERATION=FACTOR`: that operation takes FACTOR times as
    /// long (0.5: twice as fast). Repeatable. Without any, `before` is the
    /// models' replay of the recorded latencies: with `--test` traces of
    /// another load, how well the training load's models predict it.
    #[arg(long, value_name = "SERVICE:OPERATION=FACTOR")]
    pub scale: Vec<flows::Scale>,
    /// Model only parents with at least this many children (the others
    /// keep their recorded latency, so a change below them stops there).
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub min_children: usize,
    /// Keep spans whose parent is missing as extra roots.
    #[arg(long)]
    pub orphans_as_roots: bool,
    /// Write `{"before": {"mean_us", "p50_us", "p90_us", "p99_us"}, "after":
    /// {...}, "actual": {...}, "roots": N}` here.
    #[arg(long, value_name = "OUT.json")]
    pub json: Option<PathBuf>,
}

/// Run `cpt traces whatif`.
///
/// # Errors
///
/// Unreadable inputs, no trace in them, or a scaled operation that appears
/// in no replayed trace.
pub fn whatif(args: WhatifArgs) -> anyhow::Result<()> {
    let mut keys = KeyInterner::default();
    let train = load_traces("training", &args.train, args.from, args.orphans_as_roots)?;
    let invs: Vec<Invocation> = train
        .traces
        .iter()
        .flat_map(|t| flows::invocations(t, &mut keys))
        .collect();
    let models = flows::Models::train(&invs, args.min_children);
    let replay = if args.test.is_empty() {
        train
    } else {
        load_traces("replayed", &args.test, args.from, args.orphans_as_roots)?
    };
    let w = flows::whatif(
        &models,
        &replay.traces,
        &args.scale,
        flows::Method::NearestNeighborFlow,
        &mut keys,
    );
    if w.scaled_spans == 0 && !args.scale.is_empty() {
        let names: Vec<&str> = args.scale.iter().map(|s| s.key.as_str()).collect();
        bail!(
            "no replayed span is {} (names are SERVICE:OPERATION as the traces spell them; `cpt traces bottomup` lists them)",
            names.join(" or ")
        );
    }
    eprintln!(
        "{} replayed; {} predicted by nearest-neighbour flows of {}, {} scaled",
        crate::format::plural(w.roots as u64, "root"),
        crate::format::plural(w.modelled_spans as u64, "span"),
        crate::format::plural(models.parents.len() as u64, "parent"),
        crate::format::plural(w.scaled_spans as u64, "span"),
    );
    let row = |name: &str, l: &flows::Latencies| {
        format!(
            "{name:<8} {:>10.1} {:>10.1} {:>10.1} {:>10.1}\n",
            l.mean / 1e3,
            l.p50 / 1e3,
            l.p90 / 1e3,
            l.p99 / 1e3
        )
    };
    print!(
        "{:<8} {:>10} {:>10} {:>10} {:>10}\n{}{}{}",
        "root µs",
        "mean",
        "p50",
        "p90",
        "p99",
        row("actual", &w.actual),
        row("before", &w.before),
        row("after", &w.after)
    );
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&w.to_json())?;
        std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
