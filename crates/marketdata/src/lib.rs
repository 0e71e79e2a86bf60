//! crossbook's market data, derived from the engine's events of durable
//! commands only: every instrument's order book by price level, its
//! trades, candles of every interval from a minute to a day, its 24-hour
//! ticker and best bid and offer; rendered in Binance's spot shapes
//! (`render`), kept across restarts as a checkpoint (`codec`).
//!
//! Pure: no I/O and no clock. Time is the journal's: each command comes
//! with the time the sequencer stamped on it, so what this crate derives
//! is a function of the journal, the same live and after a restart.
//!
//! **Update ids.** Binance's `lastUpdateId`, `U` and `u` are journal
//! sequence numbers here. A depth snapshot is the book after command
//! `lastUpdateId`; a diff covers the commands `U..=u`, and an instrument's
//! diffs cover its commands without gaps (`U` is the previous diff's `u`
//! plus one, whether or not the commands in between touched its book), so
//! Binance's procedure for a local book works exactly and a gap is seen.

pub mod accounts;
pub mod candles;
pub mod codec;
pub mod render;
pub mod transfers;

use accounts::{Accounts, PlaceDetails};
use candles::Candles;
use crossbook_engine::{CancelReason, Command, Event, EventKind, InstrumentId, OrderId, OrderType, RejectReason, Side, TimeInForce};
use foldhash::HashMap;
use std::collections::{BTreeMap, VecDeque};

/// Trades kept per instrument for `GET /api/v3/trades` (Binance's largest
/// `limit`).
pub const TRADES_KEPT: usize = 1_000;

/// A decimal unit: `mantissa * 10^-scale` (the price of one tick, or the
/// quantity of one lot).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unit {
    pub mantissa: u64,
    pub scale: u32,
}

impl Unit {
    pub const ONE: Unit = Unit { mantissa: 1, scale: 0 };
}

/// What market data knows of an instrument besides its events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstrumentInfo {
    pub id: InstrumentId,
    /// crossbook's symbol (`BTC-USD`).
    pub symbol: String,
    /// Binance's way of writing it (`BTCUSD`): [`binance_symbol`].
    pub binance: String,
    /// The engine's ids of the base and quote assets.
    pub base: crossbook_engine::AssetId,
    pub quote: crossbook_engine::AssetId,
    pub base_asset: String,
    pub quote_asset: String,
    pub price_unit: Unit,
    pub qty_unit: Unit,
    pub min_price: i64,
    pub max_price: i64,
    pub min_qty: u64,
    pub max_qty: u64,
    /// Quote-asset units one lot costs per tick, and base-asset units in
    /// a lot: the engine's own definition, which a binary-protocol client
    /// needs to work out what an order locks (`exchangeInfo`'s
    /// `crossbook` object carries them).
    pub tick_size: u64,
    pub lot_size: u64,
    /// The decimal value of one unit of the base asset.
    pub base_asset_unit: Unit,
    /// The decimal value of one unit of the quote asset (the REST API's
    /// fees are in it).
    pub quote_asset_unit: Unit,
    /// Fees in basis points (negative: a rebate).
    pub maker_bps: i64,
    pub taker_bps: i64,
}

impl InstrumentInfo {
    /// What market data knows of an instrument from its engine
    /// definition alone: units of one tick and one lot, assets named `B`
    /// and `Q` (the tests' and the bench's instruments).
    pub fn of_spec(spec: &crossbook_engine::InstrumentSpec) -> InstrumentInfo {
        InstrumentInfo {
            id: spec.id,
            symbol: spec.symbol.as_str().to_string(),
            binance: binance_symbol(spec.symbol.as_str()),
            base: spec.base,
            quote: spec.quote,
            base_asset: "B".into(),
            quote_asset: "Q".into(),
            price_unit: Unit::ONE,
            qty_unit: Unit::ONE,
            min_price: spec.min_price,
            max_price: spec.max_price,
            min_qty: spec.min_qty,
            max_qty: spec.max_qty,
            tick_size: spec.tick_size,
            lot_size: spec.lot_size,
            base_asset_unit: Unit::ONE,
            quote_asset_unit: Unit::ONE,
            maker_bps: spec.maker_bps,
            taker_bps: spec.taker_bps,
        }
    }

    /// The instruments a command stream adds (the first of each id: the
    /// mixed workload also tries duplicates, which the engine refuses).
    pub fn of_commands(commands: &[Command]) -> Vec<InstrumentInfo> {
        let mut seen = std::collections::BTreeSet::new();
        commands
            .iter()
            .filter_map(|c| match c {
                Command::AddInstrument(spec) if seen.insert(spec.id) => Some(InstrumentInfo::of_spec(spec)),
                _ => None,
            })
            .collect()
    }
}

/// Binance writes a symbol as its letters and digits, upper case:
/// `BTC-USD` and `btc_usd` are both `BTCUSD`.
pub fn binance_symbol(symbol: &str) -> String {
    symbol.chars().filter(char::is_ascii_alphanumeric).map(|c| c.to_ascii_uppercase()).collect()
}

/// One trade, as market data shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Trade {
    /// Per instrument, from 1, with no gaps.
    pub id: u64,
    pub price: i64,
    pub qty: u64,
    pub time_ms: u64,
    /// The buyer's order was resting (the taker sold).
    pub buyer_is_maker: bool,
    /// The command that made it.
    pub seq: u64,
}

/// A map keyed by order id (`std`'s, with [`OrderIdHash`]).
pub type ByOrderId<V> = std::collections::HashMap<OrderId, V, OrderIdHash>;

/// The hash of the maps keyed by order id. An order's id is the number of
/// the command that placed it, so ids only grow. This hash keeps blocks
/// of 16 consecutive ids together: an id's low four bits stay as they are
/// (where hashbrown puts an entry, within the block's group of 16
/// buckets), the rest of its position is a multiply of the block's number
/// (blocks scattered over the table as by any hash), and its top seven
/// bits (hashbrown's tag, compared before the keys) a multiply of the
/// whole id (different within a block). Orders placed one after another
/// share a group: placing one, and forgetting the oldest ended one, touch
/// memory touched a moment before, where foldhash scattered every order
/// over a table of tens of thousands, a cache miss each
/// (`docs/benchmarks.md`, "What market data costs a command"). Ids kept
/// in order over the whole table (the low bits all as they are) were
/// quicker still on `steady-deep`, but a window of ids wider than the
/// table and dense (most commands placing orders) folds onto itself:
/// twice the entries in part of the table, and probes of hundreds of
/// groups there. The engine gives the ids: no client chooses them.
#[derive(Clone, Copy, Debug, Default)]
pub struct OrderIdHash;

impl std::hash::BuildHasher for OrderIdHash {
    type Hasher = OrderIdHasher;

    fn build_hasher(&self) -> OrderIdHasher {
        OrderIdHasher(0)
    }
}

#[derive(Clone, Copy, Debug, Default)]
pub struct OrderIdHasher(u64);

/// The bits of a hash below hashbrown's tag (its top seven).
const BELOW_TAG: u64 = (1 << 57) - 1;
/// The bits of an id that place it within its block.
const IN_BLOCK: u64 = 15;

impl std::hash::Hasher for OrderIdHasher {
    fn finish(&self) -> u64 {
        let id = self.0;
        let block = (id >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let place = (block ^ (block >> 29)) & BELOW_TAG & !IN_BLOCK;
        let tag = id.wrapping_mul(0xD6E8_FEB8_6659_FD93) & !BELOW_TAG;
        tag | place | (id & IN_BLOCK)
    }

    fn write_u64(&mut self, id: u64) {
        self.0 = id;
    }

    /// Keys other than one `u64` (none here) still hash, each byte mixed in.
    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*byte);
        }
    }
}

/// One side's price levels: price (ticks) to lots.
pub type Levels = BTreeMap<i64, u64>;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Book {
    pub bids: Levels,
    pub asks: Levels,
}

/// One price level: (price in ticks, lots).
pub type Level = (i64, u64);

/// The best bid and the best ask, if any.
pub type Top = (Option<Level>, Option<Level>);

impl Book {
    fn side_mut(&mut self, side: Side) -> &mut Levels {
        match side {
            Side::Buy => &mut self.bids,
            Side::Sell => &mut self.asks,
        }
    }

    fn add(&mut self, side: Side, price: i64, qty: u64) {
        if qty > 0 {
            *self.side_mut(side).entry(price).or_insert(0) += qty;
        }
    }

    fn take(&mut self, side: Side, price: i64, qty: u64) {
        let levels = self.side_mut(side);
        if let Some(total) = levels.get_mut(&price) {
            *total = total.saturating_sub(qty);
            if *total == 0 {
                levels.remove(&price);
            }
        }
    }

    /// Best bid and best ask, each (price, lots).
    pub fn top(&self) -> Top {
        (self.bids.iter().next_back().map(|(p, q)| (*p, *q)), self.asks.iter().next().map(|(p, q)| (*p, *q)))
    }

    /// The best `limit` bids (best first) and asks (best first).
    pub fn depth(&self, limit: usize) -> (Vec<Level>, Vec<Level>) {
        (self.bids.iter().rev().take(limit).map(|(p, q)| (*p, *q)).collect(), self.asks.iter().take(limit).map(|(p, q)| (*p, *q)).collect())
    }
}

/// An order market data follows: resting, or the taker of the command
/// being applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Live {
    pub instrument: u32,
    pub side: Side,
    pub price: i64,
    pub remaining: u64,
    /// In its level's total (else the taker of the current command).
    pub resting: bool,
    /// A GTC limit order: what is left of it when its command ends rests.
    pub rests: bool,
}

/// One instrument's market data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstrumentData {
    pub info: InstrumentInfo,
    pub book: Book,
    /// Trading is halted (the engine's `halt`): `exchangeInfo` says `HALT`.
    pub halted: bool,
    /// The last `TRADES_KEPT` trades, oldest first.
    pub trades: VecDeque<Trade>,
    pub next_trade_id: u64,
    pub candles: Candles,
    /// The `u` of the last depth diff handed out (the next one's `U` is
    /// one more).
    pub diffs_through: u64,
    /// Changes since the last [`MarketData::take_updates`].
    /// Prices touched, in the order touched (sorted and deduplicated when
    /// the updates are taken; kept as vectors so that a batch allocates
    /// nothing for them).
    changed_bids: Vec<i64>,
    changed_asks: Vec<i64>,
    /// Its trades since then (all of them: a batch may trade more than
    /// `TRADES_KEPT`).
    new_trades: Vec<Trade>,
    top_before: Option<Top>,
    /// In [`MarketData::dirty`].
    dirty: bool,
}

impl InstrumentData {
    fn new(info: InstrumentInfo, start_seq: u64) -> InstrumentData {
        InstrumentData {
            info,
            book: Book::default(),
            halted: false,
            trades: VecDeque::new(),
            next_trade_id: 1,
            candles: Candles::default(),
            diffs_through: start_seq,
            changed_bids: Vec::new(),
            changed_asks: Vec::new(),
            new_trades: Vec::new(),
            top_before: None,
            dirty: false,
        }
    }

    fn touch(&mut self, side: Side, price: i64) {
        if self.top_before.is_none() {
            self.top_before = Some(self.book.top());
        }
        let changed = match side {
            Side::Buy => &mut self.changed_bids,
            Side::Sell => &mut self.changed_asks,
        };
        if changed.last() != Some(&price) {
            changed.push(price);
        }
    }
}

/// Counters for the dashboard: what the venue has done.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub orders: u64,
    pub trades: u64,
    pub cancels: u64,
}

/// A depth diff: the levels that changed over `first..=last`, each with
/// its new total (0: gone).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DepthDiff {
    pub first: u64,
    pub last: u64,
    pub bids: Vec<(i64, u64)>,
    pub asks: Vec<(i64, u64)>,
}

impl DepthDiff {
    /// Folds in `later`, the instrument's next diff (`later.first ==
    /// self.last + 1`): one diff over `self.first..=later.last` with each
    /// level at its latest total, best first on both sides. What Binance's
    /// `@depth@100ms` and `@depth@1000ms` streams send: the diffs of an
    /// interval as one.
    pub fn merge(&mut self, later: &DepthDiff) {
        debug_assert_eq!(later.first, self.last + 1, "diffs merge only in order, without gaps");
        self.last = later.last;
        self.bids = merge_levels(&self.bids, &later.bids, |a, b| b.cmp(&a));
        self.asks = merge_levels(&self.asks, &later.asks, |a, b| a.cmp(&b));
    }
}

/// Two lists of levels in `order` merged into one, `later`'s total where
/// both have a price.
fn merge_levels(earlier: &[(i64, u64)], later: &[(i64, u64)], order: impl Fn(i64, i64) -> std::cmp::Ordering) -> Vec<(i64, u64)> {
    let mut merged = Vec::with_capacity(earlier.len() + later.len());
    let (mut e, mut l) = (earlier.iter().peekable(), later.iter().peekable());
    loop {
        let next = match (e.peek(), l.peek()) {
            (Some(a), Some(b)) => match order(a.0, b.0) {
                std::cmp::Ordering::Less => e.next(),
                std::cmp::Ordering::Greater => l.next(),
                std::cmp::Ordering::Equal => {
                    e.next();
                    l.next()
                }
            },
            (Some(_), None) => e.next(),
            (None, Some(_)) => l.next(),
            (None, None) => break,
        };
        merged.extend(next.copied());
    }
    merged
}

/// What changed for one instrument over the commands applied since the
/// last [`MarketData::take_updates`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstrumentUpdate {
    pub index: usize,
    pub depth: Option<DepthDiff>,
    pub trades: Vec<Trade>,
    /// Best bid or offer changed (price or size).
    pub top_changed: bool,
}

/// Everything that changed, as of command `seq` at `time_ms`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Updates {
    pub seq: u64,
    pub time_ms: u64,
    pub instruments: Vec<InstrumentUpdate>,
}

/// What a gateway knows of a command besides its events: the command, and
/// the client id its gateway journaled with it (a FIX ClOrdID, a REST
/// `newClientOrderId`).
#[derive(Clone, Copy, Debug)]
pub struct CommandContext<'a> {
    pub command: &'a Command,
    pub client_id: Option<&'a str>,
    /// Sent by the gateway whose engine client ids are
    /// `accounts.gateway_cids` (the REST gateway).
    pub gateway: bool,
}

/// Every instrument's market data, and the orders it follows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MarketData {
    pub instruments: Vec<InstrumentData>,
    by_id: HashMap<InstrumentId, u32>,
    by_symbol: HashMap<String, u32>,
    pub orders: ByOrderId<Live>,
    /// Orders that took part in the command being applied as takers.
    takers: Vec<OrderId>,
    /// The last command applied, and its time.
    pub seq: u64,
    pub time_ms: u64,
    pub counters: Counters,
    /// Instruments with changes since the last `take_updates`.
    dirty: Vec<u32>,
    /// Each account's orders and trades.
    pub accounts: Accounts,
    /// Deposits and withdrawals made by the operator, by reference.
    pub transfers: transfers::Transfers,
}

impl MarketData {
    /// Market data for `instruments`, from command `start_seq` on (the
    /// books empty: for a venue recovered with open orders, restore a
    /// checkpoint or apply the journal from its start).
    pub fn new(instruments: Vec<InstrumentInfo>, start_seq: u64) -> MarketData {
        let by_id = instruments.iter().enumerate().map(|(i, info)| (info.id, i as u32)).collect();
        let by_symbol = instruments.iter().enumerate().map(|(i, info)| (info.binance.clone(), i as u32)).collect();
        MarketData {
            instruments: instruments.into_iter().map(|info| InstrumentData::new(info, start_seq)).collect(),
            by_id,
            by_symbol,
            orders: ByOrderId::default(),
            takers: Vec::new(),
            seq: start_seq,
            time_ms: 0,
            counters: Counters::default(),
            dirty: Vec::new(),
            accounts: Accounts::default(),
            transfers: transfers::Transfers::default(),
        }
    }

    /// Lists an instrument the venue added by the command applied last:
    /// its book empty and its diffs following on from that command.
    /// `false`: one with its id or its Binance symbol is listed already.
    pub fn add_instrument(&mut self, info: InstrumentInfo) -> bool {
        if self.by_id.contains_key(&info.id) || self.by_symbol.contains_key(&info.binance) {
            return false;
        }
        let index = self.instruments.len() as u32;
        self.by_id.insert(info.id, index);
        self.by_symbol.insert(info.binance.clone(), index);
        self.instruments.push(InstrumentData::new(info, self.seq));
        true
    }

    /// The instrument with Binance symbol `symbol` (upper case).
    pub fn by_symbol(&self, symbol: &str) -> Option<&InstrumentData> {
        self.by_symbol.get(symbol).map(|&i| &self.instruments[i as usize])
    }

    /// The index of the instrument with engine id `id`.
    pub fn index_of_id(&self, id: InstrumentId) -> Option<usize> {
        self.by_id.get(&id).map(|&i| i as usize)
    }

    pub fn index_of_symbol(&self, symbol: &str) -> Option<usize> {
        self.by_symbol.get(symbol).map(|&i| i as usize)
    }

    /// Applies the events of durable command `seq`, stamped `time_ms`.
    pub fn apply(&mut self, seq: u64, time_ms: u64, events: &[Event]) {
        self.apply_command(seq, time_ms, None, events);
    }

    /// [`MarketData::apply`], with what the command itself says (an
    /// order's client id, post-only and budget; a FOK order that could not
    /// fill).
    pub fn apply_command(&mut self, seq: u64, time_ms: u64, context: Option<CommandContext<'_>>, events: &[Event]) {
        self.accounts.trim();
        self.seq = seq;
        self.time_ms = self.time_ms.max(time_ms);
        // A deposit or withdrawal with its reference (the operator's
        // endpoints journal one with each).
        if let Some(CommandContext { command, client_id: Some(reference), gateway: true }) = context {
            let transfer = match *command {
                Command::Deposit { account, asset, amount } => Some((account, asset, amount, transfers::Direction::Deposit)),
                Command::Withdraw { account, asset, amount } => Some((account, asset, amount, transfers::Direction::Withdrawal)),
                _ => None,
            };
            if let Some((account, asset, amount, direction)) = transfer {
                let refused = events.iter().find_map(|e| match e.kind {
                    EventKind::Rejected { reason } => Some(reason),
                    _ => None,
                });
                if refused.is_none() {
                    self.accounts.balances_changed(account, time_ms);
                }
                self.transfers.record(reference, transfers::Transfer { seq, time_ms, account, asset, amount, direction, refused });
            }
        }
        for event in events {
            self.event(&event.kind, context);
        }
        // What is left of this command's takers rests, if it may.
        for index in 0..self.takers.len() {
            let order = self.takers[index];
            let Some(live) = self.orders.get_mut(&order) else { continue };
            if live.resting {
                continue;
            }
            if live.rests && live.remaining > 0 {
                live.resting = true;
                let live = *live;
                let data = &mut self.instruments[live.instrument as usize];
                data.touch(live.side, live.price);
                data.book.add(live.side, live.price, live.remaining);
                self.mark_dirty(live.instrument);
            } else {
                self.orders.remove(&order);
            }
        }
        self.takers.clear();
    }

    fn event(&mut self, kind: &EventKind, context: Option<CommandContext<'_>>) {
        let place = context.and_then(|c| match c.command {
            Command::Place(place) => Some((place, PlaceDetails { client_id: c.client_id, gateway: c.gateway, post_only: place.post_only, stp: place.stp, budget: place.budget })),
            _ => None,
        });
        match *kind {
            EventKind::Halted { instrument } | EventKind::Resumed { instrument } => {
                let Some(&index) = self.by_id.get(&instrument) else { return };
                self.instruments[index as usize].halted = matches!(kind, EventKind::Halted { .. });
            }
            EventKind::Rejected { reason: RejectReason::FokCannotFill } => {
                let Some((place, details)) = place else { return };
                let Some(&index) = self.by_id.get(&place.instrument) else { return };
                self.accounts.expired_unfilled(self.seq, place.account, index, place.cid, place.side, place.order_type, place.price, place.qty, self.time_ms, Some(details));
            }
            EventKind::Accepted { order, account, instrument, cid, side, order_type, tif, price, qty } => {
                self.counters.orders += 1;
                let Some(&index) = self.by_id.get(&instrument) else { return };
                let details = place.filter(|(p, _)| p.cid == cid && p.account == account).map(|(_, d)| d);
                self.accounts.accepted(order, account, index, cid, side, order_type, tif, price, qty, self.time_ms, details);
                let rests = order_type == OrderType::Limit && tif == TimeInForce::Gtc;
                self.orders.insert(order, Live { instrument: index, side, price, remaining: qty, resting: false, rests });
                self.takers.push(order);
            }
            EventKind::Trade { instrument, price, qty, maker, maker_account, maker_remaining, taker, taker_account, taker_remaining, taker_side, maker_fee, taker_fee } => {
                self.counters.trades += 1;
                let Some(&index) = self.by_id.get(&instrument) else { return };
                let time_ms = self.time_ms;
                let seq = self.seq;
                let data = &mut self.instruments[index as usize];
                let maker_side = match taker_side {
                    Side::Buy => Side::Sell,
                    Side::Sell => Side::Buy,
                };
                data.touch(maker_side, price);
                data.book.take(maker_side, price, qty);
                let trade = Trade { id: data.next_trade_id, price, qty, time_ms, buyer_is_maker: taker_side == Side::Sell, seq };
                data.next_trade_id += 1;
                data.candles.add(time_ms, price, qty, taker_side == Side::Buy, trade.id);
                data.trades.push_back(trade);
                if data.trades.len() > TRADES_KEPT {
                    data.trades.pop_front();
                }
                data.new_trades.push(trade);
                self.mark_dirty(index);
                let taker_buys = taker_side == Side::Buy;
                self.accounts.fill(trade.id, index, maker, maker_account, price, qty, maker_remaining, maker_fee, !taker_buys, true, time_ms, seq);
                self.accounts.fill(trade.id, index, taker, taker_account, price, qty, taker_remaining, taker_fee, taker_buys, false, time_ms, seq);
                if maker_remaining == 0 {
                    self.orders.remove(&maker);
                } else if let Some(live) = self.orders.get_mut(&maker) {
                    live.remaining = maker_remaining;
                }
                if let Some(live) = self.orders.get_mut(&taker) {
                    live.remaining = taker_remaining;
                }
            }
            EventKind::Cancelled { order, remaining, reason, .. } => {
                if reason != CancelReason::Ioc {
                    self.counters.cancels += 1;
                }
                let book_left = self.accounts.orders.get(&order).is_some_and(|o| {
                    let book = &self.instruments[o.instrument as usize].book;
                    match o.side {
                        Side::Buy => !book.asks.is_empty(),
                        Side::Sell => !book.bids.is_empty(),
                    }
                });
                self.accounts.cancelled(order, reason, self.time_ms, book_left);
                let Some(live) = self.orders.remove(&order) else { return };
                if live.resting {
                    let data = &mut self.instruments[live.instrument as usize];
                    data.touch(live.side, live.price);
                    debug_assert_eq!(remaining, live.remaining, "order {order} cancelled with what it had left");
                    data.book.take(live.side, live.price, live.remaining);
                    self.mark_dirty(live.instrument);
                }
            }
            EventKind::Replaced { order, price, qty, remaining, priority_kept } => {
                let renamed = context.filter(|c| matches!(c.command, Command::Replace { order: o, .. } | Command::Amend { order: o, .. } if *o == order)).and_then(|c| c.client_id);
                self.accounts.replaced(order, price, qty, renamed, self.time_ms);
                let Some(live) = self.orders.get_mut(&order) else { return };
                let before = *live;
                let data = &mut self.instruments[before.instrument as usize];
                if before.resting {
                    data.touch(before.side, before.price);
                    data.book.take(before.side, before.price, before.remaining);
                }
                live.price = price;
                live.remaining = remaining;
                if priority_kept && before.resting {
                    data.book.add(before.side, price, remaining);
                } else {
                    // It left its level and matches again as a taker; what
                    // is left of it rests when the command ends.
                    live.resting = false;
                    live.rests = true;
                    self.takers.push(order);
                }
                self.mark_dirty(before.instrument);
            }
            _ => {}
        }
    }

    /// Moves on to command `seq` at `time_ms` (the last of a batch, whose
    /// other commands had no market-data events), never back.
    pub fn advance(&mut self, seq: u64, time_ms: u64) {
        self.seq = self.seq.max(seq);
        self.time_ms = self.time_ms.max(time_ms);
    }

    fn mark_dirty(&mut self, index: u32) {
        let data = &mut self.instruments[index as usize];
        if !data.dirty {
            data.dirty = true;
            self.dirty.push(index);
        }
    }

    /// What changed since the last call, instrument by instrument; depth
    /// diffs cover the commands since the previous diff of their
    /// instrument.
    pub fn take_updates(&mut self) -> Updates {
        let mut instruments = Vec::new();
        // Instrument by instrument in index order, as a set would give them.
        self.dirty.sort_unstable();
        for index in self.dirty.drain(..) {
            let data = &mut self.instruments[index as usize];
            data.dirty = false;
            let depth = (!data.changed_bids.is_empty() || !data.changed_asks.is_empty()).then(|| {
                for changed in [&mut data.changed_bids, &mut data.changed_asks] {
                    changed.sort_unstable();
                    changed.dedup();
                }
                // Best first on both sides, as Binance lists them.
                let diff = DepthDiff {
                    first: data.diffs_through + 1,
                    last: self.seq,
                    bids: data.changed_bids.drain(..).rev().map(|p| (p, data.book.bids.get(&p).copied().unwrap_or(0))).collect(),
                    asks: data.changed_asks.drain(..).map(|p| (p, data.book.asks.get(&p).copied().unwrap_or(0))).collect(),
                };
                data.diffs_through = self.seq;
                diff
            });
            let trades = std::mem::take(&mut data.new_trades);
            let top_changed = data.top_before.take().is_some_and(|before| before != data.book.top());
            if depth.is_some() || !trades.is_empty() || top_changed {
                instruments.push(InstrumentUpdate { index: index as usize, depth, trades, top_changed });
            }
        }
        Updates { seq: self.seq, time_ms: self.time_ms, instruments }
    }

    /// Sets every instrument's diffs to go on from command `seq` (after a
    /// checkpoint is restored or a replay is done: no diff is owed for
    /// what came before).
    pub fn diffs_from(&mut self, seq: u64) {
        for data in &mut self.instruments {
            data.diffs_through = seq;
            data.changed_bids.clear();
            data.changed_asks.clear();
            data.new_trades.clear();
            data.top_before = None;
            data.dirty = false;
        }
        self.dirty.clear();
    }

    /// The 24-hour figures of an instrument, from its one-minute candles
    /// whose minute ends within a day before the last command's time.
    pub fn ticker(&self, index: usize) -> Ticker {
        self.rolling(index, 86_400_000)
    }

    /// An instrument's figures over the `span_ms` before the last
    /// command's time, from its one-minute candles whose minute ends in it.
    pub fn rolling(&self, index: usize, span_ms: u64) -> Ticker {
        let data = &self.instruments[index];
        let now = self.time_ms;
        let since = now.saturating_sub(span_ms);
        let minutes = &data.candles.series[0];
        let window: Vec<&candles::Candle> = minutes.iter().filter(|c| c.open_ms + 60_000 > since).collect();
        let before = minutes.iter().rev().find(|c| c.open_ms + 60_000 <= since);
        let last = data.trades.back().copied();
        let mut ticker = Ticker {
            open_ms: since,
            close_ms: now,
            last_price: last.map_or(0, |t| t.price),
            last_qty: last.map_or(0, |t| t.qty),
            prev_close: before.map_or(0, |c| c.close),
            ..Ticker::default()
        };
        if let (Some(first), Some(latest)) = (window.first(), window.last()) {
            ticker.open = first.open;
            ticker.high = window.iter().map(|c| c.high).max().unwrap_or(0);
            ticker.low = window.iter().map(|c| c.low).min().unwrap_or(0);
            ticker.close = latest.close;
            ticker.volume = window.iter().map(|c| c.volume).sum();
            ticker.quote_volume = window.iter().map(|c| c.quote_volume).sum();
            ticker.first_trade = Some(first.first_trade);
            ticker.last_trade = Some(latest.last_trade);
            ticker.trades = window.iter().map(|c| c.trades).sum();
        }
        ticker
    }
}

/// An instrument's figures over the last 24 hours.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ticker {
    pub open_ms: u64,
    pub close_ms: u64,
    pub open: i64,
    pub high: i64,
    pub low: i64,
    pub close: i64,
    pub prev_close: i64,
    pub last_price: i64,
    pub last_qty: u64,
    pub volume: u64,
    pub quote_volume: u128,
    pub first_trade: Option<u64>,
    pub last_trade: Option<u64>,
    pub trades: u64,
}

#[cfg(test)]
mod tests;
