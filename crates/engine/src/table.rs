//! The order-id index ([`OrderIndex`]): a ring for recent order ids and an
//! open-addressing hash table ([`Table`]) for the orders that outlive it.
//!
//! Why not `std`'s `HashMap`: `hashbrown`'s general-purpose machinery cost
//! about 130 instructions a command on `steady-deep` when the client-id
//! index used it. Keys here are integers and the table never needs
//! iterating, so a flat array with linear probing, Fibonacci hashing and
//! backward-shift deletion (no tombstones, so probe lengths never degrade)
//! does the same job in a fraction of that. The client-id index has since
//! become chains through the orders (`cid.rs` says why).
//!
//! The table doubles when it is a quarter full (short probe runs); in steady state it never
//! allocates. It is never iterated, so its layout cannot leak into output.

use crate::arena::Arena;
use crate::book::Order;

/// Fibonacci hashing: the high bits of the product are well mixed even
/// for sequential ids.
#[inline]
fn hash(key: u64) -> u64 {
    key.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// 16 bytes: the key and the value, with [`EMPTY`] as the value of a free
/// entry (values are arena slots, never `u32::MAX`). A flag of its own made
/// an entry 24 bytes and every move in a deletion a copy field by field.
#[derive(Clone, Copy)]
struct Entry {
    key: u64,
    value: u32,
}

const FREE: Entry = Entry { key: 0, value: EMPTY };

/// `u64` keys (order ids) to arena slots (`u32`, never `u32::MAX`).
pub struct Table {
    entries: Vec<Entry>,
    /// `64 - log2(capacity)`: the shift that takes a hash to a home slot.
    shift: u32,
    len: usize,
}

const MIN_BITS: u32 = 6;

impl Table {
    pub fn new() -> Self {
        Table { entries: vec![FREE; 1 << MIN_BITS], shift: 64 - MIN_BITS, len: 0 }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline]
    fn mask(&self) -> usize {
        self.entries.len() - 1
    }

    #[inline]
    fn home_of_hash(&self, hash: u64) -> usize {
        (hash >> self.shift) as usize
    }

    /// The entry holding `key`, or the free entry where it would go.
    #[inline(always)]
    fn find(&self, key: &u64) -> (usize, bool) {
        let mask = self.mask();
        let key = *key;
        let mut at = self.home_of_hash(hash(key));
        loop {
            let entry = &self.entries[at];
            if entry.value == EMPTY {
                return (at, false);
            }
            if entry.key == key {
                return (at, true);
            }
            at = (at + 1) & mask;
        }
    }

    #[inline]
    pub fn get(&self, key: &u64) -> Option<u32> {
        match self.find(key) {
            (at, true) => Some(self.entries[at].value),
            _ => None,
        }
    }

    #[inline]
    pub fn contains(&self, key: &u64) -> bool {
        self.find(key).1
    }

    /// Inserts or overwrites; `value` is not `u32::MAX`.
    #[inline]
    pub fn insert(&mut self, key: u64, value: u32) {
        debug_assert!(value != EMPTY);
        if (self.len + 1) * 4 > self.entries.len() {
            self.grow();
        }
        let (at, found) = self.find(&key);
        if !found {
            self.len += 1;
        }
        self.entries[at] = Entry { key, value };
    }

    /// Removes `key`; returns its value if it was there.
    #[inline]
    pub fn remove(&mut self, key: &u64) -> Option<u32> {
        let (mut hole, found) = self.find(key);
        if !found {
            return None;
        }
        let value = self.entries[hole].value;
        self.len -= 1;
        // Backward-shift deletion: pull later members of the probe run back
        // into the hole when that does not move them before their home.
        let mask = self.mask();
        let mut at = hole;
        loop {
            at = (at + 1) & mask;
            let entry = self.entries[at];
            if entry.value == EMPTY {
                break;
            }
            let home = self.home_of_hash(hash(entry.key));
            // Distance from home to `at` versus from home to the hole,
            // both measured forward around the ring.
            if (at.wrapping_sub(home) & mask) >= (at.wrapping_sub(hole) & mask) {
                self.entries[hole] = entry;
                hole = at;
            }
        }
        self.entries[hole] = FREE;
        Some(value)
    }

    #[cold]
    fn grow(&mut self) {
        let bits = 64 - self.shift + 1;
        let old = std::mem::replace(&mut self.entries, vec![FREE; 1 << bits]);
        self.shift = 64 - bits;
        let mask = self.mask();
        for entry in old.into_iter().filter(|e| e.value != EMPTY) {
            let mut at = self.home_of_hash(hash(entry.key));
            while self.entries[at].value != EMPTY {
                at = (at + 1) & mask;
            }
            self.entries[at] = entry;
        }
    }
}

impl Default for Table {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Random inserts and removes against a `BTreeMap` model, with keys from
    /// a small range so that probe runs collide and wrap.
    #[test]
    fn agrees_with_a_btreemap_under_churn() {
        let mut table: Table = Table::new();
        let mut model = BTreeMap::new();
        let mut state = 7u64;
        for step in 0..200_000u32 {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let key = (state >> 33) % 3_000;
            match (state >> 20) % 3 {
                0 | 1 => {
                    table.insert(key, step);
                    model.insert(key, step);
                }
                _ => assert_eq!(table.remove(&key), model.remove(&key), "remove {key}"),
            }
            if step % 1000 == 0 {
                for probe in 0..3_000 {
                    assert_eq!(table.get(&probe), model.get(&probe).copied(), "get {probe}");
                }
            }
            assert_eq!(table.len(), model.len());
        }
    }

}

/// Order id -> slot, exploiting that order ids are sequence numbers.
///
/// Most orders live for a few hundred or thousand commands. The slot of
/// order `id` sits in a ring of `RING` entries at `id % RING` until an
/// order placed `RING` commands (or a multiple) later comes to rest and
/// needs the entry: then, if it is still open, it moves to an overflow
/// [`Table`]. Finding, adding or removing an order is one array access and
/// one comparison; nothing is ever scanned.
///
/// Why the move happens when the entry is needed and not when the window
/// passes (as it did until 2026-11-26): moving at the window's edge cost
/// every command a look at the ring entry it was about to pass, whether or
/// not an order would rest; now only an order that rests looks, and a
/// lookup checks that the order in the entry is the one asked for (the
/// entry may hold an older order whose id shares it).
pub struct OrderIndex {
    /// A fixed size, so that `id % RING` needs no bounds check.
    ring: Box<[u32; RING as usize]>,
    overflow: Table,
    len: usize,
}

const RING_BITS: u32 = 16;
const RING: u64 = 1 << RING_BITS;
const EMPTY: u32 = u32::MAX;

impl Default for OrderIndex {
    fn default() -> Self {
        OrderIndex { ring: crate::arena::boxed_array(EMPTY), overflow: Table::new(), len: 0 }
    }
}

impl OrderIndex {
    /// Adds the order in `slot`, with the newest id yet: an older order
    /// still holding its ring entry moves to the overflow table.
    #[inline(always)]
    pub fn insert_newest(&mut self, orders: &Arena<Order>, id: u64, slot: u32) {
        self.len += 1;
        let old = std::mem::replace(&mut self.ring[(id % RING) as usize], slot);
        if old != EMPTY {
            self.evict(orders, old);
        }
    }

    #[cold]
    fn evict(&mut self, orders: &Arena<Order>, slot: u32) {
        self.overflow.insert(orders.get(slot).id, slot);
    }

    /// Adds the order in `slot` in any order of ids (a snapshot's).
    pub fn insert(&mut self, id: u64, slot: u32) {
        self.len += 1;
        let entry = &mut self.ring[(id % RING) as usize];
        if *entry == EMPTY {
            *entry = slot;
        } else {
            self.overflow.insert(id, slot);
        }
    }

    #[inline]
    pub fn get(&self, orders: &Arena<Order>, id: u64) -> Option<u32> {
        self.find(orders, id).map(|(slot, _)| slot)
    }

    /// The slot of order `id` and its record (which the ring's check has
    /// just read: a caller that looks at the order needs no second look-up).
    #[inline(always)]
    pub fn find<'a>(&self, orders: &'a Arena<Order>, id: u64) -> Option<(u32, &'a Order)> {
        let slot = self.ring[(id % RING) as usize];
        if slot != EMPTY {
            let order = orders.get(slot);
            if order.id == id {
                return Some((slot, order));
            }
        }
        let slot = self.overflow.get(&id)?;
        Some((slot, orders.get(slot)))
    }

    /// Removes order `id`, open in `slot`.
    #[inline(always)]
    pub fn remove(&mut self, id: u64, slot: u32) {
        self.len -= 1;
        let entry = &mut self.ring[(id % RING) as usize];
        if *entry == slot {
            *entry = EMPTY;
        } else {
            self.remove_overflow(id, slot);
        }
    }

    /// An order that lost its ring entry to a newer one leaves the
    /// overflow table: out of line, as few orders live that long.
    #[cold]
    #[inline(never)]
    fn remove_overflow(&mut self, id: u64, slot: u32) {
        let removed = self.overflow.remove(&id);
        debug_assert_eq!(removed, Some(slot));
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod order_index_tests {
    use super::*;
    use std::collections::BTreeMap;

    /// The figures `docs/engine.md` gives for the memory of a resting
    /// order ("Memory per resting order"): change them together.
    #[test]
    fn memory_per_resting_order_is_as_documented() {
        assert_eq!(std::mem::size_of::<crate::book::Order>(), 80, "an order in the arena");
        assert_eq!(std::mem::size_of::<crate::book::Level>(), 24, "a price level");
        assert_eq!(std::mem::size_of::<Entry>(), 16, "an order-index overflow entry");
        // An account's client-id table: 4-byte chain heads, 2 to 4 per
        // order, 8 at least.
        let mut orders: crate::arena::Arena<crate::book::Order> = crate::arena::Arena::new();
        let mut heads = crate::cid::CidHeads::default();
        let mut cids = crate::cid::CidIndex::new(&mut heads);
        for cid in 0..10_000u64 {
            let (_, bucket) = cids.find(&heads, &orders, cid);
            let slot = orders.insert(crate::book::Order { account: 0, cid, ..Default::default() });
            cids.insert(&mut heads, &mut orders, bucket, slot);
            assert!(cids.buckets() >= 2 * cids.len());
            assert!(cids.buckets() <= 4 * cids.len().max(2));
        }
        assert_eq!(std::mem::size_of::<crate::engine::Balance>(), 16, "a balance");
        // At most a quarter of a table's entries are used.
        let mut table: Table = Table::new();
        for key in 0..10_000u64 {
            table.insert(key, 0);
            assert!(table.len() * 4 <= table.entries.len());
            assert!(table.entries.len() <= 8 * table.len().max(1 << (MIN_BITS - 3)));
        }
    }

    /// Orders with lifetimes from one command to several ring lengths,
    /// checked against a map; ids asked for are open, closed, never used
    /// or still to come.
    #[test]
    fn agrees_with_a_map_across_the_ring_boundary() {
        let mut orders: Arena<Order> = Arena::new();
        let mut index = OrderIndex::default();
        let mut model: BTreeMap<u64, u32> = BTreeMap::new();
        let mut state = 3u64;
        for seq in 1..=(RING * 5) {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            if state >> 62 != 0 {
                let slot = orders.insert(Order { id: seq, ..Order::default() });
                index.insert_newest(&orders, seq, slot);
                model.insert(seq, slot);
            }
            // Remove a random live order now and then, old or young.
            if (state >> 20).is_multiple_of(2) && !model.is_empty() {
                let pick = if (state >> 30).is_multiple_of(4) { *model.keys().next().unwrap() } else { *model.keys().next_back().unwrap() };
                let slot = model.remove(&pick).unwrap();
                index.remove(pick, slot);
                orders.remove(slot);
            }
            if seq % 9_973 == 0 {
                for (&id, &slot) in &model {
                    assert_eq!(index.get(&orders, id), Some(slot), "id {id} at {seq}");
                }
                for id in [seq + 1, seq + RING, seq.saturating_sub(RING), seq / 2] {
                    assert_eq!(index.get(&orders, id), model.get(&id).copied(), "id {id} at {seq}");
                }
                assert_eq!(index.len(), model.len());
            }
        }
    }
}
