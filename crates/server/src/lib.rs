//! `crossbook serve`: the exchange as a network service (first piece).
//!
//! Threads and queues (docs/ARCHITECTURE.md has the picture):
//!
//! - the **acceptor** (the caller's thread) takes connections, up to
//!   `limits.max_connections`;
//! - per connection, a **reader** decodes frames, authenticates the
//!   session, and sends order commands into one bounded queue
//!   (`limits.queue`): when it is full the reader blocks, so it stops
//!   reading its socket (backpressure, never an unbounded queue); and a
//!   **writer** that sends what the sequencer queued for that session;
//! - one **sequencer** takes everything queued, journals it (one group
//!   commit per batch), applies it to the engine, waits until the batch is
//!   durable, and only then hands each execution report to the owning
//!   session's writer.
//!
//! Not built yet (see the issue): replay of missed reports on reconnect,
//! the load generator, per-session in-flight limits, the FIX gateway.

pub mod config;
pub mod fix;

use config::{Config, keys_match};
use crossbook_engine::{AccountId, Command, Engine, Event};
use crossbook_journal::{Durability, Journal, JournalConfig, recover, write_snapshot};
use crossbook_protocol::reports::{Addressed, ReportBuilder};
use crossbook_protocol::*;
use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// Buffers (a batch of frames each) queued for one session's writer before
/// the session is dropped as too slow.
const OUTBOUND_FRAMES: usize = 4_096;
/// Commands the sequencer takes into one batch (one group commit).
const MAX_BATCH: usize = 4_096;
/// Bytes asked of the socket per read.
const READ_BYTES: usize = 64 * 1024;
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

fn error(what: impl std::fmt::Display) -> ServeError {
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
    reader: thread::Thread,
}

impl InFlight {
    /// A count owned by the calling (reader) thread.
    pub(crate) fn new() -> Arc<InFlight> {
        Arc::new(InFlight { count: AtomicU32::new(0), reader: thread::current() })
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

    pub(crate) fn add(&self, n: u32) {
        self.count.fetch_add(n, Ordering::AcqRel);
    }

    fn done(&self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
        self.reader.unpark();
    }
}

struct Session {
    connection: u64,
    outbound: SyncSender<Vec<u8>>,
}

/// The reason code of a refusal by the open-order limit (not an engine
/// reason: docs/protocol.md).
pub const OPEN_ORDER_LIMIT: u8 = 100;

/// Reports kept per account for replay to a session that reconnects.
const HISTORY_REPORTS: usize = 100_000;

/// An account's session sequence and its recent report frames.
#[derive(Default)]
struct History {
    /// The last sequence number given.
    last: u64,
    /// (seq, frame) of the last `HISTORY_REPORTS` reports.
    frames: std::collections::VecDeque<(u64, Vec<u8>)>,
}

#[derive(Default)]
struct Shared {
    sessions: Mutex<HashMap<AccountId, Session>>,
    /// The last session sequence number given to each account's messages
    /// (since this process started). Locked after `sessions`.
    seqs: Mutex<HashMap<AccountId, History>>,
    connections: AtomicUsize,
    commands: AtomicU64,
    /// Set when the sequencer has stopped (normally or on an I/O error).
    sequencer_stopped: AtomicBool,
}

fn log(line: &str) {
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
pub fn serve(config: Config, shutdown: Arc<AtomicBool>, listening: impl FnOnce(SocketAddr)) -> Result<Summary, ServeError> {
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
    listener.set_nonblocking(true).map_err(error)?;
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
        thread::Builder::new()
            .name("sequencer".into())
            .spawn(move || {
                let settings = Settings { data_dir: &data_dir, snapshot_every, open_orders, gateway: gateway.as_deref() };
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
    let config = Arc::new(config);
    let mut next_connection = 0u64;
    while !shutdown.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, peer)) => {
                next_connection += 1;
                accept(stream, peer, next_connection, &config, &shared, &queue, &shutdown);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => thread::sleep(Duration::from_millis(5)),
            Err(e) => log(&format!("accept failed: {e}")),
        }
    }
    log("shutting down: no new connections; draining");
    if let Some(gateway) = &gateway {
        gateway.stop();
    }
    drop(queue);
    drop(listener);
    let summary = match sequencer.join() {
        Ok(result) => result?,
        Err(_) => return Err(error("the sequencer thread panicked")),
    };
    log(&format!("stopped at seq {}", summary.seq));
    Ok(summary)
}

fn accept(
    stream: TcpStream,
    peer: SocketAddr,
    id: u64,
    config: &Arc<Config>,
    shared: &Arc<Shared>,
    queue: &SyncSender<Vec<Inbound>>,
    shutdown: &Arc<AtomicBool>,
) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_nodelay(true);
    if shared.connections.load(Ordering::Acquire) >= config.limits.max_connections {
        log(&format!("refused connection {id} from {peer}: connection limit {}", config.limits.max_connections));
        let mut frame = Vec::new();
        encode_server(&ServerMessage::Error { reason: ProtocolError::FrameTooLong }, &mut frame);
        let mut stream = stream;
        let _ = stream.write_all(&frame);
        return;
    }
    shared.connections.fetch_add(1, Ordering::AcqRel);
    let (config, shared, queue, shutdown) = (config.clone(), shared.clone(), queue.clone(), shutdown.clone());
    let spawned = thread::Builder::new().name(format!("conn-{id}")).spawn(move || {
        let reason = connection(stream, id, &config, &shared, &queue, &shutdown);
        shared.connections.fetch_sub(1, Ordering::AcqRel);
        log(&format!("disconnect connection={id} peer={peer} reason={reason}"));
    });
    if spawned.is_err() {
        log(&format!("could not start a thread for connection {id}"));
    }
}

/// Serves one connection; returns why it ended.
fn connection(
    stream: TcpStream,
    id: u64,
    config: &Config,
    shared: &Shared,
    queue: &SyncSender<Vec<Inbound>>,
    shutdown: &AtomicBool,
) -> String {
    let Ok(write_half) = stream.try_clone() else {
        return "cannot clone the socket".into();
    };
    let (outbound, frames) = sync_channel::<Vec<u8>>(OUTBOUND_FRAMES);
    let writer = thread::spawn(move || write_frames(write_half, frames));
    let reason = read_loop(stream, id, config, shared, queue, shutdown, &outbound);
    // Leave the registry (if this connection is still the account's
    // session), let the writer finish what is queued, and close.
    let mut sessions = shared.sessions.lock().unwrap_or_else(|e| e.into_inner());
    sessions.retain(|_, s| s.connection != id);
    drop(sessions);
    drop(outbound);
    let _ = writer.join();
    reason
}

fn write_frames(mut stream: TcpStream, frames: Receiver<Vec<u8>>) {
    let mut buffer: Vec<u8> = Vec::with_capacity(1 << 16);
    while let Ok(first) = frames.recv() {
        // Everything queued goes out in one write.
        buffer.clear();
        buffer.extend_from_slice(&first);
        while buffer.len() < 1 << 20 {
            match frames.try_recv() {
                Ok(more) => buffer.extend_from_slice(&more),
                Err(_) => break,
            }
        }
        if stream.write_all(&buffer).is_err() {
            break;
        }
    }
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

fn send(outbound: &SyncSender<Vec<u8>>, message: &ServerMessage) {
    let mut frame = Vec::with_capacity(96);
    encode_server(message, &mut frame);
    let _ = outbound.send(frame);
}

fn read_loop(
    mut stream: TcpStream,
    id: u64,
    config: &Config,
    shared: &Shared,
    queue: &SyncSender<Vec<Inbound>>,
    shutdown: &AtomicBool,
    outbound: &SyncSender<Vec<u8>>,
) -> String {
    let _ = stream.set_read_timeout(Some(POLL));
    let max_frame = config.limits.max_frame;
    // Never more than one frame plus one read in memory.
    let mut buffer: Vec<u8> = Vec::with_capacity(max_frame + 4 + READ_BYTES);
    let mut chunk = vec![0u8; READ_BYTES];
    let mut account: Option<AccountId> = None;
    let in_flight = InFlight::new();
    let limit = config.limits.in_flight.max(1);
    let mut commands: Vec<Inbound> = Vec::new();
    loop {
        if shutdown.load(Ordering::Acquire) {
            send(outbound, &ServerMessage::Logout { reason: 0 });
            return "server shutting down".into();
        }
        // Backpressure: while this session has too many commands
        // unanswered, its socket is not read.
        if !in_flight.wait_below(limit, || shared.sequencer_stopped.load(Ordering::Acquire) || shutdown.load(Ordering::Acquire)) {
            continue;
        }
        match stream.read(&mut chunk) {
            Ok(0) => return "closed by the client".into(),
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => continue,
            Err(e) => return format!("read error: {e}"),
        }
        let mut used = 0;
        let mut ended = None;
        loop {
            match decode_client(&buffer[used..], max_frame) {
                Ok(Decoded::NeedMore) => break,
                Ok(Decoded::Message(message, size)) => {
                    used += size;
                    if let Err(reason) = handle(message, id, &mut account, config, shared, outbound, &in_flight, &mut commands) {
                        ended = Some(reason);
                        break;
                    }
                }
                Err(reason) => {
                    send(outbound, &ServerMessage::Error { reason });
                    ended = Some(format!("protocol error: {reason}"));
                    break;
                }
            }
        }
        buffer.drain(..used);
        // Everything this read held goes to the sequencer in one hand-over
        // (blocking while its queue is full: backpressure).
        if !commands.is_empty() {
            in_flight.add(commands.len() as u32);
            if queue.send(std::mem::take(&mut commands)).is_err() {
                return "server stopping".into();
            }
        }
        if let Some(reason) = ended {
            return reason;
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn handle(
    message: ClientMessage,
    id: u64,
    account: &mut Option<AccountId>,
    config: &Config,
    shared: &Shared,
    outbound: &SyncSender<Vec<u8>>,
    in_flight: &Arc<InFlight>,
    commands: &mut Vec<Inbound>,
) -> Result<(), String> {
    match (message, *account) {
        (ClientMessage::Login { account: claimed, api_key, last_seen }, None) => {
            let known = config.api_key(claimed).is_some_and(|key| keys_match(&key, &api_key));
            if !known {
                send(outbound, &ServerMessage::LoginRejected { reason: ProtocolError::BadCredentials });
                return Err(format!("login refused for account {claimed}: bad credentials"));
            }
            let mut sessions = shared.sessions.lock().unwrap_or_else(|e| e.into_inner());
            if sessions.contains_key(&claimed) {
                drop(sessions);
                send(outbound, &ServerMessage::LoginRejected { reason: ProtocolError::AlreadyLoggedIn });
                return Err(format!("login refused for account {claimed}: already logged in"));
            }
            sessions.insert(claimed, Session { connection: id, outbound: outbound.clone() });
            // While `sessions` is held no report can be dispatched: the
            // replay and the acceptance cannot be overtaken.
            let seqs = shared.seqs.lock().unwrap_or_else(|e| e.into_inner());
            let history = seqs.get(&claimed);
            let next_seq = history.map_or(0, |h| h.last) + 1;
            send(outbound, &ServerMessage::LoginAccepted { seq: 0, account: claimed, next_seq });
            let mut replayed = 0;
            if let Some(history) = history {
                let mut frames = Vec::new();
                for (seq, frame) in &history.frames {
                    if *seq > last_seen {
                        frames.extend_from_slice(frame);
                        replayed += 1;
                    }
                }
                if !frames.is_empty() {
                    let _ = outbound.send(frames);
                }
                if let Some(&(oldest, _)) = history.frames.front()
                    && last_seen + 1 < oldest {
                        log(&format!("account {claimed} asked for reports from {} but only {oldest}.. are kept", last_seen + 1));
                    }
            }
            drop(seqs);
            drop(sessions);
            log(&format!("login connection={id} account={claimed} replayed={replayed}"));
            *account = Some(claimed);
            log(&format!("login connection={id} account={claimed}"));
            Ok(())
        }
        (ClientMessage::Login { .. }, Some(_)) => {
            send(outbound, &ServerMessage::Error { reason: ProtocolError::AlreadyLoggedIn });
            Err("second login on one connection".into())
        }
        (_, None) => {
            send(outbound, &ServerMessage::Error { reason: ProtocolError::NotLoggedIn });
            Err("message before login".into())
        }
        (ClientMessage::Heartbeat, Some(_)) => {
            send(outbound, &ServerMessage::Heartbeat);
            Ok(())
        }
        (ClientMessage::Logout, Some(who)) => {
            send(outbound, &ServerMessage::Logout { reason: 0 });
            log(&format!("logout connection={id} account={who}"));
            Err("logout".into())
        }
        (message, Some(who)) => {
            let Some(command) = message.to_command(who) else {
                return Ok(());
            };
            commands.push(Inbound { command, annex: None, in_flight: in_flight.clone() });
            Ok(())
        }
    }
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
            if settings.snapshot_every > 0 && engine.seq() - last_snapshot >= settings.snapshot_every {
                // Encoded here (quick), written and synced by the
                // snapshotter, once the journal holds everything it covers.
                // If the last one is still being written, this one is
                // skipped: the next comes `snapshot_every` commands later.
                if snapshotter.is_free() {
                    let mut state = Vec::new();
                    engine.encode_state(&mut state);
                    snapshotter.offer(engine.seq(), state);
                }
                last_snapshot = engine.seq();
            }
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
    journal.close().map_err(error)?;
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
    let mut sessions = shared.sessions.lock().unwrap_or_else(|e| e.into_inner());
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
    for (account, frames) in outgoing {
        let Some(session) = sessions.get(&account) else {
            continue;
        };
        if let Err(TrySendError::Full(_)) = session.outbound.try_send(frames) {
            // A client that does not read its reports loses its session
            // rather than the server's memory.
            log(&format!("dropping session of account {account}: it does not read its reports"));
            sessions.remove(&account);
        }
    }
}
