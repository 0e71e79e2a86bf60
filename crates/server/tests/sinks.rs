//! A gateway added from outside (`serve_with_sinks`) sees what the built-in
//! ones see: every durable command once, in sequence order, with its
//! reports and the engine's events, and at start-up every journaled command
//! again with the very same events (they are a function of the journal).

use crossbook_engine::{Event, EventKind, OrderType, SelfTradePrevention, Side, TimeInForce};
use crossbook_protocol::{ClientMessage, NewOrder, ReportKind, ServerMessage};
use crossbook_server::config::{Config, demo_key};
use crossbook_server::sink::{Durable, Released, ReportSink};
use crossbook_server::{Controls, serve_with_sinks};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::channel;
use std::sync::{Arc, Mutex};

#[derive(Default)]
struct Seen {
    released: Vec<(u64, Vec<Event>)>,
    recovered: Vec<(u64, Vec<Event>)>,
}

struct Recorder(Arc<Mutex<Seen>>);

impl ReportSink for Recorder {
    fn released(&mut self, batch: &Released<'_>) {
        let mut seen = self.0.lock().expect("lock");
        seen.released.extend(batch.durable().map(|d| (d.seq, d.events.to_vec())));
    }

    fn recovered(&mut self, durable: &Durable<'_>) {
        self.0.lock().expect("lock").recovered.push((durable.seq, durable.events.to_vec()));
    }
}

fn config(dir: &std::path::Path) -> Config {
    let mut config = Config::from_toml("demo = true\nlisten = \"127.0.0.1:0\"\ndurability = \"sync\"\n").expect("a valid configuration");
    config.data_dir = dir.to_path_buf();
    config.fix.listen = String::new();
    config.market_data.listen = String::new();
    config
}

/// Runs a venue with a recorder until `work` is done with its address.
fn with_venue(dir: &std::path::Path, work: impl FnOnce(&str)) -> Seen {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let shutdown = Arc::new(AtomicBool::new(false));
    let controls = Controls { shutdown: shutdown.clone(), snapshot: Arc::new(AtomicBool::new(false)), reload: Arc::new(AtomicBool::new(false)), reread: None, lock: None };
    let (tell, address) = channel();
    let sink = Box::new(Recorder(seen.clone()));
    let config = config(dir);
    let venue = std::thread::spawn(move || serve_with_sinks(config, controls, vec![sink], move |a| { let _ = tell.send(a); }));
    let address = address.recv_timeout(std::time::Duration::from_secs(30)).expect("the venue listens").to_string();
    work(&address);
    shutdown.store(true, Ordering::Release);
    venue.join().expect("the venue thread").expect("the venue stops cleanly");
    Arc::try_unwrap(seen).ok().expect("the venue dropped its sinks").into_inner().expect("lock")
}

fn order(cid: u64, side: Side, price: i64) -> ClientMessage {
    ClientMessage::NewOrder(NewOrder {
        cid,
        instrument: 1,
        side,
        order_type: OrderType::Limit,
        tif: TimeInForce::Gtc,
        post_only: false,
        stp: SelfTradePrevention::None,
        price,
        qty: 2,
        budget: None,
    })
}

#[test]
fn an_added_gateway_sees_every_durable_command_live_and_again_at_start_up() {
    let dir = std::env::temp_dir().join(format!("crossbook-sinks-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let live = with_venue(&dir, |address| {
        let login = |account| {
            let (client, reply) = crossbook_client::binary::Client::login(address, account, &demo_key(account), 0).expect("login");
            assert!(matches!(reply, ServerMessage::LoginAccepted { .. }), "{reply:?}");
            client
        };
        let (mut alice, mut bob) = (login(1), login(2));
        alice.send(&order(7, Side::Sell, 10_000)).expect("send");
        let accepted = alice.recv().expect("recv");
        assert!(matches!(accepted, Some(ServerMessage::ExecutionReport(r)) if r.kind == ReportKind::Accepted && r.cid == 7), "{accepted:?}");
        bob.send(&order(8, Side::Buy, 10_000)).expect("send");
        let mut kinds = Vec::new();
        while kinds.len() < 2 {
            if let Some(ServerMessage::ExecutionReport(r)) = bob.recv().expect("recv") {
                kinds.push(r.kind);
            }
        }
        assert_eq!(kinds, [ReportKind::Accepted, ReportKind::Fill]);
    });
    // The set-up commands of a new venue are journaled before it serves;
    // the two orders are the last two commands, in order, with their events.
    let seqs: Vec<u64> = live.released.iter().map(|(seq, _)| *seq).collect();
    assert_eq!(seqs.len(), 2, "{seqs:?}");
    assert_eq!(seqs[1], seqs[0] + 1);
    let (_, sell) = &live.released[0];
    assert!(matches!(sell[0].kind, EventKind::Accepted { cid: 7, account: 1, .. }), "{sell:?}");
    let (_, buy) = &live.released[1];
    assert!(buy.iter().any(|e| matches!(e.kind, EventKind::Trade { maker_account: 1, taker_account: 2, qty: 2, price: 10_000, .. })), "{buy:?}");
    assert!(live.recovered.iter().all(|(seq, _)| *seq < seqs[0]), "a new venue re-reads only its set-up");

    // Restarted: every journaled command again, in order, and the two
    // orders with exactly the events they had live.
    let again = with_venue(&dir, |_| {});
    let recovered_seqs: Vec<u64> = again.recovered.iter().map(|(seq, _)| *seq).collect();
    assert_eq!(recovered_seqs, (1..=seqs[1]).collect::<Vec<u64>>());
    assert_eq!(&again.recovered[again.recovered.len() - 2..], &live.released[..]);
    assert!(again.released.is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}
