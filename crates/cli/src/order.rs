//! `crossbook order ...`: one order (or cancel, replace, query) by hand over
//! the binary protocol, printing every message the server sends back, one
//! line each (`crossbook_client::binary::describe`).

use anyhow::{Result, anyhow, bail};
use crossbook_client::binary::{Client, describe};
use crossbook_engine::{OrderType, SelfTradePrevention, Side, TimeInForce};
use crossbook_protocol::{ClientMessage, NewOrder, ReportKind, ServerMessage};
use std::time::{Duration, Instant};

/// What to do, once logged in.
pub(crate) enum Action {
    Place(NewOrder),
    Cancel { order: u64 },
    Replace { order: u64, price: i64, qty: u64 },
    CancelAll { instrument: Option<u32> },
    Balances,
    OpenOrders { instrument: Option<u32> },
    /// Print reports as they come for this long (or until Ctrl-C).
    Watch { duration: Option<Duration> },
}

pub(crate) struct Options {
    pub(crate) address: String,
    pub(crate) account: u64,
    pub(crate) key: String,
    /// Replay reports after this one first (`u64::MAX`: none).
    pub(crate) last_seen: u64,
    /// How long to wait for the server's answer.
    pub(crate) timeout: Duration,
    /// After the answer, how long to go on printing what comes (fills of
    /// a resting order, say).
    pub(crate) linger: Duration,
    pub(crate) action: Action,
}

pub(crate) fn parse_side(text: &str) -> Result<Side> {
    match text {
        "buy" => Ok(Side::Buy),
        "sell" => Ok(Side::Sell),
        other => crate::usage!("--side must be buy or sell, not {other:?}"),
    }
}

pub(crate) fn parse_type(text: &str) -> Result<OrderType> {
    match text {
        "limit" => Ok(OrderType::Limit),
        "market" => Ok(OrderType::Market),
        other => crate::usage!("--type must be limit or market, not {other:?}"),
    }
}

pub(crate) fn parse_tif(text: &str) -> Result<TimeInForce> {
    match text {
        "gtc" => Ok(TimeInForce::Gtc),
        "ioc" => Ok(TimeInForce::Ioc),
        "fok" => Ok(TimeInForce::Fok),
        other => crate::usage!("--tif must be gtc, ioc or fok, not {other:?}"),
    }
}

pub(crate) fn parse_stp(text: &str) -> Result<SelfTradePrevention> {
    // The protocol's names (docs/protocol.md) are written with `_`.
    match text {
        "none" => Ok(SelfTradePrevention::None),
        "cancel-newest" | "cancel_newest" => Ok(SelfTradePrevention::CancelNewest),
        "cancel-oldest" | "cancel_oldest" => Ok(SelfTradePrevention::CancelOldest),
        "cancel-both" | "cancel_both" => Ok(SelfTradePrevention::CancelBoth),
        other => crate::usage!("--stp must be none, cancel-newest, cancel-oldest or cancel-both, not {other:?}"),
    }
}

/// A client order id nobody typed: the wall clock in microseconds (below
/// 2^62, where the FIX and REST gateways' own ids begin).
pub(crate) fn fresh_cid() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_micros() as u64)
}

/// Whether `message` is the server's answer to `action` (the last message
/// it owes for it, or the first for an order: its fills in the same batch
/// follow at once and are printed during the linger).
fn answers(action: &Action, message: &ServerMessage, request: u64) -> bool {
    match (action, message) {
        (_, ServerMessage::Error { .. } | ServerMessage::Logout { .. }) => true,
        (Action::Place(order), ServerMessage::ExecutionReport(r)) => r.cid == order.cid && matches!(r.kind, ReportKind::Accepted | ReportKind::Rejected),
        (Action::Cancel { order } | Action::Replace { order, .. }, ServerMessage::ExecutionReport(r)) => {
            r.order == *order && matches!(r.kind, ReportKind::Cancelled | ReportKind::Replaced | ReportKind::Rejected)
        }
        (Action::CancelAll { .. }, ServerMessage::ExecutionReport(r)) => matches!(r.kind, ReportKind::CancelAllDone) || (r.kind == ReportKind::Rejected && r.order == 0),
        (Action::Balances | Action::OpenOrders { .. }, ServerMessage::QueryDone { request: done, .. }) => *done == request,
        _ => false,
    }
}

/// Prints one line; `false` once nobody reads the output any more (a
/// closed pipe, as under `| head`): the client stops quietly.
fn say(line: &str) -> Result<bool> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{line}").and_then(|()| out.flush()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Runs `options.action`; an order the server rejects is an error (exit
/// status 1) after its report is printed.
pub(crate) fn run(options: Options) -> Result<()> {
    let (mut client, reply) = Client::login_within(&options.address, options.account, &options.key, options.last_seen, options.timeout).map_err(|e| {
        // Another protocol's port answers with what does not frame.
        let hint = if matches!(e, crossbook_client::ClientError::Garbled(_) | crossbook_client::ClientError::Closed) { " (is it the binary protocol's port? crossbook serve's is 7700; 7701 is FIX, 7702 HTTP)" } else { "" };
        anyhow!("logging in to {}: {e}{hint}", options.address)
    })?;
    if !say(&describe(&reply))? {
        return Ok(());
    }
    match reply {
        ServerMessage::LoginAccepted { next_seq, .. } => {
            // The account's reports end before it: a --last-seen past
            // them names reports the venue no longer has (docs/protocol.md).
            if options.last_seen != u64::MAX && options.last_seen >= next_seq {
                eprintln!("crossbook: warning: --last-seen {} is past the account's last report ({}): nothing is replayed; reports past it were taken back (a power cut in async durability) or never were", options.last_seen, next_seq.saturating_sub(1));
            }
        }
        _ => bail!("login refused"),
    }
    let request = 1;
    let message = match &options.action {
        Action::Place(order) => Some(ClientMessage::NewOrder(*order)),
        Action::Cancel { order } => Some(ClientMessage::Cancel { order: *order }),
        Action::Replace { order, price, qty } => Some(ClientMessage::Replace { order: *order, price: *price, qty: *qty }),
        Action::CancelAll { instrument } => Some(ClientMessage::CancelAll { instrument: *instrument }),
        Action::Balances => Some(ClientMessage::QueryBalances { request }),
        Action::OpenOrders { instrument } => Some(ClientMessage::QueryOpenOrders { request, instrument: *instrument }),
        Action::Watch { .. } => None,
    };
    if let Some(message) = &message {
        client.send(message)?;
    }
    let deadline = match &options.action {
        Action::Watch { duration } => duration.map(|d| Instant::now() + d),
        _ => Some(Instant::now() + options.timeout),
    };
    let mut answered: Option<Instant> = None;
    let mut refused: Option<String> = None;
    client.set_timeout(Duration::from_millis(50));
    loop {
        if let Some(at) = answered
            && at.elapsed() >= options.linger
        {
            break;
        }
        if answered.is_none() && deadline.is_some_and(|d| Instant::now() >= d) {
            if matches!(options.action, Action::Watch { .. }) {
                break;
            }
            let after = options.timeout.as_secs_f64();
            match options.action {
                Action::Place(_) | Action::Cancel { .. } | Action::Replace { .. } | Action::CancelAll { .. } => bail!(
                    "no answer from the server within {after} s: whether it was done is not known (`crossbook order open-orders` shows the open orders; `--last-seen N` replays the reports after N)"
                ),
                _ => bail!("no answer from the server within {after} s"),
            }
        }
        // The answer, once printed, is the outcome: a session that ends
        // during the linger says so and changes nothing (an exit status of
        // 1 would have a script send an order the venue took again).
        let message = match client.recv() {
            Ok(Some(message)) => message,
            Err(crossbook_client::ClientError::TimedOut) => continue,
            Ok(None) if answered.is_some() => {
                eprintln!("crossbook: the server closed the connection after its answer");
                break;
            }
            Ok(None) => bail!("the server closed the connection"),
            Err(e) if answered.is_some() => {
                eprintln!("crossbook: the connection ended after the server's answer: {e}");
                break;
            }
            Err(e) => return Err(anyhow!(e)),
        };
        if !say(&describe(&message))? {
            return Ok(());
        }
        if let ServerMessage::ExecutionReport(r) = &message
            && let Some(refusal) = r.refusal()
            && answers(&options.action, &message, request)
        {
            refused = Some(refusal.name().to_string());
        }
        if let ServerMessage::Error { reason } = &message {
            refused = Some(reason.to_string());
        }
        // The server ends the session (it stops, or a reload took the
        // account's key away): nothing more comes.
        if let ServerMessage::Logout { .. } = &message {
            if answered.is_some() {
                eprintln!("crossbook: the server ended the session ({}) after its answer", describe(&message));
                break;
            }
            bail!("the server ended the session ({})", describe(&message));
        }
        if answered.is_none() && answers(&options.action, &message, request) {
            answered = Some(Instant::now());
        }
    }
    let _ = client.send(&ClientMessage::Logout);
    match refused {
        Some(reason) => bail!("refused: {reason}"),
        None => Ok(()),
    }
}
