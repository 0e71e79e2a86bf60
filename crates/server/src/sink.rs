//! Where the sequencer's work goes: a gateway is a [`ReportSink`].
//!
//! The sequencer journals and applies commands and, once the journal holds
//! a batch durably, hands each of its commands (sequence number, command,
//! the annex its gateway journaled with it, the execution reports it
//! caused and the engine's events) to every sink, in sequence order, the way ripgrep's searcher
//! hands matches to a `Sink`. It knows nothing of how a gateway numbers,
//! stores, encodes or routes them: the binary gateway numbers reports per
//! account and writes frames; the FIX gateway turns them into FIX messages
//! for the sessions bound to their accounts. A new gateway (market data, a
//! REST API) is one more implementation and no change to the sequencer.
//!
//! At start-up the same commands are handed over again, one by one, as the
//! journal is re-read ([`ReportSink::recovered`]): reports are a function
//! of the journal, so a gateway rebuilds what it had sent (a session's
//! numbering and history, a FIX store's missing messages) exactly.

use crossbook_engine::{AccountId, AssetId, Command, Event, InstrumentId, OrderView, PlaceOrder};
use crossbook_protocol::reports::Addressed;
use std::ops::Range;

/// Which gateway sent a command. The sequencer only carries it, so that a
/// gateway can tell its own refusals from another's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Source(pub(crate) u8);

/// The binary gateway's commands.
pub(crate) const BINARY: Source = Source(0);
/// The FIX gateway's commands.
pub(crate) const FIX: Source = Source(1);
/// Commands of gateways added with [`crate::serve_with_sinks`] (none
/// today send any).
pub const OTHER: Source = Source(2);
/// The HTTP gateway's commands and queries (Binance's signed REST API).
pub(crate) const REST: Source = Source(3);

/// A question about one account's state, asked of the sequencer like a
/// command: it is answered in sequence, from the engine's state after every
/// command before it, and the answer is released with its batch, once the
/// journal holds every command it reflects (only durable facts leave the
/// process). Not journaled: it changes nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Query {
    pub account: AccountId,
    pub kind: QueryKind,
    /// The asking gateway's own: which connection or request to answer.
    pub token: u64,
    /// The asker's own number for it, given back with the answer.
    pub request: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueryKind {
    /// Every asset's available and locked balance.
    Balances,
    /// The open orders (of one instrument, or all).
    OpenOrders { instrument: Option<InstrumentId> },
    /// A binary session's Heartbeat or Logout sent while its earlier
    /// messages were unanswered: answered in its place after theirs
    /// (nothing of the engine's in it).
    Heartbeat,
    Logout,
}

/// A query answered: what the engine said after the commands before it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub source: Source,
    pub query: Query,
    /// The last command it reflects.
    pub seq: u64,
    /// Its place among the messages of its batch: what orders it against
    /// an open-order refusal that came between the same two commands.
    pub arrived: usize,
    /// `Balances`: (asset, available, locked), every asset of the venue;
    /// empty for an unknown account.
    pub balances: Vec<(AssetId, u64, u64)>,
    /// `OpenOrders`: oldest first.
    pub orders: Vec<OrderView>,
    /// The account exists.
    pub known: bool,
}

/// One durable command and what it caused.
pub struct Durable<'a> {
    pub seq: u64,
    /// When the sequencer took it (milliseconds since the Unix epoch; one
    /// reading per batch, never going back), as the journal keeps it; 0
    /// for a command journaled before records carried their time.
    pub time_ms: u64,
    pub command: &'a Command,
    /// What the sending gateway journaled with the command (the FIX
    /// ClOrdIDs), or `None`.
    pub annex: Option<&'a [u8]>,
    /// The execution reports, each addressed to the account it is for,
    /// not yet numbered.
    pub reports: &'a [Addressed],
    /// The engine's events (what a market-data gateway needs: every
    /// order that rests, trades, leaves).
    pub events: &'a [Event],
}

/// An order refused by the open-order limit before it reached the engine
/// or the journal: answered with `report` (sequence number 0) by the
/// gateway it came from.
pub struct Refused<'a> {
    pub source: Source,
    pub place: &'a PlaceOrder,
    pub annex: Option<&'a [u8]>,
    pub report: &'a Addressed,
    /// The sequence number of the last command journaled before it.
    pub after: u64,
    /// Its place among the messages of its batch (as [`Answer::arrived`]).
    pub arrived: usize,
}

/// A command the sequencer applied, as it keeps it until it is durable.
pub(crate) struct Applied {
    pub(crate) seq: u64,
    pub(crate) time_ms: u64,
    pub(crate) command: Command,
    pub(crate) annex: Option<Vec<u8>>,
    /// Its reports in the batch's report list, its events in its event
    /// list.
    pub(crate) reports: Range<usize>,
    pub(crate) events: Range<usize>,
}

/// An order the open-order limit refused, as the sequencer keeps it.
pub(crate) struct Refusal {
    pub(crate) source: Source,
    pub(crate) place: PlaceOrder,
    pub(crate) annex: Option<Vec<u8>>,
    pub(crate) report: Addressed,
    /// The sequence number of the last command journaled before it: it
    /// came between that command and the next.
    pub(crate) after: u64,
    /// Its place among the messages of its batch.
    pub(crate) arrived: usize,
}

/// A batch the journal has made durable, as the sinks see it.
pub struct Released<'a> {
    pub(crate) commands: &'a [Applied],
    pub(crate) reports: &'a [Addressed],
    pub(crate) events: &'a [Event],
    pub(crate) refused: &'a [Refusal],
    pub(crate) answers: &'a [Answer],
    pub(crate) from_log: bool,
}

impl<'a> Released<'a> {
    /// Its commands, in sequence order.
    pub fn durable(&self) -> impl Iterator<Item = Durable<'a>> + use<'a> {
        let (reports, events) = (self.reports, self.events);
        self.commands.iter().map(move |c| Durable {
            seq: c.seq,
            time_ms: c.time_ms,
            command: &c.command,
            annex: c.annex.as_deref(),
            reports: &reports[c.reports.clone()],
            events: &events[c.events.clone()],
        })
    }

    /// Whether its commands came from the replicated log (a follower's
    /// batch), not from this node's gateways: their annexes name requests
    /// of another node.
    pub fn from_log(&self) -> bool {
        self.from_log
    }

    /// The queries answered with it, in the order they came.
    pub fn answers(&self) -> impl Iterator<Item = &'a Answer> + use<'a> {
        self.answers.iter()
    }

    /// The orders refused while it was applied, in the order they came.
    pub fn refused(&self) -> impl Iterator<Item = Refused<'a>> + use<'a> {
        self.refused.iter().map(|r| Refused { source: r.source, place: &r.place, annex: r.annex.as_deref(), report: &r.report, after: r.after, arrived: r.arrived })
    }
}

/// A gateway's state for a snapshot (see [`ReportSink::checkpoint`]).
pub enum Checkpoint {
    /// Ready now.
    Now(Vec<u8>),
    /// Being made by a thread of the gateway's own, which follows the
    /// released batches behind the sequencer: the bytes come through this
    /// channel once that thread has caught up with the same command.
    Soon(std::sync::mpsc::Receiver<Vec<u8>>),
}

/// A checkpoint that cannot be restored: what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreError(pub String);

impl From<crossbook_marketdata::codec::CodecError> for RestoreError {
    fn from(e: crossbook_marketdata::codec::CodecError) -> RestoreError {
        RestoreError(e.0)
    }
}

impl std::fmt::Display for RestoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

pub trait ReportSink {
    /// A batch the journal has made durable: its commands in sequence
    /// order, and the orders refused while it was applied.
    fn released(&mut self, batch: &Released<'_>);

    /// One journaled command re-applied at start-up, in sequence order,
    /// before any connection is served.
    fn recovered(&mut self, durable: &Durable<'_>);

    /// The name its checkpoints are kept under in a snapshot: unique among
    /// a venue's gateways, at most 64 bytes.
    fn name(&self) -> &str {
        "gateway"
    }

    /// Its state after every batch released (or recovered) so far (the
    /// last command of which is `seq`), kept in the snapshot of the engine
    /// at that same command: what it cannot
    /// rebuild from the engine's state there and the journal's commands
    /// after it. At start-up the venue then hands it back
    /// ([`ReportSink::restore`]) and only the commands after that snapshot
    /// (`recovered`), so a restart does not re-read the whole journal.
    /// `None` (the default): it needs every command from the first at
    /// start-up, and the venue re-reads the whole journal for it.
    fn checkpoint(&mut self, seq: u64) -> Option<Checkpoint> {
        let _ = seq;
        None
    }

    /// Takes back what `checkpoint` gave, at start-up, before `recovered`
    /// hands over the commands after the snapshot it was kept in.
    fn restore(&mut self, state: &[u8]) -> Result<(), RestoreError> {
        let _ = state;
        Err(RestoreError(format!("the {} gateway keeps no checkpoints", self.name())))
    }

    /// Forgets what `restore` took back, as if it had never been called:
    /// start-up does when another gateway's checkpoint in the same
    /// snapshot does not restore, and starts from an older one.
    fn reset(&mut self) {}

    /// A configuration reload changed or took away accounts' keys
    /// (`changed`): a gateway lets go of whoever logged in or signed with
    /// the old ones (the keys themselves are in the shared table the
    /// gateway was built with).
    fn revoked(&mut self, changed: &crate::keys::Changed) {
        let _ = changed;
    }

    /// The venue is stopping: a gateway that hands the sequencer commands
    /// of its own (REST) takes no more; those it handed over are still
    /// applied and answered.
    fn stop_intake(&mut self) {}

    /// Every command it handed the sequencer has been answered: a stopping
    /// venue waits for that (bounded) before it closes the gateways.
    fn settled(&self) -> bool {
        true
    }
}
