//! Receiving a request body fairly: a slot per body, shared fairly between
//! peer addresses, and a minimum rate the body must arrive at.
//!
//! # The rule
//!
//! A request takes one of [`crate::server::ServeConfig::max_receiving_bodies`]
//! receiving slots while its body arrives. One peer address (its IP: every
//! port and connection of it, HTTP/1 and HTTP/2 streams alike) holds at most
//! [`crate::server::ServeConfig::max_receiving_bodies_per_peer`] of them (default: a
//! quarter of the slots, at least one). Beyond that the peer's next request
//! is refused at once (HTTP 429 / `RESOURCE_EXHAUSTED`, `Retry-After: 1`)
//! while other peers still find slots: one address with hundreds of slow
//! senders cannot keep everyone else out. Peers behind one NAT or proxy
//! share its address and its share.
//!
//! A body must also keep arriving: after a grace period of
//! [`BODY_RATE_GRACE`], a body whose average rate since its request started
//! falls below [`crate::server::ServeConfig::min_body_rate`] bytes per second is cut
//! (HTTP 408 / `DEADLINE_EXCEEDED`), freeing its slot long before
//! [`crate::server::ServeConfig::body_timeout`].

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http_body_util::BodyExt;
use tokio::sync::OwnedSemaphorePermit;

/// How long a body may arrive at any pace before the minimum rate applies.
pub const BODY_RATE_GRACE: Duration = Duration::from_secs(5);

/// The peer address of a request's connection, in its extensions
/// (`listen.rs` puts it there).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::server) struct PeerIp(pub(in crate::server) IpAddr);

/// Receiving slots held, per peer address.
#[derive(Debug, Default)]
pub(in crate::server) struct PeerSlots {
    held: Mutex<HashMap<IpAddr, usize>>,
}

impl PeerSlots {
    /// Take one of `peer`'s at most `max` slots; `false` when it holds them
    /// all.
    pub(in crate::server) fn take(&self, peer: IpAddr, max: usize) -> bool {
        let mut held = self
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = held.entry(peer).or_default();
        if *n >= max {
            return false;
        }
        *n += 1;
        true
    }

    /// Give back one of `peer`'s slots.
    pub(in crate::server) fn give_back(&self, peer: IpAddr) {
        let mut held = self
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = held.get_mut(&peer) {
            *n -= 1;
            if *n == 0 {
                held.remove(&peer);
            }
        }
    }
}

/// A receiving slot, given back when dropped.
pub(in crate::server) struct Receiving {
    _permit: OwnedSemaphorePermit,
    peer: Option<(Arc<PeerSlots>, IpAddr)>,
}

impl fmt::Debug for Receiving {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Receiving")
            .field("peer", &self.peer.as_ref().map(|(_, ip)| ip))
            .finish()
    }
}

impl Drop for Receiving {
    fn drop(&mut self) {
        if let Some((slots, ip)) = &self.peer {
            slots.give_back(*ip);
        }
    }
}

/// Why a slot was not given.
#[derive(Debug)]
pub(in crate::server) enum NoSlot {
    /// This peer holds its share.
    Peer,
    /// Every slot is taken.
    All,
}

/// Take a slot for a body from `peer` (its share first, then a global
/// permit).
pub(in crate::server) fn take_slot(
    slots: &Arc<PeerSlots>,
    global: &Arc<tokio::sync::Semaphore>,
    peer: Option<IpAddr>,
    per_peer: usize,
) -> Result<Receiving, NoSlot> {
    if let Some(ip) = peer
        && !slots.take(ip, per_peer)
    {
        return Err(NoSlot::Peer);
    }
    match global.clone().try_acquire_owned() {
        Ok(permit) => Ok(Receiving {
            _permit: permit,
            peer: peer.map(|ip| (slots.clone(), ip)),
        }),
        Err(_) => {
            if let Some(ip) = peer {
                slots.give_back(ip);
            }
            Err(NoSlot::All)
        }
    }
}

/// Why a body was not received.
#[derive(Debug)]
pub(in crate::server) enum BodyError {
    /// Over the size limit.
    TooLarge,
    /// Not complete within the body timeout.
    Timeout,
    /// Below the minimum rate after the grace period.
    TooSlow { received: usize, after: Duration },
    /// The connection failed.
    Read(String),
}

/// Receive a whole body of at most `limit` bytes within `timeout`, at an
/// average of at least `min_rate` bytes per second after
/// [`BODY_RATE_GRACE`] (`0`: no minimum).
pub(in crate::server) async fn collect<B>(
    body: B,
    limit: usize,
    timeout: Duration,
    min_rate: u64,
) -> Result<Bytes, BodyError>
where
    B: hyper::body::Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    // tokio's clock: the tests run it paused.
    use tokio::time::Instant;
    let mut body = std::pin::pin!(body);
    let start = Instant::now();
    let hard = start + timeout;
    let mut buf = BytesMut::new();
    loop {
        let deadline = if min_rate == 0 {
            hard
        } else {
            let owed = Duration::from_secs_f64(buf.len() as f64 / min_rate as f64);
            hard.min(start + BODY_RATE_GRACE + owed)
        };
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) if Instant::now() >= hard => return Err(BodyError::Timeout),
            Err(_) => {
                return Err(BodyError::TooSlow {
                    received: buf.len(),
                    after: start.elapsed(),
                });
            }
            Ok(None) => return Ok(buf.freeze()),
            Ok(Some(Err(e))) => return Err(BodyError::Read(e.into().to_string())),
            Ok(Some(Ok(frame))) => {
                if let Ok(mut data) = frame.into_data() {
                    if buf.len() + data.remaining() > limit {
                        return Err(BodyError::TooLarge);
                    }
                    while data.has_remaining() {
                        let chunk = data.chunk();
                        buf.extend_from_slice(chunk);
                        let n = chunk.len();
                        data.advance(n);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_gets_its_share_and_others_the_rest() {
        let slots = Arc::new(PeerSlots::default());
        let global = Arc::new(tokio::sync::Semaphore::new(4));
        let a: IpAddr = "127.0.0.2".parse().unwrap();
        let b: IpAddr = "127.0.0.1".parse().unwrap();
        let held: Vec<_> = (0..2)
            .map(|_| take_slot(&slots, &global, Some(a), 2).unwrap())
            .collect();
        assert!(matches!(
            take_slot(&slots, &global, Some(a), 2),
            Err(NoSlot::Peer)
        ));
        let b1 = take_slot(&slots, &global, Some(b), 2).unwrap();
        let _b2 = take_slot(&slots, &global, Some(b), 2).unwrap();
        // All four taken: a third peer finds none, and its share is not kept.
        let c: IpAddr = "::1".parse().unwrap();
        assert!(matches!(
            take_slot(&slots, &global, Some(c), 2),
            Err(NoSlot::All)
        ));
        assert!(!slots.held.lock().unwrap().contains_key(&c));
        drop(b1);
        let _c1 = take_slot(&slots, &global, Some(c), 2).unwrap();
        drop(held);
        assert!(!slots.held.lock().unwrap().contains_key(&a));
    }

    /// A body fed by a channel.
    struct Fed(tokio::sync::mpsc::Receiver<Bytes>);

    impl hyper::body::Body for Fed {
        type Data = Bytes;
        type Error = std::io::Error;
        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, std::io::Error>>> {
            self.0
                .poll_recv(cx)
                .map(|b| b.map(|b| Ok(hyper::body::Frame::data(b))))
        }
    }

    /// A body of `chunks` chunks of `size` bytes, one a second.
    fn trickle(chunks: usize, size: usize) -> Fed {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tokio::spawn(async move {
            for _ in 0..chunks {
                if tx.send(Bytes::from(vec![b'x'; size])).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        Fed(rx)
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_below_the_minimum_rate_is_cut_after_the_grace() {
        // 10 bytes a second against a minimum of 100.
        let got = collect(trickle(100, 10), 1 << 20, Duration::from_secs(30), 100).await;
        match got {
            Err(BodyError::TooSlow { after, received }) => {
                assert!(
                    after >= BODY_RATE_GRACE && after < Duration::from_secs(10),
                    "{after:?}"
                );
                assert!(received < 100, "{received}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_at_the_minimum_rate_is_received_whole() {
        let got = collect(trickle(20, 200), 1 << 20, Duration::from_secs(30), 100)
            .await
            .unwrap();
        assert_eq!(got.len(), 4000);
    }

    #[tokio::test(start_paused = true)]
    async fn the_body_timeout_still_applies_without_a_minimum_rate() {
        let got = collect(trickle(100, 10), 1 << 20, Duration::from_secs(30), 0).await;
        assert!(matches!(got, Err(BodyError::Timeout)), "{got:?}");
    }
}
