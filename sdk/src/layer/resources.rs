//! Which tokio resource each open `runtime.resource` span is: a per-layer
//! table from span id to the resource's interned site
//! ([`waits::SiteId`](super::waits::SiteId)), so that naming a resource at
//! its creation takes no registry lookup, no extensions lock and no `Box`,
//! and finding it again at a poll takes no registry lookup either.
//!
//! The table is set-associative: a span id hashes to one bucket of four
//! slots, one cache line; a resource claims a free slot of its bucket at its
//! creation and releases it at its close. A resource whose bucket is full,
//! or whose site the process-wide site table had no room for, keeps its
//! site in its registry extensions instead (counted, so that while none
//! does, a span missing from the table is known not to be a resource
//! without asking the registry). As for the node table, ids are unique among
//! a registry's open spans and every callback on a span runs while it is
//! open, so a slot holding an id holds that open span's site; a slot is
//! emptied at the span's close, before the registry can reuse the id.
//!
//! A span made inside a resource while a request is traced (tokio's
//! `async_op` spans and the `async_op.poll` spans inside those) takes a slot
//! too, marked as no resource: it is no node, nor are its children, which
//! the layer then knows without a registry lookup.
//!
//! The table is allocated when the layer sees its first resource span.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

use tracing::span::Id;

use super::waits::SiteId;

/// Buckets per table (a power of two); four slots each.
const BUCKETS: usize = 4096;
const WAYS: usize = 4;
const SHIFT: u32 = 64 - BUCKETS.trailing_zeros();

/// An empty slot's key (span ids are never zero).
const EMPTY: u64 = 0;

/// The site of a slot that holds a span made inside a resource (tokio's
/// `async_op` spans), not a resource: such spans are no nodes, nor are
/// their children.
const INSIDE: u32 = u32::MAX;

#[derive(Debug, Default)]
pub(crate) struct ResourceTable {
    buckets: OnceLock<Box<[Bucket; BUCKETS]>>,
    /// Resources whose site is in registry extensions.
    pub(crate) spilled: AtomicUsize,
}

/// Four slots in one cache line: span ids, and the site of each.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Bucket {
    keys: [AtomicU64; WAYS],
    sites: [AtomicU32; WAYS],
}

#[inline]
fn index(id: &Id) -> usize {
    (super::table::id_hash(id) >> SHIFT) as usize
}

impl ResourceTable {
    #[inline]
    fn bucket(&self, id: &Id) -> Option<&Bucket> {
        Some(&self.buckets.get()?[index(id)])
    }

    /// Keep `site` as resource `id`'s; false when its bucket is full.
    #[cfg(test)]
    pub(crate) fn insert(&self, id: &Id, site: SiteId) -> bool {
        self.insert_raw(id, site.0)
    }

    /// Keep `id` as a span made inside a resource (no room: it is not kept,
    /// and its children take the slower way to the same answer).
    pub(crate) fn insert_inside(&self, id: &Id) {
        self.insert_raw(id, INSIDE);
    }

    fn insert_raw(&self, id: &Id, site: u32) -> bool {
        match self.claim(id) {
            Some(slot) => {
                slot.set(site);
                true
            }
            None => false,
        }
    }

    /// Take a slot for `id`, whose site is set later ([`Slot::set`]) or
    /// the slot given back ([`Slot::release`]).
    #[inline]
    pub(crate) fn claim(&self, id: &Id) -> Option<Slot<'_>> {
        let buckets = self.buckets.get_or_init(|| {
            let all: Box<[Bucket]> = (0..BUCKETS).map(|_| Bucket::default()).collect();
            all.try_into().expect("BUCKETS buckets")
        });
        let b = &buckets[index(id)];
        let key = id.into_u64();
        for (k, s) in b.keys.iter().zip(&b.sites) {
            if k.load(Ordering::Relaxed) == EMPTY
                && k.compare_exchange(EMPTY, key, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                // Until its site is set, the slot says "no resource": no
                // other thread has the span's id yet.
                s.store(INSIDE, Ordering::Relaxed);
                return Some(Slot { key: k, site: s });
            }
        }
        None
    }

    /// The site of resource `id`, if the table has it.
    #[inline]
    pub(crate) fn get(&self, id: &Id) -> Option<SiteId> {
        self.find(id).filter(|s| s.0 != INSIDE)
    }

    /// What the table has for `id`: a resource's site, or that it is a
    /// span inside one.
    #[inline]
    pub(crate) fn find(&self, id: &Id) -> Option<SiteId> {
        let b = self.bucket(id)?;
        let key = id.into_u64();
        let w = b
            .keys
            .iter()
            .position(|k| k.load(Ordering::Acquire) == key)?;
        Some(SiteId(b.sites[w].load(Ordering::Acquire)))
    }

    /// Release `id`'s slot at its close; true if it had one.
    #[inline]
    pub(crate) fn remove(&self, id: &Id) -> bool {
        let Some(b) = self.bucket(id) else {
            return false;
        };
        let key = id.into_u64();
        match b.keys.iter().find(|k| k.load(Ordering::Relaxed) == key) {
            Some(k) => {
                k.store(EMPTY, Ordering::Release);
                true
            }
            None => false,
        }
    }
}

/// A slot taken for a span, until its site is set or it is given back.
pub(crate) struct Slot<'a> {
    key: &'a AtomicU64,
    site: &'a AtomicU32,
}

impl Slot<'_> {
    /// Keep `site` as the span's.
    #[inline]
    pub(crate) fn set(self, site: u32) {
        self.site.store(site, Ordering::Release);
    }

    /// Give the slot back: the span is no resource.
    pub(crate) fn release(self) {
        self.key.store(EMPTY, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_bucket_refuses_and_a_close_frees_its_slot() {
        let t = ResourceTable::default();
        assert_eq!(t.get(&Id::from_u64(1)), None, "nothing before the first");
        // Ids of one bucket: the multiplier's inverse would do, a scan is plainer.
        let mut same: Vec<Id> = Vec::new();
        let mut n = 1u64;
        while same.len() < WAYS + 1 {
            let id = Id::from_u64(n);
            if index(&id) == index(&Id::from_u64(1)) {
                same.push(id);
            }
            n += 1;
        }
        for (i, id) in same[..WAYS].iter().enumerate() {
            assert!(t.insert(id, SiteId(i as u32)));
        }
        assert!(!t.insert(&same[WAYS], SiteId(9)), "the bucket is full");
        for (i, id) in same[..WAYS].iter().enumerate() {
            assert_eq!(t.get(id), Some(SiteId(i as u32)));
        }
        assert!(t.remove(&same[1]));
        assert!(!t.remove(&same[1]), "released once");
        assert_eq!(t.get(&same[1]), None);
        assert!(t.insert(&same[WAYS], SiteId(9)), "the freed slot is taken");
        assert_eq!(t.get(&same[WAYS]), Some(SiteId(9)));
        assert_eq!(t.get(&same[0]), Some(SiteId(0)), "the others kept theirs");
        // A span inside a resource is found, but is no resource.
        assert!(t.remove(&same[0]));
        t.insert_inside(&same[0]);
        assert!(t.find(&same[0]).is_some());
        assert_eq!(t.get(&same[0]), None);
    }

    /// A registry slot used again makes an id that differs only in its
    /// generation (bits 50 and up): the same bucket, still in cache, and
    /// still another span.
    #[test]
    fn ids_that_differ_only_in_their_generation_share_a_bucket_and_are_other_spans() {
        let t = ResourceTable::default();
        let slot = 0x0000_1234_5678_9abc_u64;
        let ids: Vec<Id> = (1..=3u64)
            .map(|generation| Id::from_u64(generation << 50 | slot))
            .collect();
        assert_eq!(index(&ids[0]), index(&ids[1]), "one bucket");
        assert_eq!(index(&ids[0]), index(&ids[2]), "one bucket");
        assert!(t.insert(&ids[1], SiteId(7)));
        assert_eq!(t.get(&ids[0]), None);
        assert_eq!(t.get(&ids[1]), Some(SiteId(7)));
        assert_eq!(t.get(&ids[2]), None);
        assert!(!t.remove(&ids[2]), "another span's slot is not freed");
        assert_eq!(t.get(&ids[1]), Some(SiteId(7)));
        // Slab slots of other threads' shards (bits 37 to 49) are spread.
        let shards: std::collections::HashSet<usize> = (0..64u64)
            .map(|tid| index(&Id::from_u64(tid << 37 | 1)))
            .collect();
        assert!(shards.len() > 56, "{} buckets for 64 shards", shards.len());
    }
}
