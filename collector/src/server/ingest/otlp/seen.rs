//! The trace ids of the cpt records received lately: a service instrumented
//! with cpt's layer and OpenTelemetry both is counted once.

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;

use cpt_sdk::Record;

/// Trace ids of the cpt records received lately, by service: an OTLP root
/// of the same service and trace makes no record (the module docs). At most
/// [`CptTraces::CAPACITY`] are remembered, the oldest forgotten first.
#[derive(Debug, Default)]
pub(crate) struct CptTraces {
    seen: Mutex<Seen>,
}

/// (service, trace id) pairs, and the order they came in.
#[derive(Debug, Default)]
struct Seen {
    set: HashSet<(String, String)>,
    order: VecDeque<(String, String)>,
}

impl CptTraces {
    /// How many (service, trace id) pairs are remembered.
    pub(crate) const CAPACITY: usize = 200_000;

    /// Remember the trace ids of cpt records.
    pub(crate) fn note(&self, records: &[Record]) {
        if records.iter().all(|r| r.trace_id.is_none()) {
            return;
        }
        let mut g = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let Seen { set, order } = &mut *g;
        for r in records {
            let Some(t) = &r.trace_id else { continue };
            let key = (r.service.clone(), t.to_ascii_lowercase());
            if set.insert(key.clone()) {
                order.push_back(key);
                if order.len() > Self::CAPACITY
                    && let Some(old) = order.pop_front()
                {
                    set.remove(&old);
                }
            }
        }
    }

    /// Whether a cpt record of `service` carried `trace`.
    pub(crate) fn has(&self, service: &str, trace: Option<&str>) -> bool {
        let Some(t) = trace else { return false };
        let g = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        g.set
            .contains(&(service.to_owned(), t.to_ascii_lowercase()))
    }
}
