//! Bounding the connections open on the gRPC and HTTP ports, in total and
//! per peer address, so that one peer cannot take every file descriptor.
//!
//! # The rule
//!
//! Both ports together keep at most [`crate::server::ServeConfig::max_connections`]
//! connections open, and one peer address (its IP: every port and
//! connection of it) at most
//! [`crate::server::ServeConfig::max_connections_per_peer`] of them (default: a
//! sixteenth of the total, at least one). A connection beyond either bound
//! is closed as soon as it is accepted, with a reset (no `TIME_WAIT` kept
//! for it), and counted by reason (`cpt_connections_refused_total`). The
//! connections the peer already has are left alone: closing its oldest
//! idle one instead would let a peer that reconnects in a loop churn its
//! own connections at the collector's expense, and could cut an HTTP/2
//! connection an exporter is about to reuse; a refused connect is what
//! every client already retries. A peer's idle connections still close
//! after the idle timeout (`listen.rs`), freeing its share.
//!
//! # Descriptors
//!
//! Each connection is a file descriptor; the store, the Parquet files and
//! the listeners need [`RESERVED_DESCRIPTORS`] more. At start
//! [`descriptor_limit`] raises the process's soft `RLIMIT_NOFILE` to its
//! hard limit, and when that is still below what the bounds need, [`fit`]
//! warns and lowers the bounds to what the limit leaves: the connections
//! are refused, never the store's files.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::server::ingest::receiving::PeerSlots;

/// Descriptors kept for everything but connections: the store (its
/// database, WAL and shared-memory files, for the writer and each reader),
/// the Parquet files a group writes, the listeners and the runtime's own.
pub const RESERVED_DESCRIPTORS: u64 = 256;

/// Why a connection was refused (the `reason` label of
/// `cpt_connections_refused_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::server) enum Refused {
    /// Its peer address had its share open.
    Peer = 0,
    /// Both ports together had their bound open.
    Total = 1,
}

impl Refused {
    pub(in crate::server) const ALL: [Refused; 2] = [Refused::Peer, Refused::Total];

    pub(in crate::server) fn as_str(self) -> &'static str {
        match self {
            Refused::Peer => "peer",
            Refused::Total => "total",
        }
    }
}

/// The connections open on both ports, and the bounds on them.
#[derive(Debug)]
pub(in crate::server) struct Connections {
    open: AtomicU64,
    max: u64,
    max_per_peer: usize,
    peers: PeerSlots,
    refused: [AtomicU64; 2],
}

impl Connections {
    /// At most `max` connections, `max_per_peer` from one address (each at
    /// least 1).
    pub(in crate::server) fn new(max: usize, max_per_peer: usize) -> Connections {
        Connections {
            open: AtomicU64::new(0),
            max: max.max(1) as u64,
            max_per_peer: max_per_peer.max(1),
            peers: PeerSlots::default(),
            refused: Default::default(),
        }
    }

    /// Count a connection just accepted from `peer`, or say why it must be
    /// closed (counted too).
    pub(in crate::server) fn admit(self: &Arc<Self>, peer: IpAddr) -> Result<Open, Refused> {
        if !self.peers.take(peer, self.max_per_peer) {
            return Err(self.refuse(Refused::Peer));
        }
        let taken = self
            .open
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.max).then_some(n + 1)
            });
        if taken.is_err() {
            self.peers.give_back(peer);
            return Err(self.refuse(Refused::Total));
        }
        Ok(Open {
            conns: self.clone(),
            peer,
        })
    }

    fn refuse(&self, why: Refused) -> Refused {
        self.refused[why as usize].fetch_add(1, Ordering::Relaxed);
        why
    }

    /// Connections open now.
    pub(in crate::server) fn open(&self) -> u64 {
        self.open.load(Ordering::Relaxed)
    }

    /// The bound on both ports together.
    pub(in crate::server) fn max(&self) -> u64 {
        self.max
    }

    /// The bound per peer address.
    pub(in crate::server) fn max_per_peer(&self) -> usize {
        self.max_per_peer
    }

    /// Connections refused so far for `why`.
    pub(in crate::server) fn refused(&self, why: Refused) -> u64 {
        self.refused[why as usize].load(Ordering::Relaxed)
    }
}

/// An open connection, counted until dropped.
#[derive(Debug)]
pub(in crate::server) struct Open {
    conns: Arc<Connections>,
    peer: IpAddr,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.conns.open.fetch_sub(1, Ordering::Relaxed);
        self.conns.peers.give_back(self.peer);
    }
}

/// The connection bounds a collector runs with, fitted to the descriptors
/// it may open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(in crate::server) struct Fitted {
    pub(in crate::server) max: usize,
    pub(in crate::server) max_per_peer: usize,
    /// What to tell the operator when the limit is below what the bounds
    /// asked for need.
    pub(in crate::server) warning: Option<String>,
}

/// The default per-peer bound for a total of `max`: a sixteenth, at least 1.
fn default_per_peer(max: usize) -> usize {
    (max / 16).max(1)
}

/// Fit `max` connections (and `per_peer`, `None`: the default share) to a
/// descriptor limit of `limit` (`None`: unlimited): with fewer than `max` +
/// [`RESERVED_DESCRIPTORS`], the bounds shrink to what the limit leaves and
/// a warning says so.
pub(in crate::server) fn fit(limit: Option<u64>, max: usize, per_peer: Option<usize>) -> Fitted {
    let max = max.max(1);
    let need = max as u64 + RESERVED_DESCRIPTORS;
    let (fitted, warning) = match limit {
        Some(limit) if limit < need => {
            let fitted = usize::try_from(limit.saturating_sub(RESERVED_DESCRIPTORS))
                .unwrap_or(usize::MAX)
                .max(1);
            let per = per_peer.unwrap_or(default_per_peer(fitted)).min(fitted);
            let warning = format!(
                "the open-file limit (RLIMIT_NOFILE) is {limit}, below the {need} descriptors \
                 --max-connections {max} needs (one a connection, and {RESERVED_DESCRIPTORS} for \
                 the store, Parquet files and listeners): at most {fitted} connections are kept \
                 open, {per} per peer address. Raise the limit (`ulimit -n`, systemd \
                 `LimitNOFILE=`) or lower --max-connections"
            );
            (fitted, Some(warning))
        }
        _ => (max, None),
    };
    let max_per_peer = per_peer
        .unwrap_or(default_per_peer(fitted))
        .clamp(1, fitted);
    Fitted {
        max: fitted,
        max_per_peer,
        warning,
    }
}

/// The process's open-file limit, its soft limit first raised to its hard
/// one (`None`: unlimited, or unknown on this platform).
pub(in crate::server) fn descriptor_limit() -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
        let limit = getrlimit(Resource::Nofile);
        // `None` is unlimited.
        let below_hard = match (limit.current, limit.maximum) {
            (Some(soft), Some(hard)) => soft < hard,
            (Some(_), None) => true,
            (None, _) => false,
        };
        if below_hard {
            let raised = Rlimit {
                current: limit.maximum,
                maximum: limit.maximum,
            };
            if setrlimit(Resource::Nofile, raised).is_ok() {
                return limit.maximum;
            }
        }
        limit.current
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_beyond_its_share_or_anyone_beyond_the_total_is_refused_and_counted() {
        let conns = Arc::new(Connections::new(5, 3));
        let (a, b, c): (IpAddr, IpAddr, IpAddr) = (
            "127.0.0.2".parse().unwrap(),
            "127.0.0.1".parse().unwrap(),
            "::1".parse().unwrap(),
        );
        let held: Vec<Open> = (0..3).map(|_| conns.admit(a).unwrap()).collect();
        assert_eq!(conns.admit(a).unwrap_err(), Refused::Peer);
        // Another address still gets in, up to the total.
        let b1 = conns.admit(b).unwrap();
        let _b2 = conns.admit(b).unwrap();
        assert_eq!(conns.admit(c).unwrap_err(), Refused::Total);
        assert_eq!(conns.open(), 5);
        // A closed connection frees its peer's share and the total.
        drop(b1);
        let _c1 = conns.admit(c).unwrap();
        drop(held);
        let _a1 = conns.admit(a).unwrap();
        assert_eq!(conns.open(), 3);
        assert_eq!(conns.refused(Refused::Peer), 1);
        assert_eq!(conns.refused(Refused::Total), 1);
    }

    #[test]
    fn bounds_fit_the_descriptor_limit_or_warn() {
        /// Name, limit, --max-connections, --max-connections-per-peer; the
        /// bounds fitted, and whether it warns.
        type Case = (
            &'static str,
            Option<u64>,
            usize,
            Option<usize>,
            usize,
            usize,
            bool,
        );
        #[rustfmt::skip]
        let cases: [Case; 6] = [
            ("unlimited",              None,         8192, None,       8192, 512, false),
            ("room to spare",          Some(20_000), 8192, None,       8192, 512, false),
            ("exactly enough",         Some(8448),   8192, None,       8192, 512, false),
            ("too few: shrunk",        Some(1024),   8192, None,        768,  48, true),
            ("too few, per peer given", Some(1024),  8192, Some(2000),  768, 768, true),
            ("per peer above the total", None,       100,  Some(500),   100, 100, false),
        ];
        for (name, limit, max, per_peer, want_max, want_per_peer, warns) in cases {
            let f = fit(limit, max, per_peer);
            assert_eq!(
                (f.max, f.max_per_peer, f.warning.is_some()),
                (want_max, want_per_peer, warns),
                "{name}"
            );
        }
        let warning = fit(Some(1024), 8192, None).warning.unwrap();
        for part in ["RLIMIT_NOFILE", "1024", "8448", "at most 768", "ulimit -n"] {
            assert!(warning.contains(part), "{part}: {warning}");
        }
    }
}
