//! `cpt trend`: an endpoint's mean, p50 and p99 per hour (per day past the
//! hourly roll-ups) and the frames that took the most of it, from a store's
//! roll-ups or a running collector's (`GET /v1/trend`).

use std::path::PathBuf;

use anyhow::bail;

/// Print an endpoint's latency trend from the roll-ups: per hour (per day past the hourly
/// roll-ups) the sampled requests, their mean, p50 and p99, and the mean time of the frames
/// that took the most of it (what `/ui/trend` draws).
#[derive(Debug, clap::Args)]
pub struct TrendArgs {
    /// The entry service.
    #[arg(long)]
    service: String,
    /// One endpoint (all of the service's by default).
    #[arg(long)]
    endpoint: Option<String>,
    /// How far back: periods since this long ago (e.g. 36h, 14d, 90d).
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "14d",
        conflicts_with = "since"
    )]
    last: String,
    /// Periods from this time (RFC 3339 or Unix nanoseconds) instead of --last.
    #[arg(long, value_name = "TIME")]
    since: Option<String>,
    /// Periods before this time.
    #[arg(long, value_name = "TIME")]
    until: Option<String>,
    /// Frames to follow (the rest is "other").
    #[arg(long, value_name = "N", default_value_t = 8)]
    top: usize,
    /// CSV instead of a table.
    #[arg(long)]
    csv: bool,
    /// The store to read (`cpt serve --store`).
    #[arg(
        long,
        value_name = "PATH",
        conflicts_with = "collector",
        required_unless_present = "collector"
    )]
    store: Option<PathBuf>,
    /// A running collector to ask instead (its HTTP address, e.g. http://127.0.0.1:7071).
    #[arg(long, value_name = "URL")]
    collector: Option<String>,
    /// How to read from the collector (its read token).
    #[command(flatten)]
    remote: super::remote::RemoteArgs,
}

impl TrendArgs {
    /// The query's pairs, as `/v1/trend` and the store take them.
    fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut p = vec![("service", self.service.clone())];
        if let Some(e) = &self.endpoint {
            p.push(("endpoint", e.clone()));
        }
        match &self.since {
            Some(s) => p.push(("since", s.clone())),
            None => p.push(("last", self.last.clone())),
        }
        if let Some(u) = &self.until {
            p.push(("until", u.clone()));
        }
        p.push(("top", self.top.to_string()));
        p
    }
}

/// Run `cpt trend`.
///
/// # Errors
///
/// A bad time or duration, an unreadable store, or the collector's refusal.
pub fn run(args: TrendArgs) -> anyhow::Result<()> {
    let pairs = args.pairs();
    if let Some(url) = &args.collector {
        let remote = super::remote::Remote::new(url, &args.remote)?;
        let mut all: Vec<(&str, String)> = pairs;
        all.push(("format", if args.csv { "csv" } else { "text" }.to_owned()));
        let answer = remote.get("/v1/trend", &crate::records::query::encode(all))?;
        print!("{}", String::from_utf8_lossy(&answer.body));
        return Ok(());
    }
    let Some(path) = &args.store else {
        bail!("give --store PATH or --collector URL");
    };
    from_store(path, &pairs, args.csv)
}

#[cfg(feature = "server")]
fn from_store(path: &std::path::Path, pairs: &[(&str, String)], csv: bool) -> anyhow::Result<()> {
    use crate::server::store::Store;
    use crate::server::store::rollup::TrendQuery;
    crate::records::check_store(path)?;
    let now = crate::server::store::unix_nanos(std::time::SystemTime::now());
    let q = TrendQuery::from_pairs(pairs.iter().map(|(k, v)| (*k, v.as_str())), now)
        .map_err(|e| anyhow::anyhow!(e))?;
    let store = Store::open_read_only(path).map_err(|e| anyhow::anyhow!("{e}"))?;
    let trend = store.trend(&q).map_err(|e| anyhow::anyhow!("{e}"))?;
    print!("{}", if csv { trend.to_csv() } else { trend.to_text() });
    Ok(())
}

#[cfg(not(feature = "server"))]
fn from_store(path: &std::path::Path, _: &[(&str, String)], _: bool) -> anyhow::Result<()> {
    bail!(
        "--store {}: this cpt was built without the `server` feature (no SQLite store); use --collector",
        path.display()
    )
}
