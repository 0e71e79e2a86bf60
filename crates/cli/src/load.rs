//! `crossbook load`: a load generator for `crossbook serve`.
//!
//! N sessions (demo accounts 1..=N, the server's default credentials) send
//! limit orders around a fixed mid: half GTC at passive prices that rest,
//! half IOC at prices that cross, so orders trade with other sessions. Each
//! session has a sender and a receiver thread.
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

use anyhow::{Context, Result, bail};
use crossbook_engine::{OrderType, SelfTradePrevention, Side, TimeInForce};
use crossbook_protocol::*;
use hdrhistogram::Histogram;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

pub struct Options {
    pub address: String,
    pub connections: u64,
    pub duration: Duration,
    pub rate: Option<f64>,
    pub window: u64,
    pub json: bool,
    /// Write `order cid` of every acknowledged order here (for crash tests).
    pub acked_out: Option<std::path::PathBuf>,
}

/// Per-session state shared by its sender and receiver.
struct Session {
    /// cid -> planned (or actual) send time, until acknowledged.
    pending: Mutex<HashMap<u64, Instant>>,
    /// cid -> send time, until the first fill.
    unfilled: Mutex<HashMap<u64, Instant>>,
    outstanding: Mutex<u64>,
    room: Condvar,
    ack: Mutex<Histogram<u64>>,
    fill: Mutex<Histogram<u64>>,
    sent: AtomicU64,
    acked: AtomicU64,
    rejected: AtomicU64,
    fills: AtomicU64,
    errors: AtomicU64,
    /// (order, cid) of acknowledged orders, when asked for.
    accepted: Option<Mutex<Vec<(u64, u64)>>>,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000_000, 3).expect("valid histogram bounds")
}

fn connect(address: &str, account: u64) -> Result<TcpStream> {
    let mut stream = TcpStream::connect(address).with_context(|| format!("connecting to {address}"))?;
    stream.set_nodelay(true)?;
    let key = crossbook_server::config::demo_key(account);
    let mut api_key = [0u8; API_KEY_BYTES];
    api_key[..key.len()].copy_from_slice(key.as_bytes());
    let mut frame = Vec::new();
    encode_client(&ClientMessage::Login { account, api_key, last_seen: 0 }, &mut frame);
    stream.write_all(&frame)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 256];
    loop {
        if let Ok(Decoded::Message(message, _)) = decode_server(&buffer, 1 << 16) {
            match message {
                ServerMessage::LoginAccepted { .. } => return Ok(stream),
                other => bail!("login as account {account} refused: {other:?}"),
            }
        }
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            bail!("the server closed the connection during login");
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
}

fn order(cid: u64, rng: &mut crossbook_workload::Rng) -> ClientMessage {
    let side = if rng.below(2) == 0 { Side::Buy } else { Side::Sell };
    let crossing = rng.below(2) == 0;
    let offset = 1 + rng.below(5) as i64;
    let price = match (side, crossing) {
        (Side::Buy, true) | (Side::Sell, false) => 10_000 + offset,
        (Side::Buy, false) | (Side::Sell, true) => 10_000 - offset,
    };
    ClientMessage::NewOrder(NewOrder {
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
    })
}

fn send_loop(mut stream: TcpStream, session: Arc<Session>, index: u64, options: &Options, stop: Arc<AtomicBool>, start: Instant) {
    let mut rng = crossbook_workload::Rng::new(0xC0FFEE + index);
    // Client order ids: session (4 bits) | run (20 bits, from the clock, so
    // that a second run does not collide with the first run's resting
    // orders) | counter (40 bits).
    let run = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64) & 0xF_FFFF;
    let interval = options.rate.map(|rate| Duration::from_secs_f64(options.connections as f64 / rate));
    let mut frame = Vec::with_capacity(64);
    let mut next = 0u64;
    while !stop.load(Ordering::Acquire) && start.elapsed() < options.duration {
        let planned = match interval {
            Some(interval) => {
                let due = start + interval.mul_f64(next as f64);
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
                due
            }
            None => {
                let mut outstanding = session.outstanding.lock().unwrap_or_else(|e| e.into_inner());
                while *outstanding >= options.window && !stop.load(Ordering::Acquire) {
                    outstanding = session.room.wait_timeout(outstanding, Duration::from_millis(50)).unwrap_or_else(|e| e.into_inner()).0;
                }
                *outstanding += 1;
                Instant::now()
            }
        };
        next += 1;
        let cid = (index << 60) | (run << 40) | next;
        let message = order(cid, &mut rng);
        session.pending.lock().unwrap_or_else(|e| e.into_inner()).insert(cid, planned);
        if matches!(message, ClientMessage::NewOrder(NewOrder { tif: TimeInForce::Ioc, .. })) {
            // Fill latency is measured on the orders that cross: a resting
            // order's wait for a counterparty is not the server's latency.
            session.unfilled.lock().unwrap_or_else(|e| e.into_inner()).insert(cid, planned);
        }
        frame.clear();
        encode_client(&message, &mut frame);
        if stream.write_all(&frame).is_err() {
            session.errors.fetch_add(1, Ordering::Relaxed);
            break;
        }
        session.sent.fetch_add(1, Ordering::Relaxed);
    }
}

fn receive_loop(mut stream: TcpStream, session: Arc<Session>, stop: Arc<AtomicBool>) {
    let _ = stream.set_read_timeout(Some(Duration::from_millis(100)));
    let mut buffer: Vec<u8> = Vec::with_capacity(1 << 16);
    let mut chunk = vec![0u8; 1 << 16];
    loop {
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                if stop.load(Ordering::Acquire) {
                    break;
                }
                continue;
            }
            Err(_) => {
                session.errors.fetch_add(1, Ordering::Relaxed);
                break;
            }
        }
        let now = Instant::now();
        let mut used = 0;
        loop {
            match decode_server(&buffer[used..], 1 << 16) {
                Ok(Decoded::Message(message, size)) => {
                    used += size;
                    record(&session, message, now);
                }
                Ok(Decoded::NeedMore) => break,
                Err(_) => {
                    session.errors.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            }
        }
        buffer.drain(..used);
    }
}

fn record(session: &Session, message: ServerMessage, now: Instant) {
    let ServerMessage::ExecutionReport(report) = message else {
        if matches!(message, ServerMessage::Error { .. } | ServerMessage::Logout { .. }) {
            session.errors.fetch_add(1, Ordering::Relaxed);
        }
        return;
    };
    let nanos = |since: Instant| (now.saturating_duration_since(since).as_nanos() as u64).max(1);
    match report.kind {
        ReportKind::Accepted | ReportKind::Rejected => {
            let sent = session.pending.lock().unwrap_or_else(|e| e.into_inner()).remove(&report.cid);
            if let Some(sent) = sent {
                session.ack.lock().unwrap_or_else(|e| e.into_inner()).saturating_record(nanos(sent));
                if report.kind == ReportKind::Accepted {
                    session.acked.fetch_add(1, Ordering::Relaxed);
                    if let Some(accepted) = &session.accepted {
                        accepted.lock().unwrap_or_else(|e| e.into_inner()).push((report.order, report.cid));
                    }
                } else {
                    session.rejected.fetch_add(1, Ordering::Relaxed);
                    session.unfilled.lock().unwrap_or_else(|e| e.into_inner()).remove(&report.cid);
                }
                let mut outstanding = session.outstanding.lock().unwrap_or_else(|e| e.into_inner());
                *outstanding = outstanding.saturating_sub(1);
                session.room.notify_one();
            }
        }
        ReportKind::PartialFill | ReportKind::Fill => {
            session.fills.fetch_add(1, Ordering::Relaxed);
            let mut unfilled = session.unfilled.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(sent) = unfilled.remove(&report.cid) {
                session.fill.lock().unwrap_or_else(|e| e.into_inner()).saturating_record(nanos(sent));
            }
        }
        ReportKind::Cancelled => {
            session.unfilled.lock().unwrap_or_else(|e| e.into_inner()).remove(&report.cid);
        }
        ReportKind::Replaced => {}
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
    if options.connections == 0 || options.connections > crossbook_server::config::DEMO_ACCOUNTS {
        bail!("--connections must be 1 to {} (one demo account each)", crossbook_server::config::DEMO_ACCOUNTS);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let options = Arc::new(options);
    let mut sessions = Vec::new();
    let mut threads = Vec::new();
    let mut streams = Vec::new();
    for index in 0..options.connections {
        streams.push(connect(&options.address, index + 1)?);
    }
    let start = Instant::now();
    for (index, stream) in streams.into_iter().enumerate() {
        let session = Arc::new(Session {
            pending: Mutex::new(HashMap::new()),
            unfilled: Mutex::new(HashMap::new()),
            outstanding: Mutex::new(0),
            room: Condvar::new(),
            ack: Mutex::new(histogram()),
            fill: Mutex::new(histogram()),
            sent: AtomicU64::new(0),
            acked: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            fills: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            accepted: options.acked_out.as_ref().map(|_| Mutex::new(Vec::new())),
        });
        let reader = stream.try_clone()?;
        let (s, st) = (session.clone(), stop.clone());
        threads.push(std::thread::spawn(move || receive_loop(reader, s, st)));
        let (s, st, o) = (session.clone(), stop.clone(), options.clone());
        threads.push(std::thread::spawn(move || send_loop(stream, s, index as u64, &o, st, start)));
        sessions.push(session);
    }
    std::thread::sleep(options.duration);
    let sending = start.elapsed();
    // Give the last acknowledgements a moment, bounded, then stop.
    let drain_until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < drain_until && sessions.iter().any(|s| !s.pending.lock().unwrap_or_else(|e| e.into_inner()).is_empty()) {
        std::thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Ordering::Release);
    for thread in threads {
        let _ = thread.join();
    }
    let mut ack = histogram();
    let mut fill = histogram();
    let (mut sent, mut acked, mut rejected, mut fills, mut errors, mut unanswered) = (0, 0, 0, 0, 0, 0);
    for s in &sessions {
        ack.add(&*s.ack.lock().unwrap_or_else(|e| e.into_inner()))?;
        fill.add(&*s.fill.lock().unwrap_or_else(|e| e.into_inner()))?;
        sent += s.sent.load(Ordering::Relaxed);
        acked += s.acked.load(Ordering::Relaxed);
        rejected += s.rejected.load(Ordering::Relaxed);
        fills += s.fills.load(Ordering::Relaxed);
        errors += s.errors.load(Ordering::Relaxed);
        unanswered += s.pending.lock().unwrap_or_else(|e| e.into_inner()).len() as u64;
    }
    if let Some(path) = &options.acked_out {
        let mut lines = String::new();
        for s in &sessions {
            if let Some(accepted) = &s.accepted {
                for (order, cid) in accepted.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                    lines.push_str(&format!("{order} {cid}\n"));
                }
            }
        }
        std::fs::write(path, lines).with_context(|| format!("writing {}", path.display()))?;
    }
    let seconds = sending.as_secs_f64();
    let report = serde_json::json!({
        "connections": options.connections,
        "mode": if options.rate.is_some() { "open" } else { "closed" },
        "target_rate": options.rate,
        "window": options.window,
        "duration_s": seconds,
        "sent": sent,
        "acknowledged": acked,
        "rejected": rejected,
        "fill_reports": fills,
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
            "connections {} mode {} sent {sent} acknowledged {acked} rejected {rejected} fills {fills} unanswered {unanswered} errors {errors}",
            options.connections, report["mode"].as_str().unwrap_or("")
        );
        println!("orders_per_s {:.0}", (acked + rejected) as f64 / seconds);
        for (name, h) in [("order_to_ack_ns", &ack), ("order_to_fill_ns", &fill)] {
            let p = percentiles(h);
            println!("{name} p50 {} p90 {} p99 {} p99.9 {} max {}", p["p50"], p["p90"], p["p99"], p["p99.9"], p["max"]);
        }
    }
    Ok(())
}
