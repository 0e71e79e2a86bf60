//! `crossbook load --protocol rest` and `--protocol ws-api`: the same
//! orders as the binary and FIX modes, as Binance's signed `POST
//! /api/v3/order` over keep-alive HTTP/1.1 connections, or as its
//! WebSocket API's `order.place` (`/ws-api/v3`); one connection per
//! session, each on a thread of its own. HTTP/1.1 has one request in
//! flight per connection; the WebSocket API up to `--window` (the server
//! takes a connection's requests in order and answers them in order).
//! Closed loop: each session sends its next order when an answer frees
//! its window. Open loop (`--rate`): each
//! session's orders are due on a fixed schedule and latency is measured
//! from the planned send time. The answer of an order is its
//! acknowledgement, and for an IOC order that crossed, its fill report
//! too (the `FULL` answer carries the fills).
//!
//! The HTTP client is a few lines over a `TcpStream` rather than a crate:
//! the load generator shares two cores with the server it measures, and a
//! request here costs one write and the reads of one answer, no pool, no
//! allocation beyond the answer's bytes.

use crate::{Options, Tally, order};
use anyhow::{Context, Result, bail};
use crossbook_engine::{Side, TimeInForce};
use hmac::{Hmac, Mac};
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Resting orders a session keeps before it cancels the oldest.
const MAX_RESTING: usize = 1_000;
/// The longest answer read (bytes).
const MAX_ANSWER: usize = 1 << 20;

/// One connection, signing as one account.
struct Session {
    stream: TcpStream,
    host: String,
    key: String,
    secret: Vec<u8>,
    buffer: Vec<u8>,
    /// The WebSocket API instead of HTTP (over `stream`'s clone), and the
    /// next request id.
    ws: Option<tungstenite::WebSocket<TcpStream>>,
    next_id: u64,
}

fn now_ms() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis())
}

fn hex_hmac(secret: &[u8], payload: &str) -> Result<String> {
    let Ok(mut mac) = Hmac::<sha2::Sha256>::new_from_slice(secret) else { bail!("no HMAC key") };
    mac.update(payload.as_bytes());
    Ok(mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect())
}

/// A read of an answer, its time-out (10 s) said as one.
fn read_timed(stream: &mut TcpStream, into: &mut [u8]) -> Result<usize> {
    match stream.read(into) {
        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => bail!("no answer within 10 s"),
        other => Ok(other?),
    }
}

impl Session {
    fn connect(address: &str, key: &str, secret: &str, ws: bool) -> Result<Session> {
        let stream = TcpStream::connect(address).with_context(|| format!("connecting to {address}"))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        let ws = if ws {
            let (socket, _) = match tungstenite::client(format!("ws://{address}/ws-api/v3"), stream.try_clone()?) {
                Ok(done) => done,
                Err(tungstenite::HandshakeError::Interrupted(_)) => bail!("WebSocket API handshake with {address}: no answer within 10 s"),
                Err(tungstenite::HandshakeError::Failure(e)) => bail!("WebSocket API handshake with {address}: {e}"),
            };
            // Non-blocking from here: answers are waited for with ppoll
            // (a socket time-out would be rounded up to the scheduler
            // tick, and an open loop's orders would leave late).
            stream.set_nonblocking(true)?;
            Some(socket)
        } else {
            None
        };
        Ok(Session { stream, host: address.to_string(), key: key.to_string(), secret: secret.as_bytes().to_vec(), buffer: Vec::with_capacity(4096), ws, next_id: 1 })
    }

    /// A signed HTTP request (`timestamp` and `signature` added to
    /// `params`, sent as a form body); the status and the body.
    fn signed(&mut self, method: &str, path: &str, params: &str) -> Result<(u16, serde_json::Value)> {
        let (status, body) = self.http_signed(method, path, params)?;
        Ok((status, serde_json::from_slice(&body).unwrap_or_default()))
    }

    /// Sends a signed WebSocket API request without waiting; its id.
    fn ws_send(&mut self, method: &str, params: &str) -> Result<u64> {
        let mut pairs: Vec<(String, String)> = params.split('&').filter_map(|p| p.split_once('=')).map(|(n, v)| (n.to_string(), v.to_string())).collect();
        pairs.push(("apiKey".into(), self.key.clone()));
        pairs.push(("timestamp".into(), now_ms().to_string()));
        pairs.sort();
        let payload = pairs.iter().map(|(n, v)| format!("{n}={v}")).collect::<Vec<_>>().join("&");
        let signature = hex_hmac(&self.secret, &payload)?;
        pairs.push(("signature".into(), signature));
        let id = self.next_id;
        self.next_id += 1;
        let params: serde_json::Map<String, serde_json::Value> = pairs.into_iter().map(|(n, v)| (n, serde_json::Value::String(v))).collect();
        let request = serde_json::json!({"id": id, "method": method, "params": params}).to_string();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&self.stream);
        let Some(socket) = self.ws.as_mut() else { bail!("no WebSocket") };
        let mut sent = socket.send(tungstenite::Message::Text(request.into()));
        // A full socket buffer: the frame waits in the WebSocket's own
        // buffer; flushed as the socket takes it.
        let deadline = Instant::now() + Duration::from_secs(10);
        while matches!(&sent, Err(tungstenite::Error::Io(e)) if e.kind() == std::io::ErrorKind::WouldBlock) {
            if Instant::now() > deadline {
                bail!("the server takes no more requests");
            }
            crate::poll(&mut [libc::pollfd { fd, events: libc::POLLOUT, revents: 0 }], Duration::from_millis(100));
            sent = socket.flush();
        }
        sent?;
        Ok(id)
    }

    /// Waits (ppoll) until the WebSocket has something to read, at most
    /// `timeout`.
    fn ws_wait(&self, timeout: Duration) {
        let fd = std::os::fd::AsRawFd::as_raw_fd(&self.stream);
        crate::poll(&mut [libc::pollfd { fd, events: libc::POLLIN, revents: 0 }], timeout);
    }

    /// The next WebSocket API answer: its id, status and body (`result`,
    /// or `error`); `None` if none has come whole yet.
    fn ws_answer(&mut self) -> Result<Option<(u64, u16, serde_json::Value)>> {
        let Some(socket) = self.ws.as_mut() else { bail!("no WebSocket") };
        loop {
            match socket.read() {
                Ok(tungstenite::Message::Text(text)) => {
                    let mut answer: serde_json::Value = serde_json::from_str(text.as_str()).context("an answer that is not JSON")?;
                    let Some(id) = answer["id"].as_u64() else { continue };
                    let status = answer["status"].as_u64().unwrap_or(0) as u16;
                    let body = if status == 200 { answer["result"].take() } else { answer["error"].take() };
                    return Ok(Some((id, status, body)));
                }
                Ok(tungstenite::Message::Close(frame)) => bail!("the server closed the connection: {frame:?}"),
                Ok(_) => {}
                Err(tungstenite::Error::Io(e)) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => return Ok(None),
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// A signed HTTP request; the status and the body of the answer.
    fn http_signed(&mut self, method: &str, path: &str, params: &str) -> Result<(u16, Vec<u8>)> {
        let payload = format!("{params}&timestamp={}", now_ms());
        let signature = hex_hmac(&self.secret, &payload)?;
        let body = format!("{payload}&signature={signature}");
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nX-MBX-APIKEY: {}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
            self.host,
            self.key,
            body.len()
        );
        self.stream.write_all(request.as_bytes())?;
        self.answer()
    }

    /// Reads one answer: the status line, the headers, `Content-Length`
    /// bytes of body.
    fn answer(&mut self) -> Result<(u16, Vec<u8>)> {
        let mut chunk = [0u8; 8192];
        loop {
            if let Some(end) = self.buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = std::str::from_utf8(&self.buffer[..end]).context("an answer's head is not text")?;
                let status: u16 = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).context("no status in the answer")?;
                let length: usize = head
                    .lines()
                    .find_map(|l| l.split_once(':').filter(|(n, _)| n.eq_ignore_ascii_case("content-length")).and_then(|(_, v)| v.trim().parse().ok()))
                    .context("an answer without Content-Length")?;
                if length > MAX_ANSWER {
                    bail!("an answer of {length} bytes");
                }
                while self.buffer.len() < end + 4 + length {
                    let n = read_timed(&mut self.stream, &mut chunk)?;
                    if n == 0 {
                        bail!("the server closed the connection");
                    }
                    self.buffer.extend_from_slice(&chunk[..n]);
                }
                let body = self.buffer[end + 4..end + 4 + length].to_vec();
                self.buffer.drain(..end + 4 + length);
                return Ok((status, body));
            }
            if self.buffer.len() > MAX_ANSWER {
                bail!("an answer's head longer than {MAX_ANSWER} bytes");
            }
            let n = read_timed(&mut self.stream, &mut chunk)?;
            if n == 0 {
                bail!("the server closed the connection");
            }
            self.buffer.extend_from_slice(&chunk[..n]);
        }
    }
}

/// One session's run: its orders, until `end` or its quota.
fn session(mut http: Session, index: u64, options: &Options, start: Instant, end: Instant, interval: Option<Duration>, quota: u64) -> Tally {
    let mut tally = Tally::new();
    let mut rng = crossbook_workload::Rng::new(0xC0FFEE + index);
    let mut resting: VecDeque<u64> = VecDeque::new();
    let mut next = 0u64;
    while next < quota {
        let planned = match interval {
            Some(interval) => start + interval.mul_f64(next as f64),
            None => Instant::now(),
        };
        if planned >= end {
            break;
        }
        if let Some(wait) = planned.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        next += 1;
        let new_order = order(next, &mut rng);
        let params = order_params(&new_order);
        tally.sent += 1;
        let answer = http.signed("POST", "/api/v3/order", &params);
        let nanos = (planned.elapsed().as_nanos() as u64).max(1);
        match answer {
            Ok((200, value)) => {
                tally.ack.saturating_record(nanos);
                tally.acked += 1;
                if options.acked_out.is_some() {
                    keep_accepted(&mut tally, &value);
                }
                let fills = value["fills"].as_array().map_or(0, Vec::len) as u64;
                if fills > 0 {
                    tally.fills += fills;
                    if new_order.tif == TimeInForce::Ioc {
                        tally.fill.saturating_record(nanos);
                    }
                }
                if matches!(value["status"].as_str(), Some("NEW" | "PARTIALLY_FILLED"))
                    && let Some(id) = value["orderId"].as_u64()
                {
                    resting.push_back(id);
                }
            }
            Ok((status, value)) => {
                tally.ack.saturating_record(nanos);
                tally.reject(refusal(status, &value));
            }
            Err(e) => {
                tally.error(|| format!("an order request: {e}"));
                tally.unanswered += 1;
                break;
            }
        }
        // The book keeps a fixed depth: past MAX_RESTING, the oldest is
        // cancelled (gone already, filled: the answer says so; not timed).
        while resting.len() > MAX_RESTING {
            let Some(oldest) = resting.pop_front() else { break };
            tally.cancels += 1;
            if let Err(e) = http.signed("DELETE", "/api/v3/order", &format!("symbol=BTCUSD&orderId={oldest}")) {
                tally.error(|| format!("a cancel request: {e}"));
                return tally;
            }
        }
    }
    let _ = options;
    tally
}

/// An accepted order's id and `clientOrderId`, for --acked-out.
/// A refused order's reason as the load reports it: the answer's status
/// and Binance error code (`status 429 code -1003` for a weight limit).
fn refusal(status: impl std::fmt::Display, answer: &serde_json::Value) -> String {
    match answer["code"].as_i64().or_else(|| answer["error"]["code"].as_i64()) {
        Some(code) => format!("status {status} code {code}"),
        None => format!("status {status}"),
    }
}

fn keep_accepted(tally: &mut Tally, answer: &serde_json::Value) {
    if let (Some(order), Some(client_id)) = (answer["orderId"].as_u64(), answer["clientOrderId"].as_str()) {
        tally.accepted.push((order, client_id.to_string()));
    }
}

/// An order's parameters, as both ways in take them.
fn order_params(new_order: &crossbook_protocol::NewOrder) -> String {
    format!(
        "symbol=BTCUSD&side={}&type=LIMIT&timeInForce={}&quantity={}&price={}&selfTradePreventionMode=EXPIRE_TAKER",
        if new_order.side == Side::Buy { "BUY" } else { "SELL" },
        if new_order.tif == TimeInForce::Ioc { "IOC" } else { "GTC" },
        new_order.qty,
        new_order.price
    )
}

/// One WebSocket API session's run: up to `--window` requests in flight
/// (the server answers them in order), orders sent when due (open loop)
/// or as answers free the window (closed loop).
fn ws_session(mut ws: Session, index: u64, options: &Options, start: Instant, end: Instant, interval: Option<Duration>, quota: u64) -> Tally {
    let mut tally = Tally::new();
    let mut rng = crossbook_workload::Rng::new(0xC0FFEE + index);
    let mut resting: VecDeque<u64> = VecDeque::new();
    // In flight: id, and for an order its planned time and whether it is
    // an IOC (a cancel is not timed).
    let mut in_flight: VecDeque<(u64, Option<(Instant, bool)>)> = VecDeque::new();
    let window = options.window.max(1) as usize;
    let mut next = 0u64;
    let mut sending = true;
    let drain_until = end + Duration::from_secs(2);
    if interval.is_some() {
        // As in the binary mode's open loop: a wait until the next order
        // is due ends within 1 us of it, not the default 50 us.
        // SAFETY: PR_SET_TIMERSLACK takes one integer argument and affects
        // only the calling thread.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
    }
    loop {
        let now = Instant::now();
        // Whatever is due, within the window.
        while sending && in_flight.len() < window {
            if next >= quota {
                sending = false;
                break;
            }
            let planned = interval.map_or(now, |interval| start + interval.mul_f64(next as f64));
            if planned >= end || now >= end {
                sending = false;
                break;
            }
            if planned > now {
                break;
            }
            next += 1;
            let new_order = order(next, &mut rng);
            match ws.ws_send("order.place", &order_params(&new_order)) {
                Ok(id) => {
                    tally.sent += 1;
                    in_flight.push_back((id, Some((planned, new_order.tif == TimeInForce::Ioc))));
                }
                Err(e) => {
                    tally.error(|| format!("sending an order: {e}"));
                    return tally;
                }
            }
        }
        if !sending && in_flight.is_empty() {
            break;
        }
        if Instant::now() > drain_until {
            tally.unanswered += in_flight.iter().filter(|(_, order)| order.is_some()).count() as u64;
            break;
        }
        let answer = match ws.ws_answer() {
            Ok(Some(answer)) => answer,
            Ok(None) => {
                // Nothing to read: wait for an answer, in an open loop no
                // longer than until the next order is due.
                let wait = match (sending, interval) {
                    (true, Some(interval)) if in_flight.len() < window => (start + interval.mul_f64(next as f64)).saturating_duration_since(Instant::now()),
                    _ => Duration::from_millis(200),
                };
                ws.ws_wait(wait);
                continue;
            }
            Err(e) => {
                tally.error(|| format!("reading an answer: {e}"));
                tally.unanswered += in_flight.iter().filter(|(_, order)| order.is_some()).count() as u64;
                return tally;
            }
        };
        let (id, status, body) = answer;
        let Some(position) = in_flight.iter().position(|(sent, _)| *sent == id) else { continue };
        let Some((_, order)) = in_flight.remove(position) else { continue };
        let Some((planned, ioc)) = order else { continue };
        let nanos = (planned.elapsed().as_nanos() as u64).max(1);
        tally.ack.saturating_record(nanos);
        if status != 200 {
            tally.reject(refusal(status, &body));
            continue;
        }
        tally.acked += 1;
        if options.acked_out.is_some() {
            keep_accepted(&mut tally, &body);
        }
        let fills = body["fills"].as_array().map_or(0, Vec::len) as u64;
        if fills > 0 {
            tally.fills += fills;
            if ioc {
                tally.fill.saturating_record(nanos);
            }
        }
        if matches!(body["status"].as_str(), Some("NEW" | "PARTIALLY_FILLED"))
            && let Some(order_id) = body["orderId"].as_u64()
        {
            resting.push_back(order_id);
        }
        // The book keeps a fixed depth: past MAX_RESTING, the oldest is
        // cancelled (not timed; gone already, filled: its answer says so).
        while resting.len() > MAX_RESTING {
            let Some(oldest) = resting.pop_front() else { break };
            tally.cancels += 1;
            match ws.ws_send("order.cancel", &format!("symbol=BTCUSD&orderId={oldest}")) {
                Ok(id) => in_flight.push_back((id, None)),
                Err(e) => {
                    tally.error(|| format!("sending a cancel: {e}"));
                    return tally;
                }
            }
        }
    }
    tally
}

/// Runs every session on a thread of its own; their tallies and how long
/// sending lasted.
pub(crate) fn drive(options: &Options, secrets: &[String]) -> Result<(Vec<Tally>, Duration)> {
    if secrets.len() < (options.first_account + options.connections - 1) as usize {
        bail!("--protocol rest and ws-api need the secret of each of the {} accounts", options.connections);
    }
    let mut sessions = Vec::new();
    for index in 0..options.connections as usize {
        let account = options.first_account as usize + index - 1;
        sessions.push(Session::connect(&options.address, &options.keys[account], &secrets[account], options.protocol == crate::Protocol::WsApi)?);
    }
    let interval = options.rate.map(|rate| Duration::from_secs_f64(options.connections as f64 / rate));
    let quota = options.count.map_or(u64::MAX, |count| count.div_ceil(options.connections.max(1)));
    let start = Instant::now();
    let end = start + options.duration;
    let tallies = std::thread::scope(|scope| {
        let handles: Vec<_> = sessions
            .into_iter()
            .enumerate()
            .map(|(index, connection)| {
                scope.spawn(move || {
                    if connection.ws.is_some() {
                        ws_session(connection, index as u64, options, start, end, interval, quota)
                    } else {
                        session(connection, index as u64, options, start, end, interval, quota)
                    }
                })
            })
            .collect();
        handles.into_iter().filter_map(|h| h.join().ok()).collect::<Vec<Tally>>()
    });
    Ok((tallies, start.elapsed().min(options.duration.max(Duration::from_millis(1)))))
}
