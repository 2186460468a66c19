//! [`StringTable`]: the deduplicated strings of an encoded path.

use std::collections::hash_map::Entry;

use rustc_hash::FxHashMap as HashMap;

/// Interns strings in first-use order and hands out their indices.
///
/// The order is deterministic (first use while walking the frame tree), so
/// equal paths encode to equal bytes. Not `HashSet`-ordered, unlike
/// pprof-rs's table (STYLE.md §6).
#[derive(Debug, Default)]
pub(crate) struct StringTable<'a> {
    strings: Vec<&'a str>,
    index: HashMap<&'a str, u32>,
}

impl<'a> StringTable<'a> {
    /// The index of `s`, adding it if new.
    pub(crate) fn intern(&mut self, s: &'a str) -> u32 {
        match self.index.entry(s) {
            Entry::Occupied(e) => *e.get(),
            Entry::Vacant(e) => {
                // The encoder caps tree entries far below u32::MAX / 3, and
                // every string comes from a tree entry.
                let i = u32::try_from(self.strings.len())
                    .expect("more than u32::MAX strings in one path; this is a bug");
                self.strings.push(s);
                *e.insert(i)
            }
        }
    }

    /// An empty table with room for `n` strings.
    pub(crate) fn with_capacity(n: usize) -> Self {
        let mut index = HashMap::default();
        index.reserve(n);
        StringTable {
            strings: Vec::with_capacity(n),
            index,
        }
    }

    /// Empty the table, keeping its allocations.
    pub(crate) fn clear(&mut self) {
        self.strings.clear();
        self.index.clear();
    }

    /// How many strings the table holds.
    pub(crate) fn len(&self) -> usize {
        self.strings.len()
    }

    /// The strings, by index.
    pub(crate) fn as_slice(&self) -> &[&'a str] {
        &self.strings
    }

    /// The strings, by index, owned.
    #[cfg(test)]
    pub(crate) fn into_strings(self) -> Vec<String> {
        self.strings.into_iter().map(str::to_owned).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_table_is_first_use_ordered_and_deduplicated() {
        let mut t = StringTable::default();
        assert_eq!(t.intern("A"), 0);
        assert_eq!(t.intern("A1"), 1);
        assert_eq!(t.intern("A"), 0);
        assert_eq!(t.intern(""), 2);
        assert_eq!(t.into_strings(), vec!["A", "A1", ""]);
    }
}
