//! The market-data gateway: Binance-shaped REST and WebSocket feeds and
//! the dashboard, over HTTP on `[market_data] listen` (`docs/marketdata.md`).
//!
//! It is a [`ReportSink`] like the others: the sequencer hands it every
//! durable batch, and it copies the events it needs into a bounded queue
//! to a thread of its own (`market-data`), which applies them to the
//! [`MarketData`] state (pure, `crates/marketdata`) and fans the resulting
//! messages out to the subscribed WebSocket connections. Each connection
//! has a bounded queue: a client that falls behind is disconnected with a
//! reason; neither the sequencer nor other clients ever wait for it. The
//! HTTP server (axum on tokio) runs on threads of its own too, and reads
//! the state under a read lock.
//!
//! Only durable commands are published: the sink is handed a batch once
//! the journal holds it. After a restart the state comes from the
//! gateway's checkpoint in a snapshot plus the journal after it
//! (`ReportSink::checkpoint`), so depth, trade ids, candles and tickers go
//! on where they were.

mod admin;
mod http;
mod throttle;
pub(crate) mod trading;
mod userstream;
mod ws;

use crate::config::Config;
use crate::sink::{Answer, Checkpoint, Durable, Released, ReportSink, RestoreError, REST};
use trading::{RestAnnex, Trading};
use crate::{ServeError, log};
use axum::extract::ws::Utf8Bytes;
use crossbook_engine::{AccountId, Command, Event, EventKind, RejectReason};
use crossbook_marketdata::{CommandContext, InstrumentInfo, MarketData, Unit, Updates, binance_symbol, codec, render};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, sync_channel};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};
use throttle::{Followed, Throttle};

/// Batches waiting for the market-data thread. Past it the sequencer
/// waits for that thread (which never waits for a client): bounded memory,
/// and a thread that only applies events in memory keeps up.
const FEED_QUEUE: usize = 4096;

/// One durable command, as market data and the accounts' records need it.
#[derive(Clone, Copy)]
pub(crate) struct FeedCommand<'a> {
    pub(crate) seq: u64,
    pub(crate) time_ms: u64,
    pub(crate) command: Option<&'a Command>,
    /// The client order id its gateway journaled with it (FIX, REST).
    pub(crate) client_id: Option<&'a str>,
    /// A REST request's annex: its handler waits for the answer.
    pub(crate) rest: Option<&'a RestAnnex>,
    pub(crate) events: &'a [Event],
}

/// A [`FeedCommand`] as its batch carries it to the market-data thread:
/// its events in the batch's `events`: one allocation per batch, not one
/// per command (each is freed by the other thread, which costs the
/// allocator a lock).
struct Queued {
    seq: u64,
    time_ms: u64,
    command: Option<Command>,
    client_id: Option<String>,
    rest: Option<RestAnnex>,
    events: std::ops::Range<usize>,
}

/// What a released batch brings the market-data thread.
#[derive(Default)]
struct FeedBatch {
    /// Its commands that had market-data or account events, or came over
    /// REST.
    commands: Vec<Queued>,
    /// Their events, one command's after another's.
    events: Vec<Event>,
    /// The batch's last sequence number and time.
    last_seq: u64,
    time_ms: u64,
    /// The REST gateway's queries answered, and its orders refused by the
    /// open-order limit.
    answers: Vec<Answer>,
    refused: Vec<(AccountId, RestAnnex)>,
}

enum Feed {
    Batch(FeedBatch),
    /// The state's checkpoint, once every batch before is applied.
    Checkpoint(SyncSender<Vec<u8>>),
}

/// A WebSocket connection's side the market-data thread sees.
pub(crate) struct Connection {
    pub(crate) id: u64,
    /// Messages for it, a batch's worth at a time (one hand-over and one
    /// write per batch, not per message).
    pub(crate) out: tokio::sync::mpsc::UnboundedSender<Vec<Utf8Bytes>>,
    /// Messages handed over and not yet written: past `queue`, it fell
    /// behind.
    pub(crate) waiting: AtomicUsize,
    /// Set (and `wake` notified) when it fell behind: it is closed.
    pub(crate) dropped: AtomicBool,
    pub(crate) wake: tokio::sync::Notify,
}

/// Each connection's messages from one batch (or one throttle round),
/// to be handed over together.
type Outgoing = BTreeMap<u64, (Arc<Connection>, Vec<Utf8Bytes>)>;

/// Adds the messages `payloads` renders to those of every connection
/// subscribed to `name`: rendered once (and once wrapped for `/stream`
/// connections), every connection's copy sharing the bytes.
fn fan_out(subscribers: &BTreeMap<String, Vec<Subscriber>>, outgoing: &mut Outgoing, name: &str, payloads: &dyn Fn() -> Vec<String>) {
    let Some(list) = subscribers.get(name) else { return };
    let mut rendered: Option<Vec<String>> = None;
    let mut raw: Option<Vec<Utf8Bytes>> = None;
    let mut combined: Option<Vec<Utf8Bytes>> = None;
    let mut event: Vec<Utf8Bytes>;
    for subscriber in list {
        let payloads = rendered.get_or_insert_with(payloads);
        let messages = match subscriber.wrap {
            Wrap::Raw => &*raw.get_or_insert_with(|| payloads.iter().map(|data| Wrap::Raw.frame(name, data)).collect()),
            Wrap::Combined => &*combined.get_or_insert_with(|| payloads.iter().map(|data| Wrap::Combined.frame(name, data)).collect()),
            wrap @ Wrap::Event(_) => {
                event = payloads.iter().map(|data| wrap.frame(name, data)).collect();
                &event
            }
        };
        let entry = outgoing.entry(subscriber.connection.id).or_insert_with(|| (subscriber.connection.clone(), Vec::new()));
        entry.1.extend(messages.iter().cloned());
    }
}

/// How a subscriber's messages of a stream are framed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wrap {
    /// The payload alone (`/ws`).
    Raw,
    /// `{"stream", "data"}` (`/stream`, or the `combined` property).
    Combined,
    /// `{"subscriptionId", "event"}`: a user data stream subscribed to
    /// over the WebSocket API (`/ws-api/v3`).
    Event(u64),
}

impl Wrap {
    pub(crate) fn combined(combined: bool) -> Wrap {
        if combined { Wrap::Combined } else { Wrap::Raw }
    }

    fn frame(self, name: &str, data: &str) -> Utf8Bytes {
        match self {
            Wrap::Raw => Utf8Bytes::from(data.to_string()),
            Wrap::Combined => Utf8Bytes::from(format!(r#"{{"stream":"{name}","data":{data}}}"#)),
            Wrap::Event(id) => Utf8Bytes::from(format!(r#"{{"subscriptionId":{id},"event":{data}}}"#)),
        }
    }
}

struct Subscriber {
    connection: Arc<Connection>,
    wrap: Wrap,
}

/// The state, the subscriptions, and the figures the dashboard shows.
pub(crate) struct Hub {
    state: RwLock<MarketData>,
    subscribers: Mutex<BTreeMap<String, Vec<Subscriber>>>,
    pub(crate) config: crate::config::MarketDataConfig,
    pub(crate) connections: AtomicUsize,
    /// WebSocket connections by client address (`max_connections_per_address`).
    pub(crate) connections_by_address: Arc<http::PerAddress>,
    next_connection: AtomicU64,
    /// Logged-in trading sessions: the binary gateway's count, and the
    /// FIX gateway's connected sessions.
    pub(crate) sessions: Arc<AtomicUsize>,
    pub(crate) fix_sessions: Option<Arc<dyn Fn() -> usize + Send + Sync>>,
    /// Messages sent and clients dropped as slow, for the log and stats.
    pub(crate) sent: AtomicU64,
    pub(crate) slow_dropped: AtomicU64,
    /// Every open WebSocket connection (to tell them the server stops).
    live: Mutex<std::collections::HashMap<u64, Arc<Connection>>>,
    pub(crate) stopping: AtomicBool,
    /// When a stopping server's WebSocket API connections must have sent
    /// the answers still due (set with `stopping`).
    pub(crate) stop_at: std::sync::OnceLock<Instant>,
    /// The signed endpoints and user data streams (`market_data.trading`).
    pub(crate) trading: Option<Arc<Trading>>,
    /// Whether this node takes orders, and who leads (a replicated venue).
    pub(crate) node: Arc<crate::replica::NodeState>,
    /// What the venue lists (the sequencer adds to it as the engine adds
    /// assets and instruments).
    listing: Arc<crate::listing::Listing>,
}

impl Hub {
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, MarketData> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, MarketData> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn live(&self) -> MutexGuard<'_, std::collections::HashMap<u64, Arc<Connection>>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn subscribers(&self) -> MutexGuard<'_, BTreeMap<String, Vec<Subscriber>>> {
        self.subscribers.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn new_connection_id(&self) -> u64 {
        self.next_connection.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub(crate) fn subscribe(&self, stream: &str, connection: &Arc<Connection>, wrap: Wrap) {
        let mut subscribers = self.subscribers();
        let list = subscribers.entry(stream.to_string()).or_default();
        if !list.iter().any(|s| s.connection.id == connection.id) {
            list.push(Subscriber { connection: connection.clone(), wrap });
        }
    }

    /// Wraps (or stops wrapping) a connection's messages from the next
    /// batch on, its subscriptions untouched (no message is skipped).
    pub(crate) fn set_combined(&self, connection: u64, combined: bool) {
        for list in self.subscribers().values_mut() {
            for subscriber in list.iter_mut().filter(|s| s.connection.id == connection && matches!(s.wrap, Wrap::Raw | Wrap::Combined)) {
                subscriber.wrap = Wrap::combined(combined);
            }
        }
    }

    pub(crate) fn unsubscribe(&self, stream: &str, connection: u64) {
        let mut subscribers = self.subscribers();
        if let Some(list) = subscribers.get_mut(stream) {
            list.retain(|s| s.connection.id != connection);
            if list.is_empty() {
                subscribers.remove(stream);
            }
        }
    }

    /// Sends `messages` to every subscriber of stream `name` (a user data
    /// stream's listen key).
    pub(crate) fn send_to_stream(&self, name: &str, messages: Vec<String>) {
        self.send_framed(name, |_| &messages);
    }

    /// Sends the last message of stream `name` (an ended listen key):
    /// `message` to its subscribers over `/ws` and `/stream`, `event`
    /// (wrapped) to those over the WebSocket API.
    pub(crate) fn send_ending(&self, name: &str, message: String, event: String) {
        let (message, event) = ([message], [event]);
        self.send_framed(name, |wrap| if matches!(wrap, Wrap::Event(_)) { &event } else { &message });
    }

    /// Sends each subscriber of stream `name` the messages `payloads`
    /// gives for its framing, framed.
    fn send_framed<'a>(&self, name: &str, payloads: impl Fn(Wrap) -> &'a [String]) {
        let outgoing: Vec<(Arc<Connection>, Vec<Utf8Bytes>)> = {
            let subscribers = self.subscribers();
            let Some(list) = subscribers.get(name) else { return };
            list.iter().map(|s| (s.connection.clone(), payloads(s.wrap).iter().map(|data| s.wrap.frame(name, data)).collect())).collect()
        };
        for (connection, messages) in outgoing {
            self.deliver(&connection, messages);
        }
    }

    /// Ends stream `name` for every subscriber (an ended listen key).
    pub(crate) fn drop_stream(&self, name: &str) {
        self.subscribers().remove(name);
    }

    /// Sends what a batch changed to the streams that follow every batch,
    /// and hands it to `throttle` for those sent on a clock.
    fn publish(&self, updates: &Updates, throttle: &mut Throttle) {
        if updates.instruments.is_empty() {
            return;
        }
        let subscribers = self.subscribers();
        if subscribers.is_empty() {
            return;
        }
        let state = self.read();
        let mut outgoing = Outgoing::new();
        let all_mini = subscribers.contains_key(throttle::ALL_MINI);
        for update in &updates.instruments {
            let data = &state.instruments[update.index];
            let followed = Followed::of(&subscribers, &data.info.binance);
            if followed.none() && !all_mini {
                continue;
            }
            let mut send = |kind: usize, payloads: &dyn Fn() -> Vec<String>| {
                if let Some(name) = followed.name(kind) {
                    fan_out(&subscribers, &mut outgoing, name, payloads);
                }
            };
            if let Some(diff) = &update.depth {
                send(throttle::DEPTH, &|| vec![render::depth_update_text(data, diff, updates.time_ms)]);
                for (level, levels) in throttle::PARTIAL_LEVELS.into_iter().enumerate() {
                    send(throttle::PARTIAL + level, &|| vec![render::partial_depth(&state, data, levels).to_string()]);
                }
            }
            if !update.trades.is_empty() {
                send(throttle::TRADE, &|| update.trades.iter().map(|t| render::trade_text(data, t, updates.time_ms)).collect());
                send(throttle::AGG_TRADE, &|| update.trades.iter().map(|t| render::agg_trade_text(data, t, updates.time_ms)).collect());
            }
            if update.top_changed {
                send(throttle::BOOK_TICKER, &|| vec![render::book_ticker_update(&state, data).to_string()]);
            }
            throttle.changed(&followed, all_mini, update, updates.time_ms);
        }
        drop(state);
        drop(subscribers);
        self.deliver_all(outgoing);
    }

    fn deliver_all(&self, outgoing: Outgoing) {
        for (connection, messages) in outgoing.into_values() {
            self.deliver(&connection, messages);
        }
    }

    fn deliver(&self, connection: &Connection, messages: Vec<Utf8Bytes>) {
        if connection.dropped.load(Ordering::Acquire) {
            return;
        }
        let count = messages.len();
        // Behind by more than `queue` when the next messages come (one
        // big publish alone, of one batch or of all those sent together,
        // never drops a client that keeps up).
        if connection.waiting.load(Ordering::Acquire) > self.config.queue {
            connection.dropped.store(true, Ordering::Release);
            connection.wake.notify_one();
            self.slow_dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        connection.waiting.fetch_add(count, Ordering::AcqRel);
        if connection.out.send(messages).is_ok() {
            self.sent.fetch_add(count as u64, Ordering::Relaxed);
        }
    }
}

/// What market data knows of the configured instruments.
pub(crate) fn instruments(config: &Config) -> Result<Vec<InstrumentInfo>, crate::config::ConfigError> {
    let listed = crate::listing::Listed::of(config)?;
    let mut seen = std::collections::HashSet::new();
    (0..listed.instruments.len())
        .map(|index| {
            let info = info(&listed, index)?;
            if !seen.insert(info.binance.clone()) {
                return Err(crate::config::ConfigError::SymbolClash { symbol: info.symbol, binance: info.binance });
            }
            Ok(info)
        })
        .collect()
}

/// What market data knows of the listed instrument at `index`.
fn info(listed: &crate::listing::Listed, index: usize) -> Result<InstrumentInfo, crate::config::ConfigError> {
    let (i, units) = (&listed.instruments[index], &listed.fix[index]);
    let asset = |id: u32| listed.asset(id).map_or_else(|| id.to_string(), |a| a.name.clone());
    // (`fix::venue::instruments` has refused a unit whose digits a u64
    // cannot carry.)
    let unit = |d: crossbook_fix::decimal::Decimal| Unit { mantissa: u64::try_from(d.mantissa).unwrap_or(u64::MAX), scale: d.scale };
    let binance = binance_symbol(&i.symbol);
    if binance.is_empty() {
        return Err(crate::config::ConfigError::BadName { what: "instrument symbol (market data writes its letters and digits, and it has none)", name: i.symbol.clone() });
    }
    Ok(InstrumentInfo {
        id: i.id,
        symbol: i.symbol.clone(),
        binance,
        base: i.base,
        quote: i.quote,
        base_asset: asset(i.base),
        quote_asset: asset(i.quote),
        price_unit: unit(units.price_unit),
        qty_unit: unit(units.qty_unit),
        min_price: i.min_price,
        max_price: i.max_price,
        min_qty: i.min_qty,
        max_qty: i.max_qty,
        tick_size: i.tick_size,
        lot_size: i.lot_size,
        base_asset_unit: Unit { mantissa: 1, scale: listed.asset(i.base).map_or(0, |a| a.decimals) },
        quote_asset_unit: Unit { mantissa: 1, scale: listed.asset(i.quote).map_or(0, |a| a.decimals) },
        maker_bps: i.maker_bps,
        taker_bps: i.taker_bps,
    })
}

/// The market-data gateway: its state, its thread, its HTTP server.
pub(crate) struct Market {
    pub(crate) hub: Arc<Hub>,
    feed: Mutex<Option<SyncSender<Feed>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    http: Mutex<Option<http::Running>>,
}

impl Market {
    pub(crate) fn new(
        config: &Config,
        listing: Arc<crate::listing::Listing>,
        keys: Arc<crate::keys::Keys>,
        sessions: Arc<AtomicUsize>,
        fix_sessions: Option<Arc<dyn Fn() -> usize + Send + Sync>>,
        node: Arc<crate::replica::NodeState>,
    ) -> Result<Arc<Market>, ServeError> {
        let listed = listing.get();
        let infos = (0..listed.instruments.len()).map(|index| info(&listed, index)).collect::<Result<Vec<_>, _>>()?;
        let hub = Arc::new(Hub {
            state: RwLock::new(MarketData::new(infos, 0)),
            subscribers: Mutex::new(BTreeMap::new()),
            config: config.market_data.clone(),
            connections: AtomicUsize::new(0),
            connections_by_address: http::PerAddress::new(config.market_data.max_connections_per_address),
            next_connection: AtomicU64::new(0),
            sessions,
            fix_sessions,
            sent: AtomicU64::new(0),
            slow_dropped: AtomicU64::new(0),
            live: Mutex::new(std::collections::HashMap::new()),
            stopping: AtomicBool::new(false),
            stop_at: std::sync::OnceLock::new(),
            trading: config.market_data.trading.then(|| Arc::new(Trading::new(config, &listed, keys))),
            node,
            listing,
        });
        {
            let mut state = hub.write();
            state.accounts.gateway_cids = gateway_cids();
            state.accounts.set_windows(config.market_data.orders_kept, config.market_data.trades_kept);
        }
        Ok(Arc::new(Market { hub, feed: Mutex::new(None), thread: Mutex::new(None), http: Mutex::new(None) }))
    }

    /// Starts the market-data thread and the HTTP server (after the
    /// start-up replay: the state is the recovered one); the REST
    /// gateway's commands go to the sequencer through `link`.
    pub(crate) fn start(&self, link: trading::SequencerLink) -> Result<SocketAddr, ServeError> {
        {
            // Diffs go on from the recovered state.
            let mut state = self.hub.write();
            let seq = state.seq;
            state.diffs_from(seq);
            self.hub.node.market_seq.store(seq, Ordering::Release);
            if let Some(trading) = &self.hub.trading {
                // REST orders' client ids go on after the journal's.
                trading.next_cid.store(state.accounts.largest_gateway_cid.max(trading::REST_CID_BASE) + 1, Ordering::Relaxed);
                trading.connect(link);
            }
        }
        let (sender, receiver) = sync_channel::<Feed>(FEED_QUEUE);
        let hub = self.hub.clone();
        let thread = std::thread::Builder::new().name("market-data".into()).spawn(move || feed_loop(&hub, receiver)).map_err(ServeError::io("starting the market-data thread"))?;
        *self.feed.lock().unwrap_or_else(|e| e.into_inner()) = Some(sender);
        *self.thread.lock().unwrap_or_else(|e| e.into_inner()) = Some(thread);
        let running = http::start(self.hub.clone())?;
        let address = running.address;
        *self.http.lock().unwrap_or_else(|e| e.into_inner()) = Some(running);
        log(&format!("market data on http://{address}/ (REST /api/v3/..., WebSocket /ws and /stream, the dashboard at /)"));
        Ok(address)
    }

    /// Stops the HTTP server (every WebSocket closed with a reason) and the
    /// thread, after what was queued.
    pub(crate) fn stop(&self) {
        if let Some(running) = self.http.lock().unwrap_or_else(|e| e.into_inner()).take() {
            running.stop();
        }
        self.feed.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(thread) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = thread.join();
        }
        log(&format!(
            "market data: {} messages sent, {} slow clients disconnected",
            self.hub.sent.load(Ordering::Relaxed),
            self.hub.slow_dropped.load(Ordering::Relaxed)
        ));
    }

    fn send(&self, feed: Feed) -> Result<(), Feed> {
        let sender = self.feed.lock().unwrap_or_else(|e| e.into_inner()).clone();
        match sender {
            Some(sender) => sender.send(feed).map_err(|e| e.0),
            None => Err(feed),
        }
    }
}

/// The engine client ids the REST gateway gives its orders.
fn gateway_cids() -> std::ops::Range<u64> {
    trading::REST_CID_BASE..crate::fix::venue::FIX_CID_BASE
}

/// Applies one batch's commands, answering the REST requests among them
/// as each is applied and collecting the user data streams' execution
/// reports in `out`. What changed for market data waits in `state` for
/// `take_updates`.
fn apply_batch(hub: &Hub, state: &mut MarketData, batch: &FeedBatch, out: &mut Vec<(String, String)>) {
    for queued in &batch.commands {
        let command = FeedCommand {
            seq: queued.seq,
            time_ms: queued.time_ms,
            command: queued.command.as_ref(),
            client_id: queued.client_id.as_deref(),
            rest: queued.rest.as_ref(),
            events: &batch.events[queued.events.clone()],
        };
        let context = command.command.map(|c| CommandContext { command: c, client_id: command.client_id, gateway: command.rest.is_some() });
        state.apply_command(command.seq, command.time_ms, context, command.events);
        list_added(hub, state, command.events);
        if let Some(trading) = &hub.trading {
            if let Some(annex) = command.rest {
                trading.applied(state, &command, annex);
            }
            userstream::after_command(trading, state, &command, out);
        }
    }
    state.advance(batch.last_seq, batch.time_ms);
}

/// Lists the asset or instrument a durable command added (the sequencer
/// listed it with its settings when the engine added it), once that
/// command is applied here: from then on the REST API, the streams and
/// the dashboard know it.
fn list_added(hub: &Hub, state: &mut MarketData, events: &[Event]) {
    for event in events {
        match event.kind {
            EventKind::InstrumentAdded { instrument, symbol } => {
                let listed = hub.listing.get();
                let Some(index) = listed.instruments.iter().position(|i| i.id == instrument) else { continue };
                match info(&listed, index) {
                    Ok(info) => {
                        let binance = info.binance.clone();
                        if state.add_instrument(info) {
                            log(&format!("market data: instrument {instrument} ({symbol}) listed as {binance} from command {}", state.seq));
                        } else if state.index_of_id(instrument).is_none() {
                            log(&format!("market data: instrument {instrument} ({symbol}) is not listed: another instrument is {binance}"));
                        }
                    }
                    Err(why) => log(&format!("market data: instrument {instrument} ({symbol}) is not listed: {why}")),
                }
            }
            EventKind::AssetAdded { asset, .. } => {
                if let (Some(trading), Some(listed)) = (&hub.trading, hub.listing.get().asset(asset)) {
                    trading.add_asset(listed);
                }
            }
            _ => {}
        }
    }
}

/// After a batch is applied: the REST gateway's refusals and answers, and
/// the user data streams' messages (the market-data feeds follow, for
/// this batch and the ones applied with it).
fn finish_batch(hub: &Hub, batch: FeedBatch, out: Vec<(String, String)>) {
    if let Some(trading) = &hub.trading {
        for (account, annex) in &batch.refused {
            trading.refused(*account, annex);
        }
        // The batch's execution reports before any balances answered with
        // it (an answer reflects the commands before it in the batch).
        userstream::send_reports(hub, out);
        for answer in batch.answers {
            if answer.query.token == userstream::USER_STREAM_TOKEN {
                userstream::balances(hub, trading, &hub.read(), &answer);
            } else {
                trading.answered(answer);
            }
        }
        userstream::ask_due(trading);
    }
}

fn feed_loop(hub: &Hub, receiver: Receiver<Feed>) {
    // `market_data.nice`: measured with `crossbook load` on 2 cores, 10
    // made the venue take 15% more orders/s in a closed loop and made the
    // `@trade` p99 at 50,000 orders/s 20 to 32 ms instead of 7
    // (docs/benchmarks.md): a choice for the operator, 0 by default.
    if hub.config.nice > 0 {
        lower_priority(hub.config.nice);
    }
    let interval = Duration::from_micros(hub.config.send_interval_us);
    let mut throttle = Throttle::default();
    // Batches applied whose feeds have not gone out yet, and when the
    // feeds last went out.
    let mut unsent = 0usize;
    let mut last_sent: Option<Instant> = None;
    let mut next: Option<Feed> = None;
    loop {
        // Waits for the next batch, or until the feeds of those applied
        // are due (`send_interval_us` after the last send), or the next
        // `@100ms` or `@1000ms` message is (no wake-ups while none is
        // owed).
        let send_due = (unsent > 0).then(|| last_sent.map_or_else(Instant::now, |at| at + interval));
        let due = match (throttle.next_due(), send_due) {
            (Some(one), Some(other)) => Some(one.min(other)),
            (one, other) => one.or(other),
        };
        let feed = match next.take() {
            Some(feed) => Ok(feed),
            None => match due {
                None => receiver.recv().map_err(|_| RecvTimeoutError::Disconnected),
                Some(due) => receiver.recv_timeout(due.saturating_duration_since(Instant::now())),
            },
        };
        match feed {
            Ok(Feed::Batch(batch)) => {
                apply_and_finish(hub, batch);
                unsent += 1;
            }
            // A checkpoint is of a state whose feeds went out.
            Ok(Feed::Checkpoint(answer)) => {
                if unsent > 0 {
                    send_feeds(hub, &mut throttle);
                    (unsent, last_sent) = (0, Some(Instant::now()));
                }
                let _ = answer.send(codec::encode(&hub.read()));
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                if unsent > 0 {
                    send_feeds(hub, &mut throttle);
                }
                break;
            }
        }
        let now = Instant::now();
        if unsent > 0 && last_sent.is_none_or(|at| now >= at + interval) {
            // The batches already waiting are applied before the feeds
            // go out, which then cover them all (a depth diff from the
            // first's `U` to the last's `u`): behind, the thread writes
            // to each connection once for all of them, not once a batch,
            // and catches up; keeping up, it sends what came within the
            // interval together, and a batch after a quiet interval at
            // once.
            let mut coalesced = 1;
            while coalesced < COALESCED_BATCHES {
                match receiver.try_recv() {
                    Ok(Feed::Batch(waiting)) => {
                        apply_and_finish(hub, waiting);
                        coalesced += 1;
                    }
                    Ok(other) => {
                        next = Some(other);
                        break;
                    }
                    Err(_) => break,
                }
            }
            send_feeds(hub, &mut throttle);
            (unsent, last_sent) = (0, Some(Instant::now()));
        }
        throttle.flush(hub, Instant::now());
    }
}

/// Applies one batch, then answers and reports what it did (its feeds go
/// out with [`send_feeds`]).
fn apply_and_finish(hub: &Hub, batch: FeedBatch) {
    let mut out = Vec::new();
    let seq = {
        let mut state = hub.write();
        apply_batch(hub, &mut state, &batch, &mut out);
        state.seq
    };
    finish_batch(hub, batch, out);
    // (A new leader takes orders once this has caught up.)
    hub.node.market_seq.store(seq, Ordering::Release);
}

/// Sends the feeds of every batch applied since the last send.
fn send_feeds(hub: &Hub, throttle: &mut Throttle) {
    let updates = hub.write().take_updates();
    hub.publish(&updates, throttle);
}

/// Batches waiting in its queue that the thread applies, once a send is
/// due, before it sends (a thread that has fallen behind catches up in
/// rounds of this many, so the feeds still move while it does; within a
/// `send_interval_us` any number go out together).
const COALESCED_BATCHES: usize = 64;

/// Gives the calling thread the nice value `nice` (Linux: a thread's own
/// priority). Best effort: a system that refuses leaves it where it was.
fn lower_priority(nice: libc::c_int) {
    #[cfg(target_os = "linux")]
    // SAFETY: setpriority reads its arguments only; gettid cannot fail.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, nice);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = nice;
}

/// The events market data and the accounts' records follow.
fn wanted(event: &Event) -> bool {
    matches!(
        event.kind,
        EventKind::Accepted { .. }
            | EventKind::Trade { .. }
            | EventKind::Cancelled { .. }
            | EventKind::Replaced { .. }
            | EventKind::Rejected { reason: RejectReason::FokCannotFill }
            | EventKind::Halted { .. }
            | EventKind::Resumed { .. }
            | EventKind::AssetAdded { .. }
            | EventKind::InstrumentAdded { .. }
    )
}

/// A command's REST annex, and the client order id its gateway journaled
/// with it (a REST order's, or a FIX order's or replace's ClOrdID).
fn annex_of(annex: Option<&[u8]>) -> (Option<RestAnnex>, Option<String>) {
    let Some(bytes) = annex else { return (None, None) };
    if let Some(rest) = RestAnnex::decode(bytes) {
        let client_id = (!rest.client_id.is_empty()).then(|| rest.client_id.clone());
        return (Some(rest), client_id);
    }
    match crate::fix::venue::Annex::decode(bytes) {
        Some(fix) if matches!(fix.kind, b'D' | b'G') => (None, Some(fix.cl_ord_id)),
        _ => (None, None),
    }
}

/// One durable command as the market-data thread needs it, if it needs
/// it, its events added to `events`.
fn feed_command(durable: &Durable<'_>, events: &mut Vec<Event>) -> Option<Queued> {
    let (rest, client_id) = annex_of(durable.annex);
    if rest.is_none() && !durable.events.iter().any(wanted) {
        return None;
    }
    let start = events.len();
    // A REST command's answer needs all of its events (a reject's reason).
    if rest.is_some() {
        events.extend_from_slice(durable.events);
    } else {
        events.extend(durable.events.iter().filter(|e| wanted(e)));
    }
    Some(Queued { seq: durable.seq, time_ms: durable.time_ms, command: Some(*durable.command), client_id, rest, events: start..events.len() })
}

/// The sequencer's side of the market-data gateway.
pub(crate) struct MarketSink(pub(crate) Arc<Market>);

impl ReportSink for MarketSink {
    fn stop_intake(&mut self) {
        if let Some(trading) = &self.0.hub.trading {
            trading.close();
        }
    }

    fn settled(&self) -> bool {
        self.0.hub.trading.as_ref().is_none_or(|trading| trading.settled())
    }

    /// The listen keys of accounts whose API keys a configuration reload
    /// changed or took away end (`listenKeyExpired`), as when a key's
    /// hour is up: they were opened with the old credentials.
    fn revoked(&mut self, changed: &crate::keys::Changed) {
        let Some(trading) = &self.0.hub.trading else { return };
        for &account in &changed.api_keys {
            if let Some(key) = trading.streams.end_account(account) {
                log(&format!("user data stream of account {account} ended: its API key was changed or removed by a configuration reload"));
                userstream::expired(&self.0.hub, &key);
            }
        }
    }

    fn released(&mut self, batch: &Released<'_>) {
        // At most every command and every event of the batch: one
        // allocation each, not a doubling as they come.
        let mut feed = FeedBatch { commands: Vec::with_capacity(batch.commands.len()), events: Vec::with_capacity(batch.events.len()), ..FeedBatch::default() };
        for durable in batch.durable() {
            feed.last_seq = durable.seq;
            feed.time_ms = durable.time_ms;
            feed.commands.extend(feed_command(&durable, &mut feed.events).map(|mut command| {
                // Another node's REST request: nobody waits for it here.
                if batch.from_log()
                    && let Some(annex) = command.rest.as_mut()
                {
                    annex.request = 0;
                }
                command
            }));
        }
        for refusal in batch.refused().filter(|r| r.source == REST) {
            if let Some(annex) = refusal.annex.and_then(RestAnnex::decode) {
                feed.refused.push((refusal.place.account, annex));
            }
        }
        feed.answers.extend(batch.answers().filter(|a| a.source == REST).cloned());
        if feed.last_seq == 0 && feed.refused.is_empty() && feed.answers.is_empty() {
            return;
        }
        if let Err(Feed::Batch(feed)) = self.0.send(Feed::Batch(feed)) {
            // No thread (not started, or stopped): the state follows all
            // the same, nothing is sent.
            let hub = &self.0.hub;
            let mut state = hub.write();
            apply_batch(hub, &mut state, &feed, &mut Vec::new());
            let _ = state.take_updates();
        }
    }

    fn recovered(&mut self, durable: &Durable<'_>) {
        let mut state = self.0.hub.write();
        let (rest, client_id) = annex_of(durable.annex);
        let context = CommandContext { command: durable.command, client_id: client_id.as_deref(), gateway: rest.is_some() };
        state.apply_command(durable.seq, durable.time_ms, Some(context), durable.events);
        list_added(&self.0.hub, &mut state, durable.events);
        let _ = state.take_updates();
    }

    fn name(&self) -> &str {
        "market_data"
    }

    fn checkpoint(&mut self, _seq: u64) -> Option<Checkpoint> {
        let (answer, answered) = sync_channel(1);
        match self.0.send(Feed::Checkpoint(answer)) {
            Ok(()) => Some(Checkpoint::Soon(answered)),
            Err(_) => Some(Checkpoint::Now(codec::encode(&self.0.hub.read()))),
        }
    }

    fn restore(&mut self, state: &[u8]) -> Result<(), RestoreError> {
        let mut market = self.0.hub.write();
        codec::restore(&mut market, state).map_err(|e| RestoreError(e.to_string()))
    }

    fn reset(&mut self) {
        let mut market = self.0.hub.write();
        *market = MarketData::new(market.instruments.iter().map(|d| d.info.clone()).collect(), 0);
        market.accounts.gateway_cids = gateway_cids();
        market.accounts.set_windows(self.0.hub.config.orders_kept, self.0.hub.config.trades_kept);
    }
}
