//! The average critical path a page shows: the selection's newest records
//! folded ([`Aggregator`], with per-stack histograms), at most `sample=N`
//! of them ([`DEFAULT_SAMPLE`]; `sample=all` for every one), and kept for
//! a moment so that a page and its flame graph fold once between them.
//!
//! A page must answer in well under a second whatever the store holds;
//! folding every record of a busy service does not (the pprof download,
//! `GET /profile`, still does, for the whole selection). CPT itself builds
//! profiles from a sample ("select a random sample of requests"), and the
//! comparison page's intervals account for the sample's size (Table 2).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use super::page::{PageError, Params};
use crate::profile::aggregate::{Aggregate, Aggregator};
use crate::records::selection::Selection;
use crate::server::store::{Store, StoreError, StoreQuery};

/// Records a page folds unless `sample=` says otherwise.
pub(super) const DEFAULT_SAMPLE: u64 = 5000;
/// Records per batch folded in parallel.
const BATCH: usize = 4096;
/// Folds kept (a page and its graph, a comparison's two arms, a few tabs).
const KEPT: usize = 8;

/// How many of the newest matching records to fold (`None`: all).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Sample(pub(super) Option<u64>);

impl Sample {
    /// `sample=N` or `sample=all` from the query; the default otherwise.
    pub(super) fn from_params(p: &Params) -> Result<Sample, String> {
        match p.get("sample") {
            None => Ok(Sample(Some(DEFAULT_SAMPLE))),
            Some("all") => Ok(Sample(None)),
            Some(n) => n
                .parse::<u64>()
                .ok()
                .filter(|n| *n > 0)
                .map(|n| Sample(Some(n)))
                .ok_or_else(|| {
                    format!("sample={n:?}: expected a positive number of requests, or all")
                }),
        }
    }
}

/// A fold and what it covered.
#[derive(Debug)]
pub(super) struct Folded {
    /// The aggregate of the folded records.
    pub(super) agg: Aggregate,
    /// Records matching the selection (before any percentile band).
    pub(super) matching: u64,
    /// Records folded (the newest of them).
    pub(super) folded: u64,
}

impl Folded {
    /// "newest 5000 of 100000" or "all 37", for the page.
    pub(super) fn coverage(&self) -> String {
        if self.folded < self.matching {
            format!(
                "the newest {} of {} matching requests (<code>sample=all</code> folds every one; the pprof download has them all)",
                self.folded, self.matching
            )
        } else {
            format!("all {} matching requests", self.matching)
        }
    }
}

/// Recent folds by selection, sample and the store's last row id (new
/// records make a new fold).
#[derive(Debug, Default)]
pub(super) struct FoldCache {
    kept: Mutex<VecDeque<(String, Arc<Folded>)>>,
}

/// The fold of `sel`'s newest `sample` records, from the cache when the
/// store has not changed since.
pub(super) fn fold(
    store: &Store,
    cache: &FoldCache,
    sel: &Selection,
    sample: Sample,
) -> Result<Arc<Folded>, PageError> {
    let key = format!(
        "{}|{:?}|{}",
        store.last_row_id()?,
        sample.0,
        super::page::selection_query(sel)
    );
    if let Ok(kept) = cache.kept.lock()
        && let Some((_, f)) = kept.iter().find(|(k, _)| *k == key)
    {
        return Ok(f.clone());
    }
    if sample.0.is_none() {
        let f = fold_all(store, sel)?;
        return Ok(keep(cache, key, f));
    }
    let mut agg = Aggregator::new(sel.clone())
        .with_histograms(true)
        .with_exact_latencies(true);
    // From the packed paths; a store older than them, from its records.
    let (matching, folded) = match store.fold_newest_into(&mut agg, sample.0, BATCH)? {
        Some(counts) => counts,
        None => {
            let q = StoreQuery::from_selection(sel);
            let matching = store.count(&q)?;
            let records = match sample.0 {
                Some(n) => store.query_newest(&q, n)?,
                None => store.query(&q)?,
            };
            let mut buf = Vec::with_capacity(BATCH);
            let mut folded = 0;
            for r in records {
                buf.push(r?);
                folded += 1;
                if buf.len() == BATCH {
                    agg.push_batch(&buf);
                    buf.clear();
                }
            }
            agg.push_batch(&buf);
            (matching, folded)
        }
    };
    Ok(keep(
        cache,
        key,
        Folded {
            agg: agg.finish(),
            matching,
            folded,
        },
    ))
}

fn keep(cache: &FoldCache, key: String, f: Folded) -> Arc<Folded> {
    let f = Arc::new(f);
    if let Ok(mut kept) = cache.kept.lock() {
        kept.push_front((key, f.clone()));
        kept.truncate(KEPT);
    }
    f
}

/// `sample=all`: every matching request, read in one snapshot of the
/// store; with per-stack histograms from the raw records while they are
/// all there, else the roll-ups' answer (without per-stack histograms,
/// which roll-ups do not keep).
fn fold_all(store: &Store, sel: &Selection) -> Result<Folded, PageError> {
    let refused = |e| match e {
        StoreError::BeyondRetention(gap) => PageError::BadQuery(gap.to_string()),
        e => PageError::Store(e),
    };
    let raw = Aggregator::new(sel.clone())
        .with_histograms(true)
        .with_exact_latencies(true);
    let agg = match store.profile(raw, BATCH) {
        Ok((agg, _)) => agg,
        Err(StoreError::BeyondRetention(_)) => {
            store
                .profile(Aggregator::new(sel.clone()), BATCH)
                .map_err(refused)?
                .0
        }
        Err(e) => return Err(PageError::Store(e)),
    };
    let n = agg.requests();
    Ok(Folded {
        agg,
        matching: n,
        folded: n,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_is_a_positive_count_or_all() {
        let p = |q: &str| Sample::from_params(&Params::parse(Some(q)).unwrap());
        assert_eq!(p(""), Ok(Sample(Some(DEFAULT_SAMPLE))));
        assert_eq!(p("sample=all"), Ok(Sample(None)));
        assert_eq!(p("sample=20"), Ok(Sample(Some(20))));
        assert!(p("sample=0").unwrap_err().contains("positive"));
    }
}
