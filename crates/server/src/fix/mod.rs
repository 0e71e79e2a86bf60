//! The FIX 4.4 gateway of `crossbook serve` (docs/fix.md).
//!
//! Threads: an **acceptor**; per connection a **reader** (frames bytes,
//! hands each message to its session's state machine under the gateway
//! lock, then sends the engine commands that came of it to the sequencer)
//! and a **writer** (a bounded queue of bytes to the socket); one
//! **reporter** that turns the sequencer's execution reports into FIX
//! messages for the sessions they belong to; one **timer** for heartbeats
//! and time-outs. Everything a session sends is recorded in its store
//! (`store.rs`) before it is written to the socket, and synced first in
//! `sync` durability.
//!
//! Lock order: the gateway lock is never held while waiting on the
//! sequencer's queue (commands are collected and sent after it is
//! released), so the sequencer, which hands reports to the reporter,
//! can never wait on a reader.

pub mod store;
pub mod venue;

use crate::config::{Config, FixConfig};
use crossbook_engine::AccountId;
use crossbook_fix::dictionary::Dictionary;
use crossbook_fix::session::{Action, Application, EchoApplication, Session, SessionConfig, StoreOp};
use crossbook_fix::wire::{Frame, Message, frame};
use std::collections::{HashMap, HashSet};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::thread;
use std::time::Duration;
use crate::sequencer::Inbound;
use crate::sink::{Checkpoint, Durable, Released, ReportSink, RestoreError};
use store::{Store, StoreError};
use venue::{Annex, FixBook, FixEvent, Link, Request, VenueApp};

/// Why the FIX gateway could not start.
#[derive(Debug)]
pub enum FixError {
    /// `[fix]` or the instruments cannot be served as configured.
    Config(crate::config::ConfigError),
    /// The data dictionary named by `fix.dictionary` cannot be read.
    Dictionary { path: String, why: crossbook_fix::dictionary::DictionaryError },
    /// A session store has no `.compid` file beside it (so no CompID).
    NoCompId { store: PathBuf },
    /// The `.compid` file beside a store names a CompID whose store has
    /// another name (the file was changed, or moved).
    CompIdMismatch { store: PathBuf, comp_id: String },
    /// A session store could not be read back (or rewound).
    Store(StoreError),
    /// The listening socket or a thread could not be set up.
    Io { what: String, source: std::io::Error },
}

impl std::fmt::Display for FixError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FixError::Config(e) => write!(f, "{e}"),
            FixError::Dictionary { path, why } => write!(f, "{path}: {why}"),
            FixError::NoCompId { store } => write!(f, "{}: no CompID file beside the store", store.display()),
            FixError::CompIdMismatch { store, comp_id } => {
                write!(f, "{}: its CompID file names {comp_id:?}, whose store is named otherwise: the file was changed or moved", store.display())
            }
            FixError::Store(e) => write!(f, "session store: {e}"),
            FixError::Io { what, source } => write!(f, "{what}: {source}"),
        }
    }
}

impl std::error::Error for FixError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            FixError::Store(e) => Some(e),
            FixError::Io { source, .. } => Some(source),
            FixError::Config(e) => Some(e),
            FixError::Dictionary { .. } | FixError::NoCompId { .. } | FixError::CompIdMismatch { .. } => None,
        }
    }
}

impl From<StoreError> for FixError {
    fn from(e: StoreError) -> FixError {
        FixError::Store(e)
    }
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> FixError {
    let what = what.into();
    move |source| FixError::Io { what, source }
}

/// Events the reporter takes in one pass (one lock of the gateway).
const REPORTER_BATCH: usize = 4096;
/// Bytes asked of a FIX socket per read.
const READ_CHUNK: usize = 16 * 1024;
/// The smallest `fix.max_message` honoured (a Logon must fit).
const MIN_MAX_MESSAGE: usize = 256;
/// Bytes a writer gathers from its queue into one write.
const WRITE_BATCH: usize = 1 << 20;
/// How long a writer waits for the socket to take a write before it gives
/// the connection up.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// SenderCompID (49): which session a connection's first message is for.
const SENDER_COMP_ID: u32 = 49;
/// Username (553): the account a Logon claims, when its CompID is not
/// configured.
const USERNAME: u32 = 553;

/// Bytes queued for one connection's writer before it is dropped as a
/// counterparty that does not read: twice the most a resend of every kept
/// message can be (`crossbook_fix::session`: 64 MiB), so that whatever the
/// venue owes a reading counterparty at once (that resend, or the reports
/// of a mass cancel of every open order) fits.
const OUTBOUND_BYTES: usize = 128 << 20;
/// Hand-overs queued for one connection's writer (each a batch of
/// messages) before it is dropped the same way.
const OUTBOUND_BATCHES: usize = 65_536;
/// How often the timer looks at every session.
const TICK: Duration = Duration::from_millis(200);
const POLL: Duration = Duration::from_millis(50);
/// How long `stop` waits for the writers to take their last messages out.
const CLOSE_GRACE: Duration = Duration::from_secs(2);
/// Events queued for the reporter.
const REPORT_QUEUE: usize = 65_536;
/// CompIDs (session stores) an account may have, at most: each first
/// Logon by Username and Password makes one, kept for good.
pub(crate) const MAX_COMP_IDS: usize = 16;
/// Refused first Logons whose sequence numbers are remembered, at most.
const REFUSED_REMEMBERED: usize = 1024;
/// How long an ending connection waits for what it handed the sequencer
/// to be durable, at most (moments, normally).
const SETTLE: Duration = Duration::from_secs(2);
/// How long a Logon waits for its session's previous connection, which
/// still looks alive, to end before it is refused.
const RELOGON_WAIT: Duration = Duration::from_millis(250);

fn log(line: &str) {
    crate::log(line);
}

/// Milliseconds since the epoch: the gateway's clock (the session layer
/// itself is handed the time).
pub fn now_ms() -> i64 {
    crate::now_ms() as i64
}

enum Out {
    /// A message, and the store writes that must be on disk before it
    /// is sent (none for a Logon refused without a store).
    Bytes(Vec<u8>, Option<Gate>),
    Close,
}

/// A session's store and how many of its writes a message needs on disk.
type Gate = (Arc<store::Durable>, u64);

/// A connection's writer queue, bounded in bytes ([`OUTBOUND_BYTES`]) and
/// hand-overs ([`OUTBOUND_BATCHES`]), not in messages: a burst owed to a
/// counterparty that reads is never mistaken for one that does not.
#[derive(Clone)]
struct Outlet {
    sender: SyncSender<Out>,
    /// Bytes handed over and not yet written (the writer takes them off).
    queued: Arc<AtomicUsize>,
}

impl Outlet {
    fn new() -> (Outlet, Receiver<Out>, Arc<AtomicUsize>) {
        let (sender, frames) = sync_channel::<Out>(OUTBOUND_BATCHES);
        let queued = Arc::new(AtomicUsize::new(0));
        (Outlet { sender, queued: queued.clone() }, frames, queued)
    }

    /// Queues `item`, refused (`Full`) past either bound.
    fn try_send(&self, item: Out) -> Result<(), TrySendError<Out>> {
        let bytes = match &item {
            Out::Bytes(bytes, _) => bytes.len(),
            Out::Close => 0,
        };
        if self.queued.fetch_add(bytes, Ordering::AcqRel) + bytes > OUTBOUND_BYTES {
            self.queued.fetch_sub(bytes, Ordering::AcqRel);
            return Err(TrySendError::Full(item));
        }
        self.sender.try_send(item).inspect_err(|_| {
            self.queued.fetch_sub(bytes, Ordering::AcqRel);
        })
    }
}

struct Connection {
    id: u64,
    out: Outlet,
    /// A handle on the socket: to see whether the peer is still there when
    /// its account logs on again, and to close it then.
    stream: TcpStream,
    /// A Logon was accepted on it while the account had
    /// `cancel_on_disconnect`: its end cancels the account's orders.
    cancel_on_disconnect: bool,
}

/// Whether the peer of `stream` is still there: no end and no error
/// waiting to be read (a non-blocking peek, on a socket its reader thread
/// reads blocking).
fn peer_alive(stream: &TcpStream) -> bool {
    use std::os::fd::AsRawFd;
    let mut byte = 0u8;
    // SAFETY: a valid socket descriptor and a one-byte buffer.
    let got = unsafe { libc::recv(stream.as_raw_fd(), (&mut byte as *mut u8).cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    if got > 0 {
        return true;
    }
    if got == 0 {
        return false;
    }
    matches!(std::io::Error::last_os_error().kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted)
}

enum App {
    Echo(EchoApplication),
    Venue,
}

struct FixSession {
    session: Session,
    store: Store,
    account: Option<AccountId>,
    /// The account a Logon of this CompID succeeded for once (kept in its
    /// store): the CompID is that account's for good, whatever a later
    /// Logon claims.
    bound: Option<AccountId>,
    connection: Option<Connection>,
    app: App,
    /// Set after a store write or sync failed: the session is closed and
    /// refuses to log on until restart.
    poisoned: Option<StoreError>,
    /// The engine sequence number the store has reports up to.
    through: u64,
    /// The connection the session layer dropped (a Logout, an error, a
    /// failed store), or a new Logon replaced (its peer gone), that was to
    /// cancel its account's orders: its reader does, in `detach`.
    dropped: Option<u64>,
    /// The connection attached to it last: the next one's reader waits
    /// until that one's has ended (`Gateway::readers`).
    last_connection: Option<u64>,
    /// The sequence number of the first message read whose engine
    /// command is not durable yet, if any: the store's incoming number
    /// goes no further (a restart asks the counterparty to send again
    /// from there, so a crash cannot lose an order it had sent).
    received_floor: Option<u64>,
    /// The incoming number the store's last Received record holds (one
    /// that would say the same again is not written).
    received: u64,
}

struct State {
    /// By the counterparty's CompID.
    sessions: HashMap<String, FixSession>,
    /// The session each account's reports go to.
    routes: HashMap<AccountId, String>,
    book: FixBook,
}

pub struct Gateway {
    config: FixConfig,
    echo: bool,
    dictionary: Arc<Dictionary>,
    /// The instruments listed (FIX units and all), as they are at each
    /// message: a reload may add some.
    listing: Arc<crate::listing::Listing>,
    /// The accounts' API keys, for Logon by Username/Password.
    keys: Arc<crate::keys::Keys>,
    in_flight_limit: u32,
    dir: PathBuf,
    sync: bool,
    state: Mutex<State>,
    /// Accounts whose reports the sequencer must pass on.
    fix_accounts: RwLock<HashSet<AccountId>>,
    reports: Mutex<Option<SyncSender<ToReporter>>>,
    next_connection: AtomicU64,
    /// The sequence number of the sequencer's last applied command: a
    /// session bound to an account gets the reports of later ones.
    applied: Arc<AtomicU64>,
    /// Writer threads still running (`stop` waits for them, bounded).
    writers: AtomicU64,
    /// Open connections; logged-on sessions may be `max_connections`.
    connections: AtomicU64,
    max_connections: u64,
    /// Connections that have not logged on yet, oldest first, with a
    /// handle to close them: past `max_unauthenticated` the oldest makes
    /// room for a new one, so idle connections never keep a trader out.
    waiting: Mutex<std::collections::VecDeque<(u64, TcpStream)>>,
    max_unauthenticated: usize,
    login_timeout: Duration,
    /// Connection events a flood could multiply, rate-limited.
    ratelog: Mutex<crate::ratelog::RateLog>,
    /// Connections whose reader thread has not ended. A session's new
    /// connection handles nothing before the reader of the one it follows
    /// has ended: that reader hands the sequencer what it read (its
    /// orders) and then, if the account asks, the cancel on disconnect,
    /// before any command of the new connection (`docs/fix.md`).
    readers: Mutex<HashSet<u64>>,
    reader_ended: std::sync::Condvar,
    /// Each reader's count of requests not answered yet: a stopping venue
    /// waits for them before it closes the gateways (`settled`).
    /// (With whether the reader may still hand something over: until it
    /// has left its loop, which at a stop it does within a read's
    /// time-out.)
    in_flights: Mutex<HashMap<u64, ReaderState>>,
    /// The reporter thread (`stop` lets it finish).
    reporter: Mutex<Option<thread::JoinHandle<()>>>,
    /// The sequence numbers of CompIDs whose first Logon was refused
    /// (no store is made for them), newest last, at most
    /// [`REFUSED_REMEMBERED`]: a store made later starts from them.
    refused: Mutex<std::collections::VecDeque<(String, (u64, u64))>>,
}

fn session_config(fix: &FixConfig, comp_id: &str) -> SessionConfig {
    let mut config = SessionConfig::new(&fix.comp_id, comp_id);
    config.reset_on_logon = fix.reset_on_logon;
    config.max_latency_ms = fix.max_latency_s as i64 * 1000;
    config
}

/// The data dictionary `fix.dictionary` names, or the built-in one.
pub(crate) fn read_dictionary(fix: &crate::config::FixConfig) -> Result<Dictionary, FixError> {
    if fix.dictionary.is_empty() {
        return Ok(Dictionary::builtin());
    }
    let text = std::fs::read_to_string(&fix.dictionary).map_err(io(format!("reading the FIX dictionary {}", fix.dictionary)))?;
    Dictionary::from_xml(&text).map_err(|why| FixError::Dictionary { path: fix.dictionary.clone(), why })
}

impl Gateway {
    /// Reads the dictionary and every session store under `<data>/fix`.
    ///
    /// `journal_end` is the last command recovery found: a store whose
    /// reports go further (an async-mode power cut took the commands
    /// behind them back, with the reports) is rewound to it, so that the
    /// commands journaled in their place are reported; the messages the
    /// counterparty already has keep their MsgSeqNums, and numbering goes
    /// on after them.
    pub(crate) fn open(config: &Config, listing: Arc<crate::listing::Listing>, keys: Arc<crate::keys::Keys>, sync: bool, journal_end: u64, applied: Arc<AtomicU64>) -> Result<Arc<Gateway>, FixError> {
        let fix = config.fix.clone();
        let echo = match fix.application.as_str() {
            "echo" => true,
            "venue" => false,
            other => return Err(FixError::Config(crate::config::ConfigError::BadFixApplication(other.to_string()))),
        };
        let dictionary = read_dictionary(&fix)?;
        let dir = config.data_dir.join("fix");
        std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
        let dictionary = Arc::new(dictionary);
        let mut state = State { sessions: HashMap::new(), routes: HashMap::new(), book: FixBook::new() };
        let entries = std::fs::read_dir(&dir).map_err(io(format!("reading {}", dir.display())))?;
        let all: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        let mut paths: Vec<PathBuf> = all.iter().filter(|p| p.extension().is_some_and(|x| x == "fixstore")).cloned().collect();
        paths.sort();
        // A CompID file without its store: a session made just before a
        // crash (its name is durable first, nothing was recorded yet), or a
        // store that was removed. Either way its numbers start at 1 when it
        // logs on: said, since the second would surprise its counterparty.
        for comp_file in all.iter().filter(|p| p.extension().is_some_and(|x| x == "compid")) {
            if !comp_file.with_extension("fixstore").exists() {
                log(&format!(
                    "FIX: {} has no store beside it: a session made just before a crash, or a store removed; its sequence numbers start at 1 when it logs on",
                    comp_file.display()
                ));
            }
        }
        for path in paths {
            // The CompID first: a store named for another CompID is not
            // this one's (and is not opened, so nothing is written to it).
            let Some(comp_id) = read_comp_id(&path) else {
                return Err(FixError::NoCompId { store: path.clone() });
            };
            if store::path_for(&dir, &comp_id) != path {
                return Err(FixError::CompIdMismatch { store: path.clone(), comp_id });
            }
            let (mut store, mut restored) = Store::open(&path)?;
            if restored.through_seq > journal_end {
                log(&format!(
                    "FIX store {}: reports up to command {} but the journal ends at {}: those commands are not in the journal (taken back by a power cut in async durability; in sync durability, synced records lost, or a copy of the directory taken while the venue ran); reporting goes on from {}",
                    path.display(),
                    restored.through_seq,
                    journal_end,
                    journal_end
                ));
                store.rewind(journal_end)?;
                restored.through_seq = journal_end;
            }
            let session = Session::restore(session_config(&fix, &comp_id), dictionary.clone(), restored.next_in, restored.next_out, restored.stored);
            if let Some(account) = restored.account {
                state.routes.insert(account, comp_id.clone());
            }
            let app = if echo { App::Echo(EchoApplication::default()) } else { App::Venue };
            state.sessions.insert(comp_id, FixSession { session, store, account: restored.account, bound: restored.account, connection: None, app, poisoned: None, through: restored.through_seq, dropped: None, last_connection: None, received_floor: None, received: restored.next_in });
        }
        let fix_accounts = RwLock::new(state.routes.keys().copied().collect());
        Ok(Arc::new(Gateway {
            listing,
            keys,
            in_flight_limit: config.limits.in_flight.max(1),
            config: fix,
            echo,
            dictionary,
            dir,
            sync,
            state: Mutex::new(state),
            fix_accounts,
            reports: Mutex::new(None),
            next_connection: AtomicU64::new(0),
            applied,
            writers: AtomicU64::new(0),
            connections: AtomicU64::new(0),
            max_connections: config.limits.max_connections as u64,
            waiting: Mutex::new(std::collections::VecDeque::new()),
            max_unauthenticated: config.limits.max_unauthenticated.max(1),
            login_timeout: Duration::from_secs(config.limits.login_timeout_s),
            readers: Mutex::new(HashSet::new()),
            reader_ended: std::sync::Condvar::new(),
            reporter: Mutex::new(None),
            in_flights: Mutex::new(HashMap::new()),
            refused: Mutex::new(std::collections::VecDeque::new()),
            ratelog: Mutex::new(crate::ratelog::RateLog::default()),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// FIX sessions with a connection now (the dashboard's figure).
    pub(crate) fn connected(&self) -> usize {
        self.lock().sessions.values().filter(|s| s.connection.is_some()).count()
    }

    /// The engine sequence number each FIX-bound account's store has
    /// reports up to (recovery regenerates what comes after).
    pub fn through(&self) -> HashMap<AccountId, u64> {
        let state = self.lock();
        let mut through = HashMap::new();
        for (account, comp_id) in &state.routes {
            if let Some(session) = state.sessions.get(comp_id) {
                through.insert(*account, session.store_through());
            }
        }
        through
    }

    /// Whether this gateway has anything to do with a command: one of its
    /// own (journaled with an annex), or reports for an account bound to
    /// one of its sessions.
    fn wants(&self, annex: bool, reports: &[crossbook_protocol::reports::Addressed]) -> bool {
        if annex {
            return true;
        }
        let accounts = self.fix_accounts.read().unwrap_or_else(|e| e.into_inner());
        !accounts.is_empty() && reports.iter().any(|r| accounts.contains(&r.account))
    }

    /// Hands a batch of events (their commands now durable) to the
    /// reporter thread.
    fn deliver(&self, events: Vec<FixEvent>) {
        let sender = self.reports.lock().unwrap_or_else(|e| e.into_inner()).clone();
        match sender {
            Some(sender) => {
                let _ = sender.send(ToReporter::Events(events));
            }
            // No reporter (not started yet, or stopped): the book follows,
            // nothing is sent or stored (the next start regenerates what
            // the stores lack).
            None => self.follow(events, Some(&HashMap::new())),
        }
    }

    /// The book's state once the reporter has followed every batch
    /// delivered so far (see `ReportSink::checkpoint`).
    fn checkpoint(&self, seq: u64) -> Checkpoint {
        let sender = self.reports.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(sender) = sender {
            let (answer, answered) = sync_channel(1);
            if sender.send(ToReporter::Checkpoint(seq, answer)).is_ok() {
                return Checkpoint::Soon(answered);
            }
        }
        Checkpoint::Now(self.checkpoint_now(seq))
    }

    /// The book's checkpoint at `seq`, every command through which it has
    /// followed; each bound store records that it has every message up to
    /// there (so a start-up from this checkpoint may begin there) and is
    /// synced.
    fn checkpoint_now(&self, seq: u64) -> Vec<u8> {
        let mut guard = self.lock();
        let state = &mut *guard;
        // Only the session each account's reports go to (a Logon refused
        // for a wrong password names an account it never gets).
        for (account, comp_id) in &state.routes {
            let Some(session) = state.sessions.get_mut(comp_id) else { continue };
            if session.account == Some(*account) && session.poisoned.is_none() {
                session.store.bind(*account, seq);
                session.through = session.through.max(seq);
                if let Err(e) = session.store.sync() {
                    session.poison(e);
                }
            }
        }
        state.book.checkpoint()
    }

    /// Takes back a checkpoint of the book, at start-up.
    fn restore(&self, state: &[u8]) -> Result<(), RestoreError> {
        let book = FixBook::restore(state)?;
        self.lock().book = book;
        Ok(())
    }

    /// Turns events into FIX messages and sends them. `replaying` holds the
    /// stores' ends during recovery (nothing is sent then).
    fn follow(&self, events: Vec<FixEvent>, replaying: Option<&HashMap<AccountId, u64>>) {
        let now = crossbook_fix::time::format_timestamp(now_ms());
        let listed = self.listing.get();
        let mut guard = self.lock();
        let state = &mut *guard;
        let mut touched: Vec<String> = Vec::new();
        let mut pending: HashMap<String, Vec<Action>> = HashMap::new();
        for event in &events {
            let messages = state.book.follow(event, &listed.fix, &now);
            for message in messages {
                if replaying.is_some_and(|through| through.get(&message.account).is_none_or(|&t| t >= event.seq)) {
                    continue;
                }
                let Some(comp_id) = state.routes.get(&message.account).cloned() else {
                    continue;
                };
                let Some(session) = state.sessions.get_mut(&comp_id) else {
                    continue;
                };
                let mut actions = Vec::new();
                session.session.send_app(message.msg_type, Vec::new(), message.body, now_ms(), &mut actions);
                session.record(&actions, event.seq);
                if !touched.contains(&comp_id) {
                    touched.push(comp_id.clone());
                }
                pending.entry(comp_id).or_default().extend(actions);
            }
        }
        for comp_id in touched {
            let Some(session) = state.sessions.get_mut(&comp_id) else { continue };
            // Live, the messages are made durable by the connection's
            // writer before they are sent (`store::Durable`), not here
            // under the lock; replayed at start-up, now.
            let written = if replaying.is_some() && self.sync { session.store.sync() } else { session.hand_over(self.sync) };
            if let Err(e) = written {
                session.poison(e);
                continue;
            }
            if replaying.is_none() {
                let actions = pending.remove(&comp_id).unwrap_or_default();
                session.transmit(actions, self.sync);
            }
        }
    }

    /// Starts the acceptor, reporter and timer threads.
    pub(crate) fn start(self: &Arc<Self>, queue: SyncSender<Vec<Inbound>>, wake: Arc<dyn Fn() + Send + Sync>, shutdown: Arc<AtomicBool>) -> Result<SocketAddr, FixError> {
        let listener = TcpListener::bind(&self.config.listen).map_err(io(format!("listening on {}", self.config.listen)))?;
        listener.set_nonblocking(true).map_err(io("setting the listener non-blocking"))?;
        let address = listener.local_addr().map_err(io("reading the listening address"))?;
        let (sender, receiver) = sync_channel::<ToReporter>(REPORT_QUEUE);
        *self.reports.lock().unwrap_or_else(|e| e.into_inner()) = Some(sender);
        {
            let gateway = self.clone();
            let reporter = thread::Builder::new().name("fix-reporter".into()).spawn(move || gateway.report_loop(receiver)).map_err(io("starting the FIX reporter thread"))?;
            *self.reporter.lock().unwrap_or_else(|e| e.into_inner()) = Some(reporter);
        }
        {
            let gateway = self.clone();
            let shutdown = shutdown.clone();
            thread::Builder::new().name("fix-timer".into()).spawn(move || gateway.timer_loop(&shutdown)).map_err(io("starting the FIX timer thread"))?;
        }
        let gateway = self.clone();
        thread::Builder::new()
            .name("fix-acceptor".into())
            .spawn(move || {
                while !shutdown.load(Ordering::Acquire) {
                    match listener.accept() {
                        Ok((stream, peer)) => gateway.accept(stream, peer, queue.clone(), wake.clone(), shutdown.clone()),
                        Err(e) if e.kind() == ErrorKind::WouldBlock => thread::sleep(Duration::from_millis(5)),
                        Err(e) => log(&format!("FIX accept failed: {e}")),
                    }
                }
            })
            .map_err(io("starting the FIX acceptor thread"))?;
        log(&format!("FIX 4.4 acceptor on {address} ({} application, CompID {})", if self.echo { "echo" } else { "venue" }, self.config.comp_id));
        Ok(address)
    }

    /// Stops handing out reports, sends what the reporter still has, then
    /// logs every logged-on counterparty out (a Logout whose Text (58)
    /// says why: `failure`, the venue stopping because it cannot make
    /// commands durable, or `the venue is stopping`) and closes every
    /// connection after what it has queued.
    pub fn stop(&self, failure: Option<&str>) {
        self.reports.lock().unwrap_or_else(|e| e.into_inner()).take();
        // The reporter ends once it has sent what was handed to it
        // (bounded: a venue that cannot stop cleanly stops anyway).
        if let Some(reporter) = self.reporter.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let deadline = std::time::Instant::now() + CLOSE_GRACE;
            while !reporter.is_finished() && std::time::Instant::now() < deadline {
                thread::sleep(Duration::from_millis(2));
            }
        }
        // The readers (which stopped reading) let the stores' incoming
        // numbers go on past what they handed over once it is durable,
        // and end: waited for, so that the syncs below have it (bounded).
        let deadline = std::time::Instant::now() + CLOSE_GRACE;
        {
            let mut readers = self.readers.lock().unwrap_or_else(|e| e.into_inner());
            while !readers.is_empty() && std::time::Instant::now() < deadline {
                readers = self.reader_ended.wait_timeout(readers, Duration::from_millis(5)).unwrap_or_else(|e| e.into_inner()).0;
            }
        }
        let why = failure.unwrap_or("the venue is stopping");
        let mut guard = self.lock();
        let state = &mut *guard;
        for session in state.sessions.values_mut() {
            if session.connection.is_some() {
                let mut actions = Vec::new();
                let mut requests = Vec::new();
                with_app(self, session, &mut state.book, &mut requests, |session, app| session.session.logout_and_drop(why, now_ms(), app, &mut actions));
                session.finish(actions, self.sync);
            }
            let _ = session.store.sync();
            if let Some(connection) = session.connection.take() {
                let _ = connection.out.try_send(Out::Close);
            }
        }
        drop(guard);
        // Connections that never logged on are simply closed.
        for (_, socket) in self.waiting.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            let _ = socket.shutdown(std::net::Shutdown::Both);
        }
        self.ratelog().flush();
        // The writers take their last messages (a Logout) to the sockets
        // before the process ends; bounded.
        let deadline = std::time::Instant::now() + CLOSE_GRACE;
        while self.writers.load(Ordering::Acquire) > 0 && std::time::Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
    }

    fn report_loop(&self, receiver: Receiver<ToReporter>) {
        let mut next = receiver.recv().ok();
        while let Some(message) = next.take() {
            match message {
                ToReporter::Events(mut events) => {
                    // What else is queued, up to a checkpoint request
                    // (answered after exactly the batches before it).
                    while events.len() <= REPORTER_BATCH {
                        match receiver.try_recv() {
                            Ok(ToReporter::Events(more)) => events.extend(more),
                            Ok(other) => {
                                next = Some(other);
                                break;
                            }
                            Err(_) => break,
                        }
                    }
                    self.follow(events, None);
                }
                ToReporter::Checkpoint(seq, answer) => {
                    let _ = answer.send(self.checkpoint_now(seq));
                }
            }
            if next.is_none() {
                next = receiver.recv().ok();
            }
        }
    }

    fn timer_loop(&self, shutdown: &AtomicBool) {
        while !shutdown.load(Ordering::Acquire) {
            thread::sleep(TICK);
            self.ratelog().tick();
            let now = now_ms();
            let mut guard = self.lock();
            let state = &mut *guard;
            let comp_ids: Vec<String> = state.sessions.iter().filter(|(_, s)| s.connection.is_some()).map(|(c, _)| c.clone()).collect();
            for comp_id in comp_ids {
                let Some(session) = state.sessions.get_mut(&comp_id) else { continue };
                let mut actions = Vec::new();
                let mut requests = Vec::new();
                with_app(self, session, &mut state.book, &mut requests, |session, app| session.session.on_timer(now, app, &mut actions));
                session.finish(actions, self.sync);
            }
        }
    }

    fn accept(self: &Arc<Self>, stream: TcpStream, peer: SocketAddr, queue: SyncSender<Vec<Inbound>>, wake: Arc<dyn Fn() + Send + Sync>, shutdown: Arc<AtomicBool>) {
        let id = self.next_connection.fetch_add(1, Ordering::AcqRel) + 1;
        // Each connection costs two threads. Those not logged on have a
        // budget of their own; past it the oldest is closed. Logged-on
        // sessions are bounded at Logon (`limits.max_connections`).
        let Ok(handle) = stream.try_clone() else {
            log(&format!("FIX connection {id} from {peer}: cannot clone the socket"));
            return;
        };
        {
            let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
            if waiting.len() >= self.max_unauthenticated
                && let Some((oldest, socket)) = waiting.pop_front()
            {
                let _ = socket.shutdown(std::net::Shutdown::Both);
                self.ratelog().line("FIX eviction", || format!("FIX connection {oldest} closed: too many connections waiting to log on"));
            }
            waiting.push_back((id, handle));
        }
        self.connections.fetch_add(1, Ordering::AcqRel);
        let _ = stream.set_nodelay(true);
        let _ = stream.set_nonblocking(false);
        let Ok(write_half) = stream.try_clone() else {
            log(&format!("FIX connection {id} from {peer}: cannot clone the socket"));
            return;
        };
        let (out, frames, queued) = Outlet::new();
        self.writers.fetch_add(1, Ordering::AcqRel);
        let gateway = self.clone();
        let writer = thread::Builder::new().name(format!("fix-writer-{id}")).spawn(move || {
            write_loop(id, write_half, frames, &queued);
            gateway.writers.fetch_sub(1, Ordering::AcqRel);
        });
        if writer.is_err() {
            self.writers.fetch_sub(1, Ordering::AcqRel);
            log(&format!("FIX connection {id}: could not start a writer thread"));
            return;
        }
        let gateway = self.clone();
        self.readers.lock().unwrap_or_else(|e| e.into_inner()).insert(id);
        let spawned = thread::Builder::new().name(format!("fix-conn-{id}")).spawn(move || {
            let (reason, logged_on) = gateway.read_loop(stream, id, out, &queue, &*wake, &shutdown);
            gateway.reader_done(id);
            gateway.unwait(id);
            gateway.connections.fetch_sub(1, Ordering::AcqRel);
            let line = || format!("FIX disconnect connection={id} peer={peer} reason={reason}");
            if logged_on {
                log(&line());
            } else {
                gateway.ratelog().line("FIX disconnect before logon", line);
            }
        });
        if spawned.is_err() {
            self.reader_done(id);
            log(&format!("FIX connection {id}: could not start a reader thread"));
        }
    }

    fn reader_done(&self, id: u64) {
        self.in_flights.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
        self.readers.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
        self.reader_ended.notify_all();
    }

    /// Waits until the reader of connection `id` has ended (within the
    /// login time-out; a reader ends within moments once its connection
    /// is closed); why not, if it does not, or the venue stops first.
    fn wait_for_reader(&self, id: u64, shutdown: &AtomicBool) -> Result<(), String> {
        let deadline = std::time::Instant::now() + self.login_timeout;
        let mut readers = self.readers.lock().unwrap_or_else(|e| e.into_inner());
        while readers.contains(&id) {
            if shutdown.load(Ordering::Acquire) {
                return Err("server shutting down".into());
            }
            if std::time::Instant::now() >= deadline {
                return Err(format!("the session's previous connection {id} had not ended within {} s", self.login_timeout.as_secs()));
            }
            readers = self.reader_ended.wait_timeout(readers, POLL).unwrap_or_else(|e| e.into_inner()).0;
        }
        Ok(())
    }

    fn ratelog(&self) -> std::sync::MutexGuard<'_, crate::ratelog::RateLog> {
        self.ratelog.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The connection is logged on, or gone: no longer waiting.
    fn unwait(&self, id: u64) {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner()).retain(|(waiting, _)| *waiting != id);
    }

    /// Reads a connection until it ends; why, and whether it was logged on.
    fn read_loop(&self, mut stream: TcpStream, id: u64, out: Outlet, queue: &SyncSender<Vec<Inbound>>, wake: &dyn Fn(), shutdown: &AtomicBool) -> (String, bool) {
        let _ = stream.set_read_timeout(Some(POLL));
        let max = self.config.max_message.max(MIN_MAX_MESSAGE);
        let mut buffer: Vec<u8> = Vec::with_capacity(READ_CHUNK);
        let mut chunk = vec![0u8; READ_CHUNK];
        // The counterparty's CompID once the first message named it.
        let mut bound: Option<String> = None;
        let in_flight = crate::sequencer::InFlight::new();
        let reading = Arc::new(AtomicBool::new(true));
        self.in_flights.lock().unwrap_or_else(|e| e.into_inner()).insert(id, (in_flight.clone(), reading.clone()));
        let mut frames: Vec<Vec<u8>> = Vec::new();
        let connected = std::time::Instant::now();
        // Left because the venue is stopping (not for the connection's own sake).
        let mut stopping = false;
        // What this connection handed the sequencer that is not durable yet.
        let mut floors = Floors::default();
        let reason = 'connection: loop {
            if let Some(comp_id) = &bound
                && let Some(floor) = floors.lifted(&in_flight)
            {
                self.set_floor(comp_id, floor);
            }
            if shutdown.load(Ordering::Acquire) {
                stopping = true;
                break 'connection "server shutting down".to_string();
            }
            if bound.is_none() && connected.elapsed() > self.login_timeout {
                let _ = out.try_send(Out::Close);
                break 'connection format!("no Logon within {} s", self.login_timeout.as_secs());
            }
            match stream.read(&mut chunk) {
                Ok(0) => break 'connection "closed by the counterparty".into(),
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => continue,
                Err(e) => break 'connection format!("read error: {e}"),
            }
            // Bytes skipped in this read: one line for them all, and
            // those lines rate-limited (a stream of garbage is not a flood
            // of lines).
            let mut skipped = 0;
            loop {
                match frame(&buffer, max) {
                    Frame::NeedMore => break,
                    Frame::Garbage(n) => {
                        skipped += n;
                        buffer.drain(..n);
                    }
                    Frame::TooLong => {
                        if let Some(comp_id) = &bound {
                            self.logout_and_close(comp_id, id, &format!("message longer than {max} bytes"));
                        } else {
                            let _ = out.try_send(Out::Close);
                        }
                        break 'connection format!("message longer than {max} bytes");
                    }
                    Frame::Message(n) => {
                        let raw: Vec<u8> = buffer.drain(..n).collect();
                        if bound.is_none() {
                            match self.attach_waiting(&raw, id, &out, &stream, shutdown) {
                                Ok((comp_id, follows)) => {
                                    self.unwait(id);
                                    bound = Some(comp_id);
                                    // What the session's previous connection
                                    // read goes to the sequencer first.
                                    if let Some(previous) = follows
                                        && let Err(why) = self.wait_for_reader(previous, shutdown)
                                    {
                                        let _ = out.try_send(Out::Close);
                                        break 'connection why;
                                    }
                                }
                                Err(why) => {
                                    let _ = out.try_send(Out::Close);
                                    break 'connection why.to_string();
                                }
                            }
                        }
                        frames.push(raw);
                    }
                }
            }
            if skipped > 0 {
                self.ratelog().line("FIX skipped bytes", || format!("FIX connection {id}: skipped {skipped} bytes that do not start a message"));
            }
            // Everything this read held: one pass under the lock, one
            // hand-over to the sequencer.
            let Some(comp_id) = bound.clone() else { continue };
            if frames.is_empty() {
                continue;
            }
            let (requests, closed, first, reset) = self.on_messages(&comp_id, id, &frames, floors.floor());
            frames.clear();
            if reset {
                floors.numbering_restarted();
            }
            if !requests.is_empty() {
                if !in_flight.wait_below(self.in_flight_limit, || shutdown.load(Ordering::Acquire)) {
                    // Never handed over: the number stays before them.
                    floors.lost(first);
                    stopping = true;
                    break 'connection "server shutting down".into();
                }
                let count = requests.len() as u64;
                in_flight.add(count as u32);
                let batch = requests
                    .into_iter()
                    .map(|request| Inbound {
                        request: match request.link {
                            Link::None => crate::sequencer::Request::Command(request.command),
                            Link::Records(placed) => crate::sequencer::Request::Tracked { command: request.command, placed },
                            Link::Names(placed) => crate::sequencer::Request::ForOrder { command: request.command, placed },
                        },
                        annex: Some(request.annex.encode()),
                        source: crate::sink::FIX,
                        in_flight: in_flight.clone(),
                    })
                    .collect();
                if queue.send(batch).is_err() {
                    floors.lost(first);
                    stopping = true;
                    break 'connection "server stopping".into();
                }
                floors.handed(count, first);
                wake();
            }
            if let Some(why) = closed {
                break 'connection why;
            }
        };
        reading.store(false, Ordering::Release);
        let logged_on = bound.is_some();
        // What this connection handed over becomes durable in moments: the
        // store's incoming number follows it (bounded: a venue that cannot
        // make it durable keeps the number where it is, which is safe).
        if let Some(comp_id) = &bound
            && floors.floor().is_some()
        {
            let deadline = std::time::Instant::now() + SETTLE;
            while in_flight.count() > 0 && std::time::Instant::now() < deadline {
                thread::park_timeout(Duration::from_millis(5));
            }
            if let Some(floor) = floors.lifted(&in_flight) {
                self.set_floor(comp_id, floor);
            }
        }
        // The venue is stopping: the session keeps its connection, which
        // gets the answers still to come and then a Logout (`stop`).
        if stopping && logged_on {
            return (reason, logged_on);
        }
        if let Some(account) = bound.and_then(|comp_id| self.detach(&comp_id, id)) {
            self.cancel_on_disconnect(account, id, queue, wake, shutdown);
        }
        let _ = out.try_send(Out::Close);
        (reason, logged_on)
    }

    /// A logged-on session of `account` that logged on with
    /// `cancel_on_disconnect` ended (its connection `id`): unless the venue
    /// is stopping, a CancelAll of the account's open orders is journaled.
    fn cancel_on_disconnect(&self, account: AccountId, id: u64, queue: &SyncSender<Vec<Inbound>>, wake: &dyn Fn(), shutdown: &AtomicBool) {
        if self.echo || shutdown.load(Ordering::Acquire) {
            return;
        }
        if queue.send(crate::sequencer::own_commands([crossbook_engine::Command::CancelAll { account, instrument: None }])).is_ok() {
            wake();
            log(&format!("cancel on disconnect: account {account}'s open orders are cancelled (FIX connection {id})"));
        }
    }

    /// The first message on a connection: which session it is for. Nothing
    /// is sent to a counterparty we do not know (FIX: silent disconnect).
    /// Returns the session's CompID and the connection attached to it
    /// before, whose reader must end before this one goes on.
    fn attach(&self, raw: &[u8], id: u64, out: &Outlet, stream: &TcpStream) -> Result<(String, Option<u64>), AttachRefusal> {
        let message = Message::parse(raw).map_err(|e| AttachRefusal::Garbled(e.to_string()))?;
        let comp_id = message.text(SENDER_COMP_ID).ok_or(AttachRefusal::NoSenderCompId)?.to_owned();
        let mut guard = self.lock();
        let state = &mut *guard;
        let configured = self.config.sessions.iter().find(|s| s.comp_id == comp_id).map(|s| s.account);
        let account = match configured {
            Some(account) => Some(account),
            None if self.echo => None,
            None => {
                let claimed = message.text(USERNAME).and_then(|u| u.parse::<AccountId>().ok()).filter(|&a| self.keys.has(a));
                let Some(claimed) = claimed else {
                    return Err(AttachRefusal::UnknownCompId { comp_id, username_tried: true });
                };
                Some(claimed)
            }
        };
        if account.is_none() && !state.sessions.contains_key(&comp_id) && configured.is_none() {
            return Err(AttachRefusal::UnknownCompId { comp_id, username_tried: false });
        }
        // A new CompID's store is made only for a Logon that can succeed:
        // one that cannot is answered by a session kept nowhere (a
        // counterparty trying passwords or names leaves nothing behind).
        if let Some(account) = account
            && configured.is_none()
            && !self.echo
            && !state.sessions.contains_key(&comp_id)
            && let Some(text) = self.first_logon_refusal(state, &comp_id, account, &message)
        {
            let mut session = Session::new(session_config(&self.config, &comp_id), self.dictionary.clone());
            session.connect(now_ms());
            let mut actions = Vec::new();
            session.on_message(raw, now_ms(), &mut Refuse(text.clone()), &mut actions);
            for action in actions {
                if let Action::Send(bytes) = action {
                    let _ = out.try_send(Out::Bytes(bytes, None));
                }
            }
            // A counterparty that keeps its sequence numbers counted the
            // Logon and the Logout: its next Logon of this CompID goes on
            // from there, as it would have with a stored session.
            if (session.next_in(), session.next_out()) != (1, 1) {
                let mut refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
                refused.retain(|(name, _)| *name != comp_id);
                if refused.len() >= REFUSED_REMEMBERED {
                    refused.pop_front();
                }
                refused.push_back((comp_id.clone(), (session.next_in(), session.next_out())));
            }
            return Err(AttachRefusal::FirstLogon { comp_id, text });
        }
        if !state.sessions.contains_key(&comp_id) {
            let path = store::path_for(&self.dir, &comp_id);
            // The CompID file is durable before the store exists (a store
            // without one would stop the next start), and both names are
            // durable before anything is recorded in the store (each is
            // written whole and its directory synced: `store::write_whole`).
            store::write_whole(&path.with_extension("compid"), comp_id.as_bytes()).map_err(AttachRefusal::Store)?;
            let (mut store, mut restored) = Store::open(&path).map_err(AttachRefusal::Store)?;
            let remembered = {
                let mut refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
                let at = refused.iter().position(|(name, _)| *name == comp_id);
                at.and_then(|at| refused.remove(at)).map(|(_, numbers)| numbers)
            };
            if let Some((next_in, next_out)) = remembered
                && (restored.next_in, restored.next_out) == (1, 1)
            {
                store.record(&StoreOp::Sent { seq: next_out - 1, app: None }, 0);
                store.record(&StoreOp::Received { next_in }, 0);
                (restored.next_in, restored.next_out) = (next_in, next_out);
            }
            let session = Session::restore(session_config(&self.config, &comp_id), self.dictionary.clone(), restored.next_in, restored.next_out, restored.stored);
            let app = if self.echo { App::Echo(EchoApplication::default()) } else { App::Venue };
            state.sessions.insert(comp_id.clone(), FixSession { session, store, account: restored.account, bound: restored.account, connection: None, app, poisoned: None, through: restored.through_seq, dropped: None, last_connection: None, received_floor: None, received: restored.next_in });
        }
        let Some(session) = state.sessions.get_mut(&comp_id) else {
            return Err(AttachRefusal::Vanished);
        };
        if let Some(why) = &session.poisoned {
            return Err(AttachRefusal::OutOfService { comp_id, why: why.to_string() });
        }
        // A session whose connection is gone (its end not read yet by its
        // reader) must not block its own Logon: that reader takes what is
        // left to read (what the counterparty sent before it went), ends
        // (cancelling, if the account asks), and this Logon goes on then
        // (`attach_waiting`).
        if let Some(old) = &session.connection
            && !peer_alive(&old.stream)
        {
            return Err(AttachRefusal::PreviousEnding { previous: old.id });
        }
        if session.connection.is_some() || session.session.is_connected() {
            return Err(AttachRefusal::AlreadyLoggedOn { comp_id });
        }
        let logged_on = state.sessions.values().filter(|s| s.connection.is_some()).count() as u64;
        if logged_on >= self.max_connections {
            return Err(AttachRefusal::Full { logged_on });
        }
        let Some(session) = state.sessions.get_mut(&comp_id) else {
            return Err(AttachRefusal::Vanished);
        };
        if let Some(account) = account {
            // Credentials are checked against the bound account, if any:
            // another account's pair is a wrong pair for this CompID.
            // (A `[[fix.sessions]]` entry is the operator's word and wins.)
            session.account = Some(if configured.is_some() { account } else { session.bound.unwrap_or(account) });
        }
        // A CompID bound to an account taken out of the configuration
        // (by the session's first Logon, or by a `[[fix.sessions]]` entry)
        // does not log on at all: an account out of the file trades on no
        // port.
        let gone = match configured {
            Some(account) => Some(account),
            None => session.bound,
        }
        .filter(|&account| !self.echo && !self.keys.has(account));
        if let Some(account) = gone {
            return Err(AttachRefusal::Revoked { comp_id, account });
        }
        let handle = stream.try_clone().map_err(AttachRefusal::Socket)?;
        session.connection = Some(Connection { id, out: out.clone(), stream: handle, cancel_on_disconnect: false });
        session.session.connect(now_ms());
        let follows = session.last_connection.replace(id);
        Ok((comp_id, follows))
    }

    /// Holds the store's incoming number of `comp_id` at `floor` from now
    /// on (its reader's, with nothing read to hand it with), writing it
    /// at once if that moves it: a kill then does not ask the
    /// counterparty for what the journal has (the next report's sync
    /// makes it durable).
    fn set_floor(&self, comp_id: &str, floor: Option<u64>) {
        let mut guard = self.lock();
        let Some(session) = guard.sessions.get_mut(comp_id) else { return };
        if session.poisoned.is_some() {
            return;
        }
        session.received_floor = floor;
        let next_in = session.session.next_in();
        let before = session.received;
        session.record_received(next_in);
        if session.received != before
            && let Err(e) = session.store.flush()
        {
            session.poison(e);
        }
    }

    /// [`Gateway::attach`], after the session's previous connection has
    /// ended: at once if its peer is gone (its reader takes what is left
    /// and ends), and, if it still looks alive, for up to
    /// [`RELOGON_WAIT`] (its end and this Logon can reach the venue in
    /// either order) before the Logon is refused.
    fn attach_waiting(&self, raw: &[u8], id: u64, out: &Outlet, stream: &TcpStream, shutdown: &AtomicBool) -> Result<(String, Option<u64>), AttachRefusal> {
        let deadline = std::time::Instant::now() + RELOGON_WAIT;
        let mut waited_for = None;
        // (Bounded: each wait ends a reader, or fails.)
        for _ in 0..64 {
            match self.attach(raw, id, out, stream) {
                Err(AttachRefusal::PreviousEnding { previous }) => {
                    // A reader that ended and kept its connection: the
                    // venue is stopping.
                    if waited_for == Some(previous) || shutdown.load(Ordering::Acquire) {
                        return Err(AttachRefusal::Waited("server shutting down".into()));
                    }
                    self.wait_for_reader(previous, shutdown).map_err(AttachRefusal::Waited)?;
                    waited_for = Some(previous);
                }
                Err(AttachRefusal::AlreadyLoggedOn { .. }) if std::time::Instant::now() < deadline && !shutdown.load(Ordering::Acquire) => thread::sleep(Duration::from_millis(10)),
                other => return other,
            }
        }
        Err(AttachRefusal::Waited("the session's previous connections kept it".into()))
    }

    /// Why the first Logon of a CompID not yet stored, for `account` by
    /// Username and Password, is refused, if it is: a wrong pair; the
    /// account logged on as another CompID; or the account with
    /// [`MAX_COMP_IDS`] CompIDs already.
    fn first_logon_refusal(&self, state: &State, comp_id: &str, account: AccountId, logon: &Message) -> Option<String> {
        let credentials = self.credentials(comp_id, Some(account))?;
        if !venue::credentials_match(&credentials, logon) {
            return Some(venue::BAD_CREDENTIALS.into());
        }
        if let Some(other) = busy_elsewhere(state, comp_id, account) {
            return Some(venue::busy_text(account, &other));
        }
        // (Counted under the lock that makes them: two first Logons at once
        // cannot both pass.)
        let owned = state.sessions.values().filter(|s| s.bound == Some(account) || s.account == Some(account)).count();
        (owned >= MAX_COMP_IDS).then(|| format!("Logon refused: account {account} has {MAX_COMP_IDS} CompIDs already (log on with one of them)"))
    }

    /// Messages on an attached connection, in order. Returns the engine
    /// requests they made and, if the connection is to close, why.
    /// `floor`: where the store's incoming number is held for what this
    /// connection handed over before. Also returns where it is held for
    /// the requests returned, until they are durable (1 if the numbering
    /// started again among these messages, which the reader's floors
    /// follow).
    fn on_messages(&self, comp_id: &str, id: u64, frames: &[Vec<u8>], floor: Option<u64>) -> (Vec<Request>, Option<String>, u64, bool) {
        let mut guard = self.lock();
        let state = &mut *guard;
        // Another CompID logged on for this session's account: one FIX
        // session per account at a time (its Logon is refused).
        let busy = state.sessions.get(comp_id).filter(|s| !s.session.is_logged_on()).and_then(|s| s.account).and_then(|account| busy_elsewhere(state, comp_id, account));
        let Some(session) = state.sessions.get_mut(comp_id) else {
            return (Vec::new(), Some("session vanished".into()), 0, false);
        };
        if session.connection.as_ref().is_none_or(|c| c.id != id) {
            return (Vec::new(), Some("the session was closed".into()), 0, false);
        }
        let was_logged_on = session.session.is_logged_on();
        session.received_floor = floor;
        let first_read = session.session.next_in();
        let mut actions = Vec::new();
        let mut requests = Vec::new();
        let now = now_ms();
        let credentials = self.credentials(comp_id, session.account);
        let account = session.account;
        with_app_credentials(self, session, &mut state.book, &mut requests, credentials, busy, |session, app| {
            for raw in frames {
                session.session.on_message(raw, now, app, &mut actions);
                if actions.iter().any(|a| matches!(a, Action::Disconnect(_))) {
                    break;
                }
            }
        });
        let closed = actions.iter().find_map(|a| if let Action::Disconnect(why) = a { Some(why.clone()) } else { None });
        if !was_logged_on && session.session.is_logged_on() {
            if let Some(connection) = session.connection.as_mut() {
                connection.cancel_on_disconnect = account.is_some_and(|a| !self.echo && self.keys.cancels_on_disconnect(a));
            }
            log(&format!("FIX login connection={id} comp_id={comp_id} account={}", account.map_or("-".into(), |a| a.to_string())));
            if let Some(account) = account
                && !self.echo
                && state.routes.get(&account).is_none_or(|c| c != comp_id)
            {
                // From here on this account's reports come to this session.
                // The sequencer is told before the command the store is
                // bound at is read: a command it applies after that read
                // finds the account among those it passes on (the lock
                // orders the two), so none falls in between.
                self.fix_accounts.write().unwrap_or_else(|e| e.into_inner()).insert(account);
                let seq = self.applied.load(Ordering::Acquire);
                session.store.bind(account, seq);
                session.bound = Some(account);
                state.routes.insert(account, comp_id.to_owned());
            }
        }
        // What these messages asked the engine for is not durable yet: the
        // store's incoming number stays at the first of them until it is.
        let reset = actions.iter().any(|a| matches!(a, Action::Store(StoreOp::Reset)));
        let first = if reset { 1 } else { first_read };
        if !requests.is_empty() {
            session.received_floor = Some(session.received_floor.map_or(first, |floor| floor.min(first)));
        }
        session.finish(actions, self.sync);
        (requests, closed, first, reset)
    }

    fn credentials(&self, comp_id: &str, account: Option<AccountId>) -> Option<(String, String)> {
        if self.config.sessions.iter().any(|s| s.comp_id == comp_id) {
            return None;
        }
        let account = account?;
        Some((account.to_string(), self.keys.login_key(account)?))
    }

    /// Logs out the sessions that logged on as one of `accounts` with its
    /// key (Username and Password), which a configuration reload changed
    /// or took away; and those of a `[[fix.sessions]]` CompID (no key
    /// needed: a key change leaves them) whose account it took out.
    fn revoke(&self, accounts: &[AccountId]) {
        let live: Vec<(String, u64)> = {
            let state = self.lock();
            state
                .sessions
                .iter()
                .filter(|(comp_id, s)| {
                    let configured = self.config.sessions.iter().any(|c| &&c.comp_id == comp_id);
                    s.account.is_some_and(|a| accounts.contains(&a) && (!configured || !self.keys.has(a)))
                })
                .filter_map(|(comp_id, s)| Some((comp_id.clone(), s.connection.as_ref()?.id)))
                .collect()
        };
        for (comp_id, id) in live {
            log(&format!("FIX logout comp_id={comp_id}: its account's key was changed, or the account removed, by a configuration reload"));
            self.logout_and_close(&comp_id, id, "the account's key was changed or removed");
        }
    }

    fn logout_and_close(&self, comp_id: &str, id: u64, why: &str) {
        let mut guard = self.lock();
        let state = &mut *guard;
        if let Some(session) = state.sessions.get_mut(comp_id)
            && session.connection.as_ref().is_some_and(|c| c.id == id)
        {
            let mut actions = Vec::new();
            let mut requests = Vec::new();
            with_app(self, session, &mut state.book, &mut requests, |session, app| session.session.logout_and_drop(why, now_ms(), app, &mut actions));
            session.finish(actions, self.sync);
        }
    }

    /// The connection `id` of session `comp_id` is gone. Returns the
    /// session's account if it was logged on (through a Logout too).
    fn detach(&self, comp_id: &str, id: u64) -> Option<AccountId> {
        let mut guard = self.lock();
        let state = &mut *guard;
        let session = state.sessions.get_mut(comp_id)?;
        let Some(connection) = session.connection.take_if(|c| c.id == id) else {
            // Dropped already: by the session layer (a Logout, say), which
            // has ended its side; or for not reading, which has not (and
            // the session's next Logon would find it still connected).
            if session.connection.is_none() && session.session.is_connected() {
                let mut requests = Vec::new();
                with_app(self, session, &mut state.book, &mut requests, |session, app| session.session.disconnected(app));
            }
            return session.dropped.take_if(|dropped| *dropped == id).and(session.account);
        };
        let mut requests = Vec::new();
        with_app(self, session, &mut state.book, &mut requests, |session, app| session.session.disconnected(app));
        session.account.filter(|_| connection.cancel_on_disconnect)
    }
}

/// A reader's count of requests not answered yet, and whether it may
/// still hand something over.
type ReaderState = (Arc<crate::sequencer::InFlight>, Arc<AtomicBool>);

/// What one connection's reader handed the sequencer that is not durable
/// yet, in order: the store's incoming number is held at the first
/// message of the oldest such batch.
#[derive(Default)]
struct Floors {
    /// Requests handed over so far.
    handed: u64,
    /// For each batch not known durable: the count of requests handed over
    /// at its end, and the first message it came from.
    pending: std::collections::VecDeque<(u64, u64)>,
    /// The first message of a batch that was never handed over (the venue
    /// stopping): held there for good.
    lost: Option<u64>,
    /// The floor last handed to the session.
    told: Option<u64>,
}

impl Floors {
    fn floor(&self) -> Option<u64> {
        match (self.pending.front().map(|&(_, first)| first), self.lost) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn handed(&mut self, count: u64, first: u64) {
        self.handed += count;
        self.pending.push_back((self.handed, first));
        self.told = self.floor();
    }

    fn lost(&mut self, first: u64) {
        self.lost = Some(self.lost.map_or(first, |lost| lost.min(first)));
    }

    /// The numbering started again: what is pending is held at 1.
    fn numbering_restarted(&mut self) {
        for (_, first) in &mut self.pending {
            *first = 1;
        }
        self.lost = self.lost.map(|_| 1);
        self.told = self.floor();
    }

    /// Drops the batches `in_flight` says are durable (requests are
    /// answered in the order they were handed over); the new floor, if it
    /// moved since it was last told.
    fn lifted(&mut self, in_flight: &crate::sequencer::InFlight) -> Option<Option<u64>> {
        let durable = self.handed - u64::from(in_flight.count()).min(self.handed);
        while self.pending.front().is_some_and(|&(end, _)| end <= durable) {
            self.pending.pop_front();
        }
        let floor = self.floor();
        (floor != self.told).then(|| {
            self.told = floor;
            floor
        })
    }
}

/// The CompID another session of `account` is logged on as, if it is
/// not `comp_id`'s. (A connection whose peer is gone does not count: its
/// end may not have been read yet.)
fn busy_elsewhere(state: &State, comp_id: &str, account: AccountId) -> Option<String> {
    let other = state.routes.get(&account)?;
    let live = other != comp_id && state.sessions.get(other).is_some_and(|o| o.session.is_logged_on() && o.connection.as_ref().is_some_and(|c| peer_alive(&c.stream)));
    live.then(|| other.clone())
}

/// The application of a Logon refused before a session is made for its
/// CompID: the session layer checks the Logon as any, and answers one it
/// would take with a Logout saying why.
struct Refuse(String);

impl Application for Refuse {
    fn on_logon(&mut self, _logon: &Message) -> Result<(), crossbook_fix::session::LogonRefusal> {
        Err(crossbook_fix::session::LogonRefusal { text: self.0.clone() })
    }

    fn on_message(&mut self, _message: &Message, _shape: &crossbook_fix::validate::Shape, _outbox: &mut crossbook_fix::session::Outbox<'_>) {}
}

/// Why a connection's first message does not attach it to a session
/// (logged; FIX sends nothing to a counterparty it does not know).
#[derive(Debug)]
enum AttachRefusal {
    Garbled(String),
    NoSenderCompId,
    /// The session's connection is gone but its reader has not ended yet
    /// (`attach_waiting` waits for it).
    PreviousEnding { previous: u64 },
    /// Waiting for a previous connection to end did not end well.
    Waited(String),
    /// The first Logon of a CompID, refused (answered by a Logout with
    /// `text` if it was otherwise valid); no session was made for it.
    FirstLogon { comp_id: String, text: String },
    UnknownCompId { comp_id: String, username_tried: bool },
    /// Its store could not be created.
    Store(StoreError),
    /// A store write or sync failed earlier; the session is closed until
    /// restart.
    OutOfService { comp_id: String, why: String },
    AlreadyLoggedOn { comp_id: String },
    /// Bound to an account that has no key any more.
    Revoked { comp_id: String, account: AccountId },
    /// `limits.max_connections` sessions are logged on.
    Full { logged_on: u64 },
    Socket(std::io::Error),
    /// The session disappeared under the lock (cannot happen).
    Vanished,
}

impl std::fmt::Display for AttachRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AttachRefusal::Garbled(e) => write!(f, "garbled first message ({e})"),
            AttachRefusal::NoSenderCompId => f.write_str("first message without SenderCompID"),
            AttachRefusal::PreviousEnding { previous } => write!(f, "the session's previous connection {previous} is ending"),
            AttachRefusal::Waited(why) => f.write_str(why),
            AttachRefusal::FirstLogon { comp_id, text } => write!(f, "first Logon of CompID {comp_id:?}: {text}"),
            AttachRefusal::UnknownCompId { comp_id, username_tried: true } => write!(f, "unknown CompID {comp_id:?} and no known Username"),
            AttachRefusal::UnknownCompId { comp_id, username_tried: false } => write!(f, "unknown CompID {comp_id:?}"),
            AttachRefusal::Store(e) => write!(f, "{e}"),
            AttachRefusal::OutOfService { comp_id, why } => write!(f, "session {comp_id} is out of service until restart: {why}"),
            AttachRefusal::AlreadyLoggedOn { comp_id } => write!(f, "session {comp_id} is already logged on"),
            AttachRefusal::Revoked { comp_id, account } => write!(f, "session {comp_id} belongs to account {account}, which is not in the configuration"),
            AttachRefusal::Full { logged_on } => write!(f, "{logged_on} sessions already logged on (limits.max_connections)"),
            AttachRefusal::Socket(e) => write!(f, "cannot clone the socket: {e}"),
            AttachRefusal::Vanished => f.write_str("session vanished"),
        }
    }
}

/// The FIX gateway as the sequencer sees it: the commands it cares about,
/// as events for the reporter thread (live) or followed at once (at
/// start-up, storing what a session's store is missing).
pub(crate) struct FixSink {
    gateway: Arc<Gateway>,
    /// How far each bound account's store goes (taken before the journal
    /// is re-read at start-up).
    through: HashMap<AccountId, u64>,
}

impl FixSink {
    pub(crate) fn new(gateway: Arc<Gateway>) -> FixSink {
        let through = gateway.through();
        FixSink { gateway, through }
    }

    fn event(&self, durable: &Durable<'_>) -> Option<FixEvent> {
        self.gateway.wants(durable.annex.is_some(), durable.reports).then(|| FixEvent {
            seq: durable.seq,
            command: *durable.command,
            annex: durable.annex.and_then(Annex::decode),
            reports: durable.reports.to_vec(),
            refused: false,
        })
    }
}

impl ReportSink for FixSink {
    fn revoked(&mut self, changed: &crate::keys::Changed) {
        self.gateway.revoke(&changed.logins);
    }

    fn released(&mut self, batch: &Released<'_>) {
        // A refusal goes out where it came in the sequence: a cancel sent
        // behind a refused order is answered after the order's refusal.
        let refusal = |r: crate::sink::Refused<'_>| FixEvent {
            seq: 0,
            command: crossbook_engine::Command::Place(*r.place),
            annex: r.annex.and_then(Annex::decode),
            reports: vec![*r.report],
            refused: true,
        };
        let mut refused = batch.refused().filter(|r| r.source == crate::sink::FIX).peekable();
        let mut events: Vec<FixEvent> = Vec::new();
        for durable in batch.durable() {
            while let Some(r) = refused.next_if(|r| r.after < durable.seq) {
                events.push(refusal(r));
            }
            events.extend(self.event(&durable));
        }
        events.extend(refused.map(refusal));
        if !events.is_empty() {
            self.gateway.deliver(events);
        }
    }

    fn recovered(&mut self, durable: &Durable<'_>) {
        if let Some(event) = self.event(durable) {
            self.gateway.follow(vec![event], Some(&self.through));
        }
    }

    fn name(&self) -> &str {
        "fix"
    }

    fn checkpoint(&mut self, seq: u64) -> Option<Checkpoint> {
        Some(self.gateway.checkpoint(seq))
    }

    fn restore(&mut self, state: &[u8]) -> Result<(), RestoreError> {
        self.gateway.restore(state)
    }

    fn reset(&mut self) {
        self.gateway.lock().book = FixBook::new();
    }

    /// Every FIX reader has stopped reading (the venue is stopping) and
    /// every request one handed over has been answered.
    fn settled(&self) -> bool {
        self.gateway.in_flights.lock().unwrap_or_else(|e| e.into_inner()).values().all(|(count, reading)| !reading.load(Ordering::Acquire) && count.count() == 0)
    }
}

impl FixSink {
    /// The lowest engine sequence number a bound account's store has its
    /// reports up to: a start-up that hands over only the commands after a
    /// snapshot must start at or before it, or the store would miss the
    /// messages in between.
    pub(crate) fn stores_through(&self) -> Option<u64> {
        self.through.values().copied().min()
    }
}

/// What the reporter thread is handed.
enum ToReporter {
    /// Batches the journal has made durable, to follow and send.
    Events(Vec<FixEvent>),
    /// Send the book's checkpoint at this command once the batches before
    /// are followed.
    Checkpoint(u64, SyncSender<Vec<u8>>),
}

fn read_comp_id(store: &std::path::Path) -> Option<String> {
    std::fs::read_to_string(store.with_extension("compid")).ok()
}

/// Runs `f` with the session's application.
fn with_app(gateway: &Gateway, session: &mut FixSession, book: &mut FixBook, requests: &mut Vec<Request>, f: impl FnOnce(&mut FixSession, &mut dyn Application)) {
    let credentials = gateway.credentials(session.session.config().target_comp_id.as_str(), session.account);
    with_app_credentials(gateway, session, book, requests, credentials, None, f);
}

fn with_app_credentials(
    gateway: &Gateway,
    session: &mut FixSession,
    book: &mut FixBook,
    requests: &mut Vec<Request>,
    credentials: Option<(String, String)>,
    busy: Option<String>,
    f: impl FnOnce(&mut FixSession, &mut dyn Application),
) {
    let mut app = std::mem::replace(&mut session.app, App::Venue);
    match &mut app {
        App::Echo(echo) => f(session, echo),
        App::Venue => {
            let listed = gateway.listing.get();
            let mut venue = VenueApp {
                account: session.account.unwrap_or(0),
                book,
                instruments: &listed.fix,
                requests,
                now: crossbook_fix::time::format_timestamp(now_ms()),
                now_ms: now_ms(),
                credentials,
                busy,
            };
            f(session, &mut venue);
        }
    }
    session.app = app;
}

impl FixSession {
    fn store_through(&self) -> u64 {
        self.through
    }

    /// Records the store operations among `actions` (of the incoming
    /// sequence numbers, only the last matters).
    fn record(&mut self, actions: &[Action], engine_seq: u64) {
        let last_received = actions.iter().rposition(|a| matches!(a, Action::Store(StoreOp::Received { .. })));
        for (index, action) in actions.iter().enumerate() {
            if matches!(action, Action::Store(StoreOp::Received { .. })) && Some(index) != last_received {
                continue;
            }
            match action {
                Action::Store(StoreOp::Received { next_in }) => self.record_received(*next_in),
                Action::Store(op) => {
                    if let StoreOp::Reset = op {
                        // Numbering starts again at 1: what is not durable
                        // yet is held at its start (the messages before
                        // cannot be asked for again in the new numbering).
                        self.received_floor = self.received_floor.map(|_| 1);
                        self.received = 1;
                    }
                    self.store.record(op, engine_seq);
                    if let StoreOp::Sent { .. } = op {
                        self.through = self.through.max(engine_seq);
                    }
                }
                _ => {}
            }
        }
    }

    /// Records the next expected incoming number, held at the floor; not
    /// again if the store already says so.
    fn record_received(&mut self, next_in: u64) {
        let next_in = self.received_floor.map_or(next_in, |floor| floor.min(next_in));
        if next_in != self.received {
            self.store.record(&StoreOp::Received { next_in }, 0);
            self.received = next_in;
        }
    }

    /// Hands what was recorded to the operating system. With `sync`, the
    /// messages [`FixSession::transmit`] then queues are made durable by
    /// the connection's writer before they are sent (one `fdatasync` for
    /// all that is queued, and none under the gateway's lock); a sync that
    /// failed there fails here.
    fn hand_over(&mut self, sync: bool) -> Result<(), StoreError> {
        self.store.flush()?;
        if sync { self.store.durable().failure() } else { Ok(()) }
    }

    fn poison(&mut self, why: StoreError) {
        log(&format!("FIX session {}: store failed, closing it until restart: {why}", self.session.config().target_comp_id));
        self.poisoned = Some(why);
        if let Some(connection) = self.connection.take() {
            self.let_go(connection);
        }
    }

    /// A connection the session closes: its writer is told (or, if its
    /// queue is full, the socket is shut at once, so that its reader
    /// ends), and its reader cancels for it in `detach` if it is to.
    fn let_go(&mut self, connection: Connection) {
        if connection.out.try_send(Out::Close).is_err() {
            let _ = connection.stream.shutdown(std::net::Shutdown::Both);
        }
        // (Never overwriting a connection's pending cancel with `None`:
        // one that never logged on cancels nothing.)
        if connection.cancel_on_disconnect {
            self.dropped = Some(connection.id);
        }
    }

    /// Sends what the session asked for, after recording it and handing
    /// it to the operating system: with `sync`, each message waits in the
    /// writer until the store's writes so far are on disk.
    fn transmit(&mut self, actions: Vec<Action>, sync: bool) {
        let Some(connection) = &self.connection else { return };
        // Every message of the call in one hand-over (a Disconnect among
        // them closes the connection after all of them).
        let mut batch: Vec<u8> = Vec::new();
        let mut close = false;
        for action in actions {
            match action {
                Action::Send(bytes) if batch.is_empty() => batch = bytes,
                Action::Send(bytes) => batch.extend_from_slice(&bytes),
                Action::Disconnect(_) => close = true,
                Action::Log(line) => log(&format!("FIX session {}: {line}", self.session.config().target_comp_id)),
                Action::Store(_) => {}
            }
        }
        if !batch.is_empty() {
            let durable = self.store.durable();
            let gate = sync.then(|| (Arc::clone(durable), durable.written()));
            if let Err(TrySendError::Full(_)) = connection.out.try_send(Out::Bytes(batch, gate)) {
                log(&format!(
                    "FIX session {}: dropping a counterparty that does not read (more than {} MiB waiting to be written to it)",
                    self.session.config().target_comp_id,
                    OUTBOUND_BYTES >> 20
                ));
                close = true;
            }
        }
        if close
            && let Some(connection) = self.connection.take()
        {
            self.let_go(connection);
        }
    }

    /// Records, hands over and sends: with `sync` (the server's, in both
    /// durability modes) a message is on disk before it is sent; with
    /// nothing to send, what was recorded
    /// is only written (the next message's sync covers it, and a ClOrdID
    /// seen before is refused however the sequence numbers fell:
    /// FixBook::seen).
    fn finish(&mut self, actions: Vec<Action>, sync: bool) {
        self.record(&actions, 0);
        if let Err(e) = self.hand_over(sync) {
            return self.poison(e);
        }
        self.transmit(actions, sync);
    }
}

fn write_loop(id: u64, mut stream: TcpStream, frames: Receiver<Out>, queued: &AtomicUsize) {
    let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
    let mut buffer: Vec<u8> = Vec::with_capacity(1 << 16);
    'outer: loop {
        let first = match frames.recv_timeout(Duration::from_secs(1)) {
            Ok(first) => first,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => break,
        };
        buffer.clear();
        let mut close = false;
        let mut next = Some(first);
        let mut needed: Option<Gate> = None;
        while let Some(item) = next.take() {
            match item {
                Out::Bytes(bytes, gate) => {
                    buffer.extend_from_slice(&bytes);
                    // One session's store behind a connection: the
                    // latest message needs the most.
                    if let Some(gate) = gate {
                        needed = Some(gate);
                    }
                }
                Out::Close => {
                    close = true;
                    break;
                }
            }
            if buffer.len() < WRITE_BATCH {
                next = frames.try_recv().ok();
            }
        }
        // Nothing goes out that the store does not have on disk. A sync
        // that fails closes the connection; the session is closed with
        // it the next time the gateway writes to its store (`hand_over`).
        if let Some((durable, writes)) = needed
            && let Err(e) = durable.make_durable(writes)
        {
            log(&format!("FIX store failed, closing its connection (the session stays closed until restart): {e}"));
            break 'outer;
        }
        if !buffer.is_empty()
            && let Err(e) = stream.write_all(&buffer)
        {
            // A socket that took nothing for WRITE_TIMEOUT: its
            // counterparty does not read (a closed one is no news).
            if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) {
                log(&format!(
                    "FIX connection {id}: dropping a counterparty that does not read (a write waited {} s)",
                    WRITE_TIMEOUT.as_secs()
                ));
            }
            break 'outer;
        }
        queued.fetch_sub(buffer.len(), Ordering::AcqRel);
        if close {
            break;
        }
    }
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

