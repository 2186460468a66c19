//! Writing batches: [`EncodedBatch`] (serialized off the writer thread) and
//! the group commit ([`Store::insert_group_then`]).

use cpt_sdk::Record;
use rusqlite::TransactionBehavior;

use super::paths::{self, FrameIds, PackedPath, PathRow};
use super::retention::unix_nanos;
use super::rollup::State;
use super::rollup::pass::{Key, add_rows, period_of};
use super::{Store, StoreError, to_i64};
use crate::profile::aggregate::packed::{PackedFrames, PackedRow};

/// A batch id already committed is ignored (`changes() == 0`).
const INSERT_BATCH_ID: &str =
    "INSERT OR IGNORE INTO batches (id, records, committed_unix_ms) VALUES (?1, ?2, ?3)";

/// Ids are given by the writer (see [`State::last_id`]): SQLite's own
/// choice (one past the highest) would hand out again the id of a newest
/// record that retention deleted, below what the roll-ups already hold.
const INSERT: &str = "INSERT INTO records \
    (service, endpoint, start_unix_nanos, latency_ns, trigger, labels, record, request_id, trace_id, id) \
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)";

/// OTLP spans held until their trace is complete: one row per trace and
/// request (`cpt serve --otlp-*`).
const INSERT_HELD: &str = "INSERT INTO otlp_spans (trace_id, spans) VALUES (?1, ?2)";
/// A completed trace's held spans go in the transaction that stores its
/// records.
const DELETE_HELD: &str = "DELETE FROM otlp_spans WHERE trace_id = ?1";

/// One record ready for insertion: its indexed columns and its JSON form.
#[derive(Clone, Debug)]
struct Row {
    service: String,
    endpoint: Option<String>,
    start_unix_nanos: Option<i64>,
    latency_ns: i64,
    trigger: &'static str,
    labels: String,
    record: String,
    request_id: Option<String>,
    trace_id: Option<String>,
    path: PackedPath,
}

impl Row {
    fn bytes(&self) -> usize {
        self.service.len()
            + self.endpoint.as_ref().map_or(0, String::len)
            + self.labels.len()
            + self.record.len()
            + self.request_id.as_ref().map_or(0, String::len)
            + self.trace_id.as_ref().map_or(0, String::len)
            + self.path.packed.len()
            + 64
    }
}

/// A batch serialized for the store, so the (single) writer only runs SQL.
#[derive(Clone, Debug, Default)]
pub struct EncodedBatch {
    rows: Vec<Row>,
    batch_id: Option<String>,
    /// What the rows' columns hold, about what the batch adds to the pages.
    bytes: usize,
    /// OTLP spans to hold: `(trace id, spans)` rows of `otlp_spans`.
    held: Vec<(String, Vec<u8>)>,
    /// Traces whose held spans are deleted (completed: their records are
    /// in this batch or were dropped for a counted reason).
    released: Vec<String>,
}

impl EncodedBatch {
    /// Serialize `records`.
    pub fn new(records: &[Record]) -> EncodedBatch {
        let rows: Vec<Row> = records
            .iter()
            .map(|r| Row {
                service: r.service.clone(),
                endpoint: r.endpoint.clone(),
                start_unix_nanos: r.start_unix_nanos.map(to_i64),
                latency_ns: to_i64(u64::try_from(r.latency.as_nanos()).unwrap_or(u64::MAX)),
                trigger: r.trigger.as_str(),
                labels: serde_json::to_string(&r.labels)
                    .expect("string labels always serialize; this is a bug"),
                record: r.to_json(),
                request_id: r.request_id.clone(),
                trace_id: r.trace_id.as_deref().map(str::to_ascii_lowercase),
                path: PackedPath::new(&r.path),
            })
            .collect();
        let bytes = rows.iter().map(Row::bytes).sum();
        EncodedBatch {
            rows,
            batch_id: None,
            bytes,
            held: Vec::new(),
            released: Vec::new(),
        }
    }

    /// Hold these OTLP spans in the same savepoint as the records: `(trace
    /// id, spans)` rows that [`Store::held_spans`] reads back after a
    /// restart.
    #[must_use]
    pub fn with_held_spans(mut self, held: Vec<(String, Vec<u8>)>) -> EncodedBatch {
        self.bytes += held
            .iter()
            .map(|(t, s)| t.len() + s.len() + 16)
            .sum::<usize>();
        self.held = held;
        self
    }

    /// Delete the held OTLP spans of these traces in the same savepoint as
    /// the records (the traces were completed).
    #[must_use]
    pub fn with_released_traces(mut self, released: Vec<String>) -> EncodedBatch {
        self.released = released;
        self
    }

    /// Tag the batch with the id its sender gave it: the store keeps the
    /// records of the first batch with this id and ignores later ones (see
    /// the module docs, schema version 3).
    #[must_use]
    pub fn with_batch_id(mut self, id: Option<String>) -> EncodedBatch {
        self.batch_id = id;
        self
    }

    /// The sender's batch id, if any.
    pub fn batch_id(&self) -> Option<&str> {
        self.batch_id.as_deref()
    }

    /// The number of records.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Each record's service and trace id (lowercase), if it has one.
    pub(crate) fn requests(&self) -> impl Iterator<Item = Option<(&str, &str)>> {
        self.rows
            .iter()
            .map(|r| r.trace_id.as_deref().map(|t| (r.service.as_str(), t)))
    }

    /// Keep only the records whose `keep` is true (in record order).
    pub(crate) fn keep_rows(&mut self, keep: &[bool]) {
        let mut keep = keep.iter();
        self.rows.retain(|_| keep.next().copied().unwrap_or(true));
        self.bytes = self.rows.iter().map(Row::bytes).sum::<usize>()
            + self
                .held
                .iter()
                .map(|(t, s)| t.len() + s.len() + 16)
                .sum::<usize>();
    }

    /// True when the batch has no records.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// About how many bytes the batch adds to the store (and to the WAL
    /// when it commits): what its columns hold.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Store {
    /// Store `records` in one transaction: all of them or, on error, none.
    /// Returns once the transaction has committed (see the module docs on
    /// durability).
    ///
    /// # Errors
    ///
    /// When SQLite fails; then nothing of the batch is stored.
    pub fn insert(&mut self, records: &[Record]) -> Result<u64, StoreError> {
        self.insert_encoded(&EncodedBatch::new(records))
    }

    /// [`Store::insert`] for a batch serialized beforehand.
    ///
    /// # Errors
    ///
    /// As [`Store::insert`].
    pub fn insert_encoded(&mut self, batch: &EncodedBatch) -> Result<u64, StoreError> {
        let mut results = self.insert_group(&[batch])?;
        results.pop().expect("one result per batch; this is a bug")
    }

    /// Store several batches in one transaction (one fsync), each batch
    /// all-or-nothing within it (a savepoint per batch). The outer `Err`
    /// means the commit itself failed and nothing was stored; otherwise each
    /// batch has its own result, and every `Ok` batch is durable. A batch
    /// whose [batch id](EncodedBatch::with_batch_id) was committed before
    /// (in this call or an earlier one) stores nothing and answers `Ok(0)`.
    ///
    /// # Errors
    ///
    /// When the transaction cannot begin or commit.
    pub fn insert_group(
        &mut self,
        batches: &[&EncodedBatch],
    ) -> Result<Vec<Result<u64, StoreError>>, StoreError> {
        self.insert_group_then(batches, |_| Ok(()))
    }

    /// [`insert_group`](Self::insert_group), calling `before_commit` with
    /// each batch's result once every batch is in the transaction and before
    /// it commits (`Ok(0)`: a batch id committed before). When it fails,
    /// nothing is committed, batch ids included, and its error is returned:
    /// `cpt serve --parquet-dir` writes the new batches' Parquet files there,
    /// so a batch is never in the store (and its id never marked as seen)
    /// without its file.
    ///
    /// # Errors
    ///
    /// When the transaction cannot begin or commit, or `before_commit` fails.
    pub fn insert_group_then(
        &mut self,
        batches: &[&EncodedBatch],
        before_commit: impl FnOnce(&[Result<u64, StoreError>]) -> Result<(), StoreError>,
    ) -> Result<Vec<Result<u64, StoreError>>, StoreError> {
        self.keep_wal_short();
        let path = self.path.clone();
        let sqlite = |context| {
            let path = path.clone();
            move |source| StoreError::Sqlite {
                path,
                context,
                source,
            }
        };
        let mut tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sqlite("begin transaction"))?;
        let frames = self.frames.get_or_insert_with(FrameIds::default);
        let mut state = State::read(&tx).map_err(sqlite("read the store's state"))?;
        let max_id: i64 = tx
            .query_row("SELECT coalesce(max(id), 0) FROM records", [], |r| r.get(0))
            .map_err(sqlite("read the last record id"))?;
        let mut next_id = state.last_id.max(max_id) + 1;
        let now = std::time::SystemTime::now();
        let too_old_before = self.retention.retain_for.map(|d| {
            unix_nanos(now).saturating_sub(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        });
        let hourly_before =
            (unix_nanos(now) / 1_000_000_000).saturating_sub(self.retention.hourly_for.as_secs());
        // Frames added to the table in this transaction: forgotten again
        // when their insert is rolled back.
        let mut group_added: Vec<cpt_sdk::Frame> = Vec::new();
        let mut scratch = Default::default();
        let mut results = Vec::with_capacity(batches.len());
        for batch in batches {
            let sp = tx.savepoint().map_err(sqlite("begin savepoint"))?;
            let mut added = Vec::new();
            let mut too_old = (0u64, None::<u64>, 0u64);
            let inserted = (|| {
                if let Some(id) = &batch.batch_id {
                    let now_ms = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
                    let new = sp
                        .prepare_cached(INSERT_BATCH_ID)?
                        .execute(rusqlite::params![id, batch.rows.len() as i64, now_ms])?;
                    if new == 0 {
                        // Committed before: a resend after a lost ack.
                        return Ok(0);
                    }
                }
                for row in &batch.rows {
                    let id = next_id;
                    next_id += 1;
                    let start = row.start_unix_nanos.and_then(|s| u64::try_from(s).ok());
                    if let (Some(before), Some(s)) = (too_old_before, start)
                        && s < before
                    {
                        // Older than the raw window: rolled up, never raw;
                        // a forced one (never rolled up) is counted apart.
                        too_old.0 += 1;
                        too_old.1 = Some(too_old.1.map_or(s, |m: u64| m.max(s)));
                        if row.trigger == "sampled" {
                            roll_up_one(&sp, frames, &mut added, row, id, hourly_before)?;
                        } else {
                            too_old.2 += 1;
                        }
                        continue;
                    }
                    sp.prepare_cached(INSERT)?.execute(rusqlite::params![
                        row.service,
                        row.endpoint,
                        row.start_unix_nanos,
                        row.latency_ns,
                        row.trigger,
                        row.labels,
                        row.record,
                        row.request_id,
                        row.trace_id,
                        id,
                    ])?;
                    paths::insert_path(
                        &sp,
                        frames,
                        &mut added,
                        &PathRow {
                            id,
                            service: &row.service,
                            endpoint: row.endpoint.as_deref(),
                            start_unix_nanos: row.start_unix_nanos,
                            trigger: row.trigger,
                            labels: &row.labels,
                            path: &row.path,
                            latency_ns: row.latency_ns,
                        },
                        &mut scratch,
                    )?;
                }
                for (trace, spans) in &batch.held {
                    sp.prepare_cached(INSERT_HELD)?
                        .execute(rusqlite::params![trace, spans])?;
                }
                for trace in &batch.released {
                    sp.prepare_cached(DELETE_HELD)?
                        .execute(rusqlite::params![trace])?;
                }
                Ok::<_, rusqlite::Error>(batch.rows.len() as u64)
            })();
            match inserted {
                Ok(n) => {
                    sp.commit().map_err(sqlite("release savepoint"))?;
                    group_added.append(&mut added);
                    state.too_old += too_old.0;
                    state.too_old_forced += too_old.2;
                    if let Some(s) = too_old.1 {
                        state.raw_deleted_through =
                            Some(state.raw_deleted_through.map_or(s, |d| d.max(s)));
                    }
                    results.push(Ok(n));
                }
                Err(e) => {
                    // Dropping the savepoint rolls this batch back.
                    drop(sp);
                    frames.forget(&added);
                    results.push(Err(sqlite("insert batch")(e)));
                }
            }
        }
        state.last_id = next_id - 1;
        // Dropping `tx` on these errors rolls the whole group back.
        let committed = state
            .write(&tx)
            .map_err(sqlite("note the last record id"))
            .and_then(|()| before_commit(&results))
            .and_then(|()| tx.commit().map_err(sqlite("commit")));
        if let Err(e) = committed {
            frames.forget(&group_added);
            return Err(e);
        }
        Ok(results)
    }
}

impl Store {
    /// The OTLP spans held (received and acknowledged, their trace not yet
    /// completed), as `(trace id, spans)` rows in the order they were
    /// stored: what a restarted collector reassembles.
    ///
    /// # Errors
    ///
    /// When SQLite fails.
    pub fn held_spans(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let sqlite = self.sqlite("read the held OTLP spans");
        let mut stmt = self
            .conn
            .prepare("SELECT trace_id, spans FROM otlp_spans ORDER BY rowid")
            .map_err(self.sqlite("read the held OTLP spans"))?;
        let rows: Vec<(String, Vec<u8>)> = stmt
            .query_map([], |r| {
                // A blob, or the text of rows written as JSON.
                let spans = match r.get_ref(1)? {
                    rusqlite::types::ValueRef::Blob(b) | rusqlite::types::ValueRef::Text(b) => {
                        b.to_vec()
                    }
                    _ => Vec::new(),
                };
                Ok((r.get(0)?, spans))
            })
            .and_then(Iterator::collect)
            .map_err(sqlite)?;
        Ok(rows)
    }
}

/// Add one record that is too old to keep raw to its roll-up, in the
/// batch's savepoint.
fn roll_up_one(
    conn: &rusqlite::Connection,
    frames: &mut FrameIds,
    added: &mut Vec<cpt_sdk::Frame>,
    row: &Row,
    id: i64,
    hourly_before: u64,
) -> rusqlite::Result<()> {
    let mut pf = PackedFrames::new();
    for (i, f) in row.path.frames.iter().enumerate() {
        pf.insert(i as u64, f.clone());
    }
    let start = row.start_unix_nanos.and_then(|s| u64::try_from(s).ok());
    let (resolution, bucket) = period_of(start, hourly_before);
    let key = Key {
        service: row.service.clone(),
        endpoint: row.endpoint.clone(),
        resolution,
        bucket,
    };
    let packed = PackedRow {
        id,
        service: row.service.clone(),
        start_unix_nanos: start,
        path: row.path.packed.clone(),
    };
    add_rows(conn, &key, &[packed], &pf, frames, added)
}

impl Store {
    /// Label each stored forced record of one of these (nonce, start)
    /// pairs `cpt.force.replayed=true`, in its labels and its record: a
    /// record of the same nonce that started earlier arrived after it
    /// (`server/ingest/replays.rs`). Returns how many were labelled.
    ///
    /// # Errors
    ///
    /// When the store cannot be written.
    pub(in crate::server) fn mark_replayed(
        &mut self,
        uses: &[(&str, u64)],
    ) -> Result<usize, StoreError> {
        let key = cpt_sdk::force::REPLAYED_LABEL;
        let nonce = cpt_sdk::force::NONCE_LABEL;
        let path = self.path.clone();
        let sqlite = |source| StoreError::Sqlite {
            path: path.clone(),
            context: "label replayed forced records",
            source,
        };
        let tx = self.conn.transaction().map_err(sqlite)?;
        let mut n = 0;
        {
            let mut update = tx
                .prepare(&format!(
                    "UPDATE records SET labels = json_set(labels, '$.\"{key}\"', 'true'), \
                 record = json_set(record, '$.labels.\"{key}\"', 'true') \
                 WHERE trigger = 'forced' AND start_unix_nanos = ?1 \
                 AND json_extract(labels, '$.\"{nonce}\"') = ?2"
                ))
                .map_err(sqlite)?;
            for (nonce, start) in uses {
                n += update
                    .execute(rusqlite::params![to_i64(*start), nonce])
                    .map_err(sqlite)?;
            }
        }
        tx.commit().map_err(sqlite)?;
        Ok(n)
    }
}
