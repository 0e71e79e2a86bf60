//! User data streams (`docs/trading.md`): a listen key per account
//! (`POST /api/v3/userDataStream`, an hour at a time), and on
//! `/ws/<listenKey>` (or as a stream of `/stream`) that account's
//! `executionReport`s and `outboundAccountPosition`s, and nobody else's.
//!
//! Execution reports are made on the market-data thread from each durable
//! command's events, right after the command is applied to the accounts'
//! records. Balances come from the engine: after a batch that touched a
//! streamed account, the thread asks the sequencer for its balances (one
//! question in flight per account) and sends the assets the events
//! touched once the answer comes (it reflects every command up to its
//! sequence number; assets touched later are asked again).

use super::trading::Trading;
use super::{FeedCommand, Hub};
use crate::now_ms;
use crate::sequencer::Request;
use crate::sink::{Answer, Query, QueryKind};
use crossbook_engine::{AccountId, AssetId, CancelReason, EventKind, OrderId, RejectReason};
use crossbook_marketdata::MarketData;
use crossbook_marketdata::accounts::OrderStatus;
use crossbook_marketdata::render::{self, Execution};
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The token of the balance queries the user data streams ask (a REST
/// request's token is its number, never this).
pub(crate) const USER_STREAM_TOKEN: u64 = u64::MAX;
/// A listen key lives this long after its creation or last keep-alive.
pub(crate) const KEY_LIFETIME: Duration = Duration::from_secs(60 * 60);

struct Key {
    account: AccountId,
    expires: Instant,
}

/// A streamed account's balances to send: each asset touched, with the
/// last command that touched it, and whether a question is in flight.
#[derive(Default)]
struct Watch {
    touched: BTreeMap<AssetId, u64>,
    asked: bool,
}

#[derive(Default)]
struct State {
    by_key: HashMap<String, Key>,
    by_account: HashMap<AccountId, String>,
    watches: HashMap<AccountId, Watch>,
}

/// The live listen keys.
#[derive(Default)]
pub(crate) struct Streams {
    state: Mutex<State>,
    /// How many keys live (the market-data thread skips its work at 0).
    live: AtomicUsize,
}

fn random_key() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

impl Streams {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The account's key (a new one, or the live one with a new hour).
    pub(crate) fn open(&self, account: AccountId) -> std::io::Result<String> {
        let mut state = self.state();
        if let Some(key) = state.by_account.get(&account).cloned()
            && let Some(live) = state.by_key.get_mut(&key)
        {
            live.expires = Instant::now() + KEY_LIFETIME;
            return Ok(key);
        }
        let key = random_key()?;
        state.by_key.insert(key.clone(), Key { account, expires: Instant::now() + KEY_LIFETIME });
        state.by_account.insert(account, key.clone());
        state.watches.insert(account, Watch::default());
        self.live.store(state.by_key.len(), Ordering::Release);
        Ok(key)
    }

    /// Another hour for the account's `key`; `false` if it has no such key.
    pub(crate) fn keep(&self, account: AccountId, key: &str) -> bool {
        match self.state().by_key.get_mut(key) {
            Some(live) if live.account == account => {
                live.expires = Instant::now() + KEY_LIFETIME;
                true
            }
            _ => false,
        }
    }

    /// Ends the account's `key`; `false` if it has no such key.
    pub(crate) fn close(&self, account: AccountId, key: &str) -> bool {
        let mut state = self.state();
        if state.by_key.get(key).is_none_or(|k| k.account != account) {
            return false;
        }
        Self::remove(&mut state, key);
        self.live.store(state.by_key.len(), Ordering::Release);
        true
    }

    /// Ends the account's key, if it has one; returns it.
    pub(crate) fn end_account(&self, account: AccountId) -> Option<String> {
        let mut state = self.state();
        let key = state.by_account.get(&account)?.clone();
        Self::remove(&mut state, &key);
        self.live.store(state.by_key.len(), Ordering::Release);
        Some(key)
    }

    fn remove(state: &mut State, key: &str) {
        if let Some(gone) = state.by_key.remove(key) {
            state.by_account.remove(&gone.account);
            state.watches.remove(&gone.account);
        }
    }

    pub(crate) fn is_live(&self, key: &str) -> bool {
        self.live.load(Ordering::Acquire) > 0 && self.state().by_key.get(key).is_some_and(|k| k.expires > Instant::now())
    }

    /// The keys whose hour is up, ended now.
    pub(crate) fn expire_due(&self) -> Vec<String> {
        let mut state = self.state();
        let now = Instant::now();
        let due: Vec<String> = state.by_key.iter().filter(|(_, k)| k.expires <= now).map(|(key, _)| key.clone()).collect();
        for key in &due {
            Self::remove(&mut state, key);
        }
        self.live.store(state.by_key.len(), Ordering::Release);
        due
    }

    fn any(&self) -> bool {
        self.live.load(Ordering::Acquire) > 0
    }

    fn keys_of(&self, accounts: &[AccountId]) -> HashMap<AccountId, String> {
        let state = self.state();
        accounts.iter().filter_map(|a| state.by_account.get(a).map(|k| (*a, k.clone()))).collect()
    }

    fn touch(&self, account: AccountId, assets: [AssetId; 2], seq: u64) {
        if let Some(watch) = self.state().watches.get_mut(&account) {
            for asset in assets {
                watch.touched.insert(asset, seq);
            }
        }
    }
}

/// The accounts a command's events are about.
fn accounts_of(market: &MarketData, command: &FeedCommand) -> Vec<AccountId> {
    let mut accounts = Vec::new();
    for event in command.events {
        match event.kind {
            EventKind::Accepted { account, .. } | EventKind::Cancelled { account, .. } | EventKind::Deposited { account, .. } | EventKind::Withdrawn { account, .. } => accounts.push(account),
            EventKind::Trade { maker_account, taker_account, .. } => accounts.extend([maker_account, taker_account]),
            EventKind::Replaced { order, .. } => accounts.extend(market.accounts.orders.get(&order).map(|o| o.account)),
            EventKind::Rejected { reason: RejectReason::FokCannotFill } => accounts.extend(market.accounts.orders.get(&command.seq).map(|o| o.account)),
            _ => {}
        }
    }
    accounts.sort_unstable();
    accounts.dedup();
    accounts
}

/// The execution reports of one durable command for the streamed
/// accounts it touched, as (listen key, message); `market` is the state
/// right after the command.
pub(crate) fn after_command(trading: &Trading, market: &MarketData, command: &FeedCommand, out: &mut Vec<(String, String)>) {
    if !trading.streams.any() {
        return;
    }
    let keys = trading.streams.keys_of(&accounts_of(market, command));
    if keys.is_empty() {
        return;
    }
    // Each order's filled lots and notional before this command: what it
    // has now less this command's fills.
    let mut running: HashMap<OrderId, (u64, u128)> = HashMap::new();
    for event in command.events {
        if let EventKind::Trade { maker, taker, .. } = event.kind {
            for order in [maker, taker] {
                running.entry(order).or_insert_with(|| market.accounts.orders.get(&order).map_or((0, 0), |o| (o.filled, o.quote_filled)));
            }
        }
    }
    for event in command.events {
        if let EventKind::Trade { maker, taker, price, qty, .. } = event.kind {
            for order in [maker, taker] {
                if let Some(entry) = running.get_mut(&order) {
                    entry.0 -= qty.min(entry.0);
                    entry.1 -= (u128::from(qty) * price.unsigned_abs() as u128).min(entry.1);
                }
            }
        }
    }
    // Execution ids: the command's sequence number, then the report's
    // place among this command's reports.
    let mut made = 0u64;
    let mut report = |order: OrderId, exec: Execution| {
        let Some(record) = market.accounts.orders.get(&order) else { return };
        let Some(key) = keys.get(&record.account) else { return };
        let data = &market.instruments[record.instrument as usize];
        let message = render::execution_report(data, record, &Execution { execution_id: (command.seq << 20) | made, ..exec }, command.time_ms);
        made += 1;
        out.push((key.clone(), message.to_string()));
        trading.streams.touch(record.account, [data.info.base, data.info.quote], command.seq);
    };
    // Each order's last fill in this command: a quote-quantity buy whose
    // budget ran out is FILLED there (its record says so), and its
    // leftover's IOC cancel is not reported.
    let mut last_fill: HashMap<OrderId, usize> = HashMap::new();
    for (index, event) in command.events.iter().enumerate() {
        if let EventKind::Trade { maker, taker, .. } = event.kind {
            last_fill.insert(maker, index);
            last_fill.insert(taker, index);
        }
    }
    let ended_filled = |order: OrderId| market.accounts.orders.get(&order).is_some_and(|o| o.status == OrderStatus::Filled);
    let blank = Execution { kind: "NEW", status: OrderStatus::New, last_qty: 0, last_price: 0, fee: 0, trade_id: -1, is_maker: false, cum_qty: 0, cum_quote: 0, execution_id: 0 };
    let mut trade_ids: HashMap<u32, u64> = HashMap::new();
    let mut balance_updates = Vec::new();
    for (index, event) in command.events.iter().enumerate() {
        match event.kind {
            EventKind::Accepted { order, .. } => report(order, blank),
            EventKind::Rejected { reason: RejectReason::FokCannotFill } => {
                // As Binance: NEW, then EXPIRED.
                report(command.seq, blank);
                report(command.seq, Execution { kind: "EXPIRED", status: OrderStatus::Expired, ..blank });
            }
            EventKind::Trade { instrument, maker, taker, price, qty, maker_fee, taker_fee, maker_remaining, taker_remaining, .. } => {
                // The trade's id: the instrument's next after those this
                // command made before it (market data numbered them so).
                let index_of = market.instruments.iter().position(|d| d.info.id == instrument).map_or(0, |i| i as u32);
                let made: u64 = command.events.iter().filter(|e| matches!(e.kind, EventKind::Trade { instrument: i, .. } if i == instrument)).count() as u64;
                let first = market.instruments.get(index_of as usize).map_or(1, |d| d.next_trade_id - made);
                let nth = trade_ids.entry(instrument).or_insert(0);
                let trade_id = (first + *nth) as i64;
                *nth += 1;
                for (order, fee, remaining, is_maker) in [(maker, maker_fee, maker_remaining, true), (taker, taker_fee, taker_remaining, false)] {
                    let Some(entry) = running.get_mut(&order) else { continue };
                    entry.0 += qty;
                    entry.1 += u128::from(qty) * price.unsigned_abs() as u128;
                    let spent = last_fill.get(&order) == Some(&index) && ended_filled(order);
                    let status = if remaining == 0 || spent { OrderStatus::Filled } else { OrderStatus::PartiallyFilled };
                    let (cum_qty, cum_quote) = *entry;
                    report(order, Execution { kind: "TRADE", status, last_qty: qty, last_price: price, fee, trade_id, is_maker, cum_qty, cum_quote, ..blank });
                }
            }
            EventKind::Cancelled { order, reason, .. } => {
                if reason == CancelReason::Ioc && ended_filled(order) {
                    continue;
                }
                let (kind, status) = match reason {
                    CancelReason::User | CancelReason::CancelAll | CancelReason::Replace => ("CANCELED", OrderStatus::Canceled),
                    CancelReason::Ioc => ("EXPIRED", OrderStatus::Expired),
                    CancelReason::Stp => ("TRADE_PREVENTION", OrderStatus::ExpiredInMatch),
                };
                let (cum_qty, cum_quote) = running.get(&order).copied().unwrap_or_else(|| market.accounts.orders.get(&order).map_or((0, 0), |o| (o.filled, o.quote_filled)));
                report(order, Execution { kind, status, cum_qty, cum_quote, ..blank });
            }
            EventKind::Replaced { order, .. } => {
                let Some(record) = market.accounts.orders.get(&order) else { continue };
                let (cum_qty, cum_quote) = running.get(&order).copied().unwrap_or((record.filled, record.quote_filled));
                let status = if cum_qty == 0 { OrderStatus::New } else { OrderStatus::PartiallyFilled };
                report(order, Execution { kind: "REPLACED", status, cum_qty, cum_quote, ..blank });
            }
            // The operator's deposit or withdrawal: Binance's
            // `balanceUpdate` (the change), then the asset's balance as an
            // `outboundAccountPosition`.
            EventKind::Deposited { account, asset, amount } | EventKind::Withdrawn { account, asset, amount } => {
                let (Some(key), Some(info)) = (keys.get(&account), trading.asset(asset)) else { continue };
                let delta = if matches!(event.kind, EventKind::Deposited { .. }) { i128::from(amount) } else { -i128::from(amount) };
                let message = json!({"e": "balanceUpdate", "E": command.time_ms, "a": info.name, "d": render::decimal(delta, info.unit), "T": command.time_ms});
                balance_updates.push((key.clone(), message.to_string()));
                trading.streams.touch(account, [asset, asset], command.seq);
            }
            _ => {}
        }
    }
    out.extend(balance_updates);
}

/// Sends a batch's execution reports, each to its listen key's stream.
pub(crate) fn send_reports(hub: &Hub, out: Vec<(String, String)>) {
    let mut by_key: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (key, message) in out {
        by_key.entry(key).or_default().push(message);
    }
    for (key, messages) in by_key {
        hub.send_to_stream(&key, messages);
    }
}

/// Asks for the balances of the streamed accounts that batches touched
/// and that have no question in flight.
pub(crate) fn ask_due(trading: &Trading) {
    if !trading.streams.any() {
        return;
    }
    let due: Vec<AccountId> = {
        let mut state = trading.streams.state();
        state
            .watches
            .iter_mut()
            .filter(|(_, w)| !w.asked && !w.touched.is_empty())
            .map(|(a, w)| {
                w.asked = true;
                *a
            })
            .collect()
    };
    for account in due {
        ask_balances(trading, account);
    }
}

fn ask_balances(trading: &Trading, account: AccountId) {
    let query = Query { account, kind: QueryKind::Balances, token: USER_STREAM_TOKEN, request: 0 };
    if !trading.send(Request::Query(query), None)
        && let Some(watch) = trading.streams.state().watches.get_mut(&account)
    {
        // The queue is full: asked again after the next batch.
        watch.asked = false;
    }
}

/// A user stream's balance question answered: the touched assets'
/// balances go out as an `outboundAccountPosition`.
pub(crate) fn balances(hub: &Hub, trading: &Trading, market: &MarketData, answer: &Answer) {
    let account = answer.query.account;
    let (key, assets, again) = {
        let mut state = trading.streams.state();
        let Some(key) = state.by_account.get(&account).cloned() else { return };
        let Some(watch) = state.watches.get_mut(&account) else { return };
        let assets: Vec<AssetId> = watch.touched.keys().copied().collect();
        watch.touched.retain(|_, seq| *seq > answer.seq);
        watch.asked = !watch.touched.is_empty();
        (key, assets, watch.asked)
    };
    let balances: Vec<serde_json::Value> = answer
        .balances
        .iter()
        .filter(|(asset, _, _)| assets.contains(asset))
        .filter_map(|&(asset, available, locked)| {
            let info = trading.asset(asset)?;
            Some(json!({"a": info.name, "f": render::decimal(i128::from(available), info.unit), "l": render::decimal(i128::from(locked), info.unit)}))
        })
        .collect();
    let update_ms = market.accounts.accounts.get(&account).map_or(0, |d| d.update_ms);
    let message = json!({"e": "outboundAccountPosition", "E": now_ms(), "u": update_ms, "B": balances});
    hub.send_to_stream(&key, vec![message.to_string()]);
    if again {
        ask_balances(trading, account);
    }
}

/// A key ended (closed or expired): its subscribers are told, and its
/// stream is gone.
pub(crate) fn expired(hub: &Hub, key: &str) {
    let now = now_ms();
    let message = json!({"e": "listenKeyExpired", "E": now, "listenKey": key});
    let event = json!({"e": "eventStreamTerminated", "E": now});
    hub.send_ending(key, message.to_string(), event.to_string());
    hub.drop_stream(key);
}
