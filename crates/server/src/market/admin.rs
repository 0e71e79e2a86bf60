//! The operator's endpoints on the market-data port (`docs/trading.md`,
//! "The operator's endpoints"): money into and out of accounts while the
//! venue runs, a transfer looked up by its reference, an account's
//! balances, and trading on an instrument halted and resumed. Off unless `[market_data] admin_token` is set; every request
//! carries it as `Authorization: Bearer <token>`.
//!
//! A deposit or a withdrawal is a command like an order: journaled with
//! the operator's reference in the REST gateway's annex, answered once
//! durable. A reference moves money once: while the transfer that used it
//! is remembered (market data keeps the last
//! [`crossbook_marketdata::transfers::TRANSFERS_KEPT`], in its checkpoint),
//! a second request with it is answered with that transfer and does
//! nothing, so a request whose answer was lost can be sent again.

use super::Hub;
use super::http::{ApiError, Params, json_response};
use super::trading::{Body, Outcome, Reply, RestAnnex, Trading, body_text, follower};
use crate::sequencer::Request;
use crate::sink::{Query, QueryKind};
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use crossbook_engine::{Command, RejectReason};
use crossbook_fix::decimal::Decimal;
use crossbook_marketdata::render;
use crossbook_marketdata::transfers::{Direction, Transfer};
use serde_json::{Value, json};
use std::sync::Arc;

/// Where the endpoints are.
pub(crate) const PATH: &str = "/crossbook/admin/v1";

/// Longest reference, and the characters it may have (Binance's client
/// order ids': it is journaled in the same annex field).
const MAX_REFERENCE: usize = super::trading::MAX_CLIENT_ID;

/// The trading side, once the request has shown the operator's token.
fn authorized<'a>(hub: &'a Hub, headers: &HeaderMap) -> Result<&'a Trading, ApiError> {
    let token = hub.config.admin_token.as_bytes();
    if token.is_empty() {
        return Err(ApiError::new(StatusCode::NOT_FOUND, -1000, "The operator endpoints are off on this venue ([market_data] admin_token is empty)."));
    }
    let trading = hub.trading.as_deref().ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, -1000, "The operator endpoints need the trading API ([market_data] trading = true)."))?;
    // `Bearer <token>`, the scheme in any case (RFC 7235).
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.as_bytes());
    // Compared in time that does not depend on where they differ.
    let matches = given.is_some_and(|given| given.len() == token.len() && given.iter().zip(token).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0);
    if !matches {
        return Err(ApiError::new(StatusCode::UNAUTHORIZED, -2015, "Invalid admin token: send Authorization: Bearer <market_data.admin_token>."));
    }
    Ok(trading)
}

fn account_param(params: &Params) -> Result<u64, ApiError> {
    // Mandatory: missing or empty is -1102, as for every mandatory one.
    params.get("account").ok_or_else(|| ApiError::mandatory("account"))?;
    params.number("account", 0..=u64::MAX)?.ok_or_else(|| ApiError::mandatory("account"))
}

fn reference_param(params: &Params) -> Result<String, ApiError> {
    let reference = params.get("reference").filter(|r| !r.is_empty()).ok_or_else(|| ApiError::mandatory("reference"))?;
    if reference.len() > MAX_REFERENCE || !reference.bytes().all(|b| b.is_ascii_alphanumeric() || b".:/_-".contains(&b)) {
        return Err(ApiError::illegal("reference", "^[\\.A-Z\\:/a-z0-9_-]{1,36}$"));
    }
    Ok(reference.to_string())
}

/// A transfer as the endpoints show it.
fn transfer_json(trading: &Trading, reference: &str, t: &Transfer) -> Value {
    let asset = trading.asset(t.asset);
    json!({
        "reference": reference,
        "direction": match t.direction {
            Direction::Deposit => "DEPOSIT",
            Direction::Withdrawal => "WITHDRAWAL",
        },
        "account": t.account,
        "asset": asset.as_ref().map_or_else(|| t.asset.to_string(), |a| a.name.clone()),
        "amount": asset.map_or_else(|| t.amount.to_string(), |a| render::decimal(i128::from(t.amount), a.unit)),
        "seq": t.seq,
        "time": t.time_ms,
        "status": if t.refused.is_some() { "REFUSED" } else { "DONE" },
        "reason": t.refused.map(RejectReason::name),
    })
}

/// The engine's refusal of a transfer, with the transfer.
fn refusal(direction: Direction, reason: RejectReason, data: Value) -> ApiError {
    let what = match direction {
        Direction::Deposit => "Deposit",
        Direction::Withdrawal => "Withdrawal",
    };
    let mut error = match reason {
        RejectReason::InsufficientFunds => ApiError::bad(-2010, "Account has insufficient balance for requested action."),
        other => ApiError::bad(-2010, format!("{what} refused: {}.", other.name())),
    };
    error.data = Some(Box::new(data));
    error
}

/// `POST /crossbook/admin/v1/deposit`.
pub(crate) async fn deposit(State(hub): State<Arc<Hub>>, headers: HeaderMap, RawQuery(query): RawQuery, body: Body) -> Reply {
    transfer(&hub, &headers, query.as_deref(), body, Direction::Deposit).await
}

/// `POST /crossbook/admin/v1/withdraw`.
pub(crate) async fn withdraw(State(hub): State<Arc<Hub>>, headers: HeaderMap, RawQuery(query): RawQuery, body: Body) -> Reply {
    transfer(&hub, &headers, query.as_deref(), body, Direction::Withdrawal).await
}

async fn transfer(hub: &Hub, headers: &HeaderMap, query: Option<&str>, body: Body, direction: Direction) -> Reply {
    let trading = authorized(hub, headers)?;
    let path = match direction {
        Direction::Deposit => "deposit",
        Direction::Withdrawal => "withdraw",
    };
    follower(hub, &format!("{PATH}/{path}"), query)?;
    let body = body_text(body, hub)?;
    let params = Params::parse_both(query, Some(&body), &["account", "asset", "amount", "reference"])?;
    let account = account_param(&params)?;
    let name = params.get("asset").ok_or_else(|| ApiError::mandatory("asset"))?;
    let Some(asset) = trading.asset_named(name) else {
        return Err(ApiError::illegal("asset", &trading.asset_names().join(", ")));
    };
    let text = params.get("amount").ok_or_else(|| ApiError::mandatory("amount"))?;
    let unit = Decimal { mantissa: i128::from(asset.unit.mantissa), scale: asset.unit.scale };
    let amount = Decimal::parse(text.as_bytes())
        .filter(|d| d.mantissa > 0)
        .and_then(|d| d.whole_units(unit))
        .and_then(|units| u64::try_from(units).ok())
        .ok_or_else(|| ApiError::bad(-1100, format!("Illegal characters found in parameter 'amount'; legal range is a positive number of whole {} units ({} decimals).", asset.name, asset.unit.scale)))?;
    let reference = reference_param(&params)?;
    {
        let market = hub.read();
        if let Err(used) = trading.reserve_reference(&market, &reference) {
            let mut error = ApiError::new(StatusCode::CONFLICT, -2030, format!("Reference {reference} was already used: nothing done (data: what it did)."));
            error.data = used.map(|t| Box::new(transfer_json(trading, &reference, &t)));
            if error.data.is_none() {
                error.msg = format!("Reference {reference} is in use by a transfer not answered yet: nothing done; look it up by its reference.");
            }
            return Err(error);
        }
    }
    let command = match direction {
        Direction::Deposit => Command::Deposit { account, asset: asset.id, amount },
        Direction::Withdrawal => Command::Withdraw { account, asset: asset.id, amount },
    };
    let annex = RestAnnex { request: trading.request_number(), client_id: reference.clone() };
    let outcome = match trading.ask(Request::Command(command), Some(annex), None).await {
        Ok(outcome) => outcome,
        Err(e) => {
            // Queued or not: only a refusal at the queue left nothing to
            // free the reference later.
            if e.code == -1008 {
                trading.release_reference(&reference);
            }
            return Err(e);
        }
    };
    let Outcome::Applied { seq, time_ms, reject, .. } = outcome else {
        return Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, -1000, "Unexpected answer."));
    };
    let done = Transfer { seq, time_ms, account, asset: asset.id, amount, direction, refused: reject };
    let answer = transfer_json(trading, &reference, &done);
    match reject {
        Some(reason) => Err(refusal(direction, reason, answer)),
        None => Ok(json_response(answer)),
    }
}

/// `GET /crossbook/admin/v1/transfer`: a transfer by its reference.
pub(crate) async fn transfer_by_reference(State(hub): State<Arc<Hub>>, headers: HeaderMap, RawQuery(query): RawQuery, body: Body) -> Reply {
    let trading = authorized(&hub, &headers)?;
    let body = body_text(body, &hub)?;
    let params = Params::parse_both(query.as_deref(), Some(&body), &["reference"])?;
    let reference = reference_param(&params)?;
    let market = hub.read();
    match market.transfers.get(&reference) {
        Some(t) => Ok(json_response(transfer_json(trading, &reference, t))),
        None => Err(ApiError::new(StatusCode::NOT_FOUND, -2013, format!("No transfer with reference {reference} (none was made, or it is older than the transfers kept)."))),
    }
}

/// `GET /crossbook/admin/v1/balances`: an account's balances, from the
/// engine (answered in sequence, as `GET /api/v3/account`'s).
pub(crate) async fn balances(State(hub): State<Arc<Hub>>, headers: HeaderMap, RawQuery(query): RawQuery, body: Body) -> Reply {
    let trading = authorized(&hub, &headers)?;
    let body = body_text(body, &hub)?;
    let params = Params::parse_both(query.as_deref(), Some(&body), &["account"])?;
    let account = account_param(&params)?;
    let query = Query { account, kind: QueryKind::Balances, token: 0, request: 0 };
    let Outcome::Answered(answered) = trading.ask(Request::Query(query), None, None).await? else {
        return Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, -1000, "Unexpected answer."));
    };
    if !answered.known {
        return Err(ApiError::new(StatusCode::NOT_FOUND, -2010, format!("Unknown account {account}.")));
    }
    let balances = trading.balances_json(answered.balances.iter());
    Ok(json_response(json!({"account": account, "seq": answered.seq, "balances": balances})))
}

/// `POST /crossbook/admin/v1/halt`: trading on an instrument stops (new
/// orders and replaces are refused; resting orders stay, and may be
/// cancelled or amended down).
pub(crate) async fn halt(State(hub): State<Arc<Hub>>, headers: HeaderMap, RawQuery(query): RawQuery, body: Body) -> Reply {
    trading_status(&hub, &headers, query.as_deref(), body, true).await
}

/// `POST /crossbook/admin/v1/resume`: trading on a halted instrument goes on.
pub(crate) async fn resume(State(hub): State<Arc<Hub>>, headers: HeaderMap, RawQuery(query): RawQuery, body: Body) -> Reply {
    trading_status(&hub, &headers, query.as_deref(), body, false).await
}

/// The engine's `halt` or `resume`, journaled (and replicated) like any
/// command, answered once durable.
async fn trading_status(hub: &Hub, headers: &HeaderMap, query: Option<&str>, body: Body, halt: bool) -> Reply {
    let trading = authorized(hub, headers)?;
    let (verb, path) = if halt { ("Halt", "halt") } else { ("Resume", "resume") };
    follower(hub, &format!("{PATH}/{path}"), query)?;
    let body = body_text(body, hub)?;
    let params = Params::parse_both(query, Some(&body), &["symbol"])?;
    let (instrument, symbol) = {
        let market = hub.read();
        let index = params.instrument(&market)?;
        (market.instruments[index].info.id, market.instruments[index].info.binance.clone())
    };
    let command = if halt { Command::Halt { instrument } } else { Command::Resume { instrument } };
    let annex = RestAnnex { request: trading.request_number(), client_id: String::new() };
    let Outcome::Applied { seq, time_ms, reject, .. } = trading.ask(Request::Command(command), Some(annex), None).await? else {
        return Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, -1000, "Unexpected answer."));
    };
    // Refused only when it is so already: the status is what was asked.
    let answer = json!({"symbol": symbol, "status": if halt { "HALT" } else { "TRADING" }, "seq": seq, "time": time_ms});
    match reject {
        Some(reason) => {
            let mut error = ApiError::bad(-2010, format!("{verb} refused: {}.", reason.name()));
            error.data = Some(Box::new(answer));
            Err(error)
        }
        None => Ok(json_response(answer)),
    }
}
