//! (account, client order id) of every open order: the duplicate check of
//! `place` (`docs/engine.md`, check 9 of `place`: `duplicate_client_order_id`).
//!
//! A chained hash table whose chains run through the orders themselves
//! (`Order::cid_next`): the table is an array of chain heads, and an order
//! is found by comparing the `account` and `cid` it already stores. The
//! index only ever answers "is this pair taken?"; nothing looks an order up
//! by its client id.
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
//! `multi-symbol` 617 -> 587, `mixed` 424 -> 410. Memory falls too: a flat table kept
//! three in four of its 16-byte entries free (64 bytes an order), the heads
//! here are 4 bytes each at a load of a quarter to a half (8 to 16 bytes an
//! order), plus the 4-byte link the order grew by.
//!
//! The heads double when the chains average more than one order in two
//! buckets; in steady state the index never allocates. It is never
//! iterated in an order that could reach output: chains are walked only to
//! find a pair or to rebuild the heads.

use crate::arena::{Arena, NIL};
use crate::book::Order;

pub(crate) struct CidIndex {
    /// The first order of each bucket's chain, `NIL` if none.
    heads: Vec<u32>,
    /// `64 - log2(heads.len())`: the shift that takes a hash to a bucket.
    shift: u32,
    len: usize,
}

const MIN_BITS: u32 = 6;

impl Default for CidIndex {
    fn default() -> Self {
        CidIndex { heads: vec![NIL; 1 << MIN_BITS], shift: 64 - MIN_BITS, len: 0 }
    }
}

impl CidIndex {
    /// Fibonacci hashing of the pair (client ids are often sequential:
    /// the product's high bits mix them well).
    #[inline(always)]
    fn bucket(&self, account: u32, cid: u64) -> usize {
        ((cid ^ u64::from(account).rotate_left(40)).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> self.shift) as usize
    }

    /// Whether an open order of `account` has client id `cid`; either way
    /// the bucket a new order with that pair joins, for [`CidIndex::insert`].
    #[inline(always)]
    pub fn find(&self, orders: &Arena<Order>, account: u32, cid: u64) -> (bool, usize) {
        let bucket = self.bucket(account, cid);
        let mut slot = self.heads[bucket];
        while slot != NIL {
            let order = orders.get(slot);
            if order.cid == cid && order.account == account {
                return (true, bucket);
            }
            slot = order.cid_next;
        }
        (false, bucket)
    }

    /// Adds the order in `slot`, whose `account` and `cid` are written and
    /// not taken, to `bucket`: what [`CidIndex::find`] returned for them.
    #[inline(always)]
    pub fn insert(&mut self, orders: &mut Arena<Order>, bucket: usize, slot: u32) {
        let (account, cid) = {
            let order = orders.get(slot);
            (order.account, order.cid)
        };
        let (next, bucket) = self.link(orders, bucket, account, cid, slot);
        let order = orders.get_mut(slot);
        order.cid_next = next;
        order.cid_bucket = bucket;
    }

    /// Makes `slot` the head of `bucket`'s chain for the pair (`account`,
    /// `cid`), not taken, and returns what the order's `cid_next` and
    /// `cid_bucket` must be: the caller writes them (a new order is written
    /// whole, once). `bucket` is what [`CidIndex::find`] returned for the
    /// pair; removals since leave it right, an insert in between would not
    /// (it may grow the heads). The order in `slot` is not in any chain yet.
    #[inline(always)]
    pub fn link(&mut self, orders: &mut Arena<Order>, bucket: usize, account: u32, cid: u64, slot: u32) -> (u32, u32) {
        self.len += 1;
        let bucket = if self.len * 2 > self.heads.len() {
            self.grow(orders);
            self.bucket(account, cid)
        } else {
            bucket
        };
        debug_assert_eq!(bucket, self.bucket(account, cid));
        (std::mem::replace(&mut self.heads[bucket], slot), bucket as u32)
    }

    /// Removes the order in `slot`, which is in the index.
    #[inline(always)]
    pub fn remove(&mut self, orders: &mut Arena<Order>, slot: u32) {
        let order = orders.get(slot);
        let (next, bucket) = (order.cid_next, order.cid_bucket as usize);
        debug_assert_eq!(bucket, self.bucket(order.account, order.cid));
        self.len -= 1;
        let mut at = self.heads[bucket];
        if at == slot {
            self.heads[bucket] = next;
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

    /// Doubles the heads and relinks every order into its new bucket.
    #[cold]
    fn grow(&mut self, orders: &mut Arena<Order>) {
        let bits = 64 - self.shift + 1;
        let old = std::mem::replace(&mut self.heads, vec![NIL; 1 << bits]);
        self.shift = 64 - bits;
        for mut slot in old {
            while slot != NIL {
                let order = orders.get(slot);
                let next = order.cid_next;
                let bucket = self.bucket(order.account, order.cid);
                let order = orders.get_mut(slot);
                order.cid_next = self.heads[bucket];
                order.cid_bucket = bucket as u32;
                self.heads[bucket] = slot;
                slot = next;
            }
        }
    }

    /// Open orders in the index.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Heads: what the index costs besides the link in each order.
    #[cfg(test)]
    pub fn buckets(&self) -> usize {
        self.heads.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Random inserts and removes against a map, with few accounts and
    /// client ids so that pairs collide in buckets and chains grow and
    /// shrink in every position; the heads grow through several sizes.
    #[test]
    fn agrees_with_a_map_under_churn() {
        let mut orders: Arena<Order> = Arena::new();
        let mut index = CidIndex::default();
        let mut model: BTreeMap<(u32, u64), u32> = BTreeMap::new();
        let mut state = 5u64;
        for step in 0..200_000u32 {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let (account, cid) = ((state >> 40) as u32 % 7, (state >> 20) % 600);
            let (found, bucket) = index.find(&orders, account, cid);
            assert_eq!(found, model.contains_key(&(account, cid)), "find {account}/{cid}");
            if found {
                let slot = model.remove(&(account, cid)).unwrap_or(NIL);
                index.remove(&mut orders, slot);
                orders.remove(slot);
            } else if !(state >> 10).is_multiple_of(4) {
                // Sometimes remove another order between the search and
                // the insert, as a fill does between `place`'s check and
                // the order coming to rest.
                if (state >> 12).is_multiple_of(3)
                    && let Some((&key, &slot)) = model.iter().nth((state >> 50) as usize % model.len().max(1))
                {
                    index.remove(&mut orders, slot);
                    orders.remove(slot);
                    model.remove(&key);
                }
                let slot = orders.insert(Order { account, cid, ..Order::default() });
                index.insert(&mut orders, bucket, slot);
                model.insert((account, cid), slot);
            }
            assert_eq!(index.len(), model.len());
            if step % 997 == 0 {
                for account in 0..7 {
                    for cid in 0..600 {
                        assert_eq!(index.find(&orders, account, cid).0, model.contains_key(&(account, cid)));
                    }
                }
            }
        }
        assert!(index.buckets() >= 2 * index.len());
    }

    #[test]
    fn pairs_do_not_confuse_their_halves() {
        let mut orders: Arena<Order> = Arena::new();
        let mut index = CidIndex::default();
        for (account, cid) in [(1, 2), (2, 1)] {
            let (found, bucket) = index.find(&orders, account, cid);
            assert!(!found);
            let slot = orders.insert(Order { account, cid, ..Order::default() });
            index.insert(&mut orders, bucket, slot);
        }
        assert!(index.find(&orders, 1, 2).0);
        assert!(index.find(&orders, 2, 1).0);
        assert!(!index.find(&orders, 1, 1).0);
        assert!(!index.find(&orders, 2, 2).0);
    }
}
