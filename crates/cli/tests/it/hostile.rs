//! `crossbook serve` against hostile and careless clients: idle
//! connections cannot keep traders out of either port, another account's
//! orders cannot be told from orders that do not exist, a session whose
//! connection just closed never blocks its own login, every CancelAll is
//! answered, and a Day order is refused rather than kept forever.

use crate::fix::{FixClient, expect, now_ms, order, send_owned};
use crate::serve::{CONFIG, Client, limit, spawn_with};
use crate::support::TempDir;
use crossbook_engine::{Side, TimeInForce};
use crossbook_protocol::*;
use std::net::TcpStream;
use std::time::{Duration, Instant};

fn start(dir: &std::path::Path, limits: &str) -> crate::serve::Server {
    let config = dir.join("crossbook.toml");
    let text = CONFIG.replacen("snapshot_every = 0\n", &format!("snapshot_every = 0\n\n[limits]\n{limits}\n"), 1);
    std::fs::write(&config, text).unwrap();
    spawn_with(&["--config", config.to_str().unwrap(), "--data", dir.join("data").to_str().unwrap()], &[])
}

/// 200 idle sockets held open on each port: a trader still connects, logs
/// in and trades on both, and the log stays short.
#[test]
fn idle_connections_never_keep_a_trader_out() {
    let dir = TempDir::new("lockout");
    let server = start(&dir.0, "max_connections = 8");
    let idle: Vec<TcpStream> = (0..200).flat_map(|_| [TcpStream::connect(&server.address).unwrap(), TcpStream::connect(&server.fix_address).unwrap()]).collect();
    // Let the server take them all in.
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let (mut alice, reply) = Client::login(&server.address, 1, "alice");
    assert!(matches!(reply, ServerMessage::LoginAccepted { .. }), "{reply:?}");
    alice.send(&limit(1, Side::Buy, 90, 1, TimeInForce::Gtc));
    match alice.recv() {
        Some(ServerMessage::ExecutionReport(report)) => assert_eq!(report.kind, ReportKind::Accepted),
        other => panic!("{other:?}"),
    }
    let mut bob = FixClient::connect(&server.fix_address, "BOB");
    bob.logon(2, "bob");
    send_owned(&mut bob, "D", &order("B1", "2", "110", "1"));
    expect(&bob.next(), &[(35, "8"), (150, "0"), (11, "B1")]);
    eprintln!("with 400 idle connections open, a binary login, an order, a FIX logon and an order took {} ms", started.elapsed().as_millis());
    // The log's one-second window closes with a count of what it left out.
    std::thread::sleep(Duration::from_millis(1_200));
    drop(idle);
    let (_, log) = server.terminate_with_log();
    let evictions = log.iter().filter(|l| l.contains("waiting to log")).count();
    assert!(evictions <= 40, "{evictions} eviction lines: the flood is rate-limited");
    assert!(log.iter().any(|l| l.contains("more") && l.contains("lines in the last")), "a summary of the lines left out");
}

/// A session that sends heartbeats (answered at once, not through the
/// sequencer) and never reads is dropped once its unread answers pass the
/// output bound, as one that does not read its reports is; the venue goes on.
#[test]
fn a_session_that_asks_and_never_reads_is_dropped() {
    let dir = TempDir::new("never-reads");
    let server = start(&dir.0, "");
    let (mut mallory, _) = Client::login(&server.address, 3, "mallory");
    mallory.stream().set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut chunk = Vec::new();
    while chunk.len() < 64 << 10 {
        encode_client(&ClientMessage::Heartbeat, &mut chunk);
    }
    // 16 MiB of answers and the sockets' buffers: far less than 256 MiB.
    let sent = (0..4096).take_while(|_| mallory.send_bytes(&chunk).is_ok()).count();
    assert!(sent < 4096, "the server kept reading {} MiB of heartbeats without their answers being read", (sent * chunk.len()) >> 20);
    let (mut alice, reply) = Client::login(&server.address, 1, "alice");
    assert!(matches!(reply, ServerMessage::LoginAccepted { .. }), "{reply:?}");
    alice.send(&limit(1, Side::Buy, 90, 1, TimeInForce::Gtc));
    assert_eq!(alice.report().kind, ReportKind::Accepted);
    server.expect_log("dropping session of account 3: it does not read its reports");
}

/// A connection that does not log in in time is told so and closed.
#[test]
fn a_connection_that_never_logs_in_is_closed() {
    let dir = TempDir::new("login-timeout");
    let server = start(&dir.0, "login_timeout_s = 1");
    let mut idle = Client::connect(&server.address);
    assert_eq!(idle.recv(), Some(ServerMessage::Error { reason: ProtocolError::LoginTimeout }));
    assert_eq!(idle.recv(), None);
    let mut fix = FixClient::connect(&server.fix_address, "IDLE");
    assert!(fix.closed(), "the FIX port closes a connection without a Logon too");
    server.expect_log("no Logon within 1 s");
}

/// Logged-in sessions per port are bounded by `max_connections`; a login
/// past it is refused with `server_busy`.
#[test]
fn sessions_past_the_limit_are_refused_at_login() {
    let dir = TempDir::new("session-limit");
    let server = start(&dir.0, "max_connections = 1");
    let (_alice, reply) = Client::login(&server.address, 1, "alice");
    assert!(matches!(reply, ServerMessage::LoginAccepted { .. }));
    let (_, reply) = Client::login(&server.address, 2, "bob");
    assert_eq!(reply, ServerMessage::LoginRejected { reason: ProtocolError::ServerBusy });
    let mut first = FixClient::connect(&server.fix_address, "ONE");
    first.logon(2, "bob");
    let mut second = FixClient::connect(&server.fix_address, "TWO");
    second.send("A", &[(98, "0"), (108, "30"), (553, "3"), (554, "mallory")]);
    assert!(second.closed(), "a second FIX session past the limit is closed");
    server.expect_log("limits.max_connections");
}

/// Cancelling or replacing another account's order gets exactly the answer
/// an order that does not exist gets, on both protocols.
#[test]
fn another_accounts_order_looks_like_no_order_at_all() {
    let dir = TempDir::new("oracle");
    let server = start(&dir.0, "");
    let (mut alice, _) = Client::login(&server.address, 1, "alice");
    alice.send(&limit(1, Side::Buy, 90, 1, TimeInForce::Gtc));
    let ServerMessage::ExecutionReport(accepted) = alice.recv().unwrap() else { panic!() };
    let (mut mallory, _) = Client::login(&server.address, 3, "mallory");
    let missing = accepted.order + 1_000;
    let mut answers = Vec::new();
    for message in [
        ClientMessage::Cancel { order: accepted.order },
        ClientMessage::Cancel { order: missing },
        ClientMessage::Replace { order: accepted.order, price: 91, qty: 1 },
        ClientMessage::Replace { order: missing, price: 91, qty: 1 },
    ] {
        mallory.send(&message);
        let Some(ServerMessage::ExecutionReport(mut report)) = mallory.recv() else { panic!() };
        // The order id is the one asked about, and the numbering moves on;
        // nothing else may differ.
        report.order = 0;
        report.seq = 0;
        answers.push(report);
    }
    assert_eq!(answers[0], answers[1], "cancel: someone else's order vs none");
    assert_eq!(answers[2], answers[3], "replace: someone else's order vs none");
    assert_eq!(answers[0].reason, crossbook_engine::RejectReason::UnknownOrder.code());
    // FIX: an OrigClOrdID another account uses, and one nobody uses.
    let mut bob = FixClient::connect(&server.fix_address, "BOB");
    bob.logon(2, "bob");
    send_owned(&mut bob, "D", &order("SHARED", "2", "200", "1"));
    let new = bob.next();
    expect(&new, &[(150, "0")]);
    let bobs_order = new.text(37).expect("OrderID").to_owned();
    let no_order = (bobs_order.parse::<u64>().unwrap() + 1_000).to_string();
    let mut eve = FixClient::connect(&server.fix_address, "EVE");
    eve.logon(3, "mallory");
    let mut texts = Vec::new();
    for orig in ["SHARED", "NOBODY"] {
        eve.send("F", &[(11, &format!("C-{orig}")), (41, orig), (54, "2"), (55, "BTC-USD"), (60, &crossbook_fix::time::format_timestamp(now_ms()))]);
        let reply = eve.next();
        expect(&reply, &[(35, "9"), (102, "1")]);
        texts.push((reply.text(58).map(str::to_owned), reply.text(39).map(str::to_owned)));
    }
    assert_eq!(texts[0], texts[1], "FIX: another account's ClOrdID vs none");
    // By OrderID (37): cancel, replace without Price (the gateway would
    // take it from an order it knows), replace with one. Each answer for
    // bob's order must be the answer for an order nobody has.
    let now = crossbook_fix::time::format_timestamp(now_ms());
    let mut answer = |msg_type: &str, order_id: &str, price: Option<&str>, n: usize| {
        let cl = format!("E-{msg_type}-{n}");
        let mut fields: Vec<(u32, &str)> = vec![(11, &cl), (41, "NOT-MINE"), (37, order_id), (54, "2"), (55, "BTC-USD"), (60, &now)];
        if msg_type == "G" {
            fields.extend([(38, "1"), (40, "2")]);
            if let Some(price) = price {
                fields.push((44, price));
            }
        }
        eve.send(msg_type, &fields);
        let reply = eve.next();
        expect(&reply, &[(35, "9")]);
        [58, 102, 39, 434].map(|tag| reply.text(tag).map(str::to_owned))
    };
    for (n, (msg_type, price)) in [("F", None), ("G", None), ("G", Some("201"))].into_iter().enumerate() {
        let theirs = answer(msg_type, &bobs_order, price, 2 * n);
        let nobodys = answer(msg_type, &no_order, price, 2 * n + 1);
        assert_eq!(theirs, nobodys, "FIX {msg_type} by OrderID (Price {price:?}): another account's order vs none");
    }
}

/// A client that closes its connection and logs in again at once is never
/// refused as `already_logged_in`.
#[test]
fn a_session_whose_connection_closed_never_blocks_its_relogin() {
    let dir = TempDir::new("relogin");
    let server = start(&dir.0, "");
    for round in 0..100 {
        let (client, reply) = Client::login(&server.address, 1, "alice");
        assert!(matches!(reply, ServerMessage::LoginAccepted { .. }), "round {round}: {reply:?}");
        drop(client);
    }
    for round in 0..20 {
        // Each connection starts the sequence numbers over (141=Y): this
        // client keeps none between connections.
        let mut fix = FixClient::connect(&server.fix_address, "ALICE");
        fix.send("A", &[(98, "0"), (108, "30"), (141, "Y"), (553, "1"), (554, "alice")]);
        let reply = fix.next();
        assert_eq!(reply.msg_type(), b"A", "round {round}: {}", crossbook_fix::wire::printable(reply.raw()));
        drop(fix);
    }
    // A live session still blocks a second one.
    let (_first, _) = Client::login(&server.address, 2, "bob");
    let (_, reply) = Client::login(&server.address, 2, "bob");
    assert_eq!(reply, ServerMessage::LoginRejected { reason: ProtocolError::AlreadyLoggedIn });
}

/// Every CancelAll is answered with the number of orders it cancelled,
/// none open included.
#[test]
fn every_cancel_all_is_answered_with_its_count() {
    let dir = TempDir::new("cancel-all");
    let server = start(&dir.0, "");
    let (mut alice, _) = Client::login(&server.address, 1, "alice");
    alice.send(&ClientMessage::CancelAll { instrument: None });
    let Some(ServerMessage::ExecutionReport(done)) = alice.recv() else { panic!() };
    assert_eq!((done.kind, done.last_qty, done.instrument), (ReportKind::CancelAllDone, 0, 0));
    assert!(done.seq > 0, "numbered and replayed like every report");
    for cid in 1..=2 {
        alice.send(&limit(cid, Side::Buy, 90, 1, TimeInForce::Gtc));
        let _ = alice.recv();
    }
    alice.send(&ClientMessage::CancelAll { instrument: Some(1) });
    let kinds: Vec<(ReportKind, u64)> = (0..3)
        .map(|_| match alice.recv() {
            Some(ServerMessage::ExecutionReport(r)) => (r.kind, r.last_qty),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(kinds, vec![(ReportKind::Cancelled, 0), (ReportKind::Cancelled, 0), (ReportKind::CancelAllDone, 2)]);
}

/// TimeInForce 0 (Day) is refused: the venue has no trading day to end it.
#[test]
fn a_day_order_is_refused_with_a_reason() {
    let dir = TempDir::new("day");
    let server = start(&dir.0, "");
    let mut bob = FixClient::connect(&server.fix_address, "BOB");
    bob.logon(2, "bob");
    let mut day = order("D1", "1", "100", "1");
    for field in day.iter_mut().filter(|(tag, _)| *tag == 59) {
        field.1 = "0".into();
    }
    send_owned(&mut bob, "D", &day);
    let reply = bob.next();
    expect(&reply, &[(35, "8"), (150, "8"), (11, "D1")]);
    assert!(reply.text(58).is_some_and(|t| t.contains("Day")), "{:?}", reply.text(58));
    // A Side FIX defines and the venue does not take (3, buy minus): the
    // reject says the Side sent, not another.
    let mut minus = order("D2", "1", "100", "1");
    for field in minus.iter_mut().filter(|(tag, _)| *tag == 54) {
        field.1 = "3".into();
    }
    send_owned(&mut bob, "D", &minus);
    let reply = bob.next();
    expect(&reply, &[(35, "8"), (150, "8"), (11, "D2"), (54, "3")]);
}

/// Careless command lines: every tool refuses a value it cannot use with
/// a message naming it, never a panic (exit 101) or an abort: exit 2 for a
/// value no run could use (as for what clap cannot parse), 1 for a run
/// that failed (a server that did not answer, a file it could not read);
/// a tool whose output pipe closes ends quietly.
#[test]
fn the_tools_refuse_what_they_cannot_use_with_a_message() {
    let dir = TempDir::new("careless");
    let flow = dir.0.join("flow");
    std::fs::create_dir_all(&flow).unwrap();
    std::fs::write(flow.join("commands.csv.gz"), b"x").unwrap();
    let flow = flow.to_str().unwrap().to_string();
    let journal = dir.0.join("journal").to_str().unwrap().to_string();
    let empty = dir.0.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let empty = empty.to_str().unwrap().to_string();
    let cases: Vec<(Vec<&str>, &str, i32)> = vec![
        (vec!["load", "--rate", "inf", "--duration", "1"], "--rate must be", 2),
        (vec!["load", "--rate", "0", "--duration", "1"], "--rate must be", 2),
        (vec!["load", "--duration", "1e20"], "--duration must be", 2),
        (vec!["load", "--duration=-1"], "--duration must be", 2),
        (vec!["load", "--window", "0"], "--window must be 1 to 65536", 2),
        (vec!["load", "--window", "1000000000"], "--window must be 1 to 65536", 2),
        (vec!["load", "--count", "0"], "--count must be at least 1", 2),
        (vec!["load", "--address", "127.0.0.1:99999"], "--address must be host:port", 2),
        (vec!["watch", "--address", "127.0.0.1:99999"], "--address must be host:port", 2),
        (vec!["watch", "--connections", "0"], "nothing to watch", 2),
        (vec!["watch", "--streams", ","], "--streams names no stream", 2),
        (vec!["load", "--first-account", "0"], "--first-account must be at least 1", 2),
        (vec!["watch", "--duration", "NaN"], "--duration must be", 2),
        (vec!["order", "--timeout", "inf", "balances"], "--timeout must be", 2),
        (vec!["order", "--linger", "1e30", "balances"], "--linger must be", 2),
        (vec!["order", "--timeout", "0", "balances"], "--timeout must be a number of seconds from 0.001 to 31536000", 2),
        (vec!["order", "--timeout", "-1", "balances"], "--timeout must be a number of seconds from 0.001 to 31536000", 2),
        (vec!["order", "--timeout", "1e-12", "balances"], "--timeout must be a number of seconds from 0.001 to 31536000", 2),
        // A budget of 0 would go out as "no budget" (0 on the wire).
        (vec!["order", "place", "--side", "buy", "--type", "market", "--qty", "1", "--budget", "0"], "--budget must be at least 1", 2),
        // A key past the Login's 32 bytes would be cut, not refused.
        (vec!["order", "--key", "0123456789abcdef0123456789abcdefX", "balances"], "--key must be 1 to 32 bytes", 2),
        (vec!["order", "place", "--instrument", "0", "--side", "buy", "--price", "1", "--qty", "1"], "--instrument must be at least 1", 2),
        (vec!["order", "place", "--side", "up", "--price", "1", "--qty", "1"], "--side must be buy or sell", 2),
        (vec!["order", "place", "--side", "buy", "--price", "1", "--qty", "1", "--stp", "bogus"], "--stp must be", 2),
        (vec!["order", "--address", "nonsense", "balances"], "--address must be host:port", 2),
        (vec!["order", "--address", "127.0.0.1:1", "balances"], "logging in to 127.0.0.1:1", 1),
        (vec!["load", "--duration", "0"], "--duration must be a number of seconds from 0.001 to 31536000", 2),
        (vec!["load", "--connections", "17"], "--connections must be 1 to 16, not 17", 2),
        (vec!["load", "--first-account", "15", "--connections", "4"], "--connections must be 1 to 2, not 4", 2),
        (vec!["load", "--protocol", "rest", "--address", "bad"], "(127.0.0.1:7702, say)", 2),
        (vec!["watch", "--connections", "100000"], "--connections must be 0 to 10000, not 100000", 2),
        (vec!["watch", "--connections", "0", "--depth-clients", "100000"], "--depth-clients must be 0 to 1000, not 100000", 2),
        (vec!["watch", "--duration", "-1"], "--duration must be a number of seconds from 0.001 to 31536000", 2),
        (vec!["journal", "inspect", &empty], "holds no journal", 1),
        (vec!["load", "--connections", "0"], "--connections must be at least 1", 2),
        (vec!["load", "--protocol", "fix", "--last-seen-out", &journal], "--last-seen-out is for the binary protocol", 1),
        (vec!["load", "--acked-out", "/nowhere/acked.txt"], "writing /nowhere/acked.txt", 1),
        (vec!["bench", "--commands", "0"], "--commands must be 1 to 100000000", 2),
        (vec!["bench", "--commands", "18446744073709551615"], "--commands must be 1 to 100000000", 2),
        (vec!["bench", "--passes", "0"], "--passes must be at least 1", 2),
        (vec!["bench", "--compare", "x.json", "--commands", "5"], "cannot be used with", 2),
        (vec!["run", "--commands", "/nowhere.txt", "--check", "--journal", &journal], "cannot be used with", 2),
        (vec!["run", "--commands", "/nowhere.txt", "--durability", "async"], "--journal", 2),
        (vec!["bench", "--workload", "steady-deep", "--flow", "/nowhere"], "--flow is for --workload exchange-core-single", 2),
        (vec!["compat", "exchange-core", &flow], "reading", 1),
        (vec!["run", "--commands", "/nowhere.txt", "--journal", &journal, "--segment-bytes", "0"], "--segment-bytes must be 4096 to 1099511627776, not 0", 2),
        (vec!["serve", "--listen", "nonsense", "--data", &journal], "listen \"nonsense\" is not an address", 1),
        (vec!["serve", "--market-listen", "127.0.0.1:99999", "--data", &journal], "market_data.listen \"127.0.0.1:99999\" is not an address", 1),
    ];
    for (args, said, code) in cases {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_crossbook")).args(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(code), "{args:?}: {stderr}");
        // Ours say `crossbook: `; the argument parser's own, `error: `.
        assert!((stderr.starts_with("crossbook: ") || stderr.starts_with("error: ")) && stderr.contains(said) && !stderr.contains("panicked"), "{args:?}: {stderr}");
    }
    assert!(!dir.0.join("journal").exists(), "refused before anything was written");
    // Its reader gone after one line, `gen` stops at once, quietly.
    let mut generator = std::process::Command::new(env!("CARGO_BIN_EXE_crossbook"))
        .args(["gen", "--workload", "steady-deep", "--commands", "1000000"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 1];
    std::io::Read::read_exact(generator.stdout.as_mut().unwrap(), &mut first).unwrap();
    drop(generator.stdout.take());
    let output = generator.wait_with_output().unwrap();
    assert!(!String::from_utf8_lossy(&output.stderr).contains("panicked"), "{}", String::from_utf8_lossy(&output.stderr));
}
