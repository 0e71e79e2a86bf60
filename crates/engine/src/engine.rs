//! The state machine: `apply(command) -> events`.
//!
//! The rules are specified in `docs/engine.md`; this file follows that page
//! section by section. Every command is validated completely before
//! anything is mutated (there is no rollback), so a rejected command changes
//! nothing.

use crate::arena::{Arena, NIL};
use crate::book::{Book, Order, crosses};
use crate::hash::DenseIndex;
use crate::cid::{CidHeads, CidIndex};
use crate::table::OrderIndex;
use crate::stages::{self, Stage};
use crate::types::*;

/// One account's holding of one asset. The engine emits no event when it
/// changes: consumers learn balances from the `trade` event (which carries
/// both fees) and from [`Engine::balance`]; [`crate::BalanceLines`] derives
/// the text format's `balance` lines that way.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct Balance {
    pub available: u64,
    pub locked: u64,
}

struct Asset {
    id: AssetId,
    name: Symbol,
    /// Deposits minus withdrawals.
    supply: u64,
}

pub(crate) struct Instrument {
    pub(crate) spec: InstrumentSpec,
    /// Index of the base asset in the asset table.
    pub(crate) base: u32,
    /// Index of the quote asset in the asset table.
    pub(crate) quote: u32,
    pub(crate) book: Book,
    /// Stopped by `halt`: no new order, no replace.
    pub(crate) halted: bool,
    /// How far above `min_qty` a new order's quantity may be, plus one:
    /// `max_qty - min_qty + 1` while trading, 0 while halted, so that
    /// `place` finds a halted instrument in the quantity's one compare and
    /// tells the two apart only on that cold path.
    pub(crate) qty_room: u64,
}

impl Instrument {
    /// The asset a resting order of `side` locks: the quote asset for a
    /// buy, the base asset for a sell.
    #[inline(always)]
    fn locked_asset(&self, side: Side) -> u32 {
        match side {
            Side::Buy => self.quote,
            Side::Sell => self.base,
        }
    }
}

pub(crate) struct Account {
    pub(crate) id: AccountId,
    /// Its open orders, by client order id ([`crate::cid`]).
    orders: CidIndex,
}

/// What settling a trade needs of its instrument.
struct Terms {
    id: InstrumentId,
    base: u32,
    quote: u32,
    tick_size: u64,
    lot_size: u64,
    maker_bps: i64,
    taker_bps: i64,
}

/// What settling a trade needs of the resting order.
struct Maker {
    slot: u32,
    id: OrderId,
    account: u32,
    remaining: u64,
    unit_lock: u64,
    level: u32,
}

/// The incoming side of a match: a new order, or a replaced order that lost
/// its place.
struct Taker {
    id: OrderId,
    account: u32,
    /// The account's own id, for the `trade` events.
    account_id: AccountId,
    side: Side,
    /// The worst price it may trade at; for a market order the end of the
    /// scale (`i64::MAX` to buy, `i64::MIN` to sell), which every price
    /// crosses. Plain integers here and below: `Option`s made the taker
    /// larger and every check a branch more.
    limit: i64,
    qty: u64,
    filled: u64,
    /// What each remaining lot keeps locked (0 for a market buy, whose lock
    /// is `budget_left`).
    unit_lock: u64,
    stp: SelfTradePrevention,
    /// Market buys: what is left of the locked budget; [`NO_BUDGET`]
    /// otherwise.
    budget_left: u64,
}

/// [`Taker::budget_left`] of a taker without a budget (budgets are at most
/// [`MAX_SUPPLY`]).
const NO_BUDGET: u64 = u64::MAX;

impl Taker {
    fn remaining(&self) -> u64 {
        self.qty - self.filled
    }
}

/// A read-only copy of an open order's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OrderView {
    pub id: OrderId,
    pub account: AccountId,
    pub instrument: InstrumentId,
    pub cid: ClientOrderId,
    pub side: Side,
    pub price: i64,
    pub qty: u64,
    pub filled: u64,
}

pub struct Engine {
    seq: u64,
    assets: Vec<Asset>,
    asset_index: DenseIndex,
    pub(crate) instruments: Vec<Instrument>,
    instrument_index: DenseIndex,
    pub(crate) accounts: Vec<Account>,
    account_index: DenseIndex,
    /// Every account's balances in one table: `account * asset_stride + asset`.
    pub(crate) balances: Vec<Balance>,
    /// Balance slots per account (a power of two, at least the asset count).
    pub(crate) asset_stride: usize,
    pub(crate) orders: Arena<Order>,
    order_index: OrderIndex,
    /// The accounts' client-id tables' heads.
    cid_heads: CidHeads,
    /// Room for `cancel_all` to sort an account's orders in, kept so that
    /// it allocates only when an account has more orders than ever before.
    scratch: Vec<u32>,
    /// Trades so far (a statistic; not part of the state's meaning).
    trades: u64,
}

impl Default for Engine {
    fn default() -> Self {
        Self::new()
    }
}

const BPS: i128 = 10_000;

/// `ceil(notional * bps / 10000)`: rounds toward +infinity, so a fee is
/// rounded up and a rebate toward zero. Both always favour the venue.
///
/// Every trade computes two of these. When `notional < 2^49` (a notional of
/// 5.6 * 10^14 units: every trade of the shipped instruments) the product
/// `notional * bps` fits in an `i64` (`|bps| <= 10000 < 2^14`), and the fee
/// is that product divided once by a constant. Above it, the notional is
/// split as `q * 10000 + r` so that `ceil(notional * bps / 10000) =
/// q * bps + ceil(r * bps / 10000)` and both products fit (`notional <=
/// 2^62`), still without 128-bit division. The split on every trade cost
/// about 14 instructions a trade more (`scripts/instructions steady-deep`:
/// 610 -> 602 a command, at 0.57 trades a command).
#[inline(always)]
pub fn fee(notional: u64, bps: i64) -> i64 {
    debug_assert!(notional <= MAX_SUPPLY && bps.abs() <= 10_000);
    if notional < 1 << 49 {
        let product = notional as i64 * bps;
        return if product >= 0 {
            // Not `div_ceil`: that takes the remainder too (+9 instructions
            // a command on `steady-deep`, +4 on `exchange-core-single`).
            #[allow(clippy::manual_div_ceil)]
            let ceil = (product as u64 + 9_999) / 10_000;
            ceil as i64
        } else {
            // Truncation of the magnitude is `ceil` for a negative value.
            -((product.unsigned_abs() / 10_000) as i64)
        };
    }
    let whole = (notional / 10_000) as i64 * bps;
    let part = (notional % 10_000) as i64 * bps;
    // Rust's `/` truncates toward zero, which is `ceil` for a negative part.
    let part_ceil = if part > 0 { (part + 9_999) / 10_000 } else { part / 10_000 };
    whole + part_ceil
}

/// The combinations of type, time in force, post-only flag and budget
/// that an order other than a plain limit order may take. Cold: most
/// orders are plain limit orders, and these checks, inline, cost each of
/// them.
#[cold]
#[inline(never)]
fn check_order_kind(order: &PlaceOrder) -> Result<(), RejectReason> {
    let is_limit = order.order_type == OrderType::Limit;
    let gtc = order.tif == TimeInForce::Gtc;
    // A market order cannot rest; a post-only order must be one that can.
    let market_gtc = !is_limit && gtc;
    let post_only_cannot_rest = order.post_only && !(is_limit && gtc);
    if market_gtc || post_only_cannot_rest {
        return Err(RejectReason::InvalidTimeInForce);
    }
    if let Some(budget) = order.budget
        && (is_limit || budget == 0 || (order.side == Side::Sell && order.tif != TimeInForce::Fok)) {
            return Err(RejectReason::InvalidBudget);
        }
    Ok(())
}

/// What one lot of a limit buy at `price` keeps locked: its cost at the
/// limit plus the worst-case (taker) fee on it.
#[inline]
fn unit_lock_buy(spec: &InstrumentSpec, price: i64) -> u64 {
    let notional = price as u64 * spec.tick_size;
    notional + fee(notional, spec.taker_bps) as u64
}

#[inline]
fn unit_lock(spec: &InstrumentSpec, side: Side, price: i64) -> u64 {
    match side {
        Side::Buy => unit_lock_buy(spec, price),
        Side::Sell => spec.lot_size,
    }
}

/// `lots * unit`. Bounded by the instrument limits checked in
/// `add_instrument` (price * qty * tick_size <= MAX_SUPPLY = 2^62, fees at
/// most 100%), so it cannot overflow; checked all the same.
#[inline]
fn times(lots: u64, unit: u64) -> u64 {
    lots.checked_mul(unit).expect("lock bounded by the instrument's limits")
}

/// The most lots a market buy can take at `price` with `budget` left: the
/// largest `q` with `ceil(price * q * tick_size * (10000 + taker_bps) / 10000) <= budget`.
/// Since `budget` is an integer, that is `floor(budget * 10000 / (price * tick_size * (10000 + taker_bps)))`.
#[inline]
fn affordable(tick_size: u64, taker_bps: i64, price: i64, budget: u64) -> u64 {
    let per_lot = i128::from(price) * i128::from(tick_size) * (BPS + i128::from(taker_bps));
    let lots = i128::from(budget) * BPS / per_lot;
    u64::try_from(lots).unwrap_or(u64::MAX)
}

/// What a taker sell receives for `qty` lots at `price`, fee deducted.
#[inline]
fn taker_proceeds(spec: &InstrumentSpec, price: i64, qty: u64) -> u64 {
    let notional = price as u64 * qty * spec.tick_size;
    notional - fee(notional, spec.taker_bps) as u64
}

/// The money bound a FOK order's fill must respect, if any.
#[derive(Clone, Copy)]
enum FokBound {
    None,
    /// A market buy: spend at most this, fees included.
    Spend(u64),
    /// A market sell with a budget: receive at least this, fees deducted.
    Receive(u64),
}

/// Cost to a market buyer of `qty` lots at `price`, fee included.
#[inline]
fn taker_cost(spec: &InstrumentSpec, price: i64, qty: u64) -> u64 {
    let notional = price as u64 * qty * spec.tick_size;
    notional + fee(notional, spec.taker_bps) as u64
}

impl Engine {
    pub fn new() -> Engine {
        let mut engine = Engine {
            seq: 0,
            assets: Vec::new(),
            asset_index: DenseIndex::default(),
            instruments: Vec::new(),
            instrument_index: DenseIndex::default(),
            accounts: Vec::new(),
            account_index: DenseIndex::default(),
            balances: Vec::new(),
            asset_stride: 4,
            orders: Arena::new(),
            order_index: OrderIndex::default(),
            cid_heads: CidHeads::default(),
            scratch: Vec::new(),
            trades: 0,
        };
        engine.create_account(FEE_ACCOUNT);
        engine
    }

    /// Trades executed since the engine started.
    pub fn trades(&self) -> u64 {
        self.trades
    }

    /// Sequence number of the last command applied (0 before the first).
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Applies one command and appends its events to `out`.
    pub fn apply(&mut self, command: &Command, out: &mut Vec<Event>) {
        self.seq += 1;
        let seq = self.seq;
        stages::begin(seq);
        let result = match command {
            Command::AddAsset { id, name } => self.add_asset(*id, *name, out),
            Command::AddInstrument(spec) => self.add_instrument(spec, out),
            Command::OpenAccount { account } => self.open_account(*account, out),
            Command::Deposit { account, asset, amount } => self.deposit(*account, *asset, *amount, out),
            Command::Withdraw { account, asset, amount } => self.withdraw(*account, *asset, *amount, out),
            Command::Place(order) => self.place(order, out),
            Command::Cancel { account, order } => self.cancel(*account, *order, out),
            Command::Replace { account, order, price, qty } => self.replace(*account, *order, *price, *qty, out),
            Command::Amend { account, order, qty } => self.amend(*account, *order, *qty, out),
            Command::CancelAll { account, instrument } => self.cancel_all(*account, *instrument, out),
            Command::Halt { instrument } => self.set_halted(*instrument, true, out),
            Command::Resume { instrument } => self.set_halted(*instrument, false, out),
        };
        if let Err(reason) = result {
            out.push(Event { seq, kind: EventKind::Rejected { reason } });
        }
        stages::end();
    }

    #[inline]
    fn emit(&self, out: &mut Vec<Event>, kind: EventKind) {
        out.push(Event { seq: self.seq, kind });
    }

    // ---- balances ----------------------------------------------------

    /// The balance of (`account`, `asset`) by index.
    #[inline(always)]
    fn touch(&mut self, account: u32, asset: u32) -> &mut Balance {
        &mut self.balances[account as usize * self.asset_stride + asset as usize]
    }

    #[inline]
    fn lock(&mut self, account: u32, asset: u32, amount: u64) {
        if amount == 0 {
            return;
        }
        let balance = self.touch(account, asset);
        balance.available -= amount;
        balance.locked += amount;
    }

    #[inline]
    fn unlock(&mut self, account: u32, asset: u32, amount: u64) {
        if amount == 0 {
            return;
        }
        let balance = self.touch(account, asset);
        balance.locked -= amount;
        balance.available += amount;
    }

    #[inline]
    fn available(&self, account: u32, asset: u32) -> u64 {
        self.balances[account as usize * self.asset_stride + asset as usize].available
    }

    // ---- reference data ----------------------------------------------

    fn add_asset(&mut self, id: AssetId, name: Symbol, out: &mut Vec<Event>) -> Result<(), RejectReason> {
        if self.asset_index.contains(id.into()) || self.assets.iter().any(|a| a.name == name) {
            return Err(RejectReason::DuplicateAsset);
        }
        let index = self.assets.len() as u32;
        assert!(self.assets.len() < 1 << 16, "asset table full");
        self.assets.push(Asset { id, name, supply: 0 });
        self.asset_index.insert(id.into(), index);
        if self.assets.len() > self.asset_stride {
            // Re-lay the balance table with room for twice as many assets.
            let stride = self.asset_stride * 2;
            let mut balances = vec![Balance::default(); self.accounts.len() * stride];
            for account in 0..self.accounts.len() {
                let old = &self.balances[account * self.asset_stride..(account + 1) * self.asset_stride];
                balances[account * stride..account * stride + self.asset_stride].copy_from_slice(old);
            }
            self.balances = balances;
            self.asset_stride = stride;
        }
        self.emit(out, EventKind::AssetAdded { asset: id, name });
        Ok(())
    }

    fn add_instrument(&mut self, spec: &InstrumentSpec, out: &mut Vec<Event>) -> Result<(), RejectReason> {
        if self.instrument_index.contains(spec.id.into()) || self.instruments.iter().any(|i| i.spec.symbol == spec.symbol) {
            return Err(RejectReason::DuplicateInstrument);
        }
        let (Some(base), Some(quote)) = (self.asset_index.get(spec.base.into()), self.asset_index.get(spec.quote.into())) else {
            return Err(RejectReason::UnknownAsset);
        };
        // Three 64-bit factors can overflow even 128 bits (wrapping, the
        // product could pass as small): one that does is past MAX_SUPPLY
        // all the same.
        let max_notional = i128::from(spec.max_price).checked_mul(i128::from(spec.max_qty)).and_then(|n| n.checked_mul(i128::from(spec.tick_size)));
        let max_base = i128::from(spec.max_qty).checked_mul(i128::from(spec.lot_size));
        let invalid = spec.base == spec.quote
            || spec.tick_size == 0
            || spec.lot_size == 0
            || spec.min_qty == 0
            || spec.min_qty > spec.max_qty
            || spec.min_price < 1
            || spec.min_price > spec.max_price
            || spec.taker_bps < 0
            || spec.taker_bps > 10_000
            || spec.maker_bps > spec.taker_bps
            || spec.maker_bps + spec.taker_bps < 0
            || max_notional.is_none_or(|n| n > i128::from(MAX_SUPPLY))
            || max_base.is_none_or(|b| b > i128::from(MAX_SUPPLY));
        if invalid {
            return Err(RejectReason::InvalidInstrument);
        }
        let index = self.instruments.len() as u32;
        self.instruments.push(Instrument { spec: *spec, base, quote, book: Book::default(), halted: false, qty_room: spec.max_qty - spec.min_qty + 1 });
        self.instrument_index.insert(spec.id.into(), index);
        self.emit(out, EventKind::InstrumentAdded { instrument: spec.id, symbol: spec.symbol });
        Ok(())
    }

    fn create_account(&mut self, id: AccountId) {
        let index = self.accounts.len() as u32;
        assert!((self.accounts.len() + 1) * self.asset_stride < u32::MAX as usize, "balance table full");
        let orders = CidIndex::new(&mut self.cid_heads);
        self.accounts.push(Account { id, orders });
        self.balances.resize(self.accounts.len() * self.asset_stride, Balance::default());
        self.account_index.insert(id, index);
    }

    fn open_account(&mut self, account: AccountId, out: &mut Vec<Event>) -> Result<(), RejectReason> {
        if self.account_index.contains(account) {
            return Err(RejectReason::DuplicateAccount);
        }
        self.create_account(account);
        self.emit(out, EventKind::AccountOpened { account });
        Ok(())
    }

    // ---- funds ---------------------------------------------------------

    fn account_and_asset(&self, account: AccountId, asset: AssetId) -> Result<(u32, u32), RejectReason> {
        let account = self.account_index.get(account).ok_or(RejectReason::UnknownAccount)?;
        let asset = self.asset_index.get(asset.into()).ok_or(RejectReason::UnknownAsset)?;
        Ok((account, asset))
    }

    fn deposit(&mut self, account_id: AccountId, asset_id: AssetId, amount: u64, out: &mut Vec<Event>) -> Result<(), RejectReason> {
        let (account, asset) = self.account_and_asset(account_id, asset_id)?;
        if amount == 0 {
            return Err(RejectReason::InvalidAmount);
        }
        let supply = self.assets[asset as usize].supply;
        if amount > MAX_SUPPLY - supply {
            return Err(RejectReason::BalanceOverflow);
        }
        self.assets[asset as usize].supply = supply + amount;
        self.touch(account, asset).available += amount;
        self.emit(out, EventKind::Deposited { account: account_id, asset: asset_id, amount });
        Ok(())
    }

    fn withdraw(&mut self, account_id: AccountId, asset_id: AssetId, amount: u64, out: &mut Vec<Event>) -> Result<(), RejectReason> {
        let (account, asset) = self.account_and_asset(account_id, asset_id)?;
        if amount == 0 {
            return Err(RejectReason::InvalidAmount);
        }
        if amount > self.available(account, asset) {
            return Err(RejectReason::InsufficientFunds);
        }
        self.assets[asset as usize].supply -= amount;
        self.touch(account, asset).available -= amount;
        self.emit(out, EventKind::Withdrawn { account: account_id, asset: asset_id, amount });
        Ok(())
    }

    // ---- orders ----------------------------------------------------------

    fn place(&mut self, order: &PlaceOrder, out: &mut Vec<Event>) -> Result<(), RejectReason> {
        let account = self.account_index.get(order.account).ok_or(RejectReason::UnknownAccount)?;
        if order.account == FEE_ACCOUNT {
            return Err(RejectReason::FeeAccount);
        }
        let instrument = self.instrument_index.get(order.instrument.into()).ok_or(RejectReason::UnknownInstrument)?;
        let is_limit = order.order_type == OrderType::Limit;
        // A plain limit order (no post-only flag, no budget) is valid with
        // every time in force; the other kinds are checked out of line.
        if !(is_limit && !order.post_only && order.budget.is_none()) {
            check_order_kind(order)?;
        }
        let inst = &self.instruments[instrument as usize];
        let spec = &inst.spec;
        // Each range in one compare: `add_instrument` holds `1 <= min <=
        // max` for both, so a value below the least wraps to above the span
        // (a zero quantity and a price at or below zero among them).
        if order.qty.wrapping_sub(spec.min_qty) >= inst.qty_room {
            return Err(if inst.halted { RejectReason::InstrumentHalted } else { RejectReason::InvalidQuantity });
        }
        if is_limit && order.price.wrapping_sub(spec.min_price) as u64 > (spec.max_price - spec.min_price) as u64 {
            return Err(if order.price <= 0 { RejectReason::InvalidPrice } else { RejectReason::PriceOutOfBand });
        }
        let (duplicate, cid_bucket) = self.accounts[account as usize].orders.find(&self.cid_heads, &self.orders, order.cid);
        if duplicate {
            return Err(RejectReason::DuplicateClientOrderId);
        }
        let (lock_asset, unit, lock_amount) = match (order.side, is_limit) {
            (Side::Buy, true) => {
                let unit = unit_lock_buy(spec, order.price);
                (inst.quote, unit, times(order.qty, unit))
            }
            (Side::Sell, _) => (inst.base, spec.lot_size, times(order.qty, spec.lot_size)),
            (Side::Buy, false) => {
                let available = self.available(account, inst.quote);
                let budget = match order.budget {
                    Some(budget) => budget,
                    None if available == 0 => return Err(RejectReason::InsufficientFunds),
                    None => available,
                };
                (inst.quote, 0, budget)
            }
        };
        if lock_amount > self.available(account, lock_asset) {
            return Err(RejectReason::InsufficientFunds);
        }
        if order.post_only
            && let Some(best) = inst.book.best_opposite(order.side)
                && crosses(order.side, order.price, best.price) {
                    return Err(RejectReason::PostOnlyWouldTake);
                }
        let market_buy = !is_limit && order.side == Side::Buy;
        if order.tif == TimeInForce::Fok && !self.fok_order_can_fill(order, instrument, account, lock_amount) {
            return Err(RejectReason::FokCannotFill);
        }

        // Validated: from here on nothing can be refused.
        stages::enter(Stage::Matching);
        let id = self.seq;
        self.lock(account, lock_asset, lock_amount);
        self.emit(
            out,
            EventKind::Accepted {
                order: id,
                account: order.account,
                instrument: order.instrument,
                cid: order.cid,
                side: order.side,
                order_type: order.order_type,
                tif: order.tif,
                price: if is_limit { order.price } else { 0 },
                qty: order.qty,
            },
        );
        let mut taker = Taker {
            id,
            account,
            account_id: order.account,
            side: order.side,
            limit: match (is_limit, order.side) {
                (true, _) => order.price,
                (false, Side::Buy) => i64::MAX,
                (false, Side::Sell) => i64::MIN,
            },
            qty: order.qty,
            filled: 0,
            unit_lock: unit,
            stp: order.stp,
            budget_left: if market_buy { lock_amount } else { NO_BUDGET },
        };
        let stopped = if market_buy {
            // A copy goes out of line, so that the common path's taker
            // need not live in memory.
            let mut budgeted = taker;
            let stopped = self.match_budgeted(instrument, &mut budgeted, out);
            taker = budgeted;
            stopped
        } else {
            self.match_taker::<false>(instrument, &mut taker, out)
        };
        let remaining = taker.remaining();
        if remaining > 0 {
            if !stopped && is_limit && order.tif == TimeInForce::Gtc {
                self.rest(order, account, instrument, taker.filled, unit, cid_bucket);
            } else {
                let reason = if stopped { CancelReason::Stp } else { CancelReason::Ioc };
                self.emit(out, EventKind::Cancelled { order: id, account: order.account, remaining, reason });
                self.unlock(account, lock_asset, times(remaining, unit));
            }
        }
        if taker.budget_left != NO_BUDGET {
            self.unlock(account, lock_asset, taker.budget_left);
        }
        Ok(())
    }

    /// Files what is left of a new limit order in the book and the indexes.
    /// Out of line, which measured fewer instructions a command than inline
    /// (`docs/benchmarks.md`, 2026-11-26): `place` has fewer values to keep
    /// across its match loop.
    #[inline(never)]
    fn rest(&mut self, order: &PlaceOrder, account: u32, instrument: u32, filled: u64, unit: u64, cid_bucket: usize) {
        // An order's id is the sequence number of the command that placed it.
        let (id, remaining) = (self.seq, order.qty - filled);
        // Linked everywhere first, then written whole, once, in its
        // slot (`insert` would copy it from the stack; writing the
        // links after the record stored most of them twice).
        let slot = self.orders.alloc();
        let (level, prev) = self.instruments[instrument as usize].book.append(&mut self.orders, order.side, order.price, remaining, slot);
        let (cid_next, cid_bucket) =
            self.accounts[account as usize].orders.link(&mut self.cid_heads, &mut self.orders, cid_bucket, order.cid, slot);
        self.order_index.insert_newest(&self.orders, id, slot);
        *self.orders.get_mut(slot) = Order {
            id,
            cid: order.cid,
            price: order.price,
            qty: order.qty,
            filled,
            unit_lock: unit,
            account,
            instrument,
            prev,
            next: NIL,
            level,
            cid_next,
            cid_bucket,
            side: order.side,
            stp: order.stp,
            post_only: order.post_only,
        };
    }

    /// [`Engine::fok_can_fill`] for a new order, which locks
    /// `lock_amount`. Out of line and cold: few orders are FOK, and its
    /// arguments, worked out inline, cost every order.
    #[cold]
    #[inline(never)]
    fn fok_order_can_fill(&self, order: &PlaceOrder, instrument: u32, account: u32, lock_amount: u64) -> bool {
        let is_limit = order.order_type == OrderType::Limit;
        let limit = if is_limit { Some(order.price) } else { None };
        let bound = match (!is_limit && order.side == Side::Buy, order.budget) {
            (true, _) => FokBound::Spend(lock_amount),
            (false, Some(least)) => FokBound::Receive(least),
            (false, None) => FokBound::None,
        };
        self.fok_can_fill(instrument, account, order.side, limit, order.qty, order.stp, bound)
    }

    /// Can a FOK order fill completely now? See `docs/engine.md`, check 12.
    #[allow(clippy::too_many_arguments)]
    fn fok_can_fill(
        &self,
        instrument: u32,
        account: u32,
        side: Side,
        limit: Option<i64>,
        qty: u64,
        stp: SelfTradePrevention,
        bound: FokBound,
    ) -> bool {
        let inst = &self.instruments[instrument as usize];
        let levels = match side {
            Side::Buy => &inst.book.asks,
            Side::Sell => &inst.book.bids,
        };
        let mut needed = qty;
        let mut cost: u64 = 0;
        let mut received: u64 = 0;
        for level_ref in levels.iter_best_first() {
            if let Some(limit) = limit
                && !crosses(side, limit, level_ref.price) {
                    return false;
                }
            let mut slot = inst.book.level(level_ref.level).head;
            while slot != NIL {
                let maker = self.orders.get(slot);
                slot = maker.next;
                if maker.account == account {
                    match stp {
                        SelfTradePrevention::None => {}
                        SelfTradePrevention::CancelOldest => continue,
                        SelfTradePrevention::CancelNewest | SelfTradePrevention::CancelBoth => return false,
                    }
                }
                let step = maker.remaining().min(needed);
                match bound {
                    FokBound::Spend(budget) => {
                        cost += taker_cost(&inst.spec, level_ref.price, step);
                        if cost > budget {
                            return false;
                        }
                    }
                    FokBound::Receive(_) => received += taker_proceeds(&inst.spec, level_ref.price, step),
                    FokBound::None => {}
                }
                needed -= step;
                if needed == 0 {
                    return match bound {
                        FokBound::Receive(least) => received >= least,
                        _ => true,
                    };
                }
            }
        }
        false
    }

    /// [`Engine::match_taker`] for a market buy, which spends from a
    /// budget: out of line, so that the common loop has no budget to check
    /// on every trade.
    #[inline(never)]
    fn match_budgeted(&mut self, instrument: u32, taker: &mut Taker, out: &mut Vec<Event>) -> bool {
        self.match_taker::<true>(instrument, taker, out)
    }

    /// The matching loop of `docs/engine.md`. Returns whether the taker was
    /// stopped by self-trade prevention.
    #[inline(always)]
    fn match_taker<const BUDGET: bool>(&mut self, instrument: u32, taker: &mut Taker, out: &mut Vec<Event>) -> bool {
        debug_assert_eq!(BUDGET, taker.budget_left != NO_BUDGET);
        let inst_index = instrument as usize;
        while taker.remaining() > 0 {
            let inst = &self.instruments[inst_index];
            let book = &inst.book;
            let Some(best) = book.best_opposite(taker.side) else {
                return false;
            };
            if !crosses(taker.side, taker.limit, best.price) {
                return false;
            }
            let slot = book.level(best.level).head;
            let resting = self.orders.get(slot);
            let maker = Maker {
                slot,
                id: resting.id,
                account: resting.account,
                remaining: resting.remaining(),
                unit_lock: resting.unit_lock,
                level: resting.level,
            };
            if maker.account == taker.account && taker.stp != SelfTradePrevention::None {
                match taker.stp {
                    SelfTradePrevention::CancelNewest => return true,
                    SelfTradePrevention::CancelOldest => {
                        self.cancel_resting(slot, taker.account_id, CancelReason::Stp, out);
                        continue;
                    }
                    SelfTradePrevention::CancelBoth => {
                        self.cancel_resting(slot, taker.account_id, CancelReason::Stp, out);
                        return true;
                    }
                    SelfTradePrevention::None => unreachable!(),
                }
            }
            // What settling needs of the instrument, taken only when there
            // is a trade to settle.
            let terms = {
                let inst = &self.instruments[inst_index];
                Terms {
                    id: inst.spec.id,
                    base: inst.base,
                    quote: inst.quote,
                    tick_size: inst.spec.tick_size,
                    lot_size: inst.spec.lot_size,
                    maker_bps: inst.spec.maker_bps,
                    taker_bps: inst.spec.taker_bps,
                }
            };
            let mut qty = maker.remaining.min(taker.remaining());
            if BUDGET {
                qty = qty.min(affordable(terms.tick_size, terms.taker_bps, best.price, taker.budget_left));
                if qty == 0 {
                    return false;
                }
            }
            self.trade::<BUDGET>(instrument, &terms, &maker, taker, best.price, qty, out);
        }
        false
    }

    /// Settles one trade of `qty` lots at `price` between a resting order
    /// and the taker, and emits it.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn trade<const BUDGET: bool>(&mut self, instrument: u32, terms: &Terms, maker: &Maker, taker: &mut Taker, price: i64, qty: u64, out: &mut Vec<Event>) {
        stages::enter(Stage::Settlement);
        let (base, quote) = (terms.base, terms.quote);
        let notional = price as u64 * qty * terms.tick_size;
        let base_qty = qty * terms.lot_size;
        let maker_fee = fee(notional, terms.maker_bps);
        let taker_fee = fee(notional, terms.taker_bps);
        let (buyer, buyer_fee, buyer_unit, seller, seller_fee) = match taker.side {
            Side::Buy => (taker.account, taker_fee, (!BUDGET).then_some(taker.unit_lock), maker.account, maker_fee),
            Side::Sell => (maker.account, maker_fee, Some(maker.unit_lock), taker.account, taker_fee),
        };
        // Seller: base leaves the lock, quote (less the fee) arrives.
        self.touch(seller, base).locked -= base_qty;
        {
            let balance = self.touch(seller, quote);
            balance.available = (balance.available as i64 + notional as i64 - seller_fee) as u64;
        }
        // Buyer: base arrives, quote leaves the lock; a limit buy gets back
        // what its per-lot lock held beyond the price and fee paid.
        self.touch(buyer, base).available += base_qty;
        let paid = (notional as i64 + buyer_fee) as u64;
        match buyer_unit {
            Some(unit) => {
                let held = qty * unit;
                let balance = self.touch(buyer, quote);
                balance.locked -= held;
                balance.available += held - paid;
            }
            None => {
                self.touch(buyer, quote).locked -= paid;
                if BUDGET {
                    taker.budget_left -= paid;
                }
            }
        }
        let fees = maker_fee + taker_fee;
        if fees != 0 {
            self.touch(0, quote).available += fees as u64;
        }

        self.trades += 1;
        taker.filled += qty;
        let maker_remaining = maker.remaining - qty;
        let book = &mut self.instruments[instrument as usize].book;
        if maker_remaining == 0 {
            // The maker is the head of the best level: unlinking it is O(1),
            // and an emptied level is the side's last entry (a pop).
            // Unlinking takes its remaining, this fill, off the level, and
            // its record is freed: neither needs the fill written first.
            book.unlink(&mut self.orders, maker.slot);
            self.forget(maker.slot);
        } else {
            self.orders.get_mut(maker.slot).filled += qty;
            book.reduce_level(maker.level, qty);
        }
        let maker_account = self.accounts[maker.account as usize].id;
        self.emit(
            out,
            EventKind::Trade {
                instrument: terms.id,
                price,
                qty,
                maker: maker.id,
                maker_account,
                taker: taker.id,
                taker_account: taker.account_id,
                taker_side: taker.side,
                maker_fee,
                taker_fee,
                maker_remaining,
                taker_remaining: taker.remaining(),
            },
        );
        stages::enter(Stage::Matching);
    }

    /// Adds the order in `slot` to its account's index (in `cid_bucket`,
    /// where the duplicate check looked for it).
    #[inline(always)]
    fn list_order(&mut self, slot: u32, account: u32, cid_bucket: usize) {
        self.accounts[account as usize].orders.insert(&mut self.cid_heads, &mut self.orders, cid_bucket, slot);
    }

    /// Drops an order that is no longer in any level from the indexes and
    /// frees its slot.
    #[inline(never)]
    fn forget(&mut self, slot: u32) {
        let order = self.orders.get(slot);
        let (id, account, cid_next, cid_bucket) = (order.id, order.account, order.cid_next, order.cid_bucket as usize);
        self.forget_read(slot, id, account, cid_next, cid_bucket);
    }

    /// [`Engine::forget`] for a caller that has read the order's id,
    /// account, client-id link and bucket.
    #[inline(always)]
    fn forget_read(&mut self, slot: u32, id: OrderId, account: u32, cid_next: u32, cid_bucket: usize) {
        self.order_index.remove(id, slot);
        self.accounts[account as usize].orders.remove(&mut self.cid_heads, &mut self.orders, slot, cid_next, cid_bucket);
        self.orders.remove(slot);
    }

    /// Cancels a resting order of `account_id`: out of the book, lock
    /// released, event.
    fn cancel_resting(&mut self, slot: u32, account_id: AccountId, reason: CancelReason, out: &mut Vec<Event>) {
        // Everything the exit needs, read at once: the record is not looked
        // up again (each look-up is a bounds check and a reload).
        let order = self.orders.get(slot);
        let (id, owner, instrument, side) = (order.id, order.account, order.instrument, order.side);
        let (remaining, unit_lock) = (order.remaining(), order.unit_lock);
        let (prev, next, level) = (order.prev, order.next, order.level);
        let (cid_next, cid_bucket) = (order.cid_next, order.cid_bucket as usize);
        let inst = &mut self.instruments[instrument as usize];
        let asset = inst.locked_asset(side);
        inst.book.unlink_read(&mut self.orders, prev, next, level, remaining, side);
        self.forget_read(slot, id, owner, cid_next, cid_bucket);
        self.unlock(owner, asset, times(remaining, unit_lock));
        debug_assert_eq!(self.accounts[owner as usize].id, account_id);
        self.emit(out, EventKind::Cancelled { order: id, account: account_id, remaining, reason });
    }

    /// The slot of open order `order_id` if `account_id` may act on it.
    #[inline(always)]
    fn owned_order(&self, account_id: AccountId, order_id: OrderId) -> Result<(u32, u32), RejectReason> {
        let account = self.account_index.get(account_id).ok_or(RejectReason::UnknownAccount)?;
        let (slot, order) = self.order_index.find(&self.orders, order_id).ok_or(RejectReason::UnknownOrder)?;
        if order.account != account {
            return Err(RejectReason::NotOwner);
        }
        Ok((account, slot))
    }

    fn cancel(&mut self, account_id: AccountId, order_id: OrderId, out: &mut Vec<Event>) -> Result<(), RejectReason> {
        let (_, slot) = self.owned_order(account_id, order_id)?;
        stages::enter(Stage::Matching);
        self.cancel_resting(slot, account_id, CancelReason::User, out);
        Ok(())
    }

    fn replace(&mut self, account_id: AccountId, order_id: OrderId, price: i64, qty: u64, out: &mut Vec<Event>) -> Result<(), RejectReason> {
        let (account, slot) = self.owned_order(account_id, order_id)?;
        let order = *self.orders.get(slot);
        if qty <= order.filled {
            self.cancel_resting(slot, account_id, CancelReason::Replace, out);
            return Ok(());
        }
        let inst = &self.instruments[order.instrument as usize];
        let spec = &inst.spec;
        // A halted instrument has no room for any quantity (see `place`):
        // there, only a replace that lowers the quantity at the order's own
        // price (it cannot trade) goes on, to the range check itself.
        if qty.wrapping_sub(spec.min_qty) >= inst.qty_room {
            if inst.halted && !(price == order.price && qty < order.qty) {
                return Err(RejectReason::InstrumentHalted);
            }
            if qty < spec.min_qty || qty > spec.max_qty {
                return Err(RejectReason::InvalidQuantity);
            }
        }
        if price <= 0 {
            return Err(RejectReason::InvalidPrice);
        }
        if price < spec.min_price || price > spec.max_price {
            return Err(RejectReason::PriceOutOfBand);
        }
        let asset = inst.locked_asset(order.side);
        let new_unit = unit_lock(spec, order.side, price);
        let new_remaining = qty - order.filled;
        let old_lock = times(order.remaining(), order.unit_lock);
        let new_lock = times(new_remaining, new_unit);
        if new_lock > old_lock && new_lock - old_lock > self.available(account, asset) {
            return Err(RejectReason::InsufficientFunds);
        }
        if order.post_only
            && let Some(best) = inst.book.best_opposite(order.side)
                && crosses(order.side, price, best.price) {
                    return Err(RejectReason::PostOnlyWouldTake);
                }

        stages::enter(Stage::Matching);
        if new_lock > old_lock {
            self.lock(account, asset, new_lock - old_lock);
        } else {
            self.unlock(account, asset, old_lock - new_lock);
        }
        let keeps_priority = price == order.price && qty <= order.qty;
        if keeps_priority {
            self.reduce_in_place(slot, &order, qty, out);
            return Ok(());
        }
        self.emit(out, EventKind::Replaced { order: order.id, price, qty, remaining: new_remaining, priority_kept: false });
        self.instruments[order.instrument as usize].book.unlink(&mut self.orders, slot);
        let mut taker = Taker {
            id: order.id,
            account,
            account_id,
            side: order.side,
            limit: price,
            qty,
            filled: order.filled,
            unit_lock: new_unit,
            stp: order.stp,
            budget_left: NO_BUDGET,
        };
        let stopped = self.match_taker::<false>(order.instrument, &mut taker, out);
        let remaining = taker.remaining();
        {
            let resting = self.orders.get_mut(slot);
            resting.price = price;
            resting.qty = qty;
            resting.filled = taker.filled;
            resting.unit_lock = new_unit;
        }
        if remaining == 0 {
            self.forget(slot);
        } else if stopped {
            self.forget(slot);
            self.emit(out, EventKind::Cancelled { order: order.id, account: account_id, remaining, reason: CancelReason::Stp });
            self.unlock(account, asset, times(remaining, new_unit));
        } else {
            self.instruments[order.instrument as usize].book.push_back(&mut self.orders, slot);
        }
        Ok(())
    }

    /// A replace at the order's own price, whatever that is when the
    /// command comes: it only ever lowers the quantity, so the order keeps
    /// its place. A gateway that learned the price from its records cannot
    /// move the order back by amending it after another gateway's replace.
    fn amend(&mut self, account_id: AccountId, order_id: OrderId, qty: u64, out: &mut Vec<Event>) -> Result<(), RejectReason> {
        let (account, slot) = self.owned_order(account_id, order_id)?;
        let order = *self.orders.get(slot);
        if qty <= order.filled {
            self.cancel_resting(slot, account_id, CancelReason::Replace, out);
            return Ok(());
        }
        let inst = &self.instruments[order.instrument as usize];
        if qty > order.qty || qty < inst.spec.min_qty {
            return Err(RejectReason::InvalidQuantity);
        }
        let asset = inst.locked_asset(order.side);
        stages::enter(Stage::Matching);
        self.unlock(account, asset, times(order.qty - qty, order.unit_lock));
        self.reduce_in_place(slot, &order, qty, out);
        Ok(())
    }

    /// Lowers a resting order's total quantity to `qty` (above what is
    /// filled) where it stands; its lock has been adjusted already.
    fn reduce_in_place(&mut self, slot: u32, order: &Order, qty: u64, out: &mut Vec<Event>) {
        self.emit(
            out,
            EventKind::Replaced { order: order.id, price: order.price, qty, remaining: qty - order.filled, priority_kept: true },
        );
        self.instruments[order.instrument as usize].book.reduce_level(order.level, order.qty - qty);
        self.orders.get_mut(slot).qty = qty;
    }

    /// `halt` (`halted`) or `resume`: refused if the instrument is already
    /// so. Resting orders are left as they are.
    fn set_halted(&mut self, instrument: InstrumentId, halted: bool, out: &mut Vec<Event>) -> Result<(), RejectReason> {
        let index = self.instrument_index.get(instrument.into()).ok_or(RejectReason::UnknownInstrument)?;
        let inst = &mut self.instruments[index as usize];
        if inst.halted == halted {
            return Err(if halted { RejectReason::InstrumentHalted } else { RejectReason::NotHalted });
        }
        inst.halted = halted;
        inst.qty_room = if halted { 0 } else { inst.spec.max_qty - inst.spec.min_qty + 1 };
        self.emit(out, if halted { EventKind::Halted { instrument } } else { EventKind::Resumed { instrument } });
        Ok(())
    }

    fn cancel_all(&mut self, account_id: AccountId, instrument: Option<InstrumentId>, out: &mut Vec<Event>) -> Result<(), RejectReason> {
        let account = self.account_index.get(account_id).ok_or(RejectReason::UnknownAccount)?;
        let only = match instrument {
            Some(id) => Some(self.instrument_index.get(id.into()).ok_or(RejectReason::UnknownInstrument)?),
            None => None,
        };
        stages::enter(Stage::Matching);
        let mut slots = std::mem::take(&mut self.scratch);
        self.slots_oldest_first(account, &mut slots);
        let mut count = 0u64;
        for &slot in &slots {
            if only.is_none_or(|i| i == self.orders.get(slot).instrument) {
                self.cancel_resting(slot, account_id, CancelReason::CancelAll, out);
                count += 1;
            }
        }
        self.scratch = slots;
        self.emit(out, EventKind::MassCancelled { account: account_id, count });
        Ok(())
    }

    // ---- queries ---------------------------------------------------------

    /// (available, locked) of an account's asset, if both exist.
    pub fn balance(&self, account: AccountId, asset: AssetId) -> Option<(u64, u64)> {
        let (account, asset) = self.account_and_asset(account, asset).ok()?;
        let balance = self.balances[account as usize * self.asset_stride + asset as usize];
        Some((balance.available, balance.locked))
    }

    /// Whether `account` is open.
    pub fn has_account(&self, account: AccountId) -> bool {
        self.account_index.get(account).is_some()
    }

    /// Every asset's (asset, available, locked) for `account`, assets in the
    /// order they were added; `None` for an unknown account. O(assets).
    pub fn balances_of(&self, account: AccountId) -> Option<Vec<(AssetId, u64, u64)>> {
        let index = self.account_index.get(account)? as usize;
        let row = &self.balances[index * self.asset_stride..];
        Some(self.assets.iter().zip(row).map(|(asset, b)| (asset.id, b.available, b.locked)).collect())
    }

    /// `account`'s open orders, oldest first (from its own table: O(its
    /// orders) to find them, whatever the size of the books, and a sort);
    /// `instrument` keeps one instrument's. Empty for an unknown account.
    pub fn open_orders_of(&self, account: AccountId, instrument: Option<InstrumentId>) -> Vec<OrderView> {
        let Some(index) = self.account_index.get(account) else { return Vec::new() };
        let mut slots = Vec::new();
        self.slots_oldest_first(index, &mut slots);
        slots
            .into_iter()
            .map(|slot| self.orders.get(slot))
            .filter_map(|o| {
                let spec = &self.instruments[o.instrument as usize].spec;
                instrument.is_none_or(|id| id == spec.id).then_some(OrderView {
                    id: o.id,
                    account,
                    instrument: spec.id,
                    cid: o.cid,
                    side: o.side,
                    price: o.price,
                    qty: o.qty,
                    filled: o.filled,
                })
            })
            .collect()
    }

    /// The slots of `account`'s (by index) open orders, oldest first, in
    /// `slots` (cleared first). Its table lists them in no order.
    fn slots_oldest_first(&self, account: u32, slots: &mut Vec<u32>) {
        slots.clear();
        self.accounts[account as usize].orders.slots_into(&self.cid_heads, &self.orders, slots);
        slots.sort_unstable_by_key(|&slot| self.orders.get(slot).id);
    }

    /// An instrument by its id, for the queries.
    fn instrument_by_id(&self, instrument: InstrumentId) -> Option<&Instrument> {
        let index = self.instrument_index.get(instrument.into())?;
        Some(&self.instruments[index as usize])
    }

    /// Best bid and best ask prices of an instrument.
    pub fn top_of_book(&self, instrument: InstrumentId) -> Option<(Option<i64>, Option<i64>)> {
        let book = &self.instrument_by_id(instrument)?.book;
        Some((book.bids.best().map(|l| l.price), book.asks.best().map(|l| l.price)))
    }

    /// An open order, as its owner would see it.
    pub fn order(&self, order: OrderId) -> Option<OrderView> {
        let slot = self.order_index.get(&self.orders, order)?;
        let o = self.orders.get(slot);
        Some(OrderView {
            id: o.id,
            account: self.accounts[o.account as usize].id,
            instrument: self.instruments[o.instrument as usize].spec.id,
            cid: o.cid,
            side: o.side,
            price: o.price,
            qty: o.qty,
            filled: o.filled,
        })
    }

    /// The book of an instrument level by level: asks from the best up,
    /// then bids from the best down, as (side, price, total lots, orders).
    pub fn depth(&self, instrument: InstrumentId) -> Option<Vec<(Side, i64, u64, u32)>> {
        let book = &self.instrument_by_id(instrument)?.book;
        let mut levels = Vec::new();
        for (side, book_side) in [(Side::Sell, &book.asks), (Side::Buy, &book.bids)] {
            for level_ref in book_side.iter_best_first() {
                let level = book.level(level_ref.level);
                levels.push((side, level.price, level.total_qty, book.order_count(&self.orders, level_ref.level)));
            }
        }
        Some(levels)
    }

    /// Every open order, book by book (instruments in the order they were
    /// added, bids then asks, best level first, queue order).
    pub fn open_order_views(&self) -> Vec<OrderView> {
        let mut views = Vec::with_capacity(self.orders.len());
        for inst in &self.instruments {
            for side in [&inst.book.bids, &inst.book.asks] {
                for level_ref in side.iter_best_first() {
                    let mut slot = inst.book.level(level_ref.level).head;
                    while slot != NIL {
                        let o = self.orders.get(slot);
                        views.push(OrderView {
                            id: o.id,
                            account: self.accounts[o.account as usize].id,
                            instrument: inst.spec.id,
                            cid: o.cid,
                            side: o.side,
                            price: o.price,
                            qty: o.qty,
                            filled: o.filled,
                        });
                        slot = o.next;
                    }
                }
            }
        }
        views
    }

    /// Number of open (resting) orders across all books.
    pub fn open_orders(&self) -> usize {
        self.orders.len()
    }

    /// Ids of all accounts, in the order they were opened (fee account first).
    pub fn account_ids(&self) -> impl Iterator<Item = AccountId> + '_ {
        self.accounts.iter().map(|a| a.id)
    }

    /// Ids of all instruments, in the order they were added.
    pub fn instrument_ids(&self) -> impl Iterator<Item = InstrumentId> + '_ {
        self.instruments.iter().map(|i| i.spec.id)
    }

    /// Ids of all assets, in the order they were added.
    pub fn asset_ids(&self) -> impl Iterator<Item = AssetId> + '_ {
        self.assets.iter().map(|a| a.id)
    }

    /// An asset's name, if the asset exists.
    pub fn asset_name(&self, asset: AssetId) -> Option<Symbol> {
        let index = self.asset_index.get(asset.into())?;
        Some(self.assets[index as usize].name)
    }

    /// An instrument's definition, if the instrument exists.
    pub fn instrument_spec(&self, instrument: InstrumentId) -> Option<InstrumentSpec> {
        Some(self.instrument_by_id(instrument)?.spec)
    }

    /// Whether trading on `instrument` is halted; `None` if it is unknown.
    pub fn is_halted(&self, instrument: InstrumentId) -> Option<bool> {
        Some(self.instrument_by_id(instrument)?.halted)
    }

    /// Deposits minus withdrawals of an asset.
    pub fn supply(&self, asset: AssetId) -> Option<u64> {
        let index = self.asset_index.get(asset.into())?;
        Some(self.assets[index as usize].supply)
    }

    // ---- restoring from a snapshot (see snapshot.rs) ---------------------

    pub(crate) fn asset_table(&self) -> Vec<(AssetId, Symbol, u64)> {
        self.assets.iter().map(|a| (a.id, a.name, a.supply)).collect()
    }

    pub(crate) fn set_supply(&mut self, asset: u32, supply: u64) {
        self.assets[asset as usize].supply = supply;
    }

    /// Sets the sequence number after a restore.
    pub(crate) fn set_seq(&mut self, seq: u64) {
        self.seq = seq;
    }

    /// Puts a restored order into the arena, its book level (at the back)
    /// (its indexes come later, in id order).
    pub(crate) fn restore_order(&mut self, mut order: Order) -> Result<u32, String> {
        let spec = &self.instruments[order.instrument as usize].spec;
        if order.price < spec.min_price || order.price > spec.max_price || order.qty > spec.max_qty {
            return Err(format!("order {}: price or quantity outside its instrument's limits", order.id));
        }
        order.unit_lock = unit_lock(spec, order.side, order.price);
        let slot = self.orders.insert(order);
        self.instruments[order.instrument as usize].book.push_back(&mut self.orders, slot);
        Ok(slot)
    }

    /// Indexes a restored order: the order-id index and its account's table.
    pub(crate) fn list_restored_order(&mut self, slot: u32) -> Result<(), String> {
        let order = *self.orders.get(slot);
        let (duplicate, cid_bucket) = self.accounts[order.account as usize].orders.find(&self.cid_heads, &self.orders, order.cid);
        if duplicate {
            return Err(format!("order {}: client order id {} used twice", order.id, order.cid));
        }
        // Restored orders come in order of id, not every id resting.
        self.order_index.insert(order.id, slot);
        self.list_order(slot, order.account, cid_bucket);
        Ok(())
    }

    pub(crate) fn asset_supply_by_index(&self, asset: u32) -> u64 {
        self.assets[asset as usize].supply
    }

    pub(crate) fn asset_count(&self) -> usize {
        self.assets.len()
    }

    pub(crate) fn order_index_len(&self) -> usize {
        self.order_index.len()
    }

    /// Orders in the accounts' indexes, by their own counts.
    pub(crate) fn cid_index_len(&self) -> usize {
        self.accounts.iter().map(|account| account.orders.len()).sum()
    }

    /// Whether `account`'s index (by index) holds `cid`.
    pub(crate) fn cid_taken(&self, account: u32, cid: ClientOrderId) -> bool {
        self.accounts[account as usize].orders.find(&self.cid_heads, &self.orders, cid).0
    }

    pub(crate) fn order_slot(&self, order: OrderId) -> Option<u32> {
        self.order_index.get(&self.orders, order)
    }

    /// The slots of `account`'s (by index) orders, as its index lists them.
    pub(crate) fn account_order_slots(&self, account: u32) -> Vec<u32> {
        let mut slots = Vec::new();
        self.accounts[account as usize].orders.slots_into(&self.cid_heads, &self.orders, &mut slots);
        slots
    }
}

#[cfg(test)]
mod tests {
    use super::{MAX_SUPPLY, fee};
    use crate::{Command, Engine, EventKind, InstrumentSpec, RejectReason, Symbol};

    /// `InstrumentSpec::invalid_because` (what a configuration's error
    /// names) refuses exactly what the engine refuses as
    /// `invalid_instrument`: each rule broken alone, and each at its edge.
    #[test]
    fn invalid_because_names_exactly_what_the_engine_refuses() {
        let base = InstrumentSpec {
            id: 1,
            symbol: Symbol::new("BTC-USD").expect("symbol"),
            base: 1,
            quote: 2,
            tick_size: 10,
            lot_size: 1,
            min_qty: 1,
            max_qty: 1_000,
            min_price: 1,
            max_price: 1_000_000,
            maker_bps: -2,
            taker_bps: 5,
        };
        let edits: [fn(&mut InstrumentSpec); 22] = [
            |_| {},
            |s| s.quote = 1,
            |s| s.tick_size = 0,
            |s| s.lot_size = 0,
            |s| s.min_qty = 0,
            |s| s.min_qty = 1_001,
            |s| s.min_qty = 1_000,
            |s| s.min_price = 0,
            |s| s.min_price = -5,
            |s| s.min_price = 1_000_001,
            |s| s.min_price = 1_000_000,
            |s| s.taker_bps = -1,
            |s| s.taker_bps = 10_001,
            |s| s.taker_bps = 10_000,
            |s| s.maker_bps = 6,
            |s| s.maker_bps = 5,
            |s| s.maker_bps = -6,
            |s| s.maker_bps = -5,
            |s| (s.max_price, s.max_qty) = (i64::MAX, u64::MAX),
            |s| (s.max_qty, s.lot_size) = (MAX_SUPPLY, 2),
            |s| (s.max_qty, s.lot_size, s.max_price, s.tick_size) = (MAX_SUPPLY, 1, 1, 1),
            |s| (s.max_price, s.max_qty, s.tick_size) = (i64::MAX, 1, 1),
        ];
        // What an engine with the two assets makes of the definition.
        let added = |spec: InstrumentSpec| {
            let mut engine = Engine::new();
            let mut out = Vec::new();
            for (id, name) in [(1, "BTC"), (2, "USD")] {
                engine.apply(&Command::AddAsset { id, name: Symbol::new(name).expect("name") }, &mut out);
            }
            out.clear();
            engine.apply(&Command::AddInstrument(spec), &mut out);
            out.iter().map(|e| e.kind).collect::<Vec<_>>()
        };
        let invalid = EventKind::Rejected { reason: RejectReason::InvalidInstrument };
        for (n, edit) in edits.iter().enumerate() {
            let mut spec = base;
            edit(&mut spec);
            let refused = added(spec).contains(&invalid);
            assert_eq!(refused, spec.invalid_because().is_some(), "edit {n}: {spec:?} ({:?})", spec.invalid_because());
        }
        // Limits whose product overflows 128 bits (audit, 2026-11-27: it
        // wrapped to a small or negative number, and such an instrument
        // was taken; a buy then broke the lock's bound, a trade settled
        // for nothing): refused, by both.
        let edits: [fn(&mut InstrumentSpec); 5] = [
            |s| (s.max_price, s.max_qty, s.tick_size) = (1 << 62, 1 << 62, 8),
            |s| (s.max_price, s.max_qty, s.tick_size) = (1 << 62, 1 << 62, 16),
            |s| (s.max_price, s.max_qty, s.tick_size) = (1 << 62, 8, 1 << 63),
            |s| (s.max_price, s.max_qty, s.tick_size) = (i64::MAX, u64::MAX, u64::MAX),
            |s| (s.max_qty, s.lot_size) = (u64::MAX, u64::MAX),
        ];
        for (n, edit) in edits.iter().enumerate() {
            let mut spec = base;
            edit(&mut spec);
            assert_eq!(added(spec), vec![invalid], "overflow {n}");
            assert!(spec.invalid_because().is_some_and(|why| why.contains("past 2^62")), "overflow {n}: {:?}", spec.invalid_because());
        }
    }

    /// `ceil(notional * bps / 10000)` in 128-bit arithmetic.
    fn exact(notional: u64, bps: i64) -> i64 {
        let product = i128::from(notional) * i128::from(bps);
        let quotient = product.div_euclid(10_000);
        let ceil = if product.rem_euclid(10_000) == 0 { quotient } else { quotient + 1 };
        i64::try_from(ceil).expect("a fee fits in an i64")
    }

    /// Both paths (below and above 2^49) against the exact value, at the
    /// edges of the fast path and of the rates, and at random.
    #[test]
    fn fee_is_the_exact_ceiling() {
        let mut notionals = vec![0, 1, 9_999, 10_000, 10_001, (1 << 49) - 1, 1 << 49, (1 << 49) + 1, MAX_SUPPLY];
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..20_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            notionals.push((state % (MAX_SUPPLY + 1)) >> (state % 40));
        }
        for &notional in &notionals {
            for bps in [-10_000, -9_999, -37, -1, 0, 1, 2, 25, 9_999, 10_000] {
                assert_eq!(fee(notional, bps), exact(notional, bps), "fee({notional}, {bps})");
            }
        }
    }
}
