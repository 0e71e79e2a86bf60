//! `mixed`: everything the engine does, for the differential tests.
//!
//! Three assets, three instruments with different tick and lot sizes and fee
//! schedules (one with a maker rebate, one fee-free), 128 accounts of which
//! a quarter are poor (so funds run out), and a hot set of 16 accounts that
//! place most orders (so self-trade prevention fires). Prices walk around a
//! drifting mid, so about a third of the limit orders cross. Every order
//! type, time in force, STP mode, replace, amend, cancel, cancel-all, deposit and
//! withdrawal occurs, and a steady trickle of malformed commands covers
//! every reject reason.

use crate::{Generator, Rng, symbol};
use crossbook_engine::*;
use std::collections::VecDeque;

pub const ACCOUNTS: u64 = 128;
const HOT_ACCOUNTS: u64 = 16;

struct Market {
    id: InstrumentId,
    base: AssetId,
    quote: AssetId,
    tick_size: u64,
    lot_size: u64,
    min_qty: u64,
    max_qty: u64,
    min_price: i64,
    max_price: i64,
    mid: i64,
    /// Half-width of the price spread around the mid, in ticks.
    spread: i64,
}

pub struct Mixed {
    rng: Rng,
    setup: VecDeque<Command>,
    markets: Vec<Market>,
    accounts: Vec<AccountId>,
    next_account: AccountId,
    /// Client order ids used so far, per account index.
    cids: Vec<u64>,
    /// GTC orders placed (some since filled or cancelled).
    placed: Vec<OrderId>,
    emitted: u64,
}

const ASSETS: [(AssetId, &str); 3] = [(1, "BTC"), (2, "ETH"), (3, "USD")];

impl Mixed {
    pub fn new(seed: u64) -> Mixed {
        let mut rng = Rng::new(seed);
        let markets = vec![
            Market {
                id: 1,
                base: 1,
                quote: 3,
                tick_size: 1,
                lot_size: 1_000,
                min_qty: 1,
                max_qty: 500,
                min_price: 9_000,
                max_price: 11_000,
                mid: 10_000,
                spread: 8,
            },
            Market {
                id: 2,
                base: 2,
                quote: 3,
                tick_size: 5,
                lot_size: 100,
                min_qty: 2,
                max_qty: 800,
                min_price: 400,
                max_price: 600,
                mid: 500,
                spread: 5,
            },
            Market {
                id: 3,
                base: 2,
                quote: 1,
                tick_size: 3,
                lot_size: 10,
                min_qty: 1,
                max_qty: 300,
                min_price: 50,
                max_price: 80,
                mid: 65,
                spread: 3,
            },
        ];
        let fees = [(-2, 7), (3, 10), (0, 0)];
        let mut setup = VecDeque::new();
        for (id, name) in ASSETS {
            setup.push_back(Command::AddAsset { id, name: symbol(name) });
        }
        for (market, (maker_bps, taker_bps)) in markets.iter().zip(fees) {
            let name = match market.id {
                1 => "BTC-USD",
                2 => "ETH-USD",
                _ => "ETH-BTC",
            };
            setup.push_back(Command::AddInstrument(InstrumentSpec {
                id: market.id,
                symbol: symbol(name),
                base: market.base,
                quote: market.quote,
                tick_size: market.tick_size,
                lot_size: market.lot_size,
                min_qty: market.min_qty,
                max_qty: market.max_qty,
                min_price: market.min_price,
                max_price: market.max_price,
                maker_bps,
                taker_bps,
            }));
        }
        let accounts: Vec<AccountId> = (1..=ACCOUNTS).collect();
        for &account in &accounts {
            setup.push_back(Command::OpenAccount { account });
        }
        for &account in &accounts {
            let poor = account % 4 == 0;
            for (asset, _) in ASSETS {
                let amount = if poor { 1 + rng.below(200_000) } else { 50_000_000 + rng.below(500_000_000) };
                setup.push_back(Command::Deposit { account, asset, amount });
            }
        }
        Mixed {
            rng,
            setup,
            markets,
            cids: vec![0; accounts.len()],
            next_account: ACCOUNTS + 1,
            accounts,
            placed: Vec::new(),
            emitted: 0,
        }
    }

    fn pick_account(&mut self) -> (usize, AccountId) {
        let index = if self.rng.percent(70) {
            self.rng.below(HOT_ACCOUNTS) as usize
        } else {
            self.rng.below(self.accounts.len() as u64) as usize
        };
        (index, self.accounts[index])
    }

    fn pick_market(&mut self) -> usize {
        self.rng.weighted(&[5, 3, 2])
    }

    fn new_cid(&mut self, account_index: usize) -> u64 {
        self.cids[account_index] += 1;
        self.cids[account_index]
    }

    fn side(&mut self) -> Side {
        if self.rng.below(2) == 0 { Side::Buy } else { Side::Sell }
    }

    fn stp(&mut self) -> SelfTradePrevention {
        match self.rng.weighted(&[55, 15, 15, 15]) {
            0 => SelfTradePrevention::None,
            1 => SelfTradePrevention::CancelNewest,
            2 => SelfTradePrevention::CancelOldest,
            _ => SelfTradePrevention::CancelBoth,
        }
    }

    fn qty(&mut self, market: usize) -> u64 {
        let (min, max) = (self.markets[market].min_qty, self.markets[market].max_qty);
        let qty = if self.rng.percent(90) { 1 + self.rng.below(20) } else { 1 + self.rng.below(max) };
        qty.clamp(min, max)
    }

    fn price(&mut self, market: usize) -> i64 {
        let m = &mut self.markets[market];
        // The mid drifts by a tick now and then, kept well inside the band.
        let step = self.rng.range(-1, 1);
        if self.rng.percent(10) {
            m.mid = (m.mid + step).clamp(m.min_price + 2 * m.spread, m.max_price - 2 * m.spread);
        }
        m.mid + self.rng.range(-m.spread, m.spread)
    }

    /// An order id that is probably open; sometimes a dead one.
    fn pick_order(&mut self, engine: &Engine) -> Option<OrderView> {
        for _ in 0..4 {
            if self.placed.is_empty() {
                return None;
            }
            let index = self.rng.below(self.placed.len() as u64) as usize;
            match engine.order(self.placed[index]) {
                Some(view) => return Some(view),
                None => {
                    self.placed.swap_remove(index);
                }
            }
        }
        None
    }

    fn limit(&mut self, engine: &Engine) -> Command {
        let market = self.pick_market();
        let (account_index, account) = self.pick_account();
        let tif = match self.rng.weighted(&[75, 15, 10]) {
            0 => TimeInForce::Gtc,
            1 => TimeInForce::Ioc,
            _ => TimeInForce::Fok,
        };
        let post_only = tif == TimeInForce::Gtc && self.rng.percent(10);
        let cid = if self.rng.percent(3) { self.open_cid(engine, account).unwrap_or(0) } else { self.new_cid(account_index) };
        let cid = if cid == 0 { self.new_cid(account_index) } else { cid };
        if tif == TimeInForce::Gtc {
            self.placed.push(self.emitted + 1);
        }
        Command::Place(PlaceOrder {
            account,
            instrument: self.markets[market].id,
            cid,
            side: self.side(),
            order_type: OrderType::Limit,
            tif,
            price: self.price(market),
            qty: self.qty(market),
            post_only,
            stp: self.stp(),
            budget: None,
        })
    }

    /// The cid of one of `account`'s open orders, to provoke a duplicate.
    fn open_cid(&mut self, engine: &Engine, account: AccountId) -> Option<u64> {
        let view = self.pick_order(engine)?;
        (view.account == account).then_some(view.cid)
    }

    fn market(&mut self) -> Command {
        let market = self.pick_market();
        let (account_index, account) = self.pick_account();
        let side = self.side();
        let qty = self.qty(market);
        let tif = if self.rng.percent(80) { TimeInForce::Ioc } else { TimeInForce::Fok };
        // A buy's budget caps its spending; a FOK sell's is the least it
        // must receive (on an IOC sell it is refused).
        let with_budget = match (side, tif) {
            (Side::Buy, _) => self.rng.percent(50),
            (Side::Sell, TimeInForce::Fok) => self.rng.percent(60),
            (Side::Sell, _) => self.rng.percent(3),
        };
        let budget = if with_budget {
            let m = &self.markets[market];
            let full = qty * m.mid as u64 * m.tick_size;
            Some(1 + self.rng.below(full + full / 2))
        } else {
            None
        };
        Command::Place(PlaceOrder {
            account,
            instrument: self.markets[market].id,
            cid: self.new_cid(account_index),
            side,
            order_type: OrderType::Market,
            tif,
            price: 0,
            qty,
            post_only: false,
            stp: self.stp(),
            budget,
        })
    }

    fn cancel(&mut self, engine: &Engine) -> Command {
        let roll = self.rng.below(100);
        match self.pick_order(engine) {
            Some(view) if roll < 90 => Command::Cancel { account: view.account, order: view.id },
            Some(view) if roll < 95 => {
                let (_, other) = self.pick_account();
                Command::Cancel { account: other, order: view.id }
            }
            _ => {
                let (_, account) = self.pick_account();
                Command::Cancel { account, order: 1 + self.rng.below(self.emitted + 10) }
            }
        }
    }

    fn replace(&mut self, engine: &Engine) -> Command {
        let Some(view) = self.pick_order(engine) else {
            return self.cancel(engine);
        };
        let market = self.markets.iter().position(|m| m.id == view.instrument).unwrap_or(0);
        if self.rng.percent(30) {
            return self.amend(&view, market);
        }
        let price = match self.rng.below(10) {
            0..=3 => view.price,
            4..=8 => self.price(market),
            _ => self.markets[market].max_price + 1,
        };
        let remaining = view.qty - view.filled;
        let qty = match self.rng.below(10) {
            0..=3 => view.filled + 1 + self.rng.below(remaining),
            4..=7 => view.qty + 1 + self.rng.below(10),
            8 => self.rng.below(view.filled + 1),
            _ => self.markets[market].max_qty + 1,
        };
        let account = if self.rng.percent(3) { self.pick_account().1 } else { view.account };
        Command::Replace { account, order: view.id, price, qty }
    }

    /// Mostly a valid reduction; sometimes no change, an increase (refused),
    /// at most what is filled (a cancel) or under the minimum.
    fn amend(&mut self, view: &OrderView, market: usize) -> Command {
        let remaining = view.qty - view.filled;
        let qty = match self.rng.below(10) {
            0..=5 => view.filled + 1 + self.rng.below(remaining),
            6 => view.qty,
            7 => view.qty + 1 + self.rng.below(10),
            8 => self.rng.below(view.filled + 1),
            _ => self.rng.below(self.markets[market].min_qty.max(1)),
        };
        let account = if self.rng.percent(3) { self.pick_account().1 } else { view.account };
        Command::Amend { account, order: view.id, qty }
    }

    fn deposit(&mut self) -> Command {
        let (_, account) = self.pick_account();
        let asset = ASSETS[self.rng.below(3) as usize].0;
        Command::Deposit { account, asset, amount: 1 + self.rng.below(5_000_000) }
    }

    fn withdraw(&mut self, engine: &Engine) -> Command {
        let (_, account) = self.pick_account();
        let asset = ASSETS[self.rng.below(3) as usize].0;
        let available = engine.balance(account, asset).map_or(0, |(available, _)| available);
        // Up to twice what is there: about half are refused.
        Command::Withdraw { account, asset, amount: 1 + self.rng.below(available / 10 * 2 + 1) }
    }

    fn cancel_all(&mut self) -> Command {
        let (_, account) = self.pick_account();
        let market = self.pick_market();
        let instrument = match self.rng.below(4) {
            0 | 1 => None,
            2 => Some(self.markets[market].id),
            _ => Some(if self.rng.percent(20) { 42 } else { self.markets[market].id }),
        };
        Command::CancelAll { account, instrument }
    }

    fn open(&mut self) -> Command {
        let account = self.next_account;
        self.next_account += 1;
        self.accounts.push(account);
        self.cids.push(0);
        Command::OpenAccount { account }
    }

    /// A command that breaks one rule, chosen so that every reject reason
    /// comes up.
    fn bad(&mut self, engine: &Engine) -> Command {
        let market = self.pick_market();
        let (account_index, account) = self.pick_account();
        let base = PlaceOrder {
            account,
            instrument: self.markets[market].id,
            cid: self.new_cid(account_index),
            side: self.side(),
            order_type: OrderType::Limit,
            tif: TimeInForce::Gtc,
            price: self.markets[market].mid,
            qty: self.markets[market].min_qty,
            post_only: false,
            stp: SelfTradePrevention::None,
            budget: None,
        };
        let m = &self.markets[market];
        let spec = InstrumentSpec {
            id: 100,
            symbol: symbol("BAD-ONE"),
            base: 1,
            quote: 3,
            tick_size: 1,
            lot_size: 1,
            min_qty: 1,
            max_qty: 10,
            min_price: 1,
            max_price: 10,
            maker_bps: 0,
            taker_bps: 0,
        };
        match self.rng.below(21) {
            0 => Command::Place(PlaceOrder { account: 9_999_999, ..base }),
            1 => Command::Place(PlaceOrder { account: FEE_ACCOUNT, ..base }),
            2 => Command::Place(PlaceOrder { instrument: 42, ..base }),
            3 => Command::Place(PlaceOrder { order_type: OrderType::Market, tif: TimeInForce::Gtc, price: 0, ..base }),
            4 => Command::Place(PlaceOrder { post_only: true, tif: TimeInForce::Ioc, ..base }),
            5 => Command::Place(PlaceOrder { budget: Some(1_000), ..base }),
            6 => Command::Place(PlaceOrder { qty: 0, ..base }),
            7 => Command::Place(PlaceOrder { qty: m.max_qty + 1, ..base }),
            8 => Command::Place(PlaceOrder { price: -self.rng.range(0, 5), ..base }),
            9 => Command::Place(PlaceOrder { price: m.min_price - 1, ..base }),
            10 => Command::Place(PlaceOrder { price: m.max_price + 1, post_only: true, ..base }),
            11 => Command::Deposit { account, asset: 77, amount: 5 },
            12 => Command::Deposit { account, asset: 1, amount: 0 },
            13 => Command::Deposit { account, asset: 3, amount: MAX_SUPPLY },
            14 => Command::Withdraw { account: 9_999_999, asset: 1, amount: 5 },
            15 => Command::AddAsset { id: 1 + self.rng.below(5) as u32, name: symbol("USD") },
            16 => Command::AddInstrument(InstrumentSpec { id: 1, ..spec }),
            17 => Command::AddInstrument(InstrumentSpec { tick_size: 0, ..spec }),
            18 => Command::AddInstrument(InstrumentSpec { base: 9, ..spec }),
            19 => Command::OpenAccount { account: self.pick_account().1 },
            _ => match self.pick_order(engine) {
                // A market sell or budgeted buy that cannot be afforded,
                // from one of the poor accounts.
                Some(view) => Command::Place(PlaceOrder {
                    account: 4 * (1 + self.rng.below(ACCOUNTS / 4)),
                    order_type: OrderType::Market,
                    price: 0,
                    tif: TimeInForce::Fok,
                    side: Side::Buy,
                    budget: Some(1 << 40),
                    cid: view.cid,
                    ..base
                }),
                None => Command::Withdraw { account, asset: 2, amount: 1 << 50 },
            },
        }
    }

    fn make(&mut self, engine: &Engine) -> Command {
        if let Some(command) = self.setup.pop_front() {
            return command;
        }
        match self.rng.weighted(&[500, 60, 140, 120, 8, 30, 30, 40, 2]) {
            0 => self.limit(engine),
            1 => self.market(),
            2 => self.cancel(engine),
            3 => self.replace(engine),
            4 => self.cancel_all(),
            5 => self.deposit(),
            6 => self.withdraw(engine),
            7 => self.bad(engine),
            _ => self.open(),
        }
    }
}

impl Generator for Mixed {
    fn next(&mut self, engine: &Engine) -> Command {
        let command = self.make(engine);
        self.emitted += 1;
        command
    }
}
