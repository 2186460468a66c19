//! Zipkin v2 JSON: a list of spans (`POST /api/v2/spans`), or a list of
//! traces (`GET /api/v2/traces`), spans of many traces mixed in any order.
//!
//! - Times are µs since the epoch; `duration` may be absent (zero-length;
//!   a span without `timestamp` is placed by [`crate::traces::model::build`]).
//! - **Shared spans**: a CLIENT and a SERVER record may share one `id`
//!   (Zipkin's B3 "shared span" model). The CLIENT (or kind-less) record
//!   keeps the id; each SERVER record becomes its own span, child of the
//!   client half, with the id `ID#s0`, `ID#s1`, …; other spans naming the
//!   id as parent hang under the first server half. Exact duplicate
//!   server records are dropped, and so is a kind-less record of the id
//!   with the same local endpoint as a typed one (a late-reported part of
//!   that span, Zipkin's span merging).
//! - The clock domain is `localEndpoint.ipv4` / `ipv6`, else its
//!   `serviceName`. A span without a service name is `"unknown"`.

use std::borrow::Cow;
use std::collections::HashMap;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::tags::{TagValue, is_error_tag};
use crate::traces::model::{
    BuildOptions, Interner, RawSpan, Reason, SpanKind, Trace, TraceError, build,
};

#[derive(Deserialize)]
struct ZSpan<'a> {
    #[serde(rename = "traceId", borrow)]
    trace_id: Cow<'a, str>,
    #[serde(borrow)]
    id: Cow<'a, str>,
    #[serde(rename = "parentId", default, borrow)]
    parent_id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(default)]
    timestamp: Option<i64>,
    #[serde(default)]
    duration: Option<i64>,
    #[serde(rename = "localEndpoint", default, borrow)]
    local: Option<Endpoint<'a>>,
    #[serde(default, borrow)]
    tags: Option<HashMap<Cow<'a, str>, TagValue<'a>>>,
}

#[derive(Deserialize)]
struct Endpoint<'a> {
    #[serde(rename = "serviceName", default, borrow)]
    service: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    ipv4: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    ipv6: Option<Cow<'a, str>>,
}

/// Read a Zipkin v2 document into validated traces (in order of first
/// appearance) and the errors of what could not be read.
pub fn read(text: &str, opts: BuildOptions) -> (Vec<Result<Trace, TraceError>>, Vec<TraceError>) {
    let mut errors = Vec::new();
    let items: Vec<&RawValue> = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            return (
                vec![],
                vec![TraceError::new(
                    "#1",
                    Reason::Json(format!("not a Zipkin v2 span list: {e}")),
                )],
            );
        }
    };
    let mut spans: Vec<&RawValue> = Vec::with_capacity(items.len());
    for it in items {
        if it.get().trim_start().starts_with('[') {
            match serde_json::from_str::<Vec<&RawValue>>(it.get()) {
                Ok(v) => spans.extend(v),
                Err(e) => errors.push(TraceError::new("#?", Reason::Json(e.to_string()))),
            }
        } else {
            spans.push(it);
        }
    }
    let mut names = Interner::default();
    let mut order: Vec<String> = Vec::new();
    let mut by_trace: HashMap<String, Vec<ZSpan<'_>>> = HashMap::new();
    let mut bad: HashMap<String, String> = HashMap::new();
    for raw in spans {
        match serde_json::from_str::<ZSpan<'_>>(raw.get()) {
            Ok(s) => {
                let id = s.trace_id.to_ascii_lowercase();
                let v = by_trace.entry(id.clone()).or_insert_with(|| {
                    order.push(id);
                    Vec::new()
                });
                v.push(s);
            }
            Err(e) => {
                let tid = guess(raw.get(), "\"traceId\"");
                match tid {
                    Some(t) => {
                        let t = t.to_ascii_lowercase();
                        if !by_trace.contains_key(&t) {
                            order.push(t.clone());
                            by_trace.insert(t.clone(), Vec::new());
                        }
                        bad.entry(t).or_insert_with(|| e.to_string());
                    }
                    None => errors.push(TraceError::new("<unknown>", Reason::Json(e.to_string()))),
                }
            }
        }
    }
    let mut out = Vec::with_capacity(order.len());
    for tid in order {
        let zs = by_trace.remove(&tid).unwrap_or_default();
        if let Some(e) = bad.remove(&tid) {
            out.push(Err(TraceError::new(tid, Reason::Json(e))));
            continue;
        }
        out.push(convert(&tid, zs, &mut names, opts));
    }
    (out, errors)
}

fn convert(
    tid: &str,
    zs: Vec<ZSpan<'_>>,
    names: &mut Interner,
    opts: BuildOptions,
) -> Result<Trace, TraceError> {
    // Records per id, to untangle shared ids.
    let mut per_id: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, s) in zs.iter().enumerate() {
        per_id.entry(&s.id).or_default().push(i);
    }
    let is_server = |s: &ZSpan<'_>| {
        s.kind
            .as_deref()
            .is_some_and(|k| k.eq_ignore_ascii_case("server"))
    };
    // id -> (new id for the owner record per index, parent override)
    let mut new_id: Vec<Option<String>> = vec![None; zs.len()];
    let mut parent_override: Vec<Option<String>> = vec![None; zs.len()];
    let mut skip = vec![false; zs.len()];
    // Where children naming an id go.
    let mut child_target: HashMap<&str, String> = HashMap::new();
    for (id, idx) in &per_id {
        if idx.len() < 2 {
            continue;
        }
        // A kind-less record with the same local endpoint as another record
        // of the id is a late-reported part of that span (tags, annotations):
        // merge it away.
        for &i in idx.iter() {
            if zs[i].kind.is_none()
                && idx
                    .iter()
                    .any(|&j| j != i && zs[j].kind.is_some() && same_endpoint(&zs[i], &zs[j]))
            {
                skip[i] = true;
            }
        }
        let owner = idx
            .iter()
            .copied()
            .find(|&i| {
                !skip[i]
                    && zs[i]
                        .kind
                        .as_deref()
                        .is_some_and(|k| k.eq_ignore_ascii_case("client"))
            })
            .or_else(|| {
                idx.iter()
                    .copied()
                    .find(|&i| !skip[i] && !is_server(&zs[i]))
            });
        let servers: Vec<usize> = idx
            .iter()
            .copied()
            .filter(|&i| !skip[i] && is_server(&zs[i]))
            .collect();
        let mut kept_servers: Vec<usize> = Vec::new();
        for &si in &servers {
            let dup = kept_servers.iter().any(|&k| same_record(&zs[k], &zs[si]));
            if dup {
                skip[si] = true;
            } else {
                kept_servers.push(si);
            }
        }
        for (k, &si) in kept_servers.iter().enumerate() {
            if owner.is_none() && k == 0 {
                continue; // the first server half keeps the id
            }
            new_id[si] = Some(format!("{id}#s{k}"));
            if owner.is_some() {
                parent_override[si] = Some((*id).to_string());
            }
        }
        if owner.is_some()
            && let Some(&first) = kept_servers.first()
        {
            child_target.insert(id, format!("{id}#s0"));
            let _ = first;
        }
    }
    let mut raw = Vec::with_capacity(zs.len());
    for (i, s) in zs.iter().enumerate() {
        if skip[i] {
            continue;
        }
        let local = s.local.as_ref();
        let service = local
            .and_then(|l| l.service.as_deref())
            .filter(|s| !s.is_empty())
            .unwrap_or("unknown");
        let clock = local
            .and_then(|l| l.ipv4.as_deref().or(l.ipv6.as_deref()))
            .map(|ip| format!("ip:{ip}"))
            .unwrap_or_else(|| format!("service:{service}"));
        let kind = s
            .kind
            .as_deref()
            .map_or(SpanKind::Unspecified, SpanKind::parse_lossy);
        let parent = match &parent_override[i] {
            Some(p) => Some(p.clone()),
            None => s.parent_id.as_deref().map(|p| {
                child_target
                    .get(p)
                    .cloned()
                    .unwrap_or_else(|| p.to_string())
            }),
        };
        let error = s
            .tags
            .as_ref()
            .is_some_and(|t| t.iter().any(|(k, v)| k == "error" || is_error_tag(k, v)));
        raw.push(RawSpan {
            id: new_id[i].clone().unwrap_or_else(|| s.id.to_string()).into(),
            parent_id: parent.map(Into::into),
            service: names.get(service),
            operation: names.get(s.name.as_deref().unwrap_or("")),
            start_ns: s.timestamp.map(|t| t.saturating_mul(1000)),
            duration_ns: s.duration.map(|d| d.saturating_mul(1000)),
            kind,
            clock: names.get(&clock),
            error,
            follows_from: false,
        });
    }
    build(tid, raw, opts)
}

fn same_endpoint(a: &ZSpan<'_>, b: &ZSpan<'_>) -> bool {
    match (&a.local, &b.local) {
        (Some(x), Some(y)) => x.service == y.service && x.ipv4 == y.ipv4 && x.ipv6 == y.ipv6,
        (None, None) => true,
        _ => false,
    }
}

fn same_record(a: &ZSpan<'_>, b: &ZSpan<'_>) -> bool {
    let same_ep = same_endpoint(a, b);
    a.timestamp == b.timestamp
        && a.duration == b.duration
        && a.name == b.name
        && a.parent_id == b.parent_id
        && same_ep
}

/// The string value after `key` in a JSON text, found textually.
pub(crate) fn guess(text: &str, key: &str) -> Option<String> {
    let i = text.find(key)?;
    let rest = &text[i + key.len()..];
    let rest = rest
        .trim_start()
        .strip_prefix(':')?
        .trim_start()
        .strip_prefix('"')?;
    let end = rest.find('"')?;
    Some(rest[..end].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_ids_become_client_and_server_halves() {
        let doc = r#"[
          {"traceId":"t","id":"r","kind":"SERVER","name":"get","timestamp":0,"duration":100,"localEndpoint":{"serviceName":"a","ipv4":"1.1.1.1"}},
          {"traceId":"t","parentId":"r","id":"x","kind":"CLIENT","name":"post","timestamp":10,"duration":80,"localEndpoint":{"serviceName":"a","ipv4":"1.1.1.1"}},
          {"traceId":"t","parentId":"r","id":"x","kind":"SERVER","name":"post","timestamp":20,"duration":60,"localEndpoint":{"serviceName":"b","ipv4":"2.2.2.2"},"shared":true},
          {"traceId":"t","parentId":"x","id":"y","name":"work","timestamp":30,"localEndpoint":{"serviceName":"b","ipv4":"2.2.2.2"}}
        ]"#;
        let (traces, errs) = read(doc, BuildOptions::default());
        assert!(errs.is_empty());
        let t = traces.into_iter().next().unwrap().unwrap();
        let by = |id: &str| t.spans.iter().position(|s| &*s.span_id == id).unwrap();
        let srv = by("x#s0");
        assert_eq!(t.spans[srv].parent, Some(by("x") as u32));
        assert_eq!(t.spans[by("y")].parent, Some(srv as u32));
        assert_eq!(t.spans[by("y")].duration_ns, 0);
        assert_ne!(t.spans[srv].clock, t.spans[by("x")].clock);
    }

    #[test]
    fn a_span_with_a_wrong_type_rejects_only_its_trace() {
        let doc = r#"[
          {"traceId":"t1","id":"a","name":"x","timestamp":0,"duration":5},
          {"traceId":"t2","id":"b","name":"x","timestamp":"soon","duration":5}
        ]"#;
        let (traces, errs) = read(doc, BuildOptions::default());
        assert!(errs.is_empty());
        assert!(traces[0].is_ok());
        let e = traces[1].as_ref().unwrap_err();
        assert_eq!(e.trace_id, "t2");
    }
}
