//! Market data in Binance's spot shapes: the REST answers and the
//! WebSocket payloads (`docs/marketdata.md` lists every field). Prices and
//! quantities are decimal strings: ticks times the instrument's price unit,
//! lots times its quantity unit, with exactly the unit's decimals.

use crate::accounts::{AccountTrade, OrderRecord, OrderStatus};
use crate::candles::{Candle, INTERVALS, close_of};
use crate::{DepthDiff, InstrumentData, MarketData, Ticker, Trade, Unit};
use serde_json::{Value, json};

/// `value` units of `unit` as a decimal string with `unit.scale` decimals.
pub fn decimal(value: i128, unit: Unit) -> String {
    let scaled = value * i128::from(unit.mantissa);
    let negative = scaled < 0;
    let digits = scaled.unsigned_abs().to_string();
    let scale = unit.scale as usize;
    let text = if scale == 0 {
        digits
    } else if digits.len() > scale {
        format!("{}.{}", &digits[..digits.len() - scale], &digits[digits.len() - scale..])
    } else {
        format!("0.{}{}", "0".repeat(scale - digits.len()), digits)
    };
    if negative { format!("-{text}") } else { text }
}

/// The unit of a price times a quantity.
pub fn quote_unit(info: &crate::InstrumentInfo) -> Unit {
    Unit { mantissa: info.price_unit.mantissa * info.qty_unit.mantissa, scale: info.price_unit.scale + info.qty_unit.scale }
}

fn price(data: &InstrumentData, ticks: i64) -> String {
    decimal(i128::from(ticks), data.info.price_unit)
}

fn qty(data: &InstrumentData, lots: u64) -> String {
    decimal(i128::from(lots), data.info.qty_unit)
}

fn quote(data: &InstrumentData, amount: u128) -> String {
    decimal(amount as i128, quote_unit(&data.info))
}

fn levels(data: &InstrumentData, levels: &[(i64, u64)]) -> Value {
    Value::Array(levels.iter().map(|(p, q)| json!([price(data, *p), qty(data, *q)])).collect())
}

/// `GET /api/v3/exchangeInfo`.
pub fn exchange_info(market: &MarketData, server_time_ms: u64, rate_limits: Value) -> Value {
    let symbols: Vec<Value> = market
        .instruments
        .iter()
        .map(|data| {
            let info = &data.info;
            json!({
                "symbol": info.binance,
                "status": if data.halted { "HALT" } else { "TRADING" },
                "baseAsset": info.base_asset,
                "baseAssetPrecision": info.qty_unit.scale,
                "quoteAsset": info.quote_asset,
                "quotePrecision": info.price_unit.scale,
                "quoteAssetPrecision": info.price_unit.scale,
                "baseCommissionPrecision": info.qty_unit.scale,
                "quoteCommissionPrecision": quote_unit(info).scale,
                "orderTypes": ["LIMIT", "LIMIT_MAKER", "MARKET"],
                "icebergAllowed": false,
                "ocoAllowed": false,
                "otoAllowed": false,
                "quoteOrderQtyMarketAllowed": true,
                "allowTrailingStop": false,
                "cancelReplaceAllowed": true,
                "allowAmend": true,
                "isSpotTradingAllowed": true,
                "isMarginTradingAllowed": false,
                "filters": [
                    {"filterType": "PRICE_FILTER", "minPrice": price(data, info.min_price), "maxPrice": price(data, info.max_price), "tickSize": decimal(1, info.price_unit)},
                    {"filterType": "LOT_SIZE", "minQty": qty(data, info.min_qty), "maxQty": qty(data, info.max_qty), "stepSize": decimal(1, info.qty_unit)},
                    {"filterType": "NOTIONAL", "minNotional": decimal(0, quote_unit(info)), "applyMinToMarket": false, "maxNotional": quote(data, info.max_price as u128 * u128::from(info.max_qty)), "applyMaxToMarket": false, "avgPriceMins": 0}
                ],
                "permissions": [],
                "permissionSets": [["SPOT"]],
                "defaultSelfTradePreventionMode": "NONE",
                "allowedSelfTradePreventionModes": ["NONE", "EXPIRE_TAKER", "EXPIRE_MAKER", "EXPIRE_BOTH"],
                "crossbookSymbol": info.symbol,
                "crossbookId": info.id,
                "crossbook": engine_terms(info),
            })
        })
        .collect();
    json!({"timezone": "UTC", "serverTime": server_time_ms, "rateLimits": rate_limits, "exchangeFilters": [], "symbols": symbols})
}

/// `exchangeInfo`'s `crossbook` object: the instrument as the engine and
/// the binary protocol see it, ids and integers in ticks, lots and asset
/// units (`docs/protocol.md`, "Ids, ticks and lots").
fn engine_terms(info: &crate::InstrumentInfo) -> Value {
    json!({
        "id": info.id,
        "symbol": info.symbol,
        "baseAssetId": info.base,
        "quoteAssetId": info.quote,
        "baseAssetUnit": decimal(1, info.base_asset_unit),
        "quoteAssetUnit": decimal(1, info.quote_asset_unit),
        "priceUnit": decimal(1, info.price_unit),
        "qtyUnit": decimal(1, info.qty_unit),
        "tickSize": info.tick_size,
        "lotSize": info.lot_size,
        "minPrice": info.min_price,
        "maxPrice": info.max_price,
        "minQty": info.min_qty,
        "maxQty": info.max_qty,
        "makerBps": info.maker_bps,
        "takerBps": info.taker_bps,
    })
}

/// `GET /api/v3/depth`: the book after command `market.seq`.
pub fn depth(market: &MarketData, data: &InstrumentData, limit: usize) -> Value {
    let (bids, asks) = data.book.depth(limit);
    json!({"lastUpdateId": market.seq, "bids": levels(data, &bids), "asks": levels(data, &asks)})
}

/// `GET /api/v3/trades`: the last `limit`, oldest first.
pub fn trades(data: &InstrumentData, limit: usize) -> Value {
    let from = data.trades.len().saturating_sub(limit);
    Value::Array(
        data.trades
            .iter()
            .skip(from)
            .map(|t| {
                json!({
                    "id": t.id,
                    "price": price(data, t.price),
                    "qty": qty(data, t.qty),
                    "quoteQty": quote(data, t.price as u128 * u128::from(t.qty)),
                    "time": t.time_ms,
                    "isBuyerMaker": t.buyer_is_maker,
                    "isBestMatch": true,
                })
            })
            .collect(),
    )
}

/// One of `GET /api/v3/aggTrades`: a trade as its own aggregate.
pub fn agg_trade(data: &InstrumentData, t: &Trade) -> Value {
    json!({"a": t.id, "p": price(data, t.price), "q": qty(data, t.qty), "f": t.id, "l": t.id, "T": t.time_ms, "m": t.buyer_is_maker, "M": true})
}

fn close_ms(interval: usize, candle: &Candle) -> u64 {
    close_of(interval, candle.open_ms)
}

/// `GET /api/v3/klines`: one array per candle.
pub fn klines(data: &InstrumentData, interval: usize, start: Option<u64>, end: Option<u64>, limit: usize) -> Value {
    Value::Array(
        data.candles
            .range(interval, start, end, limit)
            .iter()
            .map(|c| {
                json!([
                    c.open_ms,
                    price(data, c.open),
                    price(data, c.high),
                    price(data, c.low),
                    price(data, c.close),
                    qty(data, c.volume),
                    close_ms(interval, c),
                    quote(data, c.quote_volume),
                    c.trades,
                    qty(data, c.taker_buy_volume),
                    quote(data, c.taker_buy_quote_volume),
                    "0"
                ])
            })
            .collect(),
    )
}

fn percent(change: i128, base: i128) -> String {
    if base == 0 {
        return "0.000".into();
    }
    // Thousandths of a percent, rounded half away from zero.
    let (magnitude, base) = (change.abs() * 100_000, base.abs());
    let rounded = magnitude / base + i128::from(magnitude % base * 2 >= base);
    decimal(if change < 0 { -rounded } else { rounded }, Unit { mantissa: 1, scale: 3 })
}

fn weighted_average(data: &InstrumentData, ticker: &Ticker) -> String {
    if ticker.volume == 0 {
        return average(data, 0);
    }
    average(data, ticker.quote_volume as i128 * 10i128.pow(AVERAGE_DECIMALS) / i128::from(ticker.volume))
}

/// Decimals an average price has beyond the price unit's: an average is
/// not on the tick grid.
const AVERAGE_DECIMALS: u32 = 4;

/// An average price in ticks times 10^AVERAGE_DECIMALS, as text.
fn average(data: &InstrumentData, scaled_ticks: i128) -> String {
    decimal(scaled_ticks, Unit { mantissa: data.info.price_unit.mantissa, scale: data.info.price_unit.scale + AVERAGE_DECIMALS })
}

/// `GET /api/v3/avgPrice`: the volume-weighted average price of the last
/// five minutes' trades (the one-minute candles whose minute ends in
/// them), or with none the last trade's price (zero before the first);
/// `closeTime` is the last trade's time (0 before the first).
pub fn avg_price(market: &MarketData, index: usize) -> Value {
    let data = &market.instruments[index];
    let window = market.rolling(index, 5 * 60_000);
    let scaled = if window.volume > 0 {
        window.quote_volume as i128 * 10i128.pow(AVERAGE_DECIMALS) / i128::from(window.volume)
    } else {
        i128::from(window.last_price) * 10i128.pow(AVERAGE_DECIMALS)
    };
    json!({"mins": 5, "price": average(data, scaled), "closeTime": data.trades.back().map_or(0, |t| t.time_ms)})
}

/// `GET /api/v3/ticker/24hr` for one instrument.
pub fn ticker_24hr(market: &MarketData, index: usize) -> Value {
    let data = &market.instruments[index];
    let ticker = market.ticker(index);
    let (bid, ask) = data.book.top();
    let change = i128::from(ticker.last_price) - i128::from(ticker.open);
    let change = if ticker.trades == 0 { 0 } else { change };
    json!({
        "symbol": data.info.binance,
        "priceChange": decimal(change, data.info.price_unit),
        "priceChangePercent": percent(change, i128::from(ticker.open)),
        "weightedAvgPrice": weighted_average(data, &ticker),
        "prevClosePrice": price(data, ticker.prev_close),
        "lastPrice": price(data, ticker.last_price),
        "lastQty": qty(data, ticker.last_qty),
        "bidPrice": price(data, bid.map_or(0, |b| b.0)),
        "bidQty": qty(data, bid.map_or(0, |b| b.1)),
        "askPrice": price(data, ask.map_or(0, |a| a.0)),
        "askQty": qty(data, ask.map_or(0, |a| a.1)),
        "openPrice": price(data, ticker.open),
        "highPrice": price(data, ticker.high),
        "lowPrice": price(data, ticker.low),
        "volume": qty(data, ticker.volume),
        "quoteVolume": quote(data, ticker.quote_volume),
        "openTime": ticker.open_ms,
        "closeTime": ticker.close_ms,
        "firstId": ticker.first_trade.map_or(-1, |id| id as i64),
        "lastId": ticker.last_trade.map_or(-1, |id| id as i64),
        "count": ticker.trades,
    })
}

/// `GET /api/v3/ticker/price` for one instrument: the last trade's price
/// (the 24 h ticker's `lastPrice`; `"0"` before the first trade).
pub fn price_ticker(data: &InstrumentData) -> Value {
    json!({"symbol": data.info.binance, "price": price(data, data.trades.back().map_or(0, |t| t.price))})
}

/// `GET /api/v3/ticker/bookTicker` for one instrument.
pub fn book_ticker(data: &InstrumentData) -> Value {
    let (bid, ask) = data.book.top();
    json!({
        "symbol": data.info.binance,
        "bidPrice": price(data, bid.map_or(0, |b| b.0)),
        "bidQty": qty(data, bid.map_or(0, |b| b.1)),
        "askPrice": price(data, ask.map_or(0, |a| a.0)),
        "askQty": qty(data, ask.map_or(0, |a| a.1)),
    })
}

/// The `<symbol>@depth` payload.
pub fn depth_update(data: &InstrumentData, diff: &DepthDiff, time_ms: u64) -> Value {
    json!({
        "e": "depthUpdate",
        "E": time_ms,
        "s": data.info.binance,
        "U": diff.first,
        "u": diff.last,
        "b": levels(data, &diff.bids),
        "a": levels(data, &diff.asks),
    })
}

/// The `<symbol>@depth<N>` payload: the best `limit` levels each side.
pub fn partial_depth(market: &MarketData, data: &InstrumentData, limit: usize) -> Value {
    depth(market, data, limit)
}

/// [`depth_update`] written straight to text (the hot path of the feed:
/// no intermediate JSON values).
pub fn depth_update_text(data: &InstrumentData, diff: &DepthDiff, time_ms: u64) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(96 + 24 * (diff.bids.len() + diff.asks.len()));
    let _ = write!(out, r#"{{"e":"depthUpdate","E":{time_ms},"s":"{}","U":{},"u":{},"b":["#, data.info.binance, diff.first, diff.last);
    write_levels(&mut out, data, &diff.bids);
    out.push_str(r#"],"a":["#);
    write_levels(&mut out, data, &diff.asks);
    out.push_str("]}");
    out
}

fn write_levels(out: &mut String, data: &InstrumentData, levels: &[(i64, u64)]) {
    use std::fmt::Write;
    for (index, (p, q)) in levels.iter().enumerate() {
        if index > 0 {
            out.push(',');
        }
        let _ = write!(out, r#"["{}","{}"]"#, price(data, *p), qty(data, *q));
    }
}

/// [`trade`] written straight to text.
pub fn trade_text(data: &InstrumentData, trade: &Trade, time_ms: u64) -> String {
    format!(
        r#"{{"e":"trade","E":{time_ms},"s":"{}","t":{},"p":"{}","q":"{}","T":{},"m":{},"M":true}}"#,
        data.info.binance,
        trade.id,
        price(data, trade.price),
        qty(data, trade.qty),
        trade.time_ms,
        trade.buyer_is_maker
    )
}

/// The `<symbol>@aggTrade` payload: a trade as its own aggregate (as
/// `GET /api/v3/aggTrades` has it), written straight to text.
pub fn agg_trade_text(data: &InstrumentData, trade: &Trade, time_ms: u64) -> String {
    format!(
        r#"{{"e":"aggTrade","E":{time_ms},"s":"{}","a":{},"p":"{}","q":"{}","f":{},"l":{},"T":{},"m":{},"M":true}}"#,
        data.info.binance,
        trade.id,
        price(data, trade.price),
        qty(data, trade.qty),
        trade.id,
        trade.id,
        trade.time_ms,
        trade.buyer_is_maker
    )
}

/// The `<symbol>@trade@100ms` payload (crossbook's own): an interval's
/// `count` trades in one message, the newest of them (`trades`, oldest
/// first) each as its `@trade` payload.
pub fn trades_text(data: &InstrumentData, trades: impl Iterator<Item = Trade>, count: u64, time_ms: u64) -> String {
    let mut out = format!(r#"{{"e":"trades","E":{time_ms},"s":"{}","n":{count},"t":["#, data.info.binance);
    for (index, t) in trades.enumerate() {
        if index > 0 {
            out.push(',');
        }
        out.push_str(&trade_text(data, &t, time_ms));
    }
    out.push_str("]}");
    out
}

/// The `<symbol>@trade` payload.
pub fn trade(data: &InstrumentData, trade: &Trade, time_ms: u64) -> Value {
    json!({
        "e": "trade",
        "E": time_ms,
        "s": data.info.binance,
        "t": trade.id,
        "p": price(data, trade.price),
        "q": qty(data, trade.qty),
        "T": trade.time_ms,
        "m": trade.buyer_is_maker,
        "M": true,
    })
}

/// The `<symbol>@bookTicker` payload.
pub fn book_ticker_update(market: &MarketData, data: &InstrumentData) -> Value {
    let (bid, ask) = data.book.top();
    json!({
        "u": market.seq,
        "s": data.info.binance,
        "b": price(data, bid.map_or(0, |b| b.0)),
        "B": qty(data, bid.map_or(0, |b| b.1)),
        "a": price(data, ask.map_or(0, |a| a.0)),
        "A": qty(data, ask.map_or(0, |a| a.1)),
    })
}

/// The `<symbol>@kline_<interval>` payloads: every candle a trade from
/// `first_trade` on touched (none if 0), and every candle from the one that
/// opened at `from_open_ms` on (the newest of the previous message, sent
/// while it was open), oldest first. A candle is closed (`x`) when a newer
/// one follows it or when `now_ms` is past its end.
pub fn kline_updates(data: &InstrumentData, interval: usize, first_trade: u64, from_open_ms: Option<u64>, time_ms: u64, now_ms: u64) -> Vec<Value> {
    let series = data.candles.series(interval);
    let traded = if first_trade == 0 { 0 } else { series.iter().rev().take_while(|c| c.last_trade >= first_trade).count() };
    let left_open = from_open_ms.map_or(0, |open| series.iter().rev().take_while(|c| c.open_ms >= open).count());
    let from = series.len() - traded.max(left_open);
    series
        .iter()
        .enumerate()
        .skip(from)
        .map(|(position, c)| {
            json!({
                "e": "kline",
                "E": time_ms,
                "s": data.info.binance,
                "k": {
                    "t": c.open_ms,
                    "T": close_ms(interval, c),
                    "s": data.info.binance,
                    "i": INTERVALS[interval].0,
                    "f": c.first_trade,
                    "L": c.last_trade,
                    "o": price(data, c.open),
                    "c": price(data, c.close),
                    "h": price(data, c.high),
                    "l": price(data, c.low),
                    "v": qty(data, c.volume),
                    "n": c.trades,
                    "x": position + 1 < series.len() || close_ms(interval, c) < now_ms,
                    "q": quote(data, c.quote_volume),
                    "V": qty(data, c.taker_buy_volume),
                    "Q": quote(data, c.taker_buy_quote_volume),
                    "B": "0",
                }
            })
        })
        .collect()
}

/// The `<symbol>@ticker` payload.
pub fn ticker_update(market: &MarketData, index: usize, time_ms: u64) -> Value {
    let rest = ticker_24hr(market, index);
    let field = |name: &str| rest.get(name).cloned().unwrap_or(Value::Null);
    json!({
        "e": "24hrTicker",
        "E": time_ms,
        "s": field("symbol"),
        "p": field("priceChange"),
        "P": field("priceChangePercent"),
        "w": field("weightedAvgPrice"),
        "x": field("prevClosePrice"),
        "c": field("lastPrice"),
        "Q": field("lastQty"),
        "b": field("bidPrice"),
        "B": field("bidQty"),
        "a": field("askPrice"),
        "A": field("askQty"),
        "o": field("openPrice"),
        "h": field("highPrice"),
        "l": field("lowPrice"),
        "v": field("volume"),
        "q": field("quoteVolume"),
        "O": field("openTime"),
        "C": field("closeTime"),
        "F": field("firstId"),
        "L": field("lastId"),
        "n": field("count"),
    })
}

/// The `<symbol>@miniTicker` payload: the 24-hour ticker's prices and
/// volumes only.
pub fn mini_ticker_update(market: &MarketData, index: usize, time_ms: u64) -> Value {
    let rest = ticker_24hr(market, index);
    let field = |name: &str| rest.get(name).cloned().unwrap_or(Value::Null);
    json!({
        "e": "24hrMiniTicker",
        "E": time_ms,
        "s": field("symbol"),
        "c": field("lastPrice"),
        "o": field("openPrice"),
        "h": field("highPrice"),
        "l": field("lowPrice"),
        "v": field("volume"),
        "q": field("quoteVolume"),
    })
}

// ---- an account's own orders and trades (the signed endpoints) ----------

fn side_name(side: crossbook_engine::Side) -> &'static str {
    match side {
        crossbook_engine::Side::Buy => "BUY",
        crossbook_engine::Side::Sell => "SELL",
    }
}

fn tif_name(tif: crossbook_engine::TimeInForce) -> &'static str {
    match tif {
        crossbook_engine::TimeInForce::Gtc => "GTC",
        crossbook_engine::TimeInForce::Ioc => "IOC",
        crossbook_engine::TimeInForce::Fok => "FOK",
    }
}

/// Binance's name of a self-trade prevention mode (the taker's decides,
/// as on Binance): `cancel_newest` expires the taker, `cancel_oldest` the
/// maker.
pub fn stp_name(stp: crossbook_engine::SelfTradePrevention) -> &'static str {
    match stp {
        crossbook_engine::SelfTradePrevention::None => "NONE",
        crossbook_engine::SelfTradePrevention::CancelNewest => "EXPIRE_TAKER",
        crossbook_engine::SelfTradePrevention::CancelOldest => "EXPIRE_MAKER",
        crossbook_engine::SelfTradePrevention::CancelBoth => "EXPIRE_BOTH",
    }
}

/// `LIMIT`, `LIMIT_MAKER` (post-only) or `MARKET`.
pub fn order_type_name(o: &OrderRecord) -> &'static str {
    match (o.order_type, o.post_only) {
        (crossbook_engine::OrderType::Market, _) => "MARKET",
        (crossbook_engine::OrderType::Limit, true) => "LIMIT_MAKER",
        (crossbook_engine::OrderType::Limit, false) => "LIMIT",
    }
}

/// An amount of the quote asset (a fee, a budget) as a decimal.
pub fn quote_asset(data: &InstrumentData, amount: i128) -> String {
    decimal(amount, data.info.quote_asset_unit)
}

fn limit_price(data: &InstrumentData, o: &OrderRecord) -> String {
    price(data, if o.order_type == crossbook_engine::OrderType::Market { 0 } else { o.price })
}

/// An order as `GET /api/v3/order`, `openOrders` and `allOrders` show it.
pub fn order(data: &InstrumentData, o: &OrderRecord) -> Value {
    json!({
        "symbol": data.info.binance,
        "orderId": o.id,
        "orderListId": -1,
        "clientOrderId": o.client_id,
        "price": limit_price(data, o),
        "origQty": qty(data, o.qty),
        "executedQty": qty(data, o.filled),
        "cummulativeQuoteQty": quote(data, o.quote_filled),
        "status": o.status.binance(),
        "timeInForce": tif_name(o.tif),
        "type": order_type_name(o),
        "side": side_name(o.side),
        "stopPrice": price(data, 0),
        "icebergQty": qty(data, 0),
        "time": o.time_ms,
        "updateTime": o.update_ms,
        "isWorking": true,
        "workingTime": o.time_ms,
        "origQuoteOrderQty": quote_asset(data, i128::from(o.budget.unwrap_or(0))),
        "selfTradePreventionMode": stp_name(o.stp),
    })
}

/// The answer to `POST /api/v3/order`: `ACK`, `RESULT` or `FULL`
/// (with the fills of the order's own command).
pub fn new_order(data: &InstrumentData, o: &OrderRecord, transact_ms: u64, response: &str, fills: &[AccountTrade]) -> Value {
    let mut answer = json!({
        "symbol": data.info.binance,
        "orderId": o.id,
        "orderListId": -1,
        "clientOrderId": o.client_id,
        "transactTime": transact_ms,
    });
    if response == "ACK" {
        return answer;
    }
    let full = order(data, o);
    for key in ["price", "origQty", "executedQty", "origQuoteOrderQty", "cummulativeQuoteQty", "status", "timeInForce", "type", "side", "workingTime", "selfTradePreventionMode"] {
        answer[key] = full[key].clone();
    }
    if response == "FULL" {
        answer["fills"] = Value::Array(
            fills
                .iter()
                .map(|t| json!({"price": price(data, t.price), "qty": qty(data, t.qty), "commission": quote_asset(data, i128::from(t.fee)), "commissionAsset": data.info.quote_asset, "tradeId": t.id}))
                .collect(),
        );
    }
    answer
}

/// The answer to `DELETE /api/v3/order` (and each of
/// `DELETE /api/v3/openOrders`'s).
pub fn cancelled_order(data: &InstrumentData, o: &OrderRecord, transact_ms: u64) -> Value {
    let full = order(data, o);
    let mut answer = json!({
        "symbol": data.info.binance,
        "origClientOrderId": o.client_id,
        "orderId": o.id,
        "orderListId": -1,
        "clientOrderId": o.client_id,
        "transactTime": transact_ms,
    });
    for key in ["price", "origQty", "executedQty", "origQuoteOrderQty", "cummulativeQuoteQty", "status", "timeInForce", "type", "side", "selfTradePreventionMode"] {
        answer[key] = full[key].clone();
    }
    answer
}

/// The answer to `PUT /api/v3/order/amend/keepPriority`: the order as
/// its amendment left it (`orig_client_id`: its client id before).
pub fn amended_order(data: &InstrumentData, o: &OrderRecord, orig_client_id: &str, transact_ms: u64, execution_id: u64) -> Value {
    let full = order(data, o);
    let mut amended = json!({
        "symbol": data.info.binance,
        "orderId": o.id,
        "orderListId": -1,
        "origClientOrderId": orig_client_id,
        "clientOrderId": o.client_id,
        "price": full["price"],
        "qty": full["origQty"],
        "executedQty": full["executedQty"],
        "preventedQty": qty(data, 0),
        "quoteOrderQty": full["origQuoteOrderQty"],
        "cumulativeQuoteQty": full["cummulativeQuoteQty"],
    });
    for key in ["status", "timeInForce", "type", "side", "workingTime", "selfTradePreventionMode"] {
        amended[key] = full[key].clone();
    }
    json!({"transactTime": transact_ms, "executionId": execution_id, "amendedOrder": amended})
}

/// One of `GET /api/v3/myTrades`.
pub fn my_trade(data: &InstrumentData, t: &AccountTrade) -> Value {
    json!({
        "symbol": data.info.binance,
        "id": t.id,
        "orderId": t.order,
        "orderListId": -1,
        "price": price(data, t.price),
        "qty": qty(data, t.qty),
        "quoteQty": quote(data, t.price.unsigned_abs() as u128 * u128::from(t.qty)),
        "commission": quote_asset(data, i128::from(t.fee)),
        "commissionAsset": data.info.quote_asset,
        "time": t.time_ms,
        "isBuyer": t.is_buyer,
        "isMaker": t.is_maker,
        "isBestMatch": true,
    })
}

/// What one event did to an order, for an `executionReport`.
#[derive(Clone, Copy, Debug)]
pub struct Execution {
    /// `x`: NEW, TRADE, CANCELED, EXPIRED, TRADE_PREVENTION, REPLACED.
    pub kind: &'static str,
    /// `X`: the order's status after it.
    pub status: OrderStatus,
    pub last_qty: u64,
    pub last_price: i64,
    pub fee: i64,
    /// `t`: the trade's id, or -1.
    pub trade_id: i64,
    pub is_maker: bool,
    /// `z` and `Z` after it.
    pub cum_qty: u64,
    pub cum_quote: u128,
    /// `I`: unique per execution (the command's sequence number times
    /// 2^20 plus the report's place among the command's reports).
    pub execution_id: u64,
}

/// A user data stream's `executionReport` for `o` (its price, quantity
/// and identity; `exec` says what changed).
pub fn execution_report(data: &InstrumentData, o: &OrderRecord, exec: &Execution, time_ms: u64) -> Value {
    let on_book = exec.status.is_open() && o.order_type == crossbook_engine::OrderType::Limit && o.tif == crossbook_engine::TimeInForce::Gtc;
    json!({
        "e": "executionReport",
        "E": time_ms,
        "s": data.info.binance,
        "c": o.client_id,
        "S": side_name(o.side),
        "o": order_type_name(o),
        "f": tif_name(o.tif),
        "q": qty(data, o.qty),
        "p": limit_price(data, o),
        "P": price(data, 0),
        "F": qty(data, 0),
        "g": -1,
        "C": "",
        "x": exec.kind,
        "X": exec.status.binance(),
        "r": "NONE",
        "i": o.id,
        "l": qty(data, exec.last_qty),
        "z": qty(data, exec.cum_qty),
        "L": price(data, exec.last_price),
        "n": quote_asset(data, i128::from(exec.fee)),
        "N": if exec.last_qty > 0 { Value::from(data.info.quote_asset.clone()) } else { Value::Null },
        "T": time_ms,
        "t": exec.trade_id,
        "I": exec.execution_id,
        "w": on_book,
        "m": exec.is_maker,
        "M": false,
        "O": o.time_ms,
        "Z": quote(data, exec.cum_quote),
        "Y": quote(data, exec.last_price.unsigned_abs() as u128 * u128::from(exec.last_qty)),
        "Q": quote_asset(data, i128::from(o.budget.unwrap_or(0))),
        "W": o.time_ms,
        "V": stp_name(o.stp),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// BTC-USD in units `price` (ticks, quote) and `qty` (lots).
    fn btc_usd(price: Unit, qty: Unit) -> crate::InstrumentInfo {
        crate::InstrumentInfo {
            id: 1,
            symbol: "BTC-USD".into(),
            binance: "BTCUSD".into(),
            base: 1,
            quote: 2,
            base_asset: "BTC".into(),
            quote_asset: "USD".into(),
            price_unit: price,
            qty_unit: qty,
            min_price: 1,
            max_price: 1_000_000,
            min_qty: 1,
            max_qty: 1_000,
            tick_size: 1,
            lot_size: 1,
            base_asset_unit: qty,
            quote_asset_unit: price,
            maker_bps: -1,
            taker_bps: 5,
        }
    }

    #[test]
    fn the_hot_payloads_written_as_text_are_the_json_ones() {
        let info = btc_usd(Unit { mantissa: 1, scale: 2 }, Unit { mantissa: 5, scale: 3 });
        let market = MarketData::new(vec![info], 0);
        let data = &market.instruments[0];
        let diff = DepthDiff { first: 7, last: 9, bids: vec![(10_050, 3), (10_000, 0)], asks: vec![(10_100, 12)] };
        let text: Value = serde_json::from_str(&depth_update_text(data, &diff, 1_700_000_000_123)).expect("JSON");
        assert_eq!(text, depth_update(data, &diff, 1_700_000_000_123));
        let empty = DepthDiff { first: 1, last: 1, bids: vec![], asks: vec![] };
        assert_eq!(serde_json::from_str::<Value>(&depth_update_text(data, &empty, 5)).expect("JSON"), depth_update(data, &empty, 5));
        for buyer_is_maker in [true, false] {
            let t = Trade { id: 42, price: 10_075, qty: 7, time_ms: 1_700_000_000_100, buyer_is_maker, seq: 99 };
            let text: Value = serde_json::from_str(&trade_text(data, &t, 1_700_000_000_123)).expect("JSON");
            assert_eq!(text, trade(data, &t, 1_700_000_000_123));
        }
    }

    #[test]
    fn a_candle_sent_open_is_sent_again_closed() {
        let info = btc_usd(Unit::ONE, Unit::ONE);
        let mut market = MarketData::new(vec![info], 0);
        let minute = 60_000 * 29_000_000;
        market.instruments[0].candles.add(minute + 5_000, 100, 2, true, 1);
        let one_minute = 0;
        let opened_at = |updates: &[Value]| updates.iter().map(|u| (u["k"]["t"].as_u64().expect("t"), u["k"]["x"] == true)).collect::<Vec<_>>();
        // Sent while its minute lasts: open.
        let first = kline_updates(&market.instruments[0], one_minute, 1, None, minute + 5_000, minute + 5_001);
        assert_eq!(opened_at(&first), [(minute, false)]);
        // Its minute over, nothing traded: the same candle, closed.
        let closing = kline_updates(&market.instruments[0], one_minute, 0, Some(minute), minute + 5_000, minute + 60_000);
        assert_eq!(opened_at(&closing), [(minute, true)]);
        assert_eq!(closing[0]["k"]["n"], 1);
        // Nothing owed and nothing left open: nothing.
        assert!(kline_updates(&market.instruments[0], one_minute, 0, None, minute + 5_000, minute + 60_000).is_empty());
        // A trade in the next minute: the next message has both, the
        // first closed (it was left open), though the trade did not touch it.
        market.instruments[0].candles.add(minute + 61_000, 101, 1, false, 2);
        let next = kline_updates(&market.instruments[0], one_minute, 2, Some(minute), minute + 61_000, minute + 61_001);
        assert_eq!(opened_at(&next), [(minute, true), (minute + 60_000, false)]);
    }

    #[test]
    fn decimals_have_the_units_digits() {
        let cents = Unit { mantissa: 1, scale: 2 };
        assert_eq!(decimal(12345, cents), "123.45");
        assert_eq!(decimal(5, cents), "0.05");
        assert_eq!(decimal(0, cents), "0.00");
        assert_eq!(decimal(-5, cents), "-0.05");
        assert_eq!(decimal(7, Unit::ONE), "7");
        assert_eq!(decimal(3, Unit { mantissa: 5, scale: 1 }), "1.5");
        assert_eq!(percent(5, 100), "5.000");
        assert_eq!(percent(-1, 3), "-33.333");
        assert_eq!(percent(2, 3), "66.667");
        assert_eq!(percent(-2, 3), "-66.667");
    }
}
