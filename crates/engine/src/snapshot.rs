//! The canonical serialization of the whole engine state: what a snapshot
//! stores and what the state hash is computed over.
//!
//! Canonical means independent of how the state happens to be laid out in
//! memory (arena slots, hash-table order): two engines that applied the same
//! commands serialize to the same bytes, and an engine restored from a
//! snapshot serializes exactly as the one that wrote it.
//!
//! Layout (little-endian, version 2; version 1, without `halted`, is still
//! read as every instrument trading):
//!
//! ```text
//! "XBS1" | version u32 | seq u64
//! asset count u32,      per asset:      id u32, name (33 bytes), supply u64
//! instrument count u32, per instrument: spec (as in the command codec),
//!   halted u8
//! account count u32,    per account:    id u64
//! per account, per asset (table order): available u64, locked u64
//! per instrument, bids then asks:       level count u32, per level (best
//!   first): price i64, order count u32, per order (queue order):
//!   id u64, account index u32, cid u64, qty u64, filled u64, stp u8,
//!   post_only u8
//! ```

use crate::arena::NIL;
use crate::book::Order;
use crate::codec::{DecodeError, Reader, Writer, stp_code};
use crate::engine::Engine;
use crate::types::*;

pub const STATE_MAGIC: &[u8; 4] = b"XBS1";
pub const STATE_VERSION: u32 = 2;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateError {
    BadMagic,
    UnsupportedVersion(u32),
    Decode(DecodeError),
    /// The bytes decode but describe an impossible state.
    Inconsistent(String),
}

impl std::fmt::Display for StateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StateError::BadMagic => f.write_str("not an engine state (bad magic)"),
            StateError::UnsupportedVersion(v) => write!(f, "unsupported state version {v}"),
            StateError::Decode(e) => write!(f, "{e}"),
            StateError::Inconsistent(why) => write!(f, "inconsistent state: {why}"),
        }
    }
}

impl std::error::Error for StateError {}

impl From<DecodeError> for StateError {
    fn from(e: DecodeError) -> Self {
        StateError::Decode(e)
    }
}

impl Engine {
    /// Appends the canonical serialization of the state to `out`.
    pub fn encode_state(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(STATE_MAGIC);
        let mut w = Writer { out };
        w.u32(STATE_VERSION);
        w.u64(self.seq());
        let assets = self.asset_table();
        w.u32(assets.len() as u32);
        for (id, name, supply) in &assets {
            w.u32(*id);
            w.symbol(name);
            w.u64(*supply);
        }
        w.u32(self.instruments.len() as u32);
        for inst in &self.instruments {
            w.spec(&inst.spec);
            w.u8(u8::from(inst.halted));
        }
        w.u32(self.accounts.len() as u32);
        for account in &self.accounts {
            w.u64(account.id);
        }
        for account in 0..self.accounts.len() {
            for asset in 0..assets.len() {
                let balance = &self.balances[account * self.asset_stride + asset];
                w.u64(balance.available);
                w.u64(balance.locked);
            }
        }
        for inst in &self.instruments {
            for side in [&inst.book.bids, &inst.book.asks] {
                w.u32(side.len() as u32);
                for level_ref in side.iter_best_first() {
                    let level = inst.book.level(level_ref.level);
                    w.i64(level.price);
                    w.u32(inst.book.order_count(&self.orders, level_ref.level));
                    let mut slot = level.head;
                    while slot != NIL {
                        let order = self.orders.get(slot);
                        w.u64(order.id);
                        w.u32(order.account);
                        w.u64(order.cid);
                        w.u64(order.qty);
                        w.u64(order.filled);
                        w.u8(stp_code(order.stp));
                        w.u8(u8::from(order.post_only));
                        slot = order.next;
                    }
                }
            }
        }
    }

    /// Rebuilds an engine from [`Engine::encode_state`]'s bytes, and checks
    /// every invariant of the result.
    pub fn decode_state(bytes: &[u8]) -> Result<Engine, StateError> {
        let mut r = Reader::new(bytes);
        if r.take(4).map_err(|_| StateError::BadMagic)? != STATE_MAGIC {
            return Err(StateError::BadMagic);
        }
        let version = r.u32()?;
        if !(1..=STATE_VERSION).contains(&version) {
            return Err(StateError::UnsupportedVersion(version));
        }
        let seq = r.u64()?;
        let inconsistent = |why: String| StateError::Inconsistent(why);
        let mut engine = Engine::new();
        let mut scratch = Vec::new();
        let asset_count = r.u32()?;
        let mut supplies = Vec::new();
        for _ in 0..asset_count {
            let id = r.u32()?;
            let name = r.symbol("asset name")?;
            supplies.push((id, r.u64()?));
            engine.apply(&Command::AddAsset { id, name }, &mut scratch);
        }
        let instrument_count = r.u32()?;
        for _ in 0..instrument_count {
            let spec = r.spec()?;
            engine.apply(&Command::AddInstrument(spec), &mut scratch);
            if version >= 2 && r.flag("halted")? {
                engine.apply(&Command::Halt { instrument: spec.id }, &mut scratch);
            }
        }
        let account_count = r.u32()?;
        if account_count == 0 {
            return Err(inconsistent("no fee account".into()));
        }
        let first = r.u64()?;
        if first != FEE_ACCOUNT {
            return Err(inconsistent(format!("first account is {first}, not the fee account")));
        }
        for _ in 1..account_count {
            let account = r.u64()?;
            engine.apply(&Command::OpenAccount { account }, &mut scratch);
        }
        if scratch.iter().any(|e| matches!(e.kind, EventKind::Rejected { .. })) {
            return Err(inconsistent("duplicate or invalid reference data".into()));
        }
        for account in 0..account_count as usize {
            for asset in 0..asset_count as usize {
                let available = r.u64()?;
                let locked = r.u64()?;
                let balance = &mut engine.balances[account * engine.asset_stride + asset];
                balance.available = available;
                balance.locked = locked;
            }
        }
        for (index, (_, supply)) in supplies.iter().enumerate() {
            engine.set_supply(index as u32, *supply);
        }
        let mut resting: Vec<(OrderId, u32)> = Vec::new();
        for instrument in 0..instrument_count {
            for side in [Side::Buy, Side::Sell] {
                let levels = r.u32()?;
                for _ in 0..levels {
                    let price = r.i64()?;
                    let count = r.u32()?;
                    if count == 0 {
                        return Err(inconsistent(format!("empty level at {price}")));
                    }
                    for _ in 0..count {
                        let id = r.u64()?;
                        let account = r.u32()?;
                        let cid = r.u64()?;
                        let qty = r.u64()?;
                        let filled = r.u64()?;
                        let stp = r.stp()?;
                        let post_only = r.flag("post_only")?;
                        if account == 0 || account >= account_count || filled >= qty || id == 0 || id > seq {
                            return Err(inconsistent(format!("order {id} is impossible")));
                        }
                        let slot = engine.restore_order(Order {
                            id,
                            cid,
                            price,
                            qty,
                            filled,
                            account,
                            instrument,
                            side,
                            stp,
                            post_only,
                            ..Order::default()
                        })
                        .map_err(inconsistent)?;
                        resting.push((id, slot));
                    }
                }
            }
        }
        if r.remaining() != 0 {
            return Err(StateError::Decode(DecodeError::TrailingBytes(r.remaining())));
        }
        // Indexed in increasing order id, as they were placed.
        resting.sort_unstable();
        if resting.windows(2).any(|w| w[0].0 == w[1].0) {
            return Err(inconsistent("an order id appears twice".into()));
        }
        for (_, slot) in resting {
            engine.list_restored_order(slot).map_err(inconsistent)?;
        }
        engine.set_seq(seq);
        engine.check_invariants().map_err(inconsistent)?;
        Ok(engine)
    }
}
