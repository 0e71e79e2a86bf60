//! One instrument's order book: two sides of price levels, each level a FIFO
//! of orders linked intrusively through their arena slots.
//!
//! # The price-level structure, and why
//!
//! Each side keeps its non-empty levels in a `Vec<LevelRef>` sorted so that
//! the **best level is the last element** (bids by ascending price, asks by
//! descending price). The level bodies (FIFO head, tail, total quantity)
//! live in a per-book [`Arena`] and each order records its level's slot.
//!
//! - Best price: `last()`, O(1).
//! - Cancel: unlink the order from its level through its own `prev`/`next`
//!   and the level slot it records, O(1). Only when that empties the level
//!   is the level's entry removed from the sorted vector (binary search,
//!   then a `memmove` of the entries *better* than it, which are few: orders
//!   cluster near the touch).
//! - Matching consumes the best level, which is the vector's tail: emptying
//!   it is a `pop`, O(1).
//! - A new level is inserted by binary search; near the touch (the common
//!   case) the shift is short.
//!
//! The alternatives we set aside: a `BTreeMap<price, level>` allocates and
//! frees nodes as levels come and go (so the book would allocate in steady
//! state) and chases pointers to find the best level; a dense array indexed
//! by price over the whole band costs memory in proportion to the band
//! (megabytes per instrument for a wide band) and needs a bitmap scan to
//! find the next level. A sorted vector of a few hundred 16-byte entries is
//! contiguous, allocation-free once grown, and fastest at the touch.

use crate::arena::{Arena, NIL};
use crate::types::{SelfTradePrevention, Side};

/// A resting order. Lives in the engine's order arena.
#[derive(Clone, Copy, Debug)]
pub struct Order {
    pub id: u64,
    pub cid: u64,
    pub price: i64,
    /// Total quantity, filled lots included.
    pub qty: u64,
    pub filled: u64,
    /// What one remaining lot keeps locked: `unit_lock(price)` of the quote
    /// asset for a buy, `lot_size` of the base asset for a sell.
    pub unit_lock: u64,
    /// Index of the owning account in the engine's account table.
    pub account: u32,
    /// Index of the instrument in the engine's instrument table.
    pub instrument: u32,
    /// Level FIFO links.
    pub prev: u32,
    pub next: u32,
    /// Slot of the level in the book's level arena, or `NIL` when not in a
    /// level (only ever briefly, during a replace).
    pub level: u32,
    /// Account's open-order list links (kept in increasing order id).
    pub account_prev: u32,
    pub account_next: u32,
    pub side: Side,
    pub stp: SelfTradePrevention,
    pub post_only: bool,
}

impl Order {
    #[inline]
    pub fn remaining(&self) -> u64 {
        self.qty - self.filled
    }
}

impl Default for Order {
    fn default() -> Self {
        Order {
            id: 0,
            cid: 0,
            price: 0,
            qty: 0,
            filled: 0,
            unit_lock: 0,
            account: NIL,
            instrument: NIL,
            prev: NIL,
            next: NIL,
            level: NIL,
            account_prev: NIL,
            account_next: NIL,
            side: Side::Buy,
            stp: SelfTradePrevention::None,
            post_only: false,
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Level {
    pub price: i64,
    pub head: u32,
    pub tail: u32,
    /// Sum of the remaining quantities of the level's orders.
    pub total_qty: u64,
    pub count: u32,
}

impl Default for Level {
    fn default() -> Self {
        Level { price: 0, head: NIL, tail: NIL, total_qty: 0, count: 0 }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LevelRef {
    pub price: i64,
    pub level: u32,
}

/// The levels of one side, best last.
#[derive(Default)]
pub struct BookSide {
    pub sorted: Vec<LevelRef>,
}

impl BookSide {
    #[inline]
    pub fn best(&self) -> Option<LevelRef> {
        self.sorted.last().copied()
    }

    /// Position of `price` in `sorted` (`Ok`) or where it would go (`Err`).
    /// `rank` turns a price into an ascending sort key for this side.
    #[inline]
    fn search(&self, price: i64, side: Side) -> Result<usize, usize> {
        let rank = rank(side, price);
        self.sorted.binary_search_by(|probe| rank_of(side, probe.price).cmp(&rank))
    }
}

#[inline]
fn rank(side: Side, price: i64) -> i64 {
    match side {
        Side::Buy => price,
        Side::Sell => -price,
    }
}

#[inline]
fn rank_of(side: Side, price: i64) -> i64 {
    rank(side, price)
}

#[derive(Default)]
pub struct Book {
    pub bids: BookSide,
    pub asks: BookSide,
    pub levels: Arena<Level>,
}

impl Book {
    #[inline]
    pub fn side(&self, side: Side) -> &BookSide {
        match side {
            Side::Buy => &self.bids,
            Side::Sell => &self.asks,
        }
    }

    #[inline]
    fn side_mut(&mut self, side: Side) -> &mut BookSide {
        match side {
            Side::Buy => &mut self.bids,
            Side::Sell => &mut self.asks,
        }
    }

    /// Best level of the side opposite to a taker on `taker_side`.
    #[inline]
    pub fn best_opposite(&self, taker_side: Side) -> Option<LevelRef> {
        match taker_side {
            Side::Buy => self.asks.best(),
            Side::Sell => self.bids.best(),
        }
    }

    /// Links the order in `slot` at the back of the level of its price,
    /// creating the level if needed.
    pub fn push_back(&mut self, orders: &mut Arena<Order>, slot: u32) {
        let (price, side, remaining) = {
            let order = orders.get(slot);
            (order.price, order.side, order.remaining())
        };
        let level_slot = match self.side(side).search(price, side) {
            Ok(position) => self.side(side).sorted[position].level,
            Err(position) => {
                let level_slot = self.levels.insert(Level { price, ..Level::default() });
                self.side_mut(side).sorted.insert(position, LevelRef { price, level: level_slot });
                level_slot
            }
        };
        let level = self.levels.get_mut(level_slot);
        let old_tail = level.tail;
        level.tail = slot;
        if old_tail == NIL {
            level.head = slot;
        }
        level.total_qty += remaining;
        level.count += 1;
        if old_tail != NIL {
            orders.get_mut(old_tail).next = slot;
        }
        let order = orders.get_mut(slot);
        order.prev = old_tail;
        order.next = NIL;
        order.level = level_slot;
    }

    /// Unlinks the order in `slot` from its level, removing the level if it
    /// becomes empty. The order's `remaining()` must be what the level
    /// counted for it.
    pub fn unlink(&mut self, orders: &mut Arena<Order>, slot: u32) {
        let order = *orders.get(slot);
        debug_assert!(order.level != NIL);
        if order.prev != NIL {
            orders.get_mut(order.prev).next = order.next;
        }
        if order.next != NIL {
            orders.get_mut(order.next).prev = order.prev;
        }
        let level = self.levels.get_mut(order.level);
        if order.prev == NIL {
            level.head = order.next;
        }
        if order.next == NIL {
            level.tail = order.prev;
        }
        level.total_qty -= order.remaining();
        level.count -= 1;
        if level.count == 0 {
            self.remove_level(order.side, order.price, order.level);
        }
        let order = orders.get_mut(slot);
        order.level = NIL;
        order.prev = NIL;
        order.next = NIL;
    }

    fn remove_level(&mut self, side: Side, price: i64, level_slot: u32) {
        let book_side = self.side_mut(side);
        if book_side.sorted.last().map(|l| l.level) == Some(level_slot) {
            book_side.sorted.pop();
        } else {
            match book_side.search(price, side) {
                Ok(position) => {
                    book_side.sorted.remove(position);
                }
                Err(_) => unreachable!("level {price} missing from its side"),
            }
        }
        self.levels.remove(level_slot);
    }

    /// Takes `qty` off a level's total after a partial fill or an in-place
    /// reduction of one of its orders.
    #[inline]
    pub fn reduce_level(&mut self, level_slot: u32, qty: u64) {
        self.levels.get_mut(level_slot).total_qty -= qty;
    }

    #[inline]
    pub fn level(&self, level_slot: u32) -> &Level {
        self.levels.get(level_slot)
    }
}

/// Does a limit of `limit` on `taker_side` cross a resting price `maker`?
#[inline]
pub fn crosses(taker_side: Side, limit: i64, maker: i64) -> bool {
    match taker_side {
        Side::Buy => maker <= limit,
        Side::Sell => maker >= limit,
    }
}
