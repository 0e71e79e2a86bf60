//! Execution reports built from engine events: a scenario spelled out, and
//! agreement with the engine's own order state over random runs.

use crossbook_engine::*;
use crossbook_protocol::reports::{Addressed, ReportBuilder};
use crossbook_protocol::{ExecutionReport, ReportKind};
use crossbook_workload::{Workload, generate};

fn run(script: &str) -> Vec<Addressed> {
    let commands = crossbook_text::parse_commands(script).unwrap();
    let mut engine = Engine::new();
    let mut builder = ReportBuilder::new();
    let mut events = Vec::new();
    let mut out = Vec::new();
    for command in &commands {
        events.clear();
        engine.apply(command, &mut events);
        builder.reports(command, &events, &mut out);
    }
    out
}

fn summary(a: &Addressed) -> (AccountId, ReportKind, OrderId, u64, u64, u64, i64, u8) {
    let r: &ExecutionReport = &a.report;
    (a.account, r.kind, r.order, r.last_qty, r.cum_qty, r.leaves_qty, r.fee, r.reason)
}

#[test]
fn a_partial_fill_a_replace_and_a_cancel_read_as_a_trader_expects() {
    let reports = run("\
asset id=1 name=B
asset id=2 name=Q
instrument id=1 symbol=B-Q base=1 quote=2 tick_size=1 lot_size=1 min_qty=1 max_qty=100 min_price=1 max_price=1000 maker_bps=-10 taker_bps=20
open account=1
open account=2
deposit account=1 asset=1 amount=100
deposit account=2 asset=2 amount=100000
place account=1 instrument=1 cid=7 side=sell type=limit tif=gtc price=100 qty=10
place account=2 instrument=1 cid=8 side=buy type=limit tif=ioc price=101 qty=4
replace account=1 order=8 price=100 qty=8
cancel account=2 order=8
cancel account=1 order=8
");
    let got: Vec<_> = reports.iter().map(summary).collect();
    assert_eq!(
        got,
        vec![
            (1, ReportKind::Accepted, 8, 0, 0, 10, 0, 0),
            (2, ReportKind::Accepted, 9, 0, 0, 4, 0, 0),
            // The maker: 4 of 10 filled, a rebate of 0.4 rounded to 0.
            (1, ReportKind::PartialFill, 8, 4, 4, 6, 0, 0),
            // The taker: all 4, fee ceil(400 * 20 / 10000) = 1.
            (2, ReportKind::Fill, 9, 4, 4, 0, 1, 0),
            (1, ReportKind::Replaced, 8, 0, 4, 4, 0, 0),
            // Someone else's order: refused exactly as a missing one
            // (unknown_order, though the engine says not_owner), and told
            // nothing about it.
            (2, ReportKind::Rejected, 8, 0, 0, 0, 0, RejectReason::UnknownOrder.code()),
            (1, ReportKind::Cancelled, 8, 0, 4, 0, 0, 1),
        ]
    );
    assert_eq!(reports[5].report.cid, 0, "no leak of the owner's client id");
    assert_eq!(reports[6].report.cid, 7);
}

#[test]
fn reports_agree_with_the_engine_over_random_runs() {
    for seed in 1..=4 {
        let commands = generate(Workload::Mixed, seed, 20_000);
        let mut engine = Engine::new();
        let mut builder = ReportBuilder::new();
        let mut events = Vec::new();
        let mut out = Vec::new();
        let mut fills = 0;
        for (index, command) in commands.iter().enumerate() {
            events.clear();
            out.clear();
            engine.apply(command, &mut events);
            builder.reports(command, &events, &mut out);
            assert_eq!(builder.open_orders(), engine.open_orders(), "seed {seed} command {index}");
            if index % 50 == 0 {
                for view in engine.open_order_views() {
                    assert_eq!(builder.order(view.id), Some((view.account, view.qty, view.filled)), "seed {seed} command {index}");
                }
            }
            for a in &out {
                let r = &a.report;
                if r.kind == ReportKind::Rejected {
                    continue;
                }
                if matches!(r.kind, ReportKind::Fill | ReportKind::PartialFill) {
                    fills += 1;
                    assert!(r.last_qty > 0);
                }
                if let Some(view) = engine.order(r.order) {
                    assert_eq!(a.account, view.account, "seed {seed}: report to the wrong account");
                    if r.kind != ReportKind::Cancelled {
                        assert_eq!(r.cum_qty + r.leaves_qty, view.qty, "seed {seed} command {index}: {r:?}");
                    }
                }
                if r.kind == ReportKind::Fill || r.kind == ReportKind::Cancelled {
                    assert_eq!(r.leaves_qty, 0);
                    assert!(engine.order(r.order).is_none(), "seed {seed}: a finished order is still open");
                }
            }
        }
        // Rebuilt from the engine, the builder knows the same open orders.
        assert_eq!(ReportBuilder::from_engine(&engine).open_orders(), engine.open_orders());
        assert!(fills > 1_000, "seed {seed}: only {fills} fill reports");
    }
}
