//! Rules that the generated workloads do not reach, written out by hand.

use crate::support::events_text;
use crossbook_text::parse_commands;

fn events(commands: &str) -> String {
    String::from_utf8(events_text(&parse_commands(commands).unwrap())).unwrap()
}

/// Balances live in one table with a slot per asset per account; adding a
/// fifth asset after accounts exist re-lays the table. Nothing may move.
#[test]
fn adding_assets_after_accounts_keeps_every_balance() {
    let mut script = String::from("open account=7\nopen account=3\n");
    for asset in 1..=9 {
        script.push_str(&format!("asset id={} name=A{asset}\n", 10 - asset));
        script.push_str(&format!("deposit account=7 asset={} amount={}\n", 10 - asset, asset * 100));
        script.push_str(&format!("deposit account=3 asset={} amount={}\n", 10 - asset, asset));
    }
    script.push_str("withdraw account=7 asset=9 amount=100\nwithdraw account=3 asset=1 amount=9\nwithdraw account=7 asset=1 amount=901\n");
    let out = events(&script);
    let tail: Vec<&str> = out.lines().rev().take(5).collect();
    assert_eq!(
        tail,
        [
            "32 rejected reason=insufficient_funds",
            "31 balance account=3 asset=1 available=0 locked=0",
            "31 withdrawn account=3 asset=1 amount=9",
            "30 balance account=7 asset=9 available=0 locked=0",
            "30 withdrawn account=7 asset=9 amount=100",
        ]
    );
}

/// A rejected command emits exactly one event and changes nothing: the
/// same commands with the rejected ones removed give the same events for
/// everything else.
#[test]
fn rejected_commands_leave_no_trace() {
    let setup = "\
asset id=1 name=B
asset id=2 name=Q
instrument id=1 symbol=B-Q base=1 quote=2 tick_size=1 lot_size=1 min_qty=1 max_qty=100 min_price=1 max_price=1000 maker_bps=0 taker_bps=10
open account=1
open account=2
deposit account=1 asset=2 amount=1000
deposit account=2 asset=1 amount=10
place account=2 instrument=1 cid=1 side=sell type=limit tif=gtc price=50 qty=10
";
    let rejected = "\
place account=1 instrument=1 cid=1 side=buy type=limit tif=gtc price=100 qty=10
place account=1 instrument=1 cid=2 side=buy type=limit tif=fok price=50 qty=11
place account=1 instrument=1 cid=3 side=buy type=limit tif=gtc price=50 qty=5 post_only=1
replace account=1 order=8 price=49 qty=5
cancel account=1 order=8
withdraw account=1 asset=2 amount=1001
";
    let after = "place account=1 instrument=1 cid=1 side=buy type=limit tif=ioc price=50 qty=3\n";
    let with = events(&format!("{setup}{rejected}{after}"));
    let without = events(&format!("{setup}{after}"));
    let rejects: Vec<&str> = with.lines().filter(|l| l.contains(" rejected ")).collect();
    assert_eq!(
        rejects,
        [
            "9 rejected reason=insufficient_funds",
            "10 rejected reason=fok_cannot_fill",
            "11 rejected reason=post_only_would_take",
            "12 rejected reason=not_owner",
            "13 rejected reason=not_owner",
            "14 rejected reason=insufficient_funds",
        ]
    );
    // The rest is the same in both runs, but for sequence numbers and the
    // id of the last order (its sequence number).
    let normalise = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| !l.contains(" rejected "))
            .map(|l| {
                l.split(' ')
                    .skip(1)
                    .filter(|t| !t.starts_with("order=") && !t.starts_with("taker="))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect()
    };
    assert_eq!(normalise(&with), normalise(&without));
}

/// An account's open orders, and the cancels of `cancel_all`, come oldest
/// first (`docs/engine.md`), whatever the client ids: the account's table
/// keeps them by client id, so ids chosen to scatter across its buckets,
/// through several of its doublings and with holes cancelled in between,
/// must still come back in order-id order.
#[test]
fn open_orders_and_cancel_all_go_oldest_first() {
    let mut script = String::from(
        "\
asset id=1 name=B
asset id=2 name=Q
instrument id=1 symbol=B-Q base=1 quote=2 tick_size=1 lot_size=1 min_qty=1 max_qty=100 min_price=1 max_price=1000 maker_bps=0 taker_bps=10
open account=1
deposit account=1 asset=2 amount=1000000
",
    );
    // Orders are numbered by the command that placed them: 6 onwards.
    let mut open = Vec::new();
    for i in 0..60u64 {
        let cid = (i * 7_919) % 1_000 + 1;
        script.push_str(&format!("place account=1 instrument=1 cid={cid} side=buy type=limit tif=gtc price={} qty=1\n", 1 + i % 9));
        open.push(6 + i * 2);
        // Every third order is cancelled at once, leaving holes.
        if i % 3 == 0 {
            script.push_str(&format!("cancel account=1 order={}\n", 6 + i * 2));
            open.pop();
        } else {
            script.push_str("deposit account=1 asset=2 amount=1\n");
        }
    }
    let commands = crossbook_text::parse_commands(&script).unwrap();
    let mut engine = crossbook_engine::Engine::new();
    let mut events = Vec::new();
    for command in &commands {
        engine.apply(command, &mut events);
    }
    let listed: Vec<u64> = engine.open_orders_of(1, None).iter().map(|o| o.id).collect();
    assert_eq!(listed, open, "open orders");
    events.clear();
    engine.apply(&crossbook_engine::Command::CancelAll { account: 1, instrument: None }, &mut events);
    let cancelled: Vec<u64> = events
        .iter()
        .filter_map(|e| match e.kind {
            crossbook_engine::EventKind::Cancelled { order, .. } => Some(order),
            _ => None,
        })
        .collect();
    assert_eq!(cancelled, open, "cancel_all's cancels");
    assert!(engine.open_orders_of(1, None).is_empty());
}
