//! The FIX gateway of `crossbook serve` end to end, over TCP: two accounts
//! log on with their credentials, trade, replace, cancel and mass-cancel,
//! and every ExecutionReport field is checked; malformed input (a bad
//! checksum, a bad body length, garbage between messages, a 10 MB message)
//! gets what FIX asks for and costs only its own session; sequence numbers
//! and missed reports survive a restart.
//!
//! The client here is a few lines over `crossbook_fix`'s codec; the
//! QuickFIX/J interop run (`scripts/fix-interop`) is the third-party check.

use crate::serve::start_default;
use crossbook_fix::time::format_timestamp;
use crossbook_fix::wire::{Message, printable};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub(crate) fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// The FIX initiator of `crossbook-client`, with the test's habits: every
/// failure is a panic with what happened.
pub(crate) struct FixClient(pub(crate) crossbook_client::fix::Initiator);

impl FixClient {
    pub(crate) fn connect(address: &str, comp_id: &str) -> FixClient {
        let mut initiator = crossbook_client::fix::Initiator::connect(address, comp_id).unwrap_or_else(|e| panic!("connecting to {address}: {e}"));
        initiator.set_timeout(Duration::from_secs(10));
        FixClient(initiator)
    }

    pub(crate) fn send(&mut self, msg_type: &str, body: &[(u32, &str)]) {
        self.0.send(msg_type, body).unwrap_or_else(|e| panic!("send: {e}"));
    }

    /// Raw bytes, as a broken or hostile counterparty would send them.
    pub(crate) fn send_bytes(&mut self, bytes: &[u8]) -> Result<(), crossbook_client::ClientError> {
        self.0.send_bytes(bytes)
    }

    /// The next MsgSeqNum this client sends.
    pub(crate) fn next_out(&self) -> u64 {
        self.0.writer.next_out
    }

    /// Its message writer (header, MsgSeqNum), to build a message by hand
    /// or to set the sequence number.
    pub(crate) fn writer(&mut self) -> &mut crossbook_client::fix::Writer {
        &mut self.0.writer
    }

    pub(crate) fn logon(&mut self, account: u64, key: &str) -> Message {
        self.0.logon(account, key, false).unwrap_or_else(|e| panic!("logon as {account}: {e}"))
    }

    /// The next message, or `None` after 10 s (or on close).
    pub(crate) fn recv(&mut self) -> Option<Message> {
        match self.0.recv() {
            Ok(message) => message,
            Err(crossbook_client::ClientError::TimedOut) => None,
            Err(e) => panic!("recv: {e}"),
        }
    }

    /// The next message that is not a Heartbeat.
    pub(crate) fn next(&mut self) -> Message {
        self.0.next_app().unwrap_or_else(|e| panic!("expected a message from the server: {e}"))
    }

    pub(crate) fn closed(&mut self) -> bool {
        self.0.wait_closed().unwrap_or(true)
    }
}

/// Asserts `message` has every `(tag, value)`.
pub(crate) fn expect(message: &Message, fields: &[(u32, &str)]) {
    for (tag, value) in fields {
        assert_eq!(message.text(*tag), Some(*value), "tag {tag} in {}", printable(message.raw()));
    }
}

/// A directory of its own for one test, removed when it is dropped.
fn temp_dir(name: &str) -> crate::support::TempDir {
    crate::support::TempDir::new(&format!("fix-{name}"))
}

pub(crate) fn order(cl_ord_id: &str, side: &str, price: &str, qty: &str) -> Vec<(u32, String)> {
    vec![
        (11, cl_ord_id.into()),
        (21, "1".into()),
        (38, qty.into()),
        (40, "2".into()),
        (44, price.into()),
        (54, side.into()),
        (55, "BTC-USD".into()),
        (59, "1".into()),
        (60, format_timestamp(now_ms())),
    ]
}

pub(crate) fn send_owned(client: &mut FixClient, msg_type: &str, body: &[(u32, String)]) {
    let borrowed: Vec<(u32, &str)> = body.iter().map(|(t, v)| (*t, v.as_str())).collect();
    client.send(msg_type, &borrowed);
}

#[test]
fn two_accounts_trade_replace_cancel_and_mass_cancel_over_fix() {
    let dir = temp_dir("trade");
    let server = start_default(&dir);
    let mut alice = FixClient::connect(&server.fix_address, "ALICE");
    let mut bob = FixClient::connect(&server.fix_address, "BOB");
    expect(&alice.logon(1, "demo-key-1"), &[(34, "1"), (108, "30")]);
    bob.logon(2, "demo-key-2");

    send_owned(&mut alice, "D", &order("A1", "2", "100", "10"));
    let new = alice.next();
    expect(&new, &[(35, "8"), (150, "0"), (39, "0"), (11, "A1"), (14, "0"), (151, "10"), (38, "10"), (44, "100"), (54, "2"), (55, "BTC-USD"), (1, "1")]);
    let alice_order = new.text(37).unwrap().to_owned();

    send_owned(&mut bob, "D", &order("B1", "1", "101", "4"));
    expect(&bob.next(), &[(150, "0"), (39, "0"), (11, "B1")]);
    // Bob takes 4 at Alice's price; taker fee 5 bps of 400 = 0.2, rounded up.
    expect(&bob.next(), &[(150, "F"), (39, "2"), (31, "100"), (32, "4"), (14, "4"), (151, "0"), (6, "100"), (12, "1"), (13, "3")]);
    expect(&alice.next(), &[(150, "F"), (39, "1"), (11, "A1"), (31, "100"), (32, "4"), (14, "4"), (151, "6"), (6, "100"), (37, &alice_order)]);

    let mut replace = order("A2", "2", "102", "8");
    replace.push((41, "A1".into()));
    send_owned(&mut alice, "G", &replace);
    expect(&alice.next(), &[(150, "5"), (39, "1"), (11, "A2"), (41, "A1"), (38, "8"), (44, "102"), (14, "4"), (151, "4"), (37, &alice_order)]);

    send_owned(&mut alice, "F", &[(11, "A3".into()), (41, "A2".into()), (38, "8".into()), (54, "2".into()), (55, "BTC-USD".into()), (60, format_timestamp(now_ms()))]);
    expect(&alice.next(), &[(150, "4"), (39, "4"), (11, "A3"), (41, "A2"), (14, "4"), (151, "0")]);

    // Bob cannot cancel what is not his: Alice's order id is unknown to him.
    send_owned(&mut bob, "F", &[(11, "B9".into()), (41, "A2".into()), (37, alice_order.clone()), (54, "2".into()), (55, "BTC-USD".into()), (60, format_timestamp(now_ms()))]);
    expect(&bob.next(), &[(35, "9"), (11, "B9"), (434, "1"), (102, "1")]);

    send_owned(&mut bob, "D", &order("B2", "1", "90", "1"));
    send_owned(&mut bob, "D", &order("B3", "1", "91", "1"));
    expect(&bob.next(), &[(150, "0"), (11, "B2")]);
    expect(&bob.next(), &[(150, "0"), (11, "B3")]);
    bob.send("q", &[(11, "B4"), (530, "7"), (60, &format_timestamp(now_ms()))]);
    expect(&bob.next(), &[(150, "4"), (11, "B2")]);
    expect(&bob.next(), &[(150, "4"), (11, "B3")]);
    expect(&bob.next(), &[(35, "r"), (11, "B4"), (530, "7"), (531, "7"), (533, "2")]);
    // A mass cancel sent again with its ClOrdID (a resend after a crash,
    // say) is refused, not run again over orders placed since.
    send_owned(&mut bob, "D", &order("B5", "1", "92", "1"));
    expect(&bob.next(), &[(150, "0"), (11, "B5")]);
    bob.send("q", &[(11, "B4"), (530, "7"), (60, &format_timestamp(now_ms()))]);
    let again = bob.next();
    expect(&again, &[(35, "r"), (11, "B4"), (531, "0")]);
    assert!(again.text(58).is_some_and(|t| t.contains("duplicate ClOrdID")), "{}", printable(again.raw()));
    bob.send("q", &[(11, "B6"), (530, "7"), (60, &format_timestamp(now_ms()))]);
    expect(&bob.next(), &[(150, "4"), (11, "B5")]);
    expect(&bob.next(), &[(35, "r"), (11, "B6"), (531, "7"), (533, "1")]);

    // Prices and quantities are converted exactly or refused with a reason.
    send_owned(&mut alice, "D", &order("A4", "2", "100.5", "1"));
    let refused = alice.next();
    expect(&refused, &[(150, "8"), (39, "8"), (11, "A4")]);
    assert!(refused.text(58).is_some_and(|t| t.contains("not a multiple")), "{}", printable(refused.raw()));
    // An unsupported message type is a BusinessMessageReject.
    alice.send("R", &[(131, "Q1"), (146, "0")]);
    expect(&alice.next(), &[(35, "j"), (372, "R"), (380, "3")]);

    alice.send("5", &[]);
    expect(&alice.next(), &[(35, "5")]);
    assert!(alice.closed());
    server.expect_log("FIX login");
}

/// A cancel or replace sent right behind its NewOrderSingle, before the
/// order's ExecutionReport came back, acts on the order (the sequencer
/// finds it by the client id the gateway sent it with); one behind an
/// order the engine refused finds no order.
#[test]
fn a_cancel_or_replace_sent_before_the_orders_report_acts_on_it() {
    let dir = temp_dir("behind");
    let server = start_default(&dir);
    let mut alice = FixClient::connect(&server.fix_address, "ALICE");
    alice.logon(1, "demo-key-1");
    let transact = format_timestamp(now_ms());
    let cancel = |cl_ord_id: &str, orig: &str| vec![(11, cl_ord_id.to_owned()), (41, orig.to_owned()), (54, "2".to_owned()), (55, "BTC-USD".to_owned()), (60, transact.clone())];

    send_owned(&mut alice, "D", &order("P1", "2", "150", "3"));
    send_owned(&mut alice, "F", &cancel("P2", "P1"));
    let new = alice.next();
    expect(&new, &[(35, "8"), (150, "0"), (11, "P1")]);
    let id = new.text(37).unwrap_or_default().to_owned();
    expect(&alice.next(), &[(35, "8"), (150, "4"), (39, "4"), (11, "P2"), (41, "P1"), (37, &id), (151, "0")]);

    send_owned(&mut alice, "D", &order("R1", "2", "150", "3"));
    let mut replace = order("R2", "2", "149", "2");
    replace.push((41, "R1".into()));
    send_owned(&mut alice, "G", &replace);
    let new = alice.next();
    expect(&new, &[(150, "0"), (11, "R1")]);
    let id = new.text(37).unwrap_or_default().to_owned();
    expect(&alice.next(), &[(150, "5"), (39, "0"), (11, "R2"), (41, "R1"), (37, &id), (38, "2"), (44, "149"), (151, "2")]);

    // Above the instrument's largest quantity: the engine refuses the
    // order, and the cancel behind it finds none.
    send_owned(&mut alice, "D", &order("X1", "2", "150", "99999999"));
    send_owned(&mut alice, "F", &cancel("X2", "X1"));
    expect(&alice.next(), &[(150, "8"), (11, "X1"), (58, "invalid_quantity")]);
    expect(&alice.next(), &[(35, "9"), (11, "X2"), (41, "X1"), (102, "1"), (434, "1"), (37, "NONE")]);

    // A binary order of the same account holding the engine client id the
    // gateway would give its next order (FIX's count up from 2^63: the
    // next is the resting R order's plus two, X1 having taken one): the
    // gateway passes over it, so the order is taken under the number
    // after it, and the cancel behind it acts on that order, not on the
    // binary one.
    let (binary, _) = crossbook_client::binary::Client::login(&server.address, 1, "demo-key-1", u64::MAX).expect("a binary session");
    let mut binary = crate::serve::Client(binary);
    binary.send(&crossbook_protocol::ClientMessage::QueryOpenOrders { request: 1, instrument: None });
    let mut resting_fix = Vec::new();
    loop {
        match binary.recv() {
            Some(crossbook_protocol::ServerMessage::OpenOrder(open)) => resting_fix.push(open.cid),
            Some(crossbook_protocol::ServerMessage::QueryDone { .. }) => break,
            other => panic!("open orders, got {other:?}"),
        }
    }
    assert_eq!(resting_fix.len(), 1, "R's order alone rests");
    let taken = resting_fix[0] + 2;
    binary.send(&crate::serve::limit(taken, crossbook_engine::Side::Sell, 170, 1, crossbook_engine::TimeInForce::Gtc));
    let resting = binary.report();
    assert_eq!((resting.kind, resting.cid), (crossbook_protocol::ReportKind::Accepted, taken));
    // The account's FIX session hears of it too (named by its client id).
    expect(&alice.next(), &[(150, "0"), (11, &taken.to_string())]);
    send_owned(&mut alice, "D", &order("Y1", "2", "150", "3"));
    send_owned(&mut alice, "F", &cancel("Y2", "Y1"));
    expect(&alice.next(), &[(150, "0"), (11, "Y1")]);
    expect(&alice.next(), &[(150, "4"), (39, "4"), (11, "Y2"), (41, "Y1")]);
    let (placed, cancelled) = (binary.report(), binary.report());
    assert_eq!((placed.kind, placed.cid), (crossbook_protocol::ReportKind::Accepted, taken + 1), "Y1 under the number after the binary order's");
    assert_eq!((cancelled.kind, cancelled.cid), (crossbook_protocol::ReportKind::Cancelled, taken + 1));
    let (status, body) = crate::marketdata::http_get(&server.market_address, "/api/v3/depth?symbol=BTCUSD&limit=100");
    assert!(status == 200 && body.contains(r#"["170","1"]"#), "the binary order still rests: {body}");
}

/// An order the open-order limit refuses before the engine, and a cancel
/// sent right behind it: the cancel finds no order, and is answered after
/// the order's refusal.
#[test]
fn a_cancel_behind_an_order_the_limit_refused_is_answered_after_the_refusal() {
    let dir = temp_dir("behind-limit");
    let config = dir.join("crossbook.toml");
    let text = std::fs::read_to_string(crate::support::repo_root().join("crossbook.toml")).unwrap().replacen("open_orders = 100000", "open_orders = 2", 1);
    std::fs::write(&config, text).unwrap();
    let server = crate::serve::spawn_with(&["--listen", "127.0.0.1:0", "--config", config.to_str().unwrap(), "--data", dir.join("data").to_str().unwrap()], &[]);
    let mut alice = FixClient::connect(&server.fix_address, "ALICE");
    alice.logon(1, "demo-key-1");
    for id in ["M1", "M2", "M3"] {
        send_owned(&mut alice, "D", &order(id, "2", "150", "1"));
    }
    send_owned(&mut alice, "F", &[(11, "M4".into()), (41, "M3".into()), (54, "2".into()), (55, "BTC-USD".into()), (60, format_timestamp(now_ms()))]);
    expect(&alice.next(), &[(150, "0"), (11, "M1")]);
    expect(&alice.next(), &[(150, "0"), (11, "M2")]);
    expect(&alice.next(), &[(150, "8"), (11, "M3"), (58, "open order limit reached")]);
    expect(&alice.next(), &[(35, "9"), (11, "M4"), (41, "M3"), (102, "1")]);
}

/// A cancel or replace of the account's own order must say of it what is
/// so (Symbol, Side, a GTC TimeInForce), a replace must bring a ClOrdID no
/// open order has, and a CompID stays the account's its first Logon was.
#[test]
fn what_a_request_says_of_an_order_must_be_so_and_a_compid_stays_its_accounts() {
    let dir = temp_dir("checks");
    let server = start_default(&dir);
    let mut alice = FixClient::connect(&server.fix_address, "ALICE");
    alice.logon(1, "demo-key-1");
    for (id, price) in [("C1", "100"), ("C2", "101")] {
        send_owned(&mut alice, "D", &order(id, "2", price, "5"));
        expect(&alice.next(), &[(150, "0"), (11, id)]);
    }
    let refused = |alice: &mut FixClient, body: Vec<(u32, String)>, reason: &str, text: &str| {
        send_owned(alice, "G", &body);
        let reply = alice.next();
        expect(&reply, &[(35, "9"), (434, "2"), (102, reason), (58, text)]);
        // C1 stays as it is: its OrderID and New, not an unknown order's
        // NONE and Rejected.
        assert!(reply.text(37).is_some_and(|id| id != "NONE" && id.parse::<u64>().is_ok()), "{text}: OrderID {:?}", reply.text(37));
        assert_eq!(reply.text(39), Some("0"), "{text}");
    };
    let replace = |cl_ord_id: &str, change: &[(u32, &str)]| {
        let mut body = order(cl_ord_id, "2", "100", "4");
        body.push((41, "C1".into()));
        for (tag, value) in change {
            body.retain(|(t, _)| t != tag);
            body.push((*tag, (*value).into()));
        }
        body.sort_by_key(|(t, _)| *t);
        body
    };
    refused(&mut alice, replace("C2", &[]), "6", "duplicate ClOrdID: an open or pending order of the account has it");
    refused(&mut alice, replace("C1", &[]), "6", "duplicate ClOrdID: an open or pending order of the account has it");
    refused(&mut alice, replace("C3", &[(55, "ETH-USD")]), "99", "Symbol is not the order's");
    refused(&mut alice, replace("C3", &[(54, "1")]), "99", "Side is not the order's");
    refused(&mut alice, replace("C3", &[(59, "3")]), "99", "an open order is GTC: a replace keeps TimeInForce 1");
    refused(&mut alice, replace("C3", &[(38, "0")]), "99", "OrderQty must be above 0");
    // All of that left the order as it was; a good replace goes through.
    send_owned(&mut alice, "G", &replace("C3", &[]));
    expect(&alice.next(), &[(35, "8"), (150, "5"), (11, "C3"), (41, "C1"), (38, "4")]);
    alice.send("5", &[]);
    expect(&alice.next(), &[(35, "5")]);
    assert!(alice.closed());
    // The CompID is account 1's: account 2's own pair does not log it on.
    let mut mallory = FixClient::connect(&server.fix_address, "ALICE");
    mallory.writer().next_out = alice.next_out();
    match mallory.0.logon(2, "demo-key-2", false) {
        Err(crossbook_client::ClientError::Refused(text)) => assert!(text.contains("Logon refused"), "{text}"),
        other => panic!("a Logon for another account with account 1's CompID: {other:?}"),
    }
}

/// One FIX session per account at a time: a second CompID's Logon for an
/// account another is logged on for is refused with why (its reports
/// would have nowhere sure to go); once that session logs out, the second
/// logs on and the account's reports come to it.
#[test]
fn a_second_comp_id_of_a_logged_on_account_is_refused_until_the_first_leaves() {
    let dir = temp_dir("one-session-per-account");
    let server = start_default(&dir);
    let mut first = FixClient::connect(&server.fix_address, "FIRST1");
    first.logon(1, "demo-key-1");
    let mut second = FixClient::connect(&server.fix_address, "SECOND1");
    match second.0.logon(1, "demo-key-1", false) {
        Err(crossbook_client::ClientError::Refused(text)) => {
            assert!(text.contains("|58=Logon refused: account 1 is logged on as FIRST1 (one FIX session per account at a time)|"), "{text}")
        }
        other => panic!("a second CompID of a logged-on account: {other:?}"),
    }
    // The first was not disturbed.
    send_owned(&mut first, "D", &order("F1", "2", "100", "1"));
    expect(&first.next(), &[(35, "8"), (150, "0"), (11, "F1")]);
    first.send("5", &[]);
    expect(&first.next(), &[(35, "5")]);
    assert!(first.closed());
    let mut second = FixClient::connect(&server.fix_address, "SECOND1");
    second.logon(1, "demo-key-1");
    send_owned(&mut second, "D", &order("S1", "2", "101", "1"));
    expect(&second.next(), &[(35, "8"), (150, "0"), (11, "S1"), (1, "1")]);
}

/// A CompID whose account's key was taken out of the configuration does
/// not log on, whatever Username and Password it brings (there is no
/// password left to check it against).
#[test]
fn a_compid_whose_account_lost_its_key_does_not_log_on() {
    use crate::serve::{CONFIG, start};
    let dir = temp_dir("revoked");
    let server = start(&dir);
    let mut alice = FixClient::connect(&server.fix_address, "ALICEFIX");
    alice.logon(1, "alice");
    alice.send("5", &[]);
    expect(&alice.next(), &[(35, "5")]);
    assert!(alice.closed());
    let next_out = alice.next_out();
    assert!(server.terminate().success());
    // Account 1 loses its key: its entry leaves the configuration.
    let without = CONFIG.replacen("[[accounts]]\nid = 1\napi_key = \"alice\"\ndeposits = [[1, 1000], [2, 1000000]]\n", "", 1);
    assert_ne!(without, CONFIG, "the test's configuration has account 1 as expected");
    std::fs::write(dir.join("crossbook.toml"), &without).unwrap();
    let server = crate::serve::spawn_with(&["--config", dir.join("crossbook.toml").to_str().unwrap(), "--data", dir.join("data").to_str().unwrap()], &[]);
    let mut mallory = FixClient::connect(&server.fix_address, "ALICEFIX");
    mallory.writer().next_out = next_out;
    assert!(mallory.0.logon(2, "bob", false).is_err(), "the CompID of a revoked account logged on");
    server.expect_log("belongs to account 1, which is not in the configuration");
    // Bob's own CompID is fine.
    let mut bob = FixClient::connect(&server.fix_address, "BOBFIX");
    bob.logon(2, "bob");
}

/// A session store is never started afresh by mistake: a CompID file
/// changed to name another CompID, or a store whose header is damaged,
/// stops the server with the file named; an empty store (what a crash left
/// of a store an earlier release made) and a CompID file whose store is
/// gone are said at start.
#[test]
fn a_store_that_lost_its_header_or_its_compid_stops_the_start() {
    let dir = temp_dir("store-damage");
    let server = start_default(&dir);
    let mut alice = FixClient::connect(&server.fix_address, "ALICE");
    alice.logon(1, "demo-key-1");
    alice.send("5", &[]);
    expect(&alice.next(), &[(35, "5")]);
    assert!(server.terminate().success());
    let fix_dir = dir.join("data").join("fix");
    let store = std::fs::read_dir(&fix_dir).unwrap().map(|e| e.unwrap().path()).find(|p| p.extension().is_some_and(|x| x == "fixstore")).unwrap();
    let comp_file = store.with_extension("compid");
    let serve = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_crossbook"))
            .args(["serve", "--listen", "127.0.0.1:0", "--fix-listen", "127.0.0.1:0", "--market-listen", "127.0.0.1:0", "--data", dir.join("data").to_str().unwrap()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
            .wait_with_output()
            .unwrap()
    };
    std::fs::write(&comp_file, "MALLORY").unwrap();
    let output = serve();
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && said.contains("names \"MALLORY\", whose store is named otherwise"), "{said}");
    std::fs::write(&comp_file, "ALICE").unwrap();
    let mut damaged = std::fs::read(&store).unwrap();
    damaged[1] ^= 0x20;
    std::fs::write(&store, &damaged).unwrap();
    let output = serve();
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && said.contains("no store header") && said.contains("move the file away"), "{said}");
    assert_eq!(std::fs::read(&store).unwrap(), damaged, "left as it was");
    std::fs::write(&store, b"").unwrap();
    let server = start_default(&dir);
    assert!(server.startup.iter().any(|l| l.contains("is empty (0 bytes, all zero)") && l.contains("starts again at sequence number 1")), "{:#?}", server.startup);
    assert!(server.terminate().success());
    // The store gone, its CompID file there: said at start.
    std::fs::remove_file(&store).unwrap();
    let server = start_default(&dir);
    assert!(server.startup.iter().any(|l| l.contains("has no store beside it")), "{:#?}", server.startup);
}

#[test]
fn malformed_input_costs_only_its_own_session() {
    let dir = temp_dir("garbage");
    let server = start_default(&dir);
    let mut alice = FixClient::connect(&server.fix_address, "ALICE");
    let mut bob = FixClient::connect(&server.fix_address, "BOB");
    alice.logon(1, "demo-key-1");
    bob.logon(2, "demo-key-2");

    // A bad checksum and a bad body length are garbled: ignored, no Reject,
    // and the sequence number they carried is still expected.
    let mut bad_sum = alice.writer().message("1", &[(112, "X")]);
    let at = bad_sum.len() - 4;
    bad_sum[at] = if bad_sum[at] == b'9' { b'0' } else { bad_sum[at] + 1 };
    alice.send_bytes(&bad_sum).unwrap();
    alice.writer().next_out -= 1;
    let good = Message::parse(&alice.writer().message("1", &[(112, "Y")])).unwrap();
    let length: usize = good.text(9).unwrap().parse().unwrap();
    let short = String::from_utf8(good.raw().to_vec()).unwrap().replacen(&format!("9={length}"), &format!("9={}", length - 5), 1);
    alice.send_bytes(short.as_bytes()).unwrap();
    alice.writer().next_out -= 1;
    // Garbage between messages is skipped.
    alice.send_bytes(b"this is not FIX\x01\x01").unwrap();
    alice.send("1", &[(112, "after-garbage")]);
    expect(&alice.recv().expect("a Heartbeat"), &[(35, "0"), (112, "after-garbage")]);

    // A 10 MB message: refused as soon as its length is read, with a
    // Logout naming why; the connection closes.
    let huge = format!("8=FIX.4.4\x019=10000000\x0135=D\x0134={}\x01", alice.next_out());
    alice.send_bytes(huge.as_bytes()).unwrap();
    let _ = alice.send_bytes(&vec![b'x'; 1 << 20]);
    let logout = alice.next();
    expect(&logout, &[(35, "5")]);
    assert!(logout.text(58).is_some_and(|t| t.contains("longer than")), "{}", printable(logout.raw()));
    assert!(alice.closed());
    server.expect_log("message longer than");

    // Bob never noticed.
    bob.send("1", &[(112, "still-here")]);
    expect(&bob.recv().expect("a Heartbeat"), &[(35, "0"), (112, "still-here")]);
    send_owned(&mut bob, "D", &order("B1", "1", "50", "1"));
    expect(&bob.next(), &[(150, "0"), (11, "B1")]);

    // A wrong password gets a Logout, then the close; names tried with
    // wrong passwords leave no session behind (no store, no file).
    let stores = || std::fs::read_dir(dir.join("data").join("fix")).unwrap().count();
    let before = stores();
    for name in ["MALLORY", "MALLORY2", "MALLORY3"] {
        let mut mallory = FixClient::connect(&server.fix_address, name);
        mallory.send("A", &[(98, "0"), (108, "30"), (553, "3"), (554, "wrong")]);
        let refused = mallory.next();
        expect(&refused, &[(35, "5"), (34, "1"), (58, "Logon refused: bad Username (553) or Password (554)")]);
        assert!(mallory.closed());
        server.expect_log(&format!("first Logon of CompID \"{name}\": Logon refused: bad Username"));
    }
    assert_eq!(stores(), before, "a refused first Logon makes no store");
    // The same name with the right pair logs on, its numbers going on
    // from the refused exchange's (the venue's Logout was its 1).
    let mut mallory = FixClient::connect(&server.fix_address, "MALLORY");
    let logon = mallory.logon(3, "demo-key-3");
    expect(&logon, &[(35, "A"), (34, "2")]);
    mallory.send("5", &[]);
    expect(&mallory.next(), &[(35, "5")]);
    assert!(mallory.closed());
    // An account has at most 16 CompIDs: the 17th is refused, and the
    // ones it has still log on.
    for n in 2..=16 {
        let mut client = FixClient::connect(&server.fix_address, &format!("M{n}"));
        if n == 2 {
            // Username is the account id as a number: `03` is account 3.
            client.send("A", &[(98, "0"), (108, "30"), (553, "03"), (554, "demo-key-3")]);
            expect(&client.next(), &[(35, "A")]);
        } else {
            client.logon(3, "demo-key-3");
        }
        client.send("5", &[]);
        expect(&client.next(), &[(35, "5")]);
        assert!(client.closed());
    }
    let mut seventeenth = FixClient::connect(&server.fix_address, "M17");
    match seventeenth.0.logon(3, "demo-key-3", false) {
        Err(crossbook_client::ClientError::Refused(text)) => assert!(text.contains("|58=Logon refused: account 3 has 16 CompIDs already (log on with one of them)|"), "{text}"),
        other => panic!("a 17th CompID: {other:?}"),
    }
    let mut again = FixClient::connect(&server.fix_address, "M16");
    again.writer().next_out = 3;
    again.logon(3, "demo-key-3");
    drop(server);
}

/// A session dropped for not reading its messages can log on again at
/// once (it is not left looking connected).
#[test]
fn a_session_dropped_for_not_reading_logs_on_again() {
    let dir = temp_dir("slow-reader");
    let server = start_default(&dir);
    let mut alice = FixClient::connect(&server.fix_address, "ALICE");
    alice.logon(1, "demo-key-1");
    // Orders whose ExecutionReports are never read, until the venue drops
    // the session (its writer's queue full behind a full socket).
    let mut sent = 0;
    while sent < 200_000 {
        let order = order(&format!("N{sent}"), "1", "1", "1");
        let borrowed: Vec<(u32, &str)> = order.iter().map(|(t, v)| (*t, v.as_str())).collect();
        if alice.0.send("D", &borrowed).is_err() {
            break;
        }
        sent += 1;
    }
    server.expect_log_within("dropping a counterparty that does not read", Duration::from_secs(30));
    drop(alice);
    let mut again = FixClient::connect(&server.fix_address, "ALICE");
    again.0.logon(1, "demo-key-1", true).unwrap_or_else(|e| panic!("logon after the drop ({sent} orders sent): {e}"));
    drop(server);
}

/// ALICE (account 1) logs on at `next_out`: the first message the venue
/// does not hold as received, which its ResendRequest asks from, or
/// `next_out` if it asks nothing.
fn expected_at_logon(address: &str, next_out: u64) -> u64 {
    let mut alice = FixClient::connect(address, "ALICE");
    alice.writer().next_out = next_out;
    alice.logon(1, "demo-key-1");
    alice.0.set_timeout(Duration::from_secs(2));
    match alice.recv() {
        Some(message) if message.text(35) == Some("2") => message.text(7).and_then(|v| v.parse::<u64>().ok()).expect("BeginSeqNo"),
        _ => next_out,
    }
}

/// kill -9 while a FIX session streams orders: after the restart the
/// venue's store expects the first message whose order the journal does
/// not hold (it asks for it again), never one past an order it lost.
#[test]
fn a_kill_never_loses_fix_orders_the_store_counted_as_received() {
    for round in 0..3u64 {
        let dir = temp_dir(&format!("kill-received-{round}"));
        let server = start_default(&dir);
        let mut alice = FixClient::connect(&server.fix_address, "ALICE");
        alice.logon(1, "demo-key-1");
        const ORDERS: u64 = 1500;
        for i in 0..ORDERS {
            send_owned(&mut alice, "D", &order(&format!("K{i}"), "1", "1", "1"));
        }
        std::thread::sleep(Duration::from_millis(5 + 10 * round));
        server.kill();
        let server = start_default(&dir);
        let expected = expected_at_logon(&server.fix_address, ORDERS + 2);
        let (mut binary, _) = crate::serve::Client::login(&server.address, 1, "demo-key-1");
        let open = open_cids(&mut binary, 1).len() as u64;
        assert!(open >= expected - 2, "round {round}: the store counted messages 2..{} as received, but only {open} orders are in the journal", expected - 1);
        drop(server);
    }
}

/// SIGTERM with a FIX session streaming orders: every order the venue
/// had read is answered, in order, then the session is logged out
/// (Logout `the venue is stopping`), and the process exits 0; after the
/// restart the venue expects exactly the first order it had not read.
#[test]
fn a_stopping_venue_answers_fix_orders_then_logs_the_session_out() {
    let dir = temp_dir("stop-logout");
    let mut server = start_default(&dir);
    let mut alice = FixClient::connect(&server.fix_address, "ALICE");
    alice.logon(1, "demo-key-1");
    const ORDERS: u64 = 400;
    for i in 0..ORDERS {
        send_owned(&mut alice, "D", &order(&format!("S{i}"), "1", "1", "1"));
    }
    expect(&alice.next(), &[(35, "8"), (150, "0"), (11, "S0")]);
    assert!(std::process::Command::new("kill").args(["-TERM", &server.child_id().to_string()]).status().unwrap().success());
    let mut answered = 1;
    let logout = loop {
        let message = alice.next();
        if message.text(35) == Some("8") {
            expect(&message, &[(150, "0"), (11, &format!("S{answered}"))]);
            answered += 1;
        } else {
            break message;
        }
    };
    expect(&logout, &[(35, "5"), (58, "the venue is stopping")]);
    assert!(alice.closed());
    assert!(server.wait_exit(Duration::from_secs(20)).is_some_and(|s| s.success()));
    let server = start_default(&dir);
    let expected = expected_at_logon(&server.fix_address, ORDERS + 2);
    assert_eq!(expected, answered + 2, "the first message not answered ({answered} of {ORDERS} were) is the one asked for again");
    drop(server);
}

#[test]
fn sequence_numbers_and_missed_reports_survive_a_restart() {
    let dir = temp_dir("restart");
    let server = start_default(&dir);
    let mut alice = FixClient::connect(&server.fix_address, "ALICE");
    alice.logon(1, "demo-key-1");
    send_owned(&mut alice, "D", &order("A1", "2", "100", "5"));
    expect(&alice.next(), &[(150, "0"), (11, "A1")]);
    alice.send("5", &[]);
    expect(&alice.next(), &[(35, "5")]);
    assert!(alice.closed());
    let alice_next_out = alice.next_out();

    // While Alice is away, Bob fills her order.
    let mut bob = FixClient::connect(&server.fix_address, "BOB");
    bob.logon(2, "demo-key-2");
    send_owned(&mut bob, "D", &order("B1", "1", "100", "5"));
    expect(&bob.next(), &[(150, "0")]);
    expect(&bob.next(), &[(150, "F"), (39, "2")]);
    bob.send("5", &[]);
    expect(&bob.next(), &[(35, "5")]);
    assert!(server.terminate().success());

    let server = start_default(&dir);
    let mut alice = FixClient::connect(&server.fix_address, "ALICE");
    alice.writer().next_out = alice_next_out;
    // Alice saw messages 1..=3 (Logon, New, Logout); the server numbered
    // her fill 4 while she was away, so its Logon is 5 and she asks for 4.
    let logon = alice.logon(1, "demo-key-1");
    expect(&logon, &[(34, "5")]);
    alice.send("2", &[(7, "4"), (16, "0")]);
    let resent = alice.next();
    expect(&resent, &[(35, "8"), (34, "4"), (43, "Y"), (150, "F"), (39, "2"), (11, "A1"), (14, "5"), (151, "0")]);
    // (Her Logon, 5, comes as a gap fill.) A range that ends before it
    // begins is refused, not passed over.
    expect(&alice.next(), &[(35, "4"), (123, "Y"), (36, "6")]);
    alice.send("2", &[(7, "5"), (16, "2")]);
    expect(&alice.next(), &[(35, "3"), (373, "5"), (371, "16")]);
}

/// The cids of the logged-in account's open orders (binary query).
fn open_cids(client: &mut crate::serve::Client, request: u64) -> Vec<u64> {
    use crossbook_protocol::{ClientMessage, ServerMessage};
    client.send(&ClientMessage::QueryOpenOrders { request, instrument: None });
    let mut cids = Vec::new();
    loop {
        match client.recv() {
            Some(ServerMessage::OpenOrder(o)) => cids.push(o.cid),
            Some(ServerMessage::QueryDone { request: r, .. }) if r == request => return cids,
            Some(ServerMessage::ExecutionReport(_)) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// An account with `cancel_on_disconnect` loses its open orders when a
/// session of it ends, binary or FIX, by a lost connection or a Logout
/// (a CancelAll journaled for it, reported and replayed as any); another
/// account keeps its own; when the venue stops, orders stay.
#[test]
fn a_session_that_ends_cancels_its_accounts_orders_when_the_account_asks() {
    use crate::serve::{CONFIG, Client, limit, spawn_with};
    use crossbook_engine::{Side, TimeInForce};
    use crossbook_protocol::{ClientMessage, ReportKind, ServerMessage};
    let dir = temp_dir("cancel-on-disconnect");
    let config = dir.join("crossbook.toml");
    let text = CONFIG.replacen("[[accounts]]\nid = 1\napi_key = \"alice\"\n", "[[accounts]]\nid = 1\napi_key = \"alice\"\ncancel_on_disconnect = true\n", 1);
    assert_ne!(text, CONFIG);
    std::fs::write(&config, text).unwrap();
    let data = dir.join("data");
    let args = ["--config", config.to_str().unwrap(), "--data", data.to_str().unwrap()];
    let server = spawn_with(&args, &[]);
    let rest = |client: &mut Client, cid: u64, price: i64| {
        client.send(&limit(cid, Side::Buy, price, 1, TimeInForce::Gtc));
        assert_eq!(client.report().kind, ReportKind::Accepted);
    };
    // Binary, the connection lost: alice's two orders go, bob's stays.
    let (mut alice, _) = Client::login(&server.address, 1, "alice");
    rest(&mut alice, 1, 100);
    rest(&mut alice, 2, 101);
    let (mut bob, _) = Client::login(&server.address, 2, "bob");
    rest(&mut bob, 3, 102);
    drop(alice);
    server.expect_log("cancel on disconnect: account 1's open orders are cancelled");
    let (client, reply) = crossbook_client::binary::Client::login(&server.address, 1, "alice", 2).unwrap();
    assert!(matches!(reply, ServerMessage::LoginAccepted { .. }), "{reply:?}");
    let mut alice = Client(client);
    let replayed: Vec<(ReportKind, u8)> = (0..3).map(|_| alice.report()).map(|r| (r.kind, r.reason)).collect();
    assert_eq!(replayed, vec![(ReportKind::Cancelled, 5), (ReportKind::Cancelled, 5), (ReportKind::CancelAllDone, 0)], "replayed as a CancelAll's reports");
    assert_eq!(open_cids(&mut alice, 1), Vec::<u64>::new());
    assert_eq!(open_cids(&mut bob, 2), vec![3]);
    // Binary, a Logout: the same.
    rest(&mut alice, 4, 100);
    alice.send(&ClientMessage::Logout);
    assert!(matches!(alice.recv(), Some(ServerMessage::Logout { .. })));
    drop(alice);
    server.expect_log("cancel on disconnect: account 1's open orders are cancelled");
    // Alice logs on over FIX as `comp_id` and rests an order `cl_ord_id`.
    let fix_resting = |comp_id: &str, cl_ord_id: &str, price: &str| {
        let mut fix = FixClient::connect(&server.fix_address, comp_id);
        fix.logon(1, "alice");
        send_owned(&mut fix, "D", &order(cl_ord_id, "1", price, "1"));
        // (The account's reports come to its FIX session: the binary
        // session's cancel may come first.)
        let accepted = std::iter::repeat_with(|| fix.next()).find(|m| m.text(11) == Some(cl_ord_id)).unwrap();
        expect(&accepted, &[(35, "8"), (150, "0")]);
        fix
    };
    // FIX, the connection lost.
    let fix = fix_resting("ALICEFIX", "f1", "99");
    drop(fix);
    server.expect_log("cancel on disconnect: account 1's open orders are cancelled (FIX connection");
    let (mut alice, _) = Client::login(&server.address, 1, "alice");
    assert_eq!(open_cids(&mut alice, 3), Vec::<u64>::new(), "the FIX order went");
    drop(alice);
    server.expect_log("cancel on disconnect: account 1's open orders are cancelled");
    // FIX, a Logout: the same (another CompID of hers: a new client
    // starts its sequence numbers at 1).
    let mut fix = fix_resting("ALICEFIX2", "f2", "98");
    fix.send("5", &[]);
    let answer = std::iter::repeat_with(|| fix.next()).find(|m| m.text(35) == Some("5")).unwrap();
    expect(&answer, &[(35, "5")]);
    assert!(fix.closed());
    server.expect_log("cancel on disconnect: account 1's open orders are cancelled (FIX connection");
    let (mut alice, _) = Client::login(&server.address, 1, "alice");
    assert_eq!(open_cids(&mut alice, 6), Vec::<u64>::new(), "the FIX order went with the Logout");
    // FIX, a Logout and at once a new connection of the same CompID that
    // places an order: the first connection's cancel comes before any
    // command of the second, so the new order stays.
    let mut fix = fix_resting("ALICEFIX3", "f3", "97");
    fix.send("5", &[]);
    drop(fix);
    let mut again = FixClient::connect(&server.fix_address, "ALICEFIX3");
    again.0.logon(1, "alice", true).unwrap_or_else(|e| panic!("logon again: {e}"));
    send_owned(&mut again, "D", &order("f4", "1", "96", "1"));
    let accepted = std::iter::repeat_with(|| again.next()).find(|m| m.text(11) == Some("f4")).unwrap();
    expect(&accepted, &[(35, "8"), (150, "0")]);
    assert_eq!(open_cids(&mut alice, 7).len(), 1, "f3 went with its connection's Logout, f4 stays");
    drop(again);
    // (f3's connection's line, then f4's.)
    server.expect_log("cancel on disconnect: account 1's open orders are cancelled (FIX connection");
    server.expect_log("cancel on disconnect: account 1's open orders are cancelled (FIX connection");
    assert_eq!(open_cids(&mut alice, 8), Vec::<u64>::new(), "f4 went with its connection");
    // Bob's session ending leaves his order; the venue stopping leaves alice's.
    drop(bob);
    rest(&mut alice, 5, 100);
    assert!(server.terminate().success());
    let server = spawn_with(&args, &[]);
    let (mut alice, _) = Client::login(&server.address, 1, "alice");
    assert_eq!(open_cids(&mut alice, 4), vec![5], "orders stay when the venue stops");
    let (mut bob, _) = Client::login(&server.address, 2, "bob");
    assert_eq!(open_cids(&mut bob, 5), vec![3]);
    drop((alice, bob));
    assert!(server.terminate().success());
}

/// A message ahead of a gap is held, and held messages are done in order
/// as the gap fills; one rejected as it came uses up its number in its
/// turn (it is not asked for again); once the venue has sent its Logout
/// (a wrong BeginString, here, which uses up no number but its own) a
/// held order is not done; a BusinessMessageReject is never answered
/// with another.
#[test]
fn held_messages_are_done_in_order_and_never_after_the_venues_logout() {
    let dir = temp_dir("held");
    let server = start_default(&dir);
    let mut alice = FixClient::connect(&server.fix_address, "ALICE");
    alice.logon(1, "demo-key-1");
    // Alice's 2 is "lost": 3 (an order) and 4 (a Reject-worthy message:
    // a tag twice) come first.
    alice.writer().next_out = 3;
    send_owned(&mut alice, "D", &order("H3", "2", "100", "1"));
    expect(&alice.next(), &[(35, "2"), (7, "2"), (16, "0")]);
    alice.send("1", &[(112, "a"), (112, "b")]);
    expect(&alice.next(), &[(35, "3"), (45, "4"), (373, "13")]);
    // 2 is resent (a TestRequest): it, then the held order, are done; 4
    // is not asked for again, so 5 follows on without a gap.
    alice.writer().next_out = 2;
    alice.send("1", &[(112, "two")]);
    let before = until_heartbeat(&mut alice, "two");
    assert!(before.is_empty(), "{before:?}");
    expect(&alice.next(), &[(35, "8"), (150, "0"), (11, "H3")]);
    alice.writer().next_out = 5;
    alice.send("j", &[(45, "1"), (372, "D"), (380, "0")]);
    alice.send("1", &[(112, "after-j")]);
    let before = until_heartbeat(&mut alice, "after-j");
    // No BusinessMessageReject in answer to hers, and no ResendRequest:
    // the rejected 4 was used up in its turn.
    assert!(before.iter().all(|m| m.get(35) != Some(b"j".as_slice()) && m.get(35) != Some(b"2".as_slice())), "{before:?}");
    // Another gap (7 missing): 8, an order, is held; then a message with
    // a wrong BeginString. The venue logs out; the held order is never
    // done, even when 7 arrives.
    alice.writer().next_out = 8;
    send_owned(&mut alice, "D", &order("H8", "2", "100", "1"));
    expect(&alice.next(), &[(35, "2"), (7, "7"), (16, "0")]);
    let mut wrong = crossbook_fix::wire::Builder::new();
    wrong.str(35, "1").num(34, 9).str(49, "ALICE").str(52, &crossbook_fix::time::format_timestamp(wall_ms())).str(56, "CROSSBOOK").str(112, "x");
    alice.send_bytes(&wrong.finish("FIX.4.2")).expect("send");
    expect(&alice.next(), &[(35, "5"), (58, "Incorrect BeginString")]);
    alice.writer().next_out = 7;
    alice.send("0", &[]);
    server.expect_log("not processed (after our Logout): MsgType D MsgSeqNum 8");
    // A TestRequest in its turn (9: the wrong BeginString did not use up
    // a number it was not expected at) is not answered, and one too low
    // gets no second Logout: the connection just ends.
    alice.writer().next_out = 9;
    alice.send("1", &[(112, "late")]);
    alice.writer().next_out = 3;
    alice.send("1", &[(112, "too-low")]);
    // Nothing more comes (FIX 4.4: after a Logout, only what a
    // ResendRequest asks).
    if let Some(message) = alice.recv() {
        panic!("after the venue's Logout: {message:?}");
    }
    drop(server);
}

/// The wall clock in milliseconds (a SendingTime written by hand).
fn wall_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// Reads up to the Heartbeat answering TestRequest `id`; returns what came
/// before it (panics if it does not come).
fn until_heartbeat(client: &mut FixClient, id: &str) -> Vec<crossbook_fix::wire::Message> {
    let mut before = Vec::new();
    loop {
        let message = client.recv().unwrap_or_else(|| panic!("no Heartbeat {id}; before it: {before:?}"));
        if message.get(35) == Some(b"0".as_slice()) && message.get(112) == Some(id.as_bytes()) {
            return before;
        }
        before.push(message);
    }
}

/// Messages held ahead of a gap are bounded in bytes too (16 MiB a
/// session): past that they are not kept, and asked for again when the
/// gap is filled; the session goes on.
#[test]
fn held_messages_are_bounded_in_bytes() {
    let dir = temp_dir("held-bytes");
    let server = start_default(&dir);
    let mut alice = FixClient::connect(&server.fix_address, "ALICE");
    alice.logon(1, "demo-key-1");
    // 2 is missing; 3 .. 402 are TestRequests of about 60 KB each (24 MB).
    let padding = "p".repeat(60_000);
    alice.writer().next_out = 3;
    for n in 3..=402u64 {
        alice.send("1", &[(112, &format!("{n}-{padding}"))]);
    }
    expect(&alice.next(), &[(35, "2"), (7, "2"), (16, "0")]);
    alice.writer().next_out = 2;
    alice.send("1", &[(112, "2")]);
    // The kept ones are answered in order (2 and those kept after it),
    // then nothing: the rest were not kept.
    alice.0.set_timeout(Duration::from_secs(3));
    let mut answered = 0u64;
    while let Some(message) = alice.recv() {
        expect(&message, &[(35, "0")]);
        answered += 1;
    }
    let first_not_kept = 2 + answered;
    assert!((250..=300).contains(&first_not_kept), "kept up to about 16 MiB: {first_not_kept}");
    // The next message shows the gap, which is asked for from the first
    // not kept.
    alice.writer().next_out = 403;
    alice.send("1", &[(112, "403")]);
    alice.0.set_timeout(Duration::from_secs(10));
    expect(&alice.next(), &[(35, "2"), (7, &first_not_kept.to_string()), (16, "0")]);
    drop(server);
}

/// A gap filled short of what was asked (the counterparty's GapFill ends
/// before the next message held) is asked for again by the next message
/// past it, never left waiting for ever.
#[test]
fn a_gap_filled_short_is_asked_for_again() {
    let dir = temp_dir("gap-short");
    let server = start_default(&dir);
    let mut alice = FixClient::connect(&server.fix_address, "ALICE");
    alice.logon(1, "demo-key-1");
    // 5 comes first, with a tag twice: Rejected, its number marked; the
    // gap 2..4 asked for.
    alice.writer().next_out = 5;
    alice.send("1", &[(112, "a"), (112, "b")]);
    let mut seen = Vec::new();
    while seen.len() < 2 {
        seen.push(alice.next());
    }
    assert!(seen.iter().any(|m| m.get(35) == Some(b"2".as_slice()) && m.get(7) == Some(b"2".as_slice())), "{seen:?}");
    assert!(seen.iter().any(|m| m.get(35) == Some(b"3".as_slice()) && m.get(45) == Some(b"5".as_slice())), "{seen:?}");
    // A GapFill from 2 to 5: 5's mark uses up its number (6 expected).
    alice.writer().next_out = 2;
    alice.send("4", &[(123, "Y"), (36, "5")]);
    // 8 shows a new gap, 6..7: asked for.
    alice.writer().next_out = 8;
    alice.send("1", &[(112, "eight")]);
    expect(&alice.next(), &[(35, "2"), (7, "6"), (16, "0")]);
    alice.writer().next_out = 6;
    alice.send("1", &[(112, "six")]);
    alice.send("1", &[(112, "seven")]);
    for id in ["six", "seven", "eight"] {
        until_heartbeat(&mut alice, id);
    }
    // A GapFill that stops short of the message held: 11 shows the gap
    // 9..10, a GapFill fills 9 only; 12 asks for 10 on.
    alice.writer().next_out = 11;
    alice.send("1", &[(112, "eleven")]);
    expect(&alice.next(), &[(35, "2"), (7, "9"), (16, "0")]);
    alice.writer().next_out = 9;
    alice.send("4", &[(123, "Y"), (36, "10")]);
    alice.writer().next_out = 12;
    alice.send("1", &[(112, "twelve")]);
    expect(&alice.next(), &[(35, "2"), (7, "10"), (16, "0")]);
    alice.writer().next_out = 10;
    alice.send("1", &[(112, "ten")]);
    for id in ["ten", "eleven", "twelve"] {
        until_heartbeat(&mut alice, id);
    }
    drop(server);
}

/// What the venue owes a counterparty that reads, however much of it
/// comes at once: the reports of a mass cancel of 9,000 orders, and a
/// resend of everything since the Logon (some 18,000 messages), arrive
/// whole; the writer's queue is bounded in bytes, not in messages (it was
/// 8,192 messages, and both dropped the session as one that does not read).
#[test]
fn a_burst_owed_to_a_reading_counterparty_arrives_whole() {
    const ORDERS: usize = 9_000;
    let dir = temp_dir("burst");
    let server = start_default(&dir);
    let mut alice = FixClient::connect(&server.fix_address, "ALICE");
    alice.logon(1, "demo-key-1");
    // Pipelined, read back as they come (a reader keeps up).
    for n in 0..ORDERS {
        send_owned(&mut alice, "D", &order(&format!("R{n}"), "1", "10", "1"));
    }
    let mut accepted = 0;
    while accepted < ORDERS {
        let message = alice.0.next_app().unwrap_or_else(|e| panic!("after {accepted} acknowledgements: {e}"));
        assert_eq!((message.msg_type(), message.text(150)), (&b"8"[..], Some("0")), "{}", printable(message.raw()));
        accepted += 1;
    }
    alice.send("q", &[(11, "MASS"), (530, "7"), (60, &format_timestamp(now_ms()))]);
    let mut cancelled = 0;
    loop {
        let message = alice.0.next_app().unwrap_or_else(|e| panic!("after {cancelled} cancels: {e}"));
        if message.msg_type() == b"r" {
            expect(&message, &[(11, "MASS"), (533, &ORDERS.to_string())]);
            break;
        }
        expect(&message, &[(35, "8"), (150, "4")]);
        cancelled += 1;
    }
    assert_eq!(cancelled, ORDERS);
    // Everything again, then a TestRequest to know the resend is over.
    alice.send("2", &[(7, "1"), (16, "0")]);
    alice.send("1", &[(112, "resent")]);
    let mut resent_reports = 0;
    loop {
        let message = alice.0.recv().unwrap_or_else(|e| panic!("after {resent_reports} resent reports: {e}")).unwrap_or_else(|| panic!("closed after {resent_reports} resent reports"));
        if message.msg_type() == b"0" && message.text(112) == Some("resent") {
            break;
        }
        assert_eq!(message.text(43), Some("Y"), "{}", printable(message.raw()));
        if matches!(message.msg_type(), b"8" | b"r") {
            resent_reports += 1;
        }
    }
    assert_eq!(resent_reports, 2 * ORDERS + 1, "every report and the mass cancel's");
}
