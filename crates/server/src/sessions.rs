//! The binary gateway's sessions: which connection serves each logged-in
//! account, every account's numbered report history (for replay on
//! reconnect), and the frames waiting for the gateway to write. Owned by
//! the gateway's thread, which also runs the sequencer: plain fields, no
//! locks.

use crate::checkpoint::Reader;
use crate::sink::{Answer, BINARY, Checkpoint, Durable, QueryKind, Released, ReportSink, RestoreError};
use crossbook_engine::AccountId;
use crossbook_protocol::{ExecutionReport, OpenOrder, ServerMessage, encode_server};
use std::collections::{HashMap, VecDeque};

/// Reports kept per account for replay to a session that reconnects.
pub(crate) const HISTORY_REPORTS: usize = 100_000;

/// A logged-in binary session: the gateway's connection serving it.
pub(crate) struct Session {
    pub(crate) connection: u64,
}

/// An account's session sequence and its recent reports (numbered; their
/// frames are encoded when they are sent, live or replayed).
#[derive(Default)]
pub(crate) struct History {
    /// The last sequence number given.
    pub(crate) last: u64,
    /// The last `HISTORY_REPORTS` reports, oldest first.
    pub(crate) reports: VecDeque<ExecutionReport>,
}

impl History {
    /// Numbers a report for its account and keeps it; returns it numbered.
    fn record(&mut self, mut report: ExecutionReport) -> ExecutionReport {
        self.last += 1;
        report.seq = self.last;
        if self.reports.len() == HISTORY_REPORTS {
            self.reports.pop_front();
        }
        self.reports.push_back(report);
        report
    }
}

#[derive(Default)]
pub(crate) struct Sessions {
    pub(crate) by_account: HashMap<AccountId, Session>,
    /// Every account's numbering since the journal began (rebuilt from it
    /// at start-up), whether or not a session is logged in.
    pub(crate) histories: HashMap<AccountId, History>,
    /// Report frames for the gateway to write, by connection.
    pub(crate) outbox: Vec<(u64, Vec<u8>)>,
    /// How many are logged in, for whoever shows it (market data's
    /// dashboard); set by the gateway as sessions come and go.
    pub(crate) logged_in: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Sessions {
    /// Publishes the number of logged-in sessions.
    pub(crate) fn count(&self) {
        self.logged_in.store(self.by_account.len(), std::sync::atomic::Ordering::Relaxed);
    }
}

/// A query's answer as frames: one message per asset or order, then
/// `QueryDone`.
fn answer_frames(answer: &Answer) -> Vec<u8> {
    let request = answer.query.request;
    let mut frames = Vec::new();
    let mut count = 0u32;
    match answer.query.kind {
        QueryKind::Heartbeat => {
            encode_server(&ServerMessage::Heartbeat, &mut frames);
            return frames;
        }
        QueryKind::Logout => {
            encode_server(&ServerMessage::Logout { reason: 0 }, &mut frames);
            return frames;
        }
        QueryKind::Balances => {
            for &(asset, available, locked) in &answer.balances {
                encode_server(&ServerMessage::Balance { request, asset, available, locked }, &mut frames);
                count += 1;
            }
        }
        QueryKind::OpenOrders { .. } => {
            for o in &answer.orders {
                let open = OpenOrder { request, order: o.id, cid: o.cid, instrument: o.instrument, side: o.side, price: o.price, qty: o.qty, cum_qty: o.filled, leaves_qty: o.qty - o.filled };
                encode_server(&ServerMessage::OpenOrder(open), &mut frames);
                count += 1;
            }
        }
    }
    encode_server(&ServerMessage::QueryDone { request, count, as_of: answer.seq }, &mut frames);
    frames
}

impl ReportSink for Sessions {
    /// Numbers every report for its account, and queues one buffer of
    /// frames per logged-in account (one write for all of a session's
    /// reports in the batch). Refusals of this gateway's orders go out
    /// unnumbered (sequence number 0).
    /// Every message goes out where it came in the sequence: a refusal
    /// or a query's answer after the reports of the commands before it
    /// and before those of the commands after it (one connection's
    /// messages in one batch reach it in the order they were sent).
    fn released(&mut self, batch: &Released<'_>) {
        let mut outgoing: HashMap<AccountId, Vec<u8>> = HashMap::new();
        // An answer goes with its account's reports when its connection is
        // the account's session (always, but for a session replaced since).
        let mut elsewhere: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut refused = batch.refused().filter(|r| r.source == BINARY).peekable();
        let mut answers = batch.answers().filter(|a| a.source == BINARY).peekable();
        // The refusals and answers that came before the command `upto`,
        // in the order they came (those between the same two commands
        // too).
        let mut before = |upto: u64, sessions: &Sessions, outgoing: &mut HashMap<AccountId, Vec<u8>>| loop {
            let refusal = refused.peek().filter(|r| r.after < upto).map(|r| r.arrived);
            let answer = answers.peek().filter(|a| a.seq < upto).map(|a| a.arrived);
            let refusal_first = match (refusal, answer) {
                (None, None) => break,
                (Some(refusal), Some(answer)) => refusal < answer,
                (refusal, _) => refusal.is_some(),
            };
            if refusal_first {
                let addressed = refused.next().expect("peeked").report;
                if sessions.by_account.contains_key(&addressed.account) {
                    encode_server(&ServerMessage::ExecutionReport(addressed.report), outgoing.entry(addressed.account).or_default());
                }
            } else {
                let answer = answers.next().expect("peeked");
                let frames = answer_frames(answer);
                match sessions.by_account.get(&answer.query.account) {
                    Some(session) if session.connection == answer.query.token => outgoing.entry(answer.query.account).or_default().extend_from_slice(&frames),
                    _ => elsewhere.push((answer.query.token, frames)),
                }
            }
        };
        for command in batch.durable() {
            before(command.seq, self, &mut outgoing);
            for addressed in command.reports {
                let report = self.histories.entry(addressed.account).or_default().record(addressed.report);
                if self.by_account.contains_key(&addressed.account) {
                    encode_server(&ServerMessage::ExecutionReport(report), outgoing.entry(addressed.account).or_default());
                }
            }
        }
        before(u64::MAX, self, &mut outgoing);
        for (account, frames) in outgoing {
            if let Some(session) = self.by_account.get(&account) {
                self.outbox.push((session.connection, frames));
            }
        }
        self.outbox.extend(elsewhere);
    }

    /// Numbers the reports as they were numbered live.
    fn recovered(&mut self, durable: &Durable<'_>) {
        for addressed in durable.reports {
            self.histories.entry(addressed.account).or_default().record(addressed.report);
        }
    }

    fn name(&self) -> &str {
        "binary"
    }

    /// Each account's last report number: the reports themselves are
    /// rebuilt from the journal after the snapshot.
    fn checkpoint(&mut self, _seq: u64) -> Option<Checkpoint> {
        let mut numbering: Vec<(AccountId, u64)> = self.histories.iter().map(|(account, history)| (*account, history.last)).collect();
        numbering.sort_unstable();
        let mut out = Vec::with_capacity(8 + 16 * numbering.len());
        out.extend_from_slice(&(numbering.len() as u64).to_le_bytes());
        for (account, last) in numbering {
            out.extend_from_slice(&account.to_le_bytes());
            out.extend_from_slice(&last.to_le_bytes());
        }
        Some(Checkpoint::Now(out))
    }

    fn reset(&mut self) {
        self.histories.clear();
    }

    fn restore(&mut self, state: &[u8]) -> Result<(), RestoreError> {
        let mut reader = Reader::new(state);
        let count = reader.count(true, 16)?;
        for _ in 0..count {
            let (account, last) = (reader.u64()?, reader.u64()?);
            self.histories.insert(account, History { last, reports: VecDeque::new() });
        }
        Ok(reader.end()?)
    }
}
