//! The replicated log on NATS JetStream, and the leader lease beside it.
//!
//! One stream (`<stream>`, subject `<stream>.log`, `replicas` copies, file
//! storage, kept for ever) holds the messages of `batch.rs`. Appends are
//! fenced with `Nats-Expected-Last-Sequence`: a writer says which stream
//! sequence number it expects to follow, so a writer that is no longer the
//! last one (another leader appended since) is refused (err_code 10071),
//! and stops. Each append carries a `Nats-Msg-Id` (`<node>-<epoch>-<first
//! command>`): a retry after a lost acknowledgement is recognised as a
//! duplicate, never written twice. (The stream-wide header, not the
//! per-subject one: on nats-server 2.9 a retry with the per-subject header
//! is refused instead of recognised.)
//!
//! The lease is a key-value bucket (`<stream>_LEASE`, history 1, the
//! bucket's `max_age` the lease's time to live, `replicas` copies) with one
//! key, `leader`: created by the node that takes the lead (refused if it
//! exists), kept alive by updates that name the revision they follow
//! (refused if another wrote since). The bucket's stream is made here
//! rather than with `create_key_value`, which on async-nats 0.41+ reads
//! account fields that nats-server 2.9 (Debian 12's) does not send.
//!
//! The API here is blocking (the server's threads are not async): a
//! tokio runtime of one worker thread runs the client and the background
//! tasks (the appender, the reader).

use crate::batch::{self, HEADER_CHAIN, HEADER_ENCODING, HEADER_LEADER, HEADER_PREVIOUS, HEADER_SEQ, Record, Span};
use crossbook_engine::codec::COMMAND_FORMAT_VERSION;
use async_nats::jetstream::{self, context::PublishErrorKind, kv, stream};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The largest message the appender writes (nats-server's default
/// `max_payload` is 1 MiB; headers come on top).
pub const MAX_MESSAGE: usize = 768 * 1024;
/// Messages of the appender's queue (each one sequencer batch).
const APPEND_QUEUE: usize = 4096;
/// Messages sent to JetStream and not yet acknowledged, at most.
const MAX_IN_FLIGHT: usize = 64;
/// Messages the reader may have delivered and not yet taken, at most...
const READ_QUEUE: usize = 1024;
/// ... and their payloads' kibibytes, at most (a follower catching up on
/// large batches holds 64 MiB of them read ahead, not 1,024 times
/// `MAX_MESSAGE`).
const READ_AHEAD_KIB: u32 = 64 * 1024;
/// How long an append or a read waits before it is retried.
const RETRY: Duration = Duration::from_millis(100);
/// The stream's window for recognising a retried message.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);
const LEASE_KEY: &str = "leader";

#[derive(Clone, Debug)]
pub struct Config {
    /// NATS servers (`nats://host:port`), any of the cluster.
    pub urls: Vec<String>,
    /// The stream's name (the subject is `<stream>.log`).
    pub stream: String,
    /// Copies of the stream and of the lease bucket (3 in a 3-node cluster).
    pub replicas: usize,
    /// The lease's time to live.
    pub lease_ttl: Duration,
    /// This node's name (unique in the cluster).
    pub node: String,
    /// How long to keep trying to reach NATS at start.
    pub connect_timeout: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplicationError {
    /// NATS could not be reached, or answered with an error.
    Nats(String),
    /// Another writer appended since: this node is no longer the leader.
    Deposed(String),
    /// A message that is not a well-formed, well-chained batch.
    Corrupt(String),
    /// A message written by a newer build: its commands are of an
    /// encoding this build does not read.
    Newer(String),
}

impl std::fmt::Display for ReplicationError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReplicationError::Nats(what) => write!(f, "NATS: {what}"),
            ReplicationError::Deposed(what) => write!(f, "deposed: {what}"),
            ReplicationError::Corrupt(what) => write!(f, "a corrupt log message: {what}"),
            ReplicationError::Newer(what) => write!(f, "a log message this build cannot read: {what}"),
        }
    }
}

impl std::error::Error for ReplicationError {}

/// Where a message is: its stream sequence number and what it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Position {
    pub stream_seq: u64,
    pub span: Span,
}

/// One message as a replica takes it.
#[derive(Clone, Debug)]
pub struct Delivered {
    pub stream_seq: u64,
    pub span: Span,
    pub records: Vec<Record>,
    /// A leadership marker's node.
    pub leader: Option<String>,
}

/// Who leads, as the lease says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Leader {
    pub node: String,
    /// Its binary-protocol address (where clients send orders).
    pub binary: String,
    /// Its HTTP address (market data and the REST API), or empty.
    pub rest: String,
}

pub struct Log {
    runtime: tokio::runtime::Runtime,
    target: Target,
    js: jetstream::Context,
    stream_name: String,
    subject: String,
    lease: kv::Store,
    config: Config,
}

fn span_of(headers: Option<&async_nats::HeaderMap>) -> Result<(Span, Option<String>), ReplicationError> {
    let headers = headers.ok_or_else(|| ReplicationError::Corrupt("a message without headers".into()))?;
    let get = |name: &str| headers.get(name).map(|v| v.as_str().to_string()).ok_or_else(|| ReplicationError::Corrupt(format!("no {name} header")));
    let span = Span::parse(&get(HEADER_SEQ)?, &get(HEADER_PREVIOUS)?, &get(HEADER_CHAIN)?).ok_or_else(|| ReplicationError::Corrupt("bad Crossbook headers".into()))?;
    Ok((span, headers.get(HEADER_LEADER).map(|v| v.as_str().to_string())))
}

fn deliver(stream_seq: u64, headers: Option<&async_nats::HeaderMap>, payload: &[u8]) -> Result<Delivered, ReplicationError> {
    // Messages from before the header: encodings up to 2.
    let encoding = headers.and_then(|h| h.get(HEADER_ENCODING)).map(|v| v.as_str().parse::<u32>().ok());
    match encoding {
        Some(Some(encoding)) if encoding > COMMAND_FORMAT_VERSION => {
            return Err(ReplicationError::Newer(format!(
                "stream message {stream_seq} holds commands of encoding {encoding}, and this build reads up to {COMMAND_FORMAT_VERSION}: upgrade this node (docs/replication.md)"
            )));
        }
        Some(None) => return Err(ReplicationError::Corrupt(format!("stream message {stream_seq}: a {HEADER_ENCODING} header that is not a number"))),
        _ => {}
    }
    let (span, leader) = span_of(headers).map_err(|e| match e {
        ReplicationError::Corrupt(what) => ReplicationError::Corrupt(format!("stream message {stream_seq}: {what}")),
        other => other,
    })?;
    let records = batch::decode(&span, payload).map_err(|e| ReplicationError::Corrupt(format!("stream message {stream_seq}: {e}")))?;
    Ok(Delivered { stream_seq, span, records, leader })
}

/// Says on standard error, the first time, that the start is waiting for
/// NATS, why, and for how long more.
fn waiting(said: &mut bool, why: &str, deadline: Instant) {
    if !std::mem::replace(said, true) {
        let left = deadline.saturating_duration_since(Instant::now()).as_secs_f64();
        eprintln!("replication: waiting: {why}; trying again for up to {left:.0} s (connect_timeout_s)");
    }
}

impl Log {
    /// Connects (trying for `connect_timeout`), and makes the stream and
    /// the lease bucket if they are not there.
    pub fn connect(config: Config) -> Result<Log, ReplicationError> {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).thread_name("nats").enable_all().build().map_err(|e| ReplicationError::Nats(format!("starting the NATS runtime: {e}")))?;
        let stream_name = config.stream.clone();
        let subject = format!("{}.log", config.stream);
        let (js, lease) = runtime.block_on(async {
            let deadline = Instant::now() + config.connect_timeout;
            // An operator hears once what the start waits for, not only
            // when `connect_timeout_s` is up.
            let mut said = false;
            let client = loop {
                let options = async_nats::ConnectOptions::new().name(&config.node).max_reconnects(None).connection_timeout(Duration::from_secs(2));
                match options.connect(config.urls.clone()).await {
                    Ok(client) => break client,
                    Err(e) if Instant::now() < deadline => {
                        waiting(&mut said, &format!("no NATS server answers at {:?} ({e})", config.urls), deadline);
                        tokio::time::sleep(RETRY * 5).await;
                    }
                    Err(e) => return Err(ReplicationError::Nats(format!("connecting to {:?}: {e}", config.urls))),
                }
            };
            let js = jetstream::context::ContextBuilder::new().timeout(Duration::from_secs(5)).build(client);
            // JetStream answers once the cluster has a meta leader.
            let stream_config = stream::Config {
                name: stream_name.clone(),
                subjects: vec![subject.clone()],
                num_replicas: config.replicas,
                duplicate_window: DUPLICATE_WINDOW,
                storage: stream::StorageType::File,
                retention: stream::RetentionPolicy::Limits,
                discard: stream::DiscardPolicy::Old,
                ..Default::default()
            };
            let bucket = format!("{stream_name}_LEASE");
            let lease_config = stream::Config {
                name: format!("KV_{bucket}"),
                subjects: vec![format!("$KV.{bucket}.>")],
                max_messages_per_subject: 1,
                max_age: config.lease_ttl,
                storage: stream::StorageType::File,
                num_replicas: config.replicas,
                discard: stream::DiscardPolicy::New,
                allow_rollup: true,
                deny_delete: true,
                allow_direct: true,
                ..Default::default()
            };
            loop {
                // Each try within what is left of `connect_timeout_s` (a
                // JetStream without a quorum answers nothing until its
                // requests time out, which would take longer).
                let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(500));
                let made = async {
                    js.get_or_create_stream(stream_config.clone()).await.map_err(|e| e.to_string())?;
                    let existing = js.get_or_create_stream(lease_config.clone()).await.map_err(|e| e.to_string())?;
                    // A venue whose `lease_ttl_ms` changed since the bucket
                    // was made: the bucket follows it (a lease that lived
                    // longer than the nodes renew it would lapse, or one
                    // that lived shorter slow every failover).
                    if existing.cached_info().config.max_age != config.lease_ttl {
                        js.update_stream(lease_config.clone()).await.map_err(|e| format!("setting the lease bucket's max_age to lease_ttl_ms: {e}"))?;
                    }
                    js.get_key_value(bucket.clone()).await.map_err(|e| e.to_string())
                };
                let made = tokio::time::timeout(left, made).await.unwrap_or_else(|_| Err(format!("JetStream did not answer within {:.1} s", left.as_secs_f64())));
                match made {
                    Ok(lease) => break Ok((js, lease)),
                    Err(e) if Instant::now() < deadline => {
                        waiting(&mut said, &format!("NATS has not made the stream {stream_name} and its lease bucket yet ({e})"), deadline);
                        tokio::time::sleep(RETRY * 5).await;
                    }
                    Err(e) => break Err(ReplicationError::Nats(format!("making the stream {stream_name} and its lease bucket: {e}"))),
                }
            }
        })?;
        let target = Target { js: js.clone(), stream: stream_name.clone(), subject: subject.clone(), node: config.node.clone() };
        Ok(Log { runtime, target, js, stream_name, subject, lease, config })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    async fn stream(&self) -> Result<stream::Stream, ReplicationError> {
        self.js.get_stream(&self.stream_name).await.map_err(|e| ReplicationError::Nats(format!("stream {}: {e}", self.stream_name)))
    }

    async fn message(&self, stream: &stream::Stream, seq: u64) -> Result<Delivered, ReplicationError> {
        let message = stream.get_raw_message(seq).await.map_err(|e| {
            if unreadable(&e) {
                // There, and not a message any node of ours wrote.
                ReplicationError::Corrupt(format!("stream message {seq}: it cannot be read ({e})"))
            } else {
                ReplicationError::Nats(format!("message {seq}: {e}"))
            }
        })?;
        deliver(seq, Some(&message.headers), &message.payload)
    }

    /// The last message of the log, if any.
    pub fn last(&self) -> Result<Option<Position>, ReplicationError> {
        self.runtime.block_on(async {
            let stream = self.stream().await?;
            let info = stream.get_info().await.map_err(|e| ReplicationError::Nats(format!("stream info: {e}")))?;
            let last = info.state.last_sequence;
            if last == 0 {
                return Ok(None);
            }
            let message = self.message(&stream, last).await?;
            Ok(Some(Position { stream_seq: last, span: message.span }))
        })
    }

    /// The message at a stream sequence number.
    pub fn at(&self, stream_seq: u64) -> Result<Delivered, ReplicationError> {
        self.runtime.block_on(async {
            let stream = self.stream().await?;
            self.message(&stream, stream_seq).await
        })
    }

    /// The message that holds command `seq` (by bisection over the stream:
    /// log(messages) reads); `None` past the log's end.
    pub fn holding(&self, seq: u64) -> Result<Option<Position>, ReplicationError> {
        self.runtime.block_on(async {
            let stream = self.stream().await?;
            let info = stream.get_info().await.map_err(|e| ReplicationError::Nats(format!("stream info: {e}")))?;
            let (mut low, mut high) = (info.state.first_sequence.max(1), info.state.last_sequence);
            while low <= high && high > 0 {
                let middle = low + (high - low) / 2;
                let span = self.message(&stream, middle).await?.span;
                if seq < span.first {
                    high = middle - 1;
                } else if seq > span.last {
                    low = middle + 1;
                } else {
                    return Ok(Some(Position { stream_seq: middle, span }));
                }
            }
            Ok(None)
        })
    }

    /// Appends a leadership marker after stream message `after` (the last
    /// this node has applied, its chain value `chain` and last command
    /// `last_command`): from then on, only this node's appends follow.
    /// `Ok(None)` if the log has moved on meanwhile (apply what came, and
    /// try again).
    pub fn mark_leader(&self, epoch: u64, after: u64, last_command: u64, chain: u32) -> Result<Option<u64>, ReplicationError> {
        let span = Span { first: last_command + 1, last: last_command, previous: chain, chain };
        // An id of its own per attempt: an earlier attempt's answer says
        // nothing of this one.
        let id = format!("{}-{epoch}-lead-{after}", self.config.node);
        let patience = self.config.lease_ttl.max(Duration::from_secs(1));
        self.runtime.block_on(async {
            // Bounded: without a quorum the caller (the server's event loop)
            // must not wait here; it tries again.
            match tokio::time::timeout(patience, append(&self.target, &id, after, &span, Vec::new(), true)).await {
                Ok(Ok(seq)) => Ok(Some(seq)),
                Ok(Err(ReplicationError::Deposed(_))) => Ok(None),
                Ok(Err(e)) => Err(e),
                Err(_) => Err(ReplicationError::Nats(format!("the marker was not acknowledged within {} ms", patience.as_millis()))),
            }
        })
    }

    /// Starts the appender: messages follow stream message `after`.
    pub fn appender(&self, epoch: u64, after: u64, acked_command: u64, wake: Arc<dyn Fn() + Send + Sync>) -> Appender {
        let (queue, mut incoming) = tokio::sync::mpsc::channel::<(batch::Encoder, Instant)>(APPEND_QUEUE);
        let shared = Arc::new(AppendState {
            acked: AtomicU64::new(acked_command),
            failed: std::sync::Mutex::new(None),
            stopped: AtomicBool::new(false),
            waited: std::sync::Mutex::new(micros()),
            round_trips: std::sync::Mutex::new(micros()),
        });
        let state = shared.clone();
        let target = self.target.clone();
        self.runtime.spawn(async move {
            let fail = |e: ReplicationError| {
                *state.failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                state.stopped.store(true, Ordering::Release);
                wake();
            };
            // The last stream message known to be ours and in place; the
            // messages sent after it, acknowledgement awaited, oldest first,
            // with when their oldest batch was submitted and when they were
            // sent; a batch taken from the queue that did not fit the last
            // message.
            let mut confirmed = after;
            let mut in_flight: std::collections::VecDeque<(Span, String, Vec<u8>, AckFuture)> = std::collections::VecDeque::new();
            let mut times: std::collections::VecDeque<(Instant, Instant)> = std::collections::VecDeque::new();
            let mut carry: Option<(batch::Encoder, Instant)> = None;
            let mut open = true;
            loop {
                if !open && in_flight.is_empty() && carry.is_none() {
                    return;
                }
                // A message to send, if there is room in flight and a batch.
                if in_flight.len() < MAX_IN_FLIGHT {
                    let first = match carry.take() {
                        Some(batch) => Some(batch),
                        None => match incoming.try_recv() {
                            Ok(batch) => Some(batch),
                            Err(tokio::sync::mpsc::error::TryRecvError::Empty) => None,
                            Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => {
                                open = false;
                                None
                            }
                        },
                    };
                    if let Some((mut message, submitted)) = first {
                        // What is queued behind it goes in the same message
                        // (group commit at the log's level), as long as it
                        // fits.
                        while let Ok((next, at)) = incoming.try_recv() {
                            if message.payload.len() + next.payload.len() > MAX_MESSAGE {
                                carry = Some((next, at));
                                break;
                            }
                            message.extend(&next);
                        }
                        let sent = Instant::now();
                        let span = message.span();
                        let id = format!("{}-{epoch}-{}", target.node, span.first);
                        // Pipelined: each names the stream position it
                        // must follow and, behind another in flight, that
                        // one's id. The position alone is no fence here:
                        // were the one before refused because another
                        // leader's marker took its place, this one would
                        // follow the marker's position and be stored,
                        // after the marker, by a writer that lost the lead
                        // (it learns of the refusal only once this is sent).
                        // The id ties it to its own predecessor, which a
                        // marker is not. (Not on the first in flight: its
                        // predecessor was confirmed, perhaps long ago, and a
                        // restarted NATS server knows the last id only if
                        // it is within the duplicates window.)
                        let expected = confirmed + in_flight.len() as u64;
                        let previous = in_flight.back().map(|(_, id, ..)| id.as_str());
                        match publish(&target, &id, expected, previous, &span, &message.payload, false).await {
                            Ok(future) => {
                                in_flight.push_back((span, id, message.payload, future));
                                times.push_back((submitted, sent));
                            }
                            Err(_) => {
                                // Not even sent: the same recovery as a
                                // failed acknowledgement, this one last.
                                times.clear();
                                let mut pending: Vec<(Span, String, Vec<u8>)> = in_flight.drain(..).map(|(span, id, payload, _)| (span, id, payload)).collect();
                                pending.push((span, id, message.payload));
                                match resend(&target, confirmed, pending, &state, &wake).await {
                                    Ok(seq) => confirmed = seq,
                                    Err(e) => return fail(e),
                                }
                            }
                        }
                        continue;
                    }
                }
                tokio::select! {
                    biased;
                    acked = async { in_flight.front_mut().expect("awaited only when some are in flight").3.as_mut().await }, if !in_flight.is_empty() => {
                        match acked {
                            Ok(ack) if ack.sequence == confirmed + 1 => {
                                confirmed = ack.sequence;
                                let (span, ..) = in_flight.pop_front().expect("the front");
                                state.acked.store(span.last, Ordering::Release);
                                wake();
                                if let Some((submitted, sent)) = times.pop_front() {
                                    state.record(submitted, sent);
                                }
                            }
                            // Anything else (a lost acknowledgement, no
                            // stream leader for a moment, no quorum, the
                            // log moved on): the messages in flight are
                            // sent again one by one after the last one
                            // confirmed, with their ids (those the stream
                            // already has are recognised, not stored twice),
                            // and a writer that lost the lead finds out.
                            _ => {
                                times.clear();
                                let pending: Vec<(Span, String, Vec<u8>)> = in_flight.drain(..).map(|(span, id, payload, _)| (span, id, payload)).collect();
                                match resend(&target, confirmed, pending, &state, &wake).await {
                                    Ok(seq) => confirmed = seq,
                                    Err(e) => return fail(e),
                                }
                            }
                        }
                    }
                    next = incoming.recv(), if open && in_flight.len() < MAX_IN_FLIGHT => {
                        match next {
                            Some(batch) => carry = Some(batch),
                            None => open = false,
                        }
                    }
                }
            }
        });
        Appender { queue, state: shared }
    }

    /// Starts reading messages from stream sequence number `from` into a
    /// queue the caller takes from (`Reader::next`); `wake` is called when
    /// messages wait.
    pub fn reader(&self, from: u64, wake: Arc<dyn Fn() + Send + Sync>) -> Reader {
        let (sender, receiver) = tokio::sync::mpsc::channel::<(Result<Delivered, ReplicationError>, tokio::sync::OwnedSemaphorePermit)>(READ_QUEUE);
        let budget = Arc::new(tokio::sync::Semaphore::new(READ_AHEAD_KIB as usize));
        let (js, name, subject) = (self.js.clone(), self.stream_name.clone(), self.subject.clone());
        let task = self.runtime.spawn(async move {
            let mut next = from;
            loop {
                let consumer = async {
                    let stream = js.get_stream(&name).await.map_err(|e| e.to_string())?;
                    let config = jetstream::consumer::pull::OrderedConfig {
                        filter_subject: subject.clone(),
                        deliver_policy: jetstream::consumer::DeliverPolicy::ByStartSequence { start_sequence: next },
                        ..Default::default()
                    };
                    let consumer = stream.create_consumer(config).await.map_err(|e| e.to_string())?;
                    consumer.messages().await.map_err(|e| e.to_string())
                }
                .await;
                let mut messages = match consumer {
                    Ok(messages) => messages,
                    Err(_) => {
                        tokio::time::sleep(RETRY * 5).await;
                        continue;
                    }
                };
                while let Some(message) = messages.next().await {
                    let Ok(message) = message else { break };
                    let Ok(info) = message.info().map(|i| i.stream_sequence) else { break };
                    if info < next {
                        continue;
                    }
                    let delivered = deliver(info, message.headers.as_ref(), &message.payload);
                    let failed = delivered.is_err();
                    // Held until the message is taken (`Reader::try_next`).
                    let kib = u32::try_from(message.payload.len().div_ceil(1024)).unwrap_or(u32::MAX).clamp(1, READ_AHEAD_KIB);
                    let Ok(permit) = budget.clone().acquire_many_owned(kib).await else { return };
                    if sender.send((delivered, permit)).await.is_err() {
                        return;
                    }
                    wake();
                    if failed {
                        return;
                    }
                    next = info + 1;
                }
                // The consumer ended (a NATS node went, a reconnect): a new
                // one goes on from the next message.
                tokio::time::sleep(RETRY).await;
            }
        });
        Reader { receiver, task }
    }

    // ---- the lease ---------------------------------------------------------

    /// Who leads now, and the lease's revision; `None` if nobody does (the
    /// key is absent, or its time to live ran out).
    pub fn leader(&self) -> Result<Option<(Leader, u64)>, ReplicationError> {
        self.runtime.block_on(async {
            let entry = self.lease.entry(LEASE_KEY).await.map_err(|e| ReplicationError::Nats(format!("reading the lease: {e}")))?;
            Ok(entry.filter(|e| e.operation == kv::Operation::Put).and_then(|e| serde_json::from_slice::<Leader>(&e.value).ok().map(|l| (l, e.revision))))
        })
    }

    /// Takes the lease if nobody holds it: `Some(revision)` (the epoch of
    /// this leadership).
    pub fn take_lease(&self, me: &Leader) -> Result<Option<u64>, ReplicationError> {
        let value = serde_json::to_vec(me).map_err(|e| ReplicationError::Nats(format!("encoding the lease: {e}")))?;
        self.runtime.block_on(async {
            match self.lease.create(LEASE_KEY, value.into()).await {
                Ok(revision) => Ok(Some(revision)),
                Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => Ok(None),
                Err(e) => Err(ReplicationError::Nats(format!("taking the lease: {e}"))),
            }
        })
    }

    /// Renews the lease held at `revision`: the new revision, or `None` if
    /// another node wrote it since (the lease is lost).
    pub fn renew_lease(&self, me: &Leader, revision: u64) -> Result<Option<u64>, ReplicationError> {
        let value = serde_json::to_vec(me).map_err(|e| ReplicationError::Nats(format!("encoding the lease: {e}")))?;
        self.runtime.block_on(async {
            match self.lease.update(LEASE_KEY, value.into(), revision).await {
                Ok(revision) => Ok(Some(revision)),
                Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => Ok(None),
                Err(e) => Err(ReplicationError::Nats(format!("renewing the lease: {e}"))),
            }
        })
    }

    /// Gives the lease up (a clean stop), if it is still ours.
    pub fn release_lease(&self, revision: u64) {
        self.runtime.block_on(async {
            let _ = self.lease.delete_expect_revision(LEASE_KEY, Some(revision)).await;
        });
    }
}

/// Where appends go.
#[derive(Clone)]
struct Target {
    js: jetstream::Context,
    stream: String,
    subject: String,
    node: String,
}

type AckFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Result<jetstream::publish::PublishAck, jetstream::context::PublishError>> + Send>>;

/// Sends one message after stream message `after` (whose id is
/// `previous`, if given), without waiting for its acknowledgement.
#[allow(clippy::too_many_arguments)]
async fn publish(target: &Target, id: &str, after: u64, previous: Option<&str>, span: &Span, payload: &[u8], marker: bool) -> Result<AckFuture, jetstream::context::PublishError> {
    let mut message = jetstream::message::PublishMessage::build()
        .payload(bytes::Bytes::copy_from_slice(payload))
        .message_id(id)
        .expected_last_sequence(after);
    if let Some(previous) = previous {
        message = message.expected_last_message_id(previous);
    }
    message = message
        .header(HEADER_SEQ, span.seq_header().as_str())
        .header(HEADER_PREVIOUS, span.previous.to_string().as_str())
        .header(HEADER_CHAIN, span.chain.to_string().as_str())
        .header(HEADER_ENCODING, COMMAND_FORMAT_VERSION.to_string().as_str());
    if marker {
        message = message.header(HEADER_LEADER, target.node.as_str());
    }
    let future = target.js.send_publish(target.subject.clone(), message).await?;
    Ok(std::future::IntoFuture::into_future(future))
}

/// Publishes one message after stream message `after`, retrying what may
/// be retried (no stream leader for a moment, a lost acknowledgement, no
/// quorum) with the same message id, so that it is written once; refused
/// for good (`Deposed`) when the log has moved on past `after`.
#[allow(clippy::too_many_arguments)]
async fn append(target: &Target, id: &str, after: u64, span: &Span, payload: Vec<u8>, marker: bool) -> Result<u64, ReplicationError> {
    loop {
        let acked = match publish(target, id, after, None, span, &payload, marker).await {
            Ok(future) => future.await,
            Err(e) => Err(e),
        };
        match acked {
            Ok(ack) if ack.sequence == after + 1 => return Ok(ack.sequence),
            Err(e) if e.kind() == PublishErrorKind::MaxPayloadExceeded => return Err(ReplicationError::Nats(format!("a message of {} bytes: {e}", payload.len()))),
            // Stored elsewhere than right after `after` (a duplicate
            // answered with another position), or refused because the log
            // moved on: whose message is right after `after` says which.
            Ok(_) => {}
            Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => {}
            Err(_) => {
                tokio::time::sleep(RETRY).await;
                continue;
            }
        }
        match settle(target, id, after).await {
            Settled::Ours => return Ok(after + 1),
            Settled::Theirs => return Err(ReplicationError::Deposed(format!("the log has moved on past stream message {after}: another node leads"))),
            Settled::Unknown => tokio::time::sleep(RETRY).await,
        }
    }
}

enum Settled {
    Ours,
    Theirs,
    Unknown,
}

/// Whose message follows stream message `after`: ours (its id is `id`),
/// another writer's, or none yet (or NATS not answering).
async fn settle(target: &Target, id: &str, after: u64) -> Settled {
    let Ok(stream) = target.js.get_stream(&target.stream).await else { return Settled::Unknown };
    match stream.get_raw_message(after + 1).await {
        Ok(message) => match message.headers.get(async_nats::header::NATS_MESSAGE_ID) {
            Some(theirs) if theirs.as_str() == id => Settled::Ours,
            _ => Settled::Theirs,
        },
        // There, but its headers cannot be read: not ours (ours always
        // can be), so another writer's. Asked again only when NATS did not
        // answer (or has no such message yet).
        Err(e) if unreadable(&e) => Settled::Theirs,
        Err(_) => Settled::Unknown,
    }
}

/// Whether getting a stream message failed on the message itself (NATS
/// answered with it, and it could not be decoded), not on the request.
fn unreadable(error: &async_nats::jetstream::stream::RawMessageError) -> bool {
    use async_nats::jetstream::stream::RawMessageErrorKind;
    matches!(error.kind(), RawMessageErrorKind::Other)
        && std::error::Error::source(error).is_none_or(|source| source.downcast_ref::<async_nats::jetstream::context::RequestError>().is_none())
}

/// Sends `pending` again one by one after stream message `confirmed`, with
/// their ids (a message already stored is recognised, not stored twice);
/// the last stream message confirmed.
async fn resend(target: &Target, mut confirmed: u64, pending: Vec<(Span, String, Vec<u8>)>, state: &AppendState, wake: &Arc<dyn Fn() + Send + Sync>) -> Result<u64, ReplicationError> {
    for (span, id, payload) in pending {
        confirmed = append(target, &id, confirmed, &span, payload, false).await?;
        state.acked.store(span.last, Ordering::Release);
        wake();
    }
    Ok(confirmed)
}

struct AppendState {
    acked: AtomicU64,
    failed: std::sync::Mutex<Option<ReplicationError>>,
    stopped: AtomicBool,
    /// Per message: from its oldest batch's submission to the quorum's
    /// acknowledgement, and from its sending to it (microseconds).
    waited: std::sync::Mutex<hdrhistogram::Histogram<u64>>,
    round_trips: std::sync::Mutex<hdrhistogram::Histogram<u64>>,
}

fn micros() -> hdrhistogram::Histogram<u64> {
    hdrhistogram::Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

impl AppendState {
    fn record(&self, submitted: Instant, sent: Instant) {
        let micros = |since: Instant| since.elapsed().as_micros() as u64;
        self.waited.lock().unwrap_or_else(|p| p.into_inner()).saturating_record(micros(submitted).max(1));
        self.round_trips.lock().unwrap_or_else(|p| p.into_inner()).saturating_record(micros(sent).max(1));
    }
}

/// The leader's side of the log: batches in, the last command JetStream
/// has acknowledged (a quorum holds it) out.
pub struct Appender {
    queue: tokio::sync::mpsc::Sender<(batch::Encoder, Instant)>,
    state: Arc<AppendState>,
}

impl Appender {
    /// Queues a batch's records (waits while the queue is full).
    pub fn submit(&self, records: batch::Encoder) -> Result<(), ReplicationError> {
        if let Some(failure) = self.failure() {
            return Err(failure);
        }
        self.queue.blocking_send((records, Instant::now())).map_err(|_| self.failure().unwrap_or_else(|| ReplicationError::Nats("the appender stopped".into())))
    }

    /// The last command a quorum holds.
    pub fn acked(&self) -> u64 {
        self.state.acked.load(Ordering::Acquire)
    }

    /// What the appender measured, one line: messages, batch submission to
    /// quorum acknowledgement, and the round trip of a message alone.
    pub fn figures(&self) -> String {
        let waited = self.state.waited.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let trips = self.state.round_trips.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let q = |h: &hdrhistogram::Histogram<u64>, p: f64| if h.is_empty() { 0 } else { h.value_at_quantile(p) };
        format!(
            "{} messages; submitted to acknowledged by a quorum p50 {} p99 {} p99.9 {} max {} us; sent to acknowledged p50 {} p99 {} us",
            waited.len(),
            q(&waited, 0.5),
            q(&waited, 0.99),
            q(&waited, 0.999),
            waited.max(),
            q(&trips, 0.5),
            q(&trips, 0.99)
        )
    }

    pub fn failure(&self) -> Option<ReplicationError> {
        if !self.state.stopped.load(Ordering::Acquire) {
            return None;
        }
        self.state.failed.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// A replica's side: the messages after a point, in order.
pub struct Reader {
    /// Each message with its share of the read-ahead budget, given back
    /// as it is taken.
    receiver: tokio::sync::mpsc::Receiver<(Result<Delivered, ReplicationError>, tokio::sync::OwnedSemaphorePermit)>,
    task: tokio::task::JoinHandle<()>,
}

impl Reader {
    /// The next message, if one is waiting.
    pub fn try_next(&mut self) -> Option<Result<Delivered, ReplicationError>> {
        match self.receiver.try_recv() {
            Ok((message, _budget)) => Some(message),
            Err(tokio::sync::mpsc::error::TryRecvError::Empty) => None,
            Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => Some(Err(ReplicationError::Nats("the log's reader stopped".into()))),
        }
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(encoding: Option<&str>) -> async_nats::HeaderMap {
        let mut headers = async_nats::HeaderMap::new();
        if let Some(encoding) = encoding {
            headers.insert(HEADER_ENCODING, encoding);
        }
        headers
    }

    /// A message of a newer command encoding stops the reader with what
    /// to do; one of this encoding, or from before the header, is read on
    /// (here to the missing span, which is the next check).
    #[test]
    fn a_newer_encoding_is_refused_not_misread() {
        let newer = (COMMAND_FORMAT_VERSION + 1).to_string();
        assert!(matches!(deliver(7, Some(&headers(Some(&newer))), b""), Err(ReplicationError::Newer(why)) if why.contains("upgrade this node")));
        assert!(matches!(deliver(7, Some(&headers(Some("three"))), b""), Err(ReplicationError::Corrupt(_))));
        for read_on in [Some(COMMAND_FORMAT_VERSION.to_string()), Some("2".to_string()), None] {
            let result = deliver(7, Some(&headers(read_on.as_deref())), b"");
            assert!(matches!(&result, Err(ReplicationError::Corrupt(why)) if why.contains("Crossbook-Seq")), "{read_on:?}: {:?}", result.err());
        }
    }
}
