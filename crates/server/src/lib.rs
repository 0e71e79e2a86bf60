//! `crossbook serve`: the exchange as a network service (first piece).
//!
//! Threads and queues (docs/ARCHITECTURE.md has the picture):
//!
//! - the **gateway** (the caller's thread, `gateway.rs`): one epoll over
//!   every binary-protocol connection; it decodes frames, logs sessions in,
//!   and hands each round's commands to the sequencer through one bounded
//!   queue (`limits.queue` batches; it blocks when the queue is full:
//!   backpressure), and writes the reports the sequencer leaves it;
//! - one **sequencer** takes everything queued, journals it (group
//!   commit), applies it to the engine, and once the journal has made a
//!   batch durable hands its execution reports to the gateway (and to the
//!   FIX gateway, `fix/`);
//! - the journal's **writer** (and, in async mode, **syncer**), the
//!   **snapshotter**, and the FIX gateway's threads.

pub mod config;
pub mod fix;
mod gateway;

use config::Config;
use crossbook_engine::{AccountId, Command, Engine, Event};
use crossbook_journal::{Durability, Journal, JournalConfig, recover, write_snapshot};
use crossbook_protocol::reports::{Addressed, ReportBuilder};
use crossbook_protocol::*;
use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// Commands the sequencer takes into one batch (one group commit).
const MAX_BATCH: usize = 4_096;
/// How often blocked loops look at the shutdown flag.
const POLL: Duration = Duration::from_millis(50);

#[derive(Debug)]
pub struct ServeError(pub String);

impl std::fmt::Display for ServeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ServeError {}

pub(crate) fn error(what: impl std::fmt::Display) -> ServeError {
    ServeError(what.to_string())
}

pub(crate) struct Inbound {
    pub(crate) command: Command,
    /// What a gateway journals with the command (the FIX ClOrdID).
    pub(crate) annex: Option<Vec<u8>>,
    /// The sending connection's commands in flight: the sequencer lowers
    /// the count once the command's reports are out.
    pub(crate) in_flight: Arc<InFlight>,
}

/// A connection's count of commands handed to the sequencer and not yet
/// answered, and the reader thread to wake when it drops (the reader does
/// not read its socket while the count is at the limit).
pub(crate) struct InFlight {
    count: AtomicU32,
    /// A reader thread that parks while the count is at its limit (FIX
    /// connections); the binary gateway is woken once per batch instead.
    reader: Option<thread::Thread>,
}

impl InFlight {
    /// A count owned by the calling (reader) thread, which parks in
    /// [`InFlight::wait_below`].
    pub(crate) fn new() -> Arc<InFlight> {
        Arc::new(InFlight { count: AtomicU32::new(0), reader: Some(thread::current()) })
    }

    /// A count for the binary gateway, which `dispatch` wakes once per batch.
    pub(crate) fn polled() -> Arc<InFlight> {
        Arc::new(InFlight { count: AtomicU32::new(0), reader: None })
    }

    /// Waits while `limit` or more are in flight; `false` if `stopping`
    /// said to give up.
    pub(crate) fn wait_below(&self, limit: u32, stopping: impl Fn() -> bool) -> bool {
        while self.count.load(Ordering::Acquire) >= limit {
            if stopping() {
                return false;
            }
            thread::park_timeout(Duration::from_millis(10));
        }
        true
    }

    pub(crate) fn count(&self) -> u32 {
        self.count.load(Ordering::Acquire)
    }

    pub(crate) fn add(&self, n: u32) {
        self.count.fetch_add(n, Ordering::AcqRel);
    }

    fn done(&self) {
        let before = self.count.fetch_sub(1, Ordering::AcqRel);
        if let Some(reader) = &self.reader
            && before == 1
        {
            reader.unpark();
        }
    }
}

/// A logged-in binary session: the gateway's connection serving it.
pub(crate) struct Session {
    pub(crate) connection: u64,
}

/// The reason code of a refusal by the open-order limit (not an engine
/// reason: docs/protocol.md).
pub const OPEN_ORDER_LIMIT: u8 = 100;

/// Reports kept per account for replay to a session that reconnects.
const HISTORY_REPORTS: usize = 100_000;

/// An account's session sequence and its recent report frames.
#[derive(Default)]
pub(crate) struct History {
    /// The last sequence number given.
    pub(crate) last: u64,
    /// (seq, frame) of the last `HISTORY_REPORTS` reports.
    pub(crate) frames: std::collections::VecDeque<(u64, Vec<u8>)>,
}

#[derive(Default)]
pub(crate) struct Shared {
    pub(crate) sessions: Mutex<HashMap<AccountId, Session>>,
    /// Report frames the sequencer left for the gateway, by connection.
    pub(crate) outbox: Mutex<Vec<(u64, Vec<u8>)>>,
    /// Wakes the gateway's poll (set once it runs).
    pub(crate) waker: std::sync::OnceLock<Arc<mio::Waker>>,
    /// The last session sequence number given to each account's messages
    /// (since this process started). Locked after `sessions`.
    pub(crate) seqs: Mutex<HashMap<AccountId, History>>,
    pub(crate) connections: AtomicUsize,
    commands: AtomicU64,
    /// Set when the sequencer has stopped (normally or on an I/O error).
    sequencer_stopped: AtomicBool,
}

pub(crate) fn log(line: &str) {
    eprintln!("{line}");
}

/// What a served session ended with.
pub struct Summary {
    pub seq: u64,
    pub commands: u64,
}

/// Runs the venue until `shutdown` is set; then stops accepting, drains
/// what was queued, syncs the journal, writes a snapshot and returns.
/// `listening` is told the bound address once connections are accepted.
/// What starts and stops a served venue from outside.
pub struct Controls {
    /// Set to stop: no new connections, drain, sync, snapshot, return.
    pub shutdown: Arc<AtomicBool>,
    /// Set to have a snapshot taken now (the flag is cleared).
    pub snapshot: Arc<AtomicBool>,
}

pub fn serve(config: Config, controls: Controls, listening: impl FnOnce(SocketAddr)) -> Result<Summary, ServeError> {
    let Controls { shutdown, snapshot: snapshot_now } = controls;
    let durability = match config.durability.as_str() {
        "sync" => Durability::Sync,
        "async" => Durability::Async { interval: Duration::from_millis(10) },
        other => return Err(error(format!("durability must be sync or async, not {other:?}"))),
    };
    let recovered = recover(&config.data_dir).map_err(error)?;
    for warning in &recovered.warnings {
        log(&format!("warning: {warning}"));
    }
    let mut engine = recovered.engine;
    // Readers hand over what one socket read held, as one batch; the
    // journal's writer drops an empty batch in after each group commit, so
    // the sequencer waits for new commands and acknowledgements in one
    // place and keeps appending while a sync runs.
    let (queue, inbound) = sync_channel::<Vec<Inbound>>(config.limits.queue.max(1));
    let waker = queue.clone();
    let on_ack = crossbook_journal::write::AckHook(Arc::new(move |_| {
        let _ = waker.try_send(Vec::new());
    }));
    let journal_config = JournalConfig { durability, on_ack: Some(on_ack), ..JournalConfig::default() };
    let mut journal = Journal::open(&config.data_dir, journal_config, &recovered.end).map_err(error)?;
    if engine.seq() == 0 {
        let mut events = Vec::new();
        for command in config.setup_commands().map_err(error)? {
            journal.append(engine.seq() + 1, &command).map_err(error)?;
            events.clear();
            engine.apply(&command, &mut events);
        }
        journal.flush().map_err(error)?;
        log(&format!("new venue: {} set-up commands from the configuration", engine.seq()));
    } else {
        log(&format!("recovered {} commands from {}", engine.seq(), config.data_dir.display()));
    }

    let listener = TcpListener::bind(&config.listen).map_err(|e| error(format!("listening on {}: {e}", config.listen)))?;
    let address = listener.local_addr().map_err(error)?;

    let shared = Arc::new(Shared::default());
    let gateway = if config.fix.listen.is_empty() {
        None
    } else {
        Some(fix::Gateway::open(&config, durability == Durability::Sync).map_err(error)?)
    };
    let histories = rebuild_histories(&config.data_dir, engine.seq(), gateway.as_deref()).map_err(error)?;
    let replayable: usize = histories.values().map(|h| h.frames.len()).sum();
    if replayable > 0 {
        log(&format!("rebuilt {replayable} execution reports of {} accounts from the journal", histories.len()));
    }
    *shared.seqs.lock().unwrap_or_else(|e| e.into_inner()) = histories;
    let sequencer = {
        let shared = shared.clone();
        let shutdown = shutdown.clone();
        let data_dir = config.data_dir.clone();
        let snapshot_every = config.snapshot_every;
        let gateway = gateway.clone();
        let open_orders = config.limits.open_orders;
        let snapshot_now = snapshot_now.clone();
        thread::Builder::new()
            .name("sequencer".into())
            .spawn(move || {
                let settings = Settings { data_dir: &data_dir, snapshot_every, open_orders, gateway: gateway.as_deref(), snapshot_now: &snapshot_now };
                let result = sequence(engine, journal, inbound, shared.clone(), shutdown.clone(), settings);
                shared.sequencer_stopped.store(true, Ordering::Release);
                if let Err(e) = &result {
                    // Nothing more can be made durable: stop the venue.
                    log(&format!("sequencer stopped: {e}"));
                    shutdown.store(true, Ordering::Release);
                }
                result
            })
            .map_err(error)?
    };
    if let Some(gateway) = &gateway {
        gateway.start(queue.clone(), shutdown.clone()).map_err(error)?;
    }
    log(&format!("listening on {address}"));
    listening(address);
    let served = gateway::run(listener, &config, &shared, &queue, &shutdown);
    if let Err(e) = &served {
        log(&format!("gateway stopped: {e}"));
        shutdown.store(true, Ordering::Release);
    }
    if let Some(gateway) = &gateway {
        gateway.stop();
    }
    drop(queue);
    let summary = match sequencer.join() {
        Ok(result) => result?,
        Err(_) => return Err(error("the sequencer thread panicked")),
    };
    log(&format!("stopped at seq {}", summary.seq));
    Ok(summary)
}

/// Writes snapshots off the sequencer's thread: the sequencer encodes the
/// state (quick) and offers it; this thread waits until the journal holds
/// every command the state covers (a snapshot is never ahead of the
/// journal), writes it, syncs it, and prunes older ones. One at a time: an
/// offer made while one is being written is declined, and made again later.
struct Snapshotter {
    offers: SyncSender<(u64, Vec<u8>)>,
    /// The journal's acknowledged sequence number, as the sequencer saw it.
    durable: Arc<AtomicU64>,
    failed: Arc<Mutex<Option<String>>>,
    /// 1 while a snapshot is being written.
    busy: Arc<AtomicU64>,
    handle: thread::JoinHandle<()>,
}

/// Snapshots kept by `serve`.
const KEEP_SNAPSHOTS: usize = 2;

impl Snapshotter {
    fn start(dir: std::path::PathBuf, durable_seq: u64) -> Result<Snapshotter, String> {
        let (offers, receive) = sync_channel::<(u64, Vec<u8>)>(1);
        let durable = Arc::new(AtomicU64::new(durable_seq));
        let failed = Arc::new(Mutex::new(None));
        let busy = Arc::new(AtomicU64::new(0));
        let (thread_durable, thread_failed, thread_busy) = (durable.clone(), failed.clone(), busy.clone());
        let handle = thread::Builder::new()
            .name("snapshotter".into())
            .spawn(move || {
                while let Ok((seq, state)) = receive.recv() {
                    while thread_durable.load(Ordering::Acquire) < seq {
                        thread::sleep(Duration::from_millis(1));
                    }
                    if let Err(e) = crossbook_journal::write_snapshot_state(&dir, seq, &state, KEEP_SNAPSHOTS) {
                        log(&format!("snapshot at seq {seq} failed: {e}"));
                        *thread_failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(e.to_string());
                        return;
                    }
                    thread_busy.store(0, Ordering::Release);
                }
            })
            .map_err(|e| e.to_string())?;
        Ok(Snapshotter { offers, durable, failed, busy, handle })
    }

    fn is_free(&self) -> bool {
        self.busy.load(Ordering::Acquire) == 0
    }

    /// Hands a state over.
    fn offer(&self, seq: u64, state: Vec<u8>) {
        self.busy.store(1, Ordering::Release);
        if self.offers.try_send((seq, state)).is_err() {
            self.busy.store(0, Ordering::Release);
        }
    }

    /// Waits for the snapshot being written (the journal is closed, so
    /// everything is durable) and reports a failure.
    fn stop(self) -> Result<(), ServeError> {
        self.durable.store(u64::MAX, Ordering::Release);
        drop(self.offers);
        let _ = self.handle.join();
        match self.failed.lock().unwrap_or_else(|e| e.into_inner()).take() {
            Some(why) => Err(error(format!("writing a snapshot: {why}"))),
            None => Ok(()),
        }
    }
}

/// What the sequencer runs with besides its queue.
struct Settings<'a> {
    data_dir: &'a Path,
    snapshot_every: u64,
    /// Open orders an account may have (`limits.open_orders`).
    open_orders: usize,
    gateway: Option<&'a fix::Gateway>,
    /// Set (by SIGUSR1) to take a snapshot now.
    snapshot_now: &'a AtomicBool,
}

/// A batch applied and waiting for the journal: its last sequence number,
/// its reports (and refusals that never reached the engine), what the FIX
/// gateway gets, and the in-flight counters to lower once it is out.
struct Waiting {
    last_seq: u64,
    reports: Vec<Addressed>,
    refused: Vec<Addressed>,
    fix_events: Vec<fix::venue::FixEvent>,
    answered: Vec<Arc<InFlight>>,
}

/// The refusal of an order that would pass the account's open-order
/// limit. It never reaches the engine or the journal, so it is not part of
/// the numbered report stream: it goes out with sequence number 0.
fn open_order_refusal(p: &crossbook_engine::PlaceOrder) -> Addressed {
    let report = ExecutionReport {
        seq: 0,
        kind: ReportKind::Rejected,
        order: 0,
        cid: p.cid,
        instrument: p.instrument,
        side: p.side,
        price: p.price,
        last_qty: 0,
        last_price: 0,
        cum_qty: 0,
        leaves_qty: 0,
        fee: 0,
        reason: OPEN_ORDER_LIMIT,
    };
    Addressed { account: p.account, report }
}

/// The sequencer: batch, journal, apply; dispatch each batch's reports once
/// the journal has made it durable.
fn sequence(
    mut engine: Engine,
    mut journal: Journal,
    inbound: Receiver<Vec<Inbound>>,
    shared: Arc<Shared>,
    shutdown: Arc<AtomicBool>,
    settings: Settings<'_>,
) -> Result<Summary, ServeError> {
    let mut builder = ReportBuilder::from_engine(&engine);
    let mut batch: Vec<Inbound> = Vec::with_capacity(MAX_BATCH);
    let mut events: Vec<Event> = Vec::new();
    // Batches applied but not yet durable. The sequencer goes on applying
    // while the journal syncs; reports leave only once the journal
    // acknowledges their batch.
    let mut waiting: std::collections::VecDeque<Waiting> = std::collections::VecDeque::new();
    let mut commands = 0u64;
    let mut last_log = Instant::now();
    let mut logged = 0u64;
    let mut last_snapshot = engine.seq();
    let mut disconnected = false;
    if let Some(gateway) = settings.gateway {
        gateway.set_engine_seq(engine.seq());
    }
    let snapshotter = Snapshotter::start(settings.data_dir.to_path_buf(), engine.seq()).map_err(error)?;
    loop {
        batch.clear();
        // Blocks until commands arrive or the journal acknowledges more
        // (its writer wakes this queue), whichever comes first.
        match inbound.recv_timeout(POLL) {
            Ok(first) => batch.extend(first),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => disconnected = true,
        }
        while batch.len() < MAX_BATCH {
            match inbound.try_recv() {
                Ok(next) => batch.extend(next),
                Err(std::sync::mpsc::TryRecvError::Empty) => break,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    disconnected = true;
                    break;
                }
            }
        }
        if !batch.is_empty() {
            let mut done = Waiting { last_seq: 0, reports: Vec::new(), refused: Vec::new(), fix_events: Vec::new(), answered: Vec::with_capacity(batch.len()) };
            for item in &batch {
                done.answered.push(item.in_flight.clone());
                if let Command::Place(p) = &item.command
                    && item.annex.is_none()
                    && builder.open_orders_of(p.account) >= settings.open_orders
                {
                    done.refused.push(open_order_refusal(p));
                    continue;
                }
                let seq = engine.seq() + 1;
                journal.append_with(seq, &item.command, item.annex.as_deref()).map_err(error)?;
                events.clear();
                engine.apply(&item.command, &mut events);
                let first_report = done.reports.len();
                builder.reports(&item.command, &events, &mut done.reports);
                if let Some(gateway) = settings.gateway
                    && gateway.wants(item.annex.is_some(), &done.reports[first_report..])
                {
                    let annex = item.annex.as_deref().and_then(fix::venue::Annex::decode);
                    done.fix_events.push(fix::venue::FixEvent { seq, command: item.command, annex, reports: done.reports[first_report..].to_vec() });
                }
            }
            journal.publish().map_err(error)?;
            commands += batch.len() as u64;
            shared.commands.store(commands, Ordering::Release);
            if let Some(gateway) = settings.gateway {
                gateway.set_engine_seq(engine.seq());
            }
            done.last_seq = engine.seq();
            waiting.push_back(done);
        }
        let requested = settings.snapshot_now.swap(false, Ordering::AcqRel);
        if requested || (settings.snapshot_every > 0 && engine.seq() - last_snapshot >= settings.snapshot_every) {
            // Encoded here (quick), written and synced by the snapshotter,
            // once the journal holds everything it covers. If the last one
            // is still being written, this one is skipped: the next comes
            // `snapshot_every` commands later (or ask again).
            if snapshotter.is_free() {
                let mut state = Vec::new();
                engine.encode_state(&mut state);
                snapshotter.offer(engine.seq(), state);
                if requested {
                    log(&format!("snapshot requested: writing one at seq {}", engine.seq()));
                }
            } else if requested {
                log("snapshot requested: the previous one is still being written; ask again");
            }
            last_snapshot = engine.seq();
        }
        if let Some(target) = waiting.front().map(|w| w.last_seq) {
            // Does not wait; reports a failed journal.
            let acked = journal.wait_acked(target, Duration::ZERO).map_err(error)?;
            snapshotter.durable.store(acked, Ordering::Release);
            while waiting.front().is_some_and(|w| w.last_seq <= acked) {
                if let Some(done) = waiting.pop_front() {
                    dispatch(&done.reports, &done.refused, &shared);
                    if let Some(gateway) = settings.gateway
                        && !done.fix_events.is_empty()
                    {
                        gateway.deliver(done.fix_events);
                    }
                    for counter in done.answered {
                        counter.done();
                    }
                }
            }
        }
        if last_log.elapsed() >= Duration::from_secs(5) {
            let rate = (commands - logged) as f64 / last_log.elapsed().as_secs_f64();
            log(&format!("throughput commands={commands} per_s={rate:.0} seq={}", engine.seq()));
            last_log = Instant::now();
            logged = commands;
        }
        let quiet = batch.is_empty() && waiting.is_empty();
        if quiet && (disconnected || (shutdown.load(Ordering::Acquire) && shared.connections.load(Ordering::Acquire) == 0)) {
            break;
        }
    }
    // Drain anything still queued, then make it all durable.
    while let Ok(items) = inbound.try_recv() {
        for item in items {
            journal.append_with(engine.seq() + 1, &item.command, item.annex.as_deref()).map_err(error)?;
            events.clear();
            engine.apply(&item.command, &mut events);
            commands += 1;
        }
    }
    let stats = journal.close().map_err(error)?;
    if stats.syncs > 0 {
        log(&format!(
            "journal: {} group commits, fdatasync {:.0} us on average, {:.1} commands per group",
            stats.syncs,
            stats.average_sync_micros(),
            stats.average_group()
        ));
    }
    snapshotter.stop()?;
    write_snapshot(settings.data_dir, &engine, 2).map_err(error)?;
    Ok(Summary { seq: engine.seq(), commands })
}

/// Every account's session history as it stood when the process stopped:
/// reports are a function of the journal, so replaying it through a
/// [`ReportBuilder`] numbers them exactly as they were numbered live, and a
/// session that reconnects after a restart still gets what it missed.
fn rebuild_histories(dir: &Path, through: u64, gateway: Option<&fix::Gateway>) -> Result<HashMap<AccountId, History>, String> {
    let mut engine = Engine::new();
    let mut builder = ReportBuilder::new();
    let mut histories: HashMap<AccountId, History> = HashMap::new();
    let mut events = Vec::new();
    let mut reports = Vec::new();
    // The FIX gateway follows the same replay: its book of ClOrdIDs, and
    // the reports its sessions' stores do not have yet.
    let fix_through = gateway.map(fix::Gateway::through).unwrap_or_default();
    crossbook_journal::scan(dir, |seq, payload| {
        if seq > through {
            return Ok(());
        }
        let (command, annex) = crossbook_journal::format::split_payload(payload)?;
        events.clear();
        reports.clear();
        engine.apply(&command, &mut events);
        builder.reports(&command, &events, &mut reports);
        for addressed in &reports {
            record_history(histories.entry(addressed.account).or_default(), addressed.report);
        }
        if let Some(gateway) = gateway
            && (annex.is_some() || !reports.is_empty())
        {
            let annex = annex.and_then(fix::venue::Annex::decode);
            gateway.replay(fix::venue::FixEvent { seq, command, annex, reports: reports.clone() }, &fix_through);
        }
        Ok(())
    })
    .map_err(|e| e.to_string())?;
    Ok(histories)
}

/// Numbers a report for its account and keeps its frame; returns the frame.
fn record_history(history: &mut History, mut report: ExecutionReport) -> Vec<u8> {
    history.last += 1;
    report.seq = history.last;
    let mut frame = Vec::with_capacity(96);
    encode_server(&ServerMessage::ExecutionReport(report), &mut frame);
    if history.frames.len() == HISTORY_REPORTS {
        history.frames.pop_front();
    }
    history.frames.push_back((report.seq, frame.clone()));
    frame
}

fn dispatch(reports: &[Addressed], refused: &[Addressed], shared: &Shared) {
    let sessions = shared.sessions.lock().unwrap_or_else(|e| e.into_inner());
    let mut seqs = shared.seqs.lock().unwrap_or_else(|e| e.into_inner());
    // One buffer of frames per session per batch: one queue operation and
    // one write for all of a session's reports.
    let mut outgoing: HashMap<AccountId, Vec<u8>> = HashMap::new();
    for addressed in refused {
        if sessions.contains_key(&addressed.account) {
            encode_server(&ServerMessage::ExecutionReport(addressed.report), outgoing.entry(addressed.account).or_default());
        }
    }
    for addressed in reports {
        let frame = record_history(seqs.entry(addressed.account).or_default(), addressed.report);
        if sessions.contains_key(&addressed.account) {
            outgoing.entry(addressed.account).or_default().extend_from_slice(&frame);
        }
    }
    let mut outbox = shared.outbox.lock().unwrap_or_else(|e| e.into_inner());
    for (account, frames) in outgoing {
        if let Some(session) = sessions.get(&account) {
            outbox.push((session.connection, frames));
        }
    }
    drop(outbox);
    drop(sessions);
    drop(seqs);
    // Reports to write, and in-flight counts lowered: the gateway has work.
    if let Some(waker) = shared.waker.get() {
        let _ = waker.wake();
    }
}
