//! `/ui/diff?base=SELECTION&test=SELECTION`: two selections (time ranges,
//! label arms, versions, percentile bands) compared stack by stack
//! ([`diff`], CPT Tables 2 and 3): the change of each stack's mean time on
//! the path with its confidence interval, the changes larger than noise
//! marked, how many chance alone would mark, and inferno's differential
//! flame graph (`/ui/diff.svg`: widths are the test arm, red slower, blue
//! faster). `base` and `test` are each a selection query, e.g.
//! `service=A&label=version=v1`; `confidence=0.99`, `min_change=1ms` and
//! `bonferroni=on` are `cpt diff`'s knobs.

use std::fmt::Write as _;
use std::sync::Arc;

use axum::Extension;
use axum::extract::{RawQuery, State};
use axum::response::Response;
use http::StatusCode;

use super::UiState;
use super::fold::{DEFAULT_SAMPLE, FoldCache, Folded, Sample, fold};
use super::page::{self, PageError, Params, Tab, esc};
use super::profile::{flame_height, svg_problem, svg_response};
use crate::format::fmt_ns;
use crate::profile::aggregate::Aggregate;
use crate::profile::diff::{DiffOptions, DiffReport, DiffRow, diff, fmt_signed};
use crate::profile::flame::{FlameOptions, diff_flame_svg};
use crate::records::selection::Selection;
use crate::server::edge::access::{Reader, Withheld};

/// Rows listed unless `all=on`.
const TOP: usize = 40;

struct Query {
    base: Selection,
    test: Selection,
    opts: DiffOptions,
    sample: Sample,
}

fn parse(params: &Params, reader: Reader) -> Result<Option<Query>, String> {
    let (Some(base), Some(test)) = (params.get("base"), params.get("test")) else {
        return Ok(None);
    };
    let arm = |name: &str, q: &str| {
        Params::parse(Some(q))
            .and_then(|p| page::selection(&p, &[]))
            .and_then(|sel| {
                reader
                    .restrict(sel)
                    .map_err(|Withheld| Withheld::MESSAGE.to_owned())
            })
            .map_err(|e| format!("{name}: {e}"))
    };
    let mut opts = DiffOptions::default();
    if let Some(c) = params.get("confidence") {
        opts.confidence = c
            .parse::<f64>()
            .ok()
            .filter(|c| *c > 0.0 && *c < 1.0)
            .ok_or_else(|| format!("confidence={c:?}: expected a number in (0, 1), e.g. 0.95"))?;
    }
    if let Some(m) = params.get("min_change") {
        opts.min_change = humantime::parse_duration(m)
            .map_err(|e| format!("min_change={m:?}: {e} (expected e.g. 500us, 1ms)"))?;
    }
    opts.bonferroni = params.get("bonferroni").is_some();
    Ok(Some(Query {
        base: arm("base", base)?,
        test: arm("test", test)?,
        opts,
        // Two arms fold as many records together as one profile page.
        sample: match params.get("sample") {
            None => Sample(Some(DEFAULT_SAMPLE / 2)),
            Some(_) => Sample::from_params(params)?,
        },
    }))
}

/// Fold both arms, side by side (each fold is itself parallel).
fn both(
    store_path: &std::path::Path,
    cache: &FoldCache,
    q: &Query,
) -> Result<(Arc<Folded>, Arc<Folded>), PageError> {
    let open = || crate::server::store::Store::open_read_only(store_path);
    std::thread::scope(|s| {
        let t = s.spawn(|| fold(&open()?, cache, &q.test, q.sample));
        let base = fold(&open()?, cache, &q.base, q.sample)?;
        let test = t
            .join()
            .map_err(|_| PageError::BadQuery("the test arm's fold failed; retry".into()))??;
        Ok((base, test))
    })
}

pub(super) async fn page(
    State(state): State<UiState>,
    Extension(reader): Extension<Reader>,
    RawQuery(raw): RawQuery,
) -> Response {
    let what = "Compare";
    let params = match Params::parse(raw.as_deref()) {
        Ok(p) => p,
        Err(e) => return page::error(StatusCode::BAD_REQUEST, Tab::Diff, what, &e),
    };
    let q = match parse(&params, reader) {
        Ok(Some(q)) => q,
        Ok(None) => {
            let body = format!(
                r#"{}<p class="note">Give two selections as <code>key=value</code> pairs joined by <code>&amp;</code>, as in <code>GET /profile</code>: e.g. base <code>service=A&amp;label=version=v1</code>, test <code>service=A&amp;label=version=v2</code>; or two time ranges, <code>service=A&amp;since=2026-11-21T22:00:00Z&amp;until=2026-11-21T23:00:00Z</code>.</p>"#,
                form(&params)
            );
            return page::respond(StatusCode::OK, page::html(Tab::Diff, what, "", &body));
        }
        Err(e) => {
            let body = format!(r#"{}<p class="error">{}</p>"#, form(&params), esc(&e));
            return page::respond(
                StatusCode::BAD_REQUEST,
                page::html(Tab::Diff, what, "", &body),
            );
        }
    };
    let path = state.store_path.clone();
    let cache = state.folds.clone();
    let opts = q.opts;
    let folded = crate::server::edge::reads::run(move || both(&path, &cache, &q)).await;
    let (base, test) = match folded {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => return e.respond(Tab::Diff, what),
        Err(e) => {
            return PageError::BadQuery(format!("the comparison failed: {e}; retry"))
                .respond(Tab::Diff, what);
        }
    };
    let report = diff(&base.agg, &test.agg, &opts);
    page::respond(
        StatusCode::OK,
        page::html(Tab::Diff, what, "", &render(&params, &base, &test, &report)),
    )
}

fn form(params: &Params) -> String {
    let v = |k: &str| esc(params.get(k).unwrap_or(""));
    format!(
        r#"<form class="filters diff" method="get" action="/ui/diff">
<label>base <input name="base" value="{}" placeholder="service=A&amp;label=version=v1" size="44"></label>
<label>test <input name="test" value="{}" placeholder="service=A&amp;label=version=v2" size="44"></label>
<label>confidence <input name="confidence" value="{}" placeholder="0.95" size="5"></label>
<label>min change <input name="min_change" value="{}" placeholder="e.g. 1ms" size="7"></label>
<label><input type="checkbox" name="bonferroni"{}> Bonferroni</label>
<button>Compare</button></form>
"#,
        v("base"),
        v("test"),
        v("confidence"),
        v("min_change"),
        if params.get("bonferroni").is_some() {
            " checked"
        } else {
            ""
        }
    )
}

fn render(params: &Params, bf: &Folded, tf: &Folded, r: &DiffReport) -> String {
    let (base, test): (&Aggregate, &Aggregate) = (&bf.agg, &tf.agg);
    let pct = r.options.confidence * 100.0;
    let mut b = form(params);
    if base.requests() == 0 || test.requests() == 0 {
        let _ = write!(
            b,
            r#"<p class="error">The {} selection matches no request: nothing to compare. Check it on the <a href="/ui/profile?{}">profile page</a>.</p>"#,
            if base.requests() == 0 { "base" } else { "test" },
            esc(params
                .get(if base.requests() == 0 { "base" } else { "test" })
                .unwrap_or(""))
        );
        return b;
    }
    let ci = |row: &DiffRow| {
        let (lo, hi) = row.ci();
        format!("[{}, {}]", fmt_signed(lo), fmt_signed(hi))
    };
    let _ = writeln!(
        b,
        r#"<div class="stats"><div><span>base</span><b>{} · {}</b></div><div><span>test</span><b>{} · {}</b></div><div><span>change in mean latency</span><b id="total-change" class="{}">{} {}</b></div><div><span>flagged stacks</span><b id="flagged-count">{}</b></div></div>
<p class="note">Base: {}. Test: {}.</p>
<p class="note">{} stacks compared at {pct}&nbsp;% confidence{}: chance alone would flag about {:.1} of them (CPT Table 3). A stack is flagged when its interval excludes zero and its change is at least {}.</p>"#,
        base.requests(),
        fmt_ns(base.mean_latency().as_nanos() as u64),
        test.requests(),
        fmt_ns(test.mean_latency().as_nanos() as u64),
        if r.total.flagged { "flagged" } else { "" },
        fmt_signed(r.total.change_nanos),
        ci(&r.total),
        r.flagged().count(),
        bf.coverage(),
        tf.coverage(),
        r.rows.len(),
        if r.options.bonferroni {
            " (Bonferroni)"
        } else {
            ""
        },
        r.expected_false_positives(),
        fmt_ns(u64::try_from(r.options.min_change.as_nanos()).unwrap_or(u64::MAX)),
    );
    let svg_q = params.without(&["all"]).query();
    let depth = base
        .stacks()
        .iter()
        .chain(test.stacks())
        .map(|s| s.stack.len())
        .max()
        .unwrap_or(1);
    let _ = writeln!(
        b,
        r#"<section class="flame"><h2>Differential flame graph</h2>
<p class="note">Widths are the test selection's mean times; red frames got slower, blue faster, by how much the colour's depth says (hover for the exact change). <a href="/ui/diff.svg?{q}">Open the graph alone</a>.</p>
<iframe id="flame" title="differential flame graph" src="/ui/diff.svg?{q}" height="{h}"></iframe></section>"#,
        q = esc(&svg_q),
        h = flame_height(depth),
    );
    let all = params.get("all").is_some();
    let _ = writeln!(
        b,
        r#"<h2>Changes</h2><table id="changes"><thead><tr><th>stack</th><th class="num">base</th><th class="num">test</th><th class="num">change</th><th class="num">{pct}&nbsp;% interval</th><th></th></tr></thead><tbody>"#
    );
    let shown = if all { r.rows.len() } else { TOP };
    for row in r.rows.iter().take(shown) {
        let frames: Vec<&str> = row.stack.split(';').collect();
        let (leaf, parents) = frames.split_last().unwrap_or((&"", &[]));
        let (class, mark) = match (row.flagged, row.change_nanos > 0.0) {
            (true, true) => ("flagged up", "▲ slower"),
            (true, false) => ("flagged down", "▼ faster"),
            (false, _) => ("", "within noise"),
        };
        let _ = writeln!(
            b,
            r#"<tr class="{class}" data-stack="{}"><td class="stack"><span class="parents">{}</span><b>{}</b></td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td class="mark">{mark}</td></tr>"#,
            esc(&row.stack),
            parents
                .iter()
                .map(|f| format!("{} › ", esc(f)))
                .collect::<String>(),
            esc(leaf),
            fmt_ns(row.base.mean_nanos.round() as u64),
            fmt_ns(row.test.mean_nanos.round() as u64),
            fmt_signed(row.change_nanos),
            ci(row),
        );
    }
    b.push_str("</tbody></table>\n");
    if !all && r.rows.len() > TOP {
        let mut q = params.clone();
        q.0.push(("all".into(), "on".into()));
        let _ = write!(
            b,
            r#"<p class="note">The {TOP} largest changes of {}. <a href="/ui/diff?{}">Show all</a>.</p>"#,
            r.rows.len(),
            esc(&q.query())
        );
    }
    let (bq, tq) = (
        params.get("base").unwrap_or(""),
        params.get("test").unwrap_or(""),
    );
    let _ = writeln!(
        b,
        r#"<h2>Elsewhere</h2><ul class="links"><li>Each arm's profile: <a href="/ui/profile?{}">base</a>, <a href="/ui/profile?{}">test</a></li><li>With pprof: download <a href="/profile?{}">base</a> and <a href="/profile?{}">test</a>, then <code>go tool pprof -http=: -diff_base base.pb.gz test.pb.gz</code></li></ul>"#,
        esc(bq),
        esc(tq),
        esc(bq),
        esc(tq)
    );
    b
}

/// The differential flame graph SVG.
pub(super) async fn svg(
    State(state): State<UiState>,
    Extension(reader): Extension<Reader>,
    RawQuery(raw): RawQuery,
) -> Response {
    let q = match Params::parse(raw.as_deref()).and_then(|p| parse(&p, reader)) {
        Ok(Some(q)) => q,
        Ok(None) => {
            return svg_problem(
                StatusCode::BAD_REQUEST,
                "give base=SELECTION and test=SELECTION",
            );
        }
        Err(e) => return svg_problem(StatusCode::BAD_REQUEST, &e),
    };
    let path = state.store_path.clone();
    let cache = state.folds.clone();
    let built = crate::server::edge::reads::run(move || {
        let (base, test) = both(&path, &cache, &q)?;
        diff_flame_svg(&base.agg, &test.agg, &FlameOptions::default())
            .map_err(|e| PageError::BadQuery(e.to_string()))
    })
    .await;
    match built {
        Ok(Ok(svg)) => svg_response(svg),
        Ok(Err(PageError::BadQuery(msg))) => svg_problem(StatusCode::NOT_FOUND, &msg),
        Ok(Err(e)) => e.respond(Tab::Diff, "Differential flame graph"),
        Err(e) => svg_problem(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}
