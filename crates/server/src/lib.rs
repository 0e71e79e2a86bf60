//! `crossbook serve`: the exchange as a network service (first piece).
//!
//! Threads and queues (docs/ARCHITECTURE.md has the picture):
//!
//! - the **gateway** (the caller's thread, `gateway.rs`): one epoll over
//!   every binary-protocol connection, and the **sequencer** (`Sequencer`)
//!   on the same thread: each round it reads every ready socket, takes what
//!   the FIX readers queued (`limits.queue` batches; they block when it is
//!   full: backpressure), journals and applies it all as one batch, hands
//!   out the reports of every batch the journal has made durable (to the
//!   binary sessions, and to the FIX gateway's reporter), and writes;
//! - the journal's **writer** (it wakes the gateway after each group
//!   commit) and, in async mode, **syncer**; the **snapshotter**; and the
//!   FIX gateway's threads (`fix/`).

pub mod config;
pub mod fix;
mod gateway;
mod ratelog;

use config::Config;
use crossbook_engine::{AccountId, Command, Engine, Event};
use crossbook_journal::{Durability, DurableWatch, Journal, JournalConfig, micros_histogram, recover, write_snapshot};
use crossbook_protocol::reports::{Addressed, ReportBuilder};
use crossbook_protocol::*;
use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};


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

/// An account's session sequence and its recent reports (numbered; their
/// frames are encoded when they are sent, live or replayed).
#[derive(Default)]
pub(crate) struct History {
    /// The last sequence number given.
    pub(crate) last: u64,
    /// The last `HISTORY_REPORTS` reports, oldest first.
    pub(crate) reports: std::collections::VecDeque<ExecutionReport>,
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
    log(&format!(
        "starting: data directory {}, durability {}, binary protocol on {}, FIX {}",
        config.data_dir.display(),
        config.durability,
        config.listen,
        if config.fix.listen.is_empty() { "off".to_string() } else { format!("on {}", config.fix.listen) }
    ));
    log("recovering: loading the newest snapshot that belongs to the journal, then replaying the journal after it");
    let started = Instant::now();
    let recovered = recover(&config.data_dir).map_err(error)?;
    for warning in &recovered.warnings {
        log(&format!("warning: {warning}"));
    }
    log(&format!(
        "recovered seq {} from {}, {} commands replayed, in {} ms",
        recovered.engine.seq(),
        recovered.snapshot.map_or_else(|| "the start of the journal (no snapshot)".to_string(), |s| format!("the snapshot at seq {s}")),
        recovered.replayed,
        started.elapsed().as_millis()
    ));
    let mut engine = recovered.engine;
    let shared = Arc::new(Shared::default());
    // The gateway's poll, made first so that the journal's writer and the
    // FIX readers can wake it.
    let poll = mio::Poll::new().map_err(error)?;
    let waker = Arc::new(mio::Waker::new(poll.registry(), gateway::WAKER).map_err(error)?);
    let _ = shared.waker.set(waker.clone());
    // The FIX gateway's commands come through this bounded queue (its
    // readers block when it is full: backpressure).
    let (queue, inbound) = sync_channel::<Vec<Inbound>>(config.limits.queue.max(1));
    let ack_waker = waker.clone();
    let on_ack = crossbook_journal::write::AckHook(Arc::new(move |_| {
        let _ = ack_waker.wake();
    }));
    // A round's batch is published whole and released whole (see
    // `Sequencer::apply`): no eager hand-off of its first records.
    if config.segment_bytes < 4096 {
        return Err(error(format!("segment_bytes must be at least 4096, not {}", config.segment_bytes)));
    }
    let journal_config = JournalConfig { durability, on_ack: Some(on_ack), eager: false, segment_bytes: config.segment_bytes };
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

    let gateway = if config.fix.listen.is_empty() {
        None
    } else {
        Some(fix::Gateway::open(&config, durability == Durability::Sync, engine.seq()).map_err(error)?)
    };
    let started = Instant::now();
    let histories = rebuild_histories(&config.data_dir, engine.seq(), gateway.as_deref()).map_err(error)?;
    let replayable: usize = histories.values().map(|h| h.reports.len()).sum();
    log(&format!(
        "rebuilt {replayable} execution reports of {} accounts for replay from the journal, in {} ms",
        histories.len(),
        started.elapsed().as_millis()
    ));
    *shared.seqs.lock().unwrap_or_else(|e| e.into_inner()) = histories;
    // Only now: a client that connects is answered at once, not left
    // waiting in the backlog while the venue recovers.
    let listener = TcpListener::bind(&config.listen).map_err(|e| error(format!("listening on {}: {e}", config.listen)))?;
    let address = listener.local_addr().map_err(error)?;
    let settings = Settings {
        data_dir: &config.data_dir,
        snapshot_every: config.snapshot_every,
        open_orders: config.limits.open_orders,
        gateway: gateway.as_deref(),
        snapshot_now: &snapshot_now,
    };
    let mut sequencer = Sequencer::new(engine, journal, &shared, settings)?;
    if let Some(gateway) = &gateway {
        let wake = waker.clone();
        gateway.start(queue.clone(), Arc::new(move || drop(wake.wake())), shutdown.clone()).map_err(error)?;
    }
    log(&format!("listening on {address}"));
    listening(address);
    let served = gateway::run(poll, listener, &config, &shared, &inbound, &mut sequencer, &shutdown);
    if let Some(gateway) = &gateway {
        let failure = served.as_ref().err().map(|e| format!("the venue is stopping: {e}"));
        gateway.stop(failure.as_deref());
    }
    if let Err(e) = &served {
        // Nothing more can be made durable, or the gateway failed: stop
        // the venue (what the journal holds is safe).
        log(&format!("serving stopped: {e}"));
        shutdown.store(true, Ordering::Release);
    }
    drop(queue);
    let mut leftover = Vec::new();
    while let Ok(items) = inbound.try_recv() {
        leftover.extend(items);
    }
    served?;
    let summary = sequencer.finish(leftover)?;
    log(&format!("stopped at seq {}", summary.seq));
    Ok(summary)
}

/// Writes snapshots off the sequencer's thread: the sequencer encodes the
/// state (quick) and offers it; this thread waits until the journal has
/// *synced* every command the state covers (in async mode too: a snapshot
/// is never ahead of what a power cut leaves), binds it to the checksum of
/// its last record, writes it, syncs it, and prunes older ones. One at a
/// time: an offer made while one is being written is declined, and made
/// again later. A failed write (a full disk, say) removes its temporary
/// file and is logged; the next one is tried when it is due.
struct Snapshotter {
    offers: SyncSender<(u64, Vec<u8>)>,
    /// 1 while a snapshot is being written.
    busy: Arc<AtomicU64>,
    /// Set when the server stops: a snapshot still waiting for the journal
    /// gives up (the final one is written after the journal closes).
    stopping: Arc<AtomicBool>,
    handle: thread::JoinHandle<()>,
}

/// Snapshots kept by `serve`.
const KEEP_SNAPSHOTS: usize = 2;

impl Snapshotter {
    fn start(dir: std::path::PathBuf, journal: DurableWatch) -> Result<Snapshotter, ServeError> {
        let (offers, receive) = sync_channel::<(u64, Vec<u8>)>(1);
        let busy = Arc::new(AtomicU64::new(0));
        let stopping = Arc::new(AtomicBool::new(false));
        let (thread_busy, thread_stopping) = (busy.clone(), stopping.clone());
        let handle = thread::Builder::new()
            .name("snapshotter".into())
            .spawn(move || {
                while let Ok((seq, state)) = receive.recv() {
                    write_when_durable(&dir, &journal, seq, &state, &thread_stopping);
                    thread_busy.store(0, Ordering::Release);
                }
            })
            .map_err(|e| ServeError(format!("starting the snapshotter thread: {e}")))?;
        Ok(Snapshotter { offers, busy, stopping, handle })
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

    /// Lets the snapshot being written finish (one still waiting for the
    /// journal gives up) and stops the thread.
    fn stop(self) {
        self.stopping.store(true, Ordering::Release);
        drop(self.offers);
        let _ = self.handle.join();
    }
}

/// The snapshotter's work for one offer: wait until the journal has synced
/// `seq`, then write the snapshot bound to that record. Failures are
/// logged, never fatal: the journal holds everything the snapshot would.
fn write_when_durable(dir: &Path, journal: &DurableWatch, seq: u64, state: &[u8], stopping: &AtomicBool) {
    loop {
        match journal.wait_durable(seq, Duration::from_millis(100)) {
            Ok(durable) if durable >= seq => break,
            Ok(_) if stopping.load(Ordering::Acquire) => return,
            Ok(_) => {}
            // The venue is stopping on the journal's failure (logged there).
            Err(_) => return,
        }
    }
    let Some(chain) = journal.chain_at(seq) else {
        log(&format!("snapshot at seq {seq} skipped: the journal no longer has its record's checksum at hand; the next one is taken when due"));
        return;
    };
    let header = crossbook_journal::SnapshotHeader { seq, chain };
    if let Err(e) = crossbook_journal::write_snapshot_state(dir, header, state, KEEP_SNAPSHOTS) {
        log(&format!("snapshot at seq {seq} failed: {e}; its temporary file is removed, the snapshots before it are kept, and the next one is tried when due"));
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
    /// When the round that read the batch applied it.
    applied_at: Instant,
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

/// The sequencer: journals and applies commands in the order they come,
/// and hands out each batch's reports once the journal holds it durably.
/// It runs on the gateway's thread (`gateway.rs` calls it every round), so
/// an order costs no hand-off between threads on its way in or out; the
/// journal's writer syncs on its own thread and wakes the gateway when a
/// group commit is done.
pub(crate) struct Sequencer<'a> {
    engine: Engine,
    journal: Journal,
    builder: ReportBuilder,
    events: Vec<Event>,
    /// Batches applied but not yet durable, oldest first.
    waiting: std::collections::VecDeque<Waiting>,
    /// Per command, from the round that applied it to the release of its
    /// reports (the journal's wait included), logged at shutdown: the
    /// server's own share of a client's order-to-acknowledgement latency.
    residence: hdrhistogram::Histogram<u64>,
    commands: u64,
    last_log: Instant,
    logged: u64,
    last_snapshot: u64,
    snapshotter: Snapshotter,
    settings: Settings<'a>,
    shared: &'a Shared,
}

impl<'a> Sequencer<'a> {
    fn new(engine: Engine, journal: Journal, shared: &'a Shared, settings: Settings<'a>) -> Result<Sequencer<'a>, ServeError> {
        if let Some(gateway) = settings.gateway {
            gateway.set_engine_seq(engine.seq());
        }
        let snapshotter = Snapshotter::start(settings.data_dir.to_path_buf(), journal.watch())?;
        Ok(Sequencer {
            builder: ReportBuilder::from_engine(&engine),
            last_snapshot: engine.seq(),
            engine,
            journal,
            events: Vec::new(),
            waiting: std::collections::VecDeque::new(),
            residence: micros_histogram(),
            commands: 0,
            last_log: Instant::now(),
            logged: 0,
            snapshotter,
            settings,
            shared,
        })
    }

    /// Journals and applies `batch` (emptied); its reports wait for the
    /// journal.
    pub(crate) fn apply(&mut self, batch: &mut Vec<Inbound>) -> Result<(), ServeError> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut done = Waiting { last_seq: 0, applied_at: Instant::now(), reports: Vec::new(), refused: Vec::new(), fix_events: Vec::new(), answered: Vec::with_capacity(batch.len()) };
        for item in batch.drain(..) {
            done.answered.push(item.in_flight.clone());
            if let Command::Place(p) = &item.command
                && item.annex.is_none()
                && self.builder.open_orders_of(p.account) >= self.settings.open_orders
            {
                done.refused.push(open_order_refusal(p));
                continue;
            }
            let seq = self.engine.seq() + 1;
            self.journal.append_with(seq, &item.command, item.annex.as_deref()).map_err(error)?;
            self.events.clear();
            self.engine.apply(&item.command, &mut self.events);
            let first_report = done.reports.len();
            self.builder.reports(&item.command, &self.events, &mut done.reports);
            if let Some(gateway) = self.settings.gateway
                && gateway.wants(item.annex.is_some(), &done.reports[first_report..])
            {
                let annex = item.annex.as_deref().and_then(fix::venue::Annex::decode);
                done.fix_events.push(fix::venue::FixEvent { seq, command: item.command, annex, reports: done.reports[first_report..].to_vec() });
            }
            self.commands += 1;
        }
        self.journal.publish().map_err(error)?;
        self.shared.commands.store(self.commands, Ordering::Release);
        if let Some(gateway) = self.settings.gateway {
            gateway.set_engine_seq(self.engine.seq());
        }
        done.last_seq = self.engine.seq();
        self.waiting.push_back(done);
        Ok(())
    }

    /// Hands out the reports of every batch the journal now holds.
    pub(crate) fn release(&mut self) -> Result<(), ServeError> {
        let Some(target) = self.waiting.front().map(|w| w.last_seq) else {
            return Ok(());
        };
        // What the journal acknowledged before any failure is released
        // first: those commands are durable, and their clients hear of them.
        let acked = self.journal.acked();
        let _ = target;
        while self.waiting.front().is_some_and(|w| w.last_seq <= acked) {
            if let Some(done) = self.waiting.pop_front() {
                dispatch(&done.reports, &done.refused, self.shared);
                let micros = done.applied_at.elapsed().as_micros() as u64;
                self.residence.saturating_record_n(micros, done.answered.len() as u64);
                if let Some(gateway) = self.settings.gateway
                    && !done.fix_events.is_empty()
                {
                    gateway.deliver(done.fix_events);
                }
                for counter in done.answered {
                    counter.done();
                }
            }
        }
        match self.journal.failure() {
            Some(failure) => Err(error(failure)),
            None => Ok(()),
        }
    }

    /// Whether every batch applied is out.
    pub(crate) fn idle(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Snapshots (due or asked for) and the periodic throughput line.
    pub(crate) fn tick(&mut self) {
        let requested = self.settings.snapshot_now.swap(false, Ordering::AcqRel);
        let seq = self.engine.seq();
        if requested || (self.settings.snapshot_every > 0 && seq - self.last_snapshot >= self.settings.snapshot_every) {
            // Encoded here (quick), written and synced by the snapshotter,
            // once the journal holds everything it covers. If the last one
            // is still being written, this one is skipped: the next comes
            // `snapshot_every` commands later (or ask again).
            if self.snapshotter.is_free() {
                let mut state = Vec::new();
                self.engine.encode_state(&mut state);
                self.snapshotter.offer(seq, state);
                if requested {
                    log(&format!("snapshot requested: writing one at seq {seq}"));
                }
            } else if requested {
                log("snapshot requested: the previous one is still being written; ask again");
            }
            self.last_snapshot = seq;
        }
        // Every 5 s while commands come; nothing on an idle venue.
        if self.last_log.elapsed() >= Duration::from_secs(5) {
            if self.commands > self.logged {
                let rate = (self.commands - self.logged) as f64 / self.last_log.elapsed().as_secs_f64();
                log(&format!("throughput commands={} per_s={rate:.0} seq={seq}", self.commands));
            }
            self.last_log = Instant::now();
            self.logged = self.commands;
        }
    }

    /// Applies what is left, makes it all durable, writes a snapshot.
    fn finish(mut self, leftover: Vec<Inbound>) -> Result<Summary, ServeError> {
        let mut leftover = leftover;
        self.apply(&mut leftover)?;
        let watch = self.journal.watch();
        let stats = self.journal.close().map_err(error)?;
        if stats.writes > 0 || stats.syncs > 0 {
            let h = &stats.sync_micros;
            log(&format!(
                "journal: {} writes, {:.1} commands each on average (largest {}); {} fdatasyncs, {:.0} us on average (p50 {} p99 {} p99.9 {} max {} us)",
                stats.writes,
                stats.average_group(),
                stats.largest_group,
                stats.syncs,
                stats.average_sync_micros(),
                h.value_at_quantile(0.5),
                h.value_at_quantile(0.99),
                h.value_at_quantile(0.999),
                h.max()
            ));
        }
        let w = &stats.write_to_sync_micros;
        if !w.is_empty() {
            log(&format!(
                "journal (async): acknowledged writes waited for the sync covering them p50 {} p99 {} max {} us (over {} syncs): what a power cut could have taken back",
                w.value_at_quantile(0.5),
                w.value_at_quantile(0.99),
                w.max(),
                w.len()
            ));
        }
        let h = &self.residence;
        if h.len() > 0 {
            log(&format!(
                "in the server: {} commands, applied to reports released p50 {} p90 {} p99 {} p99.9 {} max {} us",
                h.len(),
                h.value_at_quantile(0.5),
                h.value_at_quantile(0.9),
                h.value_at_quantile(0.99),
                h.value_at_quantile(0.999),
                h.max()
            ));
        }
        self.snapshotter.stop();
        // The journal is closed and synced: the snapshot continues its last
        // record. Its failure (a full disk) costs the next start a longer
        // replay, nothing else.
        let seq = self.engine.seq();
        let snapshot = match watch.chain_at(seq) {
            Some(chain) => write_snapshot(self.settings.data_dir, &self.engine, chain, KEEP_SNAPSHOTS).map(|_| ()).map_err(|e| e.to_string()),
            None => Err("the checksum of the journal's last record is not at hand".to_string()),
        };
        match snapshot {
            Ok(()) => log(&format!("snapshot written at seq {seq}")),
            Err(e) => log(&format!("warning: the shutdown snapshot at seq {seq} was not written ({e}); the journal holds everything, and the next start replays it")),
        }
        Ok(Summary { seq, commands: self.commands })
    }
}

/// Commands handed from the journal reader to the rebuilding thread at a
/// time.
const REBUILD_BATCH: usize = 4096;

/// Every account's session history as it stood when the process stopped:
/// reports are a function of the journal, so replaying it through a
/// [`ReportBuilder`] numbers them exactly as they were numbered live, and a
/// session that reconnects after a restart still gets what it missed.
/// One thread reads, checks and decodes the journal while this one
/// applies; the FIX gateway follows the commands it would have been given
/// live (`Gateway::wants`).
fn rebuild_histories(dir: &Path, through: u64, gateway: Option<&fix::Gateway>) -> Result<HashMap<AccountId, History>, String> {
    type Decoded = (u64, Command, Option<Vec<u8>>);
    let (sender, receiver) = sync_channel::<Vec<Decoded>>(4);
    let reader_dir = dir.to_path_buf();
    let reader = thread::Builder::new()
        .name("history-reader".into())
        .spawn(move || {
            let mut batch = Vec::with_capacity(REBUILD_BATCH);
            let result = crossbook_journal::scan(&reader_dir, |seq, payload| {
                if seq > through {
                    return Ok(());
                }
                let (command, annex) = crossbook_journal::format::split_payload(payload)?;
                batch.push((seq, command, annex.map(<[u8]>::to_vec)));
                if batch.len() == REBUILD_BATCH {
                    let full = std::mem::replace(&mut batch, Vec::with_capacity(REBUILD_BATCH));
                    sender.send(full).map_err(|_| "rebuilding stopped".to_string())?;
                }
                Ok(())
            });
            if result.is_ok() && !batch.is_empty() {
                let _ = sender.send(batch);
            }
            result.map(|_| ()).map_err(|e| e.to_string())
        })
        .map_err(|e| format!("starting the history reader thread: {e}"))?;
    let mut engine = Engine::new();
    let mut builder = ReportBuilder::new();
    let mut histories: HashMap<AccountId, History> = HashMap::new();
    let mut events = Vec::new();
    let mut reports = Vec::new();
    // The FIX gateway follows the same replay: its book of ClOrdIDs, and
    // the reports its sessions' stores do not have yet.
    let fix_through = gateway.map(fix::Gateway::through).unwrap_or_default();
    for batch in receiver {
        for (seq, command, annex) in batch {
            events.clear();
            reports.clear();
            engine.apply(&command, &mut events);
            builder.reports(&command, &events, &mut reports);
            for addressed in &reports {
                record_history(histories.entry(addressed.account).or_default(), addressed.report);
            }
            if let Some(gateway) = gateway
                && gateway.wants(annex.is_some(), &reports)
            {
                let annex = annex.as_deref().and_then(fix::venue::Annex::decode);
                gateway.replay(fix::venue::FixEvent { seq, command, annex, reports: reports.clone() }, &fix_through);
            }
        }
    }
    match reader.join() {
        Ok(result) => result?,
        Err(_) => return Err("the history reader thread panicked".into()),
    }
    Ok(histories)
}

/// Numbers a report for its account and keeps it; returns it numbered.
fn record_history(history: &mut History, mut report: ExecutionReport) -> ExecutionReport {
    history.last += 1;
    report.seq = history.last;
    if history.reports.len() == HISTORY_REPORTS {
        history.reports.pop_front();
    }
    history.reports.push_back(report);
    report
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
        let report = record_history(seqs.entry(addressed.account).or_default(), addressed.report);
        if sessions.contains_key(&addressed.account) {
            encode_server(&ServerMessage::ExecutionReport(report), outgoing.entry(addressed.account).or_default());
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
}
