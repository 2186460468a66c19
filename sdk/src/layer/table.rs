//! Which node a span is: a per-layer table from span id to [`NodeState`],
//! so that recording a node takes no registry lookup, no extensions lock and
//! no `Box` per span.
//!
//! The table is direct-mapped: a span id hashes to one slot, which a node
//! claims at creation (or [`begin`](super::request::begin)) and releases at
//! its close. A span whose slot is taken by another open node keeps its
//! state in its registry extensions instead (counted, so that while no span
//! does, a span missing from the table is known not to be a node without
//! asking the registry). Ids are unique among a registry's open spans, and
//! every callback on a span runs while the span is open, so a slot holding
//! an id holds that open span's state; a slot is emptied at the span's
//! close, before the registry can reuse the id.
//!
//! The table is allocated at the first traced request of the layer it
//! belongs to; a layer that never traces never allocates it.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use tracing::span::Id;

use super::node::NodeState;

/// Slots per table (a power of two). Open nodes beyond what fits spill into
/// registry extensions: slower, same results.
const SLOTS: usize = 4096;
const SHIFT: u32 = 64 - SLOTS.trailing_zeros();

/// An empty slot's key (span ids are never zero).
const EMPTY: u64 = 0;

#[derive(Debug, Default)]
pub(crate) struct NodeTable {
    slots: OnceLock<Box<[Slot]>>,
    /// Nodes whose state is in registry extensions (their slot was taken).
    pub(crate) spilled: AtomicUsize,
}

#[derive(Debug, Default)]
struct Slot {
    /// The id of the span whose state this slot holds, or [`EMPTY`].
    key: AtomicU64,
    /// Locked only by callbacks on that span: uncontended in practice.
    state: Mutex<Option<NodeState>>,
}

impl Slot {
    fn state(&self) -> std::sync::MutexGuard<'_, Option<NodeState>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The bits of a span id the layer's tables hash. `tracing-subscriber`'s
/// registry makes ids of a slab key: the slot's address and the thread's
/// shard in the low 50 bits, and above them a generation that changes each
/// time the slot is used again. Leaving the generation out keeps what a
/// registry slot's spans have in one place of the table, still in cache
/// when the slot's next span comes (a slot of the table holds the whole id,
/// so any id is still found exactly, whatever its subscriber's ids are).
const HASHED_BITS: u64 = (1 << 50) - 1;

/// A span id's hash: its high bits pick a place in a table.
#[inline]
pub(super) fn id_hash(id: &Id) -> u64 {
    // Fibonacci hashing: registry ids differ in their low bits.
    (id.into_u64() & HASHED_BITS).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

#[inline]
fn index(id: &Id) -> usize {
    (id_hash(id) >> SHIFT) as usize
}

impl NodeTable {
    fn slot(&self, id: &Id) -> Option<&Slot> {
        Some(&self.slots.get()?[index(id)])
    }

    /// Allocate the slots (at the first traced request).
    pub(crate) fn allocate(&self) {
        self.slots
            .get_or_init(|| (0..SLOTS).map(|_| Slot::default()).collect());
    }

    /// The state of the node `id`, if the table has it.
    #[inline]
    pub(crate) fn get(&self, id: &Id) -> Option<NodeState> {
        let slot = self.slot(id)?;
        if slot.key.load(Ordering::Acquire) != id.into_u64() {
            return None;
        }
        slot.state().clone()
    }

    /// Make `id` the node `state` (replacing what it was); gives `state`
    /// back when its slot holds another span (or the table is not
    /// allocated).
    pub(crate) fn insert(&self, id: &Id, state: NodeState) -> Result<(), NodeState> {
        let Some(slot) = self.slot(id) else {
            return Err(state);
        };
        let key = id.into_u64();
        let claimed =
            match slot
                .key
                .compare_exchange(EMPTY, key, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => true,
                Err(k) => k == key,
            };
        if !claimed {
            return Err(state);
        }
        *slot.state() = Some(state);
        Ok(())
    }

    /// Release `id`'s slot at its close, returning its state.
    pub(crate) fn remove(&self, id: &Id) -> Option<NodeState> {
        let slot = self.slot(id)?;
        if slot.key.load(Ordering::Acquire) != id.into_u64() {
            return None;
        }
        let state = slot.state().take();
        slot.key.store(EMPTY, Ordering::Release);
        state
    }
}
