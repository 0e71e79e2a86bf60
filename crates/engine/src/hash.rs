//! A fixed, seedless hasher for the engine's id indexes.
//!
//! `std`'s default `RandomState` seeds SipHash from the OS: fine for
//! iteration-free lookups, but it is slow for 8-byte keys and it is a source
//! of run-to-run variation we do not want anywhere near the engine. The
//! engine never iterates a hash map (that order would be arbitrary); it only
//! looks ids up. This is the multiply-rotate hash of rustc's `FxHasher`,
//! written out because it is ten lines and the hot path depends on it.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

#[derive(Default, Clone, Copy)]
pub struct IdHasher {
    hash: u64,
}

impl IdHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for IdHasher {
    #[inline]
    fn finish(&self) -> u64 {
        // Fold the well-mixed high bits down: hashbrown takes its bucket
        // index from the low bits.
        self.hash ^ (self.hash >> 29)
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }

    #[inline]
    fn write_u8(&mut self, value: u8) {
        self.add(u64::from(value));
    }

    #[inline]
    fn write_u32(&mut self, value: u32) {
        self.add(u64::from(value));
    }

    #[inline]
    fn write_u64(&mut self, value: u64) {
        self.add(value);
    }

    #[inline]
    fn write_usize(&mut self, value: usize) {
        self.add(value as u64);
    }
}

pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

pub fn id_map<K, V>() -> IdMap<K, V> {
    HashMap::with_hasher(BuildHasherDefault::default())
}

/// Id -> table index, for ids that operators usually hand out densely from
/// small numbers (accounts, instruments, assets): ids below `DENSE_LIMIT`
/// are found by direct indexing, any others by hashing. The dense part grows
/// to the largest small id seen (4 bytes per id), never beyond the limit.
pub struct DenseIndex {
    dense: Vec<u32>,
    sparse: IdMap<u64, u32>,
}

const DENSE_LIMIT: u64 = 1 << 20;
// `get` turns a 64-bit id into an index without losing bits.
const _: () = assert!(usize::BITS >= 64);
const ABSENT: u32 = u32::MAX;

impl Default for DenseIndex {
    fn default() -> Self {
        DenseIndex { dense: Vec::new(), sparse: id_map() }
    }
}

impl DenseIndex {
    #[inline]
    pub fn get(&self, id: u64) -> Option<u32> {
        // The dense part never reaches `DENSE_LIMIT`: an id past its end is
        // either absent or sparse, and only then is the limit compared.
        match self.dense.get(id as usize) {
            Some(&index) => (index != ABSENT).then_some(index),
            None if id < DENSE_LIMIT => None,
            None => self.sparse.get(&id).copied(),
        }
    }

    pub fn contains(&self, id: u64) -> bool {
        self.get(id).is_some()
    }

    /// Maps `id` to `index` (a new id; `index` is not `u32::MAX`).
    pub fn insert(&mut self, id: u64, index: u32) {
        assert!(index != ABSENT);
        if id < DENSE_LIMIT {
            let at = id as usize;
            if self.dense.len() <= at {
                self.dense.resize(at + 1, ABSENT);
            }
            self.dense[at] = index;
        } else {
            self.sparse.insert(id, index);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_and_sparse_ids_both_resolve() {
        let mut index = DenseIndex::default();
        index.insert(5, 0);
        index.insert(u64::MAX, 1);
        index.insert(DENSE_LIMIT, 2);
        assert_eq!(index.get(5), Some(0));
        assert_eq!(index.get(u64::MAX), Some(1));
        assert_eq!(index.get(DENSE_LIMIT), Some(2));
        assert_eq!(index.get(4), None);
        assert_eq!(index.get(6), None);
        assert_eq!(index.get(DENSE_LIMIT - 1), None);
    }
}
