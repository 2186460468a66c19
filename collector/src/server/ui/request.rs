//! `/ui/request?id=ID`: one request's critical path as the tree `cpt show`
//! prints ([`tree`]): each frame's time on the path and share of the
//! latency, its own busy time, the accounting kinds (network, blind spot,
//! unattributed, queueing) as marked leaves, the slowest leaves starred,
//! and each line beside the same endpoint's sampled average around that
//! time ([`Baseline`]). The leaves sum to the latency exactly. `ID` is a
//! request id, or an OpenTelemetry trace id (32 hex digits) when no request
//! has that id.
//!
//! `wait=DURATION` is `cpt show --wait`: while the record has not arrived
//! the page says so and refreshes itself every second (a plain
//! `<meta http-equiv="refresh">`, no script) until it does or the time is
//! up.

use std::fmt::Write as _;
use std::time::Duration;

use axum::Extension;
use axum::extract::{RawQuery, State};
use axum::response::Response;
use cpt_sdk::record::Record;
use http::StatusCode;

use super::UiState;
use super::page::{self, PageError, Params, Tab, bar, esc, nanos, now_unix_nanos};
use crate::format::fmt_ns;
use crate::profile::aggregate::Aggregator;
use crate::profile::tree::{Baseline, Node, collect_leaves, tree};
use crate::records::query;
use crate::records::selection::{Selection, format_time};
use crate::server::edge::access::Reader;
use crate::server::store::{Store, StoreQuery};

/// Records one id may match (a trace id may have several).
const MATCHES: u64 = 20;
/// Sampled requests of the endpoint averaged for the comparison, at most
/// (the newest before the window's end).
const BASELINE_REQUESTS: u64 = 1000;
/// The comparison takes the endpoint's requests this close to the one shown.
const BASELINE_WINDOW: Duration = Duration::from_secs(3600);
/// Slowest leaves starred.
const FLAGGED: usize = 3;
/// Longest `wait=`.
const MAX_WAIT: Duration = Duration::from_secs(600);

struct Found {
    records: Vec<Record>,
    baselines: Vec<Option<Baseline>>,
}

/// The records of request or trace id `id` this reader may see.
fn find(store: &Store, reader: Reader, id: &str) -> Result<Found, PageError> {
    let by = |sel: Selection| -> Result<Vec<Record>, PageError> {
        // An open collector's reader: sampled records only, so a forced
        // request's id matches nothing.
        let sel = reader.restrict(sel).map_err(|_| {
            PageError::BadQuery(crate::server::edge::access::Withheld::MESSAGE.into())
        })?;
        let mut q = StoreQuery::from_selection(&sel);
        q.limit = Some(MATCHES);
        Ok(store.query(&q)?.collect::<Result<Vec<_>, _>>()?)
    };
    let mut records = by(Selection::new().with_request_id(id))?;
    if records.is_empty() && id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
        records = by(Selection::new().with_trace_id(id))?;
    }
    let baselines = records
        .iter()
        .map(|r| baseline(store, r))
        .collect::<Result<_, _>>()?;
    Ok(Found { records, baselines })
}

/// The average of the newest [`BASELINE_REQUESTS`] sampled requests of
/// `r`'s endpoint within [`BASELINE_WINDOW`] of it: folded from the store's
/// packed paths (a store older than them: from their records); `None`
/// when there are none.
fn baseline(store: &Store, r: &Record) -> Result<Option<Baseline>, PageError> {
    let window = nanos(BASELINE_WINDOW);
    let mut sel = Selection::new().with_service(r.service.clone());
    if let Some(e) = &r.endpoint {
        sel = sel.with_endpoint(e.clone());
    }
    if let Some(t) = r.start_unix_nanos {
        sel = sel
            .with_since(t.saturating_sub(window))
            .with_until(t.saturating_add(window));
    }
    let mut agg = Aggregator::new(sel.clone());
    if let Some((_, folded)) = store.fold_newest_into(&mut agg, Some(BASELINE_REQUESTS), 4096)? {
        return Ok((folded > 0).then(|| Baseline::of_aggregate(&agg.finish())));
    }
    let sampled = store
        .query_newest(&StoreQuery::from_selection(&sel), BASELINE_REQUESTS)?
        .collect::<Result<Vec<_>, _>>()?;
    Ok((!sampled.is_empty()).then(|| Baseline::of(&sampled)))
}

pub(super) async fn page(
    State(state): State<UiState>,
    Extension(reader): Extension<Reader>,
    RawQuery(q): RawQuery,
) -> Response {
    let what = "Request";
    let params = match Params::parse(q.as_deref()) {
        Ok(p) => p,
        Err(e) => return page::error(StatusCode::BAD_REQUEST, Tab::Request, what, &e),
    };
    let Some(id) = params.get("id").map(str::trim).map(str::to_owned) else {
        return page::respond(
            StatusCode::OK,
            page::html(Tab::Request, what, "", &id_form("")),
        );
    };
    let deadline_ms = match (params.get("deadline_ms"), params.get("wait")) {
        (Some(d), _) => d.parse::<u64>().ok(),
        (None, Some(w)) => match humantime::parse_duration(w) {
            Ok(w) => Some((now_unix_nanos() + nanos(w.min(MAX_WAIT))) / 1_000_000),
            Err(e) => {
                return page::error(
                    StatusCode::BAD_REQUEST,
                    Tab::Request,
                    what,
                    &format!("wait={w:?}: {e} (expected e.g. 10s, 1m)"),
                );
            }
        },
        (None, None) => None,
    };
    let id2 = id.clone();
    let found = match page::with_store(&state.store_path, move |s| find(s, reader, &id2)).await {
        Ok(f) => f,
        Err(e) => return e.respond(Tab::Request, what),
    };
    if found.records.is_empty() {
        let now_ms = now_unix_nanos() / 1_000_000;
        return match deadline_ms {
            Some(d) if now_ms < d => {
                let again = format!(
                    "/ui/request?{}",
                    query::encode([("id", id.as_str()), ("deadline_ms", &d.to_string())])
                );
                let head = format!(
                    r#"<meta http-equiv="refresh" content="1; url={}">"#,
                    esc(&again)
                );
                let body = format!(
                    r#"<p class="waiting" id="waiting">Waiting for the record of request <code>{}</code>… This page looks again every second for another {} s (records reach the collector milliseconds to seconds after the response).</p>{}"#,
                    esc(&id),
                    (d - now_ms).div_ceil(1000),
                    id_form(&id)
                );
                page::respond(StatusCode::OK, page::html(Tab::Request, what, &head, &body))
            }
            _ => {
                let waited = if deadline_ms.is_some() {
                    "(the wait is over)"
                } else {
                    "(records arrive milliseconds to seconds after the response)"
                };
                let body = format!(
                    r#"<p class="error">No record with request id or trace id <code>{id}</code> {waited}. Was the request traced? A force with a wrong credential is ignored. <a href="/ui/request?{ide}">Wait 30 s for it</a>.</p>{form}"#,
                    id = esc(&id),
                    ide = esc(&query::encode([("id", id.as_str()), ("wait", "30s")])),
                    form = id_form(&id)
                );
                page::respond(
                    StatusCode::NOT_FOUND,
                    page::html(Tab::Request, what, "", &body),
                )
            }
        };
    }
    let mut b = id_form(&id);
    if found.records.len() > 1 {
        let _ = write!(
            b,
            r#"<p class="note">{} records match; each in turn.</p>"#,
            found.records.len()
        );
    }
    for (r, base) in found.records.iter().zip(&found.baselines) {
        render_one(&mut b, r, base.as_ref());
    }
    page::respond(
        StatusCode::OK,
        page::html(Tab::Request, &format!("Request {id}"), "", &b),
    )
}

fn id_form(id: &str) -> String {
    format!(
        r#"<form class="filters" method="get" action="/ui/request"><label>request id or trace id <input name="id" value="{}" size="40" required></label><label>wait <input name="wait" placeholder="e.g. 30s" size="6"></label><button>Find</button></form>
"#,
        esc(id)
    )
}

fn render_one(b: &mut String, r: &Record, base: Option<&Baseline>) {
    let root = tree(r);
    let latency = root.total_ns;
    let _ = writeln!(
        b,
        r#"<section class="request"><div class="stats"><div><span>service</span><b>{}</b></div><div><span>endpoint</span><b>{}</b></div><div><span>trigger</span><b>{}</b></div><div><span>latency</span><b id="latency" data-ns="{latency}">{}</b></div><div><span>started</span><b>{}</b></div>{}</div>"#,
        esc(&r.service),
        esc(r.endpoint.as_deref().unwrap_or("—")),
        r.trigger.as_str(),
        fmt_ns(latency),
        r.start_unix_nanos
            .map_or_else(|| "—".to_owned(), format_time),
        r.trace_id
            .as_deref()
            .map(|t| format!(
                r#"<div><span>trace</span><b><code>{}</code></b></div>"#,
                esc(t)
            ))
            .unwrap_or_default(),
    );
    if !r.labels.is_empty() {
        let _ = write!(
            b,
            r#"<p class="labels">labels: {}</p>"#,
            r.labels
                .iter()
                .map(|(k, v)| format!("<code>{}={}</code>", esc(k), esc(v)))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    let mut pairs = vec![("service", r.service.as_str())];
    pairs.extend(r.endpoint.as_deref().map(|e| ("endpoint", e)));
    let q = query::encode(pairs);
    match base {
        Some(bl) => {
            let _ = write!(
                b,
                r#"<p class="note">Compared with the mean of {} sampled requests of the same endpoint within an hour of this one (mean latency {}; the newest 1&nbsp;000 at most): <a href="/ui/profile?{}">their profile</a>.</p>"#,
                bl.requests,
                fmt_ns(bl.mean_latency_ns),
                esc(&q)
            );
        }
        None => b.push_str(r#"<p class="note">No sampled requests of the same endpoint within an hour of this one to compare with.</p>"#),
    }
    let mut leaves = Vec::new();
    collect_leaves(&root, &mut leaves);
    leaves.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let flagged: Vec<usize> = leaves.iter().take(FLAGGED).map(|l| l.1).collect();
    let avg_head = if base.is_some() {
        r#"<th class="num">endpoint mean</th><th class="num">difference</th>"#
    } else {
        ""
    };
    let _ = writeln!(
        b,
        r#"<table class="tree" id="tree"><thead><tr><th>frame</th><th>service</th><th class="num">on path</th><th class="num">share</th><th class="num">self</th>{avg_head}<th></th></tr></thead><tbody>"#
    );
    let mut ctx = Rows {
        latency,
        flagged: &flagged,
        next_id: 0,
        base,
        key: Vec::new(),
    };
    for c in &root.children {
        ctx.node(b, c, 0);
    }
    let _ = writeln!(
        b,
        r#"</tbody><tfoot><tr><td colspan="2">leaves (own busy time and marked kinds) sum to</td><td class="num" id="leaf-sum" data-ns="{}">{}</td><td colspan="5">= latency {}; ★ the {} slowest leaves; [..] is time the path could not explain in detail</td></tr></tfoot></table>"#,
        root.leaf_sum(),
        fmt_ns(root.leaf_sum()),
        fmt_ns(latency),
        FLAGGED.min(leaves.len()),
    );
    if let Some(id) = &r.request_id {
        let depth = r
            .path
            .segments()
            .iter()
            .map(|s| s.stack.len())
            .max()
            .unwrap_or(1);
        let _ = writeln!(
            b,
            r#"<h2>As a flame graph</h2><iframe class="flame" title="flame graph of this request" src="/ui/flame.svg?{}" height="{}"></iframe>"#,
            esc(&query::encode([("request_id", id.as_str())])),
            super::profile::flame_height(depth + 1)
        );
    }
    b.push_str("</section>\n");
}

struct Rows<'a> {
    latency: u64,
    flagged: &'a [usize],
    next_id: usize,
    base: Option<&'a Baseline>,
    key: crate::profile::tree::PathKey,
}

impl Rows<'_> {
    fn node(&mut self, b: &mut String, n: &Node, depth: usize) {
        let id = self.next_id;
        self.next_id += 1;
        self.key.push((n.service.clone(), n.name.clone(), n.kind));
        let share = n.total_ns as f64 / self.latency.max(1) as f64;
        let (label, class) = match n.kind {
            Some(k) => (
                format!("[{}]", k.as_str().replace('_', " ")),
                " class=\"accounting\"",
            ),
            None => (n.name.clone(), ""),
        };
        // The leaf's own time: a frame's busy self time, or an accounting leaf's whole.
        let leaf_ns = n.self_ns;
        let star = match self.flagged.iter().position(|f| *f == id) {
            Some(rank) if leaf_ns > 0 => {
                format!(r#"<span class="star">★ slowest #{}</span>"#, rank + 1)
            }
            _ => String::new(),
        };
        let avg = self.base.map(|bl| {
            let avg = bl.mean_at(&self.key);
            let delta = n.total_ns as i128 - avg as i128;
            let (sign, cls) = if delta >= 0 {
                ("+", "up")
            } else {
                ("−", "down")
            };
            format!(
                r#"<td class="num">{}</td><td class="num {cls}">{sign}{}</td>"#,
                fmt_ns(avg),
                fmt_ns(delta.unsigned_abs() as u64)
            )
        });
        let indent = r#"<i class="indent"></i>"#.repeat(depth);
        let _ = writeln!(
            b,
            r#"<tr{class} data-leaf-ns="{leaf_ns}"><td class="frame">{indent}{}</td><td>{}</td><td class="num" data-ns="{}">{}</td><td class="num">{:.1}&nbsp;%{}</td><td class="num">{}</td>{}<td>{star}</td></tr>"#,
            esc(&label),
            if n.kind.is_some() {
                String::new()
            } else {
                esc(&n.service)
            },
            n.total_ns,
            fmt_ns(n.total_ns),
            share * 100.0,
            bar(share),
            if leaf_ns > 0 {
                fmt_ns(leaf_ns)
            } else {
                String::new()
            },
            avg.unwrap_or_default(),
        );
        for c in &n.children {
            self.node(b, c, depth + 1);
        }
        self.key.pop();
    }
}
