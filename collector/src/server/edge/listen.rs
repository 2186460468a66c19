//! Accepting connections for both front ends, with the per-connection
//! limits a server on an open network needs (hyper's defaults have none):
//!
//! - **header-read timeout** (HTTP/1): a request whose headers have not all
//!   arrived within [`ConnLimits::header_read_timeout`] closes the
//!   connection;
//! - **idle timeout**: a connection with no request in flight that has sent
//!   or received nothing for [`ConnLimits::idle_timeout`] is closed (this
//!   also covers a connection that never sends a byte, HTTP/1 or HTTP/2);
//! - **HTTP/2 streams**: at most [`ConnLimits::max_streams`] concurrent
//!   streams per connection;
//! - **connections**: at most so many open, in total and per peer address
//!   (`connections.rs`); one beyond them is closed as soon as accepted.
//!
//! With TLS, the handshake must finish within the header-read timeout.
//!
//! The body of an admitted request has its own deadline
//! ([`crate::server::ServeConfig::body_timeout`]), enforced by the handlers.
//!
//! **Stopping**: when the collector stops, every connection is told
//! (HTTP/2 `GOAWAY`, HTTP/1 `Connection: close`) and closed as soon as no
//! request is in flight on it, without waiting for the peer: an exporter's
//! idle connection whose client runtime is not being polled never answers a
//! `GOAWAY`'s ping. A request still in flight [`DRAIN`] after the stop is
//! cut; nothing was acknowledged for it, so its sender retries it (and the
//! batch id keeps it from being stored twice).

use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::codegen::Service;

use crate::server::edge::connections::Connections;

/// How long a stopping collector lets in-flight requests finish.
pub(in crate::server) const DRAIN: Duration = Duration::from_secs(1);

/// How long a stopping connection with nothing in flight is given to send
/// its `GOAWAY` before it is closed.
const GOAWAY_GRACE: Duration = Duration::from_millis(20);

/// Per-connection limits (see the module docs).
#[derive(Clone, Copy, Debug)]
pub(in crate::server) struct ConnLimits {
    pub(in crate::server) header_read_timeout: Duration,
    pub(in crate::server) idle_timeout: Duration,
    pub(in crate::server) max_streams: u32,
}

/// Serve `service` on every connection `listener` accepts (over TLS with
/// `tls`) until `stop` is set, then let the open connections finish (each
/// still under its idle timeout) and return.
pub(in crate::server) async fn serve<S, B>(
    listener: TcpListener,
    service: S,
    limits: ConnLimits,
    tls: Option<Arc<rustls::ServerConfig>>,
    mut stop: watch::Receiver<bool>,
    connections: Arc<Connections>,
) -> io::Result<()>
where
    S: Service<http::Request<Incoming>, Response = http::Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut conns = tokio::task::JoinSet::new();
    let conn_stop = stop.clone();
    let tls = tls.map(tokio_rustls::TlsAcceptor::from);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(s) => s,
                    // Out of file descriptors and the like: back off, keep serving.
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let peer = peer.ip();
                let Ok(open) = connections.admit(peer) else {
                    // Beyond the bounds: closed now, with a reset.
                    let _ = stream.set_zero_linger();
                    drop(stream);
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let (service, stop, tls) = (service.clone(), conn_stop.clone(), tls.clone());
                conns.spawn(async move {
                    let _open = open;
                    match tls {
                        None => connection(stream, peer, service, limits, stop).await,
                        Some(acceptor) => {
                            // A peer that never completes the handshake is
                            // dropped like one that never sends its headers.
                            let handshake = acceptor.accept(stream);
                            if let Ok(Ok(stream)) =
                                tokio::time::timeout(limits.header_read_timeout, handshake).await
                            {
                                connection(stream, peer, service, limits, stop).await;
                            }
                        }
                    }
                });
            }
            () = until_stopped(&mut stop) => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    while conns.join_next().await.is_some() {}
    Ok(())
}

async fn connection<T, S, B>(
    stream: T,
    peer: std::net::IpAddr,
    service: S,
    limits: ConnLimits,
    mut stop: watch::Receiver<bool>,
) where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: Service<http::Request<Incoming>, Response = http::Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let start = Instant::now();
    let activity = Arc::new(Activity {
        last_ms: AtomicU64::new(0),
        in_flight: AtomicUsize::new(0),
        start,
    });
    let io = TokioIo::new(Tracked {
        inner: crate::server::edge::headers::ParseErrorHeaders::new(stream),
        activity: activity.clone(),
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_streams)
        .max_pending_accept_reset_streams(Some(limits.max_streams as usize * 2))
        .max_local_error_reset_streams(Some(limits.max_streams as usize * 2));
    let counted = activity.clone();
    let svc = hyper::service::service_fn(move |mut req: http::Request<Incoming>| {
        // Admission shares receiving slots fairly between peer addresses.
        req.extensions_mut()
            .insert(crate::server::ingest::receiving::PeerIp(peer));
        let guard = InFlight::enter(counted.clone());
        let mut service = service.clone();
        async move {
            std::future::poll_fn(|cx| service.poll_ready(cx)).await?;
            let resp = service.call(req).await;
            drop(guard);
            resp
        }
    });
    let conn = builder.serve_connection(io, svc);
    let mut conn = std::pin::pin!(conn);
    let idle_tick =
        (limits.idle_timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    let mut stopping: Option<Instant> = None;
    loop {
        let tick = if stopping.is_some() {
            Duration::from_millis(10)
        } else {
            idle_tick
        };
        tokio::select! {
            _ = conn.as_mut() => return,
            () = until_stopped(&mut stop), if stopping.is_none() => {
                stopping = Some(Instant::now());
                conn.as_mut().graceful_shutdown();
            }
            () = tokio::time::sleep(tick) => {
                let nothing_in_flight = activity.in_flight.load(Ordering::Relaxed) == 0;
                let done = match stopping {
                    // Dropping the connection closes it.
                    Some(since) => {
                        let waited = since.elapsed();
                        (nothing_in_flight && waited >= GOAWAY_GRACE) || waited >= DRAIN
                    }
                    None => nothing_in_flight && activity.idle_for() >= limits.idle_timeout,
                };
                if done {
                    return;
                }
            }
        }
    }
}

async fn until_stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

#[derive(Debug)]
struct Activity {
    /// Milliseconds after `start` of the last byte read or written.
    last_ms: AtomicU64,
    in_flight: AtomicUsize,
    start: Instant,
}

impl Activity {
    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    fn idle_for(&self) -> Duration {
        let now = self.start.elapsed();
        now.saturating_sub(Duration::from_millis(self.last_ms.load(Ordering::Relaxed)))
    }
}

struct InFlight(Arc<Activity>);

impl InFlight {
    fn enter(a: Arc<Activity>) -> InFlight {
        a.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(a)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A stream that records when it last moved a byte.
struct Tracked<T> {
    inner: T,
    activity: Arc<Activity>,
}

impl<T: AsyncRead + Unpin> AsyncRead for Tracked<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let res = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(res, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.touch();
        }
        res
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Tracked<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let res = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(res, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        res
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let res = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(res, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        res
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
