//! Invariants after every command of many random runs, the market drained at
//! the end of each, and a check that the `mixed` workload really exercises
//! everything it claims to.

use crate::support::*;
use crossbook_engine::*;
use crossbook_workload::{Workload, generate};
use std::collections::BTreeSet;

#[derive(Default)]
struct Coverage {
    rejects: BTreeSet<&'static str>,
    cancels: BTreeSet<&'static str>,
    /// STP modes whose taker actually met its own resting order.
    stp_fired: BTreeSet<&'static str>,
    self_trades: u64,
    replaced_kept: u64,
    replaced_lost: u64,
    market_fills: u64,
    fok_fills: u64,
    post_only_rested: u64,
    deposits: u64,
    withdrawals: u64,
    mass_cancels: u64,
    accounts: BTreeSet<AccountId>,
    instruments_traded: BTreeSet<InstrumentId>,
    /// FOK market sells with a least-to-receive budget: filled, refused.
    budget_sells: (u64, u64),
}

fn stp_name(stp: SelfTradePrevention) -> &'static str {
    match stp {
        SelfTradePrevention::None => "none",
        SelfTradePrevention::CancelNewest => "cancel_newest",
        SelfTradePrevention::CancelOldest => "cancel_oldest",
        SelfTradePrevention::CancelBoth => "cancel_both",
    }
}

fn note(coverage: &mut Coverage, command: &Command, events: &[Event]) {
    for event in events {
        match event.kind {
            EventKind::Rejected { reason } => {
                coverage.rejects.insert(reason.name());
            }
            EventKind::Cancelled { reason, .. } => {
                coverage.cancels.insert(reason.name());
                if reason == CancelReason::Stp
                    && let Command::Place(order) = command {
                        coverage.stp_fired.insert(stp_name(order.stp));
                    }
            }
            EventKind::Trade { maker_account, taker_account, instrument, .. } => {
                coverage.instruments_traded.insert(instrument);
                if maker_account == taker_account {
                    coverage.self_trades += 1;
                    coverage.stp_fired.insert("none");
                }
                if let Command::Place(order) = command {
                    if order.order_type == OrderType::Market {
                        coverage.market_fills += 1;
                    }
                    if order.tif == TimeInForce::Fok {
                        coverage.fok_fills += 1;
                    }
                }
            }
            EventKind::Replaced { priority_kept, .. } => {
                if priority_kept {
                    coverage.replaced_kept += 1;
                } else {
                    coverage.replaced_lost += 1;
                }
            }
            EventKind::Deposited { .. } => coverage.deposits += 1,
            EventKind::Withdrawn { .. } => coverage.withdrawals += 1,
            EventKind::MassCancelled { .. } => coverage.mass_cancels += 1,
            EventKind::AccountOpened { account } => {
                coverage.accounts.insert(account);
            }
            _ => {}
        }
    }
    if let Command::Place(order) = command
        && order.order_type == OrderType::Market && order.side == Side::Sell && order.budget.is_some() && order.tif == TimeInForce::Fok {
            if events.iter().any(|e| matches!(e.kind, EventKind::Trade { .. })) {
                coverage.budget_sells.0 += 1;
            }
            if events.iter().any(|e| matches!(e.kind, EventKind::Rejected { reason: RejectReason::FokCannotFill })) {
                coverage.budget_sells.1 += 1;
            }
        }
    if let Command::Place(order) = command {
        let rested = events.iter().all(|e| !matches!(e.kind, EventKind::Rejected { .. } | EventKind::Trade { .. }));
        if order.post_only && rested {
            coverage.post_only_rested += 1;
        }
    }
}

/// Cancels every open order of every account; afterwards nothing may stay
/// locked and every book must be empty.
fn drain(engine: &mut Engine, seed: u64) {
    let accounts: Vec<AccountId> = engine.account_ids().collect();
    let mut events = Vec::new();
    for account in accounts {
        events.clear();
        engine.apply(&Command::CancelAll { account, instrument: None }, &mut events);
        assert!(
            !events.iter().any(|e| matches!(e.kind, EventKind::Rejected { .. })),
            "seed {seed}: cancel_all for {account} refused"
        );
    }
    engine.check_invariants().unwrap_or_else(|e| panic!("seed {seed}: after draining: {e}"));
    assert_eq!(engine.open_orders(), 0, "seed {seed}: orders left after draining");
    assert_eq!(engine.total_locked(), 0, "seed {seed}: funds still locked after draining");
}

#[test]
fn invariants_hold_after_every_command_and_the_market_drains() {
    let mut coverage = Coverage::default();
    let count = commands_per_run(20_000);
    for seed in seeds(32) {
        // With the operator's halts and resumes now and then (`with_halts`).
        let commands = with_halts(generate(Workload::Mixed, seed, count), seed);
        let mut engine = Engine::new();
        let mut events = Vec::new();
        for command in &commands {
            events.clear();
            engine.apply(command, &mut events);
            assert!(!events.is_empty(), "seed {seed}: command {} produced no event", engine.seq());
            assert!(events.iter().all(|e| e.seq == engine.seq()), "seed {seed}: event with a wrong seq");
            if let Err(broken) = engine.check_invariants() {
                panic!("seed {seed}: after command {} ({command:?}): {broken}", engine.seq());
            }
            note(&mut coverage, command, &events);
        }
        drain(&mut engine, seed);
    }

    // The workload must be exercising what the differential test relies on.
    let all_rejects: BTreeSet<&str> = RejectReason::ALL.iter().map(|r| r.name()).collect();
    let missing: Vec<_> = all_rejects.difference(&coverage.rejects).collect();
    assert!(missing.is_empty(), "reject reasons never produced: {missing:?}");
    for reason in ["user", "ioc", "stp", "replace", "cancel_all"] {
        assert!(coverage.cancels.contains(reason), "no cancel with reason {reason}");
    }
    for mode in ["none", "cancel_newest", "cancel_oldest", "cancel_both"] {
        assert!(coverage.stp_fired.contains(mode), "self-trade prevention {mode} never came into play");
    }
    assert!(coverage.self_trades > 0);
    assert!(coverage.budget_sells.0 > 0 && coverage.budget_sells.1 > 0, "budgeted FOK sells {:?}", coverage.budget_sells);
    assert!(coverage.replaced_kept > 0 && coverage.replaced_lost > 0);
    assert!(coverage.market_fills > 0 && coverage.fok_fills > 0 && coverage.post_only_rested > 0);
    assert!(coverage.deposits > 0 && coverage.withdrawals > 0 && coverage.mass_cancels > 0);
    assert!(coverage.accounts.len() >= 100, "only {} accounts", coverage.accounts.len());
    assert!(coverage.instruments_traded.len() >= 3, "trades on {:?} only", coverage.instruments_traded);
}

#[test]
fn steady_deep_keeps_its_shape_and_invariants() {
    let commands = generate(Workload::SteadyDeep, 3, 30_000);
    let mut engine = Engine::new();
    let mut events = Vec::new();
    let mut max_open = 0;
    for command in &commands {
        events.clear();
        engine.apply(command, &mut events);
        assert!(!events.iter().any(|e| matches!(e.kind, EventKind::Rejected { .. })), "{events:?}");
        max_open = max_open.max(engine.open_orders());
    }
    engine.check_invariants().unwrap();
    assert!((500..=520).contains(&engine.open_orders()), "{} resting", engine.open_orders());
    assert!(max_open <= 520);
    drain(&mut engine, 3);
}
