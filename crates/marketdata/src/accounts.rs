//! Each account's own orders and trades, derived from durable engine
//! events like the rest of market data: what Binance's signed endpoints
//! (`GET /api/v3/order`, `openOrders`, `allOrders`, `myTrades`) and the
//! user data stream show. Orders placed through any gateway are here (a
//! binary order's client id is its number written in decimal; a FIX or
//! REST order's is the ClOrdID or `newClientOrderId` the gateway journaled
//! with it).
//!
//! **Kept**: every open order; of each account the last `orders_kept`
//! orders that ended and the last `trades_kept` trades ([`ORDERS_KEPT`]
//! and [`TRADES_KEPT_PER_ACCOUNT`] unless the venue sets them). What is
//! older is forgotten (`docs/trading.md` says so). Balances are not here:
//! the engine is their source, asked through the sequencer.

use crossbook_engine::codec::{side_code, stp_code, tif_code};
use crossbook_engine::{AccountId, CancelReason, ClientOrderId, OrderId, OrderType, SelfTradePrevention, Side, TimeInForce};
use compact_str::{CompactString, ToCompactString};
use foldhash::HashMap;
use std::collections::{BTreeSet, VecDeque};

/// Orders that ended, kept per account, unless the venue says otherwise
/// (`market_data.orders_kept`).
pub const ORDERS_KEPT: usize = 10_000;
/// Trades kept per account, unless the venue says otherwise
/// (`market_data.trades_kept`).
pub const TRADES_KEPT_PER_ACCOUNT: usize = 10_000;

/// Where an order stands, in Binance's terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OrderStatus {
    New,
    PartiallyFilled,
    Filled,
    /// Cancelled by its owner (cancel, cancel-all, or a replace down to
    /// what was filled).
    Canceled,
    /// An IOC or market order's unfilled rest, or a FOK that could not
    /// fill.
    Expired,
    /// Cancelled by self-trade prevention.
    ExpiredInMatch,
}

impl OrderStatus {
    pub fn binance(self) -> &'static str {
        match self {
            OrderStatus::New => "NEW",
            OrderStatus::PartiallyFilled => "PARTIALLY_FILLED",
            OrderStatus::Filled => "FILLED",
            OrderStatus::Canceled => "CANCELED",
            OrderStatus::Expired => "EXPIRED",
            OrderStatus::ExpiredInMatch => "EXPIRED_IN_MATCH",
        }
    }

    pub fn is_open(self) -> bool {
        matches!(self, OrderStatus::New | OrderStatus::PartiallyFilled)
    }

    fn code(self) -> u8 {
        self as u8
    }

    fn from_code(code: u8) -> Option<OrderStatus> {
        use OrderStatus::*;
        [New, PartiallyFilled, Filled, Canceled, Expired, ExpiredInMatch].into_iter().find(|s| s.code() == code)
    }
}

/// One order, as its owner sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OrderRecord {
    pub id: OrderId,
    pub account: AccountId,
    /// Its instrument's index in [`crate::MarketData::instruments`].
    pub instrument: u32,
    /// Binance's `clientOrderId`.
    pub client_id: CompactString,
    /// [`client_hash`] of its account and client id: where the open
    /// client ids keep it, found again without hashing.
    pub client_hash: u64,
    pub cid: ClientOrderId,
    pub side: Side,
    pub order_type: OrderType,
    pub tif: TimeInForce,
    pub post_only: bool,
    pub stp: SelfTradePrevention,
    pub price: i64,
    /// Its quantity, filled lots included (a replace changes it).
    pub qty: u64,
    pub filled: u64,
    /// The sum of price x lots over its fills (ticks x lots).
    pub quote_filled: u128,
    /// A market buy's budget in quote units (`quoteOrderQty`).
    pub budget: Option<u64>,
    pub status: OrderStatus,
    /// When it was placed, and when it last changed (journal time, ms).
    pub time_ms: u64,
    pub update_ms: u64,
}

/// One fill, as one side's owner sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AccountTrade {
    /// The instrument's trade id (market data's, `GET /api/v3/trades`).
    pub id: u64,
    pub instrument: u32,
    pub order: OrderId,
    pub price: i64,
    pub qty: u64,
    /// This side's fee in quote units (negative: a rebate).
    pub fee: i64,
    pub is_buyer: bool,
    pub is_maker: bool,
    pub time_ms: u64,
    /// The command that made it.
    pub seq: u64,
}

/// One account's history.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AccountData {
    pub open: BTreeSet<OrderId>,
    /// Orders that ended, oldest first.
    pub closed: VecDeque<OrderId>,
    /// Its fills, oldest first.
    pub trades: VecDeque<AccountTrade>,
    /// When its orders or balances last changed.
    pub update_ms: u64,
}

/// Every account's orders and trades.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Accounts {
    /// Open orders, and the ended ones each account still keeps.
    pub orders: crate::ByOrderId<OrderRecord>,
    pub accounts: HashMap<AccountId, AccountData>,
    /// Every open order by (account, client id).
    open_client_ids: ClientIds,
    /// The largest engine client id seen in `gateway_cids` (a gateway that
    /// numbers its orders goes on after it).
    pub largest_gateway_cid: u64,
    /// The range of engine client ids a gateway gives its orders (the
    /// REST gateway's), tracked in `largest_gateway_cid`.
    pub gateway_cids: std::ops::Range<u64>,
    /// Accounts past a window, trimmed before the next command (an
    /// account may be here more than once).
    over: Vec<AccountId>,
    /// Each account's windows: ended orders and trades kept.
    orders_kept: usize,
    trades_kept: usize,
}

impl Default for Accounts {
    fn default() -> Accounts {
        Accounts {
            orders: crate::ByOrderId::default(),
            accounts: HashMap::default(),
            open_client_ids: ClientIds::default(),
            largest_gateway_cid: 0,
            gateway_cids: 0..0,
            over: Vec::new(),
            orders_kept: ORDERS_KEPT,
            trades_kept: TRADES_KEPT_PER_ACCOUNT,
        }
    }
}

/// The part of a place command that its events do not carry.
#[derive(Clone, Copy, Debug)]
pub struct PlaceDetails<'a> {
    pub client_id: Option<&'a str>,
    /// Placed by the gateway that numbers its orders in `gateway_cids`.
    pub gateway: bool,
    pub post_only: bool,
    pub stp: SelfTradePrevention,
    pub budget: Option<u64>,
}

impl Accounts {
    pub fn new(gateway_cids: std::ops::Range<u64>) -> Accounts {
        Accounts { gateway_cids, ..Accounts::default() }
    }

    /// Keeps the last `orders` ended orders and `trades` trades of each
    /// account: what is past them now goes before the next command. Every
    /// node of a venue must keep the same (the records are a function of
    /// the journal and these two numbers).
    pub fn set_windows(&mut self, orders: usize, trades: usize) {
        self.orders_kept = orders;
        self.trades_kept = trades;
        self.mark_over_full();
    }

    /// Every account past a window, to be trimmed before the next command.
    fn mark_over_full(&mut self) {
        let (orders, trades) = (self.orders_kept, self.trades_kept);
        let mut over: Vec<AccountId> = self.accounts.iter().filter(|(_, d)| d.closed.len() > orders || d.trades.len() > trades).map(|(a, _)| *a).collect();
        over.sort_unstable();
        self.over = over;
    }

    /// An account's open order by client id.
    pub fn open_by_client_id(&self, account: AccountId, client_id: &str) -> Option<&OrderRecord> {
        self.open_client_ids.find(&self.orders, client_hash(account, client_id), account, client_id).and_then(|id| self.orders.get(&id))
    }

    /// An account's order (open, or ended and still kept) by client id:
    /// the open one, else the newest that ended.
    pub fn by_client_id(&self, account: AccountId, client_id: &str) -> Option<&OrderRecord> {
        self.open_by_client_id(account, client_id).or_else(|| {
            let data = self.accounts.get(&account)?;
            data.closed.iter().rev().filter_map(|id| self.orders.get(id)).find(|o| o.client_id == client_id)
        })
    }

    /// An account's order by id (another account's is not found).
    pub fn order_of(&self, account: AccountId, id: OrderId) -> Option<&OrderRecord> {
        self.orders.get(&id).filter(|o| o.account == account)
    }

    /// An order accepted by the engine.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn accepted(&mut self, id: OrderId, account: AccountId, instrument: u32, cid: ClientOrderId, side: Side, order_type: OrderType, tif: TimeInForce, price: i64, qty: u64, time_ms: u64, details: Option<PlaceDetails<'_>>) {
        let client_id = details.and_then(|d| d.client_id).map_or_else(|| cid.to_compact_string(), CompactString::from);
        let hash = client_hash(account, &client_id);
        // Only the gateway's own orders: a binary client's cid in that
        // range does not move its numbering.
        if details.is_some_and(|d| d.gateway) && self.gateway_cids.contains(&cid) {
            self.largest_gateway_cid = self.largest_gateway_cid.max(cid);
        }
        let record = OrderRecord {
            id,
            account,
            instrument,
            client_id,
            client_hash: hash,
            cid,
            side,
            order_type,
            tif,
            post_only: details.is_some_and(|d| d.post_only),
            stp: details.map_or(SelfTradePrevention::None, |d| d.stp),
            price,
            qty,
            filled: 0,
            quote_filled: 0,
            budget: details.and_then(|d| d.budget),
            status: OrderStatus::New,
            time_ms,
            update_ms: time_ms,
        };
        let data = self.accounts.entry(account).or_default();
        data.open.insert(id);
        data.update_ms = time_ms;
        // Client ids of open orders are unique per account within one
        // gateway; one of another gateway's with the same text keeps the
        // first (the later one is still found by its id).
        self.open_client_ids.insert_if_absent(&self.orders, &record);
        self.orders.insert(id, record);
    }

    /// The account's balances changed at `time_ms` by something else than
    /// its orders (the operator's deposit or withdrawal).
    pub(crate) fn balances_changed(&mut self, account: AccountId, time_ms: u64) {
        self.accounts.entry(account).or_default().update_ms = time_ms;
    }

    /// A FOK order that could not fill: it is kept as expired (Binance
    /// answers such an order with status `EXPIRED`, not an error).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn expired_unfilled(&mut self, id: OrderId, account: AccountId, instrument: u32, cid: ClientOrderId, side: Side, order_type: OrderType, price: i64, qty: u64, time_ms: u64, details: Option<PlaceDetails<'_>>) {
        self.accepted(id, account, instrument, cid, side, order_type, TimeInForce::Fok, price, qty, time_ms, details);
        self.end(id, OrderStatus::Expired, time_ms);
    }

    /// One fill of `order` (either side).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn fill(&mut self, trade_id: u64, instrument: u32, order: OrderId, account: AccountId, price: i64, qty: u64, remaining: u64, fee: i64, is_buyer: bool, is_maker: bool, time_ms: u64, seq: u64) {
        let data = self.accounts.entry(account).or_default();
        data.update_ms = time_ms;
        data.trades.push_back(AccountTrade { id: trade_id, instrument, order, price, qty, fee, is_buyer, is_maker, time_ms, seq });
        let over = data.trades.len() > self.trades_kept;
        if let Some(record) = self.orders.get_mut(&order) {
            record.filled += qty;
            record.quote_filled += u128::from(qty) * price.unsigned_abs() as u128;
            record.update_ms = time_ms;
            if remaining > 0 {
                record.status = OrderStatus::PartiallyFilled;
            } else {
                end_record(record, OrderStatus::Filled, time_ms, data, &mut self.open_client_ids);
            }
        }
        if over || data.closed.len() > self.orders_kept {
            self.mark_over(account);
        }
    }

    /// `order` cancelled; `book_left`: the book still had orders to meet
    /// it when it ended (a market buy with a budget then stopped because
    /// the budget was spent: Binance calls such an order `FILLED`).
    pub(crate) fn cancelled(&mut self, order: OrderId, reason: CancelReason, time_ms: u64, book_left: bool) {
        let mut status = match reason {
            CancelReason::User | CancelReason::CancelAll | CancelReason::Replace => OrderStatus::Canceled,
            CancelReason::Ioc => OrderStatus::Expired,
            CancelReason::Stp => OrderStatus::ExpiredInMatch,
        };
        if let Some(record) = self.orders.get_mut(&order)
            && record.budget.is_some()
            && reason == CancelReason::Ioc
        {
            // A quote-quantity order's quantity is what it bought.
            record.qty = record.filled;
            if book_left && record.filled > 0 {
                status = OrderStatus::Filled;
            }
        }
        self.end(order, status, time_ms);
    }

    /// A new price and total quantity (and, from a FIX replace, a new
    /// client id).
    pub(crate) fn replaced(&mut self, order: OrderId, price: i64, qty: u64, client_id: Option<&str>, time_ms: u64) {
        let Some(record) = self.orders.get_mut(&order) else { return };
        record.price = price;
        record.qty = qty;
        record.update_ms = time_ms;
        if let Some(data) = self.accounts.get_mut(&record.account) {
            data.update_ms = time_ms;
        }
        if let Some(new) = client_id
            && new != record.client_id
        {
            self.open_client_ids.remove(record.client_hash, order);
            record.client_id = CompactString::from(new);
            record.client_hash = client_hash(record.account, new);
            if let Some(record) = self.orders.get(&order) {
                self.open_client_ids.insert_if_absent(&self.orders, record);
            }
        }
    }

    /// `order` ended with `status`: out of the open ones, into the
    /// account's window of ended orders (the oldest beyond it forgotten).
    fn end(&mut self, order: OrderId, status: OrderStatus, time_ms: u64) {
        let Some(record) = self.orders.get_mut(&order) else { return };
        let data = self.accounts.entry(record.account).or_default();
        end_record(record, status, time_ms, data, &mut self.open_client_ids);
        if data.closed.len() > self.orders_kept || data.trades.len() > self.trades_kept {
            let account = record.account;
            self.mark_over(account);
        }
    }

    /// Has `account` trimmed before the next command.
    fn mark_over(&mut self, account: AccountId) {
        if self.over.last() != Some(&account) {
            self.over.push(account);
        }
    }

    /// Forgets what is past each account's windows (the oldest ended
    /// orders and trades). Called before each command, never during one:
    /// the orders and trades of the command just applied are all there for
    /// whoever reads them right after it (a REST answer, a user stream).
    pub(crate) fn trim(&mut self) {
        for account in self.over.drain(..) {
            let Some(data) = self.accounts.get_mut(&account) else { continue };
            while data.closed.len() > self.orders_kept {
                if let Some(old) = data.closed.pop_front() {
                    self.orders.remove(&old);
                }
            }
            while data.trades.len() > self.trades_kept {
                data.trades.pop_front();
            }
        }
    }

    // ---- checkpoint ------------------------------------------------------

    pub(crate) fn encode(&self, out: &mut Vec<u8>, instrument_ids: &[u32]) {
        put64(out, self.largest_gateway_cid);
        let mut ids: Vec<&OrderId> = self.orders.keys().collect();
        ids.sort_unstable();
        put64(out, ids.len() as u64);
        for id in ids {
            let o = &self.orders[id];
            put64(out, o.id);
            put64(out, o.account);
            put32(out, instrument_ids[o.instrument as usize]);
            put64(out, o.cid);
            out.push(o.client_id.len() as u8);
            out.extend_from_slice(o.client_id.as_bytes());
            out.push(side_code(o.side));
            out.push(u8::from(o.order_type == OrderType::Market));
            out.push(tif_code(o.tif));
            out.push(u8::from(o.post_only));
            out.push(stp_code(o.stp));
            put64(out, o.price as u64);
            put64(out, o.qty);
            put64(out, o.filled);
            out.extend_from_slice(&o.quote_filled.to_le_bytes());
            put64(out, o.budget.unwrap_or(u64::MAX));
            out.push(o.status.code());
            put64(out, o.time_ms);
            put64(out, o.update_ms);
        }
        let mut accounts: Vec<&AccountId> = self.accounts.keys().collect();
        accounts.sort_unstable();
        put64(out, accounts.len() as u64);
        for account in accounts {
            let data = &self.accounts[account];
            put64(out, *account);
            put64(out, data.update_ms);
            // Open orders are the kept orders whose status is open; the
            // ended ones in the order they ended.
            put64(out, data.closed.len() as u64);
            for id in &data.closed {
                put64(out, *id);
            }
            put64(out, data.trades.len() as u64);
            for t in &data.trades {
                put64(out, t.id);
                put32(out, instrument_ids[t.instrument as usize]);
                put64(out, t.order);
                put64(out, t.price as u64);
                put64(out, t.qty);
                put64(out, t.fee as u64);
                out.push(u8::from(t.is_buyer) | (u8::from(t.is_maker) << 1));
                put64(out, t.time_ms);
                put64(out, t.seq);
            }
        }
    }

    pub(crate) fn restore(&mut self, r: &mut crate::codec::Reader<'_>, index_of: &dyn Fn(u32) -> Option<u32>) -> Result<(), crate::codec::CodecError> {
        use crate::codec::CodecError;
        let instrument = |id: u32| index_of(id).ok_or_else(|| CodecError(format!("instrument {id} is not in the configuration")));
        self.largest_gateway_cid = r.u64()?;
        let count = r.count(true, 100)?;
        self.orders.clear();
        self.open_client_ids = ClientIds::default();
        self.accounts.clear();
        for _ in 0..count {
            let id = r.u64()?;
            let account = r.u64()?;
            let index = instrument(r.u32()?)?;
            let cid = r.u64()?;
            let len = usize::from(r.u8()?);
            let client_id = CompactString::from_utf8(r.take(len)?).map_err(|_| CodecError(format!("order {id}: client id is not UTF-8")))?;
            let side = side_of(r.u8()?).ok_or_else(|| CodecError(format!("order {id}: bad side")))?;
            let order_type = if r.u8()? == 1 { OrderType::Market } else { OrderType::Limit };
            let tif = tif_of(r.u8()?).ok_or_else(|| CodecError(format!("order {id}: bad time in force")))?;
            let post_only = r.u8()? == 1;
            let stp = stp_of(r.u8()?).ok_or_else(|| CodecError(format!("order {id}: bad self-trade prevention")))?;
            let price = r.i64()?;
            let (qty, filled) = (r.u64()?, r.u64()?);
            let quote_filled = r.u128()?;
            let budget = Some(r.u64()?).filter(|b| *b != u64::MAX);
            let status = OrderStatus::from_code(r.u8()?).ok_or_else(|| CodecError(format!("order {id}: bad status")))?;
            let (time_ms, update_ms) = (r.u64()?, r.u64()?);
            let client_hash = client_hash(account, &client_id);
            let record = OrderRecord { id, account, instrument: index, client_id, client_hash, cid, side, order_type, tif, post_only, stp, price, qty, filled, quote_filled, budget, status, time_ms, update_ms };
            if status.is_open() {
                self.accounts.entry(account).or_default().open.insert(id);
                // The first of an account's open orders with a client id
                // keeps it, as when they were placed (in id order).
                self.open_client_ids.insert_if_absent(&self.orders, &record);
            }
            self.orders.insert(id, record);
        }
        let count = r.count(true, 32)?;
        for _ in 0..count {
            let account = r.u64()?;
            let data = self.accounts.entry(account).or_default();
            data.update_ms = r.u64()?;
            let closed = r.count(true, 8)?;
            for _ in 0..closed {
                data.closed.push_back(r.u64()?);
            }
            let trades = r.count(true, 61)?;
            for _ in 0..trades {
                let id = r.u64()?;
                let index = instrument(r.u32()?)?;
                let (order, price, qty, fee) = (r.u64()?, r.i64()?, r.u64()?, r.i64()?);
                let flags = r.u8()?;
                let (time_ms, seq) = (r.u64()?, r.u64()?);
                data.trades.push_back(AccountTrade { id, instrument: index, order, price, qty, fee, is_buyer: flags & 1 == 1, is_maker: flags & 2 == 2, time_ms, seq });
            }
        }
        // A checkpoint taken right after a command that filled a window
        // past its size: trimmed before the next command, as it would
        // have been without the restart.
        self.mark_over_full();
        Ok(())
    }
}

/// Ends an open order's `record` with `status`: out of its account's
/// open orders (`data`) and the open client ids, into its ended ones.
fn end_record(record: &mut OrderRecord, status: OrderStatus, time_ms: u64, data: &mut AccountData, open_client_ids: &mut ClientIds) {
    if !record.status.is_open() {
        return;
    }
    record.status = status;
    record.update_ms = time_ms;
    open_client_ids.remove(record.client_hash, record.id);
    data.open.remove(&record.id);
    data.update_ms = time_ms;
    data.closed.push_back(record.id);
}

/// The hash under which the open client ids file (`account`,
/// `client_id`): SipHash (std's) under a key drawn once per process, not
/// foldhash, since a client chooses the text (and could otherwise aim at
/// collisions); one key for the process, so that two states of the same
/// orders are equal, hashes included.
pub(crate) fn client_hash(account: AccountId, client_id: &str) -> u64 {
    static KEYS: std::sync::OnceLock<std::hash::RandomState> = std::sync::OnceLock::new();
    std::hash::BuildHasher::hash_one(KEYS.get_or_init(std::hash::RandomState::new), (account, client_id))
}

/// Every account's open orders by client id: order ids filed by
/// [`client_hash`], each order's hash kept in its record. An order placed
/// is hashed once; one that ends is found by its kept hash and its id,
/// hashing and copying nothing (a map keyed by (account, client id)
/// hashed the text again and cloned it to take it out: a third of market
/// data's instructions a command, `docs/benchmarks.md`).
#[derive(Clone, Debug, Default)]
struct ClientIds(hashbrown::HashTable<OrderId>);

impl ClientIds {
    /// The open order of `account` with `client_id` (whose hash is `hash`).
    fn find(&self, orders: &crate::ByOrderId<OrderRecord>, hash: u64, account: AccountId, client_id: &str) -> Option<OrderId> {
        self.0.find(hash, |id| orders.get(id).is_some_and(|o| o.account == account && o.client_id == client_id)).copied()
    }

    /// Files `record` (not in `orders` yet, or there but not filed)
    /// unless an open order of its account has its client id already: client ids of
    /// open orders are unique per account within one gateway; one of
    /// another gateway's with the same text keeps the first (the later is
    /// still found by its id).
    fn insert_if_absent(&mut self, orders: &crate::ByOrderId<OrderRecord>, record: &OrderRecord) {
        if self.find(orders, record.client_hash, record.account, &record.client_id).is_none() {
            // Every id filed is an open order's, in `orders` with its hash.
            self.0.insert_unique(record.client_hash, record.id, |id| orders.get(id).map_or(0, |o| o.client_hash));
        }
    }

    /// Takes `order` out, if it is the one filed under `hash`.
    fn remove(&mut self, hash: u64, order: OrderId) {
        if let Ok(entry) = self.0.find_entry(hash, |&id| id == order) {
            entry.remove();
        }
    }
}

impl PartialEq for ClientIds {
    fn eq(&self, other: &ClientIds) -> bool {
        let ids = |table: &hashbrown::HashTable<OrderId>| {
            let mut ids: Vec<OrderId> = table.iter().copied().collect();
            ids.sort_unstable();
            ids
        };
        ids(&self.0) == ids(&other.0)
    }
}

impl Eq for ClientIds {}

fn put32(out: &mut Vec<u8>, value: u32) {
    out.extend_from_slice(&value.to_le_bytes());
}

fn put64(out: &mut Vec<u8>, value: u64) {
    out.extend_from_slice(&value.to_le_bytes());
}

fn side_of(code: u8) -> Option<Side> {
    [Side::Buy, Side::Sell].into_iter().find(|s| side_code(*s) == code)
}

fn tif_of(code: u8) -> Option<TimeInForce> {
    [TimeInForce::Gtc, TimeInForce::Ioc, TimeInForce::Fok].into_iter().find(|t| tif_code(*t) == code)
}

fn stp_of(code: u8) -> Option<SelfTradePrevention> {
    use SelfTradePrevention::*;
    [None, CancelNewest, CancelOldest, CancelBoth].into_iter().find(|s| stp_code(*s) == code)
}
