//! `crossbook serve` end to end, over TCP on 127.0.0.1: two accounts trade,
//! a third cannot touch their orders, garbage costs only its own
//! connection, SIGTERM stops cleanly, and a restart keeps the state.

use crossbook_engine::{OrderType, RejectReason, SelfTradePrevention, Side, TimeInForce};
use crossbook_protocol::*;
use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

pub(crate) const CONFIG: &str = r#"
listen = "127.0.0.1:0"
durability = "sync"
snapshot_every = 0

[[assets]]
id = 1
name = "BTC"

[[assets]]
id = 2
name = "USD"

[[instruments]]
id = 1
symbol = "BTC-USD"
base = 1
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
id = 1
api_key = "alice"
deposits = [[1, 1000], [2, 1000000]]

[[accounts]]
id = 2
api_key = "bob"
deposits = [[1, 1000], [2, 1000000]]

[[accounts]]
id = 3
api_key = "mallory"
deposits = [[2, 1000]]
"#;

pub(crate) struct Server {
    child: Child,
    pub(crate) address: String,
    /// The FIX acceptor's address.
    pub(crate) fix_address: String,
    /// The market-data HTTP server's address.
    pub(crate) market_address: String,
    log: Receiver<String>,
    /// What the server logged up to `listening on`.
    pub(crate) startup: Vec<String>,
}

pub(crate) fn start(dir: &Path) -> Server {
    let config = dir.join("crossbook.toml");
    std::fs::write(&config, CONFIG).unwrap();
    spawn(&["--config", config.to_str().unwrap(), "--data", dir.join("data").to_str().unwrap()])
}

/// The built-in default configuration (16 demo accounts), on any free port.
pub(crate) fn start_default(dir: &Path) -> Server {
    spawn(&["--listen", "127.0.0.1:0", "--data", dir.join("data").to_str().unwrap()])
}

fn spawn(args: &[&str]) -> Server {
    spawn_with(args, &[])
}

/// `crossbook serve` with `args` (after `--fix-listen 127.0.0.1:0`) and
/// extra environment variables.
pub(crate) fn spawn_with(args: &[&str], envs: &[(&str, PathBuf)]) -> Server {
    spawn_process(&["serve", "--fix-listen", "127.0.0.1:0", "--market-listen", "127.0.0.1:0"], args, envs)
}

/// `crossbook <first...> <args...>` (`serve` or `follow` and their flags),
/// once it says where it listens.
pub(crate) fn spawn_process(first: &[&str], args: &[&str], envs: &[(&str, PathBuf)]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_crossbook"))
        .args(first)
        .args(args)
        .envs(envs.iter().map(|(k, v)| (*k, v.as_os_str())))
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let (lines, log) = channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut fix_address = String::new();
    let mut market_address = String::new();
    let mut startup = Vec::new();
    loop {
        let line = match log.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => line,
            Err(e) => {
                // Not left running behind a failed test.
                let _ = child.kill();
                let _ = child.wait();
                panic!("server never said where it listens ({e}); it said {startup:#?}");
            }
        };
        if let Some(rest) = line.strip_prefix("FIX 4.4 acceptor on ") {
            fix_address = rest.split_whitespace().next().unwrap_or_default().to_string();
        }
        if let Some(rest) = line.strip_prefix("market data on http://") {
            market_address = rest.split('/').next().unwrap_or_default().to_string();
        }
        if let Some(address) = line.strip_prefix("listening on ") {
            let address = address.to_string();
            startup.push(line);
            return Server { child, address, fix_address, market_address, log, startup };
        }
        startup.push(line);
    }
}

impl Server {
    /// Waits for a log line containing `needle`.
    pub(crate) fn expect_log(&self, needle: &str) -> String {
        self.expect_log_within(needle, Duration::from_secs(10))
    }

    /// Waits up to `limit` for a log line containing `needle`.
    pub(crate) fn expect_log_within(&self, needle: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        let mut seen = Vec::new();
        loop {
            match self.log.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) if line.contains(needle) => return line,
                Ok(line) => seen.push(line),
                Err(_) => panic!("no log line with {needle:?}; the last lines: {:#?}", &seen[seen.len().saturating_sub(15)..]),
            }
        }
    }

    /// Whether the process has ended.
    pub(crate) fn exited(&mut self) -> bool {
        self.child.try_wait().ok().flatten().is_some()
    }

    pub(crate) fn child_id(&self) -> u32 {
        self.child.id()
    }

    /// Log lines already written (without waiting for more).
    pub(crate) fn drain(&self) -> Vec<String> {
        self.log.try_iter().collect()
    }

    /// SIGKILL, and wait for the process to be gone.
    pub(crate) fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits up to `limit` for the process to end by itself.
    pub(crate) fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// The last command market data has applied (`/crossbook/stats`'s
    /// `seq`), or 0 while the market-data port does not answer.
    pub(crate) fn market_seq(&self) -> u64 {
        if TcpStream::connect(&self.market_address).is_err() {
            return 0;
        }
        let (status, body) = crate::marketdata::http_get(&self.market_address, "/crossbook/stats");
        if status != 200 {
            return 0;
        }
        serde_json::from_str::<serde_json::Value>(&body).ok().and_then(|v| v["seq"].as_u64()).unwrap_or(0)
    }

    /// Waits (30 s at most) until market data has applied command `seq`:
    /// a point in a run to act at that does not depend on how fast the
    /// machine is.
    pub(crate) fn wait_market_seq(&self, seq: u64) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.market_seq() < seq {
            assert!(Instant::now() < deadline, "the server did not reach seq {seq} (at {})", self.market_seq());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub(crate) fn terminate(mut self) -> std::process::ExitStatus {
        let status = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().unwrap();
        assert!(status.success());
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "server did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the server with SIGTERM; how it exited, and the log lines not
    /// yet read (up to the end of its standard error).
    pub(crate) fn terminate_with_log(mut self) -> (std::process::ExitStatus, Vec<String>) {
        let log = std::mem::replace(&mut self.log, channel().1);
        let status = self.terminate();
        let mut lines = Vec::new();
        while let Ok(line) = log.recv_timeout(Duration::from_secs(10)) {
            lines.push(line);
        }
        (status, lines)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The binary client of `crossbook-client`, with the test's habits: every
/// failure is a panic with what happened.
pub(crate) struct Client(pub(crate) crossbook_client::binary::Client);

impl Client {
    pub(crate) fn connect(address: &str) -> Client {
        Client(crossbook_client::binary::Client::connect(address).unwrap_or_else(|e| panic!("connecting to {address}: {e}")))
    }

    pub(crate) fn login(address: &str, account: u64, key: &str) -> (Client, ServerMessage) {
        let (client, reply) = crossbook_client::binary::Client::login(address, account, key, 0).unwrap_or_else(|e| panic!("login as {account}: {e}"));
        (Client(client), reply)
    }

    pub(crate) fn send(&mut self, message: &ClientMessage) {
        self.0.send(message).unwrap_or_else(|e| panic!("send: {e}"));
    }

    /// Raw bytes, as a hostile client would send them.
    pub(crate) fn send_bytes(&mut self, bytes: &[u8]) -> Result<(), crossbook_client::ClientError> {
        self.0.send_bytes(bytes)
    }

    pub(crate) fn stream(&self) -> &TcpStream {
        self.0.stream()
    }

    /// The next message, or `None` once the server has closed.
    pub(crate) fn recv(&mut self) -> Option<ServerMessage> {
        self.0.recv().unwrap_or_else(|e| panic!("recv: {e}"))
    }

    pub(crate) fn report(&mut self) -> ExecutionReport {
        match self.recv() {
            Some(ServerMessage::ExecutionReport(report)) => report,
            other => panic!("expected an execution report, got {other:?}"),
        }
    }
}

pub(crate) fn limit(cid: u64, side: Side, price: i64, qty: u64, tif: TimeInForce) -> ClientMessage {
    ClientMessage::NewOrder(NewOrder {
        cid,
        instrument: 1,
        side,
        order_type: OrderType::Limit,
        tif,
        post_only: false,
        stp: SelfTradePrevention::None,
        price,
        qty,
        budget: None,
    })
}

/// A directory of its own for one test, removed when it is dropped.
fn temp_dir(name: &str) -> crate::support::TempDir {
    crate::support::TempDir::new(&format!("serve-{name}"))
}

/// A new venue whose start fails (its port taken) journals nothing: the
/// next start, with the port free or the configuration corrected, sets it
/// up afresh.
#[test]
fn a_start_that_fails_leaves_no_venue_behind() {
    let dir = crate::support::TempDir::new("serve-failed-start");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let data = dir.0.join("data");
    let output = Command::new(env!("CARGO_BIN_EXE_crossbook"))
        .args(["serve", "--listen", &address, "--fix-listen", "", "--market-listen", "", "--data", data.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains(&format!("listening on {address}: ")), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(crossbook_journal::recover(&data).unwrap().engine.seq(), 0, "nothing journaled");
}

/// The built-in configuration, whose keys are published, serves a new
/// venue and the demo venue it set up; never a venue set up or last served
/// from a file, whose accounts a forgotten `--config` would open to the
/// demo's keys.
#[test]
fn the_built_in_configuration_never_serves_a_venue_from_a_file() {
    let built_in = |data: &Path| {
        Command::new(env!("CARGO_BIN_EXE_crossbook"))
            .args(["serve", "--listen", "127.0.0.1:0", "--fix-listen", "", "--market-listen", "", "--data", data.to_str().unwrap()])
            .output()
            .unwrap()
    };
    let refused = |data: &Path| {
        let output = built_in(data);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("holds a venue set up or last served from a configuration file: start it with --config"), "{stderr}");
        assert!(!stderr.contains("from the configuration:"), "nothing of the demo's added: {stderr}");
    };
    // Set up from a file.
    let configured = temp_dir("from-a-file");
    assert!(start(&configured).terminate().success());
    refused(&configured.join("data"));
    // The demo venue, served again on the built-in configuration; then
    // once from a file (the demo's own lists), after which it is not.
    let demo = temp_dir("demo");
    for _ in 0..2 {
        let server = start_default(&demo);
        let (_, reply) = Client::login(&server.address, 1, "demo-key-1");
        assert!(matches!(reply, ServerMessage::LoginAccepted { account: 1, .. }), "{reply:?}");
        assert!(server.terminate().success());
    }
    let file = demo.join("mine.toml");
    std::fs::write(&file, "demo = true\n").unwrap();
    assert!(spawn(&["--config", file.to_str().unwrap(), "--listen", "127.0.0.1:0", "--data", demo.join("data").to_str().unwrap()]).terminate().success());
    refused(&demo.join("data"));
}

/// A server told to stop while a session's orders are still unanswered
/// answers them first, then logs the session out once; nothing follows
/// the Logout, and every order the venue journaled was answered.
#[test]
fn a_stopping_server_answers_what_is_in_flight_before_its_logout() {
    let dir = crate::support::TempDir::new("serve-stop-in-flight");
    let server = start_default(&dir.0);
    let (mut client, _) = Client::login(&server.address, 1, "demo-key-1");
    let mut burst = Vec::new();
    for cid in 1..=3_000 {
        encode_client(&limit(cid, Side::Buy, 90, 1, TimeInForce::Gtc), &mut burst);
    }
    client.send_bytes(&burst).expect("send");
    // The stop comes once the venue is answering, so that it meets
    // orders read and not yet answered (a stop before the first read
    // would answer none, which is right but tests nothing).
    let first = client.report();
    let stopping = std::thread::spawn(move || server.terminate());
    let mut accepted = u64::from(first.kind == ReportKind::Accepted);
    let (mut reports, mut logouts, mut after_logout) = (1, 0, Vec::new());
    while let Some(message) = client.recv() {
        if logouts > 0 {
            after_logout.push(format!("{message:?}"));
        }
        match message {
            ServerMessage::ExecutionReport(report) => {
                reports += 1;
                accepted += u64::from(report.kind == ReportKind::Accepted);
            }
            ServerMessage::Logout { .. } => logouts += 1,
            _ => {}
        }
    }
    assert!(stopping.join().expect("terminate").success());
    assert_eq!(logouts, 1, "one Logout");
    assert!(after_logout.is_empty(), "nothing after the Logout: {:?}", &after_logout[..after_logout.len().min(3)]);
    let recovered = crossbook_journal::recover(&dir.0.join("data")).expect("recover");
    let resting = recovered.engine.open_orders_of(1, None).len() as u64;
    assert_eq!(resting, accepted, "every order the venue journaled was answered ({reports} reports)");
}

/// One process at a time writes a data directory: a second `serve` on
/// it, or `recover` or `journal snapshot` while it runs, is refused with
/// who holds it and changes nothing; once it stops (or is killed), they
/// go ahead.
#[test]
fn a_data_directory_is_written_by_one_process_at_a_time() {
    let dir = crate::support::TempDir::new("serve-lock");
    let data = dir.0.join("data");
    let server = start_default(&dir.0);
    let (mut client, _) = Client::login(&server.address, 1, "demo-key-1");
    client.send(&limit(1, Side::Buy, 100, 1, TimeInForce::Gtc));
    assert_eq!(client.report().kind, ReportKind::Accepted);
    let crossbook = |args: &[&str]| Command::new(env!("CARGO_BIN_EXE_crossbook")).args(args).output().unwrap();
    let data_arg = data.to_str().unwrap();
    let second = crossbook(&["serve", "--listen", "127.0.0.1:0", "--fix-listen", "", "--market-listen", "", "--data", data_arg]);
    let said = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success() && said.contains(&format!("the data directory {data_arg} is in use by another crossbook process (process {})", server.child_id())), "{said}");
    for args in [&["recover", "--journal", data_arg][..], &["journal", "snapshot", data_arg][..]] {
        let refused = crossbook(args);
        assert!(!refused.status.success() && String::from_utf8_lossy(&refused.stderr).contains("is in use by another crossbook process"), "{args:?}");
    }
    // Deleting the LOCK file (taken for stale) does not free the
    // directory: a second writer would mix its records into the journal.
    std::fs::remove_file(data.join("LOCK")).unwrap();
    let second = crossbook(&["serve", "--listen", "127.0.0.1:0", "--fix-listen", "", "--market-listen", "", "--data", data_arg]);
    let said = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success() && said.contains("is in use by another crossbook process (a process that holds the directory"), "{said}");
    assert!(!data.join("LOCK").exists(), "a refused process changes nothing: no LOCK file of its own left");
    // The server was not disturbed.
    client.send(&limit(2, Side::Buy, 100, 1, TimeInForce::Gtc));
    assert_eq!(client.report().kind, ReportKind::Accepted);
    drop(client);
    server.kill();
    let recovered = crossbook(&["recover", "--journal", data_arg]);
    assert!(recovered.status.success(), "{}", String::from_utf8_lossy(&recovered.stderr));
    let seq: u64 = String::from_utf8_lossy(&recovered.stdout).lines().find_map(|l| l.strip_prefix("seq ")?.parse().ok()).unwrap();
    let server = start_default(&dir.0);
    let (client, reply) = crossbook_client::binary::Client::login(&server.address, 1, "demo-key-1", u64::MAX).unwrap();
    let mut client = Client(client);
    assert!(matches!(reply, ServerMessage::LoginAccepted { next_seq: 3, .. }), "both orders' reports are kept: {reply:?}");
    client.send(&ClientMessage::QueryOpenOrders { request: 1, instrument: None });
    let mut cids = Vec::new();
    loop {
        match client.recv() {
            Some(ServerMessage::OpenOrder(o)) => cids.push(o.cid),
            Some(ServerMessage::QueryDone { .. }) => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(cids, [1, 2], "both orders are in the journal (at seq {seq})");
    drop(client);
    assert!(server.terminate().success());
}

#[test]
fn two_accounts_trade_a_third_cannot_interfere_and_state_survives_a_restart() {
    let dir = temp_dir("trade");
    let server = start(&dir);
    let address = server.address.clone();

    let (mut alice, reply) = Client::login(&address, 1, "alice");
    assert!(matches!(reply, ServerMessage::LoginAccepted { account: 1, .. }), "{reply:?}");
    server.expect_log("login connection=");
    let (mut bob, _) = Client::login(&address, 2, "bob");
    let (mut mallory, _) = Client::login(&address, 3, "mallory");

    // A wrong key is refused, and the connection closed.
    let (mut intruder, reply) = Client::login(&address, 1, "guess");
    assert_eq!(reply, ServerMessage::LoginRejected { reason: ProtocolError::BadCredentials });
    assert_eq!(intruder.recv(), None);
    server.expect_log("bad credentials");

    alice.send(&limit(7, Side::Sell, 100, 10, TimeInForce::Gtc));
    let accepted = alice.report();
    assert_eq!((accepted.kind, accepted.cid, accepted.leaves_qty), (ReportKind::Accepted, 7, 10));
    let order = accepted.order;

    bob.send(&limit(8, Side::Buy, 101, 4, TimeInForce::Ioc));
    assert_eq!(bob.report().kind, ReportKind::Accepted);
    let fill = bob.report();
    assert_eq!((fill.kind, fill.last_qty, fill.last_price, fill.cum_qty, fill.leaves_qty), (ReportKind::Fill, 4, 100, 4, 0));
    let maker = alice.report();
    assert_eq!((maker.kind, maker.order, maker.cum_qty, maker.leaves_qty), (ReportKind::PartialFill, order, 4, 6));
    assert!(maker.seq > accepted.seq, "session sequence numbers increase");

    // Mallory cannot cancel Alice's order, and learns nothing about it, not
    // even that it exists: the answer is the one for no order at all.
    mallory.send(&ClientMessage::Cancel { order });
    let refused = mallory.report();
    assert_eq!((refused.kind, refused.reason, refused.cid), (ReportKind::Rejected, RejectReason::UnknownOrder.code(), 0));

    // Garbage on another connection costs only that connection.
    let mut garbage = Client::connect(&address);
    garbage.send_bytes(&[0xff, 0xff, 0xff, 0xff, 1, 2, 3]).unwrap();
    assert_eq!(garbage.recv(), Some(ServerMessage::Error { reason: ProtocolError::FrameTooLong }));
    assert_eq!(garbage.recv(), None);
    server.expect_log("frame_too_long");
    alice.send(&ClientMessage::Heartbeat);
    assert_eq!(alice.recv(), Some(ServerMessage::Heartbeat));

    // Alice drops her connection; a fill happens while she is away; she
    // comes back saying the last report she saw and gets the missed one.
    let last_seen = maker.seq;
    drop(alice);
    bob.send(&limit(9, Side::Buy, 100, 1, TimeInForce::Ioc));
    assert_eq!(bob.report().kind, ReportKind::Accepted);
    assert_eq!(bob.report().kind, ReportKind::Fill);
    let mut alice = Client::connect(&address);
    let mut api_key = [0u8; API_KEY_BYTES];
    api_key[..5].copy_from_slice(b"alice");
    alice.send(&ClientMessage::Login { account: 1, api_key, last_seen });
    assert!(matches!(alice.recv(), Some(ServerMessage::LoginAccepted { next_seq, .. }) if next_seq == last_seen + 2));
    let missed = alice.report();
    assert_eq!((missed.seq, missed.kind, missed.cum_qty, missed.leaves_qty), (last_seen + 1, ReportKind::PartialFill, 5, 5));

    // SIGTERM: a clean stop.
    let status = server.terminate();
    assert!(status.success(), "{status:?}");
    drop((alice, bob, mallory));

    // Restarted on the same data: the order is still there, 5 of 10 filled,
    // and the session's numbering goes on where it was.
    let server = start(&dir);
    let mut alice = Client::connect(&server.address);
    alice.send(&ClientMessage::Login { account: 1, api_key, last_seen: missed.seq - 1 });
    assert!(matches!(alice.recv(), Some(ServerMessage::LoginAccepted { next_seq, .. }) if next_seq == missed.seq + 1));
    // Asking from one report back: that report is sent again, identical.
    assert_eq!(alice.report(), missed);
    alice.send(&ClientMessage::Cancel { order });
    let cancelled = alice.report();
    assert_eq!((cancelled.kind, cancelled.order, cancelled.cum_qty, cancelled.leaves_qty), (ReportKind::Cancelled, order, 5, 0));
    assert_eq!(cancelled.seq, missed.seq + 1);
    // A snapshot on request (SIGUSR1), then a clean stop.
    // (The start-up snapshot may still be being written: then it says to
    // ask again.)
    let mut asked = String::new();
    for _ in 0..50 {
        let status = Command::new("kill").args(["-USR1", &server.child_id().to_string()]).status().unwrap();
        assert!(status.success());
        asked = server.expect_log("snapshot requested");
        if asked.contains("writing one at seq ") {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(asked.contains("writing one at seq "), "{asked}");
    let seq = asked.rsplit(' ').next().expect("a seq").to_string();
    server.expect_log(&format!("snapshot written at seq {seq}"));
    let status = server.terminate();
    assert!(status.success());

    // The balances are what the engine decided: Alice sold 5 at 100 to Bob
    // (no fees here), her cancelled rest is unlocked, Mallory is untouched.
    let recovered = crossbook_journal::recover(&dir.join("data")).unwrap();
    let engine = &recovered.engine;
    assert_eq!(engine.balance(1, 1), Some((995, 0)), "alice BTC");
    assert_eq!(engine.balance(1, 2), Some((1_000_500, 0)), "alice USD");
    assert_eq!(engine.balance(2, 1), Some((1_005, 0)), "bob BTC");
    assert_eq!(engine.balance(2, 2), Some((999_500, 0)), "bob USD");
    assert_eq!(engine.balance(3, 2), Some((1_000, 0)), "mallory USD");
    assert_eq!(engine.open_orders(), 0);
}

/// Random bytes, truncated frames, oversized lengths and mutated frames on
/// many connections while one session trades: that session is never
/// disturbed, and every broken connection is logged with its reason.
#[test]
fn garbage_costs_only_its_own_connection() {
    let dir = temp_dir("garbage");
    let server = start(&dir);
    let (mut alice, _) = Client::login(&server.address, 1, "alice");
    let (mut bob, _) = Client::login(&server.address, 2, "bob");
    let mut valid = Vec::new();
    encode_client(&ClientMessage::Login { account: 2, api_key: [0; API_KEY_BYTES], last_seen: 0 }, &mut valid);
    encode_client(&limit(1, Side::Buy, 90, 1, TimeInForce::Gtc), &mut valid);
    let mut rng = crossbook_workload::Rng::new(99);
    let rounds = 40;
    for round in 0..rounds {
        let mut bytes: Vec<u8> = match round % 4 {
            0 => (0..1 + rng.below(200)).map(|_| rng.below(256) as u8).collect(),
            1 => valid[..1 + rng.below(valid.len() as u64 - 1) as usize].to_vec(),
            // A length of 4 GiB (the largest a u32 says).
            2 => vec![0xff, 0xff, 0xff, 0xff, 1, 2],
            _ => {
                let mut copy = valid.clone();
                for _ in 0..3 {
                    let at = rng.below(copy.len() as u64) as usize;
                    copy[at] = rng.below(256) as u8;
                }
                copy
            }
        };
        if round % 4 == 1 {
            // A truncated frame, then the client goes away.
            bytes.truncate(bytes.len().min(10));
        }
        let mut garbage = Client::connect(&server.address);
        let _ = garbage.send_bytes(&bytes);
        let _ = garbage.stream().shutdown(std::net::Shutdown::Write);
        // Whatever the server answers, it closes this connection.
        let closed = Instant::now();
        while garbage.recv().is_some() {
            assert!(closed.elapsed() < Duration::from_secs(10), "round {round}: the connection stayed open");
        }
        // Alice trades with Bob, unaffected.
        alice.send(&limit(1000 + round, Side::Sell, 200, 1, TimeInForce::Gtc));
        let report = alice.report();
        assert_eq!((report.kind, report.cid), (ReportKind::Accepted, 1000 + round), "round {round}");
        bob.send(&limit(5000 + round, Side::Buy, 200, 1, TimeInForce::Ioc));
        assert_eq!(bob.report().kind, ReportKind::Accepted, "round {round}");
        assert_eq!(bob.report().kind, ReportKind::Fill, "round {round}");
        assert_eq!(alice.report().kind, ReportKind::Fill, "round {round}");
    }
    // Each closed connection was logged with its reason, a few a second
    // (connections that never logged in are a flood's kind of line), the
    // rest counted.
    let (status, log) = server.terminate_with_log();
    assert!(status.success());
    let lines: Vec<&String> = log.iter().filter(|l| l.starts_with("disconnect connection=") && !l.contains("account")).collect();
    assert!(lines.iter().all(|l| l.split("reason=").nth(1).is_some_and(|r| !r.is_empty())), "{lines:?}");
    assert!(log.iter().any(|l| l.contains("frame_too_long")), "{log:?}");
    let left_out: u64 = log.iter().filter_map(|l| l.strip_prefix("... and ")?.split_whitespace().next()?.parse::<u64>().ok()).sum();
    let logged = log.iter().filter(|l| l.starts_with("disconnect connection=") && l.contains("127.0.0.1")).count() as u64;
    assert!(logged + left_out >= rounds - 1, "{logged} logged + {left_out} counted for {rounds} connections");
}

/// `crossbook load` drives the server; the server is killed with SIGKILL
/// in the middle; every order the load generator saw acknowledged is in the
/// journal the restarted server recovers.
#[test]
fn kill_9_under_load_loses_no_acknowledged_order() {
    let dir = temp_dir("crash");
    let mut server = start_default(&dir);
    let acked_file = dir.join("acked.txt");
    let mut load = Command::new(env!("CARGO_BIN_EXE_crossbook"))
        .args(["load", "--address", &server.address, "--connections", "4", "--duration", "30", "--json"])
        .args(["--acked-out", acked_file.to_str().unwrap(), "--last-seen-out", dir.join("last-seen.txt").to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Killed well into the run, 2,000 commands after the set-up; the kill
    // ends the load.
    let base = server.market_seq();
    server.wait_market_seq(base + 2_000);
    assert!(load.try_wait().unwrap().is_none(), "the load is still running (the kill ends it)");
    server.child.kill().unwrap();
    let _ = server.child.wait();
    let output = load.wait_with_output().unwrap();
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("the load generator's JSON report");
    let acked = crate::support::number_pairs(&acked_file);
    assert!(acked.len() > 1_000, "only {} orders acknowledged before the kill: {report}", acked.len());
    assert_eq!(acked.len() as u64, report["acknowledged"].as_u64().unwrap());
    drop(server);

    // Restart on the same data (recovery).
    let server = start_default(&dir);
    let inspect = Command::new(env!("CARGO_BIN_EXE_crossbook"))
        .args(["journal", "inspect", dir.join("data").to_str().unwrap()])
        .output()
        .unwrap();
    assert!(inspect.status.success());
    let journal = String::from_utf8(inspect.stdout).unwrap();
    let lines: Vec<&str> = journal.lines().filter(|l| !l.starts_with('#')).collect();
    for (order, cid) in &acked {
        // Order ids are the sequence numbers of their place commands.
        let line = lines.get(*order as usize - 1).unwrap_or_else(|| panic!("order {order} is beyond the recovered journal ({} records)", lines.len()));
        assert!(line.starts_with("place ") && line.contains(&format!(" cid={cid} ")), "order {order}: journal has {line:?}");
    }

    // Every session reconnects saying the last report it saw, and is sent
    // exactly what it missed, in sequence: among it the acknowledgement of
    // every order the journal holds that the load generator never heard
    // back about (sent just before the kill).
    let acked_cids: std::collections::HashSet<u64> = acked.iter().map(|(_, cid)| *cid).collect();
    let last_seen = crate::support::number_pairs(&dir.join("last-seen.txt"));
    assert_eq!(last_seen.len(), 4);
    let mut unheard_total = 0;
    for (account, seen) in last_seen {
        let mut unheard: std::collections::BTreeSet<u64> = lines
            .iter()
            .filter(|l| l.starts_with(&format!("place account={account} ")))
            .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("cid=")).and_then(|c| c.parse().ok()))
            .filter(|cid| !acked_cids.contains(cid))
            .collect();
        unheard_total += unheard.len();
        let mut client = Client::connect(&server.address);
        let key = format!("demo-key-{account}");
        let mut api_key = [0u8; API_KEY_BYTES];
        api_key[..key.len()].copy_from_slice(key.as_bytes());
        client.send(&ClientMessage::Login { account, api_key, last_seen: seen });
        let Some(ServerMessage::LoginAccepted { next_seq, .. }) = client.recv() else { panic!("account {account}: no login") };
        for expected in seen + 1..next_seq {
            let report = client.report();
            assert_eq!(report.seq, expected, "account {account}: replayed reports come in sequence from the last one seen");
            if matches!(report.kind, ReportKind::Accepted | ReportKind::Rejected) {
                unheard.remove(&report.cid);
            }
        }
        assert!(unheard.is_empty(), "account {account}: {} journaled orders never acknowledged on reconnect", unheard.len());
    }
    eprintln!("{unheard_total} journaled orders were acknowledged only on reconnect");
    assert!(server.terminate().success());
}

/// The limits: an account's open orders (the next is refused with reason
/// 100, unsequenced, before it reaches the engine), and connections (one
/// more is told `server_busy` and closed), on the binary and FIX ports.
#[test]
fn limits_on_open_orders_and_connections() {
    let dir = temp_dir("limits");
    let config = dir.join("crossbook.toml");
    let text = CONFIG.replacen("snapshot_every = 0\n", "snapshot_every = 0\n\n[limits]\nmax_connections = 2\nopen_orders = 2\n", 1);
    std::fs::write(&config, text).unwrap();
    let server = spawn(&["--config", config.to_str().unwrap(), "--data", dir.join("data").to_str().unwrap()]);
    let (mut alice, _) = Client::login(&server.address, 1, "alice");
    for cid in 1..=2 {
        alice.send(&limit(cid, Side::Buy, 90, 1, TimeInForce::Gtc));
        assert_eq!(alice.report().kind, ReportKind::Accepted);
    }
    alice.send(&limit(3, Side::Buy, 90, 1, TimeInForce::Gtc));
    let refused = alice.report();
    assert_eq!((refused.kind, refused.reason, refused.seq, refused.cid), (ReportKind::Rejected, 100, 0, 3));
    // It goes out in its place: after the answer to a query sent ahead of
    // it and before the answer to one sent behind it, though no command
    // came between them (one packet).
    let mut packet = Vec::new();
    for message in [
        ClientMessage::QueryBalances { request: 7 },
        limit(5, Side::Buy, 90, 1, TimeInForce::Gtc),
        ClientMessage::QueryOpenOrders { request: 8, instrument: None },
    ] {
        crossbook_protocol::encode_client(&message, &mut packet);
    }
    alice.send_bytes(&packet).unwrap();
    let mut seen = Vec::new();
    loop {
        match alice.recv() {
            Some(ServerMessage::ExecutionReport(r)) => seen.push(format!("{:?} {} {}", r.kind, r.cid, r.reason)),
            Some(ServerMessage::Balance { .. }) => seen.push("Balance".into()),
            Some(ServerMessage::OpenOrder(o)) => seen.push(format!("OpenOrder {}", o.cid)),
            Some(ServerMessage::QueryDone { request: 7, .. }) => seen.push("QueryDone 7".into()),
            Some(ServerMessage::QueryDone { request: 8, .. }) => break,
            other => panic!("unexpected {other:?} after {seen:?}"),
        }
    }
    assert_eq!(seen, ["Balance", "Balance", "QueryDone 7", "Rejected 5 100", "OpenOrder 1", "OpenOrder 2"], "in the order sent");
    // An order that cannot rest is not held to it: an IOC at the limit
    // reaches the engine (and, with nothing to meet, is cancelled).
    alice.send(&limit(4, Side::Sell, 200, 1, TimeInForce::Ioc));
    let ioc = alice.report();
    assert_eq!((ioc.kind, ioc.cid), (ReportKind::Accepted, 4), "{ioc:?}");
    assert!(ioc.seq > 0);
    assert_eq!(alice.report().kind, ReportKind::Cancelled);
    // A cancel makes room again; the numbered stream went on undisturbed.
    alice.send(&ClientMessage::Cancel { order: 0 });
    let _ = alice.report();
    let (mut bob, _) = Client::login(&server.address, 2, "bob");
    // Two sessions are the limit: a third login is refused.
    let (mut third, reply) = Client::login(&server.address, 3, "mallory");
    assert_eq!(reply, ServerMessage::LoginRejected { reason: ProtocolError::ServerBusy });
    assert_eq!(third.recv(), None);
    server.expect_log("limits.max_connections");
    // Connections that never log in do not count against it.
    let idle: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(&server.fix_address).unwrap()).collect();
    drop(idle);
    bob.send(&ClientMessage::Heartbeat);
    assert_eq!(bob.recv(), Some(ServerMessage::Heartbeat));

    // The limit is the sequencer's, for every gateway: Bob's order over the
    // binary protocol and one over FIX fill his two; a third over FIX is
    // refused in FIX (its ClOrdID not used up), and once one is cancelled
    // the same ClOrdID goes through.
    use crate::fix::{FixClient, expect, order, send_owned};
    bob.send(&limit(1, Side::Buy, 80, 1, TimeInForce::Gtc));
    let binary_order = bob.report();
    assert_eq!(binary_order.kind, ReportKind::Accepted);
    let mut fix = FixClient::connect(&server.fix_address, "BOBFIX");
    fix.logon(2, "bob");
    send_owned(&mut fix, "D", &order("F1", "1", "81", "1"));
    expect(&fix.next(), &[(150, "0"), (11, "F1")]);
    send_owned(&mut fix, "D", &order("F2", "1", "82", "1"));
    let refused = fix.next();
    expect(&refused, &[(35, "8"), (150, "8"), (39, "8"), (11, "F2"), (103, "99"), (58, "open order limit reached"), (37, "NONE")]);
    assert!(refused.text(17).is_some_and(|id| id.starts_with("gw-")), "{}", crossbook_fix::wire::printable(refused.raw()));
    // Bob's binary session hears of his FIX order (an account's stream is
    // one), not of the FIX refusal, which is FIX's to answer.
    assert_eq!(bob.report().kind, ReportKind::Accepted);
    bob.send(&ClientMessage::Cancel { order: binary_order.order });
    let cancelled = bob.report();
    assert_eq!((cancelled.kind, cancelled.order), (ReportKind::Cancelled, binary_order.order));
    send_owned(&mut fix, "D", &order("F2", "1", "82", "1"));
    expect(&fix.next(), &[(150, "4"), (11, "1")]);
    expect(&fix.next(), &[(150, "0"), (11, "F2")]);
    assert!(server.terminate().success());
}

#[test]
fn a_login_past_the_history_learns_what_was_taken_back() {
    // Only an async-mode power cut does this: the client saw reports of
    // commands the journal lost. The login is accepted with the truth
    // (`next_seq` at or below `last_seen`), nothing is replayed, the
    // server says so in its log, and numbering goes on from the truth.
    let dir = temp_dir("taken-back");
    let server = start(&dir);
    let (client, reply) = crossbook_client::binary::Client::login(&server.address, 1, "alice", 50).unwrap();
    let mut alice = Client(client);
    match reply {
        ServerMessage::LoginAccepted { next_seq, account, .. } => assert_eq!((next_seq, account), (1, 1)),
        other => panic!("login answered {other:?}"),
    }
    server.expect_log("account 1 saw reports up to 50 but the history ends at 0: reports 1..=50 were taken back with their commands");
    alice.send(&limit(1, Side::Buy, 90, 1, TimeInForce::Gtc));
    let accepted = alice.report();
    assert_eq!((accepted.kind, accepted.seq), (ReportKind::Accepted, 1), "the first report after the login, not one replayed");
    assert!(server.terminate().success());
}

#[test]
fn an_idle_session_leaves_the_server_asleep() {
    // The gateway sleeps in epoll until a socket, the journal or the FIX
    // gateway wakes it. A connection left marked for reading after its
    // commands were answered once made every round skip that sleep: one
    // core spent on a busy loop, taken from the journal and the clients.
    let dir = temp_dir("idle");
    let server = start(&dir);
    let (mut alice, _) = Client::login(&server.address, 1, "alice");
    alice.send(&limit(1, Side::Buy, 90, 1, TimeInForce::Gtc));
    assert_eq!(alice.report().kind, ReportKind::Accepted);
    // Longer than the 5 s between throughput lines: an idle server logs
    // none (one line per 5 s of nothing once flooded the log).
    std::thread::sleep(Duration::from_millis(5600));
    alice.send(&ClientMessage::Heartbeat);
    assert_eq!(alice.recv(), Some(ServerMessage::Heartbeat));
    let startup = server.startup.join("\n");
    let (status, lines) = server.terminate_with_log();
    assert!(status.success());
    let throughput: Vec<&String> = lines.iter().filter(|l| l.starts_with("throughput")).collect();
    assert!(throughput.len() <= 1, "an idle server keeps logging its throughput: {throughput:?}");
    // The start-up log says where, in what mode, and what was recovered.
    assert!(startup.contains(&format!("starting: data directory {}, ", dir.join("data").display())), "{startup}");
    assert!(startup.contains("durability sync"), "{startup}");
    assert!(startup.contains("binary protocol on 127.0.0.1:"), "{startup}");
    assert!(startup.contains("recovered seq 0 from the start of the journal (no snapshot)"), "{startup}");
    assert!(startup.contains("new venue: "), "{startup}");
    let rounds: u64 = lines
        .iter()
        .find_map(|line| line.strip_prefix("gateway: ")?.strip_suffix(" polling rounds")?.parse().ok())
        .expect("the server logs its polling rounds when it stops");
    // About 20 a second while idle (one per 50 ms tick) plus one per
    // message; a busy loop makes hundreds of thousands.
    assert!(rounds < 1_000, "{rounds} polling rounds for 2 seconds of an idle session");
    // The shutdown figures count what was served (one order) and, in sync
    // mode, one fdatasync per write (the demo set-up's and the order's).
    let served = lines.iter().find_map(|line| line.strip_prefix("in the server: ")).expect("the server logs its own latency");
    assert!(served.starts_with("1 commands, applied to reports released p50 "), "{served}");
    let journal = lines.iter().find_map(|line| line.strip_prefix("journal: ")).expect("the server logs its journal figures");
    let count = |word: &str| -> u64 {
        let before = &journal[..journal.find(word).unwrap_or_else(|| panic!("{journal}"))];
        before.trim_end().rsplit([' ', ';']).next().and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{journal}"))
    };
    assert!(count(" writes,") >= 1, "{journal}");
    assert_eq!(count(" writes,"), count(" fdatasyncs,"), "{journal}");
}
