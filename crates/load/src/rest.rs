//! `crossbook load --protocol rest` and `--protocol ws-api`: the same
//! orders as the binary and FIX modes, as Binance's signed `POST
//! /api/v3/order` over keep-alive HTTP/1.1 connections, or as its
//! WebSocket API's `order.place` (`/ws-api/v3`); one connection per
//! session, each on a thread of its own, one request in flight (HTTP/1.1
//! has one; the WebSocket API answers a connection's requests in order,
//! one at a time). Closed loop: each session sends
//! its next order when the last is answered. Open loop (`--rate`): each
//! session's orders are due on a fixed schedule and latency is measured
//! from the planned send time. The answer of an order is its
//! acknowledgement, and for an IOC order that crossed, its fill report
//! too (the `FULL` answer carries the fills).
//!
//! The HTTP client is a few lines over a `TcpStream` rather than a crate:
//! the load generator shares two cores with the server it measures, and a
//! request here costs one write and the reads of one answer, no pool, no
//! allocation beyond the answer's bytes.

use crate::{Options, Tally, histogram, order};
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

impl Session {
    fn connect(address: &str, key: &str, secret: &str, ws: bool) -> Result<Session> {
        let stream = TcpStream::connect(address).with_context(|| format!("connecting to {address}"))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        let ws = if ws {
            let (socket, _) = tungstenite::client(format!("ws://{address}/ws-api/v3"), stream.try_clone()?).map_err(|e| anyhow::anyhow!("WebSocket API handshake with {address}: {e}"))?;
            Some(socket)
        } else {
            None
        };
        Ok(Session { stream, host: address.to_string(), key: key.to_string(), secret: secret.as_bytes().to_vec(), buffer: Vec::with_capacity(4096), ws, next_id: 1 })
    }

    /// A signed request: over HTTP `method` `path` with `params` (a query
    /// string; `timestamp` and `signature` added, sent as a form body),
    /// or over the WebSocket API `ws_method` with the same parameters
    /// (`apiKey` and `timestamp` added, sorted, signed). The status and
    /// the body (the WebSocket API's `result`, or its `error`).
    fn signed(&mut self, method: &str, path: &str, ws_method: &str, params: &str) -> Result<(u16, serde_json::Value)> {
        if self.ws.is_some() {
            return self.ws_signed(ws_method, params);
        }
        let (status, body) = self.http_signed(method, path, params)?;
        Ok((status, serde_json::from_slice(&body).unwrap_or_default()))
    }

    fn ws_signed(&mut self, method: &str, params: &str) -> Result<(u16, serde_json::Value)> {
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
        let request = serde_json::json!({"id": id, "method": method, "params": params, }).to_string();
        let Some(socket) = self.ws.as_mut() else { bail!("no WebSocket") };
        socket.send(tungstenite::Message::Text(request.into()))?;
        loop {
            match socket.read()? {
                tungstenite::Message::Text(text) => {
                    let mut answer: serde_json::Value = serde_json::from_str(text.as_str()).context("an answer that is not JSON")?;
                    if answer["id"] != id {
                        continue;
                    }
                    let status = answer["status"].as_u64().unwrap_or(0) as u16;
                    let body = if status == 200 { answer["result"].take() } else { answer["error"].take() };
                    return Ok((status, body));
                }
                tungstenite::Message::Close(frame) => bail!("the server closed the connection: {frame:?}"),
                _ => {}
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
                    let n = self.stream.read(&mut chunk)?;
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
            let n = self.stream.read(&mut chunk)?;
            if n == 0 {
                bail!("the server closed the connection");
            }
            self.buffer.extend_from_slice(&chunk[..n]);
        }
    }
}

/// One session's run: its orders, until `end` or its quota.
fn session(mut http: Session, index: u64, options: &Options, start: Instant, end: Instant, interval: Option<Duration>, quota: u64) -> Tally {
    let mut tally = Tally { ack: histogram(), fill: histogram(), sent: 0, acked: 0, rejected: 0, fills: 0, last_seq: 0, cancels: 0, errors: 0, unanswered: 0, accepted: Vec::new() };
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
        let params = format!(
            "symbol=BTCUSD&side={}&type=LIMIT&timeInForce={}&quantity={}&price={}&selfTradePreventionMode=EXPIRE_TAKER",
            if new_order.side == Side::Buy { "BUY" } else { "SELL" },
            if new_order.tif == TimeInForce::Ioc { "IOC" } else { "GTC" },
            new_order.qty,
            new_order.price
        );
        tally.sent += 1;
        let answer = http.signed("POST", "/api/v3/order", "order.place", &params);
        let nanos = (planned.elapsed().as_nanos() as u64).max(1);
        match answer {
            Ok((200, value)) => {
                tally.ack.saturating_record(nanos);
                tally.acked += 1;
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
            Ok((_, _)) => {
                tally.ack.saturating_record(nanos);
                tally.rejected += 1;
            }
            Err(_) => {
                tally.errors += 1;
                tally.unanswered += 1;
                break;
            }
        }
        // The book keeps a fixed depth: past MAX_RESTING, the oldest is
        // cancelled (gone already, filled: the answer says so; not timed).
        while resting.len() > MAX_RESTING {
            let Some(oldest) = resting.pop_front() else { break };
            tally.cancels += 1;
            if http.signed("DELETE", "/api/v3/order", "order.cancel", &format!("symbol=BTCUSD&orderId={oldest}")).is_err() {
                tally.errors += 1;
                return tally;
            }
        }
    }
    let _ = options;
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
        let handles: Vec<_> = sessions.into_iter().enumerate().map(|(index, http)| scope.spawn(move || session(http, index as u64, options, start, end, interval, quota))).collect();
        handles.into_iter().filter_map(|h| h.join().ok()).collect::<Vec<Tally>>()
    });
    Ok((tallies, start.elapsed().min(options.duration.max(Duration::from_millis(1)))))
}
