//! `/ui/trend?service=S&endpoint=E&last=14d`: an endpoint's latency over
//! weeks and months, from the roll-ups. Above, the mean and p99 per hour
//! (per day where only daily roll-ups are left); below, on the same time
//! axis, the mean time of the frames that took the most of it, stacked, so
//! a step in the mean lines up with the frame that made it. A click on a
//! point opens that period's profile; a link compares the last week with
//! the week before (`/ui/diff`). The chart is SVG drawn here: no script.

use std::fmt::Write as _;

use axum::extract::{RawQuery, State};
use axum::response::Response;
use http::StatusCode;

use super::UiState;
use super::figure;
use super::page::{self, Params, Tab, esc};
use crate::format::fmt_ns;
use crate::records::query;
use crate::records::selection::format_time;
use crate::server::store::Store;
use crate::server::store::rollup::{DAY, HOUR, Trend, TrendQuery};

const NANOS: u64 = 1_000_000_000;
const WIDTH: f64 = 960.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 16.0;
const LINES_HEIGHT: f64 = 220.0;
const STACK_HEIGHT: f64 = 170.0;
const GAP: f64 = 34.0;
/// Colours of the stacked frames, then "other" in grey.
const PALETTE: [&str; 10] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac",
];
const OTHER: &str = "#9e9e9e";

pub(super) async fn page(State(state): State<UiState>, RawQuery(raw): RawQuery) -> Response {
    let what = "Trend";
    let params = match Params::parse(raw.as_deref()) {
        Ok(p) => p,
        Err(e) => return page::error(StatusCode::BAD_REQUEST, Tab::None, what, &e),
    };
    if params.get("service").is_none() {
        let body = format!(
            r#"{}<p class="note">An endpoint's mean and p99 latency per hour (per day past the hourly roll-ups), with the frames that took the most of it, from the collector's roll-ups: they keep every sampled request long after the raw records are deleted. Pick an endpoint on the <a href="/">services page</a>, or give <code>service</code> and <code>endpoint</code>.</p>"#,
            form(&params)
        );
        return page::respond(StatusCode::OK, page::html(Tab::None, what, "", &body));
    }
    let mut pairs: Vec<(&str, &str)> = params
        .0
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    if params.get("last").is_none() && params.get("since").is_none() {
        pairs.push(("last", "14d"));
    }
    let now = page::now_unix_nanos();
    let q = match TrendQuery::from_pairs(pairs, now) {
        Ok(q) => q,
        Err(e) => return page::error(StatusCode::BAD_REQUEST, Tab::None, what, &e),
    };
    let path = state.store_path.clone();
    let query = q.clone();
    let built = crate::server::edge::reads::run(move || {
        Store::open_read_only(&path).and_then(|s| s.trend(&query))
    })
    .await;
    let trend = match built {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => return page::PageError::Store(e).respond(Tab::None, what),
        Err(e) => {
            return page::error(
                StatusCode::INTERNAL_SERVER_ERROR,
                Tab::None,
                what,
                &format!("the trend task failed: {e}; retry"),
            );
        }
    };
    let title = match &q.endpoint {
        Some(e) => format!("Trend of {e} ({})", q.service),
        None => format!("Trend of {}", q.service),
    };
    let mut body = form(&params);
    if trend.points.is_empty() {
        body.push_str(
            r#"<p class="note">No roll-ups for this selection yet: the collector rolls records up within seconds of storing them, for sampled requests that have a start time.</p>"#,
        );
        return page::respond(StatusCode::OK, page::html(Tab::None, &title, "", &body));
    }
    let _ = write!(
        body,
        r#"<p class="note">{} sampled requests in {} periods. Click a point for that period's profile. <a href="{}">Compare the last week with the week before</a>.</p>"#,
        trend.points.iter().map(|p| p.requests).sum::<u64>(),
        trend.points.len(),
        esc(&week_over_week(&q, now)),
    );
    body.push_str(&chart(&q, &trend));
    body.push_str(&table(&q, &trend));
    page::respond(StatusCode::OK, page::html(Tab::None, &title, "", &body))
}

/// The selection of `q`'s service and endpoint over `[since, until)` (ns),
/// as a query.
fn selection_query(q: &TrendQuery, since: u64, until: u64) -> String {
    let mut pairs = vec![("service", q.service.clone())];
    if let Some(e) = &q.endpoint {
        pairs.push(("endpoint", e.clone()));
    }
    pairs.push(("since", format_time(since)));
    pairs.push(("until", format_time(until)));
    query::encode(pairs)
}

/// `/ui/diff` of the last whole week against the week before, hour-aligned
/// so that the roll-ups answer both once the raw records are gone.
fn week_over_week(q: &TrendQuery, now: u64) -> String {
    let week = 7 * DAY * NANOS;
    let end = now / (HOUR * NANOS) * HOUR * NANOS;
    format!(
        "/ui/diff?{}",
        query::encode([
            ("base", selection_query(q, end - 2 * week, end - week)),
            ("test", selection_query(q, end - week, end)),
            ("sample", "all".to_owned()),
        ])
    )
}

/// The period's profile page.
fn period_link(q: &TrendQuery, start_secs: u64, resolution: u64) -> String {
    format!(
        "/ui/profile?{}&sample=all",
        selection_query(q, start_secs * NANOS, (start_secs + resolution) * NANOS)
    )
}

fn form(params: &Params) -> String {
    let v = |k: &str| esc(params.get(k).unwrap_or(""));
    format!(
        r#"<form class="selection" method="get" action="/ui/trend">
<label>service <input name="service" value="{}" required></label>
<label>endpoint <input name="endpoint" value="{}"></label>
<label>last <input name="last" value="{}" placeholder="14d"></label>
<label>frames <input name="top" value="{}" placeholder="8" size="3"></label>
<button>Show</button>
</form>
"#,
        v("service"),
        v("endpoint"),
        v("last"),
        v("top")
    )
}

/// The two panels: mean and p99 lines, the stacked frames below.
fn chart(q: &TrendQuery, t: &Trend) -> String {
    let first = t.points.first().map_or(0, |p| p.start_unix_secs);
    let last = t
        .points
        .last()
        .map_or(1, |p| p.start_unix_secs + p.resolution_secs);
    let span = (last - first).max(1) as f64;
    let plot = WIDTH - LEFT - RIGHT;
    let x = |secs: f64| LEFT + (secs - first as f64) / span * plot;
    let mid = |p: &crate::server::store::rollup::TrendPoint| {
        x(p.start_unix_secs as f64 + p.resolution_secs as f64 / 2.0)
    };
    let top = t
        .points
        .iter()
        .map(|p| p.p99_nanos)
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let y1 = |ns: u64| 10.0 + LINES_HEIGHT * (1.0 - ns as f64 / top);
    let stack_top = t
        .points
        .iter()
        .map(|p| p.mean_nanos)
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let base2 = 10.0 + LINES_HEIGHT + GAP;
    let y2 = |ns: u64| base2 + STACK_HEIGHT * (1.0 - ns as f64 / stack_top);
    let height = base2 + STACK_HEIGHT + 40.0;
    let mut svg = format!(
        r#"<figure class="trend"><svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" width="100%" role="img" aria-label="mean and p99 latency over time, and the frames that took it" font-family="system-ui, sans-serif" font-size="11">"#
    );
    // Axes and their labels.
    for (yy, label) in [
        (y1(top as u64), fmt_ns(top as u64)),
        (y1(top as u64 / 2), fmt_ns(top as u64 / 2)),
        (y1(0), "0".to_owned()),
        (y2(stack_top as u64), fmt_ns(stack_top as u64)),
        (y2(0), "0".to_owned()),
    ] {
        let _ = write!(
            svg,
            r##"<line x1="{LEFT}" x2="{}" y1="{yy:.1}" y2="{yy:.1}" stroke="#8884" stroke-width="1"/><text x="{}" y="{:.1}" text-anchor="end" fill="currentColor">{}</text>"##,
            WIDTH - RIGHT,
            LEFT - 6.0,
            yy + 4.0,
            esc(&label)
        );
    }
    let day_label = |secs: u64| {
        let s = format_time(secs * NANOS);
        s.get(..16).unwrap_or(&s).replace('T', " ")
    };
    for secs in [first, first + (last - first) / 2, last] {
        let anchor = if secs == first {
            "start"
        } else if secs == last {
            "end"
        } else {
            "middle"
        };
        let _ = write!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="{anchor}" fill="currentColor">{}</text>"#,
            x(secs as f64),
            base2 + STACK_HEIGHT + 16.0,
            esc(&day_label(secs))
        );
    }
    // The stacked frames: one band per frame, "other" on top.
    let layers = t.frames.len() + 1;
    let mut below = vec![0u64; t.points.len()];
    for layer in 0..layers {
        let above: Vec<u64> = t
            .points
            .iter()
            .zip(&below)
            .map(|(p, b)| b + p.frame_nanos.get(layer).copied().unwrap_or(0))
            .collect();
        let mut d = String::new();
        for (i, p) in t.points.iter().enumerate() {
            let _ = write!(
                d,
                "{}{:.1},{:.1} ",
                if i == 0 { "M" } else { "L" },
                mid(p),
                y2(above[i])
            );
        }
        for (i, p) in t.points.iter().enumerate().rev() {
            let _ = write!(d, "L{:.1},{:.1} ", mid(p), y2(below[i]));
        }
        let colour = if layer < t.frames.len() {
            PALETTE[layer % PALETTE.len()]
        } else {
            OTHER
        };
        let name = t.frames.get(layer).map_or("other frames", String::as_str);
        let _ = write!(
            svg,
            r#"<path d="{}Z" fill="{colour}" fill-opacity="0.85"><title>{}</title></path>"#,
            d.trim_end(),
            esc(name)
        );
        below = above;
    }
    // Mean and p99 lines, and a point per period linking its profile.
    for (values, colour, name) in [
        (
            t.points.iter().map(|p| p.p99_nanos).collect::<Vec<_>>(),
            "#e15759",
            "p99",
        ),
        (
            t.points.iter().map(|p| p.mean_nanos).collect(),
            "#4e79a7",
            "mean",
        ),
    ] {
        let mut d = String::new();
        for (i, (p, v)) in t.points.iter().zip(&values).enumerate() {
            let _ = write!(
                d,
                "{}{:.1},{:.1} ",
                if i == 0 { "M" } else { "L" },
                mid(p),
                y1(*v)
            );
        }
        let _ = write!(
            svg,
            r#"<path d="{}" fill="none" stroke="{colour}" stroke-width="2"><title>{name}</title></path>"#,
            d.trim_end()
        );
        for (p, v) in t.points.iter().zip(&values) {
            let _ = write!(
                svg,
                r#"<a href="{}"><circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{colour}"><title>{} {}: {name} {} ({} requests)</title></circle></a>"#,
                esc(&period_link(q, p.start_unix_secs, p.resolution_secs)),
                mid(p),
                y1(*v),
                esc(&day_label(p.start_unix_secs)),
                if p.resolution_secs == DAY {
                    "(day)"
                } else {
                    "(hour)"
                },
                fmt_ns(*v),
                p.requests
            );
        }
    }
    let _ = write!(
        svg,
        r#"<text x="{LEFT}" y="{:.1}" fill="currentColor">frames' mean time per request (stacked; the top is the mean)</text>"#,
        base2 - 8.0
    );
    svg.push_str("</svg>");
    // The legend, as HTML (wraps with the page).
    svg.push_str(r##"<figcaption class="legend"><span class="key"><svg width="14" height="4" aria-hidden="true"><rect width="14" height="4" fill="#4e79a7"/></svg> mean</span> <span class="key"><svg width="14" height="4" aria-hidden="true"><rect width="14" height="4" fill="#e15759"/></svg> p99</span>"##);
    for (i, f) in t.frames.iter().enumerate() {
        let _ = write!(
            svg,
            r#" <span class="key"><svg width="10" height="10" aria-hidden="true"><rect width="10" height="10" fill="{}"/></svg> {}</span>"#,
            PALETTE[i % PALETTE.len()],
            esc(f)
        );
    }
    let _ = write!(
        svg,
        r#" <span class="key"><svg width="10" height="10" aria-hidden="true"><rect width="10" height="10" fill="{OTHER}"/></svg> other frames</span></figcaption></figure>"#
    );
    svg
}

fn table(q: &TrendQuery, t: &Trend) -> String {
    let mut out = String::from(
        r#"<table class="data"><thead><tr><th>period</th><th>requests</th><th>mean</th><th>p50</th><th>p99</th><th>top frame</th></tr></thead><tbody>"#,
    );
    for p in t.points.iter().rev() {
        let (top, ns) = t
            .frames
            .iter()
            .zip(&p.frame_nanos)
            .max_by_key(|(_, v)| **v)
            .map_or(("", 0), |(f, v)| (f.as_str(), *v));
        let when = format_time(p.start_unix_secs * NANOS);
        let _ = write!(
            out,
            r#"<tr><td><a href="{}">{}</a> {}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td>{} {}</td></tr>"#,
            esc(&period_link(q, p.start_unix_secs, p.resolution_secs)),
            esc(when.get(..16).unwrap_or(&when)),
            if p.resolution_secs == DAY {
                "day"
            } else {
                "hour"
            },
            p.requests,
            fmt_ns(p.mean_nanos),
            figure::quantile(&figure::trend_quantile(p.p50_nanos)),
            figure::quantile(&figure::trend_quantile(p.p99_nanos)),
            esc(top),
            fmt_ns(ns)
        );
    }
    out.push_str("</tbody></table>");
    out
}
