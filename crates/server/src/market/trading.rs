//! Binance's signed spot endpoints on the market-data port
//! (`docs/trading.md`): orders placed, cancelled and queried over REST,
//! the account's balances, orders and trades, and user data streams.
//!
//! An order over REST is a command like any other: the handler (on the
//! HTTP thread) checks the request (key, signature, time window, weight,
//! parameters), turns it into an engine command with an annex (the
//! request's number and the client order id), queues it for the sequencer
//! beside the FIX gateway's commands, and waits. The sequencer journals and
//! applies it; once the journal holds it durably, the market-data thread
//! applies its events to the accounts' records and answers the waiting
//! handler with the order as it stands right after its command. So the
//! answer says only what is durable (in `sync` mode the HTTP response
//! waits for the fsync), and a `GET /api/v3/order` sent after the answer
//! always finds the order. Balances come from the engine itself: a query
//! the sequencer answers in sequence (`sink::Query`), released with its
//! batch.

use super::http::{ApiError, Params, json_response};
use super::userstream::USER_STREAM_TOKEN;
use super::{FeedCommand, Hub};
use crate::config::Config;
use crate::{lock, now_ms, read};
use crate::sequencer::{InFlight, Inbound, Request};
use crate::sink::{Answer, Query, QueryKind, REST};
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use crossbook_engine::{AccountId, AssetId, Command, EventKind, OrderId, OrderType, PlaceOrder, RejectReason, SelfTradePrevention, Side, TimeInForce};
use crossbook_fix::decimal::Decimal;
use crossbook_marketdata::accounts::{AccountTrade, OrderRecord};
use crossbook_marketdata::{MarketData, Unit, render};
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

/// Engine client ids of orders placed over REST: from 2^62 up (the FIX
/// gateway's start at 2^63; binary clients keep below 2^62).
pub const REST_CID_BASE: u64 = 1 << 62;
/// Binance's longest `newClientOrderId`.
pub const MAX_CLIENT_ID: usize = 36;
/// `recvWindow` when none is sent, and the largest accepted (ms).
const DEFAULT_RECV_WINDOW_MS: u64 = 5_000;
const MAX_RECV_WINDOW_MS: u64 = 60_000;
/// How far ahead of our clock a request's `timestamp` may be (ms).
const AHEAD_MS: u64 = 1_000;
/// The most rows `allOrders` and `myTrades` answer with, and by default.
const MAX_ROWS: u64 = 1_000;
const DEFAULT_ROWS: u64 = 500;

/// The annex the REST gateway journals with each of its commands: a tag,
/// the request's number (to answer the waiting handler) and the client
/// order id (the order's name in every later answer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RestAnnex {
    pub(crate) request: u64,
    pub(crate) client_id: String,
}

const ANNEX_TAG: u8 = b'R';
const _: () = assert!(1 + 8 + 1 + MAX_CLIENT_ID <= crossbook_journal::format::MAX_ANNEX);

impl RestAnnex {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(10 + self.client_id.len());
        out.push(ANNEX_TAG);
        out.extend_from_slice(&self.request.to_le_bytes());
        out.push(self.client_id.len() as u8);
        out.extend_from_slice(self.client_id.as_bytes());
        out
    }

    pub(crate) fn decode(bytes: &[u8]) -> Option<RestAnnex> {
        let (&tag, rest) = bytes.split_first()?;
        let (request, rest) = rest.split_at_checked(8)?;
        let (&len, rest) = rest.split_first()?;
        if tag != ANNEX_TAG || rest.len() != usize::from(len) {
            return None;
        }
        let request = u64::from_le_bytes(request.try_into().ok()?);
        Some(RestAnnex { request, client_id: String::from_utf8(rest.to_vec()).ok()? })
    }
}

/// What the market-data thread answers a waiting handler with.
pub(crate) enum Outcome {
    /// The command is durable and applied: the order right after it (for
    /// a place or cancel), the fills it made, the orders a cancel-all
    /// cancelled, or the engine's reject.
    Applied { seq: u64, time_ms: u64, reject: Option<RejectReason>, order: Option<OrderRecord>, fills: Vec<AccountTrade>, cancelled: Vec<OrderRecord> },
    /// Refused by the open-order limit before the engine.
    Refused,
    /// A balance query's answer.
    Answered(Answer),
}

struct Credentials {
    account: AccountId,
    secret: Arc<[u8]>,
}

/// Request weight used in the current minute, and orders in the current
/// ten seconds (Binance's fixed windows).
#[derive(Default)]
struct Usage {
    /// Weight by API key and the client's address together: a client
    /// elsewhere that knows a key but not its secret (requests refused
    /// for their signature still cost 1) cannot use up the owner's
    /// minute. (Binance counts weight by address alone; a venue's
    /// accounts on one machine would then share one budget.)
    weight: HashMap<(String, Option<std::net::IpAddr>), Window>,
    /// New orders by API key (only requests with a valid signature place
    /// one).
    orders: HashMap<String, Window>,
    /// The minute entries of past windows were last dropped in.
    swept: u64,
}

/// A count in a fixed window of the clock (`window`: the minute, or the
/// ten seconds, since the epoch).
#[derive(Default)]
struct Window {
    window: u64,
    count: u32,
}

impl Window {
    /// The count in `window`, started again if that is a new one.
    fn at(&mut self, window: u64) -> &mut u32 {
        if self.window != window {
            *self = Window { window, count: 0 };
        }
        &mut self.count
    }
}

#[derive(Default)]
struct Waiting {
    answers: HashMap<u64, tokio::sync::oneshot::Sender<Outcome>>,
    /// Client order ids of orders sent and not yet applied: a second
    /// order with the same id is refused as a duplicate meanwhile.
    client_ids: HashSet<(AccountId, String)>,
    /// Orders with an amendment sent and not answered yet: a second one
    /// would be checked against the quantity the first is changing.
    amending: HashSet<OrderId>,
    /// References of the operator's transfers sent and not yet applied.
    references: HashSet<String>,
}

/// An asset as the REST API shows it.
#[derive(Clone, Debug)]
pub(crate) struct AssetInfo {
    pub(crate) id: AssetId,
    pub(crate) name: String,
    pub(crate) unit: Unit,
}

/// The sequencer's queue, and how to wake it.
pub(crate) struct SequencerLink {
    pub(crate) queue: SyncSender<Vec<Inbound>>,
    pub(crate) wake: Arc<dyn Fn() + Send + Sync>,
}

/// The trading side of the HTTP gateway.
pub(crate) struct Trading {
    /// The accounts' keys and secrets (a configuration reload changes them).
    keys: Arc<crate::keys::Keys>,
    /// The listed assets (one added while the venue runs is added when
    /// the command that added it is durable).
    assets: RwLock<Vec<AssetInfo>>,
    link: Mutex<Option<SequencerLink>>,
    /// The venue is stopping: requests are refused, not queued.
    closed: AtomicBool,
    in_flight: Arc<InFlight>,
    waiting: Mutex<Waiting>,
    next_request: AtomicU64,
    pub(crate) next_cid: AtomicU64,
    usage: Mutex<Usage>,
    pub(crate) streams: super::userstream::Streams,
    max_weight: u32,
    max_orders: u32,
    answer_timeout: Duration,
}

fn asset_info(asset: &crate::config::AssetConfig) -> AssetInfo {
    AssetInfo { id: asset.id, name: asset.name.clone(), unit: Unit { mantissa: 1, scale: asset.decimals } }
}



impl Trading {
    pub(crate) fn new(config: &Config, listed: &crate::listing::Listed, keys: Arc<crate::keys::Keys>) -> Trading {
        let assets = listed.assets.iter().map(asset_info).collect();
        Trading {
            keys,
            assets: RwLock::new(assets),
            link: Mutex::new(None),
            closed: AtomicBool::new(false),
            in_flight: InFlight::polled(),
            waiting: Mutex::new(Waiting::default()),
            // 0 names no request (another node's, applied from the log).
            next_request: AtomicU64::new(1),
            next_cid: AtomicU64::new(REST_CID_BASE + 1),
            usage: Mutex::new(Usage::default()),
            streams: super::userstream::Streams::default(),
            max_weight: config.market_data.max_weight_per_minute,
            max_orders: config.market_data.max_orders_per_10s,
            answer_timeout: Duration::from_millis(config.market_data.answer_timeout_ms.max(1)),
        }
    }

    pub(crate) fn connect(&self, link: SequencerLink) {
        *lock(&self.link) = Some(link);
    }

    /// The venue is stopping: nothing more reaches the sequencer (what
    /// did is still answered).
    pub(crate) fn close(&self) {
        let mut link = lock(&self.link);
        self.closed.store(true, Ordering::Release);
        *link = None;
    }

    /// Every request handed to the sequencer has been answered.
    pub(crate) fn settled(&self) -> bool {
        self.in_flight.count() == 0
    }

    /// Queues `request` for the sequencer; `false` if the queue is full
    /// (or the venue is stopping).
    pub(crate) fn send(&self, request: Request, annex: Option<Vec<u8>>) -> bool {
        let link = lock(&self.link);
        let Some(link) = link.as_ref() else { return false };
        self.in_flight.add(1);
        match link.queue.try_send(vec![Inbound { request, annex, source: REST, in_flight: self.in_flight.clone() }]) {
            Ok(()) => {
                (link.wake)();
                true
            }
            Err(_) => {
                // Never reached the sequencer: it will not count it down.
                self.in_flight.undo();
                false
            }
        }
    }

    fn new_request(&self) -> (u64, tokio::sync::oneshot::Receiver<Outcome>) {
        let request = self.next_request.fetch_add(1, Ordering::Relaxed);
        let (sender, receiver) = tokio::sync::oneshot::channel();
        lock(&self.waiting).answers.insert(request, sender);
        (request, receiver)
    }

    fn forget(&self, request: u64, client_id: Option<&(AccountId, String)>) {
        let mut waiting = lock(&self.waiting);
        waiting.answers.remove(&request);
        if let Some(key) = client_id {
            waiting.client_ids.remove(key);
        }
    }

    /// Sends a request to the sequencer and waits for its outcome.
    pub(crate) async fn ask(&self, request: Request, annex: Option<RestAnnex>, client_id: Option<(AccountId, String)>) -> Result<Outcome, ApiError> {
        let (number, receiver) = match &annex {
            Some(annex) => {
                let (sender, receiver) = tokio::sync::oneshot::channel();
                lock(&self.waiting).answers.insert(annex.request, sender);
                (annex.request, receiver)
            }
            None => self.new_request(),
        };
        let request = match request {
            Request::Query(mut query) => {
                query.token = number;
                Request::Query(query)
            }
            command => command,
        };
        if !self.send(request, annex.map(|a| a.encode())) {
            self.forget(number, client_id.as_ref());
            if self.closed.load(Ordering::Acquire) {
                return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, -1001, "The server is shutting down."));
            }
            return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, -1008, "Server is currently overloaded with other requests. Please try again in a few minutes."));
        }
        match tokio::time::timeout(self.answer_timeout, receiver).await {
            Ok(Ok(outcome)) => Ok(outcome),
            Ok(Err(_)) => Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, -1001, "Internal error; unable to process your request. Please try again.")),
            Err(_) => {
                // The command may still be applied; the client id stays
                // reserved until it is (the market-data thread frees it).
                lock(&self.waiting).answers.remove(&number);
                Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, -1007, "Timeout waiting for response from backend server. Send status unknown; execution status unknown."))
            }
        }
    }

    /// An asset as the REST API shows it.
    pub(crate) fn asset(&self, id: AssetId) -> Option<AssetInfo> {
        read(&self.assets).iter().find(|a| a.id == id).cloned()
    }

    /// The asset of `name` (any case).
    pub(crate) fn asset_named(&self, name: &str) -> Option<AssetInfo> {
        read(&self.assets).iter().find(|a| a.name.eq_ignore_ascii_case(name)).cloned()
    }

    /// Every asset's name, in the order listed.
    pub(crate) fn asset_names(&self) -> Vec<String> {
        read(&self.assets).iter().map(|a| a.name.clone()).collect()
    }

    /// Lists an asset the venue added.
    pub(crate) fn add_asset(&self, asset: &crate::config::AssetConfig) {
        let mut assets = self.assets.write().unwrap_or_else(|e| e.into_inner());
        if !assets.iter().any(|a| a.id == asset.id) {
            assets.push(asset_info(asset));
        }
    }

    /// Balances, (asset, available, locked), as the REST API lists them:
    /// `{"asset", "free", "locked"}` in the assets' decimals.
    pub(crate) fn balances_json<'a>(&self, balances: impl Iterator<Item = &'a (AssetId, u64, u64)>) -> Vec<Value> {
        balances
            .filter_map(|&(asset, available, locked)| {
                let info = self.asset(asset)?;
                Some(json!({"asset": info.name, "free": render::decimal(i128::from(available), info.unit), "locked": render::decimal(i128::from(locked), info.unit)}))
            })
            .collect()
    }

    /// A number for a request to the sequencer (its annex's).
    pub(crate) fn request_number(&self) -> u64 {
        self.next_request.fetch_add(1, Ordering::Relaxed)
    }

    /// Reserves a transfer's reference (`admin.rs`) for a deposit or
    /// withdrawal about to be sent: refused with the transfer that used it
    /// if one kept did, or with none if one on its way has it. `market`
    /// is read under its lock, which the market-data thread holds while
    /// it records a transfer and frees its reference here: a reference is
    /// always in one of the two.
    pub(crate) fn reserve_reference(&self, market: &MarketData, reference: &str) -> Result<(), Option<crossbook_marketdata::transfers::Transfer>> {
        if let Some(done) = market.transfers.get(reference) {
            return Err(Some(*done));
        }
        let mut waiting = lock(&self.waiting);
        if !waiting.references.insert(reference.to_string()) {
            return Err(None);
        }
        Ok(())
    }

    /// Frees a reference whose transfer never reached the sequencer.
    pub(crate) fn release_reference(&self, reference: &str) {
        lock(&self.waiting).references.remove(reference);
    }

    /// Reserves an account's client order id for an order about to be
    /// sent: refused if one of its open orders, or one on its way, has it.
    fn reserve(&self, market: &MarketData, account: AccountId, client_id: &str) -> Result<(), ApiError> {
        let mut waiting = lock(&self.waiting);
        let key = (account, client_id.to_string());
        if waiting.client_ids.contains(&key) || market.accounts.open_by_client_id(account, client_id).is_some() {
            return Err(ApiError::bad(-2010, "Duplicate order sent."));
        }
        waiting.client_ids.insert(key);
        Ok(())
    }

    // ---- the market-data thread's side ---------------------------------

    /// A REST command is durable and applied to `market`: its handler is
    /// answered with the order as it stands now.
    pub(crate) fn applied(&self, market: &MarketData, command: &FeedCommand, annex: &RestAnnex) {
        // Request 0: another node's (a follower applying the log).
        if annex.request == 0 {
            return;
        }
        let Some(cmd) = command.command else { return };
        let reject = command.events.iter().find_map(|e| match e.kind {
            EventKind::Rejected { reason } => Some(reason),
            _ => None,
        });
        let account = cmd.trader().unwrap_or(0);
        let order_id = match cmd {
            Command::Place(_) => Some(command.seq),
            _ => cmd.target_order(),
        };
        let order = order_id.and_then(|id| market.accounts.order_of(account, id)).cloned();
        let fills: Vec<AccountTrade> = match (cmd, market.accounts.accounts.get(&account)) {
            (Command::Place(_), Some(data)) => {
                let mut fills: Vec<AccountTrade> = data.trades.iter().rev().take_while(|t| t.seq == command.seq).filter(|t| Some(t.order) == order_id).copied().collect();
                fills.reverse();
                fills
            }
            _ => Vec::new(),
        };
        let cancelled = if matches!(cmd, Command::CancelAll { .. }) {
            command
                .events
                .iter()
                .filter_map(|e| match e.kind {
                    EventKind::Cancelled { order, .. } => market.accounts.order_of(account, order).cloned(),
                    _ => None,
                })
                .collect()
        } else {
            Vec::new()
        };
        let outcome = Outcome::Applied { seq: command.seq, time_ms: command.time_ms, reject, order, fills, cancelled };
        let mut waiting = lock(&self.waiting);
        // A new order's client id, or the one an amendment gives.
        if matches!(cmd, Command::Place(_) | Command::Replace { .. } | Command::Amend { .. }) && !annex.client_id.is_empty() {
            waiting.client_ids.remove(&(account, annex.client_id.clone()));
        }
        // A transfer's reference (market data has recorded it by now).
        if matches!(cmd, Command::Deposit { .. } | Command::Withdraw { .. }) {
            waiting.references.remove(&annex.client_id);
        }
        if let Some(answer) = waiting.answers.remove(&annex.request) {
            let _ = answer.send(outcome);
        }
    }

    /// A REST order the open-order limit refused.
    pub(crate) fn refused(&self, account: AccountId, annex: &RestAnnex) {
        let mut waiting = lock(&self.waiting);
        waiting.client_ids.remove(&(account, annex.client_id.clone()));
        if let Some(answer) = waiting.answers.remove(&annex.request) {
            let _ = answer.send(Outcome::Refused);
        }
    }

    /// A query answered by the sequencer (for a handler, or for a user
    /// data stream's balances).
    pub(crate) fn answered(&self, answer: Answer) {
        if answer.query.token == USER_STREAM_TOKEN {
            return;
        }
        if let Some(waiting) = lock(&self.waiting).answers.remove(&answer.query.token) {
            let _ = waiting.send(Outcome::Answered(answer));
        }
    }

    // ---- authentication and limits -------------------------------------

    /// The account behind a request's `X-MBX-APIKEY`, and the key.
    fn key(&self, headers: &HeaderMap) -> Result<(String, Credentials), ApiError> {
        let mut values = headers.get_all("x-mbx-apikey").iter();
        // None, or two (which one would be meant?).
        let (Some(value), None) = (values.next(), values.next()) else {
            return Err(ApiError::new(StatusCode::UNAUTHORIZED, -2014, "API-key format invalid."));
        };
        let key = value.to_str().map_err(|_| ApiError::new(StatusCode::UNAUTHORIZED, -2014, "API-key format invalid."))?;
        self.credentials(key)
    }

    /// The account behind API key `key` (one with a secret), or -2015.
    fn credentials(&self, key: &str) -> Result<(String, Credentials), ApiError> {
        match self.keys.by_key(key) {
            Some((account, secret)) if !secret.is_empty() => Ok((key.to_string(), Credentials { account, secret })),
            _ => Err(ApiError::new(StatusCode::UNAUTHORIZED, -2015, "Invalid API-key, IP, or permissions for action.")),
        }
    }

    /// Counts `weight` against the minute of the key and the client's
    /// address (HTTP 429 past the limit) and, for a new order, one order
    /// against the key's ten seconds.
    fn spend(&self, key: &str, weight: u32, order: bool) -> Result<u32, ApiError> {
        let now = now_ms();
        let minute = now / 60_000;
        let mut usage = lock(&self.usage);
        if usage.swept != minute {
            // Once a minute, what counts for a window that is over goes.
            usage.swept = minute;
            usage.weight.retain(|_, used| used.window == minute);
            usage.orders.retain(|_, used| used.window + 1 >= now / 10_000);
        }
        let used = usage.weight.entry((key.to_string(), super::http::peer())).or_default().at(minute);
        // Counted even when refused, as Binance counts it.
        *used = used.saturating_add(weight);
        let used = *used;
        super::http::note_weight(used);
        if used > self.max_weight {
            let mut error = ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                -1003,
                format!("Too much request weight used; current limit is {} request weight per 1 MINUTE. Please use WebSocket Streams for live updates to avoid polling the API.", self.max_weight),
            );
            error.retry_after = Some((60_000 - now % 60_000).div_ceil(1000));
            return Err(error);
        }
        if order {
            let orders = usage.orders.entry(key.to_string()).or_default().at(now / 10_000);
            if *orders >= self.max_orders {
                let mut error = ApiError::new(StatusCode::TOO_MANY_REQUESTS, -1015, format!("Too many new orders; current limit is {} orders per 10 SECOND.", self.max_orders));
                error.retry_after = Some((10_000 - now % 10_000).div_ceil(1000));
                return Err(error);
            }
            *orders += 1;
        }
        Ok(used)
    }

    /// Checks a signed request: its key, its weight, its signature (HMAC-
    /// SHA256 of the query string and the body, `signature` left out) and
    /// its `timestamp` against `recvWindow`. Returns the account, its
    /// parameters and the weight used this minute.
    pub(crate) fn signed(&self, auth: &Auth<'_>, known: &[&str], weight: impl Fn(&Params) -> u32, order: bool) -> Result<(AccountId, Params, u32), ApiError> {
        // A request that fails before its signature and time are checked
        // costs 1; one that passes them costs its weight (and its order).
        let (key, credentials, checked) = match auth {
            Auth::Rest { headers, query, body } => {
                let (key, credentials) = self.key(headers)?;
                let mut all: Vec<&str> = known.to_vec();
                all.extend(["timestamp", "recvWindow", "signature"]);
                let body = (!body.is_empty()).then_some(*body);
                let checked = Params::parse_both(*query, body, &all).and_then(|params| {
                    let signature = params.get("signature").ok_or_else(|| ApiError::mandatory("signature"))?;
                    let payload = format!("{}{}", without_signature(query.unwrap_or("")), without_signature(body.unwrap_or("")));
                    if !signature_matches(&credentials.secret, payload.as_bytes(), signature) {
                        return Err(ApiError::bad(-1022, "Signature for this request is not valid."));
                    }
                    check_time(&params)?;
                    Ok(params)
                });
                (key, credentials, checked)
            }
            Auth::Ws(params) => {
                let Some(key) = params.get("apiKey").and_then(serde_json::Value::as_str) else {
                    return Err(ApiError::new(StatusCode::UNAUTHORIZED, -2014, "API-key format invalid."));
                };
                let (key, credentials) = self.credentials(key)?;
                let checked = ws_params(params, known).and_then(|params| {
                    let signature = params.get("signature").ok_or_else(|| ApiError::mandatory("signature"))?;
                    let payload = params.all().iter().filter(|(name, _)| name != "signature").map(|(name, value)| format!("{name}={value}")).collect::<Vec<_>>().join("&");
                    if !signature_matches(&credentials.secret, payload.as_bytes(), signature) {
                        return Err(ApiError::bad(-1022, "Signature for this request is not valid."));
                    }
                    check_time(&params)?;
                    Ok(params)
                });
                (key, credentials, checked)
            }
        };
        let params = match checked {
            Ok(params) => params,
            Err(e) => {
                self.spend(&key, 1, false)?;
                return Err(e);
            }
        };
        let used = self.spend(&key, weight(&params), order)?;
        check_return_rate_limits(&params)?;
        Ok((credentials.account, params, used))
    }

    /// An endpoint that needs only the API key (the user data stream's).
    fn keyed(&self, headers: &HeaderMap, query: Option<&str>, body: &str, known: &[&str], weight: u32) -> Result<(AccountId, Params, u32), ApiError> {
        let (key, credentials) = self.key(headers)?;
        // As for a signed request: parameters' names refused cost 1.
        let params = match Params::parse_both(query, (!body.is_empty()).then_some(body), known) {
            Ok(params) => params,
            Err(e) => {
                self.spend(&key, 1, false)?;
                return Err(e);
            }
        };
        let used = self.spend(&key, weight, false)?;
        Ok((credentials.account, params, used))
    }
}

impl Trading {
    /// The request weight allowed a key per minute.
    pub(crate) fn max_weight(&self) -> u32 {
        self.max_weight
    }

    /// New orders a key may send in 10 seconds.
    pub(crate) fn max_orders(&self) -> u32 {
        self.max_orders
    }

    /// Whether `key` is an account's API key (one with a secret).
    pub(crate) fn knows_key(&self, key: &str) -> bool {
        self.credentials(key).is_ok()
    }
}

/// Who signed a request, and how: a REST request's headers, query string
/// and body, or a WebSocket API request's `params` (`apiKey` among them).
pub(crate) enum Auth<'a> {
    Rest { headers: &'a HeaderMap, query: Option<&'a str>, body: &'a str },
    Ws(&'a serde_json::Map<String, Value>),
}

/// A WebSocket API request's `params` as name and text, sorted by name
/// (the order its signature covers them in): `known`, `apiKey`,
/// `timestamp`, `recvWindow`, `signature` and `returnRateLimits`; any other
/// is refused.
pub(crate) fn ws_params(params: &serde_json::Map<String, Value>, known: &[&str]) -> Result<Params, ApiError> {
    let mut pairs: Vec<(String, String)> = Vec::with_capacity(params.len());
    for (name, value) in params {
        if !known.contains(&name.as_str()) && !["apiKey", "timestamp", "recvWindow", "signature", "returnRateLimits"].contains(&name.as_str()) {
            return Err(ApiError::bad(-1103, format!("An unknown parameter was sent: '{name}'.")));
        }
        let text = match value {
            Value::String(text) => text.clone(),
            Value::Number(number) => number.to_string(),
            Value::Bool(flag) => flag.to_string(),
            // `"symbols": ["BTCUSD", "ETHUSD"]`, as Binance's clients send
            // it: the `["A","B"]` text a query string carries.
            Value::Array(list) if list.iter().all(Value::is_string) => Value::Array(list.clone()).to_string(),
            _ => return Err(ApiError::bad(-1100, format!("Illegal characters found in parameter '{name}'; a string, a number, a boolean or a list of strings is expected."))),
        };
        pairs.push((name.clone(), text));
    }
    pairs.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(Params::from_pairs(pairs))
}

/// `returnRateLimits`, a flag as the other flags: `true` or `false`, or
/// their text. A value, so checked after a signed request's key,
/// signature and time (and charged its weight), as other values are.
pub(crate) fn check_return_rate_limits(params: &Params) -> Result<(), ApiError> {
    match params.get("returnRateLimits") {
        Some(text) if !matches!(text, "true" | "false") => Err(ApiError::illegal("returnRateLimits", "true, false")),
        _ => Ok(()),
    }
}

/// A signed request's `timestamp` against `recvWindow` and our clock.
fn check_time(params: &Params) -> Result<(), ApiError> {
    let timestamp = params.get("timestamp").ok_or_else(|| ApiError::mandatory("timestamp"))?;
    let timestamp: u64 = timestamp.parse().map_err(|_| ApiError::illegal("timestamp", "0-18446744073709551615"))?;
    // In microseconds, as the window's decimals are.
    let window_us = match params.optional("recvWindow", "0-60000")? {
        None => DEFAULT_RECV_WINDOW_MS * 1000,
        Some(text) => {
            let value = Decimal::parse(text.as_bytes())
                .filter(|d| d.mantissa >= 0)
                .and_then(|d| d.whole_units(Decimal { mantissa: 1, scale: 3 }))
                .ok_or_else(|| ApiError::illegal("recvWindow", "0-60000"))?;
            if !(0..=i128::from(MAX_RECV_WINDOW_MS) * 1000).contains(&value) {
                return Err(ApiError::bad(-1131, "recvWindow must be less than 60000"));
            }
            value as u64
        }
    };
    let now_us = crate::now_us();
    // A timestamp in microseconds (as Binance also takes them) is
    // compared to the microsecond; one in milliseconds to the
    // millisecond, as Binance does.
    let (ahead, behind_us) = if timestamp > 10_000_000_000_000 {
        (timestamp >= now_us + AHEAD_MS * 1000, now_us.saturating_sub(timestamp))
    } else {
        let now_ms = now_us / 1000;
        (timestamp >= now_ms + AHEAD_MS, now_ms.saturating_sub(timestamp).saturating_mul(1000))
    };
    if ahead {
        return Err(ApiError::bad(-1021, "Timestamp for this request was 1000ms ahead of the server's time."));
    }
    if behind_us > window_us {
        return Err(ApiError::bad(-1021, "Timestamp for this request is outside of the recvWindow."));
    }
    Ok(())
}

/// `text` (a query string or form body) without its `signature=...` pair.
fn without_signature(text: &str) -> String {
    text.split('&').filter(|pair| !pair.starts_with("signature=")).collect::<Vec<_>>().join("&")
}

fn signature_matches(secret: &[u8], payload: &[u8], signature: &str) -> bool {
    let Ok(mut mac) = Hmac::<sha2::Sha256>::new_from_slice(secret) else { return false };
    mac.update(payload);
    let Some(given) = hex_decode(signature) else { return false };
    // Constant time: `verify_slice` does not stop at the first difference.
    mac.verify_slice(&given).is_ok()
}

fn hex_decode(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

// ---- the HTTP handlers ----------------------------------------------------

pub(crate) type Reply = Result<Response, ApiError>;

/// A response with the weight used header.
fn answer(value: Value, used: u32) -> Response {
    let mut response = json_response(value);
    response.headers_mut().insert("x-mbx-used-weight-1m", HeaderValue::from(used));
    response
}

pub(crate) fn trading(hub: &Hub) -> Result<&Trading, ApiError> {
    hub.trading.as_deref().ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, -1000, "Trading is off on this venue (market_data.trading = false)."))
}

/// An order request sent to a follower of a replicated venue: redirected
/// to the leader (HTTP 307: the client sends the same request there), or
/// refused while no leader is known.
pub(crate) fn follower(hub: &Hub, path: &str, query: Option<&str>) -> Result<(), ApiError> {
    if hub.node.accepting.load(Ordering::Acquire) {
        return Ok(());
    }
    match hub.node.leader_rest() {
        Some(leader) => {
            let websocket = path.starts_with("/ws");
            let scheme = if websocket { "ws" } else { "http" };
            let target = format!("{scheme}://{leader}{path}{}", query.map(|q| format!("?{q}")).unwrap_or_default());
            let mut error = ApiError::new(StatusCode::TEMPORARY_REDIRECT, -1000, format!("This node follows; the leader takes orders: {target}"));
            if websocket {
                // No Location header on a WebSocket answer: the address
                // is a field of the error too.
                error.data = Some(Box::new(serde_json::json!({"leader": target})));
            } else {
                error.location = Some(target);
            }
            Err(error)
        }
        None => Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, -1008, "No leader right now (a failover is under way); try again shortly.")),
    }
}

pub(crate) fn body_text(body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>, hub: &Hub) -> Result<String, ApiError> {
    let bytes = body.map_err(|_| ApiError::body_too_large(hub.config.max_body))?;
    String::from_utf8(bytes.to_vec()).map_err(|_| ApiError::bad(-1100, "Illegal characters found in the request body; it must be UTF-8 form data."))
}

pub(crate) type Body = Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>;

fn side(params: &Params) -> Result<Side, ApiError> {
    match params.get("side").ok_or_else(|| ApiError::mandatory("side"))? {
        "BUY" => Ok(Side::Buy),
        "SELL" => Ok(Side::Sell),
        _ => Err(ApiError::bad(-1117, "Invalid side.")),
    }
}

/// A decimal parameter in whole units of `unit` (ticks, lots, quote
/// units); `filter` names the Binance filter a value off the grid fails.
fn units(params: &Params, name: &str, unit: Unit, filter: &str) -> Result<Option<u64>, ApiError> {
    // Sent empty: refused (-1100), not taken as not sent.
    let Some(text) = params.optional(name, "a non-negative decimal")? else { return Ok(None) };
    let decimal = Decimal::parse(text.as_bytes()).filter(|d| d.mantissa >= 0).ok_or_else(|| ApiError::illegal(name, "a non-negative decimal"))?;
    let unit = Decimal { mantissa: i128::from(unit.mantissa), scale: unit.scale };
    let whole = decimal.whole_units(unit).ok_or_else(|| ApiError::bad(-1013, format!("Filter failure: {filter}")))?;
    u64::try_from(whole).map(Some).map_err(|_| ApiError::bad(-1013, format!("Filter failure: {filter}")))
}

fn stp(params: &Params) -> Result<SelfTradePrevention, ApiError> {
    match params.optional("selfTradePreventionMode", "NONE, EXPIRE_TAKER, EXPIRE_MAKER, EXPIRE_BOTH")? {
        None | Some("NONE") => Ok(SelfTradePrevention::None),
        Some("EXPIRE_TAKER") => Ok(SelfTradePrevention::CancelNewest),
        Some("EXPIRE_MAKER") => Ok(SelfTradePrevention::CancelOldest),
        Some("EXPIRE_BOTH") => Ok(SelfTradePrevention::CancelBoth),
        Some("DECREMENT" | "TRANSFER") => Err(ApiError::bad(-1013, "This symbol does not allow the specified self-trade prevention mode.")),
        Some(_) => Err(ApiError::illegal("selfTradePreventionMode", "NONE, EXPIRE_TAKER, EXPIRE_MAKER, EXPIRE_BOTH")),
    }
}

/// The instrument's limits the engine checks a new order against
/// (`docs/engine.md`, `place`), with the answers its refusals get: a test
/// order never reaches the engine, and is checked here the same way.
fn within_limits(info: &crossbook_marketdata::InstrumentInfo, place: &PlaceOrder) -> Result<(), ApiError> {
    if place.budget == Some(0) {
        return Err(order_reject(RejectReason::InvalidBudget));
    }
    if place.qty == 0 || place.qty < info.min_qty || place.qty > info.max_qty {
        return Err(order_reject(RejectReason::InvalidQuantity));
    }
    if place.order_type == OrderType::Limit && (place.price <= 0 || place.price < info.min_price || place.price > info.max_price) {
        return Err(order_reject(RejectReason::PriceOutOfBand));
    }
    Ok(())
}

/// A client order id as Binance allows it.
fn client_id(params: &Params, name: &str) -> Result<Option<String>, ApiError> {
    match params.get(name) {
        None => Ok(None),
        Some(id) if id.len() <= MAX_CLIENT_ID && id.bytes().all(|b| b.is_ascii_alphanumeric() || b".:/_-".contains(&b)) => Ok(Some(id.to_string())),
        Some(_) => Err(ApiError::illegal(name, "^[\\.A-Z\\:/a-z0-9_-]{1,36}$")),
    }
}

/// The reject of an order the engine refused, as Binance words it.
fn order_reject(reason: RejectReason) -> ApiError {
    match reason {
        RejectReason::InsufficientFunds => ApiError::bad(-2010, "Account has insufficient balance for requested action."),
        RejectReason::DuplicateClientOrderId => ApiError::bad(-2010, "Duplicate order sent."),
        RejectReason::PostOnlyWouldTake => ApiError::bad(-2010, "Order would immediately match and take."),
        RejectReason::InvalidQuantity => ApiError::bad(-1013, "Filter failure: LOT_SIZE"),
        RejectReason::InvalidPrice | RejectReason::PriceOutOfBand => ApiError::bad(-1013, "Filter failure: PRICE_FILTER"),
        RejectReason::InvalidBudget => ApiError::bad(-1013, "Filter failure: NOTIONAL"),
        RejectReason::InvalidTimeInForce => ApiError::bad(-1115, "Invalid timeInForce."),
        RejectReason::UnknownInstrument => ApiError::invalid_symbol(),
        RejectReason::InstrumentHalted => ApiError::bad(-2010, "Market is closed."),
        other => ApiError::bad(-2010, format!("Order rejected: {}.", other.name())),
    }
}

/// `POST /api/v3/order`.
pub(crate) async fn new_order(State(hub): State<Arc<Hub>>, headers: HeaderMap, RawQuery(query): RawQuery, body: Body) -> Reply {
    trading(&hub)?;
    follower(&hub, "/api/v3/order", query.as_deref())?;
    let body = body_text(body, &hub)?;
    let (value, used) = new_order_core(&hub, &Auth::Rest { headers: &headers, query: query.as_deref(), body: &body }).await?;
    Ok(answer(value, used))
}

/// The parameters of `POST /api/v3/order` besides the instrument's.
const NEW_ORDER_PARAMS: [&str; 18] = [
    "symbol", "side", "type", "timeInForce", "quantity", "quoteOrderQty", "price", "newClientOrderId", "newOrderRespType", "selfTradePreventionMode", "stopPrice", "trailingDelta", "icebergQty", "strategyId", "strategyType", "pegPriceType", "pegOffsetValue", "pegOffsetType",
];

/// Binance parameters of a new order this venue does not take (stop,
/// trailing, iceberg and pegged orders; strategy tags): refused, never
/// half-done.
fn refuse_unsupported(params: &Params, names: &[&str]) -> Result<(), ApiError> {
    // Sent at all, even empty.
    match names.iter().find(|name| params.all().iter().any(|(sent, _)| sent == *name)) {
        Some(name) => Err(ApiError::bad(-1106, format!("Parameter '{name}' sent when not required."))),
        None => Ok(()),
    }
}

/// A new order, checked against its instrument and numbered, not sent yet.
struct NewOrder {
    place: PlaceOrder,
    client_id: String,
    /// `newOrderRespType`.
    response: &'static str,
    /// Its instrument's index in market data.
    index: usize,
}

/// Reads and checks a new order's parameters (type, time in force,
/// quantities and price on the instrument's grid); not numbered yet
/// ([`numbered`]), its client id not reserved.
fn parse_new_order(market: &MarketData, account: AccountId, params: &Params) -> Result<NewOrder, ApiError> {
    let index = params.instrument(market)?;
    let info = &market.instruments[index].info;
    let side = side(params)?;
    let kind = params.get("type").ok_or_else(|| ApiError::mandatory("type"))?;
    let (order_type, post_only) = match kind {
        "LIMIT" => (OrderType::Limit, false),
        "LIMIT_MAKER" => (OrderType::Limit, true),
        "MARKET" => (OrderType::Market, false),
        _ => return Err(ApiError::bad(-1116, "Invalid orderType.")),
    };
    // What a limit order needs, sent empty, is missing (-1102), not
    // illegal as an optional one is.
    let needed: &[&str] = match kind {
        "LIMIT" => &["timeInForce", "quantity", "price"],
        "LIMIT_MAKER" => &["quantity", "price"],
        _ => &[],
    };
    if let Some(name) = needed.iter().find(|name| params.get(name).is_none()) {
        return Err(ApiError::mandatory(name));
    }
    let tif = match (kind, params.optional("timeInForce", "GTC, IOC, FOK")?) {
        ("LIMIT", None) => return Err(ApiError::mandatory("timeInForce")),
        ("LIMIT", Some("GTC")) | ("LIMIT_MAKER", None) => TimeInForce::Gtc,
        ("LIMIT", Some("IOC")) => TimeInForce::Ioc,
        ("LIMIT", Some("FOK")) => TimeInForce::Fok,
        ("LIMIT", Some(_)) => return Err(ApiError::bad(-1115, "Invalid timeInForce.")),
        ("MARKET", None | Some("IOC")) => TimeInForce::Ioc,
        ("MARKET", Some("FOK")) => TimeInForce::Fok,
        (_, Some(_)) => return Err(ApiError::bad(-1114, "TimeInForce parameter sent when not required.")),
        (_, None) => TimeInForce::Ioc,
    };
    // What the type does not take is refused when sent at all, even
    // empty (-1106), before any value is read.
    let unwanted: &[&str] = if order_type == OrderType::Market { &["price"] } else { &["quoteOrderQty"] };
    refuse_unsupported(params, unwanted)?;
    let qty = units(params, "quantity", info.qty_unit, "LOT_SIZE")?;
    let budget = units(params, "quoteOrderQty", info.quote_asset_unit, "NOTIONAL")?;
    let price = units(params, "price", info.price_unit, "PRICE_FILTER")?;
    let (qty, budget, price) = match order_type {
        OrderType::Limit => {
            if budget.is_some() {
                return Err(ApiError::bad(-1106, "Parameter 'quoteOrderQty' sent when not required."));
            }
            let price = price.ok_or_else(|| ApiError::mandatory("price"))?;
            (qty.ok_or_else(|| ApiError::mandatory("quantity"))?, None, price)
        }
        OrderType::Market => {
            if price.is_some() {
                return Err(ApiError::bad(-1106, "Parameter 'price' sent when not required."));
            }
            match (qty, budget) {
                (Some(_), Some(_)) | (None, None) => return Err(ApiError::bad(-1102, "Param 'quantity' or 'quoteOrderQty' must be sent, but both were empty/null!")),
                (Some(qty), None) => (qty, None, 0),
                // A budget alone: as many lots as it buys (sells)
                // within the instrument's largest quantity.
                (None, Some(budget)) => {
                    if side == Side::Sell {
                        return Err(ApiError::bad(-2010, "Quote order qty market sell orders are not supported: give quantity."));
                    }
                    // A budget buys as many lots as it pays for: there is
                    // no quantity for FOK to fill whole.
                    if tif == TimeInForce::Fok {
                        return Err(ApiError::bad(-1128, "Combination of optional parameters invalid: quoteOrderQty with timeInForce FOK (a budget buys what it can: send IOC, or quantity with FOK)."));
                    }
                    (info.max_qty, Some(budget), 0)
                }
            }
        }
    };
    let price = i64::try_from(price).map_err(|_| ApiError::bad(-1013, "Filter failure: PRICE_FILTER"))?;
    let stp = stp(params)?;
    let response = match params.optional("newOrderRespType", "ACK, RESULT, FULL")? {
        None if order_type == OrderType::Market || !post_only => "FULL",
        None => "ACK",
        Some("ACK") => "ACK",
        Some("RESULT") => "RESULT",
        Some("FULL") => "FULL",
        Some(_) => return Err(ApiError::illegal("newOrderRespType", "ACK, RESULT, FULL")),
    };
    let client_id = client_id(params, "newClientOrderId")?.unwrap_or_default();
    let place = PlaceOrder { account, instrument: info.id, cid: 0, side, order_type, tif, price, qty, post_only, stp, budget };
    Ok(NewOrder { place, client_id, response, index })
}

/// Gives a checked new order the next engine client id (and, without a
/// `newClientOrderId`, the client id named after it), and reserves its
/// client id (`-2010` if it is taken).
fn numbered_reserved(trading: &Trading, market: &MarketData, order: NewOrder) -> Result<NewOrder, ApiError> {
    let made_up = order.client_id.is_empty();
    let order = numbered(trading, market, order);
    if made_up {
        // Reserved as it was found free (under the same lock), so a
        // client that names its order so at the same moment cannot take
        // it in between.
        let mut waiting = lock(&trading.waiting);
        let key = (order.place.account, order.client_id.clone());
        if waiting.client_ids.insert(key) {
            return Ok(order);
        }
        drop(waiting);
        return numbered_reserved(trading, market, NewOrder { client_id: String::new(), ..order });
    }
    trading.reserve(market, order.place.account, &order.client_id)?;
    Ok(order)
}

/// Gives a checked new order the next engine client id (and, without a
/// `newClientOrderId`, the client id named after it).
fn numbered(trading: &Trading, market: &MarketData, mut order: NewOrder) -> NewOrder {
    // After every REST order the log holds (a node that took the lead
    // in this run numbers on after its predecessor's).
    trading.next_cid.fetch_max(market.accounts.largest_gateway_cid + 1, Ordering::Relaxed);
    let account = order.place.account;
    loop {
        order.place.cid = trading.next_cid.fetch_add(1, Ordering::Relaxed);
        // Passing over a number a binary client gave one of the account's
        // open orders (named by it in decimal), which the engine would
        // refuse as a duplicate.
        if market.accounts.open_by_client_id(account, &order.place.cid.to_string()).is_some_and(|o| o.cid == order.place.cid) {
            continue;
        }
        if !order.client_id.is_empty() {
            return order;
        }
        // Without one, the order is named after its engine client id
        // (never made up before: the numbering goes on after the
        // journal's), passing over a name the account gave one of its
        // open orders itself.
        let name = format!("crossbook-{}", order.place.cid - REST_CID_BASE);
        let taken = market.accounts.open_by_client_id(account, &name).is_some() || lock(&trading.waiting).client_ids.contains(&(account, name.clone()));
        if !taken {
            order.client_id = name;
            return order;
        }
    }
}

/// Sends a checked new order whose client id is reserved, and answers it
/// once the engine has applied it (or refused it).
async fn submit_new_order(hub: &Hub, trading: &Trading, order: NewOrder) -> Result<Value, ApiError> {
    let NewOrder { place, client_id, response, index } = order;
    let request = trading.next_request.fetch_add(1, Ordering::Relaxed);
    let reserved = (place.account, client_id.clone());
    let outcome = trading.ask(Request::Command(Command::Place(place)), Some(RestAnnex { request, client_id }), Some(reserved)).await?;
    let market = hub.read();
    let data = &market.instruments[index];
    match outcome {
        Outcome::Refused => Err(ApiError::bad(-1013, "Filter failure: MAX_NUM_ORDERS")),
        Outcome::Applied { reject: Some(RejectReason::FokCannotFill), order: Some(order), time_ms, .. } => Ok(render::new_order(data, &order, time_ms, response, &[])),
        Outcome::Applied { reject: Some(reason), .. } => Err(order_reject(reason)),
        Outcome::Applied { order: Some(order), time_ms, fills, .. } => Ok(render::new_order(data, &order, time_ms, response, &fills)),
        Outcome::Applied { order: None, seq, .. } => Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, -1000, format!("Order {seq} was applied but is not in the account's records."))),
        Outcome::Answered(_) => Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, -1000, "Unexpected answer.")),
    }
}

/// The work of [`new_order`], for REST and the WebSocket API: the answer's
/// body and the weight used this minute.
pub(crate) async fn new_order_core(hub: &Hub, auth: &Auth<'_>) -> Result<(Value, u32), ApiError> {
    let trading = trading(hub)?;
    let (account, params, used) = trading.signed(auth, &NEW_ORDER_PARAMS, |_| 1, true)?;
    refuse_unsupported(&params, &NEW_ORDER_PARAMS[10..])?;
    let order = {
        let market = hub.read();
        numbered_reserved(trading, &market, parse_new_order(&market, account, &params)?)?
    };
    Ok((submit_new_order(hub, trading, order).await?, used))
}

/// `POST /api/v3/order/test`.
pub(crate) async fn test_order(State(hub): State<Arc<Hub>>, headers: HeaderMap, RawQuery(query): RawQuery, body: Body) -> Reply {
    trading(&hub)?;
    let body = body_text(body, &hub)?;
    let (value, used) = test_order_core(&hub, &Auth::Rest { headers: &headers, query: query.as_deref(), body: &body }).await?;
    Ok(answer(value, used))
}

/// The work of [`test_order`], for REST and the WebSocket API: a new
/// order checked as `POST /api/v3/order` checks it before the engine (the
/// signature, the parameters, the instrument's filters), and not sent:
/// `{}`, or with `computeCommissionRates=true` the rates it would pay.
/// The engine's own checks (funds, post-only, the open-order limit) are
/// not made, and nothing counts against `max_orders_per_10s`.
pub(crate) async fn test_order_core(hub: &Hub, auth: &Auth<'_>) -> Result<(Value, u32), ApiError> {
    let trading = trading(hub)?;
    let mut known: Vec<&str> = NEW_ORDER_PARAMS.to_vec();
    known.push("computeCommissionRates");
    let rates = |params: &Params| params.get("computeCommissionRates") == Some("true");
    let (account, params, used) = trading.signed(auth, &known, |params| if rates(params) { 20 } else { 1 }, false)?;
    refuse_unsupported(&params, &NEW_ORDER_PARAMS[10..])?;
    if !matches!(params.optional("computeCommissionRates", "true, false")?, None | Some("true" | "false")) {
        return Err(ApiError::illegal("computeCommissionRates", "true, false"));
    }
    let market = hub.read();
    let order = parse_new_order(&market, account, &params)?;
    within_limits(&market.instruments[order.index].info, &order.place)?;
    if !rates(&params) {
        return Ok((json!({}), used));
    }
    let info = &market.instruments[order.index].info;
    let bps = |value: i64| render::decimal(i128::from(value), Unit { mantissa: 1, scale: 4 });
    Ok((
        json!({
            "standardCommissionForOrder": {"maker": bps(info.maker_bps), "taker": bps(info.taker_bps)},
            "taxCommissionForOrder": {"maker": "0", "taker": "0"},
            "discount": {"enabledForAccount": false, "enabledForSymbol": false, "discountAsset": Value::Null, "discount": "0"},
        }),
        used,
    ))
}

/// The account's order named by `orderId` or `origClientOrderId` (in
/// `symbol`; `names` gives the two parameters' names): another
/// account's, or one long gone, is not found. With both, as Binance does,
/// the order found by `orderId` must also have that client id, or none is
/// found (a client's cross-check that it names the order it means).
fn find_order<'a>(market: &'a MarketData, account: AccountId, index: usize, params: &Params, names: [&str; 2]) -> Result<Option<&'a OrderRecord>, ApiError> {
    let [by_id, by_client_id] = names;
    let found = match (params.number(by_id, 0..=u64::MAX)?, params.optional(by_client_id, "a client order id")?) {
        (Some(id), client_id) => market.accounts.order_of(account, id).filter(|o| client_id.is_none_or(|c| o.client_id == c)),
        (None, Some(client_id)) => market.accounts.by_client_id(account, client_id),
        (None, None) => return Err(ApiError::bad(-1102, format!("Param '{by_client_id}' or '{by_id}' must be sent, but both were empty/null!"))),
    };
    Ok(found.filter(|o| o.instrument as usize == index))
}

/// `DELETE /api/v3/order`.
pub(crate) async fn cancel_order(State(hub): State<Arc<Hub>>, headers: HeaderMap, RawQuery(query): RawQuery, body: Body) -> Reply {
    trading(&hub)?;
    follower(&hub, "/api/v3/order", query.as_deref())?;
    let body = body_text(body, &hub)?;
    let (value, used) = cancel_order_core(&hub, &Auth::Rest { headers: &headers, query: query.as_deref(), body: &body }).await?;
    Ok(answer(value, used))
}

/// Sends a cancel of the account's open `order` and answers it once the
/// engine has applied it.
async fn submit_cancel(hub: &Hub, trading: &Trading, account: AccountId, order: OrderId, index: usize) -> Result<Value, ApiError> {
    let request = trading.next_request.fetch_add(1, Ordering::Relaxed);
    let outcome = trading.ask(Request::Command(Command::Cancel { account, order }), Some(RestAnnex { request, client_id: String::new() }), None).await?;
    let market = hub.read();
    match outcome {
        Outcome::Applied { reject: None, order: Some(order), time_ms, .. } => Ok(render::cancelled_order(&market.instruments[index], &order, time_ms)),
        _ => Err(unknown_order()),
    }
}

fn unknown_order() -> ApiError {
    ApiError::bad(-2011, "Unknown order sent.")
}

/// The work of [`cancel_order`], for REST and the WebSocket API: the answer's
/// body and the weight used this minute.
pub(crate) async fn cancel_order_core(hub: &Hub, auth: &Auth<'_>) -> Result<(Value, u32), ApiError> {
    let trading = trading(hub)?;
    let (account, params, used) = trading.signed(auth, &["symbol", "orderId", "origClientOrderId", "newClientOrderId", "cancelRestrictions"], |_| 1, false)?;
    refuse_unsupported(&params, &["cancelRestrictions"])?;
    let (order, index) = {
        let market = hub.read();
        let index = params.instrument(&market)?;
        let order = find_order(&market, account, index, &params, ["orderId", "origClientOrderId"])?.filter(|o| o.status.is_open()).map(|o| o.id);
        (order.ok_or_else(unknown_order)?, index)
    };
    Ok((submit_cancel(hub, trading, account, order, index).await?, used))
}

/// `POST /api/v3/order/cancelReplace`.
pub(crate) async fn cancel_replace(State(hub): State<Arc<Hub>>, headers: HeaderMap, RawQuery(query): RawQuery, body: Body) -> Reply {
    trading(&hub)?;
    follower(&hub, "/api/v3/order/cancelReplace", query.as_deref())?;
    let body = body_text(body, &hub)?;
    let (value, used) = cancel_replace_core(&hub, &Auth::Rest { headers: &headers, query: query.as_deref(), body: &body }).await?;
    Ok(answer(value, used))
}

/// The work of [`cancel_replace`], for REST and the WebSocket API: an
/// open order cancelled, then a new one placed, as two commands one after
/// the other (another command may come between them). The new order is
/// checked before anything is sent: a request whose new order is
/// malformed does nothing. `cancelReplaceMode` `STOP_ON_FAILURE` places
/// nothing when the cancel fails; `ALLOW_FAILURE` places it all the same.
/// Either half failing is answered as Binance does: 400 `-2022` when
/// nothing was done, 409 `-2021` when one half was, each half's result in
/// `data`.
pub(crate) async fn cancel_replace_core(hub: &Hub, auth: &Auth<'_>) -> Result<(Value, u32), ApiError> {
    let trading = trading(hub)?;
    let mut known: Vec<&str> = NEW_ORDER_PARAMS.to_vec();
    known.extend(["cancelReplaceMode", "cancelOrderId", "cancelOrigClientOrderId", "cancelNewClientOrderId", "cancelRestrictions", "orderRateLimitExceededMode"]);
    let (account, params, used) = trading.signed(auth, &known, |_| 1, true)?;
    refuse_unsupported(&params, &NEW_ORDER_PARAMS[10..])?;
    refuse_unsupported(&params, &["cancelRestrictions"])?;
    if params.optional("orderRateLimitExceededMode", "DO_NOTHING")?.is_some_and(|mode| mode != "DO_NOTHING") {
        return Err(ApiError::illegal("orderRateLimitExceededMode", "DO_NOTHING"));
    }
    let stop_on_failure = match params.get("cancelReplaceMode") {
        Some("STOP_ON_FAILURE") => true,
        Some("ALLOW_FAILURE") => false,
        Some(_) => return Err(ApiError::illegal("cancelReplaceMode", "STOP_ON_FAILURE, ALLOW_FAILURE")),
        None => return Err(ApiError::mandatory("cancelReplaceMode")),
    };
    let (order, target) = {
        let market = hub.read();
        let order = numbered(trading, &market, parse_new_order(&market, account, &params)?);
        let target = find_order(&market, account, order.index, &params, ["cancelOrderId", "cancelOrigClientOrderId"])?.filter(|o| o.status.is_open()).map(|o| o.id);
        (order, target)
    };
    let cancelled = match target {
        Some(target) => submit_cancel(hub, trading, account, target, order.index).await,
        None => Err(unknown_order()),
    };
    let placed = if cancelled.is_err() && stop_on_failure {
        None
    } else {
        let reserved = trading.reserve(&hub.read(), account, &order.client_id);
        Some(match reserved {
            Ok(()) => submit_new_order(hub, trading, order).await,
            Err(e) => Err(e),
        })
    };
    let half = |result: &Result<Value, ApiError>| match result {
        Ok(value) => ("SUCCESS", value.clone()),
        Err(e) => ("FAILURE", json!({"code": e.code, "msg": e.msg})),
    };
    let (cancel_result, cancel_response) = half(&cancelled);
    let (new_result, new_response) = match &placed {
        Some(result) => half(result),
        None => ("NOT_ATTEMPTED", Value::Null),
    };
    let data = json!({"cancelResult": cancel_result, "newOrderResult": new_result, "cancelResponse": cancel_response, "newOrderResponse": new_response});
    // A half whose answer never came (-1007) may still be done: the
    // request's outcome is unknown, not a failure.
    let unknown = |result: &Result<Value, ApiError>| result.as_ref().err().is_some_and(|e| e.code == -1007);
    if unknown(&cancelled) || placed.as_ref().is_some_and(unknown) {
        return Err(ApiError { data: Some(Box::new(data)), ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, -1007, "Timeout waiting for response from backend server. Send status unknown; execution status unknown.") });
    }
    match (cancelled.is_ok(), placed.as_ref().is_some_and(Result::is_ok)) {
        (true, true) => Ok((data, used)),
        (false, false) => Err(ApiError { data: Some(Box::new(data)), ..ApiError::bad(-2022, "Order cancel-replace failed.") }),
        _ => Err(ApiError { data: Some(Box::new(data)), ..ApiError::new(StatusCode::CONFLICT, -2021, "Order cancel-replace partially failed.") }),
    }
}

/// `PUT /api/v3/order/amend/keepPriority`.
pub(crate) async fn amend_order(State(hub): State<Arc<Hub>>, headers: HeaderMap, RawQuery(query): RawQuery, body: Body) -> Reply {
    trading(&hub)?;
    follower(&hub, "/api/v3/order/amend/keepPriority", query.as_deref())?;
    let body = body_text(body, &hub)?;
    let (value, used) = amend_order_core(&hub, &Auth::Rest { headers: &headers, query: query.as_deref(), body: &body }).await?;
    Ok(answer(value, used))
}

/// The work of [`amend_order`], for REST and the WebSocket API: an open
/// order's quantity reduced in place (the engine's replace at the same
/// price: it keeps its id and its place in the queue), and its client id
/// changed if `newClientOrderId` says so (without it, it keeps its own).
pub(crate) async fn amend_order_core(hub: &Hub, auth: &Auth<'_>) -> Result<(Value, u32), ApiError> {
    let trading = trading(hub)?;
    let (account, params, used) = trading.signed(auth, &["symbol", "orderId", "origClientOrderId", "newClientOrderId", "newQty"], |_| 4, false)?;
    let rejected = |msg: &str| ApiError::bad(-2038, msg);
    let (amended, command, annex_client_id, reserved, orig_client_id, index) = {
        let market = hub.read();
        let index = params.instrument(&market)?;
        let info = &market.instruments[index].info;
        if params.get("newQty").is_none() {
            return Err(ApiError::mandatory("newQty"));
        }
        let new_qty = units(&params, "newQty", info.qty_unit, "LOT_SIZE")?.ok_or_else(|| ApiError::mandatory("newQty"))?;
        if new_qty == 0 {
            return Err(ApiError::bad(-1013, "Filter failure: LOT_SIZE"));
        }
        let order = find_order(&market, account, index, &params, ["orderId", "origClientOrderId"])?.filter(|o| o.status.is_open()).ok_or_else(|| rejected("Order does not exist."))?;
        if new_qty > order.qty {
            return Err(rejected("Order amend (quantity increase) is not supported."));
        }
        if new_qty == order.qty {
            return Err(rejected("The requested action would change no state; rejecting."));
        }
        if new_qty <= order.filled {
            return Err(rejected("newQty must be more than the order's executed quantity."));
        }
        let renamed = client_id(&params, "newClientOrderId")?.filter(|new| new.as_str() != order.client_id.as_str());
        if !lock(&trading.waiting).amending.insert(order.id) {
            return Err(rejected("An amendment of this order is already on its way; send the next once it is answered."));
        }
        if let Some(new) = &renamed
            && let Err(e) = trading.reserve(&market, account, new)
        {
            lock(&trading.waiting).amending.remove(&order.id);
            return Err(e);
        }
        let command = Command::Amend { account, order: order.id, qty: new_qty };
        let reserved = renamed.clone().map(|new| (account, new));
        (order.id, command, renamed.unwrap_or_default(), reserved, order.client_id.to_string(), index)
    };
    let request = trading.next_request.fetch_add(1, Ordering::Relaxed);
    let outcome = trading.ask(Request::Command(command), Some(RestAnnex { request, client_id: annex_client_id }), reserved).await;
    lock(&trading.waiting).amending.remove(&amended);
    let outcome = outcome?;
    let market = hub.read();
    match outcome {
        Outcome::Applied { reject: None, order: Some(order), time_ms, seq, .. } => Ok((render::amended_order(&market.instruments[index], &order, &orig_client_id, time_ms, seq), used)),
        Outcome::Applied { reject: Some(reason), .. } => Err(rejected(&format!("Order amend rejected: {}.", reason.name()))),
        _ => Err(rejected("Order does not exist.")),
    }
}

/// `DELETE /api/v3/openOrders`.
pub(crate) async fn cancel_open_orders(State(hub): State<Arc<Hub>>, headers: HeaderMap, RawQuery(query): RawQuery, body: Body) -> Reply {
    trading(&hub)?;
    follower(&hub, "/api/v3/openOrders", query.as_deref())?;
    let body = body_text(body, &hub)?;
    let (value, used) = cancel_open_orders_core(&hub, &Auth::Rest { headers: &headers, query: query.as_deref(), body: &body }).await?;
    Ok(answer(value, used))
}

/// The work of [`cancel_open_orders`], for REST and the WebSocket API: the answer's
/// body and the weight used this minute.
pub(crate) async fn cancel_open_orders_core(hub: &Hub, auth: &Auth<'_>) -> Result<(Value, u32), ApiError> {
    let trading = trading(hub)?;
    let (account, params, used) = trading.signed(auth, &["symbol"], |_| 1, false)?;
    let (instrument, index) = {
        let market = hub.read();
        let index = params.instrument(&market)?;
        (market.instruments[index].info.id, index)
    };
    let request = trading.next_request.fetch_add(1, Ordering::Relaxed);
    let outcome = trading.ask(Request::Command(Command::CancelAll { account, instrument: Some(instrument) }), Some(RestAnnex { request, client_id: String::new() }), None).await?;
    let market = hub.read();
    match outcome {
        Outcome::Applied { reject: None, cancelled, time_ms, .. } if !cancelled.is_empty() => {
            Ok((Value::Array(cancelled.iter().map(|o| render::cancelled_order(&market.instruments[index], o, time_ms)).collect()), used))
        }
        _ => Err(ApiError::bad(-2011, "Unknown order sent.")),
    }
}

/// `GET /api/v3/order`.
pub(crate) async fn query_order(State(hub): State<Arc<Hub>>, headers: HeaderMap, RawQuery(query): RawQuery, body: Body) -> Reply {
    trading(&hub)?;
    let body = body_text(body, &hub)?;
    let (value, used) = query_order_core(&hub, &Auth::Rest { headers: &headers, query: query.as_deref(), body: &body }).await?;
    Ok(answer(value, used))
}

/// The work of [`query_order`], for REST and the WebSocket API: the answer's
/// body and the weight used this minute.
pub(crate) async fn query_order_core(hub: &Hub, auth: &Auth<'_>) -> Result<(Value, u32), ApiError> {
    let trading = trading(hub)?;
    let (account, params, used) = trading.signed(auth, &["symbol", "orderId", "origClientOrderId"], |_| 4, false)?;
    let market = hub.read();
    let index = params.instrument(&market)?;
    let order = find_order(&market, account, index, &params, ["orderId", "origClientOrderId"])?.ok_or_else(|| ApiError::bad(-2013, "Order does not exist."))?;
    Ok((render::order(&market.instruments[index], order), used))
}

/// `GET /api/v3/openOrders`.
pub(crate) async fn open_orders(State(hub): State<Arc<Hub>>, headers: HeaderMap, RawQuery(query): RawQuery, body: Body) -> Reply {
    trading(&hub)?;
    let body = body_text(body, &hub)?;
    let (value, used) = open_orders_core(&hub, &Auth::Rest { headers: &headers, query: query.as_deref(), body: &body }).await?;
    Ok(answer(value, used))
}

/// The work of [`open_orders`], for REST and the WebSocket API: the answer's
/// body and the weight used this minute.
pub(crate) async fn open_orders_core(hub: &Hub, auth: &Auth<'_>) -> Result<(Value, u32), ApiError> {
    let trading = trading(hub)?;
    // `symbol=` (empty) is refused below, at a symbol's weight.
    let (account, params, used) = trading.signed(auth, &["symbol"], |p| if p.all().iter().any(|(name, _)| name == "symbol") { 6 } else { 80 }, false)?;
    let market = hub.read();
    let only = if params.optional("symbol", "a symbol, such as BTCUSD")?.is_some() { Some(params.instrument(&market)?) } else { None };
    let orders: Vec<Value> = market
        .accounts
        .accounts
        .get(&account)
        .map(|data| {
            data.open
                .iter()
                .filter_map(|id| market.accounts.orders.get(id))
                .filter(|o| only.is_none_or(|i| o.instrument as usize == i))
                .map(|o| render::order(&market.instruments[o.instrument as usize], o))
                .collect()
        })
        .unwrap_or_default();
    Ok((Value::Array(orders), used))
}

fn rows(params: &Params) -> Result<usize, ApiError> {
    Ok(params.number("limit", 1..=MAX_ROWS)?.unwrap_or(DEFAULT_ROWS) as usize)
}

/// Binance's window over a list (oldest first): from a starting point
/// given (`fromId`, `orderId`, `startTime`), the first `limit`; otherwise
/// the most recent `limit`.
fn window<T>(mut items: Vec<T>, from_start: bool, limit: usize) -> Vec<T> {
    if from_start {
        items.truncate(limit);
        items
    } else {
        items.split_off(items.len().saturating_sub(limit))
    }
}

/// `GET /api/v3/allOrders`: the account's orders of one symbol, open and
/// ended (the ended ones as far back as they are kept), oldest first.
pub(crate) async fn all_orders(State(hub): State<Arc<Hub>>, headers: HeaderMap, RawQuery(query): RawQuery, body: Body) -> Reply {
    trading(&hub)?;
    let body = body_text(body, &hub)?;
    let (value, used) = all_orders_core(&hub, &Auth::Rest { headers: &headers, query: query.as_deref(), body: &body }).await?;
    Ok(answer(value, used))
}

/// The work of [`all_orders`], for REST and the WebSocket API: the answer's
/// body and the weight used this minute.
pub(crate) async fn all_orders_core(hub: &Hub, auth: &Auth<'_>) -> Result<(Value, u32), ApiError> {
    let trading = trading(hub)?;
    let (account, params, used) = trading.signed(auth, &["symbol", "orderId", "startTime", "endTime", "limit"], |_| 20, false)?;
    let market = hub.read();
    let index = params.instrument(&market)?;
    let limit = rows(&params)?;
    let from_id = params.number("orderId", 0..=u64::MAX)?;
    let (start, end) = params.time_range()?;
    let mut orders: Vec<&OrderRecord> = market
        .accounts
        .accounts
        .get(&account)
        .map(|data| data.open.iter().chain(data.closed.iter()).filter_map(|id| market.accounts.orders.get(id)).collect())
        .unwrap_or_default();
    orders.retain(|o| o.instrument as usize == index && from_id.is_none_or(|f| o.id >= f) && start.is_none_or(|s| o.time_ms >= s) && end.is_none_or(|e| o.time_ms <= e));
    orders.sort_unstable_by_key(|o| o.id);
    let chosen = window(orders, from_id.is_some() || start.is_some(), limit);
    Ok((Value::Array(chosen.iter().map(|o| render::order(&market.instruments[index], o)).collect()), used))
}

/// `GET /api/v3/myTrades`.
pub(crate) async fn my_trades(State(hub): State<Arc<Hub>>, headers: HeaderMap, RawQuery(query): RawQuery, body: Body) -> Reply {
    trading(&hub)?;
    let body = body_text(body, &hub)?;
    let (value, used) = my_trades_core(&hub, &Auth::Rest { headers: &headers, query: query.as_deref(), body: &body }).await?;
    Ok(answer(value, used))
}

/// The work of [`my_trades`], for REST and the WebSocket API: the answer's
/// body and the weight used this minute.
pub(crate) async fn my_trades_core(hub: &Hub, auth: &Auth<'_>) -> Result<(Value, u32), ApiError> {
    let trading = trading(hub)?;
    let (account, params, used) = trading.signed(auth, &["symbol", "orderId", "startTime", "endTime", "fromId", "limit"], |_| 20, false)?;
    let market = hub.read();
    let index = params.instrument(&market)?;
    let limit = rows(&params)?;
    let order = params.number("orderId", 0..=u64::MAX)?;
    let from_id = params.number("fromId", 0..=u64::MAX)?;
    let (start, end) = params.time_range()?;
    let mut trades: Vec<&AccountTrade> = market
        .accounts
        .accounts
        .get(&account)
        .map(|data| data.trades.iter().filter(|t| t.instrument as usize == index).collect())
        .unwrap_or_default();
    trades.retain(|t| order.is_none_or(|o| t.order == o) && from_id.is_none_or(|f| t.id >= f) && start.is_none_or(|s| t.time_ms >= s) && end.is_none_or(|e| t.time_ms <= e));
    let chosen = window(trades, from_id.is_some() || start.is_some(), limit);
    Ok((Value::Array(chosen.iter().map(|t| render::my_trade(&market.instruments[index], t)).collect()), used))
}

/// `GET /api/v3/account`: balances from the engine, asked in sequence.
pub(crate) async fn account(State(hub): State<Arc<Hub>>, headers: HeaderMap, RawQuery(query): RawQuery, body: Body) -> Reply {
    trading(&hub)?;
    let body = body_text(body, &hub)?;
    let (value, used) = account_core(&hub, &Auth::Rest { headers: &headers, query: query.as_deref(), body: &body }).await?;
    Ok(answer(value, used))
}

/// The work of [`account`], for REST and the WebSocket API: the answer's
/// body and the weight used this minute.
pub(crate) async fn account_core(hub: &Hub, auth: &Auth<'_>) -> Result<(Value, u32), ApiError> {
    let trading = trading(hub)?;
    let (account, params, used) = trading.signed(auth, &["omitZeroBalances"], |_| 20, false)?;
    let omit_zero = match params.optional("omitZeroBalances", "true, false")? {
        None | Some("false") => false,
        Some("true") => true,
        Some(_) => return Err(ApiError::illegal("omitZeroBalances", "true, false")),
    };
    let query = Query { account, kind: QueryKind::Balances, token: 0, request: 0 };
    let Outcome::Answered(answered) = trading.ask(Request::Query(query), None, None).await? else {
        return Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, -1000, "Unexpected answer."));
    };
    let (update_ms, fees) = {
        let market = hub.read();
        // Binance's account-wide rates: the first instrument's (each
        // symbol's own: GET /api/v3/account/commission).
        let fees = market.instruments.first().map_or((0, 0), |d| (d.info.maker_bps, d.info.taker_bps));
        (market.accounts.accounts.get(&account).map_or(0, |d| d.update_ms), fees)
    };
    let rate = |bps: i64| render::decimal(i128::from(bps), Unit { mantissa: 1, scale: 4 });
    let balances = trading.balances_json(answered.balances.iter().filter(|(_, available, locked)| !omit_zero || *available > 0 || *locked > 0));
    Ok((
        json!({
            "makerCommission": fees.0,
            "takerCommission": fees.1,
            "buyerCommission": 0,
            "sellerCommission": 0,
            "commissionRates": {"maker": rate(fees.0), "taker": rate(fees.1), "buyer": "0", "seller": "0"},
            "uid": account,
            "accountType": "SPOT",
            "canTrade": true,
            "canWithdraw": false,
            "canDeposit": false,
            "brokered": false,
            "requireSelfTradePrevention": false,
            "preventSor": false,
            "updateTime": update_ms,
            "balances": balances,
            "permissions": ["SPOT"],
        }),
        used,
    ))
}

/// `GET /api/v3/account/commission`: the symbol's fees (the same for
/// every account).
pub(crate) async fn commission(State(hub): State<Arc<Hub>>, headers: HeaderMap, RawQuery(query): RawQuery, body: Body) -> Reply {
    trading(&hub)?;
    let body = body_text(body, &hub)?;
    let (value, used) = commission_core(&hub, &Auth::Rest { headers: &headers, query: query.as_deref(), body: &body }).await?;
    Ok(answer(value, used))
}

/// The work of [`commission`], for REST and the WebSocket API: the answer's
/// body and the weight used this minute.
pub(crate) async fn commission_core(hub: &Hub, auth: &Auth<'_>) -> Result<(Value, u32), ApiError> {
    let trading = trading(hub)?;
    let (_, params, used) = trading.signed(auth, &["symbol"], |_| 20, false)?;
    let market = hub.read();
    let info = &market.instruments[params.instrument(&market)?].info;
    let bps = |value: i64| render::decimal(i128::from(value), Unit { mantissa: 1, scale: 4 });
    let zero = || json!({"maker": "0", "taker": "0", "buyer": "0", "seller": "0"});
    Ok((
        json!({
            "symbol": info.binance,
            "standardCommission": {"maker": bps(info.maker_bps), "taker": bps(info.taker_bps), "buyer": "0", "seller": "0"},
            "specialCommission": zero(),
            "taxCommission": zero(),
            "discount": {"enabledForAccount": false, "enabledForSymbol": false, "discountAsset": Value::Null, "discount": "0"},
        }),
        used,
    ))
}

/// `POST /api/v3/userDataStream`: the account's listen key (the same one
/// while it lives; its hour starts again).
pub(crate) async fn new_listen_key(State(hub): State<Arc<Hub>>, headers: HeaderMap, RawQuery(query): RawQuery, body: Body) -> Reply {
    let trading = trading(&hub)?;
    let body = body_text(body, &hub)?;
    let (account, _, used) = trading.keyed(&headers, query.as_deref(), &body, &[], 2)?;
    let key = trading.streams.open(account).map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, -1000, format!("Cannot make a listen key: {e}")))?;
    Ok(answer(json!({"listenKey": key}), used))
}

/// `PUT /api/v3/userDataStream`: another hour for the key.
pub(crate) async fn keep_listen_key(State(hub): State<Arc<Hub>>, headers: HeaderMap, RawQuery(query): RawQuery, body: Body) -> Reply {
    let trading = trading(&hub)?;
    let body = body_text(body, &hub)?;
    let (account, params, used) = trading.keyed(&headers, query.as_deref(), &body, &["listenKey"], 2)?;
    let key = params.get("listenKey").ok_or_else(|| ApiError::mandatory("listenKey"))?;
    if !trading.streams.keep(account, key) {
        return Err(ApiError::bad(-1125, "This listenKey does not exist."));
    }
    Ok(answer(json!({}), used))
}

/// `DELETE /api/v3/userDataStream`: the key and its stream end.
pub(crate) async fn close_listen_key(State(hub): State<Arc<Hub>>, headers: HeaderMap, RawQuery(query): RawQuery, body: Body) -> Reply {
    let trading = trading(&hub)?;
    let body = body_text(body, &hub)?;
    let (account, params, used) = trading.keyed(&headers, query.as_deref(), &body, &["listenKey"], 2)?;
    let key = params.get("listenKey").ok_or_else(|| ApiError::mandatory("listenKey"))?;
    if !trading.streams.close(account, key) {
        return Err(ApiError::bad(-1125, "This listenKey does not exist."));
    }
    super::userstream::expired(&hub, key);
    Ok(answer(json!({}), used))
}

/// `GET /api/v3/aggTrades` (public, `http::Public::AggTrades`): the
/// recent trades, each its own aggregate (`a` is the trade's id), oldest
/// first.
pub(crate) fn agg_trades_json(market: &MarketData, params: &Params) -> Result<Value, ApiError> {
    let data = &market.instruments[params.instrument(market)?];
    let limit = params.number("limit", 1..=super::http::MAX_TRADES as u64)?.unwrap_or(500) as usize;
    let from_id = params.number("fromId", 0..=u64::MAX)?;
    let (start, end) = params.time_range()?;
    let trades: Vec<&crossbook_marketdata::Trade> = data.trades.iter().filter(|t| from_id.is_none_or(|f| t.id >= f) && start.is_none_or(|s| t.time_ms >= s) && end.is_none_or(|e| t.time_ms <= e)).collect();
    let chosen = window(trades, from_id.is_some() || start.is_some(), limit);
    Ok(Value::Array(chosen.iter().map(|t| render::agg_trade(data, t)).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::now_us;

    fn check(timestamp: u64, window: Option<&str>) -> Result<(), i32> {
        let mut pairs = vec![("timestamp".to_string(), timestamp.to_string())];
        if let Some(window) = window {
            pairs.push(("recvWindow".to_string(), window.to_string()));
        }
        check_time(&Params::from_pairs(pairs)).map_err(|e| e.code)
    }

    /// `recvWindow`'s decimals count: a microsecond timestamp 10.4 ms
    /// behind is inside 10.999 ms and 10.5, outside 10 and 10.3; one in
    /// milliseconds is compared in whole milliseconds.
    #[test]
    fn the_receive_window_counts_its_decimals() {
        for (window, inside) in [("10", false), ("10.3", false), ("10.5", true), ("10.999", true), ("11", true)] {
            assert_eq!(check(now_us() - 10_400, Some(window)).is_ok(), inside, "recvWindow {window}, 10.4 ms behind (us)");
        }
        let now_ms = now_us() / 1000;
        assert_eq!(check(now_ms - 2_000, Some("1999.999")), Err(-1021), "2 s behind in ms, window under 2 s");
        assert_eq!(check(now_ms - 2_000, Some("2000.5")), Ok(()));
        assert_eq!(check(now_ms - 4_000, None), Ok(()), "the default window is 5 s");
        assert_eq!(check(now_ms - 6_000, None), Err(-1021));
        assert_eq!(check(now_ms + 2_000, None), Err(-1021), "ahead");
        assert_eq!(check(now_us() + 2_000_000, None), Err(-1021), "ahead, in us");
        assert_eq!(check(now_ms, Some("60000.001")), Err(-1131));
        assert_eq!(check(now_ms, Some("-1")), Err(-1100));
    }
}
