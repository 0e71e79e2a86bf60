//! A restart's cost is bounded by `history_commands`, not by the length of
//! the journal: the gateways' state (report numbering, the FIX book) comes
//! from the checkpoints kept in a snapshot that far back, and only the
//! journal after it is re-read. What it rebuilds must be exactly what a
//! replay of the whole journal rebuilds.

use crate::fix::{FixClient, expect, now_ms, order, send_owned};
use crate::serve::{CONFIG, Client, Server, limit, spawn_with};
use crate::support::TempDir;
use crossbook_engine::{Side, TimeInForce};
use crossbook_protocol::*;
use std::collections::BTreeMap;
use std::path::Path;

/// Report frames by sequence number.
type Frames = BTreeMap<u64, Vec<u8>>;

fn frame_of(report: ExecutionReport) -> Vec<u8> {
    let mut frame = Vec::new();
    encode_server(&ServerMessage::ExecutionReport(report), &mut frame);
    frame
}

fn write_config(dir: &Path, name: &str, history_commands: u64) -> String {
    let path = dir.join(name);
    let text = CONFIG.replace("snapshot_every = 0", &format!("snapshot_every = 40\nhistory_commands = {history_commands}"));
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

fn start(config: &str, data: &Path) -> Server {
    spawn_with(&["--config", config, "--data", data.to_str().unwrap()], &[])
}

/// Logs in with `last_seen` 0; `next_seq` and every report replayed.
fn replayed(server: &Server, account: u64, key: &str) -> (Client, u64, Frames) {
    let (client, reply) = crossbook_client::binary::Client::login(&server.address, account, key, 0).unwrap();
    let mut client = Client(client);
    let ServerMessage::LoginAccepted { next_seq, .. } = reply else { panic!("login answered {reply:?}") };
    let mut frames = Frames::new();
    // The replay ends where numbering goes on: a heartbeat's answer comes
    // after every replayed report.
    client.send(&ClientMessage::Heartbeat);
    loop {
        match client.recv() {
            Some(ServerMessage::ExecutionReport(report)) => {
                frames.insert(report.seq, frame_of(report));
            }
            Some(ServerMessage::Heartbeat) => break,
            other => panic!("replay interrupted by {other:?}"),
        }
    }
    (client, next_seq, frames)
}

/// The `rebuilt ...` start-up line: from which checkpoint (0: the journal's
/// start) and how many commands were re-read.
fn rebuilt(server: &Server) -> (u64, u64) {
    let line = server.startup.iter().find(|l| l.starts_with("rebuilt ")).unwrap_or_else(|| panic!("{:?}", server.startup));
    let from = line.split("checkpoints at seq ").nth(1).and_then(|rest| rest.split(',').next()).map_or(0, |n| n.parse().unwrap());
    let commands = line.split(", ").find_map(|part| part.strip_suffix(" commands re-read")).and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{line}"));
    (from, commands)
}

fn recovered_seq(server: &Server) -> u64 {
    server.startup.iter().find_map(|l| l.strip_prefix("recovered seq ")?.split_whitespace().next()?.parse().ok()).expect("a recovered line")
}

#[test]
fn a_restart_rebuilds_from_the_gateways_checkpoints_what_a_whole_replay_rebuilds() {
    let work = TempDir::new("restart-window");
    let data = work.0.join("data");
    let window = write_config(&work.0, "window.toml", 150);
    let whole = write_config(&work.0, "whole.toml", 1 << 40);

    // First lifetime: a FIX order rests early on (long before any
    // checkpoint a restart will start from), then the binary accounts
    // trade for a while; it ends with kill -9.
    let server = start(&window, &data);
    let mut mallory = FixClient::connect(&server.fix_address, "MALLORY");
    mallory.logon(3, "mallory");
    send_owned(&mut mallory, "D", &order("EARLY", "1", "1", "10"));
    expect(&mallory.next(), &[(150, "0"), (11, "EARLY")]);
    let (mut alice, _) = Client::login(&server.address, 1, "alice");
    let (mut bob, _) = Client::login(&server.address, 2, "bob");
    let mut seen = Frames::new();
    // Each order is journaled before the next is sent (its Accepted
    // report is back), so alice's reports come in journal order.
    let take = |client: &mut Client, cid: u64, seen: Option<&mut Frames>| {
        let mut seen = seen;
        loop {
            match client.recv() {
                Some(ServerMessage::ExecutionReport(report)) => {
                    if let Some(seen) = seen.as_deref_mut() {
                        seen.insert(report.seq, frame_of(report));
                    }
                    if report.kind == ReportKind::Accepted && report.cid == cid {
                        return;
                    }
                }
                other => panic!("got {other:?}"),
            }
        }
    };
    for i in 0..300u64 {
        let price = 100 + (i % 7) as i64;
        alice.send(&limit(i + 1, Side::Sell, price, 1 + i % 3, TimeInForce::Gtc));
        take(&mut alice, i + 1, Some(&mut seen));
        bob.send(&limit(i + 1, Side::Buy, price, 1 + i % 2, TimeInForce::Gtc));
        take(&mut bob, i + 1, None);
    }
    // A last order of alice's: every fill of hers comes before it.
    alice.send(&limit(1_000, Side::Buy, 2, 1, TimeInForce::Gtc));
    take(&mut alice, 1_000, Some(&mut seen));
    server.kill();

    // Second lifetime: the gateways start from a checkpoint at least 150
    // commands before the end, and re-read only what follows it.
    let server = start(&window, &data);
    let end = recovered_seq(&server);
    let (from, commands) = rebuilt(&server);
    assert!(from > 0 && from + 150 <= end && from + 2 * 150 + 2 * 40 >= end, "checkpoint at {from} for a journal ending at {end}");
    assert_eq!(commands, end - from);
    let (_alice, next_seq, window_replay) = replayed(&server, 1, "alice");
    assert_eq!(next_seq, seen.keys().last().unwrap() + 1, "numbering goes on where it was");
    assert!(window_replay.keys().next().is_some_and(|first| *first > 1), "only the window is kept");
    for (seq, frame) in &window_replay {
        assert_eq!(seen.get(seq), Some(frame), "report {seq} replayed with other bytes");
    }
    assert_eq!(window_replay.keys().last(), seen.keys().last());
    // The FIX book came from the checkpoint: the early order is known by
    // its ClOrdID.
    let mut mallory = FixClient::connect(&server.fix_address, "MALLORY");
    mallory.send("A", &[(98, "0"), (108, "30"), (141, "Y"), (553, "3"), (554, "mallory")]);
    assert_eq!(mallory.next().msg_type(), b"A");
    mallory.send("F", &[(11, "C-EARLY"), (41, "EARLY"), (54, "1"), (55, "BTC-USD"), (60, &crossbook_fix::time::format_timestamp(now_ms()))]);
    expect(&mallory.next(), &[(35, "8"), (150, "4"), (11, "C-EARLY"), (41, "EARLY")]);
    assert!(server.terminate().success());

    // The checkpoint's snapshot damaged (a flipped byte in its middle): the
    // next start passes over it to an older one (or the journal's start),
    // rebuilds the same reports, and sets it aside, so that the start after
    // does not meet it again.
    let snapshot = data.join(crossbook_journal::format::snapshot_name(from));
    let mut bytes = std::fs::read(&snapshot).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x10;
    std::fs::write(&snapshot, &bytes).unwrap();
    let server = start(&window, &data);
    let warning = server.startup.iter().find(|l| l.contains("report histories not rebuilt from")).unwrap_or_else(|| panic!("{:#?}", server.startup));
    assert!(warning.contains("set aside as"), "{warning}");
    assert!(!snapshot.exists() && rebuilt(&server).0 < from, "{:#?}", server.startup);
    let (_alice, again, replay) = replayed(&server, 1, "alice");
    assert_eq!(again, next_seq);
    for (seq, frame) in &replay {
        assert_eq!(seen.get(seq), Some(frame), "report {seq} replayed with other bytes");
    }
    assert!(server.terminate().success());
    let server = start(&window, &data);
    assert!(!server.startup.iter().any(|l| l.contains("report histories not rebuilt from")), "{:#?}", server.startup);
    assert!(server.terminate().success());

    // Third lifetime, keeping every report: the whole journal is re-read,
    // and the window's reports are the same bytes under the same numbers.
    let server = start(&whole, &data);
    assert_eq!(rebuilt(&server).0, 0, "{:?}", server.startup);
    let (_alice, again, whole_replay) = replayed(&server, 1, "alice");
    assert_eq!(again, next_seq);
    assert_eq!(whole_replay, seen, "the whole replay is every report alice saw");
    for (seq, frame) in &window_replay {
        assert_eq!(whole_replay.get(seq), Some(frame), "report {seq}");
    }
    assert!(server.terminate().success());
}

/// A venue that has run takes from its configuration, at the next start,
/// what the configuration adds (an asset, an instrument, an account with
/// its starting deposits), journaled like any command; nothing it has is
/// changed (an existing account's balances), a configuration that does not
/// fit the journal (an instrument's fees changed, a new instrument under a
/// symbol the venue has, deposits past an asset's supply limit) is refused
/// before anything is journaled, and a start that finds nothing new adds
/// nothing.
#[test]
fn a_restart_adds_what_the_configuration_adds_and_changes_nothing_the_venue_has() {
    use crate::trading::binary_balances;
    let work = TempDir::new("restart-config");
    let data = work.0.join("data");
    let config = write_config(&work.0, "crossbook.toml", 1 << 20);

    let server = start(&config, &data);
    let (mut alice, _) = Client::login(&server.address, 1, "alice");
    alice.send(&limit(1, Side::Buy, 100, 5, TimeInForce::Gtc));
    assert_eq!(alice.report().kind, ReportKind::Accepted);
    let (alice_before, _) = binary_balances(&mut alice, 1);
    drop(alice);
    assert!(server.terminate().success());

    let grown = std::fs::read_to_string(&config).unwrap()
        + r#"
[[assets]]
id = 3
name = "ETH"

[[instruments]]
id = 2
symbol = "ETH-USD"
base = 3
quote = 2
tick_size = 1
lot_size = 1
min_qty = 1
max_qty = 1000
min_price = 1
max_price = 100000
maker_bps = 0
taker_bps = 0

[[accounts]]
id = 9
api_key = "carol"
deposits = [[3, 40], [2, 5000]]
"#;
    let refused_saying = |text: String, said_why: &str| {
        std::fs::write(&config, text).unwrap();
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_crossbook"))
            .args(["serve", "--config", &config, "--data", data.to_str().unwrap(), "--listen", "127.0.0.1:0", "--fix-listen", "", "--market-listen", ""])
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success() && said.contains(said_why), "{said}");
    };
    let refused = |text: String, why: &str| refused_saying(text, &format!("the configuration does not fit the venue's journal: {why}"));
    let bytes = || std::fs::read_dir(&data).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum::<u64>();
    let journaled = bytes();
    refused(grown.replacen("taker_bps = 0\n", "taker_bps = 7\n", 1), "instrument 1 (BTC-USD): taker_bps 0 in the journal, 7 in the configuration");
    refused(grown.replacen("[[instruments]]\nid = 1\n", "[[instruments]]\nid = 5\n", 1), "new instrument 5 is BTC-USD, as an instrument the venue has");
    // Alone the configuration is fine (it says less for an account the
    // venue has, which is not read again); on the venue, the new deposit
    // would pass the limit.
    let past = grown.replacen("deposits = [[1, 1000], [2, 1000000]]", "deposits = [[1, 1000], [2, 1]]", 1).replace("deposits = [[3, 40], [2, 5000]]", "deposits = [[3, 40], [2, 4611686018426386903]]");
    refused(past, "account 9's deposit of 4611686018426386903 would take asset 2's supply past 2^62");
    // What the venue has stays in the file: left out, a new asset could
    // take its name in another case, and the gateways would not know it.
    let without_usd = grown.replacen("[[assets]]\nid = 2\nname = \"USD\"\n", "", 1);
    assert!(!without_usd.contains("\"USD\""));
    refused(without_usd.clone(), "asset 2 (USD) of the venue is not in the configuration");
    refused(without_usd + "\n[[assets]]\nid = 4\nname = \"usd\"\n", "asset 2 (USD) of the venue is not in the configuration");
    refused(grown.replacen("symbol = \"BTC-USD\"", "symbol = \"BTC-EUR\"", 1), "instrument 1 (BTC-USD): symbol BTC-USD in the journal, BTC-EUR in the configuration");
    // One id twice: the second would be read as the first.
    refused_saying(grown.clone() + "\n[[accounts]]\nid = 2\napi_key = \"other\"\n", "two accounts have id 2");
    assert_eq!(bytes(), journaled, "nothing was written");
    // What the file says of an account the venue has is not read again,
    // not even to try it out (alone, these deposits would pass the limit).
    let grown = grown.replacen("deposits = [[1, 1000], [2, 1000000]]", "deposits = [[1, 1000], [2, 4611686018427387000]]", 1);
    std::fs::write(&config, &grown).unwrap();
    let server = start(&config, &data);
    let startup = server.startup.join("\n");
    assert!(startup.contains("from the configuration: 5 commands adding what the venue lacked"), "{startup}");
    let (mut carol, _) = Client::login(&server.address, 9, "carol");
    let (balances, _) = binary_balances(&mut carol, 1);
    assert_eq!(balances, BTreeMap::from([(1, (0, 0)), (2, (5000, 0)), (3, (40, 0))]), "the new account's deposits, in the new asset too");
    let mut sell = limit(1, Side::Sell, 150, 4, TimeInForce::Gtc);
    if let ClientMessage::NewOrder(order) = &mut sell {
        order.instrument = 2;
    }
    carol.send(&sell);
    let accepted = carol.report();
    assert_eq!((accepted.kind, accepted.instrument), (ReportKind::Accepted, 2), "an order on the new instrument");
    let (mut alice, _) = Client::login(&server.address, 1, "alice");
    assert_eq!(binary_balances(&mut alice, 2).0.get(&2), alice_before.get(&2), "an existing account keeps its balances (and its lock)");
    drop((alice, carol));
    assert!(server.terminate().success());

    // Nothing new: nothing added, and the new account was not funded twice.
    let server = start(&config, &data);
    assert!(!server.startup.iter().any(|line| line.starts_with("from the configuration")), "{:#?}", server.startup);
    let (mut carol, _) = Client::login(&server.address, 9, "carol");
    assert_eq!(binary_balances(&mut carol, 1).0.get(&3), Some(&(36, 4)), "ETH: 4 of 40 locked by the resting sell");
    drop(carol);
    assert!(server.terminate().success());
}
