//! Summaries the collector's web pages list without reading whole records:
//! per entry service and endpoint, how many requests, how long and when last
//! seen ([`Store::endpoints`]), from the indexed columns only; and the most
//! recent records of a query, newest first ([`Store::recent`]).

use std::collections::BTreeMap;

use cpt_sdk::{Record, Trigger};
use rusqlite::params_from_iter;
use rusqlite::types::Value;

use super::{Records, Store, StoreError, StoreQuery, to_i64};

/// One entry service and endpoint over a time range.
#[derive(Clone, Debug, PartialEq)]
pub struct EndpointSummary {
    /// The entry service.
    pub service: String,
    /// The endpoint (`None`: records without one).
    pub endpoint: Option<String>,
    /// Requests stored.
    pub requests: u64,
    /// Their mean latency, ns.
    pub mean_latency_nanos: u64,
    /// Median latency, ns (nearest rank).
    pub p50_latency_nanos: u64,
    /// 99th percentile latency, ns (nearest rank).
    pub p99_latency_nanos: u64,
    /// The latest start time among them (Unix ns), if any had one.
    pub last_seen_unix_nanos: Option<u64>,
}

/// The value at quantile `q` of sorted `v` (nearest rank, the one
/// definition the profile page shares; 0 when empty).
fn nearest_rank(v: &[u64], q: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v[crate::profile::histogram::nearest_rank(q, v.len())]
}

impl Store {
    /// Every entry service and endpoint with records of `trigger` that
    /// started in `[since, until)` (either bound optional), sorted by
    /// service then endpoint. Scans every record's service, endpoint,
    /// latency and start (in `paths`, about a tenth of a kilobyte a record;
    /// in `records` for a store older than schema 5), never their JSON.
    ///
    /// # Errors
    ///
    /// When SQLite fails.
    pub fn endpoints(
        &self,
        trigger: Trigger,
        since: Option<u64>,
        until: Option<u64>,
    ) -> Result<Vec<EndpointSummary>, StoreError> {
        // Since version 5 `paths` has every column this needs, at about a
        // twentieth of the bytes of `records`.
        let table = if self.version >= super::paths::PATH_LATENCY_VERSION {
            "paths"
        } else {
            "records"
        };
        let mut sql = format!(
            "SELECT service, endpoint, latency_ns, start_unix_nanos FROM {table} WHERE trigger = ?"
        );
        let mut params = vec![Value::Text(trigger.as_str().to_owned())];
        if let Some(t) = since {
            sql.push_str(" AND start_unix_nanos >= ?");
            params.push(Value::Integer(to_i64(t)));
        }
        if let Some(t) = until {
            sql.push_str(" AND start_unix_nanos < ?");
            params.push(Value::Integer(to_i64(t)));
        }
        type Acc = (Vec<u64>, u128, Option<u64>);
        let mut groups: BTreeMap<(String, Option<String>), Acc> = BTreeMap::new();
        let mut stmt = self
            .conn
            .prepare(&sql)
            .map_err(self.sqlite("prepare endpoint summary"))?;
        let mut rows = stmt
            .query(params_from_iter(params))
            .map_err(self.sqlite("run endpoint summary"))?;
        while let Some(row) = rows.next().map_err(self.sqlite("read endpoint summary"))? {
            let service: String = row.get(0).map_err(self.sqlite("read service"))?;
            let endpoint: Option<String> = row.get(1).map_err(self.sqlite("read endpoint"))?;
            let latency: i64 = row.get(2).map_err(self.sqlite("read latency"))?;
            let start: Option<i64> = row.get(3).map_err(self.sqlite("read start"))?;
            let g = groups.entry((service, endpoint)).or_default();
            let latency = u64::try_from(latency).unwrap_or(0);
            g.0.push(latency);
            g.1 += u128::from(latency);
            if let Some(s) = start.and_then(|s| u64::try_from(s).ok()) {
                g.2 = Some(g.2.map_or(s, |m| m.max(s)));
            }
        }
        Ok(groups
            .into_iter()
            .map(|((service, endpoint), (mut lat, sum, last))| {
                lat.sort_unstable();
                let n = lat.len() as u64;
                EndpointSummary {
                    service,
                    endpoint,
                    requests: n,
                    mean_latency_nanos: u64::try_from(sum / u128::from(n.max(1)))
                        .unwrap_or(u64::MAX),
                    p50_latency_nanos: nearest_rank(&lat, 0.5),
                    p99_latency_nanos: nearest_rank(&lat, 0.99),
                    last_seen_unix_nanos: last,
                }
            })
            .collect())
    }

    /// The `limit` most recently stored records with this trigger (and, when
    /// given, this entry service and endpoint), newest first.
    ///
    /// # Errors
    ///
    /// When SQLite fails or a stored record no longer parses.
    pub fn recent(
        &self,
        trigger: Trigger,
        service: Option<&str>,
        endpoint: Option<&str>,
        limit: u64,
    ) -> Result<Vec<Record>, StoreError> {
        let mut sql = String::from("SELECT id, record FROM records WHERE trigger = ?");
        let mut params = vec![Value::Text(trigger.as_str().to_owned())];
        if let Some(s) = service {
            sql.push_str(" AND service = ?");
            params.push(Value::Text(s.to_owned()));
        }
        if let Some(e) = endpoint {
            sql.push_str(" AND endpoint = ?");
            params.push(Value::Text(e.to_owned()));
        }
        sql.push_str(" ORDER BY id DESC LIMIT ?");
        params.push(Value::Integer(to_i64(limit)));
        let mut stmt = self
            .conn
            .prepare(&sql)
            .map_err(self.sqlite("prepare recent records"))?;
        let mut rows = stmt
            .query(params_from_iter(params))
            .map_err(self.sqlite("run recent records"))?;
        let mut out = Vec::new();
        while let Some(row) = rows.next().map_err(self.sqlite("read recent record"))? {
            let id: i64 = row.get(0).map_err(self.sqlite("read recent record"))?;
            let text: String = row.get(1).map_err(self.sqlite("read recent record"))?;
            out.push(Record::from_json(&text).map_err(|e| StoreError::Corrupt {
                path: self.path.clone(),
                id,
                reason: e.to_string(),
            })?);
        }
        Ok(out)
    }
}

impl Store {
    /// The `newest` most recently stored records matching `query` (its
    /// `limit` ignored), delivered oldest first and parsed in parallel as
    /// [`Store::query`] does: a bounded sample of a large selection.
    ///
    /// # Errors
    ///
    /// As [`Store::query`].
    pub fn query_newest(&self, query: &StoreQuery, newest: u64) -> Result<Records, StoreError> {
        if query.by_id() && self.version < super::ID_INDEX_VERSION {
            return Err(StoreError::NoIdIndex {
                path: self.path.clone(),
                found: self.version,
            });
        }
        let q = StoreQuery {
            limit: None,
            ..query.clone()
        };
        // The id of the `newest`-th newest match; the read starts there.
        let (all, mut params) = q.sql(false, self.id_index());
        let inner = all.strip_suffix(" ORDER BY id").unwrap_or(&all);
        params.push(Value::Integer(to_i64(newest.saturating_sub(1))));
        let from: Option<i64> = match self.conn.query_row(
            &format!("SELECT id FROM ({inner}) ORDER BY id DESC LIMIT 1 OFFSET ?"),
            params_from_iter(params),
            |r| r.get(0),
        ) {
            Ok(id) => Some(id),
            Err(rusqlite::Error::QueryReturnedNoRows) => None,
            Err(e) => return Err(self.sqlite("find the newest records")(e)),
        };
        let after = from.map_or(0, |id| id - 1);
        let (sql, params) = q.sql(true, self.id_index());
        self.spawn_reader(sql, params, after, None)
    }

    /// How many records match `query` (its `limit` ignored).
    ///
    /// # Errors
    ///
    /// When SQLite fails.
    pub fn count(&self, query: &StoreQuery) -> Result<u64, StoreError> {
        let q = StoreQuery {
            limit: None,
            ..query.clone()
        };
        let (sql, params) = q.sql(false, self.id_index());
        let inner = sql.strip_suffix(" ORDER BY id").unwrap_or(&sql);
        let sql = format!("SELECT count(*) FROM ({inner})");
        let n: i64 = self
            .conn
            .query_row(&sql, params_from_iter(params), |r| r.get(0))
            .map_err(self.sqlite("count records"))?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// The largest row id (0 when empty): changes whenever records are added.
    ///
    /// # Errors
    ///
    /// When SQLite fails.
    pub fn last_row_id(&self) -> Result<i64, StoreError> {
        self.conn
            .query_row("SELECT coalesce(max(id), 0) FROM records", [], |r| r.get(0))
            .map_err(self.sqlite("read last row id"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(nearest_rank(&v, 0.5), 50);
        assert_eq!(nearest_rank(&v, 0.99), 99);
        assert_eq!(nearest_rank(&[7], 0.99), 7);
        assert_eq!(nearest_rank(&[], 0.5), 0);
    }
}
