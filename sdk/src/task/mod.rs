//! Task hooks that make blocking relationships exact where plain spans
//! cannot: named nodes over futures, [`join`]/[`try_join`], [`spawn`] and
//! [`spawn_blocking`] linked to the spawning node, [`scope`] for threads,
//! and a small task graph ([`TaskGraph`]) in the spirit of Dagger producers (CPT
//! "Identifying service subcomponents").
//!
//! Every helper creates a child span of the current span, named by a
//! `cpt.name` field, so outside a traced request they cost what an ignored
//! span costs.
//!
//! ```
//! # use cpt_sdk::task;
//! # async fn demo() {
//! let (a, b) = task::join(("fetch_user", async { 1 }), ("fetch_cart", async { 2 })).await;
//! let total = task::spawn("price", async move { a + b }).await.unwrap();
//! # let _ = total;
//! # }
//! ```

mod future;
mod graph;

use std::future::Future;

pub use future::Tracked;
pub use graph::{Input, TaskGraph};

/// The task graph by its earlier name (renamed so it is not confused with
/// [`path::graph::Graph`](crate::path::graph::Graph), a request's node graph).
#[deprecated(since = "0.1.0", note = "renamed to `TaskGraph`")]
pub type Graph<T> = TaskGraph<T>;

/// The span of a helper node: a child of the current span named `name`.
pub fn node_span(name: &str) -> tracing::Span {
    tracing::info_span!(target: "cpt", "cpt.task", cpt.name = name)
}

/// Run `fut` as a node named `name` (a child of the current node).
///
/// Prefer this to `.instrument(span)` for `select!` arms: a cancelled
/// [`Tracked`] future is never taken for a blocker.
pub fn node<F: Future>(name: &str, fut: F) -> Tracked<F> {
    Tracked::new(fut, node_span(name))
}

/// Run two futures concurrently, each as a named node; the one that ends
/// last is what the caller was blocked on.
pub async fn join<A: Future, B: Future>(a: (&str, A), b: (&str, B)) -> (A::Output, B::Output) {
    let (a, b) = (node(a.0, a.1), node(b.0, b.1));
    tokio::join!(a, b)
}

/// [`join`] for three futures.
pub async fn join3<A: Future, B: Future, C: Future>(
    a: (&str, A),
    b: (&str, B),
    c: (&str, C),
) -> (A::Output, B::Output, C::Output) {
    let (a, b, c) = (node(a.0, a.1), node(b.0, b.1), node(c.0, c.1));
    tokio::join!(a, b, c)
}

/// Like [`join`] for fallible futures: returns the first error, dropping
/// (cancelling) the other branch, which is then off the path.
pub async fn try_join<A, B, TA, TB, E>(a: (&str, A), b: (&str, B)) -> Result<(TA, TB), E>
where
    A: Future<Output = Result<TA, E>>,
    B: Future<Output = Result<TB, E>>,
{
    let (a, b) = (node(a.0, a.1), node(b.0, b.1));
    tokio::try_join!(a, b)
}

/// Run many named futures concurrently; outputs in input order.
pub async fn join_all<F, I, S>(futures: I) -> Vec<F::Output>
where
    F: Future,
    I: IntoIterator<Item = (S, F)>,
    S: AsRef<str>,
{
    let nodes: Vec<_> = futures
        .into_iter()
        .map(|(name, f)| node(name.as_ref(), f))
        .collect();
    graph::JoinAll::new(nodes).await
}

/// `tokio::spawn` a named node linked to the current node: awaiting the
/// handle makes the task the blocker; a task never awaited is off the path.
///
/// # Panics
///
/// Outside a tokio runtime, like `tokio::spawn`.
pub fn spawn<F>(name: &str, fut: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(node(name, fut))
}

/// `tokio::task::spawn_blocking` of a named node linked to the current node.
///
/// # Panics
///
/// Outside a tokio runtime, like `tokio::task::spawn_blocking`.
pub fn spawn_blocking<F, R>(name: &str, f: F) -> tokio::task::JoinHandle<R>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    let span = node_span(name);
    tokio::task::spawn_blocking(move || span.in_scope(f))
}

/// `std::thread::scope` whose threads are named nodes of the current node.
///
/// The current node is busy while `f` runs and *waiting* while the scope
/// joins its threads, so the thread that ends last is the blocker (a plain
/// `std::thread::scope` inside an entered span would look like busy time).
pub fn scope<'env, F, R>(f: F) -> R
where
    F: for<'scope> FnOnce(&Scope<'scope, 'env>) -> R,
{
    let r = std::thread::scope(|s| {
        let r = f(&Scope { inner: s });
        crate::request::wait_begin();
        r
    });
    crate::request::wait_end();
    r
}

/// The scope of [`scope`].
#[derive(Debug)]
pub struct Scope<'scope, 'env> {
    inner: &'scope std::thread::Scope<'scope, 'env>,
}

impl<'scope> Scope<'scope, '_> {
    /// Spawn a scoped thread running `f` as a node named `name`.
    pub fn spawn<F, T>(&self, name: &str, f: F) -> std::thread::ScopedJoinHandle<'scope, T>
    where
        F: FnOnce() -> T + Send + 'scope,
        T: Send + 'scope,
    {
        let span = node_span(name);
        self.inner.spawn(move || span.in_scope(f))
    }
}
