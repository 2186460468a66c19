//! `/ui/profile?SELECTION`: the average critical path of a selection (CPT
//! Table 1, Figure 3) as a flame graph, the table of its top stacks (share
//! of the mean latency, how often on the path, p50 / p99 when on it:
//! [`Report`]), and the same selection as a pprof download and as `cpt`
//! commands. `/ui/flame.svg?SELECTION` is the flame graph alone.
//!
//! The flame graph is inferno's SVG ([`flame_svg`], what `cpt flame`
//! writes), embedded as a document of its own so that its script works:
//! click a frame to zoom, Ctrl-F or "Search" to highlight matching frames
//! with their total share, hover for exact values. It needs no viewer
//! library, and without JavaScript it is still a complete picture with
//! every frame's value in its tooltip.

use std::fmt::Write as _;

use axum::Extension;
use axum::extract::{RawQuery, State};
use axum::response::{IntoResponse, Response};
use http::{StatusCode, header};

use super::UiState;
use super::figure;
use super::fold::{Folded, Sample, fold};
use super::page::{self, PageError, Params, Tab, bar, esc, selection_query};
use crate::format::{fmt_ns, plural};
use crate::profile::flame::{FlameOptions, flame_svg};
use crate::profile::report::Report;
use crate::records::query;
use crate::records::selection::Selection;
use crate::server::edge::access::{Reader, Withheld};

/// Stacks in the table unless `top=` says otherwise.
const TOP: usize = 25;
/// The page's own keys (not selection keys).
const PAGE_KEYS: &[&str] = &["top", "sample"];

/// Height in CSS pixels of inferno's SVG for stacks `depth` frames deep
/// (16 px a frame plus the title, subtitle and details bar).
pub(super) fn flame_height(depth: usize) -> usize {
    (depth + 1) * 16 + 110
}

pub(super) async fn page(
    State(state): State<UiState>,
    Extension(reader): Extension<Reader>,
    RawQuery(q): RawQuery,
) -> Response {
    let what = "Profile";
    let params = match Params::parse(q.as_deref()) {
        Ok(p) => p,
        Err(e) => return page::error(StatusCode::BAD_REQUEST, Tab::Profile, what, &e),
    };
    let sel = match page::selection(&params, PAGE_KEYS) {
        Ok(s) => s,
        Err(e) => return page::error(StatusCode::BAD_REQUEST, Tab::Profile, what, &e),
    };
    let sel = match reader.restrict(sel) {
        Ok(s) => s,
        Err(Withheld) => {
            return page::error(StatusCode::FORBIDDEN, Tab::Profile, what, Withheld::MESSAGE);
        }
    };
    let top = match params.get("top").map(str::parse::<usize>) {
        None => TOP,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            return page::error(
                StatusCode::BAD_REQUEST,
                Tab::Profile,
                what,
                "top: expected a positive number of stacks to list",
            );
        }
    };
    let sample = match Sample::from_params(&params) {
        Ok(s) => s,
        Err(e) => return page::error(StatusCode::BAD_REQUEST, Tab::Profile, what, &e),
    };
    let (s2, cache) = (sel.clone(), state.folds.clone());
    let built = page::with_store(&state.store_path, move |store| {
        fold(store, &cache, &s2, sample)
    })
    .await;
    match built {
        Ok(f) => page::respond(StatusCode::OK, render(&params, &sel, &f, sample, top)),
        Err(e) => e.respond(Tab::Profile, what),
    }
}

/// The query of this selection's flame graph: the selection with absolute
/// times (so the graph folds exactly what the page did, from the cache)
/// and the sample.
pub(super) fn graph_query(sel: &Selection, sample: Sample) -> String {
    let mut pairs: Vec<(&str, String)> = sel.pairs();
    match sample.0 {
        None => pairs.push(("sample", "all".into())),
        Some(n) if n != super::fold::DEFAULT_SAMPLE => pairs.push(("sample", n.to_string())),
        Some(_) => {}
    }
    query::encode(pairs)
}

fn render(params: &Params, sel: &Selection, f: &Folded, sample: Sample, top: usize) -> String {
    let agg = &f.agg;
    let own = params.without(&["top"]).query();
    let mut b = String::new();
    let _ = writeln!(
        b,
        r#"<form class="filters" method="get" action="/ui/profile">{}<button>Show</button></form>
<p class="selection">Selection: <code>{}</code></p>"#,
        page::selection_fields(params),
        esc(&sel.to_string())
    );
    if agg.requests() == 0 {
        b.push_str(r#"<p class="empty">No request matches this selection. Widen the time range, check the service and endpoint names on the <a href="/">services page</a>, or ask for <code>trigger=all</code>.</p>"#);
        return page::html(Tab::Profile, "Profile", "", &b);
    }
    let report = Report::new(agg);
    let mean = agg.mean_latency().as_nanos() as u64;
    let _ = writeln!(
        b,
        r#"<p class="note">Folded: {}.</p>
<div class="stats"><div><span>requests</span><b id="requests">{}</b></div><div><span>mean latency</span><b id="mean-latency">{}</b></div><div><span>p50</span><b>{}</b></div><div><span>p99</span><b>{}</b></div><div><span>stacks</span><b>{}</b></div></div>"#,
        f.coverage(),
        agg.requests(),
        fmt_ns(mean),
        figure::quantile(&agg.latency_quantile(0.5)),
        figure::quantile(&agg.latency_quantile(0.99)),
        agg.stacks().len(),
    );
    let depth = agg
        .stacks()
        .iter()
        .map(|s| s.stack.len())
        .max()
        .unwrap_or(1);
    let _ = writeln!(
        b,
        r#"<section class="flame"><h2>Average critical path</h2>
<p class="note">Width is mean time on the critical path per request; click a frame to zoom, “Search” (or Ctrl-F inside the graph) to highlight frames by name. <a href="/ui/flame.svg?{q}">Open the graph alone</a>.</p>
<iframe id="flame" title="flame graph" src="/ui/flame.svg?{q}" height="{h}"></iframe>
</section>"#,
        q = esc(&graph_query(sel, sample)),
        h = flame_height(depth),
    );
    let _ = writeln!(
        b,
        r#"<h2>Top stacks</h2>
<p class="note">Each row is one frame stack on the path. <em>share</em>: of the mean latency; <em>on path</em>: of the requests; p50 / p99: its time in the requests it is on the path of, read from a histogram: <em>≈</em> marks a value within the ± bound of the exact one (hover for the range).</p>
<table id="stacks"><thead><tr><th>stack</th><th class="num">mean / request</th><th class="num">share</th><th class="num">on path</th><th class="num">p50</th><th class="num">p99</th></tr></thead><tbody>"#
    );
    for row in report.rows.iter().take(top) {
        let frames: Vec<&str> = row.stack.split(';').collect();
        let (leaf, parents) = frames.split_last().unwrap_or((&"", &[]));
        let share = row.mean_per_request_nanos as f64 / mean.max(1) as f64;
        let _ = writeln!(
            b,
            r#"<tr><td class="stack"><span class="parents">{}</span><b>{}</b></td><td class="num">{}</td><td class="num">{:.1}&nbsp;%{}</td><td class="num">{:.0}&nbsp;%</td><td class="num">{}</td><td class="num">{}</td></tr>"#,
            parents
                .iter()
                .map(|f| format!("{} › ", esc(f)))
                .collect::<String>(),
            esc(leaf),
            fmt_ns(row.mean_per_request_nanos),
            share * 100.0,
            bar(share),
            row.fraction_on_path * 100.0,
            figure::quantile(&row.histogram.quantile_range(0.5)),
            figure::quantile(&row.histogram.quantile_range(0.99)),
        );
    }
    b.push_str("</tbody></table>\n");
    if report.rows.len() > top {
        let mut all = params.without(&["top"]);
        all.0.push(("top".into(), report.rows.len().to_string()));
        let _ = write!(
            b,
            r#"<p class="note">{} more. <a href="/ui/profile?{}">Show all</a>.</p>"#,
            plural((report.rows.len() - top) as u64, "stack"),
            esc(&all.query())
        );
    }
    let exact = selection_query(sel);
    let flags = page::cli_flags(sel);
    let _ = writeln!(
        b,
        r#"<h2>Elsewhere</h2>
<ul class="links">
<li><a id="pprof" href="/profile?{ex}" download="profile.pb.gz">Download the pprof profile</a> (gzipped <code>profile.proto</code>), then <code>go tool pprof -http=: profile.pb.gz</code></li>
<li><a href="/ui/profile?{ex}">Link to exactly these records</a> (the time range fixed)</li>
<li><a href="/ui/diff?{own_enc}">Compare this selection with another</a></li>
<li>The same from a shell: <code>curl -o profile.pb.gz 'http://HOST:PORT/profile?{ex_text}'</code>, or on the collector's machine <code>cpt profile --store STORE.db{flags} -o profile.pb.gz</code></li>
</ul>"#,
        ex = esc(&exact),
        ex_text = esc(&exact),
        own_enc = esc(&query::encode([("test", own.as_str())])),
        flags = esc(&flags),
    );
    page::html(Tab::Profile, "Profile", "", &b)
}

/// The flame graph SVG of a selection, or a plain-text reason.
pub(super) async fn svg(
    State(state): State<UiState>,
    Extension(reader): Extension<Reader>,
    RawQuery(q): RawQuery,
) -> Response {
    let parsed = Params::parse(q.as_deref())
        .and_then(|p| Ok((page::selection(&p, PAGE_KEYS)?, Sample::from_params(&p)?)));
    let (sel, sample) = match parsed {
        Ok(s) => s,
        Err(e) => return svg_problem(StatusCode::BAD_REQUEST, &e),
    };
    let Ok(sel) = reader.restrict(sel) else {
        return svg_problem(StatusCode::FORBIDDEN, Withheld::MESSAGE);
    };
    let cache = state.folds.clone();
    let built = page::with_store(&state.store_path, move |store| {
        let f = fold(store, &cache, &sel, sample)?;
        flame_svg(&f.agg, &FlameOptions::default()).map_err(|e| PageError::BadQuery(e.to_string()))
    })
    .await;
    match built {
        Ok(svg) => svg_response(svg),
        Err(PageError::BadQuery(msg)) => svg_problem(StatusCode::NOT_FOUND, &msg),
        Err(e) => e.respond(Tab::Profile, "Flame graph"),
    }
}

/// Inferno's colours for the frames, its light background and black text
/// for the rest; in a dark page that is a glaring block, so the graph
/// follows `prefers-color-scheme` too (CSS beats the presentation
/// attributes inferno writes).
const DARK_FLAME: &str = r#"
@media (prefers-color-scheme: dark) {
  svg > rect[fill="url(#background)"] { fill: #1b1f24; }
  #title, #subtitle, #details, #unzoom, #search, #matched { fill: #d6dbe0; }
}
"#;

fn themed(svg: Vec<u8>) -> Vec<u8> {
    let Some(at) = svg.windows(8).position(|w| w == b"</style>") else {
        return svg;
    };
    let mut out = Vec::with_capacity(svg.len() + DARK_FLAME.len());
    out.extend_from_slice(&svg[..at]);
    out.extend_from_slice(DARK_FLAME.as_bytes());
    out.extend_from_slice(&svg[at..]);
    out
}

/// The flame graph themed, under its own policy (its script and style by
/// hash, framed by this collector's pages only: `server/edge/headers.rs`).
pub(super) fn svg_response(svg: Vec<u8>) -> Response {
    let (svg, csp) = crate::server::edge::headers::flame_graph(themed(svg));
    let mut resp = (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "image/svg+xml"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        svg,
    )
        .into_response();
    crate::server::edge::headers::framed_by_own_pages(resp.headers_mut(), Some(csp));
    resp
}

/// A small SVG that says why there is no graph (shown in the frame).
pub(super) fn svg_problem(status: StatusCode, msg: &str) -> Response {
    let body = format!(
        r##"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="800" height="40"><text x="8" y="24" font-family="sans-serif" font-size="14" fill="#888">{}</text></svg>
"##,
        esc(msg)
    );
    let mut resp = (
        status,
        [
            (header::CONTENT_TYPE, "image/svg+xml"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response();
    // Shown in the page's frame, as the graph would have been.
    crate::server::edge::headers::framed_by_own_pages(resp.headers_mut(), None);
    resp
}
