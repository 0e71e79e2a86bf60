//! Market data against the engine it follows: the books level by level
//! after every command, the trades, a checkpoint that restores the same
//! state, and a local book kept by Binance's procedure from a snapshot and
//! the diffs after it.

use super::*;
use crossbook_engine::{Command, Engine};
use crossbook_workload::{Workload, generate};

fn infos(commands: &[Command]) -> Vec<InstrumentInfo> {
    InstrumentInfo::of_commands(commands)
}

fn engine_levels(engine: &Engine, id: InstrumentId) -> Book {
    let mut book = Book::default();
    for (side, price, qty, _) in engine.depth(id).unwrap_or_default() {
        match side {
            Side::Buy => book.bids.insert(price, qty),
            Side::Sell => book.asks.insert(price, qty),
        };
    }
    book
}

#[test]
fn books_and_trades_follow_the_engine_command_by_command() {
    for seed in 1..=4u64 {
        let commands = generate(Workload::Mixed, seed, 15_000);
        let mut engine = Engine::new();
        let mut market = MarketData::new(infos(&commands), 0);
        let mut events = Vec::new();
        let mut trades = 0u64;
        for (index, command) in commands.iter().enumerate() {
            events.clear();
            engine.apply(command, &mut events);
            market.apply(engine.seq(), 1_700_000_000_000 + index as u64 * 7, &events);
            trades += events.iter().filter(|e| matches!(e.kind, EventKind::Trade { .. })).count() as u64;
            for data in &market.instruments {
                assert_eq!(data.book, engine_levels(&engine, data.info.id), "seed {seed}, command {} ({command:?}), instrument {}", index + 1, data.info.id);
            }
            let _ = market.take_updates();
        }
        let kept: u64 = market.instruments.iter().map(|d| d.next_trade_id - 1).sum();
        assert_eq!(kept, trades, "seed {seed}");
        assert!(trades > 100, "seed {seed}: the workload trades ({trades})");
        let resting: usize = market.orders.values().filter(|l| l.resting).count();
        assert_eq!(resting, market.orders.len(), "only resting orders are followed between commands");
    }
}

#[test]
fn a_checkpoint_restores_the_same_market_data() {
    let mut commands = generate(Workload::Mixed, 9, 12_000);
    // An instrument halted before the checkpoint (its status is in it).
    let halted = infos(&commands)[0].id;
    commands.insert(5_000, Command::Halt { instrument: halted });
    let mut engine = Engine::new();
    let mut live = MarketData::new(infos(&commands), 0);
    let mut events = Vec::new();
    let mut restored = None;
    for (index, command) in commands.iter().enumerate() {
        events.clear();
        engine.apply(command, &mut events);
        let time = 1_700_000_000_000 + index as u64 * 1_000;
        live.apply(engine.seq(), time, &events);
        let _ = live.take_updates();
        if index == 6_000 {
            let bytes = codec::encode(&live);
            let mut copy = MarketData::new(infos(&commands), 0);
            codec::restore(&mut copy, &bytes).expect("a checkpoint restores");
            assert_eq!(codec::encode(&copy), bytes);
            assert_eq!(copy.instruments.iter().filter(|d| d.halted).map(|d| d.info.id).collect::<Vec<_>>(), vec![halted]);
            for cut in [0, 1, bytes.len() / 2, bytes.len() - 1] {
                let mut broken = MarketData::new(infos(&commands), 0);
                assert!(codec::restore(&mut broken, &bytes[..cut]).is_err(), "cut at {cut}");
            }
            restored = Some(copy);
        }
        if let Some(copy) = restored.as_mut()
            && index > 6_000
        {
            copy.apply(engine.seq(), time, &events);
            let _ = copy.take_updates();
        }
    }
    let copy = restored.expect("restored midway");
    assert_eq!(codec::encode(&copy), codec::encode(&live));
    for (a, b) in copy.instruments.iter().zip(&live.instruments) {
        assert_eq!((&a.book, &a.trades, &a.candles, a.next_trade_id), (&b.book, &b.trades, &b.candles, b.next_trade_id));
    }
}

/// A diff applied to a book: each level's new total, 0 for gone.
fn apply_diff(book: &mut Book, diff: &DepthDiff) {
    for (price, qty) in &diff.bids {
        if *qty == 0 { book.bids.remove(price) } else { book.bids.insert(*price, *qty) };
    }
    for (price, qty) in &diff.asks {
        if *qty == 0 { book.asks.remove(price) } else { book.asks.insert(*price, *qty) };
    }
}

/// Binance's procedure: buffer diffs, take a snapshot (`lastUpdateId`),
/// drop diffs with `u <= lastUpdateId`, the first kept one must have
/// `U <= lastUpdateId + 1 <= u`, then each `U` is the previous `u + 1`.
#[test]
fn a_local_book_from_a_snapshot_and_diffs_equals_the_book() {
    let commands = generate(Workload::Mixed, 4, 10_000);
    let mut engine = Engine::new();
    let mut market = MarketData::new(infos(&commands), 0);
    let instrument = 0usize;
    let mut events = Vec::new();
    let mut buffered: Vec<DepthDiff> = Vec::new();
    let mut local: Option<(u64, Book)> = None;
    let mut applied = 0;
    for (index, chunk) in commands.chunks(37).enumerate() {
        for command in chunk {
            events.clear();
            engine.apply(command, &mut events);
            market.apply(engine.seq(), 0, &events);
        }
        let updates = market.take_updates();
        buffered.extend(updates.instruments.into_iter().filter(|u| u.index == instrument).filter_map(|u| u.depth));
        if index == 40 {
            // The snapshot, taken between two batches.
            local = Some((market.seq, market.instruments[instrument].book.clone()));
        }
        if let Some((last_update_id, book)) = local.as_mut() {
            for diff in buffered.drain(..) {
                if diff.last <= *last_update_id {
                    continue;
                }
                assert!(diff.first <= *last_update_id + 1, "a gap: diff {}..={} after {}", diff.first, diff.last, last_update_id);
                if applied > 0 {
                    assert_eq!(diff.first, *last_update_id + 1, "diffs follow each other without gaps or overlaps");
                }
                apply_diff(book, &diff);
                *last_update_id = diff.last;
                applied += 1;
            }
        }
    }
    let (_, book) = local.expect("a snapshot");
    assert_eq!(book, market.instruments[instrument].book);
    assert!(applied > 10, "{applied} diffs applied");
}


/// Diffs merged a few at a time (what the `@depth@100ms` streams send)
/// cover the same commands without gaps, list each price once, best first,
/// and build the same book as the diffs one by one, at every merged diff.
#[test]
fn merged_diffs_build_the_same_book_as_the_diffs_one_by_one() {
    let commands = generate(Workload::Mixed, 5, 10_000);
    let mut engine = Engine::new();
    let mut market = MarketData::new(infos(&commands), 0);
    let instrument = 0usize;
    let mut events = Vec::new();
    let (mut one_by_one, mut merged_book) = (Book::default(), Book::default());
    let mut pending: Option<DepthDiff> = None;
    let (mut through, mut merges, mut sent) = (0u64, 0, 0);
    for (index, chunk) in commands.chunks(23).enumerate() {
        for command in chunk {
            events.clear();
            engine.apply(command, &mut events);
            market.apply(engine.seq(), 0, &events);
        }
        for diff in market.take_updates().instruments.into_iter().filter(|u| u.index == instrument).filter_map(|u| u.depth) {
            apply_diff(&mut one_by_one, &diff);
            match pending.as_mut() {
                Some(p) => {
                    p.merge(&diff);
                    merges += 1;
                }
                None => pending = Some(diff),
            }
        }
        // Sent every few batches, as an interval ends.
        if index % 7 == 6
            && let Some(diff) = pending.take()
        {
            if sent > 0 {
                assert_eq!(diff.first, through + 1, "merged diffs follow each other");
            }
            assert!(diff.bids.windows(2).all(|w| w[0].0 > w[1].0), "bids best first, each price once: {:?}", diff.bids);
            assert!(diff.asks.windows(2).all(|w| w[0].0 < w[1].0), "asks best first, each price once: {:?}", diff.asks);
            apply_diff(&mut merged_book, &diff);
            through = diff.last;
            sent += 1;
            assert_eq!(merged_book, one_by_one, "after the merged diff ending at {through}");
        }
    }
    assert_eq!(one_by_one, engine_levels(&engine, market.instruments[instrument].info.id));
    assert!(sent > 20 && merges > 100, "{sent} merged diffs of {merges} merges");
}

/// Each account's open orders (price, quantity, fills) are the engine's
/// after every command; every fill is in both owners' trades with its fee;
/// an order's filled quantity is the sum of its trades; an ended order
/// leaves the open ones.
#[test]
fn accounts_follow_the_engine_order_by_order() {
    use crate::accounts::OrderStatus;
    for seed in [3u64, 11] {
        let commands = generate(Workload::Mixed, seed, 12_000);
        let mut engine = Engine::new();
        let mut market = MarketData::new(infos(&commands), 0);
        let mut events = Vec::new();
        let mut fills = 0usize;
        for (index, command) in commands.iter().enumerate() {
            events.clear();
            engine.apply(command, &mut events);
            let context = CommandContext { command, client_id: None, gateway: false };
            market.apply_command(engine.seq(), 1_700_000_000_000 + index as u64, Some(context), &events);
            let _ = market.take_updates();
            fills += 2 * events.iter().filter(|e| matches!(e.kind, EventKind::Trade { .. })).count();
            if index % 97 != 0 && index + 1 != commands.len() {
                continue;
            }
            for account in engine.account_ids().collect::<Vec<_>>() {
                let want: Vec<(u64, i64, u64, u64)> = engine.open_orders_of(account, None).iter().map(|o| (o.id, o.price, o.qty, o.filled)).collect();
                let data = market.accounts.accounts.get(&account);
                let have: Vec<(u64, i64, u64, u64)> = data
                    .map(|d| d.open.iter().map(|id| &market.accounts.orders[id]).map(|o| (o.id, o.price, o.qty, o.filled)).collect())
                    .unwrap_or_default();
                assert_eq!(have, want, "seed {seed}, after command {}: account {account}'s open orders", index + 1);
                for id in data.map(|d| d.open.iter().copied().collect::<Vec<_>>()).unwrap_or_default() {
                    let o = &market.accounts.orders[&id];
                    assert!(o.status.is_open());
                    assert_eq!(market.accounts.open_by_client_id(account, &o.client_id).map(|r| r.id), Some(id));
                }
            }
        }
        let kept: usize = market.accounts.accounts.values().map(|d| d.trades.len()).sum();
        assert_eq!(kept, fills, "seed {seed}: every fill is in its owner's trades");
        for data in market.accounts.accounts.values() {
            for trade in &data.trades {
                if let Some(order) = market.accounts.orders.get(&trade.order) {
                    let sum: u64 = data.trades.iter().filter(|t| t.order == order.id).map(|t| t.qty).sum();
                    assert_eq!(sum, order.filled, "seed {seed}: order {}'s fills", order.id);
                    if order.status == OrderStatus::Filled {
                        assert_eq!(order.filled, order.qty);
                    }
                }
            }
        }
        let ended = market.accounts.orders.values().filter(|o| !o.status.is_open()).count();
        assert!(ended > 100 && fills > 100, "seed {seed}: {ended} ended orders, {fills} fills");
    }
}

/// A venue of one instrument, X-Y (tick and lot 1, lots up to
/// `max_qty`), with account 7 holding 1,000,000 X.
fn x_y_venue(max_qty: u64) -> Vec<Command> {
    use crossbook_engine::{InstrumentSpec, Symbol};
    let symbol = Symbol::new("X-Y").expect("symbol");
    let spec = InstrumentSpec { id: 1, symbol, base: 1, quote: 2, tick_size: 1, lot_size: 1, min_qty: 1, max_qty, min_price: 1, max_price: 1_000_000, maker_bps: 0, taker_bps: 0 };
    vec![
        Command::AddAsset { id: 1, name: Symbol::new("X").expect("x") },
        Command::AddAsset { id: 2, name: Symbol::new("Y").expect("y") },
        Command::AddInstrument(spec),
        Command::OpenAccount { account: 7 },
        Command::Deposit { account: 7, asset: 1, amount: 1_000_000 },
    ]
}

/// Account 7's GTC sell of one lot of X-Y.
fn resting_sell(cid: u64, price: i64) -> Command {
    use crossbook_engine::{PlaceOrder, SelfTradePrevention};
    Command::Place(PlaceOrder { account: 7, instrument: 1, cid, side: Side::Sell, order_type: OrderType::Limit, tif: TimeInForce::Gtc, price, qty: 1, post_only: false, stp: SelfTradePrevention::None, budget: None })
}

/// An engine and market data that followed `commands`, and the events of
/// the last one.
fn followed(commands: &[Command]) -> (Engine, MarketData, Vec<Event>) {
    let mut engine = Engine::new();
    let mut market = MarketData::new(infos(commands), 0);
    let mut events = Vec::new();
    for command in commands {
        events.clear();
        engine.apply(command, &mut events);
        market.apply(engine.seq(), 0, &events);
    }
    (engine, market, events)
}

/// A command that ends more orders than an account keeps (a cancel-all of
/// 10,050 open orders) leaves every one of them readable right after it;
/// the window is trimmed before the next command.
#[test]
fn a_command_that_ends_many_orders_keeps_them_until_the_next() {
    use crate::accounts::{ORDERS_KEPT, OrderStatus};
    let mut commands = x_y_venue(1_000);
    let orders = ORDERS_KEPT + 50;
    commands.extend((0..orders as u64).map(|cid| resting_sell(cid, 100 + cid as i64)));
    commands.push(Command::CancelAll { account: 7, instrument: None });
    let (mut engine, mut market, mut events) = followed(&commands);
    let cancelled = events.iter().filter(|e| matches!(e.kind, EventKind::Cancelled { .. })).count();
    assert_eq!(cancelled, orders);
    for event in &events {
        if let EventKind::Cancelled { order, .. } = event.kind {
            assert_eq!(market.accounts.orders.get(&order).map(|o| o.status), Some(OrderStatus::Canceled), "order {order} readable right after its command");
        }
    }
    events.clear();
    engine.apply(&Command::Deposit { account: 7, asset: 2, amount: 1 }, &mut events);
    market.apply(engine.seq(), 0, &events);
    assert_eq!(market.accounts.accounts[&7].closed.len(), ORDERS_KEPT);
    assert_eq!(market.accounts.orders.len(), ORDERS_KEPT);
}

#[test]
fn a_batch_with_more_trades_than_are_kept_hands_every_one_out() {
    use crossbook_engine::{PlaceOrder, SelfTradePrevention};
    let mut commands = x_y_venue(1_000_000);
    commands.extend([Command::OpenAccount { account: 8 }, Command::Deposit { account: 8, asset: 2, amount: 1_000_000_000 }]);
    // One command sweeps half again as many resting orders as the
    // instrument's trade window keeps.
    let resting = TRADES_KEPT + TRADES_KEPT / 2;
    commands.extend((0..resting as u64).map(|cid| resting_sell(cid, 100 + cid as i64 % 7)));
    let (mut engine, mut market, mut events) = followed(&commands);
    let before = market.take_updates();
    assert_eq!(before.instruments[0].depth.as_ref().map(|d| d.asks.len()), Some(7));
    let sweep = Command::Place(PlaceOrder { account: 8, instrument: 1, cid: 1, side: Side::Buy, order_type: OrderType::Limit, tif: TimeInForce::Ioc, price: 1_000, qty: resting as u64, post_only: false, stp: SelfTradePrevention::None, budget: None });
    events.clear();
    engine.apply(&sweep, &mut events);
    market.apply(engine.seq(), 0, &events);
    let updates = market.take_updates();
    let trades = &updates.instruments[0].trades;
    assert_eq!(trades.len(), resting, "every trade of the batch goes to the @trade stream");
    assert!(trades.iter().enumerate().all(|(i, t)| t.id == i as u64 + 1), "ids without gaps from 1");
    assert_eq!(market.instruments[0].trades.len(), TRADES_KEPT, "the window for GET /api/v3/trades stays bounded");
    let depth = updates.instruments[0].depth.as_ref().expect("the sweep emptied the asks");
    assert_eq!(depth.asks, (100..107).map(|p| (p, 0)).collect::<Vec<_>>(), "each emptied level once, best first");
}

/// Small windows: every account keeps at most its windows once the next
/// command has trimmed them, no record outlives its window, and a
/// checkpoint taken midway restores to the same records (trimmed the same
/// way) as the node that went on.
#[test]
fn small_windows_hold_and_restore_the_same() {
    let commands = generate(Workload::Mixed, 5, 12_000);
    let windowed = || {
        let mut market = MarketData::new(infos(&commands), 0);
        market.accounts.set_windows(3, 4);
        market
    };
    let mut engine = Engine::new();
    let mut live = windowed();
    let mut restored: Option<MarketData> = None;
    let mut events = Vec::new();
    for (index, command) in commands.iter().enumerate() {
        events.clear();
        engine.apply(command, &mut events);
        let time = 1_700_000_000_000 + index as u64 * 1_000;
        let context = CommandContext { command, client_id: None, gateway: false };
        for market in std::iter::once(&mut live).chain(restored.as_mut()) {
            market.apply_command(engine.seq(), time, Some(context), &events);
            let _ = market.take_updates();
        }
        if index == 6_000 {
            let mut copy = windowed();
            codec::restore(&mut copy, &codec::encode(&live)).expect("a checkpoint restores");
            restored = Some(copy);
        }
    }
    // One command more trims what the last one left over.
    let last = crossbook_engine::Command::OpenAccount { account: 999_999 };
    events.clear();
    engine.apply(&last, &mut events);
    let copy = restored.as_mut().expect("restored midway");
    for market in [&mut live, copy] {
        market.apply_command(engine.seq(), 1_800_000_000_000, Some(CommandContext { command: &last, client_id: None, gateway: false }), &events);
    }
    let copy = restored.expect("restored midway");
    assert_eq!(codec::encode(&copy), codec::encode(&live), "the restored node trims as the live one does");
    let mut held = 0;
    for (account, data) in &live.accounts.accounts {
        assert!(data.closed.len() <= 3 && data.trades.len() <= 4, "account {account}: {} ended orders, {} trades kept", data.closed.len(), data.trades.len());
        held += data.open.len() + data.closed.len();
    }
    assert_eq!(live.accounts.orders.len(), held, "every record is open or in its account's window");
    assert!(live.accounts.accounts.values().filter(|d| d.closed.len() == 3).count() > 10, "the windows were reached");
}

/// The operator's transfers are recorded by reference from their
/// commands (done or refused, only those a gateway journaled with a
/// reference), kept in the checkpoint, and the oldest forgotten past
/// `TRANSFERS_KEPT`.
#[test]
fn transfers_are_kept_by_reference_in_the_checkpoint() {
    use transfers::{Direction, TRANSFERS_KEPT, Transfer, Transfers};
    let venue = x_y_venue(1_000);
    let mut engine = Engine::new();
    let mut market = MarketData::new(InstrumentInfo::of_commands(&venue), 0);
    let mut events = Vec::new();
    let steps: Vec<(Command, Option<&str>)> = venue
        .iter()
        .map(|c| (*c, None))
        .chain([
            (Command::Deposit { account: 7, asset: 2, amount: 500 }, Some("in-1")),
            (Command::Withdraw { account: 7, asset: 2, amount: 900 }, Some("out-1")),
            (Command::Withdraw { account: 7, asset: 2, amount: 200 }, Some("out-2")),
            (Command::Deposit { account: 7, asset: 2, amount: 1 }, None),
        ])
        .collect();
    for (index, (command, reference)) in steps.iter().enumerate() {
        events.clear();
        engine.apply(command, &mut events);
        let context = CommandContext { command, client_id: *reference, gateway: reference.is_some() };
        market.apply_command(engine.seq(), 1_000 + index as u64, Some(context), &events);
    }
    let at = |seq: u64, amount: u64, direction: Direction, refused: Option<RejectReason>| Transfer { seq, time_ms: seq + 999, account: 7, asset: 2, amount, direction, refused };
    assert_eq!(market.transfers.get("in-1"), Some(&at(6, 500, Direction::Deposit, None)));
    assert_eq!(market.transfers.get("out-1"), Some(&at(7, 900, Direction::Withdrawal, Some(RejectReason::InsufficientFunds))));
    assert_eq!(market.transfers.get("out-2"), Some(&at(8, 200, Direction::Withdrawal, None)));
    assert_eq!(market.transfers.len(), 3, "a deposit without a reference (the configuration's) is not one");

    let bytes = codec::encode(&market);
    let mut copy = MarketData::new(InstrumentInfo::of_commands(&venue), 0);
    codec::restore(&mut copy, &bytes).expect("a checkpoint restores");
    assert_eq!(copy.transfers, market.transfers);
    let mut broken = MarketData::new(InstrumentInfo::of_commands(&venue), 0);
    assert!(codec::restore(&mut broken, &bytes[..bytes.len() - 1]).is_err());

    let mut many = Transfers::default();
    for n in 0..TRANSFERS_KEPT as u64 + 2 {
        many.record(&n.to_string(), at(n, 1, Direction::Deposit, None));
    }
    assert_eq!(many.len(), TRANSFERS_KEPT);
    assert!(many.get("0").is_none() && many.get("1").is_none(), "the oldest are forgotten");
    assert!(many.get("2").is_some() && many.get(&(TRANSFERS_KEPT as u64 + 1).to_string()).is_some());
}

/// Ids placed one after another hash to neighbouring buckets, sixteen at
/// a time (their low four bits are the id's, the rest of a block's place
/// is shared), with tags that differ (the top seven bits); blocks land
/// apart; the maps keyed by them find every id, a dense window of ids
/// wider than the table included.
#[test]
fn order_ids_hash_in_blocks_with_varied_tags() {
    use std::hash::BuildHasher;
    let hash = |id: u64| OrderIdHash.hash_one(id);
    for block in [0u64, 1, 62_500, 1 << 36] {
        let place = hash(block * 16) & BELOW_TAG;
        assert!((0..16).all(|i| hash(block * 16 + i) & BELOW_TAG == place + i), "block {block}");
    }
    let tags: std::collections::BTreeSet<u64> = (0..16u64).map(|i| hash(1_600 + i) >> 57).collect();
    assert!(tags.len() > 8, "{} tags among a block's 16 ids", tags.len());
    let places: std::collections::BTreeSet<u64> = (0..1_000u64).map(|block| ((hash(block * 16) & BELOW_TAG) >> 4) & 0xFFF).collect();
    assert!(places.len() > 700, "1,000 blocks in {} of 4,096 places", places.len());
    let mut map: ByOrderId<u64> = ByOrderId::default();
    map.extend((1..=100_000u64).map(|id| (id * 3, id)));
    map.retain(|key, _| key % 5 != 0);
    map.extend((100_001..=300_000u64).map(|id| (id * 3, id)));
    assert!((1..=300_000u64).all(|id| map.get(&(id * 3)) == (id * 3 % 5 != 0 || id > 100_000).then_some(&id)));
}
