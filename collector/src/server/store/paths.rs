//! The store's profile tables (since schema version 4): every record's path packed
//! as ids into a `frames` table ([`records::packed`](crate::records::packed)),
//! beside the columns a profile selection filters on, so that a profile
//! reads about a tenth of a kilobyte a record and never parses JSON.
//!
//! - `frames (id, service, name, file, line)`: one row per distinct frame;
//!   ids are never reused or changed. The writer keeps the table in memory
//!   ([`FrameIds`]) and adds a frame in the transaction of the first record
//!   that has it.
//! - `paths (id, service, endpoint, start_unix_nanos, trigger, labels,
//!   path, latency_ns)`: one row per record, `id` the record's id in
//!   `records`; `latency_ns` since version 5, for the endpoints' summary.
//!
//! [`read_packed`] reads them in short snapshots: one read transaction per
//! chunk of rows (a few thousand, a few milliseconds), so the WAL can be
//! checkpointed past a long read while it runs. An answer that combines
//! them with the store's state and roll-ups reads them inside its one
//! snapshot instead ([`read_packed_on`] in a `Snapshot`).

use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc;

use cpt_sdk::path::{Frame, Location};
use rusqlite::types::Value;
use rusqlite::{Connection, Transaction, params_from_iter};

use super::query::IdIndex;
use super::{StoreError, StoreQuery, open_reader, to_i64};
use crate::profile::aggregate::packed::PackedRow;
use crate::records::packed;

/// The first schema version with `frames` and `paths`.
pub(super) const PATHS_VERSION: i64 = 4;

pub(super) const PATHS_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS frames (
    id      INTEGER PRIMARY KEY,
    service TEXT NOT NULL,
    name    TEXT NOT NULL,
    file    TEXT,
    line    INTEGER
);
CREATE TABLE IF NOT EXISTS paths (
    id               INTEGER PRIMARY KEY,
    service          TEXT NOT NULL,
    endpoint         TEXT,
    start_unix_nanos INTEGER,
    trigger          TEXT NOT NULL,
    labels           TEXT NOT NULL DEFAULT '{}',
    path             BLOB NOT NULL,
    latency_ns       INTEGER
);
";

/// The first schema version whose `paths` rows carry `latency_ns`.
pub(super) const PATH_LATENCY_VERSION: i64 = 5;

/// Version 4 → 5: `paths.latency_ns`, filled from `records`.
pub(super) const MIGRATE_PATH_LATENCY: &str = "
ALTER TABLE paths ADD COLUMN latency_ns INTEGER;
UPDATE paths SET latency_ns = (SELECT r.latency_ns FROM records r WHERE r.id = paths.id);
";

const INSERT_FRAME: &str = "INSERT INTO frames (service, name, file, line) VALUES (?1, ?2, ?3, ?4)";
const INSERT_PATH: &str = "INSERT INTO paths \
    (id, service, endpoint, start_unix_nanos, trigger, labels, path, latency_ns) \
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)";

/// The writer's copy of the `frames` table.
#[derive(Debug, Default)]
pub(super) struct FrameIds {
    /// Looked up for every frame of every stored record, on the writer
    /// thread: a fast hash, not SipHash (the keys are our own frames).
    ids: rustc_hash::FxHashMap<Frame, u64>,
}

fn frame_of(row: &rusqlite::Row<'_>) -> rusqlite::Result<(u64, Frame)> {
    let id: i64 = row.get(0)?;
    let service: String = row.get(1)?;
    let name: String = row.get(2)?;
    let file: Option<String> = row.get(3)?;
    let line: Option<i64> = row.get(4)?;
    let location = file.map(|f| Location {
        file: Arc::from(f),
        line: u32::try_from(line.unwrap_or(0)).unwrap_or(0),
    });
    Ok((
        u64::try_from(id).unwrap_or(0),
        Frame {
            service: Arc::from(service),
            name: Arc::from(name),
            location,
        },
    ))
}

/// Frames with an id at or above `from`.
pub(super) fn frames_from(conn: &Connection, from: u64) -> rusqlite::Result<Vec<(u64, Frame)>> {
    let mut stmt = conn.prepare_cached(
        "SELECT id, service, name, file, line FROM frames WHERE id >= ?1 ORDER BY id",
    )?;
    let rows = stmt.query_map([to_i64(from)], frame_of)?;
    rows.collect()
}

impl FrameIds {
    /// The table as stored.
    pub(super) fn load(conn: &Connection) -> rusqlite::Result<FrameIds> {
        Ok(FrameIds {
            ids: frames_from(conn, 0)?
                .into_iter()
                .map(|(id, f)| (f, id))
                .collect(),
        })
    }

    /// The id of `f`, inserting it (and noting it in `added`) when new.
    pub(super) fn id(
        &mut self,
        tx: &Connection,
        f: &Frame,
        added: &mut Vec<Frame>,
    ) -> rusqlite::Result<u64> {
        if let Some(&id) = self.ids.get(f) {
            return Ok(id);
        }
        tx.prepare_cached(INSERT_FRAME)?.execute(rusqlite::params![
            &*f.service,
            &*f.name,
            f.location.as_ref().map(|l| &*l.file),
            f.location.as_ref().map(|l| i64::from(l.line)),
        ])?;
        let id = u64::try_from(tx.last_insert_rowid()).unwrap_or(0);
        self.ids.insert(f.clone(), id);
        added.push(f.clone());
        Ok(id)
    }

    /// Forget frames whose insert was rolled back.
    pub(super) fn forget(&mut self, added: &[Frame]) {
        for f in added {
            self.ids.remove(f);
        }
    }
}

/// What [`insert_path`] needs of a record, computed off the writer thread.
#[derive(Clone, Debug)]
pub(super) struct PackedPath {
    /// The record's own frame table.
    pub(super) frames: Vec<Frame>,
    /// The path packed with the record's own frame indexes.
    pub(super) packed: Vec<u8>,
}

impl PackedPath {
    pub(super) fn new(path: &cpt_sdk::path::CriticalPath) -> PackedPath {
        let mut packed = Vec::with_capacity(16 + 4 * path.segments().len());
        packed::pack(path, &mut packed);
        PackedPath {
            frames: path.frames().to_vec(),
            packed,
        }
    }
}

/// The `paths` columns of one record.
pub(super) struct PathRow<'a> {
    pub(super) id: i64,
    pub(super) service: &'a str,
    pub(super) endpoint: Option<&'a str>,
    pub(super) start_unix_nanos: Option<i64>,
    pub(super) trigger: &'a str,
    pub(super) labels: &'a str,
    pub(super) path: &'a PackedPath,
    pub(super) latency_ns: i64,
}

/// Insert a record's `paths` row (and its new frames).
pub(super) fn insert_path(
    tx: &Connection,
    frames: &mut FrameIds,
    added: &mut Vec<Frame>,
    row: &PathRow<'_>,
    scratch: &mut (Vec<u64>, Vec<u8>),
) -> rusqlite::Result<()> {
    let (map, out) = scratch;
    map.clear();
    for f in &row.path.frames {
        map.push(frames.id(tx, f, added)?);
    }
    out.clear();
    packed::remap(&row.path.packed, map, out)
        .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
    tx.prepare_cached(INSERT_PATH)?.execute(rusqlite::params![
        row.id,
        row.service,
        row.endpoint,
        row.start_unix_nanos,
        row.trigger,
        row.labels,
        &out[..],
        row.latency_ns,
    ])?;
    Ok(())
}

/// Fill `paths` from the records' JSON (migration to version 4), in id
/// order. A record whose JSON no longer parses gets no `paths` row (every
/// read of it through `records` reports it as corrupt).
pub(super) fn fill_from_records(
    tx: &Transaction<'_>,
    frames: &mut FrameIds,
) -> Result<u64, rusqlite::Error> {
    let mut stmt = tx.prepare(
        "SELECT id, service, endpoint, start_unix_nanos, trigger, labels, record, latency_ns \
         FROM records WHERE id NOT IN (SELECT id FROM paths) ORDER BY id",
    )?;
    let mut rows = stmt.query([])?;
    let mut added = Vec::new();
    let mut scratch = Default::default();
    let mut n = 0;
    while let Some(r) = rows.next()? {
        let text: String = r.get(6)?;
        let Ok(rec) = cpt_sdk::record::Record::from_json(&text) else {
            continue;
        };
        let (service, endpoint, trigger, labels): (String, Option<String>, String, String) =
            (r.get(1)?, r.get(2)?, r.get(4)?, r.get(5)?);
        insert_path(
            tx,
            frames,
            &mut added,
            &PathRow {
                id: r.get(0)?,
                service: &service,
                endpoint: endpoint.as_deref(),
                start_unix_nanos: r.get(3)?,
                trigger: &trigger,
                labels: &labels,
                path: &PackedPath::new(&rec.path),
                latency_ns: r.get(7)?,
            },
            &mut scratch,
        )?;
        n += 1;
    }
    Ok(n)
}

/// The chunk query over `paths`: rows after `?1`, up to `?2`, in id order,
/// at most `?3`, with the query's filters.
fn chunk_sql(q: &StoreQuery, ids: IdIndex) -> (String, Vec<Value>) {
    let (f, params) = filters(q, ids, 4);
    (
        format!(
            "SELECT id, service, start_unix_nanos, path FROM paths \
             WHERE id > ?1 AND id <= ?2{f} ORDER BY id LIMIT ?3"
        ),
        params,
    )
}

/// The query's filters as conditions on `paths` (each ` AND …`), their
/// parameters numbered from `?first`.
fn filters(q: &StoreQuery, ids: IdIndex, first: usize) -> (String, Vec<Value>) {
    let mut sql = String::new();
    let mut params = Vec::new();
    let mut next = first;
    let mut param = |sql: &mut String, cond: &str, v: Value| {
        sql.push_str(&cond.replace('?', &format!("?{next}")));
        next += 1;
        params.push(v);
    };
    if let Some(s) = &q.service {
        param(&mut sql, " AND service = ?", Value::Text(s.clone()));
    }
    if let Some(e) = &q.endpoint {
        param(&mut sql, " AND endpoint = ?", Value::Text(e.clone()));
    }
    if let Some(t) = q.since_unix_nanos {
        param(
            &mut sql,
            " AND start_unix_nanos >= ?",
            Value::Integer(to_i64(t)),
        );
    }
    if let Some(t) = q.until_unix_nanos {
        param(
            &mut sql,
            " AND start_unix_nanos < ?",
            Value::Integer(to_i64(t)),
        );
    }
    if let Some(t) = q.trigger {
        param(
            &mut sql,
            " AND trigger = ?",
            Value::Text(t.as_str().to_owned()),
        );
    }
    for (k, v) in &q.labels {
        let (a, b) = (next, next + 1);
        sql.push_str(&format!(
            " AND EXISTS (SELECT 1 FROM json_each(labels) WHERE key = ?{a} AND value = ?{b})"
        ));
        next += 2;
        params.push(Value::Text(k.clone()));
        params.push(Value::Text(v.clone()));
    }
    if let Some(id) = &q.request_id {
        sql.push_str(&format!(
            " AND id IN (SELECT id FROM records WHERE {})",
            ids.condition("request_id", &format!("?{next}"))
        ));
        next += 1;
        params.push(Value::Text(id.clone()));
    }
    if let Some(id) = &q.trace_id {
        sql.push_str(&format!(
            " AND id IN (SELECT id FROM records WHERE {})",
            ids.condition("trace_id", &format!("?{next}"))
        ));
        params.push(Value::Text(id.to_ascii_lowercase()));
    }
    (sql, params)
}

/// How many rows of `paths` match `q` and, with `newest`, the id after
/// which the newest `newest` of them start (0: from the first), read in
/// one snapshot. A scan of `paths` (about a tenth of a kilobyte a row),
/// never of the records' JSON.
pub(super) fn count_newest(
    conn: &Connection,
    q: &StoreQuery,
    ids: IdIndex,
    newest: Option<u64>,
) -> rusqlite::Result<(u64, i64)> {
    let (f, params) = filters(q, ids, 1);
    // One snapshot: the caller's when it is in one.
    let own = conn.is_autocommit();
    if own {
        conn.execute_batch("BEGIN")?;
    }
    let read = (|| {
        let matching: i64 = conn.query_row(
            &format!("SELECT count(*) FROM paths WHERE 1 = 1{f}"),
            params_from_iter(params.iter()),
            |r| r.get(0),
        )?;
        let matching = u64::try_from(matching).unwrap_or(0);
        let after = match newest {
            Some(n) if n > 0 && n < matching => {
                let k = params.len() + 1;
                let mut all = params.clone();
                all.push(Value::Integer(to_i64(n - 1)));
                let from: i64 = conn.query_row(
                    &format!(
                        "SELECT id FROM paths WHERE 1 = 1{f} ORDER BY id DESC LIMIT 1 OFFSET ?{k}"
                    ),
                    params_from_iter(all),
                    |r| r.get(0),
                )?;
                from - 1
            }
            _ => 0,
        };
        Ok((matching, after))
    })();
    if own {
        conn.execute_batch("COMMIT")?;
    }
    read
}

/// A chunk of packed rows and the frames added to the table since the last.
pub(super) type Chunk = (Vec<PackedRow>, Vec<(u64, Frame)>);

/// Read the rows of `paths` with an id above `after` (and at most `upto`) matching `q`
/// (everything but its limit; `ids` the layout of the store's id indexes)
/// that were committed when the read began, on a connection of its own, one
/// short read transaction per chunk, sending each chunk with the frames it
/// may need. Stops when the receiver is gone.
pub(super) fn read_packed(
    path: &Path,
    q: &StoreQuery,
    ids: IdIndex,
    (after, upto): (i64, Option<i64>),
    chunk_rows: usize,
    tx: &mpsc::SyncSender<Result<Chunk, StoreError>>,
) {
    let conn = match open_reader(path) {
        Ok(c) => c,
        Err(source) => {
            let _ = tx.send(Err(StoreError::Sqlite {
                path: path.to_path_buf(),
                context: "open reader",
                source,
            }));
            return;
        }
    };
    let _ = conn.busy_timeout(std::time::Duration::from_secs(10));
    read_packed_on(&conn, path, q, ids, (after, upto), chunk_rows, tx);
}

/// [`read_packed`] on `conn`: inside the caller's read transaction when it
/// is in one (every chunk from the one snapshot of an answer), else one
/// short transaction per chunk.
pub(super) fn read_packed_on(
    conn: &Connection,
    path: &Path,
    q: &StoreQuery,
    ids: IdIndex,
    (after, upto): (i64, Option<i64>),
    chunk_rows: usize,
    tx: &mpsc::SyncSender<Result<Chunk, StoreError>>,
) {
    let sqlite = |context| {
        move |source| StoreError::Sqlite {
            path: path.to_path_buf(),
            context,
            source,
        }
    };
    let in_snapshot = !conn.is_autocommit();
    let run = || -> Result<(), StoreError> {
        let last: i64 = conn
            .query_row("SELECT coalesce(max(id), 0) FROM paths", [], |r| r.get(0))
            .map_err(sqlite("read the last record id"))?;
        let last = upto.map_or(last, |u| last.min(u));
        let (sql, params) = chunk_sql(q, ids);
        let mut after = after;
        let mut known = 0u64;
        loop {
            // One snapshot for the chunk and the frames it refers to.
            if !in_snapshot {
                conn.execute_batch("BEGIN").map_err(sqlite("begin read"))?;
            }
            let read = (|| {
                let mut stmt = conn.prepare_cached(&sql)?;
                let mut all: Vec<Value> = vec![
                    Value::Integer(after),
                    Value::Integer(last),
                    Value::Integer(i64::try_from(chunk_rows.max(1)).unwrap_or(i64::MAX)),
                ];
                all.extend(params.iter().cloned());
                let rows = stmt
                    .query_map(params_from_iter(all), |r| {
                        let start: Option<i64> = r.get(2)?;
                        Ok(PackedRow {
                            id: r.get(0)?,
                            service: r.get(1)?,
                            start_unix_nanos: start.and_then(|s| u64::try_from(s).ok()),
                            path: r.get(3)?,
                        })
                    })?
                    .collect::<Result<Vec<_>, _>>()?;
                let frames = frames_from(conn, known)?;
                Ok::<_, rusqlite::Error>((rows, frames))
            })();
            if !in_snapshot {
                conn.execute_batch("COMMIT").map_err(sqlite("end read"))?;
            }
            let (rows, frames) = read.map_err(sqlite("read packed paths"))?;
            if let Some((id, _)) = frames.last() {
                known = id + 1;
            }
            let full = rows.len() >= chunk_rows.max(1);
            match rows.last() {
                Some(r) => after = r.id,
                None => after = last,
            }
            if tx.send(Ok((rows, frames))).is_err() {
                return Ok(());
            }
            if !full || after >= last {
                return Ok(());
            }
        }
    };
    if let Err(e) = run() {
        let _ = tx.send(Err(e));
    }
}
