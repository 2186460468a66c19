//! Replayed force credentials, made visible: a forced record carries its
//! credential's nonce ([`NONCE_LABEL`], set by the service that accepted
//! it), and of the forced records with one nonce every one but the one
//! that started first is labelled [`REPLAYED_LABEL`] `=true`.
//!
//! Records arrive in the order their requests ended, not started: a long
//! request that used the credential first may arrive after its replay. A
//! record is labelled at ingest, before it is stored, when an earlier-started
//! record with its nonce was seen; when the record that arrives started
//! before the one seen so far, that stored one is the replay, and the
//! writer labels it in the store ([`LaterUse`]) once the arriving batch is
//! committed. (A Parquet file keeps the labels a record was written with.) A service refuses a credential it accepted once,
//! but not one another replica accepted, nor (without a state directory)
//! one it accepted before a restart: this is where such a replay shows.
//!
//! The same record sent again (a retry after a lost acknowledgement, a
//! spool replay) has the same start time and is not a replay. The nonces
//! of the last [`MAX_TTL_SECS`] (the longest a credential lives, so the
//! longest two uses of one can lie apart) are kept, at most [`CAPACITY`];
//! when the collector starts they are read back from the store's forced
//! records of that window.

use std::collections::HashMap;
use std::sync::Mutex;

use cpt_sdk::force::{MAX_TTL_SECS, NONCE_LABEL, REPLAYED_LABEL};
use cpt_sdk::{Record, Trigger};

use crate::records::selection::{Selection, TriggerFilter};
use crate::server::store::Store;

/// Nonces remembered at most (about 100 bytes each).
pub(in crate::server) const CAPACITY: usize = 65_536;

/// The first forced record seen with a nonce.
#[derive(Clone, Copy, Debug)]
struct First {
    start_unix_nanos: Option<u64>,
    /// When it was seen (its start, for those read back from the store),
    /// Unix seconds: forgotten [`MAX_TTL_SECS`] later.
    seen_unix_secs: u64,
}

/// A stored forced record that turned out to be a replay: one with its
/// nonce that started earlier arrived after it (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(in crate::server) struct LaterUse {
    pub(in crate::server) nonce: String,
    pub(in crate::server) start_unix_nanos: u64,
}

/// The nonces of recent forced records (see the module docs).
#[derive(Debug, Default)]
pub(in crate::server) struct ForcedNonces {
    first: Mutex<HashMap<String, First>>,
}

impl ForcedNonces {
    /// Read back the nonces of the store's forced records of the last
    /// [`MAX_TTL_SECS`]; a store that cannot be read is logged and leaves
    /// the set empty.
    pub(in crate::server) fn load(store: &Store) -> ForcedNonces {
        let nonces = ForcedNonces::default();
        let now = cpt_sdk::force::now_unix_secs();
        let since = now
            .saturating_sub(MAX_TTL_SECS)
            .saturating_mul(1_000_000_000);
        let sel = Selection::new()
            .with_triggers(TriggerFilter::Forced)
            .with_since(since);
        let read = store.records(&sel).and_then(|records| {
            let mut first = nonces.lock();
            for r in records {
                let r = r?;
                if let Some(nonce) = r.labels.get(NONCE_LABEL) {
                    let seen = r.start_unix_nanos.map_or(now, |s| s / 1_000_000_000);
                    remember(&mut first, nonce, r.start_unix_nanos, seen, now);
                }
            }
            Ok(())
        });
        if let Err(e) = read {
            crate::server::operations::errlog::error(
                "reading the recent forced records back failed",
                || {
                    format!(
                        "{e} (a replayed force credential is labelled only once seen again after this start)"
                    )
                },
            );
        }
        nonces
    }

    /// Label the forced records of `records` whose nonce a record that
    /// started earlier carried, and remember the new nonces; returns the
    /// stored records that these records show to be replays.
    pub(in crate::server) fn label(&self, records: &mut [Record]) -> Vec<LaterUse> {
        self.label_at(records, cpt_sdk::force::now_unix_secs())
    }

    fn label_at(&self, records: &mut [Record], now: u64) -> Vec<LaterUse> {
        let mut forced: Vec<&mut Record> = records
            .iter_mut()
            .filter(|r| r.trigger == Trigger::Forced && r.labels.contains_key(NONCE_LABEL))
            .collect();
        let mut later_uses = Vec::new();
        if forced.is_empty() {
            return later_uses;
        }
        // In the order they started (a record without a start last), so
        // that of one batch's uses of a nonce the first is the original.
        forced.sort_by_key(|r| (r.start_unix_nanos.is_none(), r.start_unix_nanos));
        let mut first = self.lock();
        for r in forced {
            let nonce = r.labels[NONCE_LABEL].clone();
            let replayed = match first.get_mut(nonce.as_str()) {
                Some(f) => match (f.start_unix_nanos, r.start_unix_nanos) {
                    // Started before the one seen so far: that one is the replay.
                    (Some(seen), Some(start)) if start < seen => {
                        later_uses.push(LaterUse {
                            nonce: nonce.clone(),
                            start_unix_nanos: seen,
                        });
                        f.start_unix_nanos = Some(start);
                        false
                    }
                    (seen, start) => seen != start,
                },
                None => {
                    remember(&mut first, &nonce, r.start_unix_nanos, now, now);
                    false
                }
            };
            if replayed {
                r.labels
                    .insert(REPLAYED_LABEL.to_owned(), "true".to_owned());
            }
        }
        later_uses
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, First>> {
        self.first
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Note the first record with `nonce`, forgetting what is older than the
/// window when full (and not noting it when still full).
fn remember(
    first: &mut HashMap<String, First>,
    nonce: &str,
    start_unix_nanos: Option<u64>,
    seen_unix_secs: u64,
    now: u64,
) {
    if first.contains_key(nonce) {
        return;
    }
    if first.len() >= CAPACITY {
        let oldest = now.saturating_sub(MAX_TTL_SECS);
        first.retain(|_, f| f.seen_unix_secs >= oldest);
        if first.len() >= CAPACITY {
            return;
        }
    }
    first.insert(
        nonce.to_owned(),
        First {
            start_unix_nanos,
            seen_unix_secs,
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use cpt_sdk::path::CriticalPath;

    const NOW: u64 = 1_800_000_000;

    fn forced(nonce: Option<&str>, start: u64) -> Record {
        let mut r = Record::new("A", Trigger::Forced, CriticalPath::new());
        r.start_unix_nanos = Some(start);
        if let Some(n) = nonce {
            r.labels.insert(NONCE_LABEL.into(), n.into());
        }
        r
    }

    fn replayed(r: &Record) -> bool {
        r.labels.get(REPLAYED_LABEL).map(String::as_str) == Some("true")
    }

    #[rustfmt::skip]
    #[test]
    fn a_second_forced_record_with_a_nonce_is_labelled_replayed() {
        let n = ForcedNonces::default();
        // (case, records of one batch, which are labelled)
        type Case<'a> = (&'a str, Vec<Record>, Vec<bool>);
        let cases: Vec<Case<'_>> = vec![
            ("first use",              vec![forced(Some("n1"), 10)],                          vec![false]),
            ("the same record resent", vec![forced(Some("n1"), 10)],                          vec![false]),
            ("a replay",               vec![forced(Some("n1"), 20)],                          vec![true]),
            ("two uses in one batch",  vec![forced(Some("n2"), 10), forced(Some("n2"), 30)],  vec![false, true]),
            ("the later first",        vec![forced(Some("n3"), 30), forced(Some("n3"), 10)],  vec![true, false]),
            ("no nonce",               vec![forced(None, 10), forced(None, 40)],              vec![false, false]),
        ];
        for (name, mut records, want) in cases {
            n.label_at(&mut records, NOW);
            let got: Vec<bool> = records.iter().map(replayed).collect();
            assert_eq!(got, want, "{name}");
        }
        // A sampled record never is.
        let mut s = forced(Some("n1"), 50);
        s.trigger = Trigger::Sampled;
        let mut records = vec![s];
        n.label_at(&mut records, NOW);
        assert!(!replayed(&records[0]));
    }

    #[test]
    fn a_record_that_started_first_but_arrived_later_marks_the_stored_one_replayed() {
        let n = ForcedNonces::default();
        // The replay (started at 20) arrives first and is stored unlabelled.
        let mut replay = vec![forced(Some("n1"), 20)];
        assert_eq!(n.label_at(&mut replay, NOW), vec![]);
        assert!(!replayed(&replay[0]));
        // The original (started at 10) arrives later: it is not labelled,
        // the stored record of 20 is.
        let mut original = vec![forced(Some("n1"), 10)];
        let later = n.label_at(&mut original, NOW);
        assert!(!replayed(&original[0]));
        let want = LaterUse {
            nonce: "n1".into(),
            start_unix_nanos: 20,
        };
        assert_eq!(later, vec![want]);
        // Another use, between the two, is a replay of the original.
        let mut between = vec![forced(Some("n1"), 15)];
        assert_eq!(n.label_at(&mut between, NOW), vec![]);
        assert!(replayed(&between[0]));
    }

    #[test]
    fn nonces_older_than_a_credential_lives_make_room_when_full() {
        let mut first = HashMap::new();
        for i in 0..CAPACITY {
            remember(&mut first, &format!("old-{i}"), Some(1), NOW, NOW);
        }
        remember(&mut first, "refused", Some(1), NOW, NOW);
        assert!(!first.contains_key("refused"), "full of live nonces");
        let later = NOW + MAX_TTL_SECS + 1;
        remember(&mut first, "new", Some(1), later, later);
        assert_eq!(first.len(), 1);
        assert!(first.contains_key("new"));
    }
}
