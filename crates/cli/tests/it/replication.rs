//! Replication over NATS JetStream against a real three-node JetStream
//! cluster on loopback (`nats-server`, Debian's package; `.ci/run`
//! installs it): a follower applies the log to the same state as the
//! leader and refuses orders with a redirect; the leader killed under load
//! loses nothing any client saw acknowledged, a standby takes over, and
//! sessions reconnecting to it get exactly what they missed; a leader
//! paused past its lease is fenced when it wakes and rejoins as a
//! follower; one NATS node lost is a pause, two stop acknowledgements until
//! one comes back. Every wait is bounded.
//!
//! Without `nats-server` on the PATH these tests say so and pass, unless
//! `CROSSBOOK_REQUIRE_NATS` is set (`.ci/run` sets it): then they fail.
//! `CROSSBOOK_FAILOVER_TRIALS=N` runs the kill trial N times (default 2;
//! `scripts/failover-trials` runs hundreds).

use crate::serve::{Client, Server, limit, spawn_process};
use crate::support::TempDir;
use crossbook_engine::{Side, TimeInForce};
use crossbook_protocol::*;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Whether the tests can run here.
fn nats_available() -> bool {
    let found = Command::new("nats-server").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success());
    if !found {
        assert!(std::env::var_os("CROSSBOOK_REQUIRE_NATS").is_none(), "nats-server is not installed (apt-get install nats-server; .ci/run does)");
        eprintln!("NOTE: nats-server is not installed: the replication tests are skipped (apt-get install nats-server)");
    }
    found
}

/// A three-node JetStream cluster on loopback.
struct Nats {
    dir: PathBuf,
    client_ports: [u16; 3],
    cluster_ports: [u16; 3],
    monitor_ports: [u16; 3],
    nodes: [Option<Child>; 3],
}

impl Nats {
    fn start(dir: &Path) -> Nats {
        // Nine distinct free ports: the listeners are held until all are
        // chosen (a port given back could be handed out again at once).
        let held: Vec<TcpListener> = (0..9).map(|_| TcpListener::bind("127.0.0.1:0").expect("a free port")).collect();
        let port = |i: usize| held[i].local_addr().expect("an address").port();
        let mut nats = Nats {
            dir: dir.join("nats"),
            client_ports: [port(0), port(1), port(2)],
            cluster_ports: [port(3), port(4), port(5)],
            monitor_ports: [port(6), port(7), port(8)],
            nodes: [None, None, None],
        };
        drop(held);
        for node in 0..3 {
            nats.start_node(node);
        }
        nats.wait_ready();
        nats
    }

    fn start_node(&mut self, node: usize) {
        let store = self.dir.join(format!("n{node}"));
        std::fs::create_dir_all(&store).unwrap();
        let routes: Vec<String> = self.cluster_ports.iter().map(|p| format!("nats-route://127.0.0.1:{p}")).collect();
        let config = format!(
            "server_name: n{node}\nlisten: 127.0.0.1:{}\nhttp: 127.0.0.1:{}\njetstream {{\n  store_dir: \"{}\"\n  max_memory_store: 64MB\n  max_file_store: 1GB\n}}\ncluster {{\n  name: crossbook\n  listen: 127.0.0.1:{}\n  routes: [{}]\n}}\n",
            self.client_ports[node],
            self.monitor_ports[node],
            store.display(),
            self.cluster_ports[node],
            routes.join(", ")
        );
        let path = self.dir.join(format!("n{node}.conf"));
        std::fs::write(&path, config).unwrap();
        let log = std::fs::File::create(self.dir.join(format!("n{node}.log"))).unwrap();
        let child = Command::new("nats-server").arg("-c").arg(&path).stdout(Stdio::null()).stderr(log).spawn().expect("starting nats-server");
        self.nodes[node] = Some(child);
    }

    /// Until the cluster has a JetStream meta leader (30 s at most).
    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let live = (0..3).filter(|n| self.nodes[*n].is_some());
            let ready = live.into_iter().any(|n| {
                let address = format!("127.0.0.1:{}", self.monitor_ports[n]);
                // Not listening yet: not ready.
                if std::net::TcpStream::connect(&address).is_err() {
                    return false;
                }
                let (status, body) = crate::marketdata::http_get(&address, "/jsz");
                // A leader, and every other node a current peer of it.
                status == 200
                    && serde_json::from_str::<serde_json::Value>(&body).is_ok_and(|v| {
                        let meta = &v["meta_cluster"];
                        let peers = meta["replicas"].as_array().map_or(0, |r| r.iter().filter(|p| p["current"].as_bool() == Some(true)).count());
                        meta["leader"].as_str().is_some_and(|l| !l.is_empty()) && peers + 1 >= self.nodes.iter().filter(|n| n.is_some()).count()
                    })
            });
            if ready {
                return;
            }
            if Instant::now() >= deadline {
                let logs: Vec<String> = (0..3).map(|n| std::fs::read_to_string(self.dir.join(format!("n{n}.log"))).unwrap_or_default()).map(|l| l.lines().rev().take(8).collect::<Vec<_>>().join("\n")).collect();
                panic!("the NATS cluster has no JetStream meta leader after 30 s; its logs end:\n{}", logs.join("\n---\n"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The servers' URLs.
    fn url_list(&self) -> Vec<String> {
        self.client_ports.iter().map(|p| format!("nats://127.0.0.1:{p}")).collect()
    }

    /// The servers' URLs as `crossbook.toml` lists them.
    fn urls(&self) -> String {
        self.url_list().iter().map(|url| format!("\"{url}\"")).collect::<Vec<_>>().join(", ")
    }

    fn kill(&mut self, node: usize) {
        if let Some(mut child) = self.nodes[node].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        for node in 0..3 {
            self.kill(node);
        }
    }
}

/// Lease times of the tests' nodes (`node_config`).
const FAST_LEASE: u64 = 1_000;
const STEADY_LEASE: u64 = 5_000;

/// A node's configuration: the default venue, FIX off, async local
/// journal, REST limits raised, and the cluster, with a lease of
/// `lease_ms`: short (`FAST_LEASE`) where a test is about a takeover,
/// longer (`STEADY_LEASE`) where one would only be a loaded machine's
/// stall mistaken for a dead leader.
fn node_config(dir: &Path, name: &str, nats: &Nats, stream: &str, lease_ms: u64) -> PathBuf {
    let base = std::fs::read_to_string(crate::support::repo_root().join("crossbook.toml")).unwrap();
    let config = base
        .replacen("listen = \"127.0.0.1:7701\"", "listen = \"\"", 1)
        .replacen("durability = \"sync\"", "durability = \"async\"", 1)
        .replacen("[[assets]]", &format!("[replication]\nnats = [{}]\nstream = \"{stream}\"\nreplicas = 3\nnode = \"{name}\"\nlease_ttl_ms = {lease_ms}\nconnect_timeout_s = 15\n\n[[assets]]", nats.urls()), 1);
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, config).unwrap();
    path
}

/// Starts a node: `serve` (a candidate) or `follow --standby`.
fn node(dir: &Path, name: &str, nats: &Nats, stream: &str, follow: bool, lease_ms: u64) -> Server {
    let config = node_config(dir, name, nats, stream, lease_ms);
    let data = dir.join(name);
    let first: &[&str] = if follow { &["follow", "--standby"] } else { &["serve"] };
    // Fixed ports: a node that loses the lead starts again in the same
    // process, on the same addresses.
    let ports = dir.join(format!("{name}.ports"));
    let (binary, market) = match std::fs::read_to_string(&ports).ok().and_then(|t| t.split_once(' ').map(|(a, b)| (a.to_string(), b.to_string()))) {
        Some(known) => known,
        None => {
            let (a, b) = (TcpListener::bind("127.0.0.1:0").expect("a free port"), TcpListener::bind("127.0.0.1:0").expect("a free port"));
            let address = |l: &TcpListener| l.local_addr().expect("an address").to_string();
            let chosen = (address(&a), address(&b));
            std::fs::write(&ports, format!("{} {}", chosen.0, chosen.1)).unwrap();
            chosen
        }
    };
    spawn_process(first, &["--config", config.to_str().unwrap(), "--data", data.to_str().unwrap(), "--listen", &binary, "--market-listen", &market], &[])
}

/// Until both are at the same sequence number (20 s at most).
fn wait_same_seq(a: &Server, b: &Server) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (x, y) = (a.market_seq(), b.market_seq());
        if x == y && x > 0 {
            return x;
        }
        assert!(Instant::now() < deadline, "the nodes stay at {x} and {y}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Until `server` is at the sequence number a leader's reload `line`
/// journaled up to, if it journaled anything (the leader's market data
/// moves only once a quorum has it: both nodes can still be at the seq
/// before).
fn wait_journaled(server: &Server, line: &str) {
    let Some(seq) = line.split("journaled up to seq ").nth(1).and_then(|rest| rest.split(')').next()).and_then(|n| n.parse::<u64>().ok()) else { return };
    let deadline = Instant::now() + Duration::from_secs(20);
    while server.market_seq() < seq {
        assert!(Instant::now() < deadline, "stays before {seq}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `crossbook recover`'s state hash of a data directory.
fn state_hash(data: &Path) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_crossbook")).args(["recover", "--journal", data.to_str().unwrap()]).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8_lossy(&output.stderr).into_owned() + &String::from_utf8_lossy(&output.stdout);
    text.lines().find_map(|l| l.strip_prefix("state-sha256 ")).map(str::to_string).unwrap_or_else(|| panic!("no state hash in {text}"))
}

/// A leader on `stream` taking orders (node `a`), then a standby
/// following it (node `b`), with lease `lease_ms`.
fn leader_and_standby(dir: &Path, nats: &Nats, stream: &str, lease_ms: u64) -> (Server, Server) {
    let leader = node(dir, "a", nats, stream, false, lease_ms);
    leader.expect_log_within("replication: taking orders", Duration::from_secs(20));
    let standby = node(dir, "b", nats, stream, true, lease_ms);
    assert!(standby.startup.iter().any(|l| l.contains("following the log")), "{:?}", standby.startup);
    (leader, standby)
}

fn load(address: &str, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_crossbook")).args(["load", "--address", address, "--connections", "4", "--json"]).args(args).stderr(Stdio::null()).output().unwrap()
}

#[test]
fn a_follower_applies_the_log_and_refuses_orders_with_a_redirect() {
    if !nats_available() {
        return;
    }
    let dir = TempDir::new("replication-follow");
    let nats = Nats::start(&dir.0);
    let (leader, follower) = leader_and_standby(&dir.0, &nats, "FOLLOW", STEADY_LEASE);
    assert!(follower.startup.iter().any(|l| l.contains("following the log from stream message 1")), "{:?}", follower.startup);
    let output = load(&leader.address, &["--count", "20000"]);
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("load report");
    assert_eq!((report["errors"].as_u64(), report["unanswered"].as_u64()), (Some(0), Some(0)), "{report}");
    // A burst in one write: one batch too big for one message of the log
    // (it goes in several; the follower takes them all).
    let (burst, _) = crossbook_client::binary::Client::login(&leader.address, 5, "demo-key-5", u64::MAX).unwrap();
    let mut burst = Client(burst);
    let mut frames = Vec::new();
    for cid in 0..5_000u64 {
        encode_client(&limit(cid, Side::Buy, 5_000 - (cid % 100) as i64, 1, TimeInForce::Gtc), &mut frames);
    }
    burst.send_bytes(&frames).unwrap();
    for _ in 0..5_000 {
        assert_eq!(burst.report().kind, ReportKind::Accepted);
    }
    let seq = wait_same_seq(&leader, &follower);
    assert!(seq > 25_000, "{seq}");
    // The follower's market data is the leader's (its market-data thread
    // publishes a moment after the engine has applied a batch: a loaded
    // test run once read it in between).
    let depth = |s: &Server| crate::marketdata::http_get(&s.market_address, "/api/v3/depth?symbol=BTCUSD&limit=50").1;
    let deadline = Instant::now() + Duration::from_secs(10);
    while depth(&leader) != depth(&follower) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(depth(&leader), depth(&follower));
    // It refuses orders, saying where the leader is.
    let redirect = |message: Option<ServerMessage>| match message {
        Some(ServerMessage::Redirect { leader }) => redirect_address(&leader),
        other => panic!("expected a Redirect, got {other:?}"),
    };
    let (client, reply) = crossbook_client::binary::Client::login(&follower.address, 1, "demo-key-1", u64::MAX).unwrap();
    let mut client = Client(client);
    assert!(matches!(reply, ServerMessage::LoginAccepted { .. }), "{reply:?}");
    assert_eq!(redirect(client.recv()), leader.address);
    client.send(&limit(77, Side::Buy, 9_000, 1, TimeInForce::Gtc));
    let refused = client.report();
    assert_eq!((refused.kind, refused.reason, refused.seq, refused.cid), (ReportKind::Rejected, reports::NOT_LEADER, 0, 77));
    assert_eq!(redirect(client.recv()), leader.address);
    // Over REST: a 307 to the leader's same endpoint.
    let mut stream = std::net::TcpStream::connect(&follower.market_address).unwrap();
    use std::io::{Read, Write};
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(stream, "POST /api/v3/order?symbol=BTCUSD HTTP/1.1\r\nHost: x\r\nX-MBX-APIKEY: demo-key-1\r\nConnection: close\r\nContent-Length: 0\r\n\r\n").unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 307"), "{answer}");
    assert!(answer.to_ascii_lowercase().contains(&format!("location: http://{}/api/v3/order?symbol=btcusd", leader.market_address).to_ascii_lowercase()), "{answer}");
    // SIGHUP on the leader opens an account its file adds, replicated; on
    // the follower (the log brought it the account first), it installs
    // the account's key: the account logs in there and sees its deposit.
    let added = "\n[[accounts]]\nid = 98\napi_key = \"key-98\"\ndeposits = [[2, 555]]\n";
    for (server, name) in [(&leader, "a"), (&follower, "b")] {
        let config = dir.0.join(format!("{name}.toml"));
        let grown = std::fs::read_to_string(&config).unwrap() + added;
        std::fs::write(&config, grown).unwrap();
        assert!(Command::new("kill").args(["-HUP", &server.child_id().to_string()]).status().unwrap().success());
        let line = server.expect_log_within("configuration reloaded:", Duration::from_secs(10));
        let opened = if name == "a" { "opened 98 (journaled up to seq" } else { "opened none" };
        assert!(line.contains(opened), "{name}: {line}");
        wait_journaled(&follower, &line);
    }
    let (follower_session, reply) = crossbook_client::binary::Client::login(&follower.address, 98, "key-98", u64::MAX).unwrap();
    assert!(matches!(reply, ServerMessage::LoginAccepted { .. }), "{reply:?}");
    let mut follower_session = Client(follower_session);
    assert_eq!(redirect(follower_session.recv()), leader.address);
    assert_eq!(crate::trading::binary_balances(&mut follower_session, 1).0.get(&2), Some(&(555, 0)));
    drop(follower_session);
    // A new asset and instrument: in the follower's file first (a reload
    // there lists nothing: it waits for the leader), then in the
    // leader's, which journals and replicates them; the follower lists
    // them with its file's units as the log brings them.
    let listed = "\n[[assets]]\nid = 3\nname = \"ETH\"\ndecimals = 4\n\n[[instruments]]\nid = 2\nsymbol = \"ETH-USD\"\nbase = 3\nquote = 2\ntick_size = 1\nlot_size = 10\nmin_qty = 1\nmax_qty = 1000\nmin_price = 1\nmax_price = 100000\nmaker_bps = 0\ntaker_bps = 0\nfix_price_unit = \"10\"\nfix_qty_unit = \"0.001\"\n";
    for (server, name) in [(&follower, "b"), (&leader, "a")] {
        let config = dir.0.join(format!("{name}.toml"));
        let grown = std::fs::read_to_string(&config).unwrap() + listed;
        std::fs::write(&config, grown).unwrap();
        assert!(Command::new("kill").args(["-HUP", &server.child_id().to_string()]).status().unwrap().success());
        let line = server.expect_log_within("configuration reloaded:", Duration::from_secs(10));
        let said = if name == "a" { "listed asset 3 (ETH), instrument 2 (ETH-USD) (journaled up to seq" } else { "listed asset 3 (ETH), instrument 2 (ETH-USD) when this node leads" };
        assert!(line.contains(said), "{name}: {line}");
        wait_journaled(&follower, &line);
    }
    follower.expect_log_within("market data: instrument 2 (ETH-USD) listed as ETHUSD", Duration::from_secs(10));
    wait_same_seq(&leader, &follower);
    let info = |s: &Server| serde_json::from_str::<serde_json::Value>(&crate::marketdata::http_get(&s.market_address, "/api/v3/exchangeInfo?symbol=ETHUSD").1).unwrap()["symbols"].clone();
    assert_eq!(info(&follower)[0]["filters"][0]["tickSize"], "10", "{}", info(&follower));
    assert_eq!(info(&leader), info(&follower));
    // Both stopped, both journals recover to the same state.
    assert!(follower.terminate().success());
    assert!(leader.terminate().success());
    assert_eq!(state_hash(&dir.0.join("a")), state_hash(&dir.0.join("b")));
    // Pointed at another (empty) log, a node with history refuses to start
    // rather than cut its journal to nothing.
    let config = node_config(&dir.0, "a", &nats, "ANOTHER", STEADY_LEASE);
    std::fs::write(&config, std::fs::read_to_string(&config).unwrap() + listed).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_crossbook"))
        .args(["serve", "--config", config.to_str().unwrap(), "--data", dir.0.join("a").to_str().unwrap(), "--listen", "127.0.0.1:0", "--market-listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && said.contains("holds no command"), "{said}");
    assert_eq!(state_hash(&dir.0.join("a")), state_hash(&dir.0.join("b")), "nothing was cut");
    // Started again with an account added to its configuration, the node
    // that leads appends it (and its deposit) to the log.
    let config = node_config(&dir.0, "a", &nats, "FOLLOW", STEADY_LEASE);
    let grown = std::fs::read_to_string(&config).unwrap() + listed + "\n[[accounts]]\nid = 99\napi_key = \"key-99\"\ndeposits = [[2, 777]]\n";
    std::fs::write(&config, grown).unwrap();
    let data = dir.0.join("a");
    let leader = spawn_process(&["serve"], &["--config", config.to_str().unwrap(), "--data", data.to_str().unwrap(), "--listen", "127.0.0.1:0", "--market-listen", "127.0.0.1:0"], &[]);
    leader.expect_log_within("from the configuration: 2 commands adding what the venue lacked, replicated", Duration::from_secs(20));
    // It takes orders (and says so to a login) once they are released.
    leader.expect_log_within("replication: taking orders", Duration::from_secs(20));
    let (mut carol, _) = Client::login(&leader.address, 99, "key-99");
    assert_eq!(crate::trading::binary_balances(&mut carol, 1).0.get(&2), Some(&(777, 0)));
    drop(carol);
    assert!(leader.terminate().success());
}

/// A follower that meets a message going on from before its own last
/// command (the log went on without a message it applied: seen once with
/// two of three NATS nodes killed) stops, saying so, rather than go on
/// with a history that is not the log's; started again, it cuts its
/// journal back to the log. The message here is a leadership marker
/// written by the test after command K - 1, the follower being at K.
#[test]
fn a_follower_holding_what_the_log_does_not_stops() {
    if !nats_available() {
        return;
    }
    let dir = TempDir::new("replication-ahead");
    let nats = Nats::start(&dir.0);
    let (leader, mut follower) = leader_and_standby(&dir.0, &nats, "AHEAD", STEADY_LEASE);
    let output = load(&leader.address, &["--count", "2000"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stdout));
    let seq = wait_same_seq(&leader, &follower);
    let config = crossbook_replication::Config { urls: nats.url_list(), stream: "AHEAD".into(), replicas: 3, lease_ttl: Duration::from_millis(STEADY_LEASE), node: "test".into(), connect_timeout: Duration::from_secs(15) };
    let log = crossbook_replication::Log::connect(config).expect("the log");
    let last = log.last().expect("the log's end").expect("a message");
    assert_eq!(last.span.last, seq);
    let behind = log.mark_leader(1 << 40, last.stream_seq, seq - 1, 0).expect("a marker appended");
    assert_eq!(behind, Some(last.stream_seq + 1));
    let status = follower.wait_exit(Duration::from_secs(20)).expect("the follower stops");
    assert_eq!(status.code(), Some(1));
    follower.expect_log_within(&format!("stream message {} goes on from command {}, but this node applied up to command {seq}: it holds commands the log does not", last.stream_seq + 1, seq - 1), Duration::from_secs(5));
    drop(leader);
}

/// One failover trial: the leader is killed (-9) under `crossbook load`;
/// the standby takes over; every acknowledged order is in it; every
/// session, reconnecting to it with the last report it saw, is sent exactly
/// what it missed; the old leader comes back as a follower and the states
/// agree.
fn failover_trial(trial: u64) {
    let dir = TempDir::new(&format!("replication-failover-{trial}"));
    let nats = Nats::start(&dir.0);
    let stream = format!("FAILOVER{trial}");
    let (leader, standby) = leader_and_standby(&dir.0, &nats, &stream, FAST_LEASE);
    let acked_file = dir.0.join("acked.txt");
    let seen_file = dir.0.join("last-seen.txt");
    let mut generator = Command::new(env!("CARGO_BIN_EXE_crossbook"))
        .args(["load", "--address", &leader.address, "--connections", "4", "--duration", "30", "--json"])
        .args(["--acked-out", acked_file.to_str().unwrap(), "--last-seen-out", seen_file.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Somewhere in the run (the trial number moves the moment), once
    // it is under way however slow the machine.
    leader.wait_market_seq(leader.market_seq() + 300);
    std::thread::sleep(Duration::from_millis((trial * 211) % 1500));
    assert!(generator.try_wait().unwrap().is_none(), "trial {trial}: the load is still running (the kill ends it)");
    let killed_at = Instant::now();
    leader.kill();
    let _ = generator.wait_with_output().unwrap();
    standby.expect_log_within("replication: taking orders", Duration::from_secs(30));
    let failover = killed_at.elapsed();
    // The new leader takes orders at once.
    let (mut client, _) = Client::login(&standby.address, 9, "demo-key-9");
    client.send(&limit(1, Side::Buy, 1, 1, TimeInForce::Gtc));
    assert_eq!(client.report().kind, ReportKind::Accepted);
    eprintln!("trial {trial}: leader killed, the standby leads and acknowledges after {} ms", failover.as_millis());
    let acked = crate::support::number_pairs(&acked_file);
    assert!(acked.len() > 100, "trial {trial}: only {} orders acknowledged before the kill", acked.len());
    // Sessions come back to the new leader with the last report they saw.
    let last_seen = crate::support::number_pairs(&seen_file);
    for (account, seen) in last_seen {
        let key = format!("demo-key-{account}");
        let (mut session, reply) = crossbook_client::binary::Client::login(&standby.address, account, &key, seen).unwrap();
        let ServerMessage::LoginAccepted { next_seq, .. } = reply else { panic!("trial {trial}: account {account}: {reply:?}") };
        assert!(next_seq > seen, "trial {trial}: account {account} saw report {seen}, which the new leader does not have (next {next_seq})");
        for expected in seen + 1..next_seq {
            match session.recv().unwrap() {
                Some(ServerMessage::ExecutionReport(r)) => assert_eq!(r.seq, expected, "trial {trial}: account {account}"),
                other => panic!("trial {trial}: account {account}: {other:?}"),
            }
        }
    }
    // The old leader comes back, as a follower, and catches up.
    let old = node(&dir.0, "a", &nats, &stream, false, FAST_LEASE);
    assert!(old.startup.iter().any(|l| l.contains("following the log")), "{:?}", old.startup);
    let seq = wait_same_seq(&old, &standby);
    assert!(standby.terminate().success());
    assert!(old.terminate().success());
    // Every acknowledged order is in the log, under its number.
    let inspect = Command::new(env!("CARGO_BIN_EXE_crossbook")).args(["journal", "inspect", dir.0.join("b").to_str().unwrap()]).output().unwrap();
    let journal = String::from_utf8(inspect.stdout).unwrap();
    let lines: Vec<&str> = journal.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(lines.len() as u64, seq);
    for (order, cid) in &acked {
        let line = lines.get(*order as usize - 1).unwrap_or_else(|| panic!("trial {trial}: order {order} is beyond the new leader's journal ({} records)", lines.len()));
        assert!(line.starts_with("place ") && line.contains(&format!(" cid={cid} ")), "trial {trial}: order {order}: {line:?}");
    }
    assert_eq!(state_hash(&dir.0.join("a")), state_hash(&dir.0.join("b")), "trial {trial}: the two nodes' states");
}

#[test]
fn kill_9_of_the_leader_under_load_loses_nothing_acknowledged() {
    if !nats_available() {
        return;
    }
    let trials: u64 = std::env::var("CROSSBOOK_FAILOVER_TRIALS").ok().and_then(|v| v.parse().ok()).unwrap_or(2);
    for trial in 0..trials {
        failover_trial(trial);
    }
}

#[test]
fn a_leader_paused_past_its_lease_is_fenced_when_it_wakes() {
    if !nats_available() {
        return;
    }
    let dir = TempDir::new("replication-pause");
    let nats = Nats::start(&dir.0);
    let (mut leader, standby) = leader_and_standby(&dir.0, &nats, "PAUSE", FAST_LEASE);
    let (mut alice, _) = Client::login(&leader.address, 1, "demo-key-1");
    alice.send(&limit(1, Side::Sell, 12_000, 5, TimeInForce::Gtc));
    assert_eq!(alice.report().kind, ReportKind::Accepted);
    // Paused past its lease: the standby takes over.
    let pid = leader.child_id().to_string();
    assert!(Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
    standby.expect_log_within("replication: taking orders", Duration::from_secs(30));
    // An order sent to the paused leader meanwhile.
    alice.send(&limit(2, Side::Sell, 12_001, 5, TimeInForce::Gtc));
    let (mut bob, _) = Client::login(&standby.address, 2, "demo-key-2");
    bob.send(&limit(1, Side::Buy, 12_000, 2, TimeInForce::Ioc));
    let _ = bob.report();
    assert!(Command::new("kill").args(["-CONT", &pid]).status().unwrap().success());
    // Woken, its append is refused: it says so, tells its sessions, and
    // starts again as a follower; the order it took while paused was never
    // acknowledged.
    leader.expect_log_within("no longer the leader", Duration::from_secs(20));
    loop {
        match alice.0.recv() {
            Ok(Some(ServerMessage::ExecutionReport(r))) => assert_ne!(r.cid, 2, "the paused leader's order is never acknowledged: {r:?}"),
            Ok(Some(ServerMessage::Error { reason })) => {
                assert_eq!(reason, ProtocolError::NotLeader);
                break;
            }
            Ok(None) => break,
            Ok(Some(_)) => {}
            Err(e) => panic!("{e}"),
        }
    }
    leader.expect_log_within("following the log", Duration::from_secs(20));
    assert!(!leader.exited());
    let seq = wait_same_seq(&leader, &standby);
    assert!(standby.terminate().success());
    assert!(leader.terminate().success());
    let hash = state_hash(&dir.0.join("a"));
    assert_eq!(hash, state_hash(&dir.0.join("b")));
    // Nothing twice, nothing of the fenced order: one place each of cids 1
    // (alice) and 1 (bob) after the set-up.
    let inspect = Command::new(env!("CARGO_BIN_EXE_crossbook")).args(["journal", "inspect", dir.0.join("a").to_str().unwrap()]).output().unwrap();
    let journal = String::from_utf8(inspect.stdout).unwrap();
    let places: Vec<&str> = journal.lines().filter(|l| l.starts_with("place ")).collect();
    assert_eq!(places.len(), 2, "{places:?}");
    assert_eq!(journal.lines().filter(|l| !l.starts_with('#')).count() as u64, seq);
}

#[test]
fn losing_one_nats_node_is_a_pause_and_losing_two_stops_acknowledging() {
    if !nats_available() {
        return;
    }
    let dir = TempDir::new("replication-nats-nodes");
    let mut nats = Nats::start(&dir.0);
    let leader = node(&dir.0, "a", &nats, "QUORUM", false, STEADY_LEASE);
    leader.expect_log_within("replication: taking orders", Duration::from_secs(20));
    let (mut alice, _) = Client::login(&leader.address, 1, "demo-key-1");
    alice.0.set_timeout(Duration::from_secs(30));
    let mut cid = 0;
    let mut order = |client: &mut Client| {
        cid += 1;
        client.send(&limit(cid, Side::Buy, 1_000 + cid as i64, 1, TimeInForce::Gtc));
        cid
    };
    // One node down: orders go on (a pause while JetStream elects).
    nats.kill(0);
    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    while started.elapsed() < Duration::from_secs(4) {
        let sent = Instant::now();
        let id = order(&mut alice);
        let report = alice.report();
        assert_eq!((report.kind, report.cid), (ReportKind::Accepted, id));
        slowest = slowest.max(sent.elapsed());
    }
    eprintln!("one NATS node down: the slowest acknowledgement took {} ms", slowest.as_millis());
    // Two down: no quorum, nothing is acknowledged.
    nats.kill(1);
    std::thread::sleep(Duration::from_millis(300));
    let waiting = order(&mut alice);
    alice.0.set_timeout(Duration::from_secs(3));
    let early = alice.0.recv();
    assert!(matches!(early, Err(crossbook_client::ClientError::TimedOut)), "an order acknowledged without a quorum: {early:?}");
    // One back: the order is acknowledged (it was held, not lost).
    nats.start_node(1);
    alice.0.set_timeout(Duration::from_secs(60));
    let report = alice.report();
    assert_eq!((report.kind, report.cid), (ReportKind::Accepted, waiting));
    // No quorum again, an order waiting for it, and the leader told to
    // stop: the session still gets its Logout (after the 5 s grace), before
    // the answer that could not come (the log may yet keep the order).
    nats.kill(1);
    std::thread::sleep(Duration::from_millis(300));
    order(&mut alice);
    std::thread::sleep(Duration::from_millis(300));
    let stopping = std::thread::spawn(move || leader.terminate());
    alice.0.set_timeout(Duration::from_secs(20));
    match alice.0.recv() {
        Ok(Some(ServerMessage::Logout { reason: 0 })) => {}
        other => panic!("expected the stopping server's Logout, got {other:?}"),
    }
    stopping.join().expect("the leader stops");
}
