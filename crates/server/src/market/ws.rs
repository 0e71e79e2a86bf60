//! WebSocket connections: Binance's raw (`/ws/<stream>`, `/ws`) and
//! combined (`/stream?streams=a/b`) endpoints, the `SUBSCRIBE`,
//! `UNSUBSCRIBE`, `LIST_SUBSCRIPTIONS`, `SET_PROPERTY` and `GET_PROPERTY`
//! requests, pings, and the limits (`docs/marketdata.md`); and the
//! WebSocket API (`/ws-api/v3`, `docs/trading.md`): the REST endpoints'
//! work for orders, queries and balances, up to `MAX_IN_FLIGHT` requests
//! at once per connection, and user data stream subscriptions.

use super::http::ApiError;
use super::trading::{self, Auth};
use super::{Connection, Hub, Wrap};
use crate::log;
use crossbook_engine::AccountId;
use axum::extract::WebSocketUpgrade;
use axum::extract::ws::{CloseFrame, Message, WebSocket};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures_util::stream::FuturesOrdered;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Binance's close code for a policy violation (slow consumer, too many
/// messages, silence), and for going away (the server stops).
const POLICY: u16 = 1008;
const GOING_AWAY: u16 = 1001;
/// RFC 6455's close codes for a broken frame, text that is not UTF-8, and
/// a message over the size limit.
const PROTOCOL_ERROR: u16 = 1002;
const INVALID_DATA: u16 = 1007;
const TOO_BIG: u16 = 1009;
/// How long a closing connection's last frame may take to leave, and then
/// how long the client's Close is waited for.
const CLOSE_WAIT: Duration = Duration::from_secs(5);
const CLIENT_CLOSE_WAIT: Duration = Duration::from_secs(1);
/// Messages written to a connection with one flush, at most.
const WRITE_BATCH: usize = 256;

/// Bytes the WebSocket layer reads from a client at a time.
const READ_BUFFER: usize = 4096;

/// The canonical name of a stream (lower-case symbol), if it is one this
/// venue serves.
pub(crate) fn stream_name(hub: &Hub, name: &str) -> Option<String> {
    // A user data stream: a live listen key.
    if !name.contains('@') {
        return hub.trading.as_ref().filter(|t| t.streams.is_live(name)).map(|_| name.to_string());
    }
    if name == super::throttle::ALL_MINI {
        return Some(name.to_string());
    }
    let (symbol, kind) = name.split_once('@')?;
    let upper = symbol.to_ascii_uppercase();
    hub.read().index_of_symbol(&upper)?;
    let known = matches!(kind, "depth" | "depth@100ms" | "depth@1000ms" | "trade" | "aggTrade" | "trade@100ms" | "bookTicker" | "ticker" | "miniTicker")
        || ["5", "10", "20"].iter().any(|n| kind.strip_prefix("depth").and_then(|r| r.strip_prefix(n)).is_some_and(|rest| matches!(rest, "" | "@100ms" | "@1000ms")))
        || kind.strip_prefix("kline_").is_some_and(|i| crossbook_marketdata::candles::interval(i).is_some());
    known.then(|| format!("{}@{kind}", upper.to_ascii_lowercase()))
}

/// Answers a WebSocket upgrade: the streams named in the path are checked
/// first (an unknown one is a 400), and the connection budget (a 503 past
/// it).
pub(crate) fn upgrade(hub: Arc<Hub>, upgrade: WebSocketUpgrade, streams: Vec<String>, combined: bool) -> Response {
    open(hub, upgrade, streams, combined, false)
}

/// Answers a WebSocket API upgrade (`/ws-api/v3`): the same connection
/// budget; requests in the API's shape.
pub(crate) fn upgrade_api(hub: Arc<Hub>, upgrade: WebSocketUpgrade) -> Response {
    if hub.trading.is_none() {
        return ApiError::new(StatusCode::NOT_FOUND, -1020, "The trading API is off on this venue ([market_data] trading = false).").into_response();
    }
    open(hub, upgrade, Vec::new(), false, true)
}

fn open(hub: Arc<Hub>, upgrade: WebSocketUpgrade, streams: Vec<String>, combined: bool, api: bool) -> Response {
    let mut names = Vec::with_capacity(streams.len());
    // A stream named twice is one subscription (as a second SUBSCRIBE).
    let mut named = std::collections::HashSet::with_capacity(streams.len());
    for stream in &streams {
        match stream_name(&hub, stream) {
            Some(name) => {
                if named.insert(name.clone()) {
                    names.push(name);
                }
            }
            None => return ApiError::new(StatusCode::BAD_REQUEST, -1121, format!("Invalid stream name: {stream}.")).into_response(),
        }
    }
    if names.len() > hub.config.max_streams {
        return ApiError::new(StatusCode::BAD_REQUEST, -1101, format!("Too many streams: at most {} per connection.", hub.config.max_streams)).into_response();
    }
    if hub.stopping.load(Ordering::Acquire) {
        return ApiError::new(StatusCode::SERVICE_UNAVAILABLE, -1001, "The server is shutting down.").into_response();
    }
    let peer = super::http::peer();
    // One client address holds at most its share (every connection here
    // has one; a caller outside a connection's task is not limited).
    let address_slot = match peer.map(|address| (address, hub.connections_by_address.take(address))) {
        Some((address, None)) => {
            return ApiError::new(StatusCode::TOO_MANY_REQUESTS, -1003, format!("Too many WebSocket connections from {address}: at most {} per address.", hub.config.max_connections_per_address)).into_response();
        }
        Some((_, slot)) => slot,
        None => None,
    };
    if hub.connections.fetch_add(1, Ordering::AcqRel) >= hub.config.max_connections {
        hub.connections.fetch_sub(1, Ordering::AcqRel);
        return ApiError::new(StatusCode::SERVICE_UNAVAILABLE, -1003, format!("Too many WebSocket connections: at most {}.", hub.config.max_connections)).into_response();
    }
    // The slot is given back when the connection ends, and also when the
    // upgrade never completes (its callback is then dropped unrun).
    let slot = Slot { hub: hub.clone(), _address: address_slot };
    let max = hub.config.max_message;
    // The read buffer holds a client's requests, which are small. The
    // WebSocket layer zeroes up to a buffer's worth each time the socket
    // is polled for reading, which a subscriber's connection is once per
    // batch it is sent: at the 128 KiB default that cleared 128 KiB per
    // batch per connection and was a tenth of the time of the thread that
    // writes to the connections with 100 subscribers (`docs/benchmarks.md`,
    // `perf`). A larger request (up to `max_message`) still arrives
    // whole: the buffer grows for it.
    // The upgraded connection runs in a task of its own: the client's
    // address goes with it (what its signed requests' weight is counted by).
    upgrade.read_buffer_size(READ_BUFFER).max_message_size(max).max_frame_size(max).on_upgrade(move |socket| async move {
        let slot = slot;
        super::http::with_peer(peer, serve(&slot.hub, socket, names, combined, api)).await;
    })
}

/// One of `max_connections` (and of its address's
/// `max_connections_per_address`), held by a connection.
struct Slot {
    hub: Arc<Hub>,
    /// Given back with the slot.
    _address: Option<super::http::AddressSlot>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.hub.connections.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Tells every connection the server is stopping.
pub(crate) fn close_all(hub: &Hub) {
    // The answers still due go out first, within the grace (less a
    // moment for the Close).
    let _ = hub.stop_at.set(Instant::now() + super::http::STOP_GRACE.saturating_sub(Duration::from_millis(500)));
    hub.stopping.store(true, Ordering::Release);
    for connection in hub.live().values() {
        connection.wake.notify_one();
    }
}

/// Why the connection must close now, if it must: it fell behind, or the
/// server stops.
fn closing_reason(hub: &Hub, connection: &Connection) -> Option<(u16, String)> {
    if connection.dropped.load(Ordering::Acquire) {
        return Some((POLICY, format!("slow consumer: more than {} messages waiting", hub.config.queue)));
    }
    hub.stopping.load(Ordering::Acquire).then(|| (GOING_AWAY, "server shutting down".to_string()))
}

/// Sends messages with one flush (one write to the socket for all of
/// them, where there is room), unless the connection must close first: a
/// client that does not read fills its socket, and the send must not wait
/// for it past the moment its queue overflows (or the server stops).
///
/// A WebSocket API connection (`api`) that is sending when the server
/// stops goes on until the stop's time is up (its answers are due: their
/// commands were applied); any other stops sending at once.
async fn send_all<S>(sink: &mut S, messages: Vec<Message>, hub: &Hub, connection: &Connection, api: bool) -> Result<(), Option<(u16, String)>>
where
    S: futures_util::Sink<Message> + Unpin,
{
    let feed_all = async {
        for message in messages {
            sink.feed(message).await?;
        }
        sink.flush().await
    };
    // A client that does not read (with or without subscriptions: the
    // answers to its own requests fill its socket too) is not waited for
    // past three ping intervals, the time it has to answer a ping: its
    // connection's slot would be held for ever.
    let patience = Duration::from_secs(hub.config.ping_interval_s.max(1) * 3);
    tokio::select! {
        sent = feed_all => sent.map_err(|_| None),
        () = tokio::time::sleep(patience) => Err(Some((POLICY, format!("not reading: a write waited {} s", patience.as_secs())))),
        () = async {
            loop {
                // A stopping server waits for the client to read what is
                // due to it until its time is up.
                if let Some(&at) = hub.stop_at.get() {
                    if api {
                        tokio::time::sleep_until(at.into()).await;
                    }
                    return;
                }
                connection.wake.notified().await;
                if connection.dropped.load(Ordering::Acquire) {
                    return;
                }
            }
        } => Err(closing_reason(hub, connection)),
    }
}

/// Until a stopping server's WebSocket API answers must be out (forever
/// while it is not stopping).
async fn stop_deadline(hub: &Hub) {
    match hub.stop_at.get() {
        Some(&at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// One connection's subscriptions and request budget.
struct Session {
    connection: Arc<Connection>,
    streams: Vec<String>,
    combined: bool,
    /// When the messages of the last second came (`max_messages_per_s`
    /// of them at most: one more is one too many).
    recent: std::collections::VecDeque<Instant>,
    /// A WebSocket API connection (`/ws-api/v3`): its user data stream
    /// subscriptions (id, account, the account's listen key), and the next
    /// id.
    api: bool,
    subscriptions: Vec<(u64, AccountId, String)>,
    next_subscription: u64,
}

/// The most user data stream subscriptions one WebSocket API connection
/// holds at once.
const MAX_SUBSCRIPTIONS: usize = 1000;

async fn serve(hub: &Arc<Hub>, socket: WebSocket, names: Vec<String>, combined: bool, api: bool) {
    let (out, mut queued) = tokio::sync::mpsc::unbounded_channel::<Vec<axum::extract::ws::Utf8Bytes>>();
    let connection = Arc::new(Connection { id: hub.new_connection_id(), out, waiting: AtomicUsize::new(0), dropped: AtomicBool::new(false), wake: tokio::sync::Notify::new() });
    hub.live().insert(connection.id, connection.clone());
    let mut session = Session {
        connection: connection.clone(),
        streams: Vec::new(),
        combined,
        recent: std::collections::VecDeque::new(),
        api,
        subscriptions: Vec::new(),
        next_subscription: 0,
    };
    for name in names {
        hub.subscribe(&name, &connection, Wrap::combined(combined));
        session.streams.push(name);
    }
    let (mut sink, mut incoming) = socket.split();
    let every = Duration::from_secs(hub.config.ping_interval_s.max(1));
    let mut pings = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    let mut last_heard = Instant::now();
    // The WebSocket API's answers still waiting for the sequencer, in
    // the order of their requests.
    // `kinds` says what each of them is; a request that reads what an
    // earlier one may change is `held` (and nothing more is read) until
    // it may start.
    let mut pending: FuturesOrdered<Later> = FuturesOrdered::new();
    let mut kinds: std::collections::VecDeque<Kind> = std::collections::VecDeque::new();
    let mut held: Option<(Later, Kind)> = None;
    let api = session.api;
    let closing: Option<(u16, String)> = loop {
        // Stopping, with no answer due (any more: a server that stops
        // sends the WebSocket API's answers to the requests it took first,
        // `docs/trading.md`, "When the venue stops"; and whether or not a
        // send took the stop's wake-up): closed now.
        if hub.stopping.load(Ordering::Acquire) && pending.is_empty() && held.is_none() {
            break closing_reason(hub, &connection);
        }
        tokio::select! {
            message = incoming.next(), if pending.len() < MAX_IN_FLIGHT && held.is_none() => match message {
                Some(Ok(Message::Text(text))) => {
                    last_heard = Instant::now();
                    let answer = if session.api {
                        let (reply, keyed) = session.api_request(hub, text.as_str());
                        if !keyed && let Some(reason) = session.count_message(hub) {
                            break Some(reason);
                        }
                        let answer = match reply {
                            Reply::Now(answer) => answer,
                            Reply::Later(later, kind) if !kind.may_start(&kinds) => {
                                held = Some((later, kind));
                                continue;
                            }
                            Reply::Later(later, kind) => match start(later, kind, &mut pending, &mut kinds) {
                                Some(answer) => answer,
                                None => continue,
                            },
                        };
                        // Behind the answers still waiting, in order.
                        if !pending.is_empty() {
                            pending.push_back(Box::pin(std::future::ready(answer)));
                            kinds.push_back(Kind::Answered);
                            continue;
                        }
                        answer
                    } else {
                        if let Some(reason) = session.count_message(hub) {
                            break Some(reason);
                        }
                        session.request(hub, text.as_str())
                    };
                    if let Err(reason) = send_all(&mut sink, vec![Message::Text(answer.to_string().into())], hub, &connection, api).await {
                        break reason;
                    }
                }
                Some(Ok(Message::Binary(_))) => {
                    last_heard = Instant::now();
                    if let Some(reason) = session.count_message(hub) {
                        break Some(reason);
                    }
                    let answer = if session.api {
                        api_error(&Value::Null, &ApiError::bad(-1000, "Malformed request: requests are text frames."))
                    } else {
                        json!({"error": {"code": 3, "msg": "Invalid JSON: requests are text frames"}, "id": null})
                    };
                    // Behind the answers still waiting, in order.
                    if !pending.is_empty() {
                        pending.push_back(Box::pin(std::future::ready(answer)));
                        kinds.push_back(Kind::Answered);
                        continue;
                    }
                    if let Err(reason) = send_all(&mut sink, vec![Message::Text(answer.to_string().into())], hub, &connection, api).await {
                        break reason;
                    }
                }
                // Pings are answered by the WebSocket layer; any frame
                // shows the client is there.
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => last_heard = Instant::now(),
                // The client closes: the WebSocket layer has its Close
                // ready to echo, and it goes out before the socket does.
                Some(Ok(Message::Close(_))) => {
                    let _ = tokio::time::timeout(CLOSE_WAIT, sink.close()).await;
                    break None;
                }
                Some(Err(e)) => break protocol_error(e),
                None => break None,
            },
            Some(answer) = pending.next(), if !pending.is_empty() => {
                kinds.pop_front();
                let mut answers = vec![Message::Text(answer.to_string().into())];
                if held.as_ref().is_some_and(|(_, kind)| kind.may_start(&kinds))
                    && let Some((later, kind)) = held.take()
                    && let Some(answer) = start(later, kind, &mut pending, &mut kinds)
                {
                    if pending.is_empty() {
                        answers.push(Message::Text(answer.to_string().into()));
                    } else {
                        pending.push_back(Box::pin(std::future::ready(answer)));
                        kinds.push_back(Kind::Answered);
                    }
                }
                if let Err(reason) = send_all(&mut sink, answers, hub, &connection, api).await {
                    break reason;
                }
            }
            messages = queued.recv() => match messages {
                Some(first) => {
                    // Everything queued goes out in one write.
                    let mut batch: Vec<Message> = first.into_iter().map(Message::Text).collect();
                    while batch.len() < WRITE_BATCH {
                        match queued.try_recv() {
                            Ok(more) => batch.extend(more.into_iter().map(Message::Text)),
                            Err(_) => break,
                        }
                    }
                    let count = batch.len();
                    if let Err(reason) = send_all(&mut sink, batch, hub, &connection, api).await {
                        break reason;
                    }
                    connection.waiting.fetch_sub(count, Ordering::AcqRel);
                }
                None => break None,
            },
            // Fell behind: closed now. (The stop: at the loop's top.)
            _ = connection.wake.notified() => {
                if connection.dropped.load(Ordering::Acquire) {
                    break closing_reason(hub, &connection);
                }
            }
            () = stop_deadline(hub), if hub.stopping.load(Ordering::Acquire) => break closing_reason(hub, &connection),
            _ = pings.tick() => {
                // The listen keys behind the connection's subscriptions
                // live as long as it does; one whose key was ended (closed
                // over REST) has had its eventStreamTerminated and is gone.
                if let Some(trading) = &hub.trading {
                    session.subscriptions.retain(|(_, account, key)| trading.streams.keep(*account, key));
                }
                if last_heard.elapsed() > every * 3 {
                    break Some((POLICY, format!("nothing heard for {} s (pong timeout)", (every * 3).as_secs())));
                }
                if let Err(reason) = send_all(&mut sink, vec![Message::Ping(Vec::new().into())], hub, &connection, api).await {
                    break reason;
                }
            }
        }
    };
    for name in &session.streams {
        hub.unsubscribe(name, connection.id);
    }
    hub.live().remove(&connection.id);
    if let Some((code, reason)) = closing {
        if code == POLICY {
            log(&format!("market data: WebSocket connection {} closed: {reason}", connection.id));
        }
        // The reason goes out if the client's socket has room for it (a
        // client that never reads may not: it is not waited for).
        let close = Message::Close(Some(CloseFrame { code, reason: reason.into() }));
        let sent = tokio::time::timeout(CLOSE_WAIT, async {
            let _ = sink.send(close).await;
            let _ = sink.close().await;
        })
        .await;
        // Then the client's Close, for a moment, reading (and leaving)
        // what it sent meanwhile: a socket closed with bytes unread is
        // reset, and a reset can cost the client what was sent to it last.
        if sent.is_ok() {
            let _ = tokio::time::timeout(CLIENT_CLOSE_WAIT, async {
                while let Some(Ok(message)) = incoming.next().await {
                    if matches!(message, Message::Close(_)) {
                        break;
                    }
                }
            })
            .await;
        }
    }
}

/// The numbers among a WebSocket API request's `params` as their text,
/// exactly as written: the signature is over that text (`1.50` is not
/// `1.5`, nor `1e0` `1.0`), and a value is read from it as from a query
/// string. (`Value` keeps a number as an `f64` or an integer, not as
/// written: `written` is the request's `params` as written.)
fn numbers_as_written(written: Option<&Members<'_>>, params: &mut serde_json::Map<String, Value>) {
    let Some(written) = written else { return };
    for (name, value) in params.iter_mut().filter(|(_, value)| value.is_number()) {
        if let Some((_, text)) = written.0.iter().find(|(written, _)| written == name) {
            *value = Value::String(text.get().to_string());
        }
    }
}

/// A JSON object's members in order, each with its value's text as
/// written: what `Value` does not keep (a name given twice: `Value` keeps
/// the last and says nothing, but a signature over the other, or an order
/// read from it, must not be; a number's digits).
struct Members<'a>(Vec<(String, &'a serde_json::value::RawValue)>);

impl<'a> Members<'a> {
    /// The members of the object `text` is, if it is one.
    fn of(text: &'a str) -> Option<Members<'a>> {
        serde_json::from_str(text).ok()
    }

    /// The first name given twice.
    fn twice(&self) -> Option<&str> {
        let mut seen = std::collections::BTreeSet::new();
        self.0.iter().map(|(name, _)| name.as_str()).find(|name| !seen.insert(*name))
    }

    /// The members of the object member `name` is.
    fn object(&self, name: &str) -> Option<Members<'a>> {
        self.0.iter().find(|(member, _)| member == name).and_then(|(_, value)| Members::of(value.get()))
    }
}

impl<'de> serde::Deserialize<'de> for Members<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(self, mut map: M) -> Result<Members<'de>, M::Error> {
                let mut members = Vec::new();
                while let Some(member) = map.next_entry()? {
                    members.push(member);
                }
                Ok(Members(members))
            }
        }
        deserializer.deserialize_map(Visit)
    }
}

impl Session {
    /// Answers one WebSocket API request (`docs/trading.md`, "The
    /// WebSocket API"): `{"id", "status", "result", "rateLimits"}` or
    /// `{"id", "status", "error": {"code", "msg"}}`.
    ///
    /// Also whether the request named a known API key: such a request is
    /// paid for with that key's request weight; any other counts against
    /// the connection's `max_messages_per_s`.
    fn api_request(&mut self, hub: &Arc<Hub>, text: &str) -> (Reply, bool) {
        let mut request = match serde_json::from_str(text) {
            Ok(Value::Object(request)) => request,
            Ok(_) => return (Reply::Now(api_error(&Value::Null, &ApiError::bad(-1000, "Malformed request: a JSON object is expected."))), false),
            Err(e) => return (Reply::Now(api_error(&Value::Null, &ApiError::bad(-1000, format!("Malformed request: {e}.")))), false),
        };
        let written = Members::of(text);
        if let Some(name) = written.as_ref().and_then(Members::twice) {
            return (Reply::Now(api_error(&Value::Null, &ApiError::bad(-1000, format!("Malformed request: '{name}' is given twice.")))), false);
        }
        let written = written.and_then(|request| request.object("params"));
        let id = request.get("id").cloned().unwrap_or(Value::Null);
        if !(id.is_null() || id.is_i64() || id.is_u64() || id.as_str().is_some_and(|s| s.chars().count() <= 36)) {
            return (Reply::Now(api_error(&Value::Null, &ApiError::bad(-1000, "Malformed request: 'id' must be an integer, a string of 36 characters at most, or null."))), false);
        }
        let mut params = request.remove("params");
        let Some(method) = request.get("method").and_then(Value::as_str) else {
            return (Reply::Now(api_error(&id, &ApiError::mandatory("method"))), false);
        };
        let mut params = match params.take() {
            None | Some(Value::Null) => serde_json::Map::new(),
            Some(Value::Object(params)) => params,
            Some(_) => return (Reply::Now(api_error(&id, &ApiError::bad(-1000, "Malformed request: 'params' must be an object."))), false),
        };
        if let Some(name) = written.as_ref().and_then(Members::twice) {
            return (Reply::Now(api_error(&id, &ApiError::bad(-1101, format!("Duplicate values for parameter '{name}'.")))), false);
        }
        numbers_as_written(written.as_ref(), &mut params);
        let params = &params;
        let Some(trading) = &hub.trading else {
            return (Reply::Now(api_error(&id, &ApiError::new(StatusCode::NOT_FOUND, -1020, "The trading API is off on this venue."))), false);
        };
        // Paid for with the key's request weight: only the methods that
        // spend it (a signed one). A public method naming a key counts
        // against the connection's messages a second like any other.
        let spends_weight = TRADING_METHODS.contains(&method) || method == "userDataStream.subscribe.signature";
        let keyed = spends_weight && params.get("apiKey").and_then(Value::as_str).is_some_and(|key| trading.knows_key(key));
        if TRADING_METHODS.contains(&method) {
            return (Reply::Later(Box::pin(api_trading(hub.clone(), id, method.to_string(), params.clone())), Kind::of(method)), keyed);
        }
        (Reply::Now(self.api_answer(hub, trading, &id, method, params)), keyed)
    }

    /// The answer to a well-formed WebSocket API request that is not one
    /// of `TRADING_METHODS`.
    fn api_answer(&mut self, hub: &Hub, trading: &trading::Trading, id: &Value, method: &str, params: &serde_json::Map<String, Value>) -> Value {
        // A subscription whose key was ended (it had its
        // eventStreamTerminated) is over: not listed, not active.
        self.end_terminated(hub, trading);
        if matches!(method, "ping" | "time" | "session.subscriptions")
            && let Some(name) = params.keys().next()
        {
            return api_error(id, &ApiError::bad(-1103, format!("An unknown parameter was sent: '{name}'.")));
        }
        // Market data, answered as its REST endpoint answers.
        if let Some(endpoint) = super::http::Public::of_method(method) {
            return match trading::ws_params(params, endpoint.known()).and_then(|params| {
                trading::check_return_rate_limits(&params)?;
                super::http::public(hub, endpoint, &params)
            }) {
                Ok(result) => json!({"id": id, "status": 200, "result": result}),
                Err(e) => api_error(id, &e),
            };
        }
        match method {
            "userDataStream.subscribe.signature" => {
                // Its refusals once the weight is counted say it, as those
                // of the other signed methods do.
                let (account, used) = match super::http::weighed_now(|| trading.signed(&Auth::Ws(params), &[], |_| 2, false)) {
                    (Ok((account, _, used)), _) => (account, used),
                    (Err(e), Some(used)) => return with_limits(trading, params, api_error(id, &e), used),
                    (Err(e), None) => return api_error(id, &e),
                };
                let refuse = |error: ApiError| with_limits(trading, params, api_error(id, &error), used);
                if self.subscriptions.iter().any(|(_, a, _)| *a == account) {
                    return refuse(ApiError::bad(-1020, "This account already has a subscription on this connection."));
                }
                if self.subscriptions.len() >= MAX_SUBSCRIPTIONS {
                    return refuse(ApiError::bad(-1020, format!("Too many subscriptions: at most {MAX_SUBSCRIPTIONS} per connection.")));
                }
                let key = match trading.streams.open(account) {
                    Ok(key) => key,
                    Err(e) => return refuse(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, -1000, format!("No user data stream: {e}."))),
                };
                let subscription = self.next_subscription;
                self.next_subscription += 1;
                hub.subscribe(&key, &self.connection, Wrap::Event(subscription));
                if !self.streams.contains(&key) {
                    self.streams.push(key.clone());
                }
                self.subscriptions.push((subscription, account, key));
                with_limits(trading, params, json!({"id": id, "status": 200, "result": {"subscriptionId": subscription}}), used)
            }
            "userDataStream.unsubscribe" => {
                if let Some(name) = params.keys().find(|name| *name != "subscriptionId") {
                    return api_error(id, &ApiError::bad(-1103, format!("An unknown parameter was sent: '{name}'.")));
                }
                let ended: Vec<(u64, AccountId, String)> = match params.get("subscriptionId") {
                    None => std::mem::take(&mut self.subscriptions),
                    Some(wanted) => {
                        let Some(wanted) = wanted.as_u64().or_else(|| wanted.as_str().and_then(|s| s.parse().ok())) else {
                            return api_error(id, &ApiError::illegal("subscriptionId", &format!("0-{}", u64::MAX)));
                        };
                        let Some(at) = self.subscriptions.iter().position(|(s, _, _)| *s == wanted) else {
                            return api_error(id, &ApiError::bad(-2035, "User Data Stream subscription not active."));
                        };
                        vec![self.subscriptions.remove(at)]
                    }
                };
                for (_, _, key) in ended {
                    hub.unsubscribe(&key, self.connection.id);
                    self.streams.retain(|s| *s != key);
                }
                json!({"id": id, "status": 200, "result": {}})
            }
            "session.subscriptions" => {
                let list: Vec<Value> = self.subscriptions.iter().map(|(s, _, _)| json!({"subscriptionId": s})).collect();
                json!({"id": id, "status": 200, "result": list})
            }
            "ping" => json!({"id": id, "status": 200, "result": {}}),
            "time" => json!({"id": id, "status": 200, "result": {"serverTime": crate::now_ms()}}),
            other => api_error(id, &ApiError::bad(-1020, format!("Unsupported method: '{other}' (docs/trading.md lists this venue's WebSocket API methods)."))),
        }
    }

    /// Drops the subscriptions whose listen key was ended since.
    fn end_terminated(&mut self, hub: &Hub, trading: &trading::Trading) {
        let mut ended = Vec::new();
        self.subscriptions.retain(|(_, _, key)| {
            let live = trading.streams.is_live(key);
            if !live {
                ended.push(key.clone());
            }
            live
        });
        for key in ended {
            hub.unsubscribe(&key, self.connection.id);
            self.streams.retain(|s| *s != key);
        }
    }

    /// Counts a message against the per-second budget; the close reason if
    /// it is spent.
    fn count_message(&mut self, hub: &Hub) -> Option<(u16, String)> {
        // A sliding window: the messages of the second before this one.
        let now = Instant::now();
        while self.recent.front().is_some_and(|&at| now.duration_since(at) >= Duration::from_secs(1)) {
            self.recent.pop_front();
        }
        if self.recent.len() >= hub.config.max_messages_per_s as usize {
            return Some((POLICY, format!("too many messages: more than {} a second", hub.config.max_messages_per_s)));
        }
        self.recent.push_back(now);
        None
    }

    /// Answers one request.
    fn request(&mut self, hub: &Hub, text: &str) -> Value {
        let request: Value = match serde_json::from_str(text) {
            Ok(value) => value,
            Err(e) => return json!({"error": {"code": 3, "msg": format!("Invalid JSON: {e}")}, "id": null}),
        };
        let id = request.get("id").cloned().unwrap_or(Value::Null);
        let invalid = |msg: String| json!({"error": {"code": 2, "msg": format!("Invalid request: {msg}")}, "id": id});
        if !(id.is_null() || id.is_u64() || id.is_string()) {
            // Not an id to echo.
            return json!({"error": {"code": 2, "msg": "Invalid request: request ID must be an unsigned integer or a string"}, "id": null});
        }
        let Some(method) = request.get("method").and_then(Value::as_str) else {
            return invalid("missing field method".into());
        };
        let params: Vec<Value> = match request.get("params") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(list)) => list.clone(),
            Some(_) => return invalid("params must be an array".into()),
        };
        match method {
            "SUBSCRIBE" | "UNSUBSCRIBE" => {
                let mut names = Vec::with_capacity(params.len());
                for param in &params {
                    let Some(name) = param.as_str().and_then(|s| stream_name(hub, s)) else {
                        return invalid(format!("invalid stream {param}"));
                    };
                    names.push(name);
                }
                if method == "SUBSCRIBE" {
                    let new = names.iter().filter(|n| !self.streams.contains(n)).count();
                    if self.streams.len() + new > hub.config.max_streams {
                        return invalid(format!("too many streams: at most {} per connection", hub.config.max_streams));
                    }
                    for name in names {
                        if !self.streams.contains(&name) {
                            hub.subscribe(&name, &self.connection, Wrap::combined(self.combined));
                            self.streams.push(name);
                        }
                    }
                } else {
                    for name in names {
                        hub.unsubscribe(&name, self.connection.id);
                        self.streams.retain(|s| *s != name);
                    }
                }
                json!({"result": null, "id": id})
            }
            "LIST_SUBSCRIPTIONS" => json!({"result": self.streams, "id": id}),
            "SET_PROPERTY" => match (params.first().and_then(Value::as_str), params.get(1)) {
                (Some("combined"), Some(Value::Bool(combined))) => {
                    self.combined = *combined;
                    hub.set_combined(self.connection.id, *combined);
                    json!({"result": null, "id": id})
                }
                (Some("combined"), _) => json!({"error": {"code": 1, "msg": "Invalid value type: expected Boolean"}, "id": id}),
                (Some(_), _) => json!({"error": {"code": 0, "msg": "Unknown property"}, "id": id}),
                (None, _) => invalid("params must name a property and its value".into()),
            },
            "GET_PROPERTY" => match params.first().and_then(Value::as_str) {
                Some("combined") => json!({"result": self.combined, "id": id}),
                Some(_) => json!({"error": {"code": 0, "msg": "Unknown property"}, "id": id}),
                None => invalid("params must name a property".into()),
            },
            other => invalid(format!("unknown variant {other}, expected one of SUBSCRIBE, UNSUBSCRIBE, LIST_SUBSCRIPTIONS, SET_PROPERTY, GET_PROPERTY")),
        }
    }
}

/// A WebSocket API error answer.
fn api_error(id: &Value, error: &ApiError) -> Value {
    let mut answer = json!({"id": id, "status": error.status.as_u16(), "error": {"code": error.code, "msg": error.msg}});
    if let Some(data) = &error.data {
        answer["error"]["data"] = (**data).clone();
    }
    answer
}

/// The WebSocket API methods that do a REST endpoint's work (signed the
/// WebSocket API's way; the result is the REST answer's body). Several may
/// be in flight on one connection; each is sent to the sequencer in the
/// order the requests came, and answered in that order.
const TRADING_METHODS: [&str; 12] = ["order.place", "order.test", "order.cancel", "order.cancelReplace", "order.amend.keepPriority", "openOrders.cancelAll", "order.status", "openOrders.status", "allOrders", "myTrades", "account.status", "account.commission"];

/// The requests a WebSocket API connection has in flight at most; past
/// it, the next one is read once the oldest is answered.
const MAX_IN_FLIGHT: usize = 64;

/// The close a broken frame from the client gets: 1009 for a message
/// over the size limit, 1002 for any other breach of the protocol; none
/// when the connection itself failed (nothing could be sent).
fn protocol_error(error: axum::Error) -> Option<(u16, String)> {
    match error.into_inner().downcast::<tungstenite::Error>().map(|e| *e) {
        Ok(tungstenite::Error::Capacity(e)) => Some((TOO_BIG, format!("message too big: {e}"))),
        Ok(tungstenite::Error::Protocol(e)) => Some((PROTOCOL_ERROR, format!("protocol error: {e}"))),
        Ok(tungstenite::Error::Utf8(e)) => Some((INVALID_DATA, format!("invalid UTF-8 in a text message: {e}"))),
        _ => None,
    }
}

/// A WebSocket API answer: ready, or waiting for the sequencer.
enum Reply {
    Now(Value),
    Later(Later, Kind),
}

type Later = std::pin::Pin<Box<dyn std::future::Future<Output = Value> + Send>>;

/// What a WebSocket API request in flight is, for the order of their
/// effects: each one reads the account's orders as they are when it
/// starts (an order named by its client id, a duplicate client id, the
/// open-order limit, a query), so it starts only once the earlier
/// requests that may change them are answered. New orders follow new
/// orders at once (a duplicate client id among them is caught as they
/// are handed over), so placing stays pipelined.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `order.place`, `order.test`.
    NewOrder,
    /// Every other trading method: a cancel, an amendment, a query.
    Other,
    /// An answer that was ready, waiting behind earlier ones.
    Answered,
}

impl Kind {
    fn of(method: &str) -> Kind {
        match method {
            "order.place" | "order.test" => Kind::NewOrder,
            _ => Kind::Other,
        }
    }

    /// Whether a request of this kind may start while `ahead` are in flight.
    fn may_start(self, ahead: &std::collections::VecDeque<Kind>) -> bool {
        match self {
            Kind::NewOrder => !ahead.contains(&Kind::Other),
            _ => !ahead.iter().any(|k| *k != Kind::Answered),
        }
    }
}

/// Starts a request: its first poll does its checks, reads the state and
/// hands it to the sequencer, before the next request is read. Its answer
/// if that was all; else it waits in `pending`.
fn start(mut later: Later, kind: Kind, pending: &mut FuturesOrdered<Later>, kinds: &mut std::collections::VecDeque<Kind>) -> Option<Value> {
    let mut context = std::task::Context::from_waker(futures_util::task::noop_waker_ref());
    match later.as_mut().poll(&mut context) {
        std::task::Poll::Ready(answer) => Some(answer),
        std::task::Poll::Pending => {
            pending.push_back(later);
            kinds.push_back(kind);
            None
        }
    }
}

/// `rateLimits` added to a successful answer, unless `returnRateLimits`
/// is `false`.
fn with_limits(trading: &trading::Trading, params: &serde_json::Map<String, Value>, mut answer: Value, used: u32) -> Value {
    if !params.get("returnRateLimits").is_some_and(|flag| *flag == false || *flag == "false") {
        answer["rateLimits"] = json!([{"rateLimitType": "REQUEST_WEIGHT", "interval": "MINUTE", "intervalNum": 1, "limit": trading.max_weight(), "count": used}]);
    }
    answer
}

/// One of `TRADING_METHODS`: the REST endpoint's work. Everything up to
/// the hand-over to the sequencer happens at the first poll (the checks
/// and the reading of the state are synchronous), so polling requests'
/// futures once each as they come keeps their order.
async fn api_trading(hub: Arc<Hub>, id: Value, method: String, params: serde_json::Map<String, Value>) -> Value {
    let Some(trading) = hub.trading.as_deref() else {
        return api_error(&id, &ApiError::new(StatusCode::NOT_FOUND, -1020, "The trading API is off on this venue."));
    };
    let auth = Auth::Ws(&params);
    let changes = matches!(method.as_str(), "order.place" | "order.cancel" | "order.cancelReplace" | "order.amend.keepPriority" | "openOrders.cancelAll");
    if changes && let Err(e) = trading::follower(&hub, "/ws-api/v3", None) {
        return api_error(&id, &e);
    }
    let work = async {
        match method.as_str() {
            "order.place" => trading::new_order_core(&hub, &auth).await,
            "order.cancel" => trading::cancel_order_core(&hub, &auth).await,
            "order.cancelReplace" => trading::cancel_replace_core(&hub, &auth).await,
            "order.test" => trading::test_order_core(&hub, &auth).await,
            "order.amend.keepPriority" => trading::amend_order_core(&hub, &auth).await,
            "openOrders.cancelAll" => trading::cancel_open_orders_core(&hub, &auth).await,
            "order.status" => trading::query_order_core(&hub, &auth).await,
            "openOrders.status" => trading::open_orders_core(&hub, &auth).await,
            "allOrders" => trading::all_orders_core(&hub, &auth).await,
            "myTrades" => trading::my_trades_core(&hub, &auth).await,
            "account.status" => trading::account_core(&hub, &auth).await,
            _ => trading::commission_core(&hub, &auth).await,
        }
    };
    match super::http::weighed(work).await {
        (Ok((result, used)), _) => with_limits(trading, &params, json!({"id": id, "status": 200, "result": result}), used),
        // A refusal after the weight was counted says it too, as Binance's do.
        (Err(e), Some(used)) => with_limits(trading, &params, api_error(&id, &e), used),
        (Err(e), None) => api_error(&id, &e),
    }
}
