//! `place-cancel`: the shape of the 0xInfinity dataset (1.3M orders):
//! 1,000,000 limit orders and 300,000 cancels from 1,000 accounts on one
//! instrument, prices around a drifting mid, about 30% of orders crossing
//! the spread, quantities log-normal.

use crate::{Generator, Rng, symbol};
use crossbook_engine::*;
use std::collections::VecDeque;

pub const ACCOUNTS: u64 = 1_000;
/// Cancels per 13 trading commands (300,000 of 1,300,000).
pub const CANCEL_IN_13: u64 = 3;
pub const CROSSING_PERCENT: u64 = 30;
const START_MID: i64 = 50_000;

pub struct PlaceCancel {
    rng: Rng,
    setup: VecDeque<Command>,
    placed: Vec<(OrderId, AccountId)>,
    emitted: u64,
    next_cid: u64,
    mid: i64,
}

impl PlaceCancel {
    pub fn new(seed: u64) -> PlaceCancel {
        let mut setup = VecDeque::new();
        setup.push_back(Command::AddAsset { id: 1, name: symbol("BTC") });
        setup.push_back(Command::AddAsset { id: 2, name: symbol("USDT") });
        setup.push_back(Command::AddInstrument(InstrumentSpec {
            id: 1,
            symbol: symbol("BTC-USDT"),
            base: 1,
            quote: 2,
            tick_size: 1,
            lot_size: 1,
            min_qty: 1,
            max_qty: 100_000,
            min_price: 1,
            max_price: 10_000_000,
            maker_bps: 1,
            taker_bps: 5,
        }));
        for account in 1..=ACCOUNTS {
            setup.push_back(Command::OpenAccount { account });
            setup.push_back(Command::Deposit { account, asset: 1, amount: 1 << 44 });
            setup.push_back(Command::Deposit { account, asset: 2, amount: 1 << 50 });
        }
        PlaceCancel { rng: Rng::new(seed), setup, placed: Vec::new(), emitted: 0, next_cid: 1, mid: START_MID }
    }

    /// A log-normal quantity: median 5 lots, sigma 1 (Box-Muller over the
    /// generator's own uniform draws), clamped to 1..=10,000.
    fn quantity(&mut self) -> u64 {
        let u1 = (self.rng.below(1 << 53) as f64 + 1.0) / (1u64 << 53) as f64;
        let u2 = self.rng.below(1 << 53) as f64 / (1u64 << 53) as f64;
        let normal = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        let qty = (5.0f64.ln() + normal).exp().round();
        (qty as u64).clamp(1, 10_000)
    }

    fn cancel(&mut self, engine: &Engine) -> Option<Command> {
        while !self.placed.is_empty() {
            let index = self.rng.below(self.placed.len() as u64) as usize;
            let (order, account) = self.placed.swap_remove(index);
            if engine.order(order).is_some() {
                return Some(Command::Cancel { account, order });
            }
        }
        None
    }

    fn make(&mut self, engine: &Engine) -> Command {
        if let Some(command) = self.setup.pop_front() {
            return command;
        }
        if self.rng.below(13) < CANCEL_IN_13
            && let Some(cancel) = self.cancel(engine) {
                return cancel;
            }
        if self.rng.percent(10) {
            self.mid += if self.rng.below(2) == 0 { 1 } else { -1 };
            self.mid = self.mid.clamp(1_000, 9_000_000);
        }
        let (bid, ask) = engine.top_of_book(1).unwrap_or((None, None));
        let side = if self.rng.below(2) == 0 { Side::Buy } else { Side::Sell };
        let crossing = self.rng.percent(CROSSING_PERCENT);
        let price = match (side, crossing) {
            (Side::Buy, true) => ask.unwrap_or(self.mid + 1) + self.rng.below(3) as i64,
            (Side::Sell, true) => bid.unwrap_or(self.mid - 1) - self.rng.below(3) as i64,
            (Side::Buy, false) => ask.unwrap_or(self.mid + 1).min(self.mid + 1) - 1 - self.rng.below(30) as i64,
            (Side::Sell, false) => bid.unwrap_or(self.mid - 1).max(self.mid - 1) + 1 + self.rng.below(30) as i64,
        };
        let account = 1 + self.rng.below(ACCOUNTS);
        let cid = self.next_cid;
        self.next_cid += 1;
        self.placed.push((self.emitted + 1, account));
        Command::Place(PlaceOrder {
            account,
            instrument: 1,
            cid,
            side,
            order_type: OrderType::Limit,
            tif: TimeInForce::Gtc,
            price: price.max(1),
            qty: self.quantity(),
            post_only: false,
            stp: SelfTradePrevention::None,
            budget: None,
        })
    }
}

impl Generator for PlaceCancel {
    fn next(&mut self, engine: &Engine) -> Command {
        let command = self.make(engine);
        self.emitted += 1;
        command
    }
}
