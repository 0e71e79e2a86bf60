//! One account's open orders, by client order id: the duplicate check of
//! `place` (`docs/engine.md`, check 9 of `place`: `duplicate_client_order_id`)
//! and the account's list of open orders (`cancel_all`, the open-orders
//! query).
//!
//! A chained hash table per account whose chains run through the orders
//! themselves (`Order::cid_next`): the table is an array of chain heads,
//! and an order is found by comparing the `cid` it already stores. Nothing
//! looks an order up by its client id; the index answers "is this client
//! id taken?" and "which orders are open?" (the second in no useful order:
//! callers that show or act on the orders sort them by order id).
//!
//! Why chains and not the open-addressing [`crate::table::Table`] the index
//! used before (2026-11-25): every order that rests enters the index and
//! every order that leaves the book leaves it. In a flat table a removal is
//! a search (the key's hash, a probe run) and a backward shift of the run
//! behind it, about 50 instructions; here the chain is walked from its head
//! to the order (on average about one step at the load kept below) and
//! relinked, and an insert is two stores into a bucket the duplicate check
//! already found. `scripts/instructions W SMALL LARGE`: `steady-deep` 589 ->
//! 557, `exchange-core-single` 398 -> 390, `place-cancel` 562 -> 533,
//! `multi-symbol` 617 -> 587, `mixed` 424 -> 410. Memory falls too: a flat
//! table kept three in four of its 16-byte entries free (64 bytes an order),
//! the heads here are 4 bytes each at a load of a quarter to a half (8 to 16
//! bytes an order), plus the 4-byte link the order grew by.
//!
//! Why one table per account and not one for the engine (2026-11-26): an
//! account also needs its open orders listed (`cancel_all`, the open-orders
//! query), which one table for everyone cannot do without visiting
//! everyone's orders, so each account used to keep a doubly linked list of
//! its orders besides. Appending to it and unlinking from it wrote two
//! other orders' records, usually far apart in memory. A table per account
//! lists the account's orders by walking its own heads, and its chains
//! need not compare accounts. `scripts/instructions W 200000 400000`:
//! `steady-deep` 529 -> 521, `place-cancel` 498 -> 491,
//! `exchange-core-single` 383 -> 388, `mixed` 398 -> 402; the engine's
//! time per command on `steady-deep` (`crossbook bench`, five interleaved
//! runs on one core, medians) 54.1 -> 49.4 ns, on `exchange-core-single`
//! level (46.9 -> 46.3 ns); a resting order 8 bytes smaller.
//!
//! The tables' heads live in one vector, in blocks ([`CidHeads`]): a table
//! starts at 8 heads and moves to a block twice its size when its chains
//! average more than one order in two buckets, leaving its old block to
//! the next table that needs one that size. A block per table from the
//! allocator would allocate whenever any one account held more orders than
//! it ever had, which in a venue of many accounts goes on happening long
//! after the book as a whole has stopped growing; shared blocks allocate
//! only when all the tables together need more room than ever before. The
//! index is never iterated in an order that could reach output unsorted.

use crate::arena::{Arena, NIL};
use crate::book::Order;

/// Every account's chain heads, in blocks of a power of two, each block
/// one account's table. A block an account outgrows (or shrinks out of)
/// goes to a free list of its size for the next account that needs one,
/// so that accounts taking turns at being busy reuse each other's blocks
/// and the engine allocates only when all of them together need more room
/// than ever before (as with its order arena).
pub(crate) struct CidHeads {
    cells: Vec<u32>,
    /// Offsets of free blocks, by the log2 of their size; every cell of a
    /// free block is `NIL`.
    free: Vec<Vec<u32>>,
}

impl Default for CidHeads {
    fn default() -> Self {
        CidHeads { cells: Vec::new(), free: (0..32).map(|_| Vec::new()).collect() }
    }
}

impl CidHeads {
    fn take(&mut self, bits: u32) -> u32 {
        if let Some(at) = self.free[bits as usize].pop() {
            return at;
        }
        let at = self.cells.len();
        assert!(at + (1 << bits) <= NIL as usize, "client-id heads full: {at} cells");
        self.cells.resize(at + (1 << bits), NIL);
        at as u32
    }

    fn give(&mut self, at: u32, bits: u32) {
        self.cells[at as usize..][..1 << bits].fill(NIL);
        let free = &mut self.free[bits as usize];
        if free.len() == free.capacity() {
            // Room for every block of this size the cells could hold:
            // freeing then allocates only after the cells have grown.
            free.reserve((self.cells.len() >> bits) - free.len());
        }
        free.push(at);
    }
}

/// One account's table: where its block of heads is and how big.
pub(crate) struct CidIndex {
    /// Offset of the block in [`CidHeads`].
    at: u32,
    /// `64 - log2(block size)`: the shift that takes a hash to a bucket.
    shift: u32,
    len: u32,
    /// Half the block: more orders than that and the table grows.
    grow_at: u32,
}

const MIN_BITS: u32 = 3;

impl CidIndex {
    pub fn new(heads: &mut CidHeads) -> Self {
        CidIndex { at: heads.take(MIN_BITS), shift: 64 - MIN_BITS, len: 0, grow_at: 1 << (MIN_BITS - 1) }
    }

    fn bits(&self) -> u32 {
        64 - self.shift
    }

    /// Fibonacci hashing (client ids are often sequential: the product's
    /// high bits spread them well), as a cell of [`CidHeads`].
    #[inline(always)]
    fn cell(&self, cid: u64) -> usize {
        self.at as usize + (cid.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> self.shift) as usize
    }

    /// Whether an open order has client id `cid`; either way the cell of
    /// the chain a new order with that id joins, for [`CidIndex::insert`].
    #[inline(always)]
    pub fn find(&self, heads: &CidHeads, orders: &Arena<Order>, cid: u64) -> (bool, usize) {
        let cell = self.cell(cid);
        let mut slot = heads.cells[cell];
        while slot != NIL {
            let order = orders.get(slot);
            if order.cid == cid {
                return (true, cell);
            }
            slot = order.cid_next;
        }
        (false, cell)
    }

    /// Adds the order in `slot`, whose `cid` is written and not taken, to
    /// `cell`: what [`CidIndex::find`] returned for it.
    #[inline(always)]
    pub fn insert(&mut self, heads: &mut CidHeads, orders: &mut Arena<Order>, cell: usize, slot: u32) {
        let cid = orders.get(slot).cid;
        let (next, cell) = self.link(heads, orders, cell, cid, slot);
        let order = orders.get_mut(slot);
        order.cid_next = next;
        order.cid_bucket = cell;
    }

    /// Makes `slot` the head of `cell`'s chain for `cid`, not taken, and
    /// returns what the order's `cid_next` and `cid_bucket` must be: the
    /// caller writes them (a new order is written whole, once). `cell` is
    /// what [`CidIndex::find`] returned for `cid`; removals since leave it
    /// right (they never move the block), an insert in between would not
    /// (it may). The order in `slot` is not in any chain yet.
    #[inline(always)]
    pub fn link(&mut self, heads: &mut CidHeads, orders: &mut Arena<Order>, cell: usize, cid: u64, slot: u32) -> (u32, u32) {
        self.len += 1;
        let cell = if self.len > self.grow_at {
            self.grow(heads, orders);
            self.cell(cid)
        } else {
            cell
        };
        debug_assert_eq!(cell, self.cell(cid));
        (std::mem::replace(&mut heads.cells[cell], slot), cell as u32)
    }

    /// Removes the order in `slot`, which is in the index, given its
    /// `cid_next` and `cid_bucket` (the caller has its record at hand).
    #[inline(always)]
    pub fn remove(&mut self, heads: &mut CidHeads, orders: &mut Arena<Order>, slot: u32, next: u32, cell: usize) {
        debug_assert_eq!((next, cell), (orders.get(slot).cid_next, orders.get(slot).cid_bucket as usize));
        debug_assert_eq!(cell, self.cell(orders.get(slot).cid));
        self.len -= 1;
        let mut at = heads.cells[cell];
        if at == slot {
            heads.cells[cell] = next;
            return;
        }
        loop {
            debug_assert!(at != NIL, "order in slot {slot} is not in its chain");
            let order = orders.get_mut(at);
            if order.cid_next == slot {
                order.cid_next = next;
                return;
            }
            at = order.cid_next;
        }
    }

    /// Moves the table to a block twice the size and relinks its orders.
    #[cold]
    fn grow(&mut self, heads: &mut CidHeads, orders: &mut Arena<Order>) {
        let (old_at, old_bits) = (self.at as usize, self.bits());
        let bits = old_bits + 1;
        self.at = heads.take(bits);
        self.shift = 64 - bits;
        self.grow_at = 1 << (bits - 1);
        for old in old_at..old_at + (1 << old_bits) {
            let mut slot = heads.cells[old];
            while slot != NIL {
                let order = orders.get(slot);
                let next = order.cid_next;
                let cell = self.cell(order.cid);
                let order = orders.get_mut(slot);
                order.cid_next = heads.cells[cell];
                order.cid_bucket = cell as u32;
                heads.cells[cell] = slot;
                slot = next;
            }
        }
        heads.give(old_at as u32, old_bits);
    }

    /// Appends the slot of every order in the index to `slots`, in bucket
    /// order (no meaning: sort before showing or acting on them).
    pub fn slots_into(&self, heads: &CidHeads, orders: &Arena<Order>, slots: &mut Vec<u32>) {
        for &head in &heads.cells[self.at as usize..][..1 << self.bits()] {
            let mut slot = head;
            while slot != NIL {
                slots.push(slot);
                slot = orders.get(slot).cid_next;
            }
        }
    }

    /// Open orders in the index.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Heads: what the index costs besides the link in each order.
    #[cfg(test)]
    pub fn buckets(&self) -> usize {
        1 << self.bits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Takes the order in `slot` out of `index` with the links its record
    /// holds, as the engine does.
    fn remove(index: &mut CidIndex, heads: &mut CidHeads, orders: &mut Arena<Order>, slot: u32) {
        let order = orders.get(slot);
        let (next, cell) = (order.cid_next, order.cid_bucket as usize);
        index.remove(heads, orders, slot, next, cell);
    }

    /// Random inserts and removes against a map, over a few accounts with
    /// few client ids so that ids collide in buckets and chains grow and
    /// shrink in every position; the tables grow through several sizes,
    /// taking blocks that others left. Every account's listing is its own
    /// orders, each once.
    #[test]
    fn agrees_with_a_map_under_churn() {
        let mut orders: Arena<Order> = Arena::new();
        let mut heads = CidHeads::default();
        let mut indexes: Vec<CidIndex> = (0..7).map(|_| CidIndex::new(&mut heads)).collect();
        let mut model: BTreeMap<(u32, u64), u32> = BTreeMap::new();
        let mut state = 5u64;
        for step in 0..200_000u32 {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            // Accounts take turns at holding many orders.
            let (account, cid) = ((state >> 40) as u32 % 7, (state >> 20) % (50 + u64::from(step / 20_000) * 60));
            let (found, cell) = indexes[account as usize].find(&heads, &orders, cid);
            assert_eq!(found, model.contains_key(&(account, cid)), "find {account}/{cid}");
            if found {
                let slot = model.remove(&(account, cid)).unwrap_or(NIL);
                remove(&mut indexes[account as usize], &mut heads, &mut orders, slot);
                orders.remove(slot);
            } else if !(state >> 10).is_multiple_of(4) {
                // Sometimes remove another order between the search and
                // the insert, as a fill does between `place`'s check and
                // the order coming to rest.
                if (state >> 12).is_multiple_of(3)
                    && let Some((&key, &slot)) = model.iter().nth((state >> 50) as usize % model.len().max(1))
                {
                    remove(&mut indexes[key.0 as usize], &mut heads, &mut orders, slot);
                    orders.remove(slot);
                    model.remove(&key);
                }
                let slot = orders.insert(Order { account, cid, ..Order::default() });
                indexes[account as usize].insert(&mut heads, &mut orders, cell, slot);
                model.insert((account, cid), slot);
            }
            assert_eq!(indexes.iter().map(CidIndex::len).sum::<usize>(), model.len());
            if step % 997 == 0 {
                for (account, index) in indexes.iter().enumerate() {
                    for cid in 0..600 {
                        assert_eq!(index.find(&heads, &orders, cid).0, model.contains_key(&(account as u32, cid)));
                    }
                    let mut listed = Vec::new();
                    index.slots_into(&heads, &orders, &mut listed);
                    listed.sort_unstable();
                    let mut expected: Vec<u32> = model.range((account as u32, 0)..(account as u32 + 1, 0)).map(|(_, &slot)| slot).collect();
                    expected.sort_unstable();
                    assert_eq!(listed, expected, "account {account}'s orders");
                }
            }
        }
        for index in &indexes {
            assert!(index.buckets() >= 2 * index.len());
        }
        // Blocks are only ever as many as the tables and the free lists hold.
        let held: usize = indexes.iter().map(CidIndex::buckets).sum::<usize>()
            + heads.free.iter().enumerate().map(|(bits, free)| free.len() << bits).sum::<usize>();
        assert_eq!(held, heads.cells.len());
        assert!(heads.free.iter().flatten().all(|&at| heads.cells[at as usize] == NIL));
    }
}
