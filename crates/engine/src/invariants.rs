//! The full consistency check of `docs/engine.md` § Invariants. Too slow for
//! the hot path (it walks every order and balance); the tests call it after
//! every command.

use crate::arena::NIL;
use crate::book::BookSide;
use crate::engine::Engine;
use crate::types::Side;

impl Engine {
    /// Checks every invariant; the error names the first one broken.
    pub fn check_invariants(&self) -> Result<(), String> {
        let assets = self.asset_count();
        // Expected locked amount per (account index, asset index).
        let mut expected_locked = vec![0u128; self.accounts.len() * assets];
        let mut resting = 0usize;
        for (inst_index, inst) in self.instruments.iter().enumerate() {
            let book = &inst.book;
            let symbol = inst.spec.symbol;
            let room = if inst.halted { 0 } else { inst.spec.max_qty - inst.spec.min_qty + 1 };
            if inst.qty_room != room {
                return Err(format!("{symbol}: quantity room {} where halted = {} says {room}", inst.qty_room, inst.halted));
            }
            if let (Some(bid), Some(ask)) = (book.bids.best(), book.asks.best())
                && bid.price >= ask.price {
                    return Err(format!("{symbol}: book crossed: bid {} >= ask {}", bid.price, ask.price));
                }
            for (side, book_side) in [(Side::Buy, &book.bids), (Side::Sell, &book.asks)] {
                check_sorted(side, book_side).map_err(|e| format!("{symbol}: {e}"))?;
                for level_ref in book_side.iter_best_first() {
                    let level = book.level(level_ref.level);
                    if level.price != level_ref.price {
                        return Err(format!("{symbol}: level {} filed under {}", level.price, level_ref.price));
                    }
                    if level.head == NIL {
                        return Err(format!("{symbol}: empty level at {}", level.price));
                    }
                    let mut total = 0u64;
                    let mut count = 0u32;
                    let mut prev = NIL;
                    let mut slot = level.head;
                    while slot != NIL {
                        let order = self.orders.get(slot);
                        let id = order.id;
                        if order.prev != prev || order.level != level_ref.level {
                            return Err(format!("order {id}: broken level links"));
                        }
                        if order.side != side || order.price != level.price || order.instrument as usize != inst_index {
                            return Err(format!("order {id}: in the wrong level"));
                        }
                        if order.filled >= order.qty {
                            return Err(format!("order {id}: resting with nothing left ({} of {})", order.filled, order.qty));
                        }
                        if self.order_slot(id) != Some(slot) {
                            return Err(format!("order {id}: missing from the id index"));
                        }
                        // Found, so listed by its account's index: with the
                        // count below, every order is listed exactly once.
                        if !self.cid_taken(order.account, order.cid) {
                            return Err(format!("order {id}: client order id {} not in its account's index", order.cid));
                        }
                        let asset = if side == Side::Buy { inst.quote } else { inst.base };
                        expected_locked[order.account as usize * assets + asset as usize] +=
                            u128::from(order.remaining()) * u128::from(order.unit_lock);
                        total += order.remaining();
                        count += 1;
                        resting += 1;
                        prev = slot;
                        slot = order.next;
                    }
                    if level.tail != prev || level.total_qty != total {
                        return Err(format!(
                            "{symbol}: level {} says {} lots, holds {total} in {count} orders",
                            level.price, level.total_qty
                        ));
                    }
                }
            }
        }
        if resting != self.orders.len() || resting != self.order_index_len() {
            return Err(format!(
                "{resting} orders in books, {} in the arena, {} in the index",
                self.orders.len(),
                self.order_index_len()
            ));
        }
        let mut listed = 0usize;
        for (account_index, account) in self.accounts.iter().enumerate() {
            for slot in self.account_order_slots(account_index as u32) {
                let order = self.orders.get(slot);
                if order.account as usize != account_index || self.order_slot(order.id) != Some(slot) {
                    return Err(format!("account {}: its index lists order {}, not open or not its own", account.id, order.id));
                }
                listed += 1;
            }
        }
        if listed != resting || self.cid_index_len() != resting {
            return Err(format!("{listed} orders in account indexes (by their counts {}), {resting} in books", self.cid_index_len()));
        }
        let mut supply = vec![0u128; assets];
        for (account_index, account) in self.accounts.iter().enumerate() {
            let row = &self.balances[account_index * self.asset_stride..][..assets];
            for (asset, balance) in row.iter().enumerate() {
                if u128::from(balance.locked) != expected_locked[account_index * assets + asset] {
                    return Err(format!(
                        "account {} asset #{asset}: locked {} but its orders hold {}",
                        account.id,
                        balance.locked,
                        expected_locked[account_index * assets + asset]
                    ));
                }
                supply[asset] += u128::from(balance.available) + u128::from(balance.locked);
            }
        }
        for (asset, total) in supply.iter().enumerate() {
            let expected = self.asset_supply_by_index(asset as u32);
            if *total != u128::from(expected) {
                return Err(format!("asset #{asset}: balances sum to {total}, deposits minus withdrawals {expected}"));
            }
        }
        Ok(())
    }

    /// Total locked across every account and asset (0 once the market is
    /// drained).
    pub fn total_locked(&self) -> u128 {
        self.balances.iter().map(|b| u128::from(b.locked)).sum()
    }
}

fn check_sorted(side: Side, book_side: &BookSide) -> Result<(), String> {
    book_side.check()?;
    let mut previous: Option<i64> = None;
    let mut count = 0usize;
    for level in book_side.iter_best_first() {
        if let Some(better) = previous {
            let worse = match side {
                Side::Buy => level.price < better,
                Side::Sell => level.price > better,
            };
            if !worse {
                return Err(format!("{side:?} levels out of order at {better} / {}", level.price));
            }
        }
        previous = Some(level.price);
        count += 1;
    }
    if count != book_side.len() {
        return Err(format!("{side:?}: {} levels counted, {count} listed", book_side.len()));
    }
    Ok(())
}
