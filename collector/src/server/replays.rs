//! Replayed force credentials, made visible: a forced record carries its
//! credential's nonce ([`NONCE_LABEL`], set by the service that accepted
//! it), and a forced record of another request start with a nonce an
//! earlier one carried is labelled [`REPLAYED_LABEL`] `=true` at ingest,
//! before it is stored. A service refuses a credential it accepted once,
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

use super::store::Store;
use crate::records::selection::{Selection, TriggerFilter};

/// Nonces remembered at most (about 100 bytes each).
pub(super) const CAPACITY: usize = 65_536;

/// The first forced record seen with a nonce.
#[derive(Clone, Copy, Debug)]
struct First {
    start_unix_nanos: Option<u64>,
    /// When it was seen (its start, for those read back from the store),
    /// Unix seconds: forgotten [`MAX_TTL_SECS`] later.
    seen_unix_secs: u64,
}

/// The nonces of recent forced records (see the module docs).
#[derive(Debug, Default)]
pub(super) struct ForcedNonces {
    first: Mutex<HashMap<String, First>>,
}

impl ForcedNonces {
    /// Read back the nonces of the store's forced records of the last
    /// [`MAX_TTL_SECS`]; a store that cannot be read is logged and leaves
    /// the set empty.
    pub(super) fn load(store: &Store) -> ForcedNonces {
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
            super::errlog::error("reading the recent forced records back failed", || {
                format!(
                    "{e} (a replayed force credential is labelled only once seen again after this start)"
                )
            });
        }
        nonces
    }

    /// Label the forced records of `records` whose nonce an earlier record
    /// of another start carried, and remember the new nonces.
    pub(super) fn label(&self, records: &mut [Record]) {
        self.label_at(records, cpt_sdk::force::now_unix_secs());
    }

    fn label_at(&self, records: &mut [Record], now: u64) {
        let mut forced = records
            .iter_mut()
            .filter(|r| r.trigger == Trigger::Forced && r.labels.contains_key(NONCE_LABEL))
            .peekable();
        if forced.peek().is_none() {
            return;
        }
        let mut first = self.lock();
        for r in forced {
            let nonce = &r.labels[NONCE_LABEL];
            let replayed = match first.get(nonce.as_str()) {
                Some(f) => f.start_unix_nanos != r.start_unix_nanos,
                None => {
                    let nonce = nonce.clone();
                    remember(&mut first, &nonce, r.start_unix_nanos, now, now);
                    false
                }
            };
            if replayed {
                r.labels
                    .insert(REPLAYED_LABEL.to_owned(), "true".to_owned());
            }
        }
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
