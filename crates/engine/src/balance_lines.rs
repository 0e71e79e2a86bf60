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
use std::collections::BTreeMap;

/// Remembers the last value of every (account, asset) pair it has seen
/// change; everything else is zero.
#[derive(Default)]
pub struct BalanceLines {
    last: BTreeMap<(AccountId, AssetId), (u64, u64)>,
    accounts: Vec<AccountId>,
    assets: Vec<AssetId>,
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
        for account in engine.account_ids() {
            for asset in engine.asset_ids() {
                if let Some(value) = engine.balance(account, asset).filter(|&v| v != (0, 0)) {
                    lines.last.insert((account, asset), value);
                }
            }
        }
        lines
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
        self.accounts.sort_unstable();
        self.accounts.dedup();
        self.assets.clear();
        self.assets.extend(engine.asset_ids());
        self.assets.sort_unstable();
        for &account in &self.accounts {
            for &asset in &self.assets {
                let now = engine.balance(account, asset).unwrap_or((0, 0));
                let before = self.last.get(&(account, asset)).copied().unwrap_or((0, 0));
                if now != before {
                    self.last.insert((account, asset), now);
                    events.push(Event { seq, kind: EventKind::Balance { account, asset, available: now.0, locked: now.1 } });
                }
            }
        }
    }
}
