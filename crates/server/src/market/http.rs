//! The HTTP side of market data: Binance's public REST endpoints, the
//! WebSocket upgrades, the dashboard's files, and `/crossbook/stats`. One
//! tokio runtime on a thread of its own (`market-http`).

use super::{Hub, ws};
use crate::{ServeError, log, now_ms};
use axum::Router;
use axum::extract::{Path, RawQuery, State, WebSocketUpgrade};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use crossbook_marketdata::candles::interval;
use crossbook_marketdata::{MarketData, render};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Levels a depth request may ask for, at most (Binance's bound).
pub(crate) const MAX_DEPTH: usize = 5000;
/// Trades and candles a request may ask for, at most.
pub(crate) const MAX_TRADES: usize = 1000;
pub(crate) const MAX_KLINES: usize = 1000;
/// Parameters of a query string (or of a form body), at most.
const MAX_PARAMS: usize = 64;
/// How long a stopping server waits for its connections to close.
pub(crate) const STOP_GRACE: Duration = Duration::from_secs(3);

/// The running server: its address and how to stop it.
pub(crate) struct Running {
    pub(crate) address: SocketAddr,
    stop: tokio::sync::watch::Sender<bool>,
    thread: std::thread::JoinHandle<()>,
}

impl Running {
    /// Closes every WebSocket with a reason and stops serving.
    pub(crate) fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.thread.join();
    }
}

/// A Binance-style error answer: `{"code": -1121, "msg": "Invalid symbol."}`.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) code: i32,
    pub(crate) msg: String,
    /// Seconds, for a `Retry-After` header (429).
    pub(crate) retry_after: Option<u64>,
    /// A `Location` header (a follower's 307 to the leader).
    pub(crate) location: Option<String>,
    /// What was done before the error (`order/cancelReplace`: each half's
    /// result), as Binance's `data`.
    pub(crate) data: Option<Box<Value>>,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: i32, msg: impl Into<String>) -> ApiError {
        ApiError { status, code, msg: msg.into(), retry_after: None, location: None, data: None }
    }

    pub(crate) fn bad(code: i32, msg: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, code, msg)
    }

    /// A body past `max_body` bytes: 413.
    pub(crate) fn body_too_large(max_body: usize) -> ApiError {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, -1000, format!("Request body too large: at most {max_body} bytes."))
    }

    pub(crate) fn invalid_symbol() -> ApiError {
        ApiError::bad(-1121, "Invalid symbol.")
    }

    pub(crate) fn mandatory(name: &str) -> ApiError {
        ApiError::bad(-1102, format!("Mandatory parameter '{name}' was not sent, was empty/null, or malformed."))
    }

    pub(crate) fn illegal(name: &str, legal: &str) -> ApiError {
        ApiError::bad(-1100, format!("Illegal characters found in parameter '{name}'; legal range is '{legal}'."))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = match self.data {
            Some(data) => json!({"code": self.code, "msg": self.msg, "data": data}),
            None => json!({"code": self.code, "msg": self.msg}),
        };
        let mut response = (self.status, json_response(body)).into_response();
        if let Some(seconds) = self.retry_after {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if let Some(location) = self.location.as_deref().and_then(|l| HeaderValue::from_str(l).ok()) {
            response.headers_mut().insert(header::LOCATION, location);
        }
        response
    }
}

pub(crate) fn json_response(value: Value) -> Response {
    ([(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], value.to_string()).into_response()
}

/// A request's query parameters, checked the way Binance checks them: each
/// at most once, none the endpoint does not read.
pub(crate) struct Params(Vec<(String, String)>);

impl Params {
    pub(crate) fn parse(query: Option<&str>, known: &[&str]) -> Result<Params, ApiError> {
        Params::parse_both(query, None, known)
    }

    /// The parameters of the query string and of a form body together
    /// (a signed request may use either or both; on a name in both, the
    /// query string's wins, as on Binance).
    pub(crate) fn parse_both(query: Option<&str>, body: Option<&str>, known: &[&str]) -> Result<Params, ApiError> {
        let mut params = pairs(query.unwrap_or(""))?;
        for (name, value) in pairs(body.unwrap_or(""))? {
            if !params.iter().any(|(n, _)| *n == name) {
                params.push((name, value));
            }
        }
        let read = params.iter().filter(|(n, _)| known.contains(&n.as_str())).count();
        if read < params.len() {
            return Err(ApiError::bad(-1104, format!("Not all sent parameters were read; read '{read}' parameter(s) but was sent '{}'.", params.len())));
        }
        let decoded = params.into_iter().map(|(name, value)| match decode(value) {
            Some(value) => Ok((name, value)),
            None => Err(ApiError::illegal(&name, "percent-encoded UTF-8")),
        });
        Ok(Params(decoded.collect::<Result<_, _>>()?))
    }

    /// Parameters already split (a WebSocket API request's `params`).
    pub(crate) fn from_pairs(pairs: Vec<(String, String)>) -> Params {
        Params(pairs)
    }

    pub(crate) fn all(&self) -> &[(String, String)] {
        &self.0
    }

    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str()).filter(|v| !v.is_empty())
    }

    /// An optional parameter: sent with an empty value, it is refused
    /// (-1100, its `legal` values named), not taken as not sent (which for
    /// `symbol` on a ticker would answer every instrument).
    pub(crate) fn optional(&self, name: &str, legal: &str) -> Result<Option<&str>, ApiError> {
        match self.0.iter().find(|(n, _)| n == name) {
            Some((_, value)) if value.is_empty() => Err(ApiError::illegal(name, legal)),
            Some((_, value)) => Ok(Some(value.as_str())),
            None => Ok(None),
        }
    }

    /// `startTime` and `endTime`, if given; a start after the end is -1023.
    pub(crate) fn time_range(&self) -> Result<(Option<u64>, Option<u64>), ApiError> {
        let start = self.number("startTime", 0..=u64::MAX)?;
        let end = self.number("endTime", 0..=u64::MAX)?;
        if let (Some(start), Some(end)) = (start, end)
            && start > end
        {
            return Err(ApiError::bad(-1023, "Start time is greater than end time."));
        }
        Ok((start, end))
    }

    pub(crate) fn number(&self, name: &str, range: std::ops::RangeInclusive<u64>) -> Result<Option<u64>, ApiError> {
        let legal = format!("{}-{}", range.start(), range.end());
        match self.optional(name, &legal)? {
            None => Ok(None),
            Some(text) => match text.parse::<u64>() {
                Ok(n) if range.contains(&n) => Ok(Some(n)),
                _ => Err(ApiError::illegal(name, &legal)),
            },
        }
    }

    /// The instrument named by `symbol` (any case; Binance's way of
    /// writing it: `BTCUSD` for `BTC-USD`).
    pub(crate) fn instrument(&self, market: &MarketData) -> Result<usize, ApiError> {
        let symbol = self.get("symbol").ok_or_else(|| ApiError::mandatory("symbol"))?;
        market.index_of_symbol(&symbol.to_ascii_uppercase()).ok_or_else(ApiError::invalid_symbol)
    }

    /// The instruments of `symbol`, of `symbols` (`["A","B"]`), or all.
    fn instruments(&self, market: &MarketData) -> Result<Option<Vec<usize>>, ApiError> {
        match (self.optional("symbol", "a symbol, such as BTCUSD")?, self.optional("symbols", "a JSON array of symbols")?) {
            (Some(_), Some(_)) => Err(ApiError::bad(-1128, "Combination of optional parameters invalid.")),
            (Some(_), None) => Ok(Some(vec![self.instrument(market)?])),
            (None, Some(list)) => {
                let names: Vec<String> = serde_json::from_str(list).map_err(|_| ApiError::illegal("symbols", "a JSON array of symbols"))?;
                if names.is_empty() {
                    return Err(ApiError::mandatory("symbols"));
                }
                names.iter().map(|n| market.index_of_symbol(&n.to_ascii_uppercase()).ok_or_else(ApiError::invalid_symbol)).collect::<Result<Vec<_>, _>>().map(Some)
            }
            (None, None) => Ok(None),
        }
    }
}

/// The `name=value` pairs of a query string or form body, the names
/// decoded, the values as sent (decoded once every name is known to be
/// read: a parameter the endpoint does not read is -1104 whatever its
/// value); a name given twice is refused.
fn pairs(text: &str) -> Result<Vec<(String, &str)>, ApiError> {
    let mut params: Vec<(String, &str)> = Vec::new();
    for pair in text.split('&').filter(|p| !p.is_empty()) {
        // No endpoint reads a quarter as many; checked before the rest
        // (each name is compared with those before it).
        if params.len() == MAX_PARAMS {
            return Err(ApiError::bad(-1101, format!("Too many parameters: at most {MAX_PARAMS} are read.")));
        }
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let name = decode(name).ok_or_else(|| ApiError::bad(-1100, "Illegal characters found in a parameter name."))?;
        if params.iter().any(|(n, _)| *n == name) {
            return Err(ApiError::bad(-1101, format!("Duplicate values for parameter '{name}'.")));
        }
        params.push((name, value));
    }
    Ok(params)
}

/// Percent-decoding of a query component (`+` is a space).
fn decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        match bytes[at] {
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(at + 1..at + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                at += 3;
            }
            b'+' => {
                out.push(b' ');
                at += 1;
            }
            byte => {
                out.push(byte);
                at += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

type Answer = Result<Response, ApiError>;

async fn ping(RawQuery(query): RawQuery) -> Answer {
    Params::parse(query.as_deref(), &[])?;
    Ok(json_response(json!({})))
}

async fn time(RawQuery(query): RawQuery) -> Answer {
    Params::parse(query.as_deref(), &[])?;
    Ok(json_response(json!({"serverTime": now_ms()})))
}

/// The per-key limits of the signed endpoints, as Binance lists them (the
/// WebSocket connection and stream limits are not rates: they are in
/// `docs/marketdata.md`, not here).
fn rate_limits(hub: &Hub) -> Value {
    match &hub.trading {
        Some(trading) => json!([
            {"rateLimitType": "REQUEST_WEIGHT", "interval": "MINUTE", "intervalNum": 1, "limit": trading.max_weight()},
            {"rateLimitType": "ORDERS", "interval": "SECOND", "intervalNum": 10, "limit": trading.max_orders()},
        ]),
        None => json!([]),
    }
}

/// The public market-data endpoints, as REST serves them and as the
/// WebSocket API's market-data methods do (`docs/trading.md`, "The
/// WebSocket API"): one answer, whichever way it is asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Public {
    ExchangeInfo,
    Depth,
    Trades,
    AggTrades,
    Klines,
    Ticker24hr,
    BookTicker,
    PriceTicker,
    AvgPrice,
}

impl Public {
    /// The parameters it reads.
    pub(crate) fn known(self) -> &'static [&'static str] {
        match self {
            Public::ExchangeInfo | Public::BookTicker | Public::PriceTicker => &["symbol", "symbols"],
            Public::Depth | Public::Trades => &["symbol", "limit"],
            Public::AvgPrice => &["symbol"],
            Public::AggTrades => &["symbol", "fromId", "startTime", "endTime", "limit"],
            Public::Klines => &["symbol", "interval", "startTime", "endTime", "limit", "timeZone"],
            Public::Ticker24hr => &["symbol", "symbols", "type"],
        }
    }

    /// The WebSocket API method that asks for it (Binance's names).
    pub(crate) fn of_method(method: &str) -> Option<Public> {
        Some(match method {
            "exchangeInfo" => Public::ExchangeInfo,
            "depth" => Public::Depth,
            "trades.recent" => Public::Trades,
            "trades.aggregate" => Public::AggTrades,
            "klines" | "uiKlines" => Public::Klines,
            "ticker.24hr" => Public::Ticker24hr,
            "ticker.book" => Public::BookTicker,
            "ticker.price" => Public::PriceTicker,
            "avgPrice" => Public::AvgPrice,
            _ => return None,
        })
    }
}

/// A public endpoint's answer to `params` (read as [`Public::known`]).
pub(crate) fn public(hub: &Hub, endpoint: Public, params: &Params) -> Result<Value, ApiError> {
    match endpoint {
        Public::ExchangeInfo => {
            let market = hub.read();
            let mut info = render::exchange_info(&market, now_ms(), rate_limits(hub));
            if let Some(only) = params.instruments(&market)? {
                let symbols: Vec<Value> = only.iter().map(|&i| info["symbols"][i].clone()).collect();
                info["symbols"] = Value::Array(symbols);
            }
            Ok(info)
        }
        // `symbol` first, as Binance checks it (a missing one is -1102,
        // an unknown one -1121, whatever else is wrong).
        Public::Depth => {
            let market = hub.read();
            let index = params.instrument(&market)?;
            let limit = params.number("limit", 1..=MAX_DEPTH as u64)?.unwrap_or(100) as usize;
            Ok(render::depth(&market, &market.instruments[index], limit))
        }
        Public::Trades => {
            let market = hub.read();
            let index = params.instrument(&market)?;
            let limit = params.number("limit", 1..=MAX_TRADES as u64)?.unwrap_or(500) as usize;
            Ok(render::trades(&market.instruments[index], limit))
        }
        Public::AggTrades => super::trading::agg_trades_json(&hub.read(), params),
        Public::Klines => {
            let market = hub.read();
            let index = params.instrument(&market)?;
            let name = params.get("interval").ok_or_else(|| ApiError::mandatory("interval"))?;
            let interval = interval(name).ok_or_else(|| ApiError::bad(-1120, "Invalid interval."))?;
            let (start, end) = params.time_range()?;
            if params.optional("timeZone", "UTC")?.is_some_and(|z| !is_utc(z)) {
                return Err(ApiError::bad(-1100, "Illegal characters found in parameter 'timeZone'; only UTC (0) is served."));
            }
            let limit = params.number("limit", 1..=MAX_KLINES as u64)?.unwrap_or(500) as usize;
            Ok(render::klines(&market.instruments[index], interval, start, end, limit))
        }
        Public::Ticker24hr => {
            if params.optional("type", "FULL")?.is_some_and(|t| t != "FULL") {
                return Err(ApiError::illegal("type", "FULL"));
            }
            let market = hub.read();
            per_symbol(params, &market, |i| render::ticker_24hr(&market, i))
        }
        Public::BookTicker => {
            let market = hub.read();
            per_symbol(params, &market, |i| render::book_ticker(&market.instruments[i]))
        }
        Public::PriceTicker => {
            let market = hub.read();
            per_symbol(params, &market, |i| render::price_ticker(&market.instruments[i]))
        }
        Public::AvgPrice => {
            let market = hub.read();
            let index = params.instrument(&market)?;
            Ok(render::avg_price(&market, index))
        }
    }
}

/// A public endpoint over REST.
fn serve_public(hub: &Hub, endpoint: Public, query: Option<String>) -> Answer {
    let params = Params::parse(query.as_deref(), endpoint.known())?;
    Ok(json_response(public(hub, endpoint, &params)?))
}

async fn exchange_info(State(hub): State<Arc<Hub>>, RawQuery(query): RawQuery) -> Answer {
    serve_public(&hub, Public::ExchangeInfo, query)
}

async fn depth(State(hub): State<Arc<Hub>>, RawQuery(query): RawQuery) -> Answer {
    serve_public(&hub, Public::Depth, query)
}

async fn trades(State(hub): State<Arc<Hub>>, RawQuery(query): RawQuery) -> Answer {
    serve_public(&hub, Public::Trades, query)
}

async fn agg_trades(State(hub): State<Arc<Hub>>, RawQuery(query): RawQuery) -> Answer {
    serve_public(&hub, Public::AggTrades, query)
}

/// Whether a klines `timeZone` is UTC: `UTC` in any case, or a zero
/// offset as Binance writes offsets (hours, or hours:minutes, either
/// signed: `0`, `-0`, `+00:00`, `0:00`). A `+` written as is in a URL
/// arrives as a space (a query string decodes as a form does): a leading
/// space is that plus.
fn is_utc(zone: &str) -> bool {
    if zone.eq_ignore_ascii_case("utc") {
        return true;
    }
    let unsigned = zone.strip_prefix(['+', '-', ' ']).unwrap_or(zone);
    let (hours, minutes) = unsigned.split_once(':').map_or((unsigned, None), |(h, m)| (h, Some(m)));
    let zeros = |digits: &str, lengths: std::ops::RangeInclusive<usize>| lengths.contains(&digits.len()) && digits.bytes().all(|b| b == b'0');
    zeros(hours, 1..=2) && minutes.is_none_or(|m| zeros(m, 2..=2))
}

async fn klines(State(hub): State<Arc<Hub>>, RawQuery(query): RawQuery) -> Answer {
    serve_public(&hub, Public::Klines, query)
}

/// A ticker's answer: one object for `symbol`, an array for `symbols` or,
/// without either, for every instrument.
fn per_symbol(params: &Params, market: &MarketData, one: impl Fn(usize) -> Value) -> Result<Value, ApiError> {
    Ok(match params.instruments(market)? {
        Some(only) if params.get("symbol").is_some() => one(only[0]),
        Some(only) => Value::Array(only.iter().map(|&i| one(i)).collect()),
        None => Value::Array((0..market.instruments.len()).map(one).collect()),
    })
}

async fn ticker_24hr(State(hub): State<Arc<Hub>>, RawQuery(query): RawQuery) -> Answer {
    serve_public(&hub, Public::Ticker24hr, query)
}

async fn book_ticker(State(hub): State<Arc<Hub>>, RawQuery(query): RawQuery) -> Answer {
    serve_public(&hub, Public::BookTicker, query)
}

async fn price_ticker(State(hub): State<Arc<Hub>>, RawQuery(query): RawQuery) -> Answer {
    serve_public(&hub, Public::PriceTicker, query)
}

async fn avg_price(State(hub): State<Arc<Hub>>, RawQuery(query): RawQuery) -> Answer {
    serve_public(&hub, Public::AvgPrice, query)
}

/// The dashboard's figures: what the venue has done, who is connected.
async fn stats(State(hub): State<Arc<Hub>>, RawQuery(query): RawQuery) -> Answer {
    Params::parse(query.as_deref(), &[])?;
    // Counted before the state's lock is taken: the FIX count takes the
    // FIX gateway's lock, which must never be waited for under it.
    let sessions = hub.sessions.load(std::sync::atomic::Ordering::Relaxed) + hub.fix_sessions.as_ref().map_or(0, |count| count());
    let market = hub.read();
    Ok(json_response(json!({
        "seq": market.seq,
        "time": market.time_ms,
        "orders": market.counters.orders,
        "trades": market.counters.trades,
        "cancels": market.counters.cancels,
        "tradingSessions": sessions,
        "webSockets": hub.connections.load(std::sync::atomic::Ordering::Relaxed),
        "messagesSent": hub.sent.load(std::sync::atomic::Ordering::Relaxed),
        "slowClientsDropped": hub.slow_dropped.load(std::sync::atomic::Ordering::Relaxed),
        "instruments": market.instruments.iter().map(|d| json!({"symbol": d.info.binance, "name": d.info.symbol, "baseAsset": d.info.base_asset, "quoteAsset": d.info.quote_asset, "pricePrecision": d.info.price_unit.scale, "qtyPrecision": d.info.qty_unit.scale, "maxPrice": render::decimal(i128::from(d.info.max_price), d.info.price_unit), "status": if d.halted { "HALT" } else { "TRADING" }})).collect::<Vec<_>>(),
    })))
}

/// An error the HTTP layer answered by itself (a method the path does not
/// take, a WebSocket path asked without an upgrade, a body it could not
/// read) in the API's shape: `{"code": -1000, "msg"}` at its status.
async fn json_errors(response: Response) -> Response {
    let status = response.status();
    let is_json = response.headers().get(header::CONTENT_TYPE).is_some_and(|t| t.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let allow = response.headers().get(header::ALLOW).cloned();
    let said = axum::body::to_bytes(response.into_body(), 4096).await.unwrap_or_default();
    let said = String::from_utf8_lossy(&said);
    let msg = match (status, &allow) {
        (StatusCode::METHOD_NOT_ALLOWED, Some(allow)) => format!("Method not allowed: this path takes {}.", allow.to_str().unwrap_or("another method")),
        // The router adds its `allow` header outside this layer.
        (StatusCode::METHOD_NOT_ALLOWED, None) => "Method not allowed: the allow header lists what this path takes.".to_string(),
        _ if said.trim().is_empty() => status.canonical_reason().unwrap_or("Bad request").to_string(),
        _ => said.trim().to_string(),
    };
    let mut answer = ApiError::new(status, -1000, msg).into_response();
    if let Some(allow) = allow {
        answer.headers_mut().insert(header::ALLOW, allow);
    }
    answer
}

async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, -1000, format!("Unknown path: {}", uri.path()))
}

fn asset(content_type: &'static str, body: &'static [u8]) -> Response {
    ([(header::CONTENT_TYPE, HeaderValue::from_static(content_type)), (header::CACHE_CONTROL, HeaderValue::from_static("no-cache"))], body).into_response()
}

async fn index() -> Response {
    asset("text/html; charset=utf-8", include_bytes!("dashboard/index.html"))
}

async fn app_js() -> Response {
    asset("text/javascript; charset=utf-8", include_bytes!("dashboard/app.js"))
}

async fn charts_js() -> Response {
    asset("text/javascript; charset=utf-8", include_bytes!("dashboard/vendor/lightweight-charts.standalone.production.js"))
}

async fn charts_licence() -> Response {
    asset("text/plain; charset=utf-8", include_bytes!("dashboard/vendor/LICENSE-lightweight-charts"))
}

async fn ws_raw(State(hub): State<Arc<Hub>>, Path(streams): Path<String>, RawQuery(query): RawQuery, upgrade: WebSocketUpgrade) -> Response {
    // The streams are named in the path: a parameter (`?streams=`, the
    // combined form's) would be read by nobody.
    if let Err(e) = Params::parse(query.as_deref(), &[]) {
        return e.into_response();
    }
    // `/ws/<n>` with a number of up to four digits: a connection with no
    // stream yet, as `/ws`. ccxt's Binance class connects so (`/ws/0`,
    // `/ws/1`, ...: the index of the connection it spreads its
    // subscriptions over) and subscribes with SUBSCRIBE, as Binance
    // allows; a listen key is never a number.
    if (1..=4).contains(&streams.len()) && streams.bytes().all(|b| b.is_ascii_digit()) {
        return ws::upgrade(hub, upgrade, Vec::new(), false);
    }
    ws::upgrade(hub, upgrade, streams.split('/').filter(|s| !s.is_empty()).map(str::to_string).collect(), false)
}

async fn ws_api(State(hub): State<Arc<Hub>>, upgrade: WebSocketUpgrade) -> Response {
    ws::upgrade_api(hub, upgrade)
}

async fn ws_bare(State(hub): State<Arc<Hub>>, RawQuery(query): RawQuery, upgrade: WebSocketUpgrade) -> Response {
    // Streams are named in the path (`/ws/<a>/<b>`) or subscribed to:
    // a parameter here would be read by nobody.
    if let Err(e) = Params::parse(query.as_deref(), &[]) {
        return e.into_response();
    }
    ws::upgrade(hub, upgrade, Vec::new(), false)
}

async fn ws_combined(State(hub): State<Arc<Hub>>, RawQuery(query): RawQuery, upgrade: WebSocketUpgrade) -> Response {
    let params = match Params::parse(query.as_deref(), &["streams"]) {
        Ok(params) => params,
        Err(e) => return e.into_response(),
    };
    let streams = params.get("streams").map(|s| s.split('/').filter(|s| !s.is_empty()).map(str::to_string).collect()).unwrap_or_default();
    ws::upgrade(hub, upgrade, streams, true)
}

fn router(hub: Arc<Hub>) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/assets/app.js", get(app_js))
        .route("/assets/lightweight-charts.js", get(charts_js))
        .route("/assets/LICENSE-lightweight-charts", get(charts_licence))
        .route("/api/v3/ping", get(ping))
        .route("/api/v3/time", get(time))
        .route("/api/v3/exchangeInfo", get(exchange_info))
        .route("/api/v3/depth", get(depth))
        .route("/api/v3/trades", get(trades))
        .route("/api/v3/klines", get(klines))
        .route("/api/v3/uiKlines", get(klines))
        .route("/api/v3/ticker/24hr", get(ticker_24hr))
        .route("/api/v3/ticker/bookTicker", get(book_ticker))
        .route("/api/v3/ticker/price", get(price_ticker))
        .route("/api/v3/avgPrice", get(avg_price))
        .route("/api/v3/aggTrades", get(agg_trades))
        .route("/api/v3/order", post(super::trading::new_order).delete(super::trading::cancel_order).get(super::trading::query_order))
        .route("/api/v3/order/cancelReplace", post(super::trading::cancel_replace))
        .route("/api/v3/order/test", post(super::trading::test_order))
        .route("/api/v3/order/amend/keepPriority", put(super::trading::amend_order))
        .route("/api/v3/openOrders", get(super::trading::open_orders).delete(super::trading::cancel_open_orders))
        .route("/api/v3/allOrders", get(super::trading::all_orders))
        .route("/api/v3/myTrades", get(super::trading::my_trades))
        .route("/api/v3/account", get(super::trading::account))
        .route("/api/v3/account/commission", get(super::trading::commission))
        .route("/api/v3/userDataStream", post(super::trading::new_listen_key).put(super::trading::keep_listen_key).delete(super::trading::close_listen_key))
        .route("/crossbook/stats", get(stats))
        .route("/crossbook/admin/v1/deposit", post(super::admin::deposit))
        .route("/crossbook/admin/v1/withdraw", post(super::admin::withdraw))
        .route("/crossbook/admin/v1/transfer", get(super::admin::transfer_by_reference))
        .route("/crossbook/admin/v1/balances", get(super::admin::balances))
        .route("/crossbook/admin/v1/halt", post(super::admin::halt))
        .route("/crossbook/admin/v1/resume", post(super::admin::resume))
        .route("/ws", get(ws_bare))
        .route("/ws/", get(ws_bare))
        .route("/ws/{*streams}", get(ws_raw))
        .route("/stream", get(ws_combined))
        .route("/stream/", get(ws_combined))
        .route("/ws-api/v3", get(ws_api))
        .fallback(not_found)
        .layer(axum::middleware::map_response(json_errors))
        .layer(axum::middleware::from_fn_with_state(hub.clone(), whole_body))
        .layer(axum::extract::DefaultBodyLimit::max(hub.config.max_body))
        .with_state(hub)
}

/// Reads a request's whole body before any handler sees it, bounded in
/// size (`max_body`: HTTP 413, at once where `Content-Length` says more)
/// and in time (`header_timeout_s` from the header's end: HTTP 408). A
/// body left unread would be drained by hyper after the answer with no
/// time limit, so a client that declares a body and stalls would hold its
/// connection, one of `max_http_connections`, for good. Both refusals
/// close the connection: what is left of the body is never read.
async fn whole_body(State(hub): State<Arc<Hub>>, request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let refuse = |error: ApiError| {
        let mut response = error.into_response();
        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        response
    };
    let too_large = || ApiError::body_too_large(hub.config.max_body);
    let declared = request.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|length| length > hub.config.max_body as u64) {
        return refuse(too_large());
    }
    let (parts, body) = request.into_parts();
    let patience = Duration::from_secs(hub.config.header_timeout_s);
    match tokio::time::timeout(patience, axum::body::to_bytes(body, hub.config.max_body)).await {
        Ok(Ok(bytes)) => {
            let request = axum::extract::Request::from_parts(parts, axum::body::Body::from(bytes));
            let (mut response, used) = weighed(next.run(request)).await;
            if let Some(used) = used {
                response.headers_mut().entry("x-mbx-used-weight-1m").or_insert(HeaderValue::from(used));
            }
            response
        }
        Ok(Err(error)) => match error.into_inner().is::<http_body_util::LengthLimitError>() {
            true => refuse(too_large()),
            false => refuse(ApiError::bad(-1000, "The request body is malformed or was cut short.")),
        },
        Err(_) => refuse(ApiError::new(StatusCode::REQUEST_TIMEOUT, -1000, format!("The request body did not arrive within {} s.", hub.config.header_timeout_s))),
    }
}

/// Binds `[market_data] listen` and serves on a thread of its own.
pub(crate) fn start(hub: Arc<Hub>) -> Result<Running, ServeError> {
    let listener = std::net::TcpListener::bind(&hub.config.listen).map_err(ServeError::io(format!("listening on {} (market data)", hub.config.listen)))?;
    listener.set_nonblocking(true).map_err(ServeError::io("setting the market-data listener non-blocking"))?;
    let address = listener.local_addr().map_err(ServeError::io("reading the market-data address"))?;
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(ServeError::io("starting the market-data runtime"))?;
    let thread = std::thread::Builder::new()
        .name("market-http".into())
        .spawn(move || {
            runtime.block_on(async move {
                let listener = match tokio::net::TcpListener::from_std(listener) {
                    Ok(listener) => listener,
                    Err(e) => return log(&format!("market data: cannot serve: {e}")),
                };
                let app = router(hub.clone());
                if let Some(trading) = hub.trading.clone() {
                    // Listen keys whose hour is up end, and their streams
                    // are told (`listenKeyExpired`).
                    let hub = hub.clone();
                    tokio::spawn(async move {
                        let mut every = tokio::time::interval(Duration::from_secs(1));
                        loop {
                            every.tick().await;
                            for key in trading.streams.expire_due() {
                                super::userstream::expired(&hub, &key);
                            }
                        }
                    });
                }
                accept_loop(listener, app, &hub, stopping).await;
            });
        })
        .map_err(ServeError::io("starting the market-data thread"))?;
    Ok(Running { address, stop, thread })
}

tokio::task_local! {
    /// The address of the client a connection's task serves: set for each
    /// HTTP connection's task, and again for a WebSocket's after its
    /// upgrade. Request weight is counted by API key and this address.
    static PEER: std::net::IpAddr;
}

tokio::task_local! {
    /// The request weight the key of the request being served has used
    /// this minute, once it has been counted: every answer says it in
    /// `X-MBX-USED-WEIGHT-1M`, a refusal included, as Binance's do.
    static WEIGHT: std::cell::Cell<Option<u32>>;
}

/// Notes the weight the request's key has used (see [`WEIGHT`]), for the
/// [`weighed`] request under way.
pub(crate) fn note_weight(used: u32) {
    let _ = WEIGHT.try_with(|weight| weight.set(Some(used)));
}

/// [`weighed`] for work that does not wait.
pub(crate) fn weighed_now<T>(work: impl FnOnce() -> T) -> (T, Option<u32>) {
    WEIGHT.sync_scope(std::cell::Cell::new(None), || {
        let output = work();
        (output, WEIGHT.with(std::cell::Cell::get))
    })
}

/// Runs one request's `work`, and says the weight its key had used once
/// it was counted (`None`: not counted, the key unknown, say).
pub(crate) async fn weighed<F: std::future::Future>(work: F) -> (F::Output, Option<u32>) {
    WEIGHT
        .scope(std::cell::Cell::new(None), async {
            let output = work.await;
            (output, WEIGHT.with(std::cell::Cell::get))
        })
        .await
}

/// The address of the client whose request is being served (`None`
/// outside a connection's task).
pub(crate) fn peer() -> Option<std::net::IpAddr> {
    PEER.try_with(|peer| *peer).ok()
}

/// `work` with [`peer`] saying `peer` (as it did where it was made).
pub(crate) async fn with_peer<F: std::future::Future>(peer: Option<std::net::IpAddr>, work: F) -> F::Output {
    match peer {
        Some(peer) => PEER.scope(peer, work).await,
        None => work.await,
    }
}

/// Accepts HTTP connections and serves each with the router, until told
/// to stop: then accepts no more, closes every WebSocket with a reason,
/// lets the requests under way finish, and returns once every connection
/// is done or `STOP_GRACE` is up.
///
/// `axum::serve` would do the serving, but bounds neither the connections
/// nor the time a client takes to send a request's header: here at most
/// `max_http_connections` are served at once (one more is closed as soon
/// as it is accepted), and hyper closes a connection that has not sent a
/// whole header `header_timeout_s` after it opened or after its last
/// answer. A connection upgraded to WebSocket leaves the count (the
/// upgrade's own limits hold it: `max_connections`, pings).
async fn accept_loop(listener: tokio::net::TcpListener, app: Router, hub: &Arc<Hub>, mut stopping: tokio::sync::watch::Receiver<bool>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let open = Arc::new(AtomicUsize::new(0));
    let timeout = Duration::from_secs(hub.config.header_timeout_s);
    let mut refused = 0u64;
    let per_address = PerAddress::new(hub.config.max_http_connections_per_address);
    let mut refused_per_address = 0u64;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = async { let _ = stopping.wait_for(|stop| *stop).await; } => break,
        };
        let (tcp, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors, most likely: the connections open
                // go on; accepting is tried again in a moment.
                log(&format!("market data: cannot accept a connection: {e}"));
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        if open.load(Ordering::Acquire) >= hub.config.max_http_connections {
            refused += 1;
            if refused.is_power_of_two() {
                log(&format!("market data: {refused} HTTP connections closed at once so far: {} open already (market_data.max_http_connections)", hub.config.max_http_connections));
            }
            drop(tcp);
            continue;
        }
        let Some(address_slot) = per_address.take(peer.ip()) else {
            refused_per_address += 1;
            if refused_per_address.is_power_of_two() {
                log(&format!(
                    "market data: {refused_per_address} HTTP connections closed at once so far: {} open already from {} (market_data.max_http_connections_per_address)",
                    per_address.most,
                    peer.ip()
                ));
            }
            drop(tcp);
            continue;
        };
        // No Nagle: a small answer or message goes out at once, not when
        // the client's next segment acknowledges the last one (a
        // pipelining client waited a whole request interval).
        let _ = tcp.set_nodelay(true);
        // A client that sends requests and never reads the answers (or a
        // WebSocket's messages) fills its socket: not waited on past three
        // ping intervals (and a second, so that a WebSocket's own limit,
        // with its Close, comes first).
        let tcp = Patient::new(tcp, Duration::from_secs(3 * hub.config.ping_interval_s.max(1) + 1), peer.ip());
        open.fetch_add(1, Ordering::AcqRel);
        let counted = Counted(open.clone());
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let mut stop = stopping.clone();
        tokio::spawn(PEER.scope(peer.ip(), async move {
            let _counted = (counted, address_slot);
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(timeout);
            let connection = builder.serve_connection(hyper_util::rt::TokioIo::new(tcp), service).with_upgrades();
            let mut connection = std::pin::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                () = async { let _ = stop.wait_for(|stop| *stop).await; } => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
        }));
    }
    ws::close_all(hub);
    let deadline = tokio::time::Instant::now() + STOP_GRACE;
    while (open.load(Ordering::Acquire) > 0 || hub.connections.load(Ordering::Acquire) > 0) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A connection's socket whose writes wait `patience` at most: past it a
/// write fails (`TimedOut`, logged), and the connection ends with it.
struct Patient<T> {
    inner: T,
    patience: Duration,
    peer: std::net::IpAddr,
    /// Since the write now waiting began to wait.
    waiting: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl<T> Patient<T> {
    fn new(inner: T, patience: Duration, peer: std::net::IpAddr) -> Patient<T> {
        Patient { inner, patience, peer, waiting: None }
    }

    /// The inner socket's answer to a write, with the deadline.
    fn deadline<R>(&mut self, cx: &mut std::task::Context<'_>, polled: std::task::Poll<std::io::Result<R>>) -> std::task::Poll<std::io::Result<R>> {
        use std::future::Future;
        use std::task::Poll;
        if polled.is_ready() {
            self.waiting = None;
            return polled;
        }
        let patience = self.patience;
        let sleep = self.waiting.get_or_insert_with(|| Box::pin(tokio::time::sleep(patience)));
        match sleep.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(()) => {
                log(&format!("market data: HTTP connection from {} closed: not reading (a write waited {} s)", self.peer, patience.as_secs()));
                Poll::Ready(Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the client does not read")))
            }
        }
    }
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Patient<T> {
    fn poll_read(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>, buf: &mut tokio::io::ReadBuf<'_>) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Patient<T> {
    fn poll_write(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>, buf: &[u8]) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        self.deadline(cx, polled)
    }

    fn poll_write_vectored(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>, bufs: &[std::io::IoSlice<'_>]) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.deadline(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_flush(cx);
        self.deadline(cx, polled)
    }

    fn poll_shutdown(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Connections open from each client address, at most `most` each: one
/// client cannot take every connection the server allows.
pub(crate) struct PerAddress {
    open: std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>,
    pub(crate) most: usize,
}

impl PerAddress {
    pub(crate) fn new(most: usize) -> Arc<PerAddress> {
        Arc::new(PerAddress { open: std::sync::Mutex::new(std::collections::HashMap::new()), most })
    }

    /// One more connection from `address`, unless it has `most` open.
    pub(crate) fn take(self: &Arc<PerAddress>, address: std::net::IpAddr) -> Option<AddressSlot> {
        let address = client_of(address);
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let count = open.entry(address).or_insert(0);
        if *count >= self.most {
            return None;
        }
        *count += 1;
        Some(AddressSlot { of: self.clone(), address })
    }
}

/// The client an address counts for: an IPv4 address itself (also
/// written as IPv6), an IPv6 one by its /64, which a host usually has
/// whole (it could otherwise take a place per address).
fn client_of(address: std::net::IpAddr) -> std::net::IpAddr {
    match address {
        std::net::IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => std::net::IpAddr::V4(v4),
            None => std::net::IpAddr::V6(std::net::Ipv6Addr::from(u128::from(v6) & !u128::from(u64::MAX))),
        },
        v4 => v4,
    }
}

/// One connection counted against its address, given back when dropped.
pub(crate) struct AddressSlot {
    of: Arc<PerAddress>,
    address: std::net::IpAddr,
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut open = self.of.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = open.get_mut(&self.address) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.address);
            }
        }
    }
}

/// One of the HTTP connections counted against `max_http_connections`,
/// given back when its task ends.
struct Counted(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_ipv6_client_counts_by_its_64_and_a_mapped_ipv4_one_as_ipv4() {
        let per = super::PerAddress::new(2);
        let ip = |text: &str| text.parse::<std::net::IpAddr>().expect("address");
        let held: Vec<_> = ["2001:db8::1", "2001:db8::ffff:2"].iter().map(|a| per.take(ip(a)).expect("within the /64's share")).collect();
        assert!(per.take(ip("2001:db8::3")).is_none(), "a third from the same /64");
        assert!(per.take(ip("2001:db8:0:1::1")).is_some(), "another /64");
        let v4: Vec<_> = (0..2).map(|_| per.take(ip("127.0.0.9")).expect("an IPv4 client")).collect();
        assert!(per.take(ip("::ffff:127.0.0.9")).is_none(), "the same client written as IPv6");
        drop((held, v4));
        assert!(per.take(ip("2001:db8::3")).is_some(), "places given back");
    }

    #[test]
    fn a_zero_offset_is_utc_however_written() {
        for zone in ["0", "+0", "-0", "00", "0:00", "00:00", "+00:00", "-00:00", " 00:00", " 0", "UTC", "utc"] {
            assert!(super::is_utc(zone), "{zone}");
        }
        for zone in ["", "+", " ", "  0", "+ 0", "1", "-1:00", "0:0", "0:000", "000", "00:30", "GMT", "0:00:00"] {
            assert!(!super::is_utc(zone), "{zone}");
        }
    }
}
