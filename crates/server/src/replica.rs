//! A replicated node (`docs/replication.md`): the command log is a NATS
//! JetStream stream (`crossbook_replication`), and this node either
//! **follows** it (applies every message to its own engine, journal and
//! gateways, serves the read side, refuses orders) or **leads** (takes
//! orders, appends each batch to the log, and releases a batch's reports
//! only once JetStream has acknowledged it: a quorum of the cluster holds
//! it).
//!
//! - **Start-up** (`reconcile`): the local journal is checked against the
//!   log: where they part (a deposed leader's last batches, which the log
//!   never took), the local journal is cut back and the log followed from
//!   there.
//! - **Taking the lead**: the lease thread takes the lease when nobody holds
//!   it and this node has applied the whole log; the sequencer then appends
//!   a leadership marker right after the last message it applied (refused
//!   if the log moved on: it applies what came and tries again). Once the
//!   marker is in, no earlier leader can append again (its appends name a
//!   stream position that is no longer the last), and this node takes
//!   orders.
//! - **Losing it**: an append refused because the log moved on, or the
//!   lease lost, stops the node at once (`ServeError::Deposed`): nothing
//!   more is acknowledged; started again, it follows.

use crate::ServeError;
use crate::log;
use crossbook_journal::{Recovered, recover, scan_chained_from, truncate_after};
use crossbook_replication::{Leader, Log};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the node's threads share: its role, the leader's addresses, the
/// lease thread's news.
pub(crate) struct NodeState {
    /// Orders are taken (not replicated, or leading).
    pub(crate) accepting: AtomicBool,
    /// Who leads, for the redirects of a follower.
    pub(crate) leader: Mutex<Option<Leader>>,
    /// The epoch (lease revision) to lead in, once the lease thread took
    /// the lease; 0: none.
    pub(crate) promote: AtomicU64,
    /// The lease was lost (or could not be renewed in time).
    pub(crate) lost: AtomicBool,
    /// The last stream message this node has applied.
    pub(crate) applied_stream: AtomicU64,
    /// This node leads (its marker is in the log).
    pub(crate) leading: AtomicBool,
    pub(crate) stop: AtomicBool,
    /// The last command market data has applied (the REST gateway's
    /// checks read its state); `u64::MAX`: no market data on this node.
    pub(crate) market_seq: AtomicU64,
    /// A node of a replicated venue (its history may be behind the log's).
    pub(crate) replicated: bool,
}

impl NodeState {
    pub(crate) fn new(accepting: bool) -> Arc<NodeState> {
        Arc::new(NodeState {
            accepting: AtomicBool::new(accepting),
            leader: Mutex::new(None),
            promote: AtomicU64::new(0),
            lost: AtomicBool::new(false),
            applied_stream: AtomicU64::new(0),
            leading: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            market_seq: AtomicU64::new(u64::MAX),
            replicated: !accepting,
        })
    }

    /// Market data (if this node has it) has applied every command up to
    /// `seq`.
    pub(crate) fn market_has(&self, seq: u64) -> bool {
        let market = self.market_seq.load(std::sync::atomic::Ordering::Acquire);
        market == u64::MAX || market >= seq
    }

    /// The leader's binary address, if a follower knows it.
    pub(crate) fn leader_binary(&self) -> Option<String> {
        self.leader.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|l| l.binary.clone()).filter(|a| !a.is_empty())
    }

    /// The leader's HTTP address, if a follower knows it.
    pub(crate) fn leader_rest(&self) -> Option<String> {
        self.leader.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|l| l.rest.clone()).filter(|a| !a.is_empty())
    }
}

/// The chain value of local record `seq` (0 for 0), read from the journal.
fn local_chain(dir: &Path, seq: u64) -> Result<Option<u32>, ServeError> {
    if seq == 0 {
        return Ok(Some(0));
    }
    let mut found = None;
    scan_chained_from(dir, seq, |at, _, crc| {
        if at == seq {
            found = Some(crc);
        }
        Ok(())
    })
    .map_err(ServeError::History)?;
    Ok(found)
}

/// Where a node's local journal and the log agree: the last command both
/// hold alike (`chain` values equal there: the chained checksum covers the
/// whole history before it).
fn agreed(dir: &Path, log: &Log, local_last: u64, local_chain_last: u32) -> Result<u64, ServeError> {
    let Some(last) = log.last()? else { return Ok(0) };
    let upto = local_last.min(last.span.last);
    if upto == 0 {
        return Ok(0);
    }
    // The usual case: the message holding `upto` agrees with the local
    // journal up to `upto`.
    if let Some(position) = log.holding(upto)? {
        let message = log.at(position.stream_seq)?;
        let before = position.span.first - 1;
        if local_chain(dir, before)? == Some(position.span.previous) {
            let mut chain = position.span.previous;
            let mut agree = before;
            let target = if upto == local_last { Some(local_chain_last) } else { local_chain(dir, upto)? };
            for record in message.records.iter().take_while(|r| r.seq <= upto) {
                // Re-chain the message's records to compare at `upto`.
                let mut encoder = crossbook_replication::batch::Encoder::new(record.seq, chain);
                encoder.push(record.seq, record.time_ms, &record.command, record.annex.as_deref());
                chain = encoder.span().chain;
                if record.seq == upto && Some(chain) == target {
                    agree = upto;
                }
            }
            if agree == upto {
                return Ok(upto);
            }
            // They part inside this message: keep what is before it.
            return Ok(before);
        }
    }
    // They part further back: the last message whose end agrees, by
    // bisection over the stream (agreement holds up to a point, then never
    // again).
    let (mut low, mut high, mut best) = (1u64, log.holding(upto)?.map_or(last.stream_seq, |p| p.stream_seq), 0u64);
    while low <= high {
        let middle = low + (high - low) / 2;
        let span = log.at(middle)?.span;
        if span.last > upto {
            high = middle - 1;
            continue;
        }
        if local_chain(dir, span.last)? == Some(span.chain) {
            best = best.max(span.last);
            low = middle + 1;
        } else {
            high = middle - 1;
        }
    }
    Ok(best)
}

/// Checks the local journal against the log, cuts it back to where they
/// agree if it holds what the log does not, and recovers again if it did.
pub(crate) fn reconcile(dir: &Path, log: &Log, recovered: Recovered) -> Result<Recovered, ServeError> {
    let local = recovered.engine.seq();
    if local == 0 {
        return Ok(recovered);
    }
    if log.last()?.is_none_or(|last| last.span.last == 0) {
        return Err(ServeError::Diverged(format!(
            "the log (stream {}) holds no command, but the local journal holds {local}: a new or another stream, or a wiped NATS cluster? To follow this log, start from an empty data directory",
            log.config().stream
        )));
    }
    let keep = agreed(dir, log, local, recovered.end.last_crc)?;
    if keep == local {
        return Ok(recovered);
    }
    if keep == 0 {
        return Err(ServeError::Diverged(format!(
            "the local journal and the log (stream {}) share no history: another venue's log? Nothing was cut; to follow this log, start from an empty data directory",
            log.config().stream
        )));
    }
    // What is cut is kept aside (never used again), for whoever wants to
    // see what a deposed leader had journaled.
    let aside = dir.join(format!("cut-after-{keep}"));
    std::fs::create_dir_all(&aside).map_err(ServeError::io(format!("creating {}", aside.display())))?;
    for entry in std::fs::read_dir(dir).map_err(ServeError::io(format!("listing {}", dir.display())))?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("segment-") {
            std::fs::copy(entry.path(), aside.join(&name)).map_err(ServeError::io(format!("copying {name} aside")))?;
        }
    }
    log_line(&format!(
        "replication: the local journal holds commands {}..={local} that the log does not (a deposed leader's last, never acknowledged): cutting it back to {keep} and following the log from there",
        keep + 1
    ));
    drop(recovered);
    truncate_after(dir, keep)?;
    let again = recover(dir).map_err(ServeError::Recovery)?;
    if again.engine.seq() != keep {
        return Err(ServeError::Diverged(format!("cut back to {keep}, the journal recovers to {}", again.engine.seq())));
    }
    Ok(again)
}

/// The stream message to read from, for a node whose engine is at `seq`:
/// the one holding `seq + 1` (its earlier records are skipped), or the one
/// after the message ending at `seq`.
pub(crate) fn read_from(log: &Log, seq: u64) -> Result<u64, ServeError> {
    if seq == 0 {
        return Ok(1);
    }
    match log.holding(seq)? {
        Some(position) if position.span.last > seq => Ok(position.stream_seq),
        Some(position) => Ok(position.stream_seq + 1),
        None => Err(ServeError::Diverged(format!("the log does not hold command {seq}, which the local journal has"))),
    }
}

/// The lease thread: a candidate takes the lease when nobody holds it and
/// this node has applied the whole log; the holder renews it every quarter
/// of its time to live (every 250 ms at most), and says when it is lost; every node keeps the
/// leader's addresses for redirects.
pub(crate) fn lease_thread(log: Arc<Log>, state: Arc<NodeState>, me: Leader, candidate: bool, ttl: Duration, wake: Arc<dyn Fn() + Send + Sync>) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new().name("replication-lease".into()).spawn(move || {
        let mut held: Option<(u64, Instant)> = None;
        let mut reading_failed = false;
        let mut renew_failing = false;
        let every = ttl / 4;
        let mut first = true;
        while !state.stop.load(Ordering::Acquire) {
            // The first look at once (a follower's clients want the
            // leader's address), then every quarter of the time to live.
            if !first {
                std::thread::sleep(every.min(Duration::from_millis(250)));
                if state.stop.load(Ordering::Acquire) {
                    break;
                }
            }
            first = false;
            match held {
                Some((revision, renewed)) => match log.renew_lease(&me, revision) {
                    Ok(Some(next)) => {
                        held = Some((next, Instant::now()));
                        renew_failing = false;
                    }
                    // Our revision is not the last: the lease ran out
                    // (NATS was unreachable, or electing, for longer than
                    // its time to live) or another node wrote it. Taken
                    // again if nobody holds it: this node is still the
                    // log's last writer (were it not, its next append would
                    // be refused, and it would step down then).
                    Ok(None) => match log.leader() {
                        // Ours still (a renewal that timed out here but
                        // was stored): go on from its revision.
                        Ok(Some((leader, next))) if leader.node == me.node => held = Some((next, Instant::now())),
                        Ok(Some((leader, _))) => {
                            log_line(&format!("replication: the lease was taken by node {} (revision {revision} is not the last)", leader.node));
                            state.lost.store(true, Ordering::Release);
                            wake();
                            return;
                        }
                        // Someone else has it now if this is refused: who
                        // is read at the next renewal, which fails the same
                        // way (another node's, this one steps down; ours, a
                        // write that timed out here was stored, it goes on;
                        // a store just back from losing its quorum may
                        // answer the two questions from different moments).
                        // Meanwhile the log's fence keeps a second writer
                        // out.
                        Ok(None) => {
                            if let Ok(Some(next)) = log.take_lease(&me) {
                                log_line(&format!("replication: the lease ran out after {} ms without a renewal; taken again (epoch {next})", renewed.elapsed().as_millis()));
                                held = Some((next, Instant::now()));
                            }
                        }
                        Err(_) => {}
                    },
                    // NATS unreachable (or electing): tried again. The log's
                    // fence, not the lease, keeps a second writer out.
                    Err(e) => {
                        if renewed.elapsed() >= ttl && !renew_failing {
                            log_line(&format!("replication: the lease not renewed for {} ms: {e}", renewed.elapsed().as_millis()));
                            renew_failing = true;
                        }
                        continue;
                    }
                },
                None => {
                    let current = match log.leader() {
                        Ok(current) => current,
                        Err(e) => {
                            if !reading_failed {
                                log_line(&format!("replication: reading the lease: {e}"));
                                reading_failed = true;
                            }
                            continue;
                        }
                    };
                    reading_failed = false;
                    *state.leader.lock().unwrap_or_else(|e| e.into_inner()) = current.as_ref().map(|(l, _)| l.clone());
                    if current.is_some() || !candidate {
                        continue;
                    }
                    // Nobody leads: take over once the whole log is applied.
                    let caught_up = match log.last() {
                        Ok(last) => last.is_none_or(|p| p.stream_seq <= state.applied_stream.load(Ordering::Acquire)),
                        Err(_) => false,
                    };
                    if !caught_up {
                        continue;
                    }
                    if let Ok(Some(revision)) = log.take_lease(&me) {
                        log_line(&format!("replication: took the lease (epoch {revision}); taking the lead"));
                        held = Some((revision, Instant::now()));
                        *state.leader.lock().unwrap_or_else(|e| e.into_inner()) = Some(me.clone());
                        state.promote.store(revision, Ordering::Release);
                        wake();
                    }
                }
            }
        }
        // A clean stop gives the lease up, so that a standby takes over at
        // once rather than when it runs out.
        if let Some((revision, _)) = held
            && state.leading.load(Ordering::Acquire)
        {
            log.release_lease(revision);
        }
    })
}

fn log_line(line: &str) {
    log(line);
}
