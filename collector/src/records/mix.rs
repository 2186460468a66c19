//! Noticing a selection that mixes several entry services.

use cpt_sdk::record::Record;
use rustc_hash::{FxHashMap, FxHashSet};

use crate::format::plural;

/// The entry services of the records a selection kept, to warn when there is
/// more than one.
///
/// A record's `service` is the service whose request is the record's root.
/// A profile's total is the mean over its requests, so it should describe one
/// kind of request. The rule:
///
/// - more than one `service` among the selected records is a mix;
/// - a service X whose frames appear on the paths of another selected service
///   Y's records is *internal*: Y calls X, and X's own records are requests
///   it sampled itself (its sampler said yes to a call from Y). Their time is
///   then counted twice, once inside Y's requests and once as X's own
///   requests, and the mean belongs to neither.
#[derive(Debug, Default)]
pub struct EntryServices {
    services: FxHashMap<String, Entry>,
}

#[derive(Debug, Default)]
struct Entry {
    records: u64,
    /// Other services seen in this service's records' frames.
    callees: FxHashSet<String>,
}

impl EntryServices {
    /// Count one selected record.
    pub fn observe(&mut self, r: &Record) {
        let e = match self.services.get_mut(r.service.as_str()) {
            Some(e) => e,
            None => self.services.entry(r.service.clone()).or_default(),
        };
        e.records += 1;
        for f in r.path.frames() {
            if *f.service != *r.service && !e.callees.contains(&*f.service) {
                e.callees.insert(f.service.to_string());
            }
        }
    }

    /// Count `n` selected records of `service` (their frames' services go
    /// to [`EntryServices::observe_callee`]).
    pub fn observe_service(&mut self, service: &str, n: u64) {
        match self.services.get_mut(service) {
            Some(e) => e.records += n,
            None => {
                self.services.entry(service.to_owned()).or_default().records += n;
            }
        }
    }

    /// Note that a frame of `callee` is on a selected record of `service`
    /// (ignored when they are the same service).
    pub fn observe_callee(&mut self, service: &str, callee: &str) {
        if service == callee {
            return;
        }
        let e = match self.services.get_mut(service) {
            Some(e) => e,
            None => self.services.entry(service.to_owned()).or_default(),
        };
        if !e.callees.contains(callee) {
            e.callees.insert(callee.to_owned());
        }
    }

    /// Add what another observer saw.
    pub fn merge(&mut self, other: EntryServices) {
        for (s, e) in other.services {
            let mine = self.services.entry(s).or_default();
            mine.records += e.records;
            mine.callees.extend(e.callees);
        }
    }

    /// The entry services with their record counts, most records first.
    pub fn services(&self) -> Vec<(&str, u64)> {
        let mut v: Vec<(&str, u64)> = self
            .services
            .iter()
            .map(|(s, e)| (s.as_str(), e.records))
            .collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        v
    }

    /// The services that appear on another selected service's paths, each
    /// with one caller, sorted.
    pub fn internal(&self) -> Vec<(&str, &str)> {
        let mut v: Vec<(&str, &str)> = Vec::new();
        for (callee, _) in self.services() {
            let mut callers: Vec<&str> = self
                .services
                .iter()
                .filter(|(s, e)| s.as_str() != callee && e.callees.contains(callee))
                .map(|(s, _)| s.as_str())
                .collect();
            callers.sort_unstable();
            if let Some(c) = callers.first() {
                v.push((callee, c));
            }
        }
        v.sort_unstable();
        v
    }

    /// A warning when the records come from more than one entry service.
    pub fn warning(&self) -> Option<String> {
        let services = self.services();
        if services.len() < 2 {
            return None;
        }
        let list: Vec<String> = services
            .iter()
            .map(|(s, n)| format!("{s} ({})", plural(*n, "record")))
            .collect();
        let internal = self.internal();
        // Suggest the service that is nobody's callee with most records.
        let entry = services
            .iter()
            .find(|(s, _)| !internal.iter().any(|(c, _)| c == s))
            .unwrap_or(&services[0])
            .0;
        let mut msg = format!(
            "the selection mixes {} entry services: {}",
            services.len(),
            list.join(", ")
        );
        if internal.is_empty() {
            msg.push_str(
                "; a profile's mean belongs to one kind of request, so select one with --service NAME",
            );
        } else {
            let named: Vec<String> = internal
                .iter()
                .map(|(callee, caller)| format!("{callee} is called by {caller}"))
                .collect();
            msg.push_str(&format!(
                ". {}: those records are requests an internal service sampled on its own, so \
                 their time is counted twice (inside the caller's requests and as requests of \
                 their own). Select the entry service with --service {entry}",
                named.join(", ")
            ));
        }
        Some(msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cpt_sdk::path::{CriticalPath, Frame, SegmentKind};
    use cpt_sdk::trigger::Trigger;
    use std::time::Duration;

    fn rec(service: &str, frames: &[(&str, &str)]) -> Record {
        let mut p = CriticalPath::new();
        p.push_frames(
            frames.iter().map(|(s, n)| Frame::new(*s, *n)),
            Duration::from_millis(1),
            SegmentKind::Busy,
        );
        Record::new(service, Trigger::Sampled, p)
    }

    #[test]
    fn one_service_is_no_mix() {
        let mut m = EntryServices::default();
        m.observe(&rec("A", &[("A", "a"), ("B", "b")]));
        m.observe(&rec("A", &[("A", "a")]));
        assert_eq!(m.warning(), None);
    }

    #[test]
    fn an_internal_service_sampling_its_own_traffic_is_named() {
        let mut m = EntryServices::default();
        m.observe(&rec("A", &[("A", "a"), ("B", "b")]));
        m.observe(&rec("A", &[("A", "a")]));
        m.observe(&rec("B", &[("B", "b")]));
        assert_eq!(m.internal(), vec![("B", "A")]);
        let w = m.warning().unwrap();
        assert!(w.contains("A (2 records), B (1 record)"), "{w}");
        assert!(w.contains("B is called by A"), "{w}");
        assert!(w.contains("--service A"), "{w}");
    }

    #[test]
    fn unrelated_entry_services_are_a_mix_too() {
        let mut m = EntryServices::default();
        m.observe(&rec("A", &[("A", "a")]));
        m.observe(&rec("C", &[("C", "c")]));
        assert!(m.internal().is_empty());
        assert!(m.warning().unwrap().contains("select one with --service"));
    }
}
