//! `multi-symbol`: 1,000 instruments and 100,000 accounts, orders spread
//! over the instruments by a Zipf-like popularity (weight of the instrument
//! of rank r is proportional to 1/r), to show how the cost grows with the
//! number of books and accounts.

use crate::{Generator, Rng, symbol};
use crossbook_engine::*;
use std::collections::VecDeque;

pub const ASSETS: u32 = 40;
pub const INSTRUMENTS: u32 = 1_000;
pub const ACCOUNTS: u64 = 100_000;
pub const CANCEL_PERCENT: u64 = 20;
const MID: i64 = 1_000;

pub struct MultiSymbol {
    rng: Rng,
    setup: VecDeque<Command>,
    /// (base, quote) of each instrument; instrument id is index + 1.
    pairs: Vec<(AssetId, AssetId)>,
    /// Cumulative Zipf weights, for drawing an instrument.
    cumulative: Vec<u64>,
    placed: Vec<(OrderId, AccountId)>,
    emitted: u64,
    next_cid: u64,
}

/// The assets account `k` is funded in (each account holds three).
fn funded(account: u64) -> [AssetId; 3] {
    let a = ASSETS as u64;
    [(account % a) as u32 + 1, ((account / a) % a) as u32 + 1, ((account / (a * a)) % a) as u32 + 1]
}

impl MultiSymbol {
    pub fn new(seed: u64) -> MultiSymbol {
        let mut setup = VecDeque::new();
        for asset in 1..=ASSETS {
            setup.push_back(Command::AddAsset { id: asset, name: symbol(&format!("A{asset:02}")) });
        }
        let mut pairs = Vec::new();
        'outer: for base in 1..=ASSETS {
            for quote in 1..=ASSETS {
                if base != quote {
                    pairs.push((base, quote));
                    if pairs.len() == INSTRUMENTS as usize {
                        break 'outer;
                    }
                }
            }
        }
        for (index, &(base, quote)) in pairs.iter().enumerate() {
            setup.push_back(Command::AddInstrument(InstrumentSpec {
                id: index as u32 + 1,
                symbol: symbol(&format!("A{base:02}-A{quote:02}")),
                base,
                quote,
                tick_size: 1,
                lot_size: 1,
                min_qty: 1,
                max_qty: 10_000,
                min_price: 1,
                max_price: 1_000_000,
                maker_bps: 0,
                taker_bps: 5,
            }));
        }
        for account in 1..=ACCOUNTS {
            setup.push_back(Command::OpenAccount { account });
        }
        for account in 1..=ACCOUNTS {
            let mut seen = [0u32; 3];
            for (i, asset) in funded(account).into_iter().enumerate() {
                if !seen[..i].contains(&asset) {
                    setup.push_back(Command::Deposit { account, asset, amount: 1 << 40 });
                }
                seen[i] = asset;
            }
        }
        // Integer Zipf weights: 10^9 / rank.
        let mut total = 0u64;
        let cumulative = (1..=INSTRUMENTS as u64)
            .map(|rank| {
                total += 1_000_000_000 / rank;
                total
            })
            .collect();
        MultiSymbol { rng: Rng::new(seed), setup, pairs, cumulative, placed: Vec::new(), emitted: 0, next_cid: 1 }
    }

    fn instrument(&mut self) -> usize {
        let total = *self.cumulative.last().unwrap_or(&1);
        let pick = self.rng.below(total);
        self.cumulative.partition_point(|&c| c <= pick)
    }

    /// A random account funded in `asset`.
    fn account_holding(&mut self, asset: AssetId) -> AccountId {
        // Accounts k with k % ASSETS == asset - 1 hold `asset`.
        let a = ASSETS as u64;
        let slots = ACCOUNTS / a;
        let mut account = (asset as u64 - 1) + a * self.rng.below(slots);
        if account == 0 {
            account = a;
        }
        account
    }

    fn make(&mut self, engine: &Engine) -> Command {
        if let Some(command) = self.setup.pop_front() {
            return command;
        }
        if self.rng.percent(CANCEL_PERCENT) {
            while !self.placed.is_empty() {
                let index = self.rng.below(self.placed.len() as u64) as usize;
                let (order, account) = self.placed.swap_remove(index);
                if engine.order(order).is_some() {
                    return Command::Cancel { account, order };
                }
            }
        }
        let index = self.instrument();
        let (base, quote) = self.pairs[index];
        let side = if self.rng.below(2) == 0 { Side::Buy } else { Side::Sell };
        let account = self.account_holding(if side == Side::Buy { quote } else { base });
        let cid = self.next_cid;
        self.next_cid += 1;
        self.placed.push((self.emitted + 1, account));
        Command::Place(PlaceOrder {
            account,
            instrument: index as u32 + 1,
            cid,
            side,
            order_type: OrderType::Limit,
            tif: TimeInForce::Gtc,
            price: MID - 10 + self.rng.below(21) as i64,
            qty: 1 + self.rng.below(10),
            post_only: false,
            stp: SelfTradePrevention::None,
            budget: None,
        })
    }
}

impl Generator for MultiSymbol {
    fn next(&mut self, engine: &Engine) -> Command {
        let command = self.make(engine);
        self.emitted += 1;
        command
    }
}
