//! `steady-deep`: the shape of qsl's published order-book benchmark, with
//! accounts and settlement on.
//!
//! One instrument. Limit GTC orders of a random side at a price drawn
//! uniformly from a 64-tick band around a fixed mid, for 1 to 8 lots, from
//! 100 funded accounts (self-trades allowed). Once 512 orders rest, each
//! new order is preceded by a cancel of the oldest resting one, so the book
//! stays about 512 deep while roughly half of the orders trade on arrival.

use crate::{Generator, Rng, symbol};
use crossbook_engine::*;
use std::collections::VecDeque;

pub const DEPTH: usize = 512;
pub const ACCOUNTS: u64 = 100;
pub const MID: i64 = 100_000;
pub const BAND: i64 = 64;

pub struct SteadyDeep {
    rng: Rng,
    setup: VecDeque<Command>,
    /// Orders placed, oldest first (some since filled).
    placed: VecDeque<(OrderId, AccountId)>,
    /// Commands emitted so far: the next one's sequence number less one.
    emitted: u64,
    next_cid: u64,
}

impl SteadyDeep {
    pub fn new(seed: u64) -> SteadyDeep {
        let mut setup = VecDeque::new();
        setup.push_back(Command::AddAsset { id: 1, name: symbol("BTC") });
        setup.push_back(Command::AddAsset { id: 2, name: symbol("USD") });
        setup.push_back(Command::AddInstrument(InstrumentSpec {
            id: 1,
            symbol: symbol("BTC-USD"),
            base: 1,
            quote: 2,
            tick_size: 1,
            lot_size: 1,
            min_qty: 1,
            max_qty: 1_000,
            min_price: 1,
            max_price: 1_000_000,
            maker_bps: -1,
            taker_bps: 2,
        }));
        for account in 1..=ACCOUNTS {
            setup.push_back(Command::OpenAccount { account });
            setup.push_back(Command::Deposit { account, asset: 1, amount: 1 << 40 });
            setup.push_back(Command::Deposit { account, asset: 2, amount: 1 << 52 });
        }
        SteadyDeep { rng: Rng::new(seed), setup, placed: VecDeque::new(), emitted: 0, next_cid: 1 }
    }

    fn make(&mut self, engine: &Engine) -> Command {
        if let Some(command) = self.setup.pop_front() {
            return command;
        }
        if engine.open_orders() >= DEPTH {
            while let Some((order, account)) = self.placed.pop_front() {
                if engine.order(order).is_some() {
                    return Command::Cancel { account, order };
                }
            }
        }
        let account = 1 + self.rng.below(ACCOUNTS);
        let side = if self.rng.below(2) == 0 { Side::Buy } else { Side::Sell };
        let price = MID - BAND / 2 + self.rng.below(BAND as u64) as i64;
        let qty = 1 + self.rng.below(8);
        let cid = self.next_cid;
        self.next_cid += 1;
        self.placed.push_back((self.emitted + 1, account));
        Command::Place(PlaceOrder {
            account,
            instrument: 1,
            cid,
            side,
            order_type: OrderType::Limit,
            tif: TimeInForce::Gtc,
            price,
            qty,
            post_only: false,
            stp: SelfTradePrevention::None,
            budget: None,
        })
    }
}

impl Generator for SteadyDeep {
    fn next(&mut self, engine: &Engine) -> Command {
        let command = self.make(engine);
        self.emitted += 1;
        command
    }
}
