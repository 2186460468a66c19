//! [`StoreQuery`]: which records a query returns, as SQL; and the reader
//! that streams them in short snapshots ([`Records`]).

use std::path::Path;
use std::sync::mpsc;
use std::thread;

use cpt_sdk::{Record, Trigger};
use rayon::prelude::*;
use rusqlite::params_from_iter;
use rusqlite::types::Value;

use super::{
    BUCKETED_ID_VERSION, ID_BUCKET_BITS, PARSE_CHUNK, SNAPSHOT_ROWS, StoreError, open_reader,
    to_i64,
};
use crate::records::selection::{Selection, TriggerFilter};

/// How a store's request and trace id indexes are laid out, which the SQL
/// of a lookup by id follows so that it uses them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum IdIndex {
    /// Schema versions 2–4: on the id alone.
    Plain,
    /// Version 5 on: on the record's id bucket, then the id.
    Bucketed,
}

impl IdIndex {
    /// The layout of a store of schema `version`.
    pub(super) fn of_version(version: i64) -> IdIndex {
        if version >= BUCKETED_ID_VERSION {
            IdIndex::Bucketed
        } else {
            IdIndex::Plain
        }
    }

    /// SQL true for the rows of `records` whose `column` equals the
    /// parameter `param` (`?` or `?N`). Bucketed, it names every bucket up
    /// to the newest record's, so SQLite seeks the id once in each.
    pub(super) fn condition(self, column: &str, param: &str) -> String {
        match self {
            IdIndex::Plain => format!("{column} = {param}"),
            IdIndex::Bucketed => format!(
                "(id >> {b}) IN (WITH RECURSIVE bucket(n) AS (SELECT 0 UNION ALL \
                 SELECT n + 1 FROM bucket WHERE n < (SELECT coalesce(max(id), 0) FROM records) >> {b}) \
                 SELECT n FROM bucket) AND {column} = {param}",
                b = ID_BUCKET_BITS
            ),
        }
    }
}

/// Which records a query returns. Every field left `None` / empty matches
/// everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreQuery {
    /// Only this service.
    pub service: Option<String>,
    /// Only this endpoint.
    pub endpoint: Option<String>,
    /// Only records that started at or after this time (records without a
    /// start time are then excluded).
    pub since_unix_nanos: Option<u64>,
    /// Only records that started before this time.
    pub until_unix_nanos: Option<u64>,
    /// Only this trigger.
    pub trigger: Option<Trigger>,
    /// Only records carrying every one of these labels with these values.
    pub labels: Vec<(String, String)>,
    /// Only the record(s) of this request id (through the id index).
    pub request_id: Option<String>,
    /// Only the records of this trace id, lowercase (through the id index).
    pub trace_id: Option<String>,
    /// At most this many records (the oldest first); `None` is no limit.
    pub limit: Option<u64>,
}

impl StoreQuery {
    /// The part of a profile [`Selection`] SQL can evaluate (everything but
    /// the percentile band).
    pub fn from_selection(sel: &Selection) -> StoreQuery {
        let (since, until) = sel.time_range();
        StoreQuery {
            service: sel.service().map(str::to_owned),
            endpoint: sel.endpoint().map(str::to_owned),
            since_unix_nanos: since,
            until_unix_nanos: until,
            trigger: match sel.triggers() {
                TriggerFilter::Sampled => Some(Trigger::Sampled),
                TriggerFilter::Forced => Some(Trigger::Forced),
                TriggerFilter::All => None,
            },
            labels: sel.labels().to_vec(),
            request_id: sel.request_id().map(str::to_owned),
            trace_id: sel.trace_id().map(str::to_owned),
            limit: None,
        }
    }

    /// Whether the query needs the id index (schema version 2).
    pub(super) fn by_id(&self) -> bool {
        self.request_id.is_some() || self.trace_id.is_some()
    }

    /// The query in insertion (`id`) order. With an indexable filter
    /// (service, endpoint, time range) the matching ids are found through an
    /// index and the rows fetched by id in order, so SQLite never sorts the
    /// (large) rows themselves; otherwise one scan in rowid order.
    #[cfg(test)]
    pub(super) fn to_sql(&self) -> (String, Vec<Value>) {
        self.sql(false, IdIndex::Bucketed)
    }

    /// [`to_sql`](Self::to_sql), or with `chunked` its form for one chunk
    /// of a read in short snapshots: `AND id > ? AND id <= ?` (within the
    /// subquery of an indexed query) and `LIMIT ?`,
    /// whose three values the caller appends to the parameters (the query's
    /// own limit is then the caller's to count). `ids` is the layout of the
    /// store's id indexes.
    pub(super) fn sql(&self, chunked: bool, ids: IdIndex) -> (String, Vec<Value>) {
        let indexed = self.by_id()
            || self.service.is_some()
            || self.endpoint.is_some()
            || self.since_unix_nanos.is_some()
            || self.until_unix_nanos.is_some();
        let mut sql = String::from(if indexed {
            "SELECT id, record FROM records WHERE id IN (SELECT id FROM records WHERE 1 = 1"
        } else {
            "SELECT id, record FROM records WHERE 1 = 1"
        });
        let mut params = Vec::new();
        if let Some(id) = &self.request_id {
            sql.push_str(" AND ");
            sql.push_str(&ids.condition("request_id", "?"));
            params.push(Value::Text(id.clone()));
        }
        if let Some(id) = &self.trace_id {
            sql.push_str(" AND ");
            sql.push_str(&ids.condition("trace_id", "?"));
            params.push(Value::Text(id.to_ascii_lowercase()));
        }
        if let Some(s) = &self.service {
            sql.push_str(" AND service = ?");
            params.push(Value::Text(s.clone()));
        }
        if let Some(e) = &self.endpoint {
            sql.push_str(" AND endpoint = ?");
            params.push(Value::Text(e.clone()));
        }
        if let Some(t) = self.since_unix_nanos {
            sql.push_str(" AND start_unix_nanos >= ?");
            params.push(Value::Integer(to_i64(t)));
        }
        if let Some(t) = self.until_unix_nanos {
            sql.push_str(" AND start_unix_nanos < ?");
            params.push(Value::Integer(to_i64(t)));
        }
        if let Some(t) = self.trigger {
            sql.push_str(" AND trigger = ?");
            params.push(Value::Text(t.as_str().to_owned()));
        }
        for (k, v) in &self.labels {
            sql.push_str(
                " AND EXISTS (SELECT 1 FROM json_each(labels) WHERE key = ? AND value = ?)",
            );
            params.push(Value::Text(k.clone()));
            params.push(Value::Text(v.clone()));
        }
        if chunked {
            // Inside the subquery when there is one: the outer query then
            // fetches only the chunk's rows, not every match's row to keep
            // those in the range.
            sql.push_str(" AND id > ? AND id <= ?");
        }
        if indexed {
            sql.push(')');
        }
        if chunked {
            sql.push_str(" ORDER BY id LIMIT ?");
            return (sql, params);
        }
        sql.push_str(" ORDER BY id");
        if let Some(n) = self.limit {
            sql.push_str(" LIMIT ?");
            params.push(Value::Integer(to_i64(n)));
        }
        (sql, params)
    }
}

/// Read the rows of a chunked query ([`StoreQuery::sql`]) committed when
/// the read began with an id above `after`, at most `limit`, one short read
/// transaction per chunk of
/// [`SNAPSHOT_ROWS`] rows, parsing each chunk's JSON on the rayon pool and
/// sending the records in order.
pub(super) fn read_rows(
    path: &Path,
    sql: &str,
    params: Vec<Value>,
    after: i64,
    limit: Option<u64>,
    tx: &mpsc::SyncSender<Result<Record, StoreError>>,
) {
    let sqlite = |context| {
        move |source| StoreError::Sqlite {
            path: path.to_path_buf(),
            context,
            source,
        }
    };
    let corrupt = |id: i64, reason: String| StoreError::Corrupt {
        path: path.to_path_buf(),
        id,
        reason,
    };
    let run = || -> Result<(), StoreError> {
        let conn = open_reader(path).map_err(sqlite("open reader"))?;
        let _ = conn.busy_timeout(std::time::Duration::from_secs(10));
        let last: i64 = conn
            .query_row("SELECT coalesce(max(id), 0) FROM records", [], |r| r.get(0))
            .map_err(sqlite("read the last record id"))?;
        let mut left = limit.unwrap_or(u64::MAX);
        let mut after = after;
        while left > 0 {
            let want = left.min(SNAPSHOT_ROWS as u64);
            let mut all = params.clone();
            all.extend([
                Value::Integer(after),
                Value::Integer(last),
                Value::Integer(to_i64(want)),
            ]);
            // One statement, one implicit read transaction, per chunk.
            let chunk: Vec<(i64, String)> = conn
                .prepare_cached(sql)
                .and_then(|mut stmt| {
                    stmt.query_map(params_from_iter(all), |r| {
                        let id: i64 = r.get(0)?;
                        let text = r.get_ref(1)?;
                        Ok((id, text.as_str().map(str::to_owned)))
                    })?
                    .map(|r| r.map(|(id, t)| (id, t.map_err(|e| (id, e.to_string())))))
                    .collect::<Result<Vec<_>, _>>()
                })
                .map_err(sqlite("read rows"))?
                .into_iter()
                .map(|(id, t)| t.map(|t| (id, t)))
                .collect::<Result<_, _>>()
                .map_err(|(id, e)| corrupt(id, e))?;
            let n = chunk.len() as u64;
            if let Some((id, _)) = chunk.last() {
                after = *id;
            }
            // JSON parsing is most of the cost: chunks of rows in parallel.
            let parsed: Vec<Result<Record, StoreError>> = chunk
                .par_chunks(PARSE_CHUNK)
                .flat_map_iter(|rows| {
                    rows.iter().map(|(id, text)| {
                        Record::from_json(text).map_err(|e| corrupt(*id, e.to_string()))
                    })
                })
                .collect();
            drop(chunk);
            // A failed send means the consumer is gone.
            if !parsed.into_iter().all(|item| tx.send(item).is_ok()) {
                return Ok(());
            }
            left -= n;
            if n < want {
                break;
            }
        }
        Ok(())
    };
    if let Err(e) = run() {
        let _ = tx.send(Err(e));
    }
}

/// The records a [`Store::query`](super::Store::query) returns, streamed.
#[derive(Debug)]
pub struct Records {
    pub(super) rx: mpsc::Receiver<Result<Record, StoreError>>,
    pub(super) _reader: thread::JoinHandle<()>,
}

impl Iterator for Records {
    type Item = Result<Record, StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.rx.recv().ok()
    }
}
