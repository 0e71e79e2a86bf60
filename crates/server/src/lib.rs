//! `crossbook serve`: the exchange as a network service. This file is the
//! wiring; the parts have files of their own (docs/ARCHITECTURE.md has the
//! picture):
//!
//! - `sequencer.rs`: journals and applies commands, in the order they come,
//!   and hands each durable batch to every gateway through the
//!   [`sink::ReportSink`] trait (`sink.rs`); it knows no gateway;
//! - `gateway.rs` and `sessions.rs`: the binary protocol: one epoll over
//!   every connection, on the thread that also runs the sequencer, and the
//!   sessions, report histories and outbox it owns;
//! - `fix/`: the FIX 4.4 gateway, on threads of its own;
//! - `snapshotter.rs`, `replay.rs` (start-up: the journal re-read for the
//!   gateways), `error.rs`, `config.rs`, `ratelog.rs`.
//!
//! Threads besides those: the journal's **writer** (it wakes the gateway
//! after each group commit) and, in async mode, **syncer**.

mod checkpoint;
pub mod config;
mod error;
pub mod fix;
mod gateway;
mod keys;
mod listing;
mod market;
mod ratelog;
mod replay;
mod replica;
mod sequencer;
mod sessions;
pub mod sink;
mod snapshotter;

pub use crossbook_protocol::reports::OPEN_ORDER_LIMIT;
pub use error::ServeError;
pub use sequencer::Reread;

use config::Config;
use crossbook_journal::{Journal, JournalConfig, recover};
use sequencer::{Inbound, Sequencer, Settings};
use sink::ReportSink;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::sync_channel;
use std::time::Instant;

/// One line of the server's log (standard error). A log nobody reads any
/// more (its pipe closed) costs the venue nothing: the line is dropped,
/// never a panic.
pub fn log(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// A shared value's read guard; a panic elsewhere while it was held
/// (poisoning) does not stop the venue from reading it.
pub(crate) fn read<T>(lock: &std::sync::RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|e| e.into_inner())
}

/// A mutex's guard, poisoned or not (as [`read`]).
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// The wall clock in milliseconds since the Unix epoch (0 before it).
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// The wall clock in microseconds since the Unix epoch (0 before it).
pub(crate) fn now_us() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

/// What would make a start fail after a new venue's set-up is journaled:
/// an address that cannot be bound (one in use, say) and a FIX dictionary
/// that cannot be read. Each address is bound and let go at once; the
/// gateways bind them for good once the venue is recovered.
fn probe(config: &Config) -> Result<(), ServeError> {
    let addresses = [("listening on", &config.listen), ("listening for FIX on", &config.fix.listen), ("listening for market data on", &config.market_data.listen)];
    // All held at once: two ports configured alike fail here too.
    let mut held = Vec::new();
    for (what, address) in addresses.into_iter().filter(|(_, address)| !address.is_empty()) {
        held.push(TcpListener::bind(address.as_str()).map_err(ServeError::io(format!("{what} {address}")))?);
    }
    drop(held);
    if !config.fix.listen.is_empty() {
        fix::read_dictionary(&config.fix)?;
    }
    Ok(())
}

/// A venue that has run before takes from its configuration what it
/// lacks (a new asset, instrument or account, with the new account's
/// deposits; `sequencer::lacking`), journaled like any command; a
/// configuration that does not fit the journal is refused before anything
/// is journaled.
fn add_what_the_configuration_adds(config: &Config, engine: &mut crossbook_engine::Engine, journal: &mut Journal) -> Result<(), ServeError> {
    let lacking = sequencer::additions(config, engine)?;
    if lacking.is_empty() {
        return Ok(());
    }
    let refused = sequencer::set_up(engine, journal, &lacking)?;
    if let Some((command, reason)) = refused.first() {
        // `lacking` refuses what the engine would: not reached.
        let what = format!("{command:?}");
        return Err(ServeError::Config(config::ConfigError::Refused { what, reason }));
    }
    log(&format!("from the configuration: {} commands adding what the venue lacked, journaled up to seq {}", lacking.len(), engine.seq()));
    Ok(())
}

/// Says in the data directory whether its venue is the demo venue
/// (`config::DEMO_MARKER`): made, durably, before a new venue is set up
/// from the built-in configuration; removed once a file serves the venue.
fn mark_demo(dir: &std::path::Path, demo: bool) -> Result<(), ServeError> {
    let path = dir.join(config::DEMO_MARKER);
    let changed = if demo {
        !path.exists() && {
            let write = || -> std::io::Result<()> {
                let mut file = std::fs::File::create(&path)?;
                std::io::Write::write_all(&mut file, b"The demo venue: set up from crossbook serve's built-in configuration, whose accounts' keys are published.\nServed from a file once, this file goes, and the built-in configuration is refused on this directory from then on.\n")?;
                file.sync_all()
            };
            write().map_err(ServeError::io(format!("writing {}", path.display())))?;
            true
        }
    } else {
        match std::fs::remove_file(&path) {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => return Err(ServeError::io(format!("removing {}", path.display()))(e)),
        }
    };
    if changed {
        crossbook_journal::sync_dir(dir)?;
    }
    Ok(())
}

/// What a served session ended with.
pub struct Summary {
    pub seq: u64,
    pub commands: u64,
}

/// What starts and stops a served venue from outside.
pub struct Controls {
    /// Set to stop: no new connections, drain, sync, snapshot, return.
    pub shutdown: Arc<AtomicBool>,
    /// Set to have a snapshot taken now (the flag is cleared).
    pub snapshot: Arc<AtomicBool>,
    /// Set to have the configuration read again (the flag is cleared):
    /// `Sequencer::reload_if_asked` says what a running venue takes from
    /// it (docs/ARCHITECTURE.md, "Configuration reload").
    pub reload: Arc<AtomicBool>,
    /// How to read it again (the file, with the command line's
    /// overrides); `None`: there is no file (the built-in configuration).
    pub reread: Option<Arc<sequencer::Reread>>,
    /// The data directory's lock, when the caller holds it already: a
    /// process that serves the directory again (a deposed leader starting
    /// again as a follower) keeps it in between, so that no other process
    /// can take the directory then. `None`: `serve` takes it itself, until
    /// it returns.
    pub lock: Option<Arc<crossbook_journal::DirLock>>,
}

/// Runs the venue until `shutdown` is set; then stops accepting, drains
/// what was queued, syncs the journal, writes a snapshot and returns.
/// `listening` is told the bound address once connections are accepted.
pub fn serve(config: Config, controls: Controls, listening: impl FnOnce(SocketAddr)) -> Result<Summary, ServeError> {
    serve_with_sinks(config, controls, Vec::new(), listening)
}

/// [`serve`], with more gateways: each of `sinks` is handed every durable
/// batch after the built-in gateways, on the sequencer's thread (so it
/// must not block: a gateway with clients of its own queues and returns),
/// and every journaled command at start-up (`ReportSink::recovered`).
pub fn serve_with_sinks(config: Config, controls: Controls, mut sinks: Vec<Box<dyn ReportSink + Send>>, listening: impl FnOnce(SocketAddr)) -> Result<Summary, ServeError> {
    let Controls { shutdown, snapshot: snapshot_now, reload, reread, lock } = controls;
    config.check()?;
    config.check_addresses()?;
    for warning in config.unit_warnings() {
        log(&format!("warning: {warning}: the REST API's amounts would not add up"));
    }
    let durability = config.durability()?;
    log(&format!(
        "starting: data directory {}, durability {}, binary protocol on {}, FIX {}",
        config.data_dir.display(),
        config.durability,
        config.listen,
        if config.fix.listen.is_empty() { "off".to_string() } else { format!("on {}", config.fix.listen) }
    ));
    // One process at a time writes a data directory: held until this
    // function returns, or by the caller across its restarts.
    let _lock = match lock {
        Some(held) => held,
        None => Arc::new(crossbook_journal::lock_dir(&config.data_dir)?),
    };
    log("recovering: loading the newest snapshot that belongs to the journal, then replaying the journal after it");
    let started = Instant::now();
    let recovered = recover(&config.data_dir)?;
    for warning in &recovered.warnings {
        log(&format!("warning: {warning}"));
    }
    // A replicated node: the log on NATS JetStream is the truth; the local
    // journal is checked against it (and cut back where it holds what the
    // log does not) before anything is served.
    let (recovered, replicated_log) = match &config.replication {
        Some(replication) => {
            log(&format!("replication: node {} connecting to {:?} (stream {}, {} replicas)", replication.node, replication.nats, replication.stream, replication.replicas));
            let log_config = crossbook_replication::Config {
                urls: replication.nats.clone(),
                stream: replication.stream.clone(),
                replicas: replication.replicas,
                lease_ttl: std::time::Duration::from_millis(replication.lease_ttl_ms),
                node: replication.node.clone(),
                connect_timeout: std::time::Duration::from_secs(replication.connect_timeout_s),
            };
            let replicated_log = Arc::new(crossbook_replication::Log::connect(log_config)?);
            let recovered = replica::reconcile(&config.data_dir, &replicated_log, recovered)?;
            (recovered, Some(replicated_log))
        }
        None => (recovered, None),
    };
    log(&format!(
        "recovered seq {} from {}, {} replayed, in {} ms",
        recovered.engine.seq(),
        recovered.snapshot.map_or_else(|| "the start of the journal (no snapshot)".to_string(), |s| format!("the snapshot at seq {s}")),
        if recovered.replayed == 1 { "1 command".to_string() } else { format!("{} commands", recovered.replayed) },
        started.elapsed().as_millis()
    ));
    let mut engine = recovered.engine;
    // The gateway's poll, made first so that the journal's writer and the
    // FIX readers can wake it.
    let poll = mio::Poll::new().map_err(ServeError::io("creating the epoll instance"))?;
    let waker = Arc::new(mio::Waker::new(poll.registry(), gateway::WAKER).map_err(ServeError::io("creating the gateway's waker"))?);
    // The FIX gateway's commands come through this bounded queue (its
    // readers block when it is full: backpressure).
    let (queue, inbound) = sync_channel::<Vec<Inbound>>(config.limits.queue.max(1));
    let ack_waker = waker.clone();
    let on_ack = crossbook_journal::write::AckHook(Arc::new(move |_| {
        let _ = ack_waker.wake();
    }));
    // A round's batch is published whole and released whole (see
    // `Sequencer::apply`): no eager hand-off of its first records.
    let journal_config = JournalConfig { durability, on_ack: Some(on_ack), eager: false, segment_bytes: config.segment_bytes };
    let mut journal = Journal::open(&config.data_dir, journal_config, &recovered.end)?;
    let chain = recovered.end.last_crc;
    // The built-in configuration's keys are published: it serves a new
    // venue, or the demo venue it set up, never one set up or served from
    // a file (a forgotten --config would open its accounts to them).
    let built_in = reread.is_none() && replicated_log.is_none();
    if engine.seq() > 0 && built_in && !config.data_dir.join(config::DEMO_MARKER).exists() {
        return Err(ServeError::Config(config::ConfigError::NotTheDemo(config.data_dir.clone())));
    }
    if engine.seq() == 0 && replicated_log.is_none() {
        // A new venue is journaled only once it could be served: a start
        // that fails here leaves the directory without a venue, so that a
        // corrected configuration starts afresh.
        probe(&config)?;
        mark_demo(&config.data_dir, built_in)?;
        sequencer::set_up(&mut engine, &mut journal, &config.checked_setup_commands()?)?;
        log(&format!("new venue: {} set-up commands from the configuration", engine.seq()));
    } else {
        log(&format!("recovered {} commands from {}", engine.seq(), config.data_dir.display()));
        if !built_in {
            mark_demo(&config.data_dir, false)?;
        }
        if replicated_log.is_none() {
            add_what_the_configuration_adds(&config, &mut engine, &mut journal)?;
        } else {
            // What it adds is appended when this node leads; what does not
            // fit the venue it has is refused now.
            sequencer::lacking(&config.setup_commands()?, &engine)?;
        }
    }
    // Where the log is read from (a replicated node follows first).
    let read_from = match &replicated_log {
        Some(replicated_log) => Some(replica::read_from(replicated_log, engine.seq())?),
        None => None,
    };
    let node = replica::NodeState::new(replicated_log.is_none());

    // The sequencer's progress, for the gateways that need it.
    let applied = Arc::new(AtomicU64::new(engine.seq()));
    // The accounts' credentials, every gateway's (a reload changes them).
    let keys = Arc::new(keys::Keys::new(&config.accounts));
    // The assets and instruments listed, every gateway's (a reload adds).
    let listing = Arc::new(listing::Listing::new(&config, &engine)?);
    let gateway = if config.fix.listen.is_empty() {
        None
    } else {
        // FIX stores are synced before a message is sent in both
        // durability modes: a counterparty's sequence numbers can never be
        // taken back (in async mode a power cut would otherwise lose
        // messages it has, and their numbers would be given again).
        Some(fix::Gateway::open(&config, listing.clone(), keys.clone(), true, engine.seq(), applied.clone())?)
    };
    // The gateways, as the sequencer sees them: the binary sessions (the
    // gateway's loop adds them first) and the others.
    let mut sessions = sessions::Sessions::default();
    let mut fix_sink = gateway.clone().map(fix::FixSink::new);
    let market = if config.market_data.listen.is_empty() {
        None
    } else {
        let fix_sessions = gateway.clone().map(|g| Arc::new(move || g.connected()) as Arc<dyn Fn() -> usize + Send + Sync>);
        Some(market::Market::new(&config, listing.clone(), keys.clone(), sessions.logged_in.clone(), fix_sessions, node.clone())?)
    };
    let mut market_sink = market.clone().map(market::MarketSink);
    // The FIX stores' messages end there: the start-up replay must begin
    // at or before it for them to get what comes after.
    let not_after = fix_sink.as_ref().and_then(|sink| sink.stores_through()).unwrap_or(u64::MAX);
    let mut others: Vec<&mut dyn ReportSink> = Vec::new();
    if let Some(sink) = fix_sink.as_mut() {
        others.push(sink);
    }
    if let Some(sink) = market_sink.as_mut() {
        others.push(sink);
    }
    for sink in sinks.iter_mut() {
        others.push(sink.as_mut());
    }
    let started = Instant::now();
    // The gateways' state (report numbering and histories, the FIX book)
    // from the newest snapshot with their checkpoints at least
    // `history_commands` back, plus the journal after it: bounded by that,
    // not by the journal's length (docs/ARCHITECTURE.md, "Start-up").
    log(&format!("rebuilding the gateways' report histories (the last {} commands at least) from a snapshot with their checkpoints and the journal after it", config.history_commands));
    let rebuilt = {
        let mut all: Vec<&mut dyn ReportSink> = vec![&mut sessions];
        all.extend(others.iter_mut().map(|s| &mut **s as &mut dyn ReportSink));
        replay::rebuild(&config.data_dir, engine.seq(), config.history_commands, not_after, &mut all)?
    };
    let replayable: usize = sessions.histories.values().map(|h| h.reports.len()).sum();
    log(&format!(
        "rebuilt {replayable} execution reports of {} accounts for replay from {}, {} commands re-read, in {} ms",
        sessions.histories.len(),
        rebuilt.from.map_or_else(|| "the start of the journal".to_string(), |seq| format!("the gateways' checkpoints at seq {seq}")),
        rebuilt.commands,
        started.elapsed().as_millis()
    ));
    // A snapshot of this very state with the gateways' checkpoints, unless
    // the newest already is one (a shutdown snapshot carries none).
    let newest = crossbook_journal::read::snapshots(&config.data_dir).ok().and_then(|all| all.into_iter().next());
    let checkpoint_now = engine.seq() > 0
        && !newest.is_some_and(|(seq, path)| seq == engine.seq() && crossbook_journal::read::snapshot_has_attachments(&path).unwrap_or(false));
    // Only now: a client that connects is answered at once, not left
    // waiting in the backlog while the venue recovers.
    let listener = TcpListener::bind(&config.listen).map_err(ServeError::io(format!("listening on {}", config.listen)))?;
    let address = listener.local_addr().map_err(ServeError::io("reading the listening address"))?;
    let settings = Settings {
        data_dir: &config.data_dir,
        snapshot_every: config.snapshot_every,
        open_orders: config.limits.open_orders,
        snapshot_now: &snapshot_now,
        applied,
        history_commands: config.history_commands,
        reload_now: &reload,
        reread: reread.as_deref(),
        keys: keys.clone(),
        listing,
    };
    let mut sequencer = Sequencer::new(engine, journal, settings, checkpoint_now)?;

    if let Some(gateway) = &gateway {
        let wake = waker.clone();
        gateway.start(queue.clone(), Arc::new(move || drop(wake.wake())), shutdown.clone())?;
    }
    let mut market_address = None;
    if let Some(market) = &market {
        let wake = waker.clone();
        market_address = Some(market.start(market::trading::SequencerLink { queue: queue.clone(), wake: Arc::new(move || drop(wake.wake())) })?);
    }
    let mut lease = None;
    if let (Some(replicated_log), Some(from), Some(replication)) = (replicated_log, read_from, &config.replication) {
        let wake = waker.clone();
        let wake: Arc<dyn Fn() + Send + Sync> = Arc::new(move || drop(wake.wake()));
        node.applied_stream.store(from - 1, Ordering::Release);
        let reader = replicated_log.reader(from, wake.clone());
        log(&format!("replication: following the log from stream message {from}{}", if replication.candidate { " (a candidate to lead)" } else { " (a read replica: never leads)" }));
        let me = crossbook_replication::Leader {
            node: replication.node.clone(),
            binary: if replication.advertise_binary.is_empty() { address.to_string() } else { replication.advertise_binary.clone() },
            rest: if replication.advertise_rest.is_empty() { market_address.map(|a| a.to_string()).unwrap_or_default() } else { replication.advertise_rest.clone() },
        };
        // A wildcard listening address is no address for a client on
        // another machine: the lease would send it there.
        for (key, address) in [("advertise_binary", &me.binary), ("advertise_rest", &me.rest)] {
            if address.parse::<std::net::SocketAddr>().is_ok_and(|a| a.ip().is_unspecified()) {
                log(&format!("replication: warning: clients are sent to {address} (the listening address) when this node leads, which no other machine can reach: set {key} to an address they can"));
            }
        }
        let ttl = std::time::Duration::from_millis(replication.lease_ttl_ms);
        lease = Some(replica::lease_thread(replicated_log.clone(), node.clone(), me, replication.candidate, ttl, wake.clone()).map_err(ServeError::io("starting the lease thread"))?);
        sequencer.replicated(sequencer::Replication { log: replicated_log, state: node.clone(), wake, chain, role: sequencer::Role::Follower(reader), setup: if from <= 1 { config.checked_setup_commands()? } else { config.setup_commands()? }, candidate: replication.candidate, start_from: from, accept_pending: false });
    }
    log(&format!("listening on {address}"));
    listening(address);
    let served = gateway::run(poll, listener, &config, &keys, sessions, &inbound, &mut sequencer, &mut others, &shutdown, node.clone());
    node.stop.store(true, Ordering::Release);
    if let Some(lease) = lease {
        let _ = lease.join();
    }
    if let Some(gateway) = &gateway {
        let failure = served.as_ref().err().map(|e| format!("the venue is stopping: {e}"));
        gateway.stop(failure.as_deref());
    }
    if let Err(e) = &served {
        // Nothing more can be made durable, or the gateway failed: stop
        // the venue (what the journal holds is safe).
        log(&format!("serving stopped: {e}"));
        // A deposed leader stops this run only: its caller starts it again
        // as a follower.
        if !matches!(e, ServeError::Deposed(_)) {
            shutdown.store(true, Ordering::Release);
        }
    }
    drop(queue);
    // What was queued and not applied yet: a FIX command is applied (its
    // session gets its reports at its next Logon, from its store); a REST
    // request is not (its answer could no longer go out: nothing done,
    // and its client sees the connection close without one).
    let mut leftover = Vec::new();
    let mut unanswerable = 0;
    while let Ok(items) = inbound.try_recv() {
        for item in items {
            if item.source == sink::REST {
                unanswerable += 1;
            } else {
                leftover.push(item);
            }
        }
    }
    if unanswerable > 0 {
        log(&format!("{unanswerable} REST requests still queued as the venue stopped were not applied (their clients get no answer: nothing was done)"));
    }
    if let Some(market) = &market {
        market.stop();
    }
    served?;
    let summary = sequencer.finish(leftover)?;
    log(&format!("stopped at seq {}", summary.seq));
    Ok(summary)
}
