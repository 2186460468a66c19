//! Reading a store: record streams and the folds of profiles and pages.

use std::sync::mpsc;
use std::thread;

use cpt_sdk::Record;

use crate::profile::aggregate::Aggregator;
use crate::profile::aggregate::packed::{PackedFrames, PackedRow};
use crate::records::EntryServices;
use crate::records::selection::Selection;

use super::paths::{self, PATHS_VERSION};
use super::query::read_rows;
use super::snapshot::Snapshot;
use super::{ID_INDEX_VERSION, READ_AHEAD, Records, Store, StoreError, StoreQuery};

impl Store {
    /// The records that may match a profile [`Selection`]: service,
    /// endpoint, time range, trigger and labels are pushed down into SQL;
    /// the percentile band is left to the caller (it needs the whole
    /// selection). Records come in insertion order, so percentile ties break
    /// the same way on every run.
    ///
    /// # Errors
    ///
    /// As [`Store::query`].
    pub fn records(&self, sel: &Selection) -> Result<Records, StoreError> {
        self.query(&StoreQuery::from_selection(sel))
    }

    /// Hand the records that may match `sel` (as [`Store::records`]) to `f`
    /// in batches of at most `batch` records; returns how many were read.
    /// The one loop `cpt profile --store` and the collector's `GET /profile`
    /// both read a store with.
    ///
    /// # Errors
    ///
    /// The first error reading the store; batches before it were handed
    /// over, nothing after it is.
    pub fn for_each_batch(
        &self,
        sel: &Selection,
        batch: usize,
        mut f: impl FnMut(&[Record]),
    ) -> Result<u64, StoreError> {
        let batch = batch.max(1);
        let mut buf = Vec::with_capacity(batch);
        let mut n = 0;
        for r in self.records(sel)? {
            buf.push(r?);
            n += 1;
            if buf.len() == batch {
                f(&buf);
                buf.clear();
            }
        }
        if !buf.is_empty() {
            f(&buf);
        }
        Ok(n)
    }

    /// Hand the stored records that match `sel` (every filter but the
    /// percentile band, applied in SQL) to `f` in their packed form, in
    /// insertion order, in batches of at most `batch` rows, with the frames
    /// table they point into; returns how many were read. The records are
    /// those committed when the call began, read in short snapshots (see the
    /// module docs), on a reader thread one batch ahead of `f`.
    ///
    /// `Ok(None)` without calling `f` when the store predates the profile
    /// tables (schema version 4) and was opened read-only: read it with
    /// [`Store::for_each_batch`] instead.
    ///
    /// # Errors
    ///
    /// As [`Store::query`]; batches before an error were handed over.
    pub fn for_each_packed(
        &self,
        sel: &Selection,
        batch: usize,
        f: impl FnMut(&[PackedRow], &PackedFrames),
    ) -> Result<Option<u64>, StoreError> {
        if self.version < PATHS_VERSION {
            return Ok(None);
        }
        self.for_each_packed_after(None, &StoreQuery::from_selection(sel), (0, None), batch, f)
            .map(Some)
    }

    /// [`for_each_packed`](Self::for_each_packed) of `query`'s rows with an
    /// id above `ids.0` and at most `ids.1`, on a store with the profile
    /// tables: read in `snap` when given (one snapshot for a whole answer),
    /// else on a connection of the reader's own in short snapshots.
    pub(super) fn for_each_packed_after(
        &self,
        snap: Option<&mut Snapshot>,
        query: &StoreQuery,
        (after, upto): (i64, Option<i64>),
        batch: usize,
        mut f: impl FnMut(&[PackedRow], &PackedFrames),
    ) -> Result<u64, StoreError> {
        if query.by_id() && self.version < ID_INDEX_VERSION {
            return Err(StoreError::NoIdIndex {
                path: self.path.clone(),
                found: self.version,
            });
        }
        let path = self.path.clone();
        let (tx, rx) = mpsc::sync_channel(1);
        let rows = batch.max(1);
        let ids = self.id_index();
        thread::scope(|s| {
            let reader = thread::Builder::new()
                .name("cpt-store-reader".into())
                .spawn_scoped(s, move || match snap {
                    Some(snap) => paths::read_packed_on(
                        snap.conn(),
                        &path,
                        query,
                        ids,
                        (after, upto),
                        rows,
                        &tx,
                    ),
                    None => paths::read_packed(&path, query, ids, (after, upto), rows, &tx),
                })
                .map_err(|e| StoreError::Sqlite {
                    path: self.path.clone(),
                    context: "start reader thread",
                    source: rusqlite::Error::ToSqlConversionFailure(Box::new(e)),
                })?;
            let mut frames = PackedFrames::new();
            let mut n = 0;
            let mut result = Ok(());
            for chunk in rx.iter() {
                match chunk {
                    Ok((rows, new)) => {
                        for (id, frame) in new {
                            frames.insert(id, frame);
                        }
                        n += rows.len() as u64;
                        if !rows.is_empty() {
                            f(&rows, &frames);
                        }
                    }
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                }
            }
            drop(rx);
            let _ = reader.join();
            result.map(|()| n)
        })
    }

    /// Fold the newest `newest` stored records matching `agg`'s selection
    /// (every one with `None`) into it, from the packed paths: what the
    /// collector's pages show. The percentile band applies among the
    /// records folded. Returns how many records match the selection (before
    /// the band) and how many were folded, or `None` for a store that
    /// predates the profile tables (schema version 4), opened read-only.
    ///
    /// # Errors
    ///
    /// As [`fold_into`](Self::fold_into).
    pub fn fold_newest_into(
        &self,
        agg: &mut Aggregator,
        newest: Option<u64>,
        batch: usize,
    ) -> Result<Option<(u64, u64)>, StoreError> {
        if self.version < PATHS_VERSION {
            return Ok(None);
        }
        let query = StoreQuery::from_selection(agg.selection());
        // The count and the records counted from one snapshot.
        let mut snap = Snapshot::begin(&self.path)?;
        let (matching, after) = paths::count_newest(snap.conn(), &query, self.id_index(), newest)
            .map_err(snap.sqlite("find the newest records"))?;
        let folded = self.fold_packed_after(
            Some(&mut snap),
            agg,
            &query,
            (after, None),
            batch,
            None,
            &mut |_| {},
        )?;
        Ok(Some((matching, folded)))
    }

    /// Fold `query`'s packed rows with an id in `ids` (above `ids.0`, at most
    /// `ids.1`) into `agg`, read in `snap` when given,
    /// showing selected records to `mix` and each batch's size to
    /// `progress`; a path that does not decode is [`StoreError::Corrupt`].
    #[allow(clippy::too_many_arguments)]
    pub(super) fn fold_packed_after(
        &self,
        snap: Option<&mut Snapshot>,
        agg: &mut Aggregator,
        query: &StoreQuery,
        ids: (i64, Option<i64>),
        batch: usize,
        mut mix: Option<&mut EntryServices>,
        progress: &mut dyn FnMut(u64),
    ) -> Result<u64, StoreError> {
        let mut failed = None;
        let n = self.for_each_packed_after(snap, query, ids, batch, |rows, frames| {
            progress(rows.len() as u64);
            if failed.is_none()
                && let Err(e) = agg.push_packed(rows, frames, mix.as_deref_mut())
            {
                failed = Some(e);
            }
        })?;
        match failed {
            Some(e) => Err(StoreError::Corrupt {
                path: self.path.clone(),
                id: e.id,
                reason: e.reason,
            }),
            None => Ok(n),
        }
    }

    /// Fold the stored records that `agg`'s selection keeps into it (the
    /// one read `cpt profile --store` and the collector's `GET /profile`
    /// share): from the packed paths ([`Store::for_each_packed`]), or from
    /// the JSON of a store that predates them. Selected records are shown to
    /// `mix` when given. Returns the records read.
    ///
    /// # Errors
    ///
    /// As [`Store::query`], or a packed path that does not decode
    /// ([`StoreError::Corrupt`]).
    pub fn fold_into(
        &self,
        agg: &mut Aggregator,
        batch: usize,
        mix: Option<&mut EntryServices>,
    ) -> Result<u64, StoreError> {
        self.fold_into_reporting(agg, batch, mix, &mut |_| {})
    }

    /// [`fold_into`](Self::fold_into), telling `progress` how many records
    /// each batch held as it is folded (for a progress bar).
    ///
    /// # Errors
    ///
    /// As [`fold_into`](Self::fold_into).
    pub fn fold_into_reporting(
        &self,
        agg: &mut Aggregator,
        batch: usize,
        mut mix: Option<&mut EntryServices>,
        progress: &mut dyn FnMut(u64),
    ) -> Result<u64, StoreError> {
        let sel = agg.selection().clone();
        if self.version >= PATHS_VERSION {
            let query = StoreQuery::from_selection(&sel);
            let mut snap = Snapshot::begin(&self.path)?;
            return self.fold_packed_after(
                Some(&mut snap),
                agg,
                &query,
                (0, None),
                batch,
                mix,
                progress,
            );
        }
        self.for_each_batch(&sel, batch, |records| {
            progress(records.len() as u64);
            if let Some(m) = mix.as_deref_mut() {
                for r in records.iter().filter(|r| sel.matches(r)) {
                    m.observe(r);
                }
            }
            agg.push_batch(records);
        })
    }

    /// Stream the records matching `query`, oldest insert first.
    ///
    /// The query runs on a reader thread with its own read-only connection
    /// and a consistent snapshot; at most a small fixed number of records
    /// are buffered. Dropping the iterator stops the reader.
    ///
    /// # Errors
    ///
    /// When the query cannot be prepared; later failures (including a
    /// stored record that no longer parses) are items of the iterator.
    pub fn query(&self, query: &StoreQuery) -> Result<Records, StoreError> {
        if query.by_id() && self.version < ID_INDEX_VERSION {
            return Err(StoreError::NoIdIndex {
                path: self.path.clone(),
                found: self.version,
            });
        }
        let (sql, params) = query.sql(true, self.id_index());
        // Prepare here so a bad query fails now, not on the first item.
        self.conn
            .prepare(&sql)
            .map_err(self.sqlite("prepare query"))?;
        self.spawn_reader(sql, params, 0, query.limit)
    }

    /// Stream the records `sql` selects (ids above `after`, at most
    /// `limit`) from a reader thread with its own connection.
    pub(super) fn spawn_reader(
        &self,
        sql: String,
        params: Vec<rusqlite::types::Value>,
        after: i64,
        limit: Option<u64>,
    ) -> Result<Records, StoreError> {
        let path = self.path.clone();
        let (tx, rx) = mpsc::sync_channel(READ_AHEAD);
        let reader = thread::Builder::new()
            .name("cpt-store-reader".into())
            .spawn(move || read_rows(&path, &sql, params, after, limit, &tx))
            .map_err(|e| StoreError::Sqlite {
                path: self.path.clone(),
                context: "start reader thread",
                source: rusqlite::Error::ToSqlConversionFailure(Box::new(e)),
            })?;
        Ok(Records {
            rx,
            _reader: reader,
        })
    }
}
