//! The task graph (Dagger producers, CPT "Identifying service
//! subcomponents") and the `join_all` future.
//!
//! # How the graph records blockers
//!
//! Every node's span is created when the graph starts running, as a child
//! of the span running the graph. A node starts (is first polled) in the
//! same poll in which its last input completed, and the graph records that
//! input as the blocker of the node's first poll
//! ([`request::note_blocker`](crate::request::note_blocker)). The walk then
//! goes from a node straight into the input that completed last, exactly as
//! Dagger's framework "knows which of A2, B1, and B2 was the last to block
//! execution".

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use super::Tracked;

type BoxFut<T> = Pin<Box<dyn Future<Output = T> + Send>>;
type Make<T> = Box<dyn FnOnce(Vec<T>) -> BoxFut<T> + Send>;

/// A handle to a node's output, used to declare another node's inputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Input(usize);

struct Spec<T> {
    name: String,
    inputs: Vec<usize>,
    make: Make<T>,
}

/// A graph of named async nodes whose values are all of type `T`; each node
/// declares its inputs and runs once they are all ready.
///
/// # Examples
///
/// ```
/// use cpt_sdk::task::TaskGraph;
///
/// # async fn demo() {
/// let mut g = TaskGraph::new();
/// let b1 = g.node("B1", &[], |_| async { 20 });
/// let a2 = g.node("A2", &[], |_| async { 2 });
/// let a1 = g.node("A1", &[b1, a2], |inputs: Vec<u64>| async move { inputs.iter().sum() });
/// assert_eq!(g.run(a1).await, 22);
/// # }
/// ```
pub struct TaskGraph<T> {
    specs: Vec<Spec<T>>,
}

impl<T> fmt::Debug for TaskGraph<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.specs.iter().map(|s| (&s.name, &s.inputs)))
            .finish()
    }
}

impl<T> Default for TaskGraph<T> {
    fn default() -> Self {
        TaskGraph { specs: Vec::new() }
    }
}

impl<T: Clone + Send + 'static> TaskGraph<T> {
    /// An empty graph.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add a node named `name` that runs `f(values of inputs, in order)` once
    /// every input has completed. Inputs must be nodes added earlier, so the
    /// graph is acyclic by construction.
    ///
    /// # Panics
    ///
    /// If an input is not from this graph.
    pub fn node<F, Fut>(&mut self, name: impl Into<String>, inputs: &[Input], f: F) -> Input
    where
        F: FnOnce(Vec<T>) -> Fut + Send + 'static,
        Fut: Future<Output = T> + Send + 'static,
    {
        let inputs: Vec<usize> = inputs.iter().map(|i| i.0).collect();
        assert!(
            inputs.iter().all(|&i| i < self.specs.len()),
            "task::TaskGraph::node: an input is not a node of this graph"
        );
        self.specs.push(Spec {
            name: name.into(),
            inputs,
            make: Box::new(move |v| Box::pin(f(v))),
        });
        Input(self.specs.len() - 1)
    }

    /// Run every node (each as a child node of the current span) and return
    /// `output`'s value.
    ///
    /// # Panics
    ///
    /// If `output` is not from this graph.
    pub fn run(self, output: Input) -> Run<T> {
        assert!(
            output.0 < self.specs.len(),
            "task::TaskGraph::run: output is not a node of this graph"
        );
        let n = self.specs.len();
        let mut dependants = vec![Vec::new(); n];
        let mut waiting = Vec::with_capacity(n);
        let mut nodes = Vec::with_capacity(n);
        for (i, s) in self.specs.into_iter().enumerate() {
            for &inp in &s.inputs {
                dependants[inp].push(i);
            }
            waiting.push(s.inputs.len());
            nodes.push(State::Waiting {
                span: super::node_span(&s.name),
                inputs: s.inputs,
                make: s.make,
            });
        }
        Run {
            nodes,
            dependants,
            waiting,
            output: output.0,
            started: false,
        }
    }
}

enum State<T> {
    Waiting {
        span: tracing::Span,
        inputs: Vec<usize>,
        make: Make<T>,
    },
    Running(Pin<Box<Tracked<BoxFut<T>>>>, tracing::Span),
    Done(T),
    Taken,
}

/// The future of [`TaskGraph::run`].
pub struct Run<T> {
    nodes: Vec<State<T>>,
    dependants: Vec<Vec<usize>>,
    waiting: Vec<usize>,
    output: usize,
    started: bool,
}

impl<T> fmt::Debug for Run<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Run")
            .field("nodes", &self.nodes.len())
            .finish_non_exhaustive()
    }
}

impl<T: Clone + Send + 'static> Run<T> {
    fn start(&mut self, i: usize, blocker: Option<&tracing::Span>) {
        let State::Waiting { span, inputs, make } =
            std::mem::replace(&mut self.nodes[i], State::Taken)
        else {
            return;
        };
        let values = inputs
            .iter()
            .map(|&inp| match &self.nodes[inp] {
                State::Done(v) => v.clone(),
                _ => unreachable!("a node starts only when its inputs are done; this is a bug"),
            })
            .collect();
        if let Some(b) = blocker {
            crate::request::note_blocker(&span, b);
        }
        let fut = Tracked::new(make(values), span.clone());
        self.nodes[i] = State::Running(Box::pin(fut), span);
    }
}

// No field is structurally pinned: running futures are boxed.
impl<T> Unpin for Run<T> {}

impl<T: Clone + Send + 'static> Future for Run<T> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let this = self.get_mut();
        if !this.started {
            this.started = true;
            for i in 0..this.nodes.len() {
                if this.waiting[i] == 0 {
                    this.start(i, None);
                }
            }
        }
        // Poll until no node completes; nodes whose inputs completed start
        // in the same pass, blocked on the input that completed last.
        loop {
            let mut progressed = false;
            for i in 0..this.nodes.len() {
                let State::Running(fut, _) = &mut this.nodes[i] else {
                    continue;
                };
                let Poll::Ready(v) = fut.as_mut().poll(cx) else {
                    continue;
                };
                let State::Running(_, span) = std::mem::replace(&mut this.nodes[i], State::Taken)
                else {
                    unreachable!()
                };
                this.nodes[i] = State::Done(v);
                progressed = true;
                for d in this.dependants[i].clone() {
                    this.waiting[d] -= 1;
                    if this.waiting[d] == 0 {
                        this.start(d, Some(&span));
                    }
                }
            }
            if let State::Done(v) = &this.nodes[this.output] {
                return Poll::Ready(v.clone());
            }
            if !progressed {
                return Poll::Pending;
            }
        }
    }
}

/// The future of [`join_all`](super::join_all).
pub(crate) struct JoinAll<F: Future> {
    futs: Vec<Option<Pin<Box<F>>>>,
    out: Vec<Option<F::Output>>,
}

impl<F: Future> JoinAll<F> {
    pub(crate) fn new(futs: Vec<F>) -> Self {
        let n = futs.len();
        JoinAll {
            futs: futs.into_iter().map(|f| Some(Box::pin(f))).collect(),
            out: (0..n).map(|_| None).collect(),
        }
    }
}

impl<F: Future> Unpin for JoinAll<F> {}

impl<F: Future> Future for JoinAll<F> {
    type Output = Vec<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let mut pending = false;
        for (slot, out) in this.futs.iter_mut().zip(this.out.iter_mut()) {
            if let Some(f) = slot {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => {
                        *out = Some(v);
                        // Drop the branch now: its span closes at its end.
                        *slot = None;
                    }
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            return Poll::Pending;
        }
        Poll::Ready(
            this.out
                .iter_mut()
                .map(|o| o.take().expect("every branch completed"))
                .collect(),
        )
    }
}
