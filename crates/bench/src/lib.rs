//! The benchmark harness of `crossbook bench` ([`harness`]: workloads,
//! throughput, latency, stages, journal figures, reports and their
//! comparison), and the fixtures of the micro-benchmarks in
//! `benches/book.rs`: an engine with one instrument and funded accounts,
//! and order commands.

pub mod harness;

use crossbook_engine::*;

pub const INSTRUMENT: InstrumentId = 1;
pub const MAKER: AccountId = 1;
pub const TAKER: AccountId = 2;

/// An engine with BTC-USD (tick 1, lot 1, no fees) and two rich accounts.
pub fn engine() -> Engine {
    let mut engine = Engine::new();
    let mut events = Vec::new();
    let setup = [
        Command::AddAsset { id: 1, name: Symbol::new("BTC").expect("valid") },
        Command::AddAsset { id: 2, name: Symbol::new("USD").expect("valid") },
        Command::AddInstrument(InstrumentSpec {
            id: INSTRUMENT,
            symbol: Symbol::new("BTC-USD").expect("valid"),
            base: 1,
            quote: 2,
            tick_size: 1,
            lot_size: 1,
            min_qty: 1,
            max_qty: 1_000_000,
            min_price: 1,
            max_price: 1_000_000,
            maker_bps: 0,
            taker_bps: 0,
        }),
        Command::OpenAccount { account: MAKER },
        Command::OpenAccount { account: TAKER },
        Command::Deposit { account: MAKER, asset: 1, amount: 1 << 50 },
        Command::Deposit { account: MAKER, asset: 2, amount: 1 << 58 },
        Command::Deposit { account: TAKER, asset: 1, amount: 1 << 50 },
        Command::Deposit { account: TAKER, asset: 2, amount: 1 << 58 },
    ];
    for command in &setup {
        engine.apply(command, &mut events);
    }
    engine
}

pub fn limit(account: AccountId, cid: u64, side: Side, price: i64, qty: u64, tif: TimeInForce) -> Command {
    Command::Place(PlaceOrder {
        account,
        instrument: INSTRUMENT,
        cid,
        side,
        order_type: OrderType::Limit,
        tif,
        price,
        qty,
        post_only: false,
        stp: SelfTradePrevention::None,
        budget: None,
    })
}
