//! Each workload is what docs/benchmarks.md says it is, within stated
//! tolerances.

use crossbook_engine::*;
use crossbook_workload::{Workload, generate, multisymbol, placecancel};

struct Tally {
    places: u64,
    places_trading: u64,
    cancels: u64,
    rejects: u64,
    per_instrument: Vec<u64>,
    accounts: u64,
    instruments: u64,
}

fn tally(commands: &[Command], skip_setup: bool) -> Tally {
    let mut engine = Engine::new();
    let mut events = Vec::new();
    let mut t = Tally { places: 0, places_trading: 0, cancels: 0, rejects: 0, per_instrument: vec![0; 1_001], accounts: 0, instruments: 0 };
    let mut trading = false;
    for command in commands {
        events.clear();
        engine.apply(command, &mut events);
        t.rejects += events.iter().filter(|e| matches!(e.kind, EventKind::Rejected { .. })).count() as u64;
        match command {
            Command::OpenAccount { .. } => t.accounts += 1,
            Command::AddInstrument(_) => t.instruments += 1,
            Command::Place(p) => {
                trading = true;
                t.places += 1;
                t.per_instrument[p.instrument as usize] += 1;
                if events.iter().any(|e| matches!(e.kind, EventKind::Trade { .. })) {
                    t.places_trading += 1;
                }
            }
            Command::Cancel { .. } => t.cancels += 1,
            _ => {}
        }
        let _ = (skip_setup, trading);
    }
    t
}

fn within(value: f64, expected: f64, tolerance: f64, what: &str) {
    assert!((value - expected).abs() <= tolerance, "{what}: {value:.4}, expected {expected} ± {tolerance}");
}

#[test]
fn place_cancel_has_its_published_shape() {
    let setup = 3 + 3 * placecancel::ACCOUNTS as usize;
    let commands = generate(Workload::PlaceCancel, 5, setup + 130_000);
    let t = tally(&commands, true);
    assert_eq!(t.rejects, 0);
    assert_eq!(t.accounts, 1_000);
    within(t.cancels as f64 / (t.places + t.cancels) as f64, 3.0 / 13.0, 0.01, "cancel share");
    within(t.places_trading as f64 / t.places as f64, 0.30, 0.05, "share of orders crossing");
    // Quantities: log-normal with median 5.
    let mut sizes: Vec<u64> = commands.iter().filter_map(|c| if let Command::Place(p) = c { Some(p.qty) } else { None }).collect();
    sizes.sort_unstable();
    assert_eq!(sizes[sizes.len() / 2], 5, "median size");
    assert!(*sizes.last().unwrap() > 50, "a long tail");
}

#[test]
fn multi_symbol_spreads_orders_by_zipf_popularity() {
    let setup_len = generate(Workload::MultiSymbol, 1, 400_000)
        .iter()
        .position(|c| matches!(c, Command::Place(_) | Command::Cancel { .. }))
        .unwrap();
    let commands = generate(Workload::MultiSymbol, 1, setup_len + 60_000);
    let t = tally(&commands, true);
    assert_eq!((t.instruments, t.accounts), (1_000, 100_000));
    assert_eq!(t.rejects, 0, "every order is funded");
    within(t.cancels as f64 / (t.places + t.cancels) as f64, multisymbol::CANCEL_PERCENT as f64 / 100.0, 0.015, "cancel share");
    // Rank r has weight 1/r: the first instrument gets 1/H(1000) = 13.4%,
    // the tenth a tenth of that.
    let harmonic: f64 = (1..=1000).map(|r| 1.0 / r as f64).sum();
    within(t.per_instrument[1] as f64 / t.places as f64, 1.0 / harmonic, 0.01, "share of the most popular instrument");
    within(t.per_instrument[10] as f64 / t.places as f64, 0.1 / harmonic, 0.004, "share of the tenth");
    assert!(t.per_instrument[1..].iter().filter(|&&n| n > 0).count() > 900, "the long tail is traded too");
}

#[test]
fn steady_deep_mix_is_as_documented() {
    let commands = generate(Workload::SteadyDeep, 2, 60_000);
    let t = tally(&commands, true);
    assert_eq!(t.rejects, 0);
    let trading = (t.places + t.cancels) as f64;
    within(t.places as f64 / trading, 0.82, 0.03, "place share");
}

#[test]
fn steady_deep_keeps_its_book_at_512_in_a_64_tick_band() {
    let commands = generate(Workload::SteadyDeep, 3, 60_000);
    let mut engine = Engine::new();
    let mut events = Vec::new();
    let (mut buys, mut sells, mut deepest) = (0u64, 0u64, 0usize);
    for command in &commands {
        events.clear();
        engine.apply(command, &mut events);
        deepest = deepest.max(engine.open_orders());
        if let Command::Place(p) = command {
            assert!((99_968..=100_031).contains(&p.price), "price {} outside the 64-tick band", p.price);
            assert!((1..=8).contains(&p.qty), "quantity {}", p.qty);
            assert_eq!((p.order_type, p.tif), (OrderType::Limit, TimeInForce::Gtc));
            match p.side {
                Side::Buy => buys += 1,
                Side::Sell => sells += 1,
            }
        }
    }
    // A cancel of the oldest precedes every order once 512 rest.
    assert!((500..=513).contains(&deepest), "the book peaked at {deepest} resting orders");
    within(buys as f64 / (buys + sells) as f64, 0.5, 0.01, "buy share");
}

#[test]
fn mixed_operation_mix_is_as_documented() {
    // Weights out of 930 (docs/benchmarks.md); the 40 one-rule-broken
    // commands land in every category, and a replace with no open order to
    // pick becomes a cancel, hence the one-sided tolerances.
    let commands = generate(Workload::Mixed, 4, 80_000);
    let trading = commands.iter().position(|c| matches!(c, Command::Place(_))).unwrap();
    let commands = &commands[trading..];
    let n = commands.len() as f64;
    let share = |f: &dyn Fn(&Command) -> bool| commands.iter().filter(|c| f(c)).count() as f64 / n;
    let limit = share(&|c| matches!(c, Command::Place(p) if p.order_type == OrderType::Limit));
    let market = share(&|c| matches!(c, Command::Place(p) if p.order_type == OrderType::Market));
    let cancel_or_replace = share(&|c| matches!(c, Command::Cancel { .. } | Command::Replace { .. } | Command::Amend { .. }));
    let amend = share(&|c| matches!(c, Command::Amend { .. }));
    let cancel_all = share(&|c| matches!(c, Command::CancelAll { .. }));
    let funds = share(&|c| matches!(c, Command::Deposit { .. } | Command::Withdraw { .. }));
    let in_range = |value: f64, weight: f64, below: f64, above: f64, what: &str| {
        let expected = weight / 930.0;
        assert!(value >= expected - below && value <= expected + above, "{what}: {value:.4}, expected {expected:.4} -{below} +{above}");
    };
    in_range(limit, 500.0, 0.01, 0.03, "limit orders");
    in_range(market, 60.0, 0.005, 0.01, "market orders");
    in_range(cancel_or_replace, 260.0, 0.015, 0.03, "cancels and replaces");
    in_range(amend, 120.0 * 0.3, 0.006, 0.004, "amendments (30% of the replaces)");
    in_range(cancel_all, 8.0, 0.0015, 0.002, "cancel-alls");
    in_range(funds, 60.0, 0.005, 0.025, "deposits and withdrawals");
}
