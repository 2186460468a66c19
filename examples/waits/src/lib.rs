//! A handler that waits on four things cpt does not instrument, and the
//! subscriber that names them.
//!
//! [`handle`] awaits, in sequence:
//!
//! 1. a 10 ms `tokio::time::sleep`;
//! 2. a permit of a `tokio::sync::Semaphore` (the [`Backend`]'s pool) that
//!    another request holds for 25 ms from its start, so about 15 ms;
//! 3. a oneshot answered by a spawned task (a node, [`task::spawn`]) after
//!    20 ms of its own (it goes on for 30 ms after answering);
//! 4. a TCP read from a server that is not traced at all and answers after
//!    25 ms.
//!
//! With the `named-waits` feature and `RUSTFLAGS="--cfg tokio_unstable"`,
//! its path names each wait: `[sleep src/lib.rs:…]`, `[semaphore
//! src/lib.rs:…]`, the task's node, `[io]`. Without them, the task is still
//! the blocker of the oneshot (its waker names it), and the other three are
//! `[unattributed]`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use cpt_sdk::layer::filter::NamedWaits;
use cpt_sdk::task;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, oneshot};
use tracing_subscriber::filter::LevelFilter;

/// How long each of the handler's waits is meant to take.
pub mod ms {
    /// The sleep.
    pub const SLEEP: u64 = 10;
    /// How long the other request holds the pool's permit (from its start).
    pub const HOLD: u64 = 25;
    /// The semaphore wait: the hold, less the sleep.
    pub const SEMAPHORE: u64 = HOLD - SLEEP;
    /// The spawned task's own time before it answers.
    pub const TASK: u64 = 20;
    /// What the task does after it answered (off the handler's path; it
    /// ends after the response).
    pub const TASK_AFTER: u64 = 30;
    /// The uninstrumented server's answer.
    pub const SERVER: u64 = 25;
}

/// What the handler talks to: a one-permit pool and an untraced server.
#[derive(Debug, Clone)]
pub struct Backend {
    pool: Arc<Semaphore>,
    server: SocketAddr,
}

impl Backend {
    /// The pool, and a TCP server (not traced) answering each line after
    /// [`ms::SERVER`].
    pub async fn start() -> anyhow::Result<Backend> {
        let pool = Arc::new(Semaphore::new(1));
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let server = listener.local_addr()?;
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1];
                    while conn.read_exact(&mut buf).await.is_ok() {
                        tokio::time::sleep(Duration::from_millis(ms::SERVER)).await;
                        if conn.write_all(&buf).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        Ok(Backend { pool, server })
    }

    /// A connection to the server, made before the request.
    pub async fn connect(&self) -> anyhow::Result<TcpStream> {
        Ok(TcpStream::connect(self.server).await?)
    }

    /// The other request: holds the pool's permit for [`ms::HOLD`].
    pub async fn hold_the_pool(&self) {
        let _permit = self.pool.acquire().await.expect("the pool is never closed");
        tokio::time::sleep(Duration::from_millis(ms::HOLD)).await;
    }
}

/// The handler: a node (`task::node`, so that cpt sees who wakes it)
/// awaiting the four waits in sequence.
pub async fn handle(backend: &Backend, conn: &mut TcpStream) -> anyhow::Result<u8> {
    task::node("handle", async {
        // 1. A timer: a database, say.
        tokio::time::sleep(Duration::from_millis(ms::SLEEP)).await;
        // 2. A pool's permit, held by another request.
        let _permit = backend.pool.acquire().await?;
        // 3. A oneshot answered by a task of this request.
        let (tx, rx) = oneshot::channel();
        task::spawn("price", async move {
            tokio::time::sleep(Duration::from_millis(ms::TASK)).await;
            let _ = tx.send(7u8);
            // It goes on after answering and ends after the response: only
            // its wake says it was what the handler waited on.
            tokio::time::sleep(Duration::from_millis(ms::TASK_AFTER)).await;
        });
        let price = rx.await?;
        // 4. A socket: a driver's query to a server cpt does not see.
        conn.write_all(&[price]).await?;
        let mut answer = [0u8; 1];
        conn.read_exact(&mut answer).await?;
        Ok(answer[0])
    })
    .await
}

/// The filter of cpt's layer: the few of tokio's spans and events that name
/// waits, and everything else at INFO. Give it to cpt's layer alone
/// (`layer.with_filter(...)`), so that other layers (logs) keep their own
/// filter.
pub fn cpt_filter() -> NamedWaits<LevelFilter> {
    NamedWaits::new(LevelFilter::INFO)
}
