//! The book's hot operations, one at a time: add a resting order, cancel
//! one, the two together, match one level, replace.
//! `cargo bench -p crossbook-bench`.

use crossbook_bench::*;
use crossbook_engine::*;
use divan::Bencher;

fn main() {
    divan::main();
}

/// A book with `depth` resting sells spread over 64 levels above 10,000
/// and as many buys below: the shape of `steady-deep`.
fn deep_engine(depth: u64) -> (Engine, u64) {
    let mut engine = engine();
    let mut events = Vec::new();
    for i in 0..depth {
        let offset = 1 + (i % 32) as i64;
        engine.apply(&limit(MAKER, i * 2 + 1, Side::Sell, 10_000 + offset, 5, TimeInForce::Gtc), &mut events);
        engine.apply(&limit(MAKER, i * 2 + 2, Side::Buy, 10_000 - offset, 5, TimeInForce::Gtc), &mut events);
    }
    (engine, depth * 2 + 1)
}

/// Add a resting order, then cancel it (the pair is what keeps a book at
/// a steady depth).
#[divan::bench(args = [16, 512, 8192])]
fn add_then_cancel(bencher: Bencher, depth: u64) {
    let (mut engine, mut cid) = deep_engine(depth);
    let mut events = Vec::with_capacity(64);
    bencher.bench_local(|| {
        cid += 1;
        events.clear();
        engine.apply(&limit(TAKER, cid, Side::Buy, 9_990, 3, TimeInForce::Gtc), &mut events);
        let order = engine.seq();
        engine.apply(&Command::Cancel { account: TAKER, order }, &mut events);
        divan::black_box(events.len())
    });
}

/// Add one resting order (at one of 64 passive prices), nothing else:
/// the book grows by one order per iteration, which for an O(1) add into
/// an existing level does not change its cost.
#[divan::bench(args = [16, 512, 8192])]
fn add(bencher: Bencher, depth: u64) {
    let (mut engine, mut cid) = deep_engine(depth);
    let mut events = Vec::with_capacity(64);
    bencher.bench_local(|| {
        cid += 1;
        events.clear();
        let price = 9_900 - (cid % 64) as i64;
        engine.apply(&limit(TAKER, cid, Side::Buy, price, 3, TimeInForce::Gtc), &mut events);
        divan::black_box(events.len())
    });
}

/// Cancel one resting order; the order is added outside the timed part.
#[divan::bench(args = [16, 512, 8192])]
fn cancel(bencher: Bencher, depth: u64) {
    let (engine, cid) = deep_engine(depth);
    let engine = std::cell::RefCell::new(engine);
    let cid = std::cell::Cell::new(cid);
    let mut events = Vec::with_capacity(64);
    bencher
        .with_inputs(|| {
            let mut engine = engine.borrow_mut();
            cid.set(cid.get() + 1);
            let mut added = Vec::new();
            engine.apply(&limit(TAKER, cid.get(), Side::Buy, 9_900 - (cid.get() % 64) as i64, 3, TimeInForce::Gtc), &mut added);
            engine.seq()
        })
        .bench_local_values(|order| {
            events.clear();
            engine.borrow_mut().apply(&Command::Cancel { account: TAKER, order }, &mut events);
            divan::black_box(events.len())
        });
}

/// An IOC order that takes one whole resting order at the best level, and
/// the maker put back (so the book stays the same).
#[divan::bench(args = [16, 512, 8192])]
fn match_one_level(bencher: Bencher, depth: u64) {
    let (mut engine, mut cid) = deep_engine(depth);
    let mut events = Vec::with_capacity(64);
    bencher.bench_local(|| {
        cid += 2;
        events.clear();
        engine.apply(&limit(MAKER, cid, Side::Sell, 10_001, 5, TimeInForce::Gtc), &mut events);
        engine.apply(&limit(TAKER, cid + 1, Side::Buy, 10_001, 5, TimeInForce::Ioc), &mut events);
        divan::black_box(events.len())
    });
}

/// Replace a resting order to a new price and back (loses priority twice).
#[divan::bench(args = [16, 512, 8192])]
fn replace_price(bencher: Bencher, depth: u64) {
    let (mut engine, cid) = deep_engine(depth);
    let mut events = Vec::with_capacity(64);
    engine.apply(&limit(TAKER, cid, Side::Buy, 9_980, 5, TimeInForce::Gtc), &mut events);
    let order = engine.seq();
    bencher.bench_local(|| {
        events.clear();
        engine.apply(&Command::Replace { account: TAKER, order, price: 9_981, qty: 5 }, &mut events);
        engine.apply(&Command::Replace { account: TAKER, order, price: 9_980, qty: 5 }, &mut events);
        divan::black_box(events.len())
    });
}
