//! `GET /v1/trend?service=S&endpoint=E&last=30d`: an endpoint's trend from
//! the roll-ups (per hour, per day past the hourly roll-ups: requests,
//! mean, p50, p99 and the top frames' mean time), as CSV or, with
//! `format=text`, as `cpt trend` prints it; an error is JSON,
//! `{"error": "…"}`, as on every API route. A read like the others: the
//! read token when the collector has one. Roll-ups hold sampled requests
//! only, so nothing forced is in it.

use std::sync::Arc;

use axum::Router;
use axum::extract::{RawQuery, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use http::{StatusCode, header};

use crate::records::query;
use crate::server::edge::routes::error;
use crate::server::ingest::admission::Ingest;
use crate::server::store::Store;
use crate::server::store::rollup::TrendQuery;

pub(in crate::server) fn router(ingest: Arc<Ingest>) -> Router {
    Router::new()
        .route("/v1/trend", get(get_trend))
        .with_state(ingest)
}

fn text(status: StatusCode, body: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body,
    )
        .into_response()
}

/// Behind the route guard (`routes.rs`): a read. Roll-ups hold sampled
/// requests only, so no reader is shown a forced one here.
async fn get_trend(State(ingest): State<Arc<Ingest>>, RawQuery(raw): RawQuery) -> Response {
    let raw = raw.unwrap_or_default();
    let parsed = query::decode(&raw)
        .map_err(|e| e.to_string())
        .and_then(|p| {
            let csv = !p.iter().any(|(k, v)| k == "format" && v == "text");
            TrendQuery::from_pairs(
                p.iter().map(|(k, v)| (k.as_str(), v.as_str())),
                crate::server::store::unix_nanos(std::time::SystemTime::now()),
            )
            .map(|q| (q, csv))
        });
    let (q, csv) = match parsed {
        Ok(q) => q,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("bad trend query: {e}")),
    };
    let path = ingest.store_path.clone();
    let built = crate::server::edge::reads::run(move || {
        Store::open_read_only(&path).and_then(|s| s.trend(&q))
    })
    .await;
    match built {
        Ok(Ok(t)) => text(StatusCode::OK, if csv { t.to_csv() } else { t.to_text() }),
        Ok(Err(e)) => {
            crate::server::operations::errlog::error("building a trend failed", || e.to_string());
            error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "building a trend failed: the store could not be read (the collector's log has the detail); retry later".into(),
            )
        }
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("trend task failed: {e}"),
        ),
    }
}
