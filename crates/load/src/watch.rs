//! `crossbook watch`: market-data clients for measuring the feed
//! (`docs/benchmarks.md`): N WebSocket connections to a combined stream,
//! each on a thread of its own, counting messages and timing each `@trade`
//! message from its trade's time (the journal's stamp) to its arrival; and
//! optionally K clients asking `GET /api/v3/depth` in a loop over
//! keep-alive connections.

use anyhow::{Context, Result, bail};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub struct WatchOptions {
    /// The market-data server (`host:port`).
    pub address: String,
    /// Streams every connection subscribes to (`btcusd@trade`, ...).
    pub streams: Vec<String>,
    pub connections: usize,
    pub duration: Duration,
    /// Clients asking `GET /api/v3/depth?symbol=<depth_symbol>&limit=100`
    /// in a loop (0: none).
    pub depth_clients: usize,
    pub depth_symbol: String,
    pub json: bool,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// What one WebSocket connection saw.
struct Seen {
    messages: u64,
    bytes: u64,
    trade_latency_ms: hdrhistogram::Histogram<u64>,
    closed: Option<String>,
}

/// The `"T":<ms>` field of a trade message.
fn trade_time(text: &str) -> Option<u64> {
    let at = text.find("\"T\":")? + 4;
    let digits: &str = &text[at..];
    let end = digits.find(|c: char| !c.is_ascii_digit()).unwrap_or(digits.len());
    digits[..end].parse().ok()
}

/// How long connecting and the WebSocket handshake may take, at least (a
/// longer run gives them until its end).
const HANDSHAKE: Duration = Duration::from_secs(10);

fn watch_one(address: &str, path: &str, until: Instant) -> Result<Seen> {
    let url = format!("ws://{address}{path}");
    let patience = until.saturating_duration_since(Instant::now()).max(HANDSHAKE);
    let resolved = address.to_socket_addrs().with_context(|| format!("resolving {address}"))?.next().with_context(|| format!("{address} resolves to no address"))?;
    let stream = TcpStream::connect_timeout(&resolved, patience).with_context(|| format!("connecting to {address}"))?;
    stream.set_read_timeout(Some(patience))?;
    stream.set_write_timeout(Some(patience))?;
    let (mut socket, _) = match tungstenite::client(url.as_str(), stream) {
        Ok(done) => done,
        Err(tungstenite::HandshakeError::Interrupted(_)) => bail!("{url}: no WebSocket handshake from the server within {} s", patience.as_secs_f64()),
        // Its text once (the error's sources repeat it): and the likely
        // cause of an answer that is not HTTP.
        Err(tungstenite::HandshakeError::Failure(e)) => bail!("WebSocket handshake with {url}: {e} (is {address} the market-data port?)"),
    };
    socket.get_ref().set_read_timeout(Some(Duration::from_millis(200)))?;
    let mut seen = Seen { messages: 0, bytes: 0, trade_latency_ms: hdrhistogram::Histogram::new(3)?, closed: None };
    while Instant::now() < until {
        match socket.read() {
            Ok(tungstenite::Message::Text(text)) => {
                let arrived = now_ms();
                seen.messages += 1;
                seen.bytes += text.len() as u64;
                // The trade time, without parsing the whole message (the
                // watcher's own cost would count against the venue's).
                if let Some(time) = text.contains("\"e\":\"trade\"").then(|| trade_time(text.as_str())).flatten() {
                    seen.trade_latency_ms.saturating_record(arrived.saturating_sub(time));
                }
            }
            Ok(tungstenite::Message::Close(frame)) => {
                seen.closed = Some(frame.map(|f| f.reason.to_string()).unwrap_or_default());
                break;
            }
            Ok(_) => {}
            Err(tungstenite::Error::Io(e)) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(e) => {
                seen.closed = Some(e.to_string());
                break;
            }
        }
    }
    let _ = socket.close(None);
    Ok(seen)
}

/// Asks for the depth over one keep-alive connection until `stop`;
/// returns the requests answered with 200.
fn ask_depth(address: &str, symbol: &str, stop: &AtomicBool) -> Result<u64> {
    asking_depth(address, symbol, stop).map_err(|e| match e.downcast_ref::<std::io::Error>().map(std::io::Error::kind) {
        Some(std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => anyhow::anyhow!("GET /api/v3/depth on {address}: no answer within 10 s"),
        _ => e.context(format!("GET /api/v3/depth on {address}")),
    })
}

fn asking_depth(address: &str, symbol: &str, stop: &AtomicBool) -> Result<u64> {
    let stream = TcpStream::connect(address)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let request = format!("GET /api/v3/depth?symbol={symbol}&limit=100 HTTP/1.1\r\nHost: {address}\r\n\r\n");
    let mut answered = 0;
    let mut body = Vec::new();
    while !stop.load(Ordering::Acquire) {
        writer.write_all(request.as_bytes())?;
        let mut status = String::new();
        reader.read_line(&mut status)?;
        let mut length = 0usize;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line)?;
            if line == "\r\n" || line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().unwrap_or(0);
            }
        }
        body.resize(length, 0);
        reader.read_exact(&mut body)?;
        if status.split_whitespace().nth(1) != Some("200") {
            bail!("GET /api/v3/depth answered {}", status.trim());
        }
        answered += 1;
    }
    Ok(answered)
}

/// Connections a watch opens at most (a thread each), and clients asking
/// for the depth.
pub const MAX_CONNECTIONS: usize = 10_000;
pub const MAX_DEPTH_CLIENTS: usize = 1_000;

pub fn run(options: WatchOptions) -> Result<()> {
    let path = format!("/stream?streams={}", options.streams.join("/"));
    let until = Instant::now() + options.duration;
    let started = Instant::now();
    let watchers = (0..options.connections)
        .map(|_| {
            let (address, path) = (options.address.clone(), path.clone());
            std::thread::Builder::new().spawn(move || watch_one(&address, &path, until))
        })
        .collect::<std::io::Result<Vec<_>>>()
        .with_context(|| format!("starting {} watcher threads (one per connection)", options.connections))?;
    let stop = Arc::new(AtomicBool::new(false));
    let requests = Arc::new(AtomicU64::new(0));
    let askers: Vec<_> = (0..options.depth_clients)
        .map(|_| {
            let (address, symbol, stop, requests) = (options.address.clone(), options.depth_symbol.clone(), stop.clone(), requests.clone());
            std::thread::spawn(move || -> Result<()> {
                let answered = ask_depth(&address, &symbol, &stop)?;
                requests.fetch_add(answered, Ordering::AcqRel);
                Ok(())
            })
        })
        .collect();
    let mut latency = hdrhistogram::Histogram::<u64>::new(3)?;
    let (mut messages, mut bytes, mut closed) = (0u64, 0u64, Vec::new());
    for watcher in watchers {
        let seen = watcher.join().map_err(|_| anyhow::anyhow!("a watcher thread panicked"))??;
        messages += seen.messages;
        bytes += seen.bytes;
        latency.add(&seen.trade_latency_ms)?;
        closed.extend(seen.closed);
    }
    if options.depth_clients > 0 {
        let left = until.saturating_duration_since(Instant::now());
        std::thread::sleep(left);
    }
    stop.store(true, Ordering::Release);
    for asker in askers {
        asker.join().map_err(|_| anyhow::anyhow!("a depth client thread panicked"))??;
    }
    let seconds = started.elapsed().as_secs_f64();
    let quantile = |q: f64| if latency.is_empty() { 0 } else { latency.value_at_quantile(q) };
    let report = serde_json::json!({
        "connections": options.connections,
        "streams": options.streams,
        "seconds": seconds,
        "messages": messages,
        "messages_per_s": messages as f64 / seconds,
        "bytes": bytes,
        "trades_timed": latency.len(),
        "trade_latency_ms": {"p50": quantile(0.5), "p90": quantile(0.9), "p99": quantile(0.99), "max": latency.max()},
        "closed_by_server": closed,
        "depth_clients": options.depth_clients,
        "depth_requests_per_s": requests.load(Ordering::Acquire) as f64 / seconds,
    });
    if options.json {
        println!("{report}");
    } else {
        println!("connections {} messages {messages} messages_per_s {:.0} closed_by_server {}", options.connections, messages as f64 / seconds, closed.len());
        println!("trade_latency_ms p50 {} p90 {} p99 {} max {} (over {} trades; from the trade's journal time to its arrival)", quantile(0.5), quantile(0.9), quantile(0.99), latency.max(), latency.len());
        if options.depth_clients > 0 {
            println!("depth_requests_per_s {:.0} ({} clients, limit=100)", requests.load(Ordering::Acquire) as f64 / seconds, options.depth_clients);
        }
    }
    Ok(())
}
