//! The load generator behind `crossbook load`, for `crossbook serve`.
//!
//! N sessions (accounts 1..=N, with the keys the caller gives: the
//! server's demo credentials for `crossbook load`) send
//! limit orders around a fixed mid: half GTC at passive prices that rest,
//! half IOC at prices that cross, so orders trade with other sessions. All
//! sessions run on one thread: each round writes everything each session
//! has due in one write, then waits for replies on all of them (no locks,
//! no hand-offs, as little CPU taken from the server as possible).
//!
//! - Closed loop (no `--rate`): each session keeps `--window` orders
//!   outstanding (sent, not yet acknowledged).
//! - Open loop (`--rate R`, orders per second over all sessions): orders
//!   are due on a fixed schedule and latency is measured from the *planned*
//!   send time, so a stall in the server (or in the sender) shows up in the
//!   figures instead of being hidden (coordinated omission).
//!
//! Latency: order to acknowledgement (accepted or rejected), and, for the
//! orders that cross (IOC), order to the first fill report, into HDR
//! histograms.

mod rest;
pub mod watch;

use anyhow::{Context, Result, bail};
use crossbook_engine::{OrderType, SelfTradePrevention, Side, TimeInForce};
use crossbook_protocol::*;
use hdrhistogram::Histogram;
use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct Options {
    pub address: String,
    pub connections: u64,
    /// The API key (binary, REST) or Password (FIX) of account `n` at
    /// `n - 1`; at least `connections` of them.
    pub keys: Vec<String>,
    /// The REST signing secret of account `n` at `n - 1` (`Protocol::Rest`,
    /// `Protocol::WsApi`).
    pub secrets: Vec<String>,
    pub duration: Duration,
    pub rate: Option<f64>,
    pub window: u64,
    pub json: bool,
    /// Write `order cid` of every acknowledged order here (for crash tests).
    pub acked_out: Option<std::path::PathBuf>,
    /// Write `account last_seq` for every session here: the last report
    /// sequence number each saw (for crash tests).
    pub last_seen_out: Option<std::path::PathBuf>,
    pub protocol: Protocol,
    /// Session `i` (from 0) is account `first_account + i`.
    pub first_account: u64,
    /// Stop sending after this many orders in all (and at the latest after
    /// `duration`).
    pub count: Option<u64>,
}

/// The workloads `crossbook load` can drive (`--workload`).
pub const WORKLOADS: &[&str] = &["cross-rest"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Binary,
    Fix,
    /// Binance's signed `POST /api/v3/order` (`docs/trading.md`).
    Rest,
    /// Binance's WebSocket API `order.place` (`/ws-api/v3`,
    /// `docs/trading.md`).
    WsApi,
}

/// What the load generator needs of a report, whichever protocol.
#[derive(Clone, Debug)]
struct Reply {
    kind: ReportKind,
    cid: u64,
    order: u64,
    /// The session sequence number (binary protocol; 0 over FIX).
    seq: u64,
    /// A rejection's reason as the protocol says it (the binary reason's
    /// name, FIX's OrdRejReason); empty otherwise.
    why: String,
}

/// The protocol a session speaks: how an order and a cancel are written
/// and a report read.
trait Wire {
    fn order(&mut self, order: &NewOrder, out: &mut Vec<u8>);
    fn cancel(&mut self, order: u64, cid: u64, out: &mut Vec<u8>);
    /// The next reply in `buffer` and the bytes it took; `Ok(None)` for
    /// more bytes needed, `Err` for a broken stream. A message that is not
    /// a report comes back as `Some((None, n))`.
    fn decode(&mut self, buffer: &[u8]) -> Result<Option<(Option<Reply>, usize)>, String>;
}

struct BinaryWire;

impl Wire for BinaryWire {
    fn order(&mut self, order: &NewOrder, out: &mut Vec<u8>) {
        encode_client(&ClientMessage::NewOrder(*order), out);
    }

    fn cancel(&mut self, order: u64, _cid: u64, out: &mut Vec<u8>) {
        encode_client(&ClientMessage::Cancel { order }, out);
    }

    fn decode(&mut self, buffer: &[u8]) -> Result<Option<(Option<Reply>, usize)>, String> {
        match decode_server(buffer, 1 << 16) {
            Ok(Decoded::Message(ServerMessage::ExecutionReport(r), size)) => {
                let why = r.refusal().map_or_else(String::new, |refusal| refusal.name().to_string());
                Ok(Some((Some(Reply { kind: r.kind, cid: r.cid, order: r.order, seq: r.seq, why }), size)))
            }
            Ok(Decoded::Message(ServerMessage::Error { reason } | ServerMessage::LoginRejected { reason }, _)) => Err(format!("the server ended the session: Error {reason}")),
            Ok(Decoded::Message(ServerMessage::Logout { .. }, _)) => Err("the server ended the session: logged out".into()),
            Ok(Decoded::Message(_, size)) => Ok(Some((None, size))),
            Ok(Decoded::NeedMore) => Ok(None),
            Err(e) => Err(format!("a garbled message from the server: {e}")),
        }
    }
}

/// FIX 4.4: NewOrderSingle and OrderCancelRequest out, ExecutionReports
/// in. ClOrdID is the client id in decimal.
struct FixWire {
    writer: crossbook_client::fix::Writer,
}

impl FixWire {
    fn message(&mut self, msg_type: &str, body: &[(u32, &str)], out: &mut Vec<u8>) {
        out.extend_from_slice(&self.writer.message(msg_type, body));
    }
}

impl Wire for FixWire {
    fn order(&mut self, order: &NewOrder, out: &mut Vec<u8>) {
        let (cid, qty, price) = (order.cid.to_string(), order.qty.to_string(), order.price.to_string());
        let side = if order.side == Side::Buy { "1" } else { "2" };
        let tif = if order.tif == TimeInForce::Ioc { "3" } else { "1" };
        self.message("D", &[(11, &cid), (38, &qty), (40, "2"), (44, &price), (54, side), (55, "BTC-USD"), (59, tif), (60, "20260101-00:00:00"), (7928, "N")], out);
    }

    fn cancel(&mut self, _order: u64, cid: u64, out: &mut Vec<u8>) {
        let (id, orig) = (format!("c{cid}"), cid.to_string());
        self.message("F", &[(11, &id), (41, &orig), (54, "1"), (55, "BTC-USD"), (60, "20260101-00:00:00")], out);
    }

    fn decode(&mut self, buffer: &[u8]) -> Result<Option<(Option<Reply>, usize)>, String> {
        use crossbook_fix::wire::{Frame, Message, frame};
        let size = match frame(buffer, 1 << 16) {
            Frame::NeedMore => return Ok(None),
            Frame::Message(size) => size,
            other => return Err(format!("unframeable FIX from the server: {other:?}")),
        };
        let message = Message::parse(&buffer[..size]).map_err(|e| format!("garbled FIX from the server: {e}"))?;
        match message.msg_type() {
            b"8" => {
                let kind = match (message.get(150), message.get(39)) {
                    (Some(b"0"), _) => ReportKind::Accepted,
                    (Some(b"8"), _) => ReportKind::Rejected,
                    (Some(b"F"), Some(b"2")) => ReportKind::Fill,
                    (Some(b"F"), _) => ReportKind::PartialFill,
                    (Some(b"4"), _) => ReportKind::Cancelled,
                    _ => ReportKind::Replaced,
                };
                // A cancel reports the cancel's own ClOrdID: the order's is 41.
                let cid_tag = if kind == ReportKind::Cancelled && message.get(41).is_some() { 41 } else { 11 };
                let cid = message.text(cid_tag).and_then(|t| t.parse().ok()).unwrap_or(0);
                let why = if kind == ReportKind::Rejected { format!("OrdRejReason={}", message.text(103).unwrap_or("none")) } else { String::new() };
                Ok(Some((Some(Reply { kind, cid, order: message.number(37).unwrap_or(0), seq: 0, why }), size)))
            }
            b"5" => Err(format!("logged out by the server: {}", message.text(58).unwrap_or(""))),
            _ => Ok(Some((None, size))),
        }
    }
}

/// Logs on over FIX (a fresh sequence, ResetSeqNumFlag) as demo `account`.
fn connect_fix(address: &str, account: u64, key: &str) -> Result<(TcpStream, FixWire)> {
    let mut initiator = crossbook_client::fix::Initiator::connect(address, &format!("LOAD{account}")).with_context(|| format!("connecting to {address}"))?;
    initiator.set_timeout(Duration::from_secs(5));
    initiator.logon(account, key, true).with_context(|| format!("FIX logon as account {account}"))?;
    let (stream, writer, buffered) = initiator.into_parts();
    if !buffered.is_empty() {
        bail!("account {account}: the server sent more than the Logon reply before any order");
    }
    Ok((stream, FixWire { writer }))
}

/// What one session counted.
pub(crate) struct Tally {
    ack: Histogram<u64>,
    fill: Histogram<u64>,
    sent: u64,
    acked: u64,
    rejected: u64,
    /// The rejections by reason.
    rejected_by: std::collections::BTreeMap<String, u64>,
    fills: u64,
    /// The highest report sequence number seen.
    last_seq: u64,
    cancels: u64,
    errors: u64,
    /// What the first error was.
    first_error: Option<String>,
    unanswered: u64,
    /// (order id, the client's id for it: the cid, FIX's ClOrdID, or the
    /// REST and WebSocket API answers' `clientOrderId`), with --acked-out.
    accepted: Vec<(u64, String)>,
}

impl Tally {
    /// Nothing counted yet.
    pub(crate) fn new() -> Tally {
        Tally { ack: histogram(), fill: histogram(), sent: 0, acked: 0, rejected: 0, rejected_by: Default::default(), fills: 0, last_seq: 0, cancels: 0, errors: 0, first_error: None, unanswered: 0, accepted: Vec::new() }
    }

    /// An order refused, for `why`.
    pub(crate) fn reject(&mut self, why: String) {
        self.rejected += 1;
        *self.rejected_by.entry(why).or_default() += 1;
    }

    /// A session's connection failed (it ends): counted, the first kept.
    pub(crate) fn error(&mut self, why: impl FnOnce() -> String) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(why());
        }
    }
}

pub(crate) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000_000, 3).expect("valid histogram bounds")
}

/// Logs in over the binary protocol as demo `account`, asking for no
/// replay of an earlier run's reports.
fn connect(address: &str, account: u64, key: &str) -> Result<TcpStream> {
    let (mut client, reply) = crossbook_client::binary::Client::login(address, account, key, u64::MAX)
        .with_context(|| format!("logging in to {address} as account {account}"))?;
    client.set_timeout(Duration::from_secs(5));
    match reply {
        ServerMessage::LoginAccepted { .. } if client.buffered() == 0 => Ok(client.into_parts().0),
        ServerMessage::LoginAccepted { .. } => bail!("account {account}: the server sent more than the login reply before any order"),
        other => bail!("login as account {account} refused: {}", crossbook_client::binary::describe(&other)),
    }
}

pub(crate) fn order(cid: u64, rng: &mut crossbook_workload::Rng) -> NewOrder {
    let side = if rng.below(2) == 0 { Side::Buy } else { Side::Sell };
    let crossing = rng.below(2) == 0;
    let offset = 1 + rng.below(5) as i64;
    let price = match (side, crossing) {
        (Side::Buy, true) | (Side::Sell, false) => 10_000 + offset,
        (Side::Buy, false) | (Side::Sell, true) => 10_000 - offset,
    };
    NewOrder {
        cid,
        instrument: 1,
        side,
        order_type: OrderType::Limit,
        tif: if crossing { TimeInForce::Ioc } else { TimeInForce::Gtc },
        post_only: false,
        stp: SelfTradePrevention::CancelNewest,
        price,
        qty: 1 + rng.below(3),
        budget: None,
    }
}

/// Bytes asked of the socket per read.
const READ_BYTES: usize = 1 << 16;
/// Resting orders a session keeps before it cancels the oldest.
const MAX_RESTING: usize = 1_000;
/// How long the last acknowledgements may take after sending stops.
const DRAIN: Duration = Duration::from_secs(2);

/// One session's state: what it has sent and not yet heard back about.
struct Client {
    stream: TcpStream,
    wire: Box<dyn Wire + Send>,
    index: u64,
    tally: Tally,
    rng: crossbook_workload::Rng,
    /// Client order ids: 00 (2 bits: from 2^62 up the REST and FIX
    /// gateways number their own) | session (4 bits) | run (18 bits, from
    /// the clock, so that a second run does not collide with the first
    /// run's resting orders) | counter (40 bits).
    run: u64,
    next: u64,
    /// cid -> (planned send time, resting kind), until acknowledged; and,
    /// for orders that cross (IOC), until the first fill: a resting
    /// order's wait for a counterparty is not the server's latency.
    pending: HashMap<u64, (Instant, bool)>,
    unfilled: HashMap<u64, Instant>,
    /// Resting orders, oldest first, and those of them still live (not
    /// filled or cancelled since): past `MAX_RESTING` the oldest is
    /// cancelled if it is, so the book stays a fixed depth, as on a real
    /// venue. Only resting orders are in `live` (a set of every order that
    /// ended, IOCs included, grew by most of the orders sent).
    resting: VecDeque<(u64, u64)>,
    live: HashSet<u64>,
    buffer: Vec<u8>,
    /// Stopped (an error, or the server closed the connection).
    broken: bool,
}

impl Client {
    fn new(stream: TcpStream, wire: Box<dyn Wire + Send>, index: u64) -> Client {
        Client {
            stream,
            wire,
            index,
            tally: Tally::new(),
            rng: crossbook_workload::Rng::new(0xC0FFEE + index),
            run: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64) & 0xF_FFFF,
            next: 0,
            pending: HashMap::new(),
            unfilled: HashMap::new(),
            resting: VecDeque::new(),
            live: HashSet::new(),
            buffer: Vec::with_capacity(2 * READ_BYTES),
            broken: false,
        }
    }

    /// When this session's next order is due (open loop).
    fn due(&self, start: Instant, interval: Duration) -> Instant {
        start + interval.mul_f64(self.next as f64)
    }

    /// Writes everything due now (a window's worth, or what the schedule
    /// says) in one write.
    fn send(&mut self, now: Instant, start: Instant, interval: Option<Duration>, window: u64, quota: u64, out: &mut Vec<u8>) {
        out.clear();
        loop {
            if self.next >= quota {
                break;
            }
            let planned = match interval {
                Some(interval) => {
                    let due = self.due(start, interval);
                    if due > now {
                        break;
                    }
                    due
                }
                None if (self.pending.len() as u64) < window => now,
                None => break,
            };
            self.next += 1;
            // Below 2^62: from there up the REST and FIX gateways number
            // their own orders.
            let cid = (self.index << 58) | ((self.run & 0x3_FFFF) << 40) | self.next;
            let new_order = order(cid, &mut self.rng);
            self.pending.insert(cid, (planned, new_order.tif == TimeInForce::Gtc));
            if new_order.tif == TimeInForce::Ioc {
                self.unfilled.insert(cid, planned);
            }
            self.wire.order(&new_order, out);
            self.tally.sent += 1;
        }
        while self.resting.len() > MAX_RESTING {
            let Some((oldest, cid)) = self.resting.pop_front() else { break };
            if self.live.remove(&oldest) {
                self.wire.cancel(oldest, cid, out);
                self.tally.cancels += 1;
            }
        }
        if !out.is_empty()
            && let Err(e) = self.stream.write_all(out)
        {
            self.tally.error(|| format!("writing to the server: {e}"));
            self.broken = true;
        }
    }

    /// Reads what is there (the socket said it is readable) and records it.
    fn receive(&mut self, chunk: &mut [u8], keep: bool) {
        match self.stream.read(chunk) {
            Ok(0) => {
                self.tally.error(|| "the server closed the connection".into());
                self.broken = true;
                return;
            }
            Err(e) => {
                self.tally.error(|| format!("reading from the server: {e}"));
                self.broken = true;
                return;
            }
            Ok(n) => self.buffer.extend_from_slice(&chunk[..n]),
        }
        let now = Instant::now();
        let mut used = 0;
        loop {
            match self.wire.decode(&self.buffer[used..]) {
                Ok(Some((reply, size))) => {
                    used += size;
                    if let Some(reply) = reply {
                        let mut books = Books { pending: &mut self.pending, unfilled: &mut self.unfilled, resting: &mut self.resting, live: &mut self.live };
                        record(&mut self.tally, &mut books, keep, reply, now);
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    self.tally.error(|| e.clone());
                    self.broken = true;
                    break;
                }
            }
        }
        self.buffer.drain(..used);
    }
}

/// Every session on one thread: each round writes what every session has
/// due, then waits (ppoll) for replies on all of them, no longer than the
/// next order is due. One thread, so that the load generator costs the
/// server (on the same two cores) as little as it can.
/// Returns each session's tally and how long sending lasted.
fn drive(mut clients: Vec<Client>, options: &Options, start: Instant) -> (Vec<Tally>, Duration) {
    use std::os::fd::AsRawFd;
    let interval = options.rate.map(|rate| Duration::from_secs_f64(options.connections as f64 / rate));
    if interval.is_some() {
        // An open loop sleeps until the next order is due; the kernel may
        // let that wake-up slip by the thread's timer slack (50 us by
        // default), and each order would leave that much late, counted in
        // its latency. Ask for 1 us instead.
        // SAFETY: PR_SET_TIMERSLACK takes one integer argument and affects
        // only the calling thread.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
    }
    let end = start + options.duration;
    // Orders per session.
    let quota = options.count.map_or(u64::MAX, |count| count.div_ceil(options.connections.max(1)));
    let mut sent_by: Option<Instant> = None;
    let keep = options.acked_out.is_some();
    let mut out: Vec<u8> = Vec::with_capacity(READ_BYTES);
    let mut chunk = vec![0u8; READ_BYTES];
    let mut fds: Vec<libc::pollfd> = clients.iter().map(|c| libc::pollfd { fd: c.stream.as_raw_fd(), events: libc::POLLIN, revents: 0 }).collect();
    loop {
        let now = Instant::now();
        if sent_by.is_none() && clients.iter().all(|c| c.broken || c.next >= quota) {
            sent_by = Some(now);
        }
        // Sending stops at the duration's end or once the count is sent.
        let end = sent_by.map_or(end, |t| t.min(end));
        let waiting = clients.iter().any(|c| !c.broken && !c.pending.is_empty());
        if now >= end && (!waiting || now >= end + DRAIN) {
            break;
        }
        if clients.iter().all(|c| c.broken) {
            break;
        }
        if now < end {
            for client in clients.iter_mut().filter(|c| !c.broken) {
                client.send(now, start, interval, options.window, quota, &mut out);
            }
        }
        let wait = match interval {
            Some(interval) if now < end => {
                // Never past the end: a slow rate's next order may be due
                // after it.
                let next_due = clients.iter().filter(|c| !c.broken).map(|c| c.due(start, interval)).min().unwrap_or(end).min(end);
                next_due.saturating_duration_since(Instant::now()).max(Duration::from_micros(10))
            }
            _ => Duration::from_millis(50),
        };
        for fd in fds.iter_mut() {
            fd.revents = 0;
        }
        if poll(&mut fds, wait) == 0 {
            continue;
        }
        for (client, fd) in clients.iter_mut().zip(&fds) {
            if !client.broken && fd.revents != 0 {
                client.receive(&mut chunk, keep);
            }
        }
    }
    let sending = sent_by.map_or(end, |t| t.min(end)).saturating_duration_since(start);
    let tallies = clients
        .into_iter()
        .map(|mut c| {
            c.tally.unanswered = c.pending.len() as u64;
            c.tally
        })
        .collect();
    (tallies, sending)
}

/// ppoll(2) on `fds` for at most `timeout`: a high-resolution timer (a
/// socket timeout, or epoll's milliseconds, would be rounded up to the
/// scheduler tick, which would swamp the latencies being measured).
pub(crate) fn poll(fds: &mut [libc::pollfd], timeout: Duration) -> i32 {
    let ts = libc::timespec { tv_sec: timeout.as_secs() as libc::time_t, tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32) };
    // SAFETY: `fds` is a valid slice of pollfd, `ts` a valid timespec, no
    // signal mask.
    unsafe { libc::ppoll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, &ts, std::ptr::null()) }
}

/// A session's view of its orders.
struct Books<'a> {
    pending: &'a mut HashMap<u64, (Instant, bool)>,
    unfilled: &'a mut HashMap<u64, Instant>,
    resting: &'a mut VecDeque<(u64, u64)>,
    live: &'a mut HashSet<u64>,
}

fn record(tally: &mut Tally, books: &mut Books<'_>, keep: bool, report: Reply, now: Instant) {
    tally.last_seq = tally.last_seq.max(report.seq);
    let nanos = |since: Instant| (now.saturating_duration_since(since).as_nanos() as u64).max(1);
    match report.kind {
        ReportKind::Accepted | ReportKind::Rejected => {
            if let Some((sent, gtc)) = books.pending.remove(&report.cid) {
                tally.ack.saturating_record(nanos(sent));
                if report.kind == ReportKind::Accepted {
                    tally.acked += 1;
                    if gtc {
                        books.resting.push_back((report.order, report.cid));
                        books.live.insert(report.order);
                    }
                    if keep {
                        tally.accepted.push((report.order, report.cid.to_string()));
                    }
                } else {
                    books.unfilled.remove(&report.cid);
                    tally.reject(report.why);
                }
            }
        }
        ReportKind::PartialFill | ReportKind::Fill => {
            tally.fills += 1;
            if report.kind == ReportKind::Fill {
                books.live.remove(&report.order);
            }
            if let Some(sent) = books.unfilled.remove(&report.cid) {
                tally.fill.saturating_record(nanos(sent));
            }
        }
        ReportKind::Cancelled => {
            books.live.remove(&report.order);
            books.unfilled.remove(&report.cid);
        }
        ReportKind::Replaced | ReportKind::CancelAllDone => {}
    }
}

fn percentiles(h: &Histogram<u64>) -> serde_json::Value {
    let q = |p: f64| if h.is_empty() { 0 } else { h.value_at_quantile(p) };
    serde_json::json!({
        "count": h.len(),
        "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "p99.9": q(0.999), "max": h.max(),
    })
}

pub fn run(options: Options) -> Result<()> {
    if options.connections == 0 {
        bail!("--connections must be at least 1");
    }
    let last = options.first_account.saturating_add(options.connections).saturating_sub(1);
    if options.first_account == 0 || last > options.keys.len() as u64 {
        bail!("--first-account plus --connections must stay within accounts 1 to {} (one account each)", options.keys.len());
    }
    if options.last_seen_out.is_some() && options.protocol != Protocol::Binary {
        bail!("--last-seen-out is for the binary protocol (its reports' sequence numbers)");
    }
    // The files are made before any order is sent: a path that cannot be
    // written fails the run before it trades, not after.
    for path in [&options.acked_out, &options.last_seen_out].into_iter().flatten() {
        std::fs::File::create(path).with_context(|| format!("writing {}", path.display()))?;
    }
    let options = Arc::new(options);
    let (tallies, sending) = if matches!(options.protocol, Protocol::Rest | Protocol::WsApi) {
        rest::drive(&options, &options.secrets)?
    } else {
        let mut streams: Vec<(TcpStream, Box<dyn Wire + Send>)> = Vec::new();
        for index in 0..options.connections {
            streams.push(match options.protocol {
                Protocol::Binary | Protocol::Rest | Protocol::WsApi => {
                    let account = options.first_account + index;
                    (connect(&options.address, account, &options.keys[account as usize - 1])?, Box::new(BinaryWire))
                }
                Protocol::Fix => {
                    let account = options.first_account + index;
                    let (stream, wire) = connect_fix(&options.address, account, &options.keys[account as usize - 1])?;
                    (stream, Box::new(wire))
                }
            });
        }
        let clients: Vec<Client> = streams.into_iter().enumerate().map(|(index, (stream, wire))| Client::new(stream, wire, index as u64)).collect();
        drive(clients, &options, Instant::now())
    };
    let mut ack = histogram();
    let mut fill = histogram();
    let (mut sent, mut acked, mut rejected, mut fills, mut cancels, mut errors, mut unanswered) = (0, 0, 0, 0, 0, 0, 0);
    let mut rejected_by = std::collections::BTreeMap::<String, u64>::new();
    let mut first_error = None;
    let mut accepted = Vec::new();
    let mut last_seen = String::new();
    for (index, tally) in tallies.into_iter().enumerate() {
        last_seen.push_str(&format!("{} {}\n", options.first_account + index as u64, tally.last_seq));
        ack.add(&tally.ack)?;
        fill.add(&tally.fill)?;
        sent += tally.sent;
        acked += tally.acked;
        rejected += tally.rejected;
        for (why, count) in tally.rejected_by {
            *rejected_by.entry(why).or_default() += count;
        }
        fills += tally.fills;
        cancels += tally.cancels;
        errors += tally.errors;
        if first_error.is_none() {
            first_error = tally.first_error.map(|why| format!("account {}: {why}", options.first_account + index as u64));
        }
        unanswered += tally.unanswered;
        accepted.extend(tally.accepted);
    }
    if let Some(path) = &options.last_seen_out {
        std::fs::write(path, &last_seen).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &options.acked_out {
        let mut lines = String::new();
        for (order, cid) in &accepted {
            lines.push_str(&format!("{order} {cid}\n"));
        }
        std::fs::write(path, lines).with_context(|| format!("writing {}", path.display()))?;
    }
    let seconds = sending.as_secs_f64();
    let report = serde_json::json!({
        "protocol": match options.protocol {
            Protocol::Binary => "binary",
            Protocol::Fix => "fix",
            Protocol::Rest => "rest",
            Protocol::WsApi => "ws-api",
        },
        "connections": options.connections,
        "workload": WORKLOADS[0],
        "mode": if options.rate.is_some() { "open" } else { "closed" },
        "target_rate": options.rate,
        "window": options.window,
        "duration_s": seconds,
        "sent": sent,
        "acknowledged": acked,
        "rejected": rejected,
        "rejected_by": rejected_by,
        "fill_reports": fills,
        "cancels_sent": cancels,
        "unanswered": unanswered,
        "errors": errors,
        "orders_per_s": (acked + rejected) as f64 / seconds,
        "order_to_ack_ns": percentiles(&ack),
        "order_to_fill_ns": percentiles(&fill),
    });
    if options.json {
        println!("{report}");
    } else {
        println!(
            "connections {} mode {} sent {sent} acknowledged {acked} rejected {rejected} fills {fills} cancels {cancels} unanswered {unanswered} errors {errors}",
            options.connections, report["mode"].as_str().unwrap_or("")
        );
        if rejected > 0 {
            let reasons: Vec<String> = rejected_by.iter().map(|(why, count)| format!("{why} {count}")).collect();
            println!("rejected_by {}", reasons.join(", "));
        }
        println!("orders_per_s {:.0}", (acked + rejected) as f64 / seconds);
        for (name, h) in [("order_to_ack_ns", &ack), ("order_to_fill_ns", &fill)] {
            let p = percentiles(h);
            println!("{name} p50 {} p90 {} p99 {} p99.9 {} max {}", p["p50"], p["p90"], p["p99"], p["p99.9"], p["max"]);
        }
    }
    // The figures are out (and the files written): a run whose sessions
    // failed says so, and ends non-zero.
    if errors > 0 {
        bail!("{errors} session errors (the first: {}); the figures above are of what was answered", first_error.unwrap_or_default());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(kind: ReportKind, cid: u64, order: u64) -> Reply {
        Reply { kind, cid, order, seq: 0, why: String::new() }
    }

    /// A session keeps only its resting orders that are still live: an
    /// IOC that ends leaves nothing behind, a resting order that fills is
    /// forgotten (and not cancelled when its turn comes).
    #[test]
    fn only_live_resting_orders_are_kept() {
        let mut tally = Tally::new();
        let (mut pending, mut unfilled, mut resting, mut live) = (HashMap::new(), HashMap::new(), VecDeque::new(), HashSet::new());
        let now = Instant::now();
        pending.insert(1, (now, true));
        pending.insert(2, (now, false));
        pending.insert(3, (now, true));
        let mut books = Books { pending: &mut pending, unfilled: &mut unfilled, resting: &mut resting, live: &mut live };
        for report in [
            reply(ReportKind::Accepted, 1, 101),
            reply(ReportKind::Accepted, 2, 102),
            reply(ReportKind::PartialFill, 2, 102),
            reply(ReportKind::Cancelled, 2, 102),
            reply(ReportKind::Accepted, 3, 103),
            reply(ReportKind::Fill, 3, 103),
        ] {
            record(&mut tally, &mut books, false, report, now);
        }
        assert_eq!(resting, VecDeque::from([(101, 1), (103, 3)]), "the GTC orders, oldest first");
        assert_eq!(live, HashSet::from([101]), "the one still resting");
        assert_eq!((tally.acked, tally.fills), (3, 2));
    }
}
