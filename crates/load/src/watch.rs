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

/// The key of every handshake (RFC 6455's own example: the server's
/// answer to it is known, so it is checked without a SHA-1 here), and the
/// mask of every frame the watcher sends. A measuring client has nothing
/// to hide from a proxy; the server only requires that frames are masked.
const HANDSHAKE_KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";
const HANDSHAKE_ACCEPT: &str = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=";
const MASK: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];
/// The largest HTTP answer to the handshake, and the largest frame, a
/// watcher takes.
const MAX_HANDSHAKE: usize = 64 * 1024;
const MAX_FRAME: usize = 64 * 1024 * 1024;
/// Bytes read from the socket at a time (a batch for a busy subscriber
/// is tens of KiB).
const READ_CHUNK: usize = 256 * 1024;

/// Sends the upgrade request and reads the answer; returns the bytes that
/// came after it (the first frames).
fn handshake(stream: &mut TcpStream, address: &str, path: &str) -> Result<Vec<u8>> {
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {HANDSHAKE_KEY}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    );
    stream.write_all(request.as_bytes())?;
    let mut answer = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    let end = loop {
        if let Some(at) = answer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        if answer.len() > MAX_HANDSHAKE {
            bail!("the answer to the WebSocket handshake is over {MAX_HANDSHAKE} bytes without its end");
        }
        let read = stream.read(&mut chunk)?;
        if read == 0 {
            bail!("the server closed the connection during the WebSocket handshake");
        }
        answer.extend_from_slice(&chunk[..read]);
    };
    let head = String::from_utf8_lossy(&answer[..end]);
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("101") {
        // The body says why (`Invalid stream name`): what has come of it.
        let body = String::from_utf8_lossy(&answer[end..]);
        bail!("the server answered {status} {}", body.trim());
    }
    let accept = head.lines().find_map(|line| line.split_once(':').filter(|(name, _)| name.trim().eq_ignore_ascii_case("sec-websocket-accept")).map(|(_, value)| value.trim()));
    if accept != Some(HANDSHAKE_ACCEPT) {
        bail!("the server's Sec-WebSocket-Accept is {accept:?}, not {HANDSHAKE_ACCEPT:?}");
    }
    Ok(answer[end..].to_vec())
}

/// Writes a masked control frame (a Pong or a Close).
fn send_control(stream: &mut TcpStream, opcode: u8, payload: &[u8]) -> std::io::Result<()> {
    // Control frames carry 125 bytes at most.
    let payload = &payload[..payload.len().min(125)];
    let mut frame = Vec::with_capacity(6 + payload.len());
    frame.push(0x80 | opcode);
    frame.push(0x80 | payload.len() as u8);
    frame.extend_from_slice(&MASK);
    frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ MASK[i % 4]));
    stream.write_all(&frame)
}

/// One frame at the front of `bytes`: FIN, opcode, payload range; `None`
/// if it has not all arrived.
fn frame_at(bytes: &[u8]) -> Result<Option<(bool, u8, std::ops::Range<usize>)>> {
    let [first, second, ..] = *bytes else { return Ok(None) };
    if second & 0x80 != 0 {
        bail!("the server sent a masked frame (RFC 6455 forbids it)");
    }
    let (length, header) = match second & 0x7f {
        126 => match bytes.get(2..4) {
            Some(b) => (u16::from_be_bytes([b[0], b[1]]) as u64, 4),
            None => return Ok(None),
        },
        127 => match bytes.get(2..10) {
            Some(b) => (u64::from_be_bytes(b.try_into().expect("8 bytes")), 10),
            None => return Ok(None),
        },
        short => (short as u64, 2),
    };
    if length > MAX_FRAME as u64 {
        bail!("the server sent a frame of {length} bytes (the watcher takes {MAX_FRAME} at most)");
    }
    let end = header + length as usize;
    Ok((bytes.len() >= end).then_some((first & 0x80 != 0, first & 0x0f, header..end)))
}

/// The `"T":<ms>` field of a trade message.
fn trade_time(text: &[u8]) -> Option<u64> {
    let at = memchr::memmem::find(text, b"\"T\":")? + 4;
    let digits = &text[at..];
    let end = digits.iter().position(|c| !c.is_ascii_digit()).unwrap_or(digits.len());
    std::str::from_utf8(&digits[..end]).ok()?.parse().ok()
}

/// How long connecting and the WebSocket handshake may take, at least (a
/// longer run gives them until its end).
const HANDSHAKE: Duration = Duration::from_secs(10);

/// One connection, read until `until`: a frame reader of its own rather
/// than a WebSocket library's, because the subscribers share the machine
/// with the venue they measure and what they spend counts against it
/// (`docs/benchmarks.md`). It takes whatever the socket holds at each read
/// (one clock reading for all of it), walks the frames' headers, answers
/// pings, and looks into a text frame only for a trade's `"T"`.
fn watch_one(address: &str, path: &str, until: Instant) -> Result<Seen> {
    let patience = until.saturating_duration_since(Instant::now()).max(HANDSHAKE);
    let resolved = address.to_socket_addrs().with_context(|| format!("resolving {address}"))?.next().with_context(|| format!("{address} resolves to no address"))?;
    let mut stream = TcpStream::connect_timeout(&resolved, patience).with_context(|| format!("connecting to {address}"))?;
    stream.set_read_timeout(Some(patience))?;
    stream.set_write_timeout(Some(patience))?;
    let url = format!("ws://{address}{path}");
    let first = handshake(&mut stream, address, path).map_err(|e| match e.downcast_ref::<std::io::Error>().map(std::io::Error::kind) {
        Some(std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => anyhow::anyhow!("{url}: no WebSocket handshake from the server within {} s", patience.as_secs_f64()),
        // And the likely cause of an answer that is not a WebSocket's.
        _ => e.context(format!("WebSocket handshake with {url} (is {address} the market-data port?)")),
    })?;
    stream.set_read_timeout(Some(Duration::from_millis(200)))?;
    let mut seen = Seen { messages: 0, bytes: 0, trade_latency_ms: hdrhistogram::Histogram::new(3)?, closed: None };
    let mut buffer = vec![0u8; READ_CHUNK.max(first.len())];
    buffer[..first.len()].copy_from_slice(&first);
    let (mut start, mut filled) = (0, first.len());
    let mut arrived = now_ms();
    let mut closing = false;
    'reading: loop {
        while let Some((fin, opcode, payload)) = frame_at(&buffer[start..filled])? {
            let body = &buffer[start + payload.start..start + payload.end];
            match opcode {
                // Text, binary, and a fragment of either: a message ends
                // at its last frame.
                0..=2 => {
                    seen.bytes += body.len() as u64;
                    seen.messages += u64::from(fin);
                    if opcode == 1 && fin && memchr::memmem::find(body, b"\"e\":\"trade\"").is_some()
                        && let Some(time) = trade_time(body)
                    {
                        seen.trade_latency_ms.saturating_record(arrived.saturating_sub(time));
                    }
                }
                8 => {
                    let reason = body.get(2..).map(String::from_utf8_lossy).unwrap_or_default();
                    seen.closed = Some(reason.into_owned());
                    // The Close echoed, as RFC 6455 asks.
                    let _ = send_control(&mut stream, 8, body.get(..2).unwrap_or_default());
                    closing = true;
                    break 'reading;
                }
                9 => send_control(&mut stream, 10, body)?,
                10 => {}
                other => bail!("the server sent a frame with opcode {other}, which RFC 6455 does not define"),
            }
            start += payload.end;
        }
        buffer.copy_within(start..filled, 0);
        (start, filled) = (0, filled - start);
        // A frame longer than the buffer: room for it.
        if filled == buffer.len() {
            buffer.resize(buffer.len() * 2, 0);
        }
        if Instant::now() >= until {
            break;
        }
        match stream.read(&mut buffer[filled..]) {
            Ok(0) => {
                seen.closed = Some("the server closed the connection without a Close frame".to_string());
                closing = true;
                break;
            }
            Ok(read) => {
                filled += read;
                arrived = now_ms();
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut | std::io::ErrorKind::Interrupted) => {}
            Err(e) => {
                seen.closed = Some(e.to_string());
                closing = true;
                break;
            }
        }
    }
    if !closing {
        let _ = send_control(&mut stream, 8, &1000u16.to_be_bytes());
    }
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
