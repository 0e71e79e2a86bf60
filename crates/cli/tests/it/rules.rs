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
