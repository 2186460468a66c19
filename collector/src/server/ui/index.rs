//! `/`: what the collector holds. Entry services and endpoints with their
//! sampled requests, mean / p50 / p99 latency and when last seen, over the
//! chosen range (`last=1h`, `since=`, `until=`); the services on their
//! critical paths (from the most recent requests); the latest forced
//! requests, each linking to its request page.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use axum::Extension;
use axum::extract::{RawQuery, State};
use axum::response::Response;
use cpt_sdk::Trigger;
use cpt_sdk::record::Record;
use http::StatusCode;

use super::UiState;
use super::page::{self, PageError, Params, Tab, ago, bar, esc};
use crate::format::{fmt_ns, plural};
use crate::records::query;
use crate::records::selection::{Selection, TriggerFilter};
use crate::server::edge::access::Reader;
use crate::server::store::EndpointSummary;

/// Recent sampled records read to find the services on the paths.
const PATH_SAMPLE: u64 = 1000;
/// Forced requests listed.
const FORCED_SHOWN: u64 = 20;

struct Overview {
    endpoints: Vec<EndpointSummary>,
    /// Service → (entry service and endpoint whose paths it is on, mean ns per request of those sampled).
    on_paths: BTreeMap<String, (Vec<Entry>, u64)>,
    sampled_for_paths: usize,
    /// `None`: this reader may not see forced records.
    forced: Option<Vec<Record>>,
}

/// An entry service and endpoint.
type Entry = (String, Option<String>);

pub(super) async fn page(
    State(state): State<UiState>,
    Extension(reader): Extension<Reader>,
    RawQuery(q): RawQuery,
) -> Response {
    let params = match Params::parse(q.as_deref()) {
        Ok(p) => p,
        Err(e) => return page::error(StatusCode::BAD_REQUEST, Tab::Services, "Services", &e),
    };
    let sel = match page::selection(&params, &[]) {
        Ok(s) => s,
        Err(e) => return page::error(StatusCode::BAD_REQUEST, Tab::Services, "Services", &e),
    };
    let (since, until) = sel.time_range();
    let built = page::with_store(&state.store_path, move |store| {
        let endpoints = store.endpoints(Trigger::Sampled, since, until)?;
        let recent = store.recent(Trigger::Sampled, None, None, PATH_SAMPLE)?;
        // The read policy decides whether this caller sees forced records.
        let forced = match reader.restrict(Selection::new().with_triggers(TriggerFilter::Forced)) {
            Ok(_) => Some(store.recent(Trigger::Forced, None, None, FORCED_SHOWN)?),
            Err(_) => None,
        };
        Ok::<_, PageError>(Overview {
            on_paths: services_on_paths(&recent),
            sampled_for_paths: recent.len(),
            endpoints,
            forced,
        })
    })
    .await;
    match built {
        Ok(o) => page::respond(StatusCode::OK, render(&params, &o)),
        Err(e) => e.respond(Tab::Services, "Services"),
    }
}

/// Every service on the recent paths: the entry endpoints it appears under
/// and its mean time on the path per request of the sample.
fn services_on_paths(records: &[Record]) -> BTreeMap<String, (Vec<Entry>, u64)> {
    let mut out: BTreeMap<String, (Vec<Entry>, u128)> = BTreeMap::new();
    for r in records {
        let entry = (r.service.clone(), r.endpoint.clone());
        for seg in r.path.segments() {
            let Some(leaf) = r.path.stack_frames(seg).last() else {
                continue;
            };
            let e = out.entry(leaf.service.to_string()).or_default();
            if !e.0.contains(&entry) {
                e.0.push(entry.clone());
            }
            e.1 += seg.duration.as_nanos();
        }
    }
    let n = records.len().max(1) as u128;
    out.into_iter()
        .map(|(k, (entries, sum))| (k, (entries, u64::try_from(sum / n).unwrap_or(u64::MAX))))
        .collect()
}

/// The profile page of an entry service and endpoint, with `extra` pairs.
fn profile_link(service: &str, endpoint: Option<&str>, extra: &[(String, String)]) -> String {
    let mut pairs = vec![("service", service)];
    pairs.extend(endpoint.map(|e| ("endpoint", e)));
    pairs.extend(extra.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    format!("/ui/profile?{}", query::encode(pairs))
}

fn render(params: &Params, o: &Overview) -> String {
    let range = params.without(&["service", "endpoint"]);
    let mut b = String::new();
    let _ = writeln!(
        b,
        r#"<form class="filters" method="get" action="/">
<label>last <input name="last" value="{}" placeholder="e.g. 1h" size="6"></label>
<label>since <input name="since" value="{}" placeholder="RFC 3339 or Unix ns" size="22"></label>
<label>until <input name="until" value="{}" placeholder="RFC 3339 or Unix ns" size="22"></label>
<button>Show</button>
<span class="quick">{}</span>
</form>"#,
        esc(params.get(page::LAST).unwrap_or("")),
        esc(params.get("since").unwrap_or("")),
        esc(params.get("until").unwrap_or("")),
        ["15m", "1h", "24h", "7d"]
            .iter()
            .map(|d| format!(r#"<a href="/?last={d}">{d}</a>"#))
            .chain(std::iter::once(r#"<a href="/">all</a>"#.to_owned()))
            .collect::<Vec<_>>()
            .join(" ")
    );
    b.push_str("<h2>Entry services</h2>\n");
    if o.endpoints.is_empty() {
        b.push_str(
            r#"<p class="empty">No sampled requests in this range. Services send records to this collector's gRPC or HTTP port (<code>POST /v1/records</code>); see the collector guide.</p>"#,
        );
    } else {
        let total: u64 = o.endpoints.iter().map(|e| e.requests).sum();
        b.push_str(
            r#"<table id="endpoints"><thead><tr><th>service</th><th>endpoint</th><th class="num">requests</th><th class="num">mean</th><th class="num">p50</th><th class="num">p99</th><th>last seen</th><th></th></tr></thead><tbody>"#,
        );
        for e in &o.endpoints {
            let link = profile_link(&e.service, e.endpoint.as_deref(), &range.0);
            let mut slowest = range.0.clone();
            slowest.push(("percentile".into(), "p99-p100".into()));
            let slowest = profile_link(&e.service, e.endpoint.as_deref(), &slowest);
            let _ = write!(
                b,
                r#"<tr data-service="{s}"><td><a href="{q}">{s}</a></td><td><a href="{q}">{ep}</a></td><td class="num">{n}{bar}</td><td class="num">{mean}</td><td class="num">{p50}</td><td class="num">{p99}</td><td>{last}</td><td><a href="{slowest}">slowest 1&nbsp;%</a></td></tr>"#,
                s = esc(&e.service),
                ep = esc(e.endpoint.as_deref().unwrap_or("(none)")),
                n = e.requests,
                bar = bar(e.requests as f64 / total.max(1) as f64),
                mean = fmt_ns(e.mean_latency_nanos),
                p50 = fmt_ns(e.p50_latency_nanos),
                p99 = fmt_ns(e.p99_latency_nanos),
                last = e.last_seen_unix_nanos.map_or_else(|| "—".into(), ago),
                q = esc(&link),
                slowest = esc(&slowest),
            );
        }
        b.push_str("</tbody></table>\n");
    }
    b.push_str("<h2>Services on the critical paths</h2>\n");
    if o.on_paths.is_empty() {
        b.push_str(r#"<p class="empty">No sampled paths yet.</p>"#);
    } else {
        let _ = write!(
            b,
            r#"<p class="note">Each service whose frames end a stretch of the path, with its mean time on the path, over the {} most recently stored.</p>"#,
            plural(o.sampled_for_paths as u64, "sampled request")
        );
        b.push_str(
            r#"<table id="on-paths"><thead><tr><th>service</th><th class="num">mean on path</th><th>under</th></tr></thead><tbody>"#,
        );
        let total: u64 = o.on_paths.values().map(|v| v.1).sum();
        for (service, (entries, mean)) in &o.on_paths {
            let under = entries
                .iter()
                .map(|(s, ep)| {
                    let text = format!("{s} {}", ep.as_deref().unwrap_or(""));
                    format!(
                        r#"<a href="{}">{}</a>"#,
                        esc(&profile_link(s, ep.as_deref(), &[])),
                        esc(text.trim_end())
                    )
                })
                .collect::<Vec<_>>()
                .join(", ");
            let _ = write!(
                b,
                r#"<tr data-service="{s}"><td>{s}</td><td class="num">{m}{bar}</td><td>{under}</td></tr>"#,
                s = esc(service),
                m = fmt_ns(*mean),
                bar = bar(*mean as f64 / total.max(1) as f64),
            );
        }
        b.push_str("</tbody></table>\n");
    }
    b.push_str("<h2>Forced requests</h2>\n");
    let Some(forced) = &o.forced else {
        b.push_str(r#"<p class="note">Forced requests are only shown with the read token, and this collector has none (start <code>cpt serve</code> with <code>--read-token-file</code>).</p>"#);
        return page::html(Tab::Services, "Services", "", &b);
    };
    if forced.is_empty() {
        b.push_str(r#"<p class="empty">No forced requests stored. An operator forces one with <code>cpt force</code>; it appears here as soon as its record arrives.</p>"#);
    } else {
        b.push_str(r#"<table id="forced"><thead><tr><th>request</th><th>service</th><th>endpoint</th><th class="num">latency</th><th>started</th><th>labels</th></tr></thead><tbody>"#);
        for r in forced {
            let id = r
                .request_id
                .as_deref()
                .or(r.trace_id.as_deref())
                .unwrap_or("");
            let link = if id.is_empty() {
                "(no id)".to_owned()
            } else {
                format!(
                    r#"<a href="/ui/request?{}">{}</a>"#,
                    esc(&query::encode([("id", id)])),
                    esc(id)
                )
            };
            let labels = r
                .labels
                .iter()
                .map(|(k, v)| format!("<code>{}={}</code>", esc(k), esc(v)))
                .collect::<Vec<_>>()
                .join(" ");
            let _ = write!(
                b,
                r#"<tr><td>{link}</td><td>{}</td><td>{}</td><td class="num">{}</td><td>{}</td><td>{labels}</td></tr>"#,
                esc(&r.service),
                esc(r.endpoint.as_deref().unwrap_or("")),
                fmt_ns(u64::try_from(r.latency.as_nanos()).unwrap_or(u64::MAX)),
                r.start_unix_nanos.map_or_else(|| "—".into(), ago),
            );
        }
        b.push_str("</tbody></table>\n");
    }
    page::html(Tab::Services, "Services", "", &b)
}
