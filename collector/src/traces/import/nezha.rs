//! The span CSV of the Nezha data sets (Yu et al., FSE'23; OpenTelemetry
//! traces of Online Boutique and TrainTicket exported one row per span):
//!
//! ```text
//! TraceID,SpanID,ParentID,PodName,OperationName,StartTimeUnixNano,EndTimeUnixNano,Duration
//! ```
//!
//! `ParentID` is `root` for the root span. The service is the Kubernetes pod
//! name without its ReplicaSet hash and pod suffix (`frontend-579b9bff58-t2dbm`
//! → `frontend`); the pod is the clock domain. Times are ns since the epoch
//! (`Duration`, in µs, is ignored: the end time is exact). There are no span
//! kinds, so no client/server shift applies, only CRISP's truncation.
//! Identical duplicate rows (traces straddling two minute files repeat) are
//! dropped by [`crate::traces::model::build`]; rows of one trace may be anywhere in
//! the file.

use std::collections::HashMap;

use crate::traces::model::{
    BuildOptions, Interner, RawSpan, Reason, SpanKind, TimeUnit, Trace, TraceError, build,
    span_start_end,
};

const HEADER: &str =
    "TraceID,SpanID,ParentID,PodName,OperationName,StartTimeUnixNano,EndTimeUnixNano";

/// The service of a Kubernetes pod name: without the last two `-` parts
/// when there are at least three (Deployment pods), else unchanged.
pub fn service_of_pod(pod: &str) -> &str {
    let parts: Vec<&str> = pod.rsplitn(3, '-').collect();
    if parts.len() == 3 && !parts[2].is_empty() && parts[0].len() == 5 && parts[1].len() >= 6 {
        parts[2]
    } else {
        pod
    }
}

/// Read a Nezha span CSV into validated traces (in order of first
/// appearance) and the errors of rows that could not be read.
pub fn read(text: &str, opts: BuildOptions) -> (Vec<Result<Trace, TraceError>>, Vec<TraceError>) {
    let mut errors = Vec::new();
    let mut lines = text.lines().enumerate();
    match lines.next() {
        Some((_, h)) if h.trim_start_matches('\u{feff}').starts_with(HEADER) => {}
        Some((_, h)) => {
            return (
                vec![],
                vec![TraceError::new(
                    "line 1",
                    Reason::Json(format!(
                        "not a Nezha span CSV: header {h:?}, expected {HEADER:?},Duration"
                    )),
                )],
            );
        }
        None => return (vec![], vec![]),
    }
    let mut names = Interner::default();
    let mut order: Vec<&str> = Vec::new();
    let mut by_trace: HashMap<&str, Vec<RawSpan<'_>>> = HashMap::new();
    let mut bad: HashMap<&str, Reason> = HashMap::new();
    for (n, line) in lines {
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').collect();
        if f.len() < 7 {
            errors.push(TraceError::new(
                format!("line {}", n + 1),
                Reason::Json(format!("{} fields, expected 8", f.len())),
            ));
            continue;
        }
        let tid = f[0];
        let v = by_trace.entry(tid).or_insert_with(|| {
            order.push(tid);
            Vec::new()
        });
        let (Ok(start), Ok(end)) = (f[5].trim().parse::<i128>(), f[6].trim().parse::<i128>())
        else {
            bad.entry(tid).or_insert_with(|| {
                Reason::Json(format!(
                    "line {}: times {:?} / {:?} are not integers",
                    n + 1,
                    f[5],
                    f[6]
                ))
            });
            continue;
        };
        let (start, duration) = match span_start_end(
            f[1],
            ("StartTimeUnixNano", start),
            ("EndTimeUnixNano", end),
            TimeUnit::Nanos,
        ) {
            Ok(t) => t,
            Err(r) => {
                bad.entry(tid).or_insert(r);
                continue;
            }
        };
        let pod = f[3];
        v.push(RawSpan {
            id: f[1].into(),
            parent_id: (f[2] != "root" && !f[2].is_empty()).then(|| f[2].into()),
            service: names.get(service_of_pod(pod)),
            operation: names.get(f[4]),
            start_ns: Some(start),
            duration_ns: Some(duration),
            kind: SpanKind::Unspecified,
            clock: names.get_joined("pod:", pod, ""),
            error: false,
            follows_from: false,
        });
    }
    let out = order
        .into_iter()
        .map(|tid| {
            let spans = by_trace.remove(tid).unwrap_or_default();
            match bad.remove(tid) {
                Some(e) => Err(TraceError::new(tid, e)),
                None => build(tid, spans, opts),
            }
        })
        .collect();
    (out, errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_map_to_services() {
        assert_eq!(service_of_pod("frontend-579b9bff58-t2dbm"), "frontend");
        assert_eq!(
            service_of_pod("ts-order-service-5b67c48447-mv5hb"),
            "ts-order-service"
        );
        assert_eq!(service_of_pod("redis-0"), "redis-0");
    }

    #[test]
    fn rows_of_a_trace_are_grouped_and_duplicates_dropped() {
        let csv = "TraceID,SpanID,ParentID,PodName,OperationName,StartTimeUnixNano,EndTimeUnixNano,Duration\n\
                   t1,a,root,frontend-579b9bff58-t2dbm,Recv.,1000,5000,4\n\
                   t2,x,root,frontend-579b9bff58-t2dbm,Recv.,1000,2000,1\n\
                   t1,b,a,cart-6d7b8c9d5f-abcde,GetCart,2000,3000,1\n\
                   t1,b,a,cart-6d7b8c9d5f-abcde,GetCart,2000,3000,1\n";
        let (traces, errs) = read(csv, BuildOptions::default());
        assert!(errs.is_empty());
        let t1 = traces[0].as_ref().unwrap();
        assert_eq!((t1.spans.len(), t1.duplicates_dropped), (2, 1));
        assert_eq!(&*t1.spans[1].service, "cart");
        assert_eq!(traces.len(), 2);
    }
}
