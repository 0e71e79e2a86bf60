//! The sequencer: journals and applies commands in the order they come,
//! and hands each batch to the gateways ([`ReportSink`]s) once the journal
//! holds it durably. It knows no gateway: what a gateway needs besides the
//! command (the FIX ClOrdIDs) travels as the command's opaque annex, and
//! the open-order limit is enforced here, once, for every gateway.
//!
//! It runs on the binary gateway's thread (`gateway.rs` calls it every
//! round), so an order costs no hand-off between threads on its way in or
//! out; the journal's writer syncs on its own thread and wakes the gateway
//! when a group commit is done.

use crate::config::{Config, ConfigError};
use crate::keys::Keys;
use crate::replica::NodeState;
use crate::sink::{Answer, Applied, Checkpoint, Query, QueryKind, Refusal, Released, ReportSink, Source};
use crossbook_replication::batch::Encoder;
use crossbook_replication::{Appender, Delivered, Log, Reader};
use crate::snapshotter::{KEEP_SNAPSHOTS, Offer, Snapshotter};
use crate::{ServeError, Summary, log};
use crossbook_engine::{Command, Engine, Event, InstrumentSpec, OrderType, TimeInForce};
use crossbook_journal::{Journal, Retention, SnapshotHeader, micros_histogram, write_snapshot_state};
use crossbook_protocol::ExecutionReport;
use crossbook_protocol::reports::{Addressed, ReportBuilder};
use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// What a gateway asks of the sequencer.
pub(crate) enum Request {
    /// Journal and apply it.
    Command(Command),
    /// Journal and apply `command` (a place), and write its sequence
    /// number (the id of the order it places, if the engine takes it) to
    /// `placed`, for the [`Request::ForOrder`]s that name it.
    Tracked { command: Command, placed: Placed },
    /// Journal and apply `command` (a cancel or replace) for the order a
    /// [`Request::Tracked`] place with the same `placed` placed, whose id
    /// its gateway has not heard yet. The id is put in as the command is
    /// sequenced, so the journal holds the command as applied; 0, which no
    /// order has, if that place was not journaled (refused before the
    /// engine, or not sequenced yet): the engine refuses the command as an
    /// unknown order, as it does if the order is gone.
    ForOrder { command: Command, placed: Placed },
    /// Answer it from the engine's state at this point of the sequence
    /// (not journaled; released with its batch).
    Query(Query),
}

/// Where the sequencer writes the sequence number of a tracked place.
#[derive(Clone, Debug, Default)]
pub(crate) struct Placed(Arc<AtomicU64>);

impl Placed {
    fn set(&self, seq: u64) {
        self.0.store(seq, Ordering::Release);
    }

    fn get(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
}

impl PartialEq for Placed {
    /// The same cell.
    fn eq(&self, other: &Placed) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Placed {}

/// Commands the venue sends itself (reference data from its
/// configuration, a cancel on disconnect): journaled like any, from no
/// gateway's client (`OTHER`), counted in flight of their own.
pub(crate) fn own_commands(commands: impl IntoIterator<Item = Command>) -> Vec<Inbound> {
    let in_flight = InFlight::polled();
    let batch: Vec<Inbound> = commands.into_iter().map(|command| Inbound { request: Request::Command(command), annex: None, source: crate::sink::OTHER, in_flight: in_flight.clone() }).collect();
    in_flight.add(batch.len() as u32);
    batch
}

/// A command (or query) for the sequencer, from a gateway.
pub(crate) struct Inbound {
    pub(crate) request: Request,
    /// What the gateway journals with the command (at most
    /// `crossbook_journal::format::MAX_ANNEX` bytes): the sequencer only
    /// carries it, to the journal and back to the sinks.
    pub(crate) annex: Option<Vec<u8>>,
    pub(crate) source: Source,
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
    /// connections); the binary gateway looks at its counts once per round
    /// instead.
    reader: Option<thread::Thread>,
}

impl InFlight {
    /// A count owned by the calling (reader) thread, which parks in
    /// [`InFlight::wait_below`].
    pub(crate) fn new() -> Arc<InFlight> {
        Arc::new(InFlight { count: AtomicU32::new(0), reader: Some(thread::current()) })
    }

    /// A count for the binary gateway, which looks at it every round.
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

    /// Takes back an `add(1)` for a command that never reached the
    /// sequencer.
    pub(crate) fn undo(&self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
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

/// Journals and applies reference data (assets, instruments, accounts,
/// deposits: a new venue's, or what its configuration adds) before
/// anything else, and waits until the journal holds it. Returns the
/// commands the engine refused, with why.
pub(crate) fn set_up(engine: &mut Engine, journal: &mut Journal, commands: &[Command]) -> Result<Vec<(Command, &'static str)>, ServeError> {
    let mut events = Vec::new();
    let mut refused = Vec::new();
    journal.stamp(crate::now_ms());
    for command in commands {
        journal.append(engine.seq() + 1, command)?;
        events.clear();
        engine.apply(command, &mut events);
        if let Some(reason) = events.iter().find_map(|e| match e.kind {
            crossbook_engine::EventKind::Rejected { reason } => Some(reason),
            _ => None,
        }) {
            refused.push((*command, reason.name()));
        }
    }
    journal.flush()?;
    Ok(refused)
}

/// Each field in which an instrument's definition in the configuration
/// differs from the journal's: `taker_bps 5 in the journal, 7 in the
/// configuration`.
fn spec_differences(kept: &InstrumentSpec, configured: &InstrumentSpec) -> String {
    let fields = |s: &InstrumentSpec| {
        [
            ("symbol", s.symbol.to_string()),
            ("base", s.base.to_string()),
            ("quote", s.quote.to_string()),
            ("tick_size", s.tick_size.to_string()),
            ("lot_size", s.lot_size.to_string()),
            ("min_qty", s.min_qty.to_string()),
            ("max_qty", s.max_qty.to_string()),
            ("min_price", s.min_price.to_string()),
            ("max_price", s.max_price.to_string()),
            ("maker_bps", s.maker_bps.to_string()),
            ("taker_bps", s.taker_bps.to_string()),
        ]
    };
    let differing: Vec<String> = fields(kept)
        .into_iter()
        .zip(fields(configured))
        .filter(|((_, a), (_, b))| a != b)
        .map(|((name, a), (_, b))| format!("{name} {a} in the journal, {b} in the configuration"))
        .collect();
    differing.join(", ")
}

/// What of a configuration's set-up commands (`setup`,
/// [`crate::config::Config::setup_commands`]) a venue that has run before
/// lacks: the assets, instruments and accounts its engine does not have,
/// each new account with its starting deposits. Nothing the venue has
/// changes (its journal is the truth: an account it has keeps its
/// balances). Refused, with every reason: an asset or instrument the
/// configuration defines otherwise than the journal (a venue's cannot
/// change: the gateways would show the configuration's while the engine
/// keeps the journal's), one the venue has and the configuration leaves
/// out (the gateways, which read the file, would not know it), a new one
/// whose name or symbol another has, new deposits past an asset's supply
/// limit: whatever the engine would refuse, so that nothing is journaled
/// half.
pub(crate) fn lacking(setup: &[Command], engine: &Engine) -> Result<Vec<Command>, ConfigError> {
    let mut commands = Vec::new();
    let mut conflicts = Vec::new();
    let mut opened = std::collections::HashSet::new();
    let mut supply: std::collections::HashMap<u32, u64> = std::collections::HashMap::new();
    for command in setup {
        match *command {
            Command::AddAsset { id, name } => match engine.asset_name(id) {
                None if engine.asset_ids().any(|other| engine.asset_name(other) == Some(name)) => conflicts.push(format!("new asset {id} is named {name}, as an asset the venue has")),
                None => commands.push(*command),
                Some(kept) if kept != name => conflicts.push(format!("asset {id} is {kept} in the journal, {name} in the configuration")),
                Some(_) => {}
            },
            Command::AddInstrument(spec) => match engine.instrument_spec(spec.id) {
                None if engine.instrument_ids().any(|other| engine.instrument_spec(other).is_some_and(|o| o.symbol == spec.symbol)) => {
                    conflicts.push(format!("new instrument {} is {}, as an instrument the venue has", spec.id, spec.symbol))
                }
                None => commands.push(*command),
                Some(kept) if kept != spec => conflicts.push(format!("instrument {} ({}): {}", spec.id, kept.symbol, spec_differences(&kept, &spec))),
                Some(_) => {}
            },
            Command::OpenAccount { account } if !engine.has_account(account) => {
                opened.insert(account);
                commands.push(*command);
            }
            Command::Deposit { account, asset, amount } if opened.contains(&account) => {
                let total = supply.entry(asset).or_insert_with(|| engine.supply(asset).unwrap_or(0));
                match total.checked_add(amount).filter(|&t| t <= crossbook_engine::MAX_SUPPLY) {
                    Some(next) => *total = next,
                    None => conflicts.push(format!("account {account}'s deposit of {amount} would take asset {asset}'s supply past 2^62")),
                }
                commands.push(*command);
            }
            _ => {}
        }
    }
    // What the venue has stays in the file: left out, the gateways and
    // market data (which read the file) would not know it while the
    // engine trades it, and a new one could take its name.
    let defined = |wanted: &dyn Fn(&Command) -> bool| setup.iter().any(wanted);
    for id in engine.asset_ids() {
        if !defined(&|c| matches!(c, Command::AddAsset { id: other, .. } if *other == id)) {
            let name = engine.asset_name(id).map(|n| n.to_string()).unwrap_or_default();
            conflicts.push(format!("asset {id} ({name}) of the venue is not in the configuration (what the venue has stays there)"));
        }
    }
    for id in engine.instrument_ids() {
        if !defined(&|c| matches!(c, Command::AddInstrument(spec) if spec.id == id)) {
            let symbol = engine.instrument_spec(id).map(|s| s.symbol.to_string()).unwrap_or_default();
            conflicts.push(format!("instrument {id} ({symbol}) of the venue is not in the configuration (what the venue has stays there)"));
        }
    }
    if conflicts.is_empty() { Ok(commands) } else { Err(ConfigError::NotTheVenues(conflicts.join("; "))) }
}

/// What `config` adds to the venue `engine` has ([`lacking`]), tried out
/// first: every asset and instrument of the file, and the accounts the
/// venue lacks with their deposits, on an engine of their own (an account
/// the venue has is not read again, whatever its deposits say).
pub(crate) fn additions(config: &Config, engine: &Engine) -> Result<Vec<Command>, ConfigError> {
    let setup = config.setup_commands()?;
    let lacking = lacking(&setup, engine)?;
    if lacking.is_empty() {
        return Ok(lacking);
    }
    Config::check_new_asset_names(&lacking)?;
    let opened: std::collections::HashSet<u64> = lacking.iter().filter_map(|c| if let Command::OpenAccount { account } = c { Some(*account) } else { None }).collect();
    let tried: Vec<Command> = setup.into_iter().filter(|c| !matches!(c, Command::OpenAccount { account } | Command::Deposit { account, .. } if !opened.contains(account))).collect();
    Config::try_out(&tried)?;
    Ok(lacking)
}

/// A replicated node's side of the sequencer (`replica.rs`).
pub(crate) struct Replication {
    pub(crate) log: Arc<Log>,
    pub(crate) state: Arc<NodeState>,
    pub(crate) wake: Arc<dyn Fn() + Send + Sync>,
    /// The chain value after the last command applied (what the next
    /// record chains from, in the log as in the journal).
    pub(crate) chain: u32,
    pub(crate) role: Role,
    /// A new venue's reference data: journaled (and so replicated) first
    /// by the node that leads a log that is still empty.
    pub(crate) setup: Vec<Command>,
    /// It may lead (`false`: a read replica).
    pub(crate) candidate: bool,
    /// The stream message the follower's reader started at: the only one
    /// that may hold commands this node applied before it (its start
    /// checked them against the log, `replica::reconcile`).
    pub(crate) start_from: u64,
    /// It leads, and takes orders once every command it applied is
    /// released and in market data: until then the gateways' own checks
    /// (a transfer's reference, a REST client order id, a session's report
    /// numbers) would read a state behind the engine's.
    pub(crate) accept_pending: bool,
}

pub(crate) enum Role {
    /// Applies the log's messages as they come.
    Follower(Reader),
    /// Appends its batches to the log; a batch's reports go out once a
    /// quorum holds it.
    Leader(Appender),
}

/// Messages of the log applied per round at most (the gateway's sockets
/// get their turn between).
const DELIVERED_PER_ROUND: usize = 64;
/// A leader's batch goes to the log in messages of about this many bytes
/// at most (nats-server takes 1 MiB by default; the appender joins small
/// ones up to 768 KiB).
const MESSAGE_BYTES: usize = 256 * 1024;

/// What the sequencer runs with besides its queue.
pub(crate) struct Settings<'a> {
    pub(crate) data_dir: &'a Path,
    pub(crate) snapshot_every: u64,
    /// Open orders an account may have (`limits.open_orders`), whichever
    /// gateway its orders come through.
    pub(crate) open_orders: usize,
    /// Set (by SIGUSR1) to take a snapshot now.
    pub(crate) snapshot_now: &'a AtomicBool,
    /// The sequence number of the last command applied, for whoever needs
    /// the sequencer's progress (the FIX gateway binds a session from it).
    pub(crate) applied: Arc<AtomicU64>,
    /// Commands whose reports a restart rebuilds for replay, at least
    /// (snapshots with the gateways' checkpoints that far back are kept).
    pub(crate) history_commands: u64,
    /// Set (by SIGHUP) to read the configuration again.
    pub(crate) reload_now: &'a AtomicBool,
    /// Reads the configuration again (`None`: nothing to read again).
    pub(crate) reread: Option<&'a Reread>,
    /// The accounts' credentials, every gateway's.
    pub(crate) keys: Arc<Keys>,
    /// What the venue lists: an asset or instrument the engine adds is
    /// listed here before the next command is applied.
    pub(crate) listing: Arc<crate::listing::Listing>,
}

/// How a served venue reads its configuration again.
pub type Reread = dyn Fn() -> Result<Config, String> + Send + Sync;

/// A batch applied and waiting for the journal: its last sequence number,
/// its commands and their reports, the refusals that never reached the
/// engine, and the in-flight counters to lower once it is out.
struct Waiting {
    last_seq: u64,
    /// When the round that read the batch applied it.
    applied_at: Instant,
    commands: Vec<Applied>,
    reports: Vec<Addressed>,
    events: Vec<Event>,
    refused: Vec<Refusal>,
    answers: Vec<Answer>,
    answered: Vec<Arc<InFlight>>,
    /// A follower's batch: commands of the log, not of this node's gateways.
    from_log: bool,
}

impl Waiting {
    fn new(commands: usize, answered: usize) -> Waiting {
        Waiting {
            last_seq: 0,
            applied_at: Instant::now(),
            commands: Vec::with_capacity(commands),
            reports: Vec::new(),
            events: Vec::new(),
            refused: Vec::new(),
            answers: Vec::new(),
            answered: Vec::with_capacity(answered),
            from_log: false,
        }
    }
}

pub(crate) struct Sequencer<'a> {
    engine: Engine,
    journal: Journal,
    builder: ReportBuilder,
    events: Vec<Event>,
    /// Batches applied but not yet durable, oldest first.
    waiting: VecDeque<Waiting>,
    /// Per command, from the round that applied it to the release of its
    /// reports (the journal's wait included), logged at shutdown: the
    /// server's own share of a client's order-to-acknowledgement latency.
    residence: hdrhistogram::Histogram<u64>,
    commands: u64,
    last_log: Instant,
    logged: u64,
    last_snapshot: u64,
    /// The engine's state at a sequence number, encoded when a snapshot
    /// was due, waiting for the release of the batch that ends there: the
    /// gateways' checkpoints are taken at the same command.
    snapshot_pending: Option<(u64, Vec<u8>)>,
    /// The sequence number of the snapshot SIGUSR1 asked for, until it
    /// is handed to the snapshotter (which says when it is written).
    asked_snapshot: Option<u64>,
    /// The last sequence number handed to the sinks.
    released: u64,
    /// The time stamped on the last batch (milliseconds since the Unix
    /// epoch).
    time_ms: u64,
    snapshotter: Snapshotter,
    settings: Settings<'a>,
    /// A replicated node's log, role and chain; `None`: one machine.
    replication: Option<Replication>,
}

impl<'a> Sequencer<'a> {
    /// A sequencer going on from `engine` (every command of which the sinks
    /// have seen). With `checkpoint_now`, a snapshot with the gateways'
    /// checkpoints is taken at once (start-up does when the newest snapshot
    /// has none: a shutdown snapshot carries none).
    pub(crate) fn new(engine: Engine, journal: Journal, settings: Settings<'a>, checkpoint_now: bool) -> Result<Sequencer<'a>, ServeError> {
        settings.applied.store(engine.seq(), Ordering::Release);
        let snapshotter = Snapshotter::start(settings.data_dir.to_path_buf(), journal.watch(), settings.history_commands)?;
        let snapshot_pending = checkpoint_now.then(|| {
            let mut state = Vec::new();
            engine.encode_state(&mut state);
            (engine.seq(), state)
        });
        Ok(Sequencer {
            builder: ReportBuilder::from_engine(&engine),
            last_snapshot: engine.seq(),
            snapshot_pending,
            asked_snapshot: None,
            released: engine.seq(),
            time_ms: 0,
            engine,
            journal,
            events: Vec::new(),
            waiting: VecDeque::new(),
            residence: micros_histogram(),
            commands: 0,
            last_log: Instant::now(),
            logged: 0,
            snapshotter,
            settings,
            replication: None,
        })
    }

    /// Makes this a replicated node's sequencer (`replica.rs`).
    pub(crate) fn replicated(&mut self, replication: Replication) {
        self.replication = Some(replication);
    }

    /// Whether this node takes orders: not replicated, or leading.
    fn leading(&self) -> bool {
        self.replication.as_ref().is_none_or(|r| matches!(r.role, Role::Leader(_)))
    }

    /// Journals and applies `batch` (emptied); its reports wait for the
    /// journal. An order past its account's open-order limit is refused
    /// here, before the journal, whichever gateway sent it.
    pub(crate) fn apply(&mut self, batch: &mut Vec<Inbound>) -> Result<(), ServeError> {
        if batch.is_empty() {
            return Ok(());
        }
        // One clock reading per batch, journaled with its commands: market
        // data's times are then a function of the journal. Never back.
        self.time_ms = self.time_ms.max(crate::now_ms());
        self.journal.stamp(self.time_ms);
        let mut done = Waiting::new(batch.len(), batch.len());
        let leading = self.leading();
        let mut records = self.replication.as_ref().map(|r| Encoder::new(self.engine.seq() + 1, r.chain));
        // A batch's records in messages of at most about MESSAGE_BYTES.
        let mut full: Vec<Encoder> = Vec::new();
        for (arrived, item) in batch.drain(..).enumerate() {
            done.answered.push(item.in_flight);
            let (command, placed) = match item.request {
                Request::Command(command) if leading => (command, None),
                Request::Tracked { command, placed } if leading => (command, Some(placed)),
                Request::ForOrder { command, placed } if leading => (command.with_target(placed.get()), None),
                // A follower takes no command (its gateways refuse them
                // first; one that raced a lost lead is dropped).
                Request::Command(_) | Request::Tracked { .. } | Request::ForOrder { .. } => continue,
                Request::Query(query) => {
                    done.answers.push(self.answer(item.source, query, arrived));
                    continue;
                }
            };
            // Only an order that may rest can add an open order: an IOC,
            // a FOK or a market order is not held to the limit.
            if let Command::Place(place) = &command
                && place.order_type == OrderType::Limit
                && place.tif == TimeInForce::Gtc
                && self.builder.open_orders_of(place.account) >= self.settings.open_orders
            {
                let report = Addressed { account: place.account, report: ExecutionReport::open_order_refusal(place) };
                done.refused.push(Refusal { source: item.source, place: *place, annex: item.annex, report, after: self.engine.seq(), arrived });
                continue;
            }
            let seq = self.engine.seq() + 1;
            self.journal.append_with(seq, &command, item.annex.as_deref())?;
            if let Some(placed) = placed {
                placed.set(seq);
            }
            if let Some(current) = records.as_mut() {
                current.push(seq, self.time_ms, &command, item.annex.as_deref());
                if current.payload.len() >= MESSAGE_BYTES {
                    let next = Encoder::new(seq + 1, current.span().chain);
                    full.push(std::mem::replace(current, next));
                }
            }
            self.run(seq, self.time_ms, command, item.annex, &mut done);
        }
        self.journal.publish()?;
        if let (Some(records), Some(replication)) = (records, self.replication.as_mut())
            && let Role::Leader(appender) = &replication.role
        {
            full.extend((!records.is_empty()).then_some(records));
            for message in full {
                replication.chain = message.span().chain;
                appender.submit(message)?;
            }
        }
        self.settings.applied.store(self.engine.seq(), Ordering::Release);
        done.last_seq = self.engine.seq();
        self.waiting.push_back(done);
        Ok(())
    }

    /// Applies one journaled command to the engine and keeps what it caused
    /// (its reports, its events) in the batch `done`.
    fn run(&mut self, seq: u64, time_ms: u64, command: Command, annex: Option<Vec<u8>>, done: &mut Waiting) {
        self.events.clear();
        self.engine.apply(&command, &mut self.events);
        if matches!(command, Command::AddAsset { .. } | Command::AddInstrument(_))
            && let Some(warning) = self.settings.listing.added(&command, &self.events)
        {
            log(&warning);
        }
        let first = done.reports.len();
        self.builder.reports(&command, &self.events, &mut done.reports);
        let first_event = done.events.len();
        done.events.extend_from_slice(&self.events);
        done.commands.push(Applied { seq, time_ms, command, annex, reports: first..done.reports.len(), events: first_event..done.events.len() });
        self.commands += 1;
    }

    /// A replicated node's turn each round: a follower applies the log's
    /// messages that came (and takes the lead once the lease thread took
    /// the lease and its marker is in); a leader checks it still leads.
    pub(crate) fn replicate(&mut self) -> Result<(), ServeError> {
        let (seq, released) = (self.engine.seq(), self.released);
        let Some(replication) = self.replication.as_mut() else { return Ok(()) };
        if replication.accept_pending && released == seq && replication.state.market_has(seq) {
            replication.accept_pending = false;
            replication.state.accepting.store(true, Ordering::Release);
            log(&format!("replication: taking orders from command {seq} (every command applied is released, and in market data)"));
        }
        let mut delivered = Vec::new();
        if let Role::Follower(reader) = &mut replication.role {
            while delivered.len() < DELIVERED_PER_ROUND {
                match reader.try_next() {
                    Some(Ok(message)) => delivered.push(message),
                    Some(Err(e)) => return Err(e.into()),
                    None => break,
                }
            }
        }
        for message in delivered {
            self.apply_delivered(message)?;
        }
        self.try_to_lead()
    }

    /// Applies one message of the log as the leader applied it: the same
    /// commands under the same sequence numbers and times, journaled
    /// locally; its reports go to the gateways once the local journal
    /// holds them.
    fn apply_delivered(&mut self, message: Delivered) -> Result<(), ServeError> {
        let Some(replication) = self.replication.as_mut() else { return Ok(()) };
        let seq = self.engine.seq();
        if message.span.first > seq + 1 {
            return Err(ServeError::Diverged(format!("stream message {} begins at command {}, after {seq}", message.stream_seq, message.span.first)));
        }
        if message.span.first == seq + 1 && message.span.previous != replication.chain {
            return Err(ServeError::Diverged(format!("stream message {} does not chain to command {seq} as this node has it", message.stream_seq)));
        }
        // Any other message that begins at or before a command this node
        // applied says the log went on without it: this node applied a
        // message the log does not keep (a leadership marker after command
        // N < `seq` is such a message too). It stops; its next start cuts
        // its journal back to the log.
        if message.span.first <= seq && message.stream_seq != replication.start_from {
            return Err(ServeError::Diverged(format!(
                "stream message {} goes on from command {}, but this node applied up to command {seq}: it holds commands the log does not",
                message.stream_seq,
                message.span.first.saturating_sub(1)
            )));
        }
        replication.state.applied_stream.store(message.stream_seq, Ordering::Release);
        let chain = message.span.chain;
        let fresh: Vec<_> = message.records.into_iter().filter(|r| r.seq > seq).collect();
        if fresh.is_empty() {
            return Ok(());
        }
        replication.chain = chain;
        let mut done = Waiting::new(fresh.len(), 0);
        done.from_log = true;
        for record in fresh {
            self.time_ms = self.time_ms.max(record.time_ms);
            self.journal.stamp(record.time_ms);
            self.journal.append_with(record.seq, &record.command, record.annex.as_deref())?;
            self.run(record.seq, record.time_ms, record.command, record.annex, &mut done);
        }
        self.journal.publish()?;
        self.settings.applied.store(self.engine.seq(), Ordering::Release);
        done.last_seq = self.engine.seq();
        self.waiting.push_back(done);
        Ok(())
    }

    /// Once the lease thread has taken the lease: the leadership marker
    /// right after the last message applied (if the log moved on, what
    /// came is applied first and it is tried again), then orders.
    fn try_to_lead(&mut self) -> Result<(), ServeError> {
        let Some(replication) = self.replication.as_mut() else { return Ok(()) };
        let epoch = replication.state.promote.load(Ordering::Acquire);
        if epoch == 0 || !matches!(replication.role, Role::Follower(_)) {
            return Ok(());
        }
        let after = replication.state.applied_stream.load(Ordering::Acquire);
        let marked = match replication.log.mark_leader(epoch, after, self.engine.seq(), replication.chain) {
            Ok(marked) => marked,
            Err(e) => {
                log(&format!("replication: the leadership marker could not be appended yet ({e}); trying again"));
                return Ok(());
            }
        };
        let Some(marker) = marked else { return Ok(()) };
        let appender = replication.log.appender(epoch, marker, self.engine.seq(), replication.wake.clone());
        replication.role = Role::Leader(appender);
        replication.state.applied_stream.store(marker, Ordering::Release);
        replication.state.leading.store(true, Ordering::Release);
        replication.accept_pending = true;
        log(&format!("replication: leading (epoch {epoch}) from command {}, stream message {marker}", self.engine.seq()));
        // A new venue: its reference data is the log's first commands; a
        // venue that has run: what this node's configuration adds to it.
        let new = self.engine.seq() == 0;
        let setup = std::mem::take(&mut replication.setup);
        let setup = if new {
            setup
        } else {
            // The node checked its configuration against its own journal
            // at start; what came to the log since may still conflict.
            lacking(&setup, &self.engine).unwrap_or_else(|why| {
                log(&format!("warning: {why}; nothing of it is added"));
                Vec::new()
            })
        };
        if !setup.is_empty() {
            let mut batch = own_commands(setup);
            let count = batch.len();
            self.apply(&mut batch)?;
            if new {
                log(&format!("new venue: {count} set-up commands from the configuration, replicated"));
            } else {
                log(&format!("from the configuration: {count} commands adding what the venue lacked, replicated"));
            }
        }
        Ok(())
    }

    /// Reads the configuration again if SIGHUP asked for it, and takes
    /// from it what a running venue can take: new assets, instruments and
    /// accounts, and the accounts' keys. What is new is journaled (and
    /// replicated when leading: a follower adds what its file adds when
    /// it takes the lead), assets and instruments first, each listed for
    /// the gateways as the engine adds it (`listing.rs`); a new account
    /// is opened with its deposits, and every account's keys are the
    /// file's from now on. All of it or nothing: a file that does not
    /// parse or check, or that does not fit the venue (`lacking`: a
    /// listed asset or instrument changed or left out, a name taken),
    /// changes nothing and is logged. Returns the accounts whose keys
    /// changed or went, for the gateways to let go of their sessions and
    /// listen keys.
    pub(crate) fn reload_if_asked(&mut self) -> Result<crate::keys::Changed, ServeError> {
        if !self.settings.reload_now.swap(false, Ordering::AcqRel) {
            return Ok(crate::keys::Changed::default());
        }
        let Some(reread) = self.settings.reread else {
            log("configuration reload: the venue runs on the built-in configuration (no --config): nothing to read again");
            return Ok(crate::keys::Changed::default());
        };
        let refused = |why: &dyn std::fmt::Display| log(&format!("configuration reload refused, nothing changed: {why}"));
        let config = match reread() {
            Ok(config) => config,
            Err(why) => {
                refused(&why);
                return Ok(crate::keys::Changed::default());
            }
        };
        let adding = match config.check().and_then(|()| additions(&config, &self.engine)) {
            Ok(adding) => adding,
            Err(why) => {
                refused(&why);
                return Ok(crate::keys::Changed::default());
            }
        };
        let listed: Vec<String> = adding
            .iter()
            .filter_map(|c| match c {
                Command::AddAsset { id, name } => Some(format!("asset {id} ({name})")),
                Command::AddInstrument(spec) => Some(format!("instrument {} ({})", spec.id, spec.symbol)),
                _ => None,
            })
            .collect();
        // What it changes of what is listed waits for the next start:
        // said now, not found out then.
        for line in self.settings.listing.changed_by(&config) {
            log(&format!("configuration reload: {line}"));
        }
        // A new asset's or instrument's settings (decimals, FIX units)
        // come from this file when the engine adds it.
        self.settings.listing.define(&config);
        for warning in config.unit_warnings() {
            if adding.iter().any(|c| matches!(c, Command::AddInstrument(spec) if warning.starts_with(&format!("instrument {}:", spec.symbol)))) {
                log(&format!("warning: {warning}: the REST API's amounts would not add up"));
            }
        }
        let opened: Vec<String> = adding.iter().filter_map(|c| if let Command::OpenAccount { account } = c { Some(account.to_string()) } else { None }).collect();
        if self.leading() {
            if !adding.is_empty() {
                self.apply(&mut own_commands(adding))?;
            }
        } else if let Some(replication) = self.replication.as_mut() {
            // A follower journals nothing of its own: what its file adds is
            // appended if it takes the lead.
            replication.setup = config.setup_commands().map_err(ServeError::Config)?;
        }
        let changed = self.settings.keys.replace(&config.accounts);
        let list = |accounts: &[u64]| if accounts.is_empty() { "none".to_string() } else { accounts.iter().map(u64::to_string).collect::<Vec<_>>().join(", ") };
        let added = |what: &[String]| {
            if what.is_empty() {
                "none".to_string()
            } else if self.leading() {
                format!("{} (journaled up to seq {})", what.join(", "), self.engine.seq())
            } else if self.replication.as_ref().is_some_and(|r| r.candidate) {
                format!("{} when this node leads", what.join(", "))
            } else {
                format!("none here ({}: a read replica never leads; they come from its leader)", what.join(", "))
            }
        };
        log(&format!(
            "configuration reloaded: {} accounts with keys; listed {}; opened {}; API keys changed or removed for {}; login keys changed or removed for {}; secrets changed for {} (a reload takes new assets, instruments and accounts, and the accounts' keys: every other setting is read at start)",
            config.accounts.len(),
            added(&listed),
            added(&opened),
            list(&changed.api_keys),
            list(&changed.logins),
            list(&changed.secrets)
        ));
        Ok(changed)
    }

    /// A query's answer from the engine as it is now (after every command
    /// before the query).
    fn answer(&self, source: Source, query: Query, arrived: usize) -> Answer {
        let (balances, orders) = match query.kind {
            QueryKind::Balances => (self.engine.balances_of(query.account).unwrap_or_default(), Vec::new()),
            QueryKind::OpenOrders { instrument } => (Vec::new(), self.engine.open_orders_of(query.account, instrument)),
            QueryKind::Heartbeat | QueryKind::Logout => (Vec::new(), Vec::new()),
        };
        Answer { source, query, seq: self.engine.seq(), arrived, balances, orders, known: self.engine.has_account(query.account) }
    }

    /// Hands every batch the journal now holds to the sinks, oldest first.
    /// What the journal acknowledged before a failure is released first:
    /// those commands are durable, and their clients hear of them; then the
    /// failure is the error.
    pub(crate) fn release(&mut self, sinks: &mut [&mut dyn ReportSink]) -> Result<(), ServeError> {
        // A snapshot due when its command was already out: the gateways
        // are at it now, before anything more is released.
        match self.snapshot_pending.as_ref().map(|(seq, _)| *seq) {
            Some(seq) if seq == self.released => self.offer_snapshot(sinks),
            Some(seq) if seq < self.released => {
                // Cannot happen (it is offered as its batch goes out); if
                // it did, the next one is taken when due.
                log(&format!("snapshot at seq {seq} dropped: the gateways went past it before their checkpoints were taken"));
                self.snapshot_pending = None;
            }
            _ => {}
        }
        if !self.waiting.is_empty() {
            let acked = match self.replication.as_ref().map(|r| &r.role) {
                // A leader's batch is acknowledged once a quorum of the log
                // holds it (and the local journal has it too).
                Some(Role::Leader(appender)) => self.journal.acked().min(appender.acked()),
                _ => self.journal.acked(),
            };
            self.release_through(acked, sinks);
        }
        if let Some(failure) = self.journal.failure() {
            return Err(ServeError::Journal(failure));
        }
        if let Some(replication) = &self.replication {
            if let Role::Leader(appender) = &replication.role
                && let Some(failure) = appender.failure()
            {
                replication.state.accepting.store(false, Ordering::Release);
                return Err(failure.into());
            }
            if replication.state.lost.load(Ordering::Acquire) {
                replication.state.accepting.store(false, Ordering::Release);
                return Err(ServeError::Deposed("the lease was lost".into()));
            }
        }
        Ok(())
    }

    fn release_through(&mut self, acked: u64, sinks: &mut [&mut dyn ReportSink]) {
        while self.waiting.front().is_some_and(|w| w.last_seq <= acked) {
            let Some(done) = self.waiting.pop_front() else { break };
            let batch = Released { commands: &done.commands, reports: &done.reports, events: &done.events, refused: &done.refused, answers: &done.answers, from_log: done.from_log };
            for sink in sinks.iter_mut() {
                sink.released(&batch);
            }
            self.released = done.last_seq;
            // The gateways have seen exactly the commands the pending
            // snapshot's state covers (a batch of refusals only can end at
            // the same number: its turn comes next).
            if self.snapshot_pending.as_ref().is_some_and(|(seq, _)| *seq == done.last_seq)
                && self.waiting.front().is_none_or(|next| next.last_seq > done.last_seq)
            {
                self.offer_snapshot(sinks);
            }
            let micros = done.applied_at.elapsed().as_micros() as u64;
            self.residence.saturating_record_n(micros, done.answered.len() as u64);
            for counter in &done.answered {
                counter.done();
            }
        }
    }

    /// Whether every batch applied is out.
    pub(crate) fn idle(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Hands the pending snapshot's state to the snapshotter with every
    /// gateway's checkpoint, taken now (the gateways are at its command).
    fn offer_snapshot(&mut self, sinks: &mut [&mut dyn ReportSink]) {
        let Some((seq, state)) = self.snapshot_pending.take() else { return };
        let checkpoints: Option<Vec<(String, Checkpoint)>> = sinks.iter_mut().map(|sink| sink.checkpoint(seq).map(|c| (sink.name().to_owned(), c))).collect();
        let announce = self.asked_snapshot.take_if(|asked| *asked == seq).is_some();
        self.snapshotter.offer(Offer { seq, state, checkpoints, announce });
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
            if self.snapshotter.is_free() && self.snapshot_pending.is_none() {
                let mut state = Vec::new();
                self.engine.encode_state(&mut state);
                self.snapshot_pending = Some((seq, state));
                if requested {
                    log(&format!("snapshot requested: writing one at seq {seq}"));
                    self.asked_snapshot = Some(seq);
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
    pub(crate) fn finish(mut self, leftover: Vec<Inbound>) -> Result<Summary, ServeError> {
        // A replicated node applies nothing more at the end: what was never
        // appended to the log was never acknowledged.
        let mut leftover = if self.replication.is_some() { Vec::new() } else { leftover };
        if let Some(Replication { role: Role::Leader(appender), .. }) = &self.replication {
            log(&format!("replication: {}", appender.figures()));
        }
        self.apply(&mut leftover)?;
        let watch = self.journal.watch();
        let stats = self.journal.close()?;
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
        if !h.is_empty() {
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
        let not_written = |why: &dyn std::fmt::Display| {
            log(&format!("warning: the shutdown snapshot at seq {seq} was not written ({why}); the journal holds everything, and the next start replays it"));
        };
        match watch.chain_at(seq) {
            Some(chain) => {
                // Without the gateways' checkpoints (the last commands
                // never reached them); the next start writes one with.
                let mut state = Vec::new();
                self.engine.encode_state(&mut state);
                let retention = Retention { newest: KEEP_SNAPSHOTS, reach: self.settings.history_commands };
                match write_snapshot_state(self.settings.data_dir, SnapshotHeader { seq, chain }, &state, &[], retention) {
                    Ok(_) => log(&format!("snapshot written at seq {seq}")),
                    Err(e) => not_written(&e),
                }
            }
            None => not_written(&"the checksum of the journal's last record is not at hand"),
        }
        Ok(Summary { seq, commands: self.commands })
    }
}
