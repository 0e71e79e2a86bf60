//! The text format's `balance` lines, derived outside the engine.
//!
//! The engine emits no event when a balance changes (see `docs/engine.md`,
//! "Balances"): keeping a per-command record of the balances it touched,
//! sorting them and writing an event for each cost about a fifth of its
//! time per command, for a stream that most consumers do not read. Tools
//! that want the old `balance` lines (`crossbook run`, the differential
//! against the reference model, the examples) get them here instead: after
//! each command, every account the command's events name is looked up with
//! [`Engine::balance`] and compared with the last value this observer saw.
//!
//! Which accounts a command can change is fixed by the rules: the owner of
//! an order accepted, cancelled or replaced, the deposit's or withdrawal's
//! account, both sides of a trade and the fee account. All of them appear
//! in the command's events (a replaced order that keeps resting is looked up
//! for its owner), so the lines are exactly the pairs whose value differs
//! from the start of the command, sorted by account id then asset id.

use crate::engine::Engine;
use crate::types::*;
use std::collections::HashMap;

/// Remembers the last value of every (account, asset) pair it has seen;
/// everything else is zero. A map is only looked up, never iterated, so its
/// order cannot reach the output.
#[derive(Default)]
pub struct BalanceLines {
    /// Per account, the last values by position in `assets`.
    last: HashMap<AccountId, Vec<(u64, u64)>>,
    /// Every asset id, ascending.
    assets: Vec<AssetId>,
    accounts: Vec<AccountId>,
}

impl BalanceLines {
    /// For an engine that starts empty (`Engine::new()`).
    pub fn new() -> BalanceLines {
        BalanceLines::default()
    }

    /// For an engine that already holds balances (restored from a snapshot
    /// or a journal): every balance it holds is the starting point.
    pub fn starting_from(engine: &Engine) -> BalanceLines {
        let mut lines = BalanceLines::new();
        lines.follow_assets(engine);
        for account in engine.account_ids() {
            let values = lines.assets.iter().map(|&asset| engine.balance(account, asset).unwrap_or((0, 0))).collect();
            lines.last.insert(account, values);
        }
        lines
    }

    /// Brings `assets` up to the engine's (assets are only ever added) and
    /// moves every remembered value to its asset's new position.
    fn follow_assets(&mut self, engine: &Engine) {
        if engine.asset_count() == self.assets.len() {
            return;
        }
        let old = std::mem::take(&mut self.assets);
        self.assets.extend(engine.asset_ids());
        self.assets.sort_unstable();
        for values in self.last.values_mut() {
            let mut moved = vec![(0, 0); self.assets.len()];
            for (position, &asset) in old.iter().enumerate() {
                if let Ok(to) = self.assets.binary_search(&asset) {
                    moved[to] = values[position];
                }
            }
            *values = moved;
        }
    }

    /// Appends to `events` (the events `engine` just emitted for one
    /// command) one `balance` event per pair that command changed.
    pub fn append(&mut self, engine: &Engine, events: &mut Vec<Event>) {
        let Some(seq) = events.first().map(|e| e.seq) else {
            return;
        };
        self.accounts.clear();
        for event in events.iter() {
            match event.kind {
                EventKind::Deposited { account, .. }
                | EventKind::Withdrawn { account, .. }
                | EventKind::Accepted { account, .. }
                | EventKind::Cancelled { account, .. }
                | EventKind::MassCancelled { account, .. } => self.accounts.push(account),
                EventKind::Trade { maker_account, taker_account, .. } => {
                    self.accounts.extend([maker_account, taker_account, FEE_ACCOUNT]);
                }
                EventKind::Replaced { order, .. } => {
                    if let Some(view) = engine.order(order) {
                        self.accounts.push(view.account);
                    }
                }
                _ => {}
            }
        }
        if self.accounts.is_empty() {
            return;
        }
        self.follow_assets(engine);
        self.accounts.sort_unstable();
        self.accounts.dedup();
        for &account in &self.accounts {
            let last = self.last.entry(account).or_insert_with(|| vec![(0, 0); self.assets.len()]);
            for (position, &asset) in self.assets.iter().enumerate() {
                let now = engine.balance(account, asset).unwrap_or((0, 0));
                if now != last[position] {
                    last[position] = now;
                    events.push(Event { seq, kind: EventKind::Balance { account, asset, available: now.0, locked: now.1 } });
                }
            }
        }
    }
}
