//! The venue behind the FIX gateway: FIX order messages in, engine commands
//! out, and engine execution reports back as FIX messages.
//!
//! FIX names orders by the client's ClOrdID (a string, renamed by every
//! replace); the engine by its order id and a numeric client id. The
//! [`FixBook`] keeps the link. It is a function of the journal: every
//! command a FIX session sends is journaled with an annex holding its
//! ClOrdID (and OrigClOrdID), so the book, and every report, can be
//! rebuilt after a restart or a crash.

use crate::sequencer::Placed;
use crossbook_engine::{AccountId, Command, InstrumentId, OrderId, OrderType, PlaceOrder, SelfTradePrevention, Side, TimeInForce};
use crossbook_fix::decimal::{Decimal, average_text};
use crossbook_fix::session::{Application, LogonRefusal, Outbox};
use crossbook_fix::validate::Shape;
use crossbook_fix::wire::Message;
use crossbook_protocol::reports::{Addressed, Refusal};
use crossbook_protocol::{ExecutionReport, ReportKind};
use std::collections::HashMap;

/// Engine client ids of orders placed over FIX: this bit set, then a
/// counter (binary-protocol clients are asked to keep below it).
pub const FIX_CID_BASE: u64 = 1 << 63;
/// Numbers the ExecIDs of refusals the gateway makes itself.
static GATEWAY_EXEC_IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// The ExecID of a refusal that is no journaled command: unique across
/// sessions and restarts (the clock, then a counter).
fn gateway_exec_id() -> String {
    format!("gw-{}-{}", super::now_ms(), GATEWAY_EXEC_IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
}

/// Longest ClOrdID accepted (it is journaled with the order).
pub const MAX_CL_ORD_ID: usize = 60;

/// The journal takes an annex of at most `MAX_ANNEX` bytes; the longest
/// one this gateway writes is its kind, then the ClOrdID and the
/// OrigClOrdID each after its length byte (`Annex::encode`). A longer
/// ClOrdID limit must not compile, rather than fail a journal append.
const LONGEST_ANNEX: usize = 1 + (1 + MAX_CL_ORD_ID) + (1 + MAX_CL_ORD_ID);
const _: () = assert!(LONGEST_ANNEX <= crossbook_journal::format::MAX_ANNEX);
/// A ClOrdID's length is one byte in the annex.
const _: () = assert!(MAX_CL_ORD_ID <= u8::MAX as usize);

/// Tags read and written here.
mod tag {
    pub const ACCOUNT: u32 = 1;
    pub const AVG_PX: u32 = 6;
    pub const CL_ORD_ID: u32 = 11;
    pub const COMMISSION: u32 = 12;
    pub const COMM_TYPE: u32 = 13;
    pub const CUM_QTY: u32 = 14;
    pub const EXEC_ID: u32 = 17;
    pub const EXEC_INST: u32 = 18;
    pub const LAST_PX: u32 = 31;
    pub const LAST_QTY: u32 = 32;
    pub const ORDER_ID: u32 = 37;
    pub const ORDER_QTY: u32 = 38;
    pub const ORD_STATUS: u32 = 39;
    pub const ORD_TYPE: u32 = 40;
    pub const ORIG_CL_ORD_ID: u32 = 41;
    pub const PRICE: u32 = 44;
    pub const SIDE: u32 = 54;
    pub const SYMBOL: u32 = 55;
    pub const TEXT: u32 = 58;
    pub const TIME_IN_FORCE: u32 = 59;
    pub const TRANSACT_TIME: u32 = 60;
    pub const CXL_REJ_REASON: u32 = 102;
    pub const ORD_REJ_REASON: u32 = 103;
    pub const EXEC_TYPE: u32 = 150;
    pub const LEAVES_QTY: u32 = 151;
    pub const CASH_ORDER_QTY: u32 = 152;
    pub const CXL_REJ_RESPONSE_TO: u32 = 434;
    pub const MASS_CANCEL_REQUEST_TYPE: u32 = 530;
    pub const MASS_CANCEL_RESPONSE: u32 = 531;
    pub const MASS_CANCEL_REJECT_REASON: u32 = 532;
    pub const TOTAL_AFFECTED_ORDERS: u32 = 533;
    pub const SELF_TRADE_PREVENTION: u32 = 7928;
}

/// An instrument as FIX sees it.
#[derive(Clone, Debug)]
pub struct FixInstrument {
    pub id: InstrumentId,
    pub symbol: String,
    pub price_unit: Decimal,
    pub qty_unit: Decimal,
}

impl FixInstrument {
    /// FIX units of one tick and one lot.
    pub(crate) fn of_spec(spec: &crossbook_engine::InstrumentSpec) -> FixInstrument {
        FixInstrument { id: spec.id, symbol: spec.symbol.as_str().to_string(), price_unit: Decimal::from_int(1), qty_unit: Decimal::from_int(1) }
    }
}

pub fn instruments(instruments: &[crate::config::InstrumentConfig]) -> Result<Vec<FixInstrument>, crate::config::ConfigError> {
    instruments
        .iter()
        .map(|i| {
            let unit = |text: &str, what: &'static str| {
                // Market data and the REST API carry a unit's digits in a
                // u64 (`crossbook_marketdata::Unit`).
                Decimal::parse(text.as_bytes())
                    .filter(|d| d.mantissa > 0 && u64::try_from(d.mantissa).is_ok())
                    .ok_or_else(|| crate::config::ConfigError::BadFixUnit { symbol: i.symbol.clone(), what, value: text.to_string() })
            };
            Ok(FixInstrument { id: i.id, symbol: i.symbol.clone(), price_unit: unit(&i.fix_price_unit, "fix_price_unit")?, qty_unit: unit(&i.fix_qty_unit, "fix_qty_unit")? })
        })
        .collect()
}

/// A FIX price or quantity that is not a whole number of the
/// instrument's ticks or lots; its text is the reject's Text (58).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AmountError {
    NotDecimal { what: &'static str },
    NotMultiple { what: &'static str, value: String, unit: String },
    OutOfRange { what: &'static str },
}

impl std::fmt::Display for AmountError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AmountError::NotDecimal { what } => write!(f, "{what} is not a decimal"),
            AmountError::NotMultiple { what, value, unit } => write!(f, "{what} {value} is not a multiple of {unit}"),
            AmountError::OutOfRange { what } => write!(f, "{what} out of range"),
        }
    }
}

/// What a FIX request journals with its command: the message type, the
/// ClOrdID and the OrigClOrdID.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Annex {
    pub kind: u8,
    pub cl_ord_id: String,
    pub orig_cl_ord_id: String,
}

impl Annex {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![self.kind, self.cl_ord_id.len() as u8];
        out.extend_from_slice(self.cl_ord_id.as_bytes());
        out.push(self.orig_cl_ord_id.len() as u8);
        out.extend_from_slice(self.orig_cl_ord_id.as_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Option<Annex> {
        let (&kind, rest) = bytes.split_first()?;
        let (&len, rest) = rest.split_first()?;
        let (id, rest) = rest.split_at_checked(len as usize)?;
        let (&len, rest) = rest.split_first()?;
        let (orig, rest) = rest.split_at_checked(len as usize)?;
        if !rest.is_empty() || !b"DFGq".contains(&kind) {
            return None;
        }
        Some(Annex { kind, cl_ord_id: String::from_utf8(id.to_vec()).ok()?, orig_cl_ord_id: String::from_utf8(orig.to_vec()).ok()? })
    }
}

#[derive(Clone, Debug)]
struct FixOrder {
    account: AccountId,
    cl_ord_id: String,
    instrument: InstrumentId,
    side: Side,
    order_type: OrderType,
    tif: TimeInForce,
    qty: u64,
    price: i64,
    /// Sum of price x lots over the fills, for AvgPx.
    notional: i128,
}

/// A ClOrdID on its way to the engine.
#[derive(Clone, Debug)]
enum Pending {
    /// A NewOrderSingle's: what it asked for, and where the sequencer
    /// writes the order's id, by which a cancel or replace sent before its
    /// ExecutionReport names it.
    Order { placed: Placed, order: FixOrder },
    /// A replace's new name.
    Rename,
}

/// The link between FIX's names for orders and the engine's, and what a
/// report needs that the engine's reports do not carry.
#[derive(Default)]
pub struct FixBook {
    orders: HashMap<OrderId, FixOrder>,
    by_cl_ord_id: HashMap<(AccountId, String), OrderId>,
    /// ClOrdIDs sent to the engine whose order is not known yet.
    pending: HashMap<(AccountId, String), Pending>,
    /// The next engine client id for a FIX order.
    next_cid: u64,
    /// The last `SEEN_CL_ORD_IDS` ClOrdIDs of new orders, open or not: a
    /// ClOrdID is used once (a resent order that was already taken must
    /// not trade twice). Rebuilt from the journal's annexes on start.
    seen: std::collections::HashSet<(AccountId, String)>,
    seen_order: std::collections::VecDeque<(AccountId, String)>,
}

/// ClOrdIDs remembered for duplicate detection.
pub const SEEN_CL_ORD_IDS: usize = 1_000_000;

/// One command and what it caused, as the FIX side needs it.
pub struct FixEvent {
    /// 0 for a refusal.
    pub seq: u64,
    pub command: Command,
    pub annex: Option<Annex>,
    pub reports: Vec<Addressed>,
    /// An order the sequencer refused (the open-order limit) before the
    /// engine or the journal saw it: its one report is the refusal, and
    /// its ClOrdID was not used.
    pub refused: bool,
}

/// A FIX message for an account's session.
pub struct Outgoing {
    pub account: AccountId,
    pub msg_type: &'static str,
    pub body: Vec<(u32, Vec<u8>)>,
}

fn field(tag: u32, value: impl ToString) -> (u32, Vec<u8>) {
    (tag, value.to_string().into_bytes())
}

fn side_code(side: Side) -> &'static str {
    match side {
        Side::Buy => "1",
        Side::Sell => "2",
    }
}



impl FixBook {
    pub fn new() -> FixBook {
        FixBook { next_cid: FIX_CID_BASE + 1, ..FixBook::default() }
    }

    /// The book's state for a snapshot: the next engine client id and every
    /// open order with its ClOrdID (the ClOrdID index is rebuilt from
    /// them). The duplicate-ClOrdID memory is not kept: after a restart it
    /// holds the open orders' ClOrdIDs and those of the commands re-read
    /// from the journal (`docs/fix.md`).
    pub fn checkpoint(&self) -> Vec<u8> {
        let mut ids: Vec<&OrderId> = self.orders.keys().collect();
        ids.sort_unstable();
        let mut out = Vec::with_capacity(16 + ids.len() * 80);
        out.extend_from_slice(&self.next_cid.to_le_bytes());
        out.extend_from_slice(&(ids.len() as u64).to_le_bytes());
        for id in ids {
            let order = &self.orders[id];
            out.extend_from_slice(&id.to_le_bytes());
            out.extend_from_slice(&order.account.to_le_bytes());
            out.extend_from_slice(&order.instrument.to_le_bytes());
            out.push(match order.side {
                Side::Buy => 0,
                Side::Sell => 1,
            });
            out.push(match order.order_type {
                OrderType::Limit => 0,
                OrderType::Market => 1,
            });
            out.push(match order.tif {
                TimeInForce::Gtc => 0,
                TimeInForce::Ioc => 1,
                TimeInForce::Fok => 2,
            });
            out.extend_from_slice(&order.qty.to_le_bytes());
            out.extend_from_slice(&order.price.to_le_bytes());
            out.extend_from_slice(&order.notional.to_le_bytes());
            out.push(order.cl_ord_id.len() as u8);
            out.extend_from_slice(order.cl_ord_id.as_bytes());
        }
        out
    }

    /// A book from [`FixBook::checkpoint`]'s bytes.
    pub fn restore(state: &[u8]) -> Result<FixBook, crate::sink::RestoreError> {
        use crate::sink::RestoreError;
        let mut reader = crate::checkpoint::Reader::new(state);
        let mut book = FixBook::new();
        book.next_cid = reader.u64()?;
        let count = reader.count(true, 56)?;
        for _ in 0..count {
            let id = reader.u64()?;
            let account = reader.u64()?;
            let instrument = reader.u32()?;
            let side = match reader.u8()? {
                0 => Side::Buy,
                1 => Side::Sell,
                other => return Err(RestoreError(format!("order {id}: side {other}"))),
            };
            let order_type = match reader.u8()? {
                0 => OrderType::Limit,
                1 => OrderType::Market,
                other => return Err(RestoreError(format!("order {id}: order type {other}"))),
            };
            let tif = match reader.u8()? {
                0 => TimeInForce::Gtc,
                1 => TimeInForce::Ioc,
                2 => TimeInForce::Fok,
                other => return Err(RestoreError(format!("order {id}: time in force {other}"))),
            };
            let (qty, price, notional) = (reader.u64()?, reader.i64()?, reader.i128()?);
            let length = reader.u8()? as usize;
            let cl_ord_id = String::from_utf8(reader.take(length)?.to_vec()).map_err(|_| RestoreError(format!("order {id}: a ClOrdID that is not UTF-8")))?;
            let key = (account, cl_ord_id.clone());
            book.by_cl_ord_id.insert(key.clone(), id);
            if book.seen.insert(key.clone()) {
                book.seen_order.push_back(key);
            }
            book.orders.insert(id, FixOrder { account, cl_ord_id, instrument, side, order_type, tif, qty, price, notional });
        }
        reader.end()?;
        Ok(book)
    }

    /// A ClOrdID taken by a journaled request: refused if sent again
    /// (the last [`SEEN_CL_ORD_IDS`] are remembered).
    fn remember(&mut self, key: (AccountId, String)) {
        if self.seen.insert(key.clone()) {
            self.seen_order.push_back(key);
            if self.seen_order.len() > SEEN_CL_ORD_IDS
                && let Some(old) = self.seen_order.pop_front()
            {
                self.seen.remove(&old);
            }
        }
    }

    fn insert_order(&mut self, id: OrderId, order: FixOrder) {
        self.orders.insert(id, order);
    }

    /// Whether one of the account's open orders placed elsewhere (known
    /// by its client id in decimal) holds engine client id `cid`.
    fn holds_cid(&self, account: AccountId, cid: u64) -> bool {
        self.order_by_cl_ord_id(account, &cid.to_string()).is_some()
    }

    fn order_by_cl_ord_id(&self, account: AccountId, cl_ord_id: &str) -> Option<OrderId> {
        self.by_cl_ord_id.get(&(account, cl_ord_id.to_owned())).copied()
    }

    /// Follows one journaled command (live or replayed) and returns the FIX
    /// messages its reports become. `now` is TransactTime.
    pub fn follow(&mut self, event: &FixEvent, instruments: &[FixInstrument], now: &str) -> Vec<Outgoing> {
        let mut out = Vec::new();
        if let (Command::Place(place), Some(annex)) = (&event.command, &event.annex) {
            let key = (place.account, annex.cl_ord_id.clone());
            self.pending.remove(&key);
            if !event.refused {
                self.remember(key);
            }
            if place.cid > FIX_CID_BASE {
                self.next_cid = self.next_cid.max(place.cid + 1);
            }
        }
        if let (Command::Replace { account, .. }, Some(annex)) = (&event.command, &event.annex) {
            self.pending.remove(&(*account, annex.cl_ord_id.clone()));
        }
        // A mass cancel's ClOrdID is taken too: one sent again (a resend
        // after a crash) is refused, not run a second time.
        if let (Command::CancelAll { account, .. }, Some(annex)) = (&event.command, &event.annex)
            && annex.kind == b'q'
            && !annex.cl_ord_id.is_empty()
        {
            self.remember((*account, annex.cl_ord_id.clone()));
        }
        let mut mass_cancelled = 0u64;
        let mut rejected = false;
        for (index, addressed) in event.reports.iter().enumerate() {
            let exec_id = format!("{}-{}", event.seq, index + 1);
            let report = addressed.report;
            if report.kind == ReportKind::Rejected {
                rejected = true;
            }
            if report.cancel_reason() == Some(crossbook_engine::CancelReason::CancelAll) {
                mass_cancelled += 1;
            }
            if let Some(message) = self.report(event, addressed.account, &report, exec_id, instruments, now) {
                out.push(message);
            }
        }
        if let (Command::CancelAll { account, instrument }, Some(annex)) = (&event.command, &event.annex)
            && annex.kind == b'q'
            && !rejected
        {
            let request_type = if instrument.is_some() { "1" } else { "7" };
            out.push(Outgoing {
                account: *account,
                msg_type: "r",
                body: vec![
                    field(tag::CL_ORD_ID, &annex.cl_ord_id),
                    field(tag::ORDER_ID, format!("mass-{}", event.seq)),
                    field(tag::MASS_CANCEL_REQUEST_TYPE, request_type),
                    field(tag::MASS_CANCEL_RESPONSE, request_type),
                    field(tag::TOTAL_AFFECTED_ORDERS, mass_cancelled),
                ],
            });
        }
        out
    }

    /// The FIX message for one engine report, updating the book.
    fn report(&mut self, event: &FixEvent, account: AccountId, report: &ExecutionReport, exec_id: String, instruments: &[FixInstrument], now: &str) -> Option<Outgoing> {
        if report.kind == ReportKind::CancelAllDone {
            // FIX answers a mass cancel with its OrderMassCancelReport.
            return None;
        }
        let own_request = Command::trader(&event.command) == Some(account);
        let annex = event.annex.as_ref().filter(|_| own_request);
        let instrument = instruments.iter().find(|i| i.id == report.instrument);
        if report.kind == ReportKind::Accepted {
            let (order_type, tif) = match event.command {
                Command::Place(p) => (p.order_type, p.tif),
                _ => (OrderType::Limit, TimeInForce::Gtc),
            };
            let cl_ord_id = annex.map_or_else(|| report.cid.to_string(), |a| a.cl_ord_id.clone());
            self.by_cl_ord_id.insert((account, cl_ord_id.clone()), report.order);
            self.insert_order(
                report.order,
                FixOrder { account, cl_ord_id, instrument: report.instrument, side: report.side, order_type, tif, qty: report.cum_qty + report.leaves_qty, price: report.price, notional: 0 },
            );
        }
        if report.kind == ReportKind::Rejected {
            return Some(self.rejection(event, account, report, annex, instrument, now));
        }
        let known = self.orders.contains_key(&report.order);
        if !known {
            // An order from before this account's FIX session existed.
            self.insert_order(
                report.order,
                FixOrder {
                    account,
                    cl_ord_id: report.cid.to_string(),
                    instrument: report.instrument,
                    side: report.side,
                    order_type: OrderType::Limit,
                    tif: TimeInForce::Gtc,
                    qty: report.cum_qty + report.leaves_qty,
                    price: report.price,
                    notional: i128::from(report.price) * i128::from(report.cum_qty - report.last_qty),
                },
            );
        }
        let mut orig_cl_ord_id = None;
        let renamed = annex.filter(|a| a.kind == b'G' || a.kind == b'F');
        let order = self.orders.get_mut(&report.order)?;
        match report.kind {
            ReportKind::PartialFill | ReportKind::Fill => order.notional += i128::from(report.last_price) * i128::from(report.last_qty),
            ReportKind::Replaced => {
                order.price = report.price;
                order.qty = report.cum_qty + report.leaves_qty;
            }
            _ => {}
        }
        let (exec_type, status) = match report.kind {
            ReportKind::Accepted => ("0", "0"),
            ReportKind::PartialFill => ("F", "1"),
            ReportKind::Fill => ("F", "2"),
            ReportKind::Cancelled => ("4", "4"),
            ReportKind::Replaced => ("5", if report.cum_qty > 0 { "1" } else { "0" }),
            ReportKind::Rejected => ("8", "8"),
            ReportKind::CancelAllDone => return None,
        };
        let cancelled_by_request = report.kind == ReportKind::Cancelled
            && matches!(report.cancel_reason(), Some(crossbook_engine::CancelReason::User | crossbook_engine::CancelReason::Replace));
        if let Some(annex) = renamed
            && (report.kind == ReportKind::Replaced || cancelled_by_request)
        {
            orig_cl_ord_id = Some(std::mem::replace(&mut order.cl_ord_id, annex.cl_ord_id.clone()));
            let key = (account, orig_cl_ord_id.clone().unwrap_or_default());
            self.by_cl_ord_id.remove(&key);
            self.by_cl_ord_id.insert((account, annex.cl_ord_id.clone()), report.order);
        }
        let order = self.orders.get(&report.order)?.clone();
        let mut body = vec![field(tag::ACCOUNT, account)];
        let price_unit = instrument.map_or(Decimal::from_int(1), |i| i.price_unit);
        let qty_unit = instrument.map_or(Decimal::from_int(1), |i| i.qty_unit);
        let price = |ticks: i64| price_unit.times(i128::from(ticks)).map_or_else(|| "0".into(), Decimal::to_text);
        let qty = |lots: u64| qty_unit.times(i128::from(lots)).map_or_else(|| "0".into(), Decimal::to_text);
        body.push(field(tag::AVG_PX, average_text(order.notional, i128::from(report.cum_qty), price_unit, 4)));
        body.push(field(tag::CL_ORD_ID, &order.cl_ord_id));
        if report.fee != 0 && report.last_qty > 0 {
            body.push(field(tag::COMMISSION, report.fee));
            body.push(field(tag::COMM_TYPE, "3"));
        }
        body.push(field(tag::CUM_QTY, qty(report.cum_qty)));
        body.push(field(tag::EXEC_ID, exec_id));
        if report.last_qty > 0 {
            body.push(field(tag::LAST_PX, price(report.last_price)));
            body.push(field(tag::LAST_QTY, qty(report.last_qty)));
        }
        body.push(field(tag::ORDER_ID, report.order));
        body.push(field(tag::ORDER_QTY, qty(order.qty)));
        body.push(field(tag::ORD_STATUS, status));
        body.push(field(tag::ORD_TYPE, if order.order_type == OrderType::Market { "1" } else { "2" }));
        if let Some(orig) = orig_cl_ord_id {
            body.push(field(tag::ORIG_CL_ORD_ID, orig));
        }
        if order.order_type == OrderType::Limit {
            body.push(field(tag::PRICE, price(order.price)));
        }
        body.push(field(tag::SIDE, side_code(order.side)));
        body.push(field(tag::SYMBOL, instrument.map_or("?", |i| i.symbol.as_str())));
        if let Some(reason) = report.cancel_reason() {
            body.push(field(tag::TEXT, cancel_text(reason)));
        }
        body.push(field(tag::TIME_IN_FORCE, tif_code(order.tif)));
        body.push(field(tag::TRANSACT_TIME, now));
        body.push(field(tag::EXEC_TYPE, exec_type));
        body.push(field(tag::LEAVES_QTY, qty(report.leaves_qty)));
        if matches!(report.kind, ReportKind::Cancelled | ReportKind::Fill) {
            self.orders.remove(&report.order);
            self.by_cl_ord_id.remove(&(account, order.cl_ord_id.clone()));
        }
        Some(Outgoing { account, msg_type: "8", body })
    }

    /// An engine rejection: ExecutionReport for a new order,
    /// OrderCancelReject for a cancel or a replace, a mass-cancel report
    /// for a mass cancel.
    fn rejection(&self, event: &FixEvent, account: AccountId, report: &ExecutionReport, annex: Option<&Annex>, instrument: Option<&FixInstrument>, now: &str) -> Outgoing {
        let refusal = report.refusal();
        let reason = match refusal {
            Some(Refusal::Engine(reason)) => Some(reason),
            _ => None,
        };
        let text = match refusal {
            Some(Refusal::Engine(reason)) => reason.name(),
            Some(Refusal::OpenOrderLimit) => "open order limit reached",
            Some(Refusal::NotLeader) => "not the leader",
            None => "rejected",
        };
        let cl_ord_id = annex.map_or_else(|| report.cid.to_string(), |a| a.cl_ord_id.clone());
        match event.command {
            Command::Cancel { .. } | Command::Replace { .. } | Command::Amend { .. } => {
                let order = self.orders.get(&report.order).filter(|o| o.account == account);
                let orig = annex.map(|a| a.orig_cl_ord_id.clone()).or_else(|| order.map(|o| o.cl_ord_id.clone())).unwrap_or_default();
                let status = match order {
                    Some(_) if report.cum_qty > 0 => "1",
                    Some(_) => "0",
                    None => "8",
                };
                let unknown = matches!(reason, Some(crossbook_engine::RejectReason::UnknownOrder));
                let response_to = if matches!(event.command, Command::Cancel { .. }) { "1" } else { "2" };
                Outgoing {
                    account,
                    msg_type: "9",
                    body: vec![
                        field(tag::CL_ORD_ID, cl_ord_id),
                        field(tag::ORDER_ID, if order.is_some() { report.order.to_string() } else { "NONE".into() }),
                        field(tag::ORD_STATUS, status),
                        field(tag::ORIG_CL_ORD_ID, orig),
                        field(tag::TEXT, text),
                        field(tag::CXL_REJ_REASON, if unknown { "1" } else { "99" }),
                        field(tag::CXL_REJ_RESPONSE_TO, response_to),
                    ],
                }
            }
            Command::CancelAll { instrument: scope, .. } => Outgoing {
                account,
                msg_type: "r",
                body: vec![
                    field(tag::CL_ORD_ID, cl_ord_id),
                    field(tag::ORDER_ID, format!("mass-{}", event.seq)),
                    field(tag::TEXT, text),
                    field(tag::MASS_CANCEL_REQUEST_TYPE, if scope.is_some() { "1" } else { "7" }),
                    field(tag::MASS_CANCEL_RESPONSE, "0"),
                    field(tag::MASS_CANCEL_REJECT_REASON, if matches!(reason, Some(crossbook_engine::RejectReason::UnknownInstrument)) { "1" } else { "99" }),
                ],
            },
            _ => {
                let symbol = instrument.map_or("?", |i| i.symbol.as_str()).to_owned();
                // A refusal is not a journaled command: its ExecID is the
                // gateway's own, like the refusals it decides alone.
                let exec_id = if event.refused { gateway_exec_id() } else { format!("{}-{}", event.seq, 1) };
                new_order_reject(account, &cl_ord_id, &symbol, side_code(report.side), ord_rej_reason(reason), text, now, &exec_id)
            }
        }
    }
}

fn cancel_text(reason: crossbook_engine::CancelReason) -> &'static str {
    use crossbook_engine::CancelReason::*;
    match reason {
        User => "cancelled on request",
        Ioc => "unfilled rest of an immediate order",
        Stp => "self-trade prevention",
        Replace => "replaced to no more than the filled quantity",
        CancelAll => "mass cancel",
    }
}

fn tif_code(tif: TimeInForce) -> &'static str {
    match tif {
        TimeInForce::Gtc => "1",
        TimeInForce::Ioc => "3",
        TimeInForce::Fok => "4",
    }
}

/// OrdRejReason (103) for an engine reject reason.
fn ord_rej_reason(reason: Option<crossbook_engine::RejectReason>) -> &'static str {
    use crossbook_engine::RejectReason::*;
    match reason {
        Some(UnknownInstrument | InvalidInstrument) => "1",
        Some(UnknownAccount) => "15",
        Some(DuplicateClientOrderId) => "6",
        Some(InvalidQuantity) => "13",
        Some(InstrumentHalted) => "2",
        _ => "99",
    }
}

#[allow(clippy::too_many_arguments)]
/// `side`: Side (54) as the order had it (as sent, for one the gateway
/// refuses, even a value it does not take).
fn new_order_reject(account: AccountId, cl_ord_id: &str, symbol: &str, side: &str, reason: &str, text: &str, now: &str, exec_id: &str) -> Outgoing {
    Outgoing {
        account,
        msg_type: "8",
        body: vec![
            field(tag::ACCOUNT, account),
            field(tag::AVG_PX, "0"),
            field(tag::CL_ORD_ID, cl_ord_id),
            field(tag::CUM_QTY, "0"),
            field(tag::EXEC_ID, exec_id),
            field(tag::ORDER_ID, "NONE"),
            field(tag::ORD_STATUS, "8"),
            field(tag::SIDE, side),
            field(tag::SYMBOL, symbol),
            field(tag::TEXT, text),
            field(tag::TRANSACT_TIME, now),
            field(tag::ORD_REJ_REASON, reason),
            field(tag::EXEC_TYPE, "8"),
            field(tag::LEAVES_QTY, "0"),
        ],
    }
}

/// A command for the engine and its annex.
#[derive(Debug, PartialEq, Eq)]
pub struct Request {
    pub command: Command,
    pub annex: Annex,
    pub(crate) link: Link,
}

/// How a request is tied to a NewOrderSingle not acknowledged yet.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Link {
    None,
    /// A NewOrderSingle's place: the sequencer writes the order's id here.
    Records(Placed),
    /// A cancel or replace of that order: the sequencer puts in the id
    /// written there (`command` names order 0 until then).
    Names(Placed),
}

/// The venue application of one session: turns D, F, G and q into engine
/// commands (collected in `requests`, sent once the session lock is
/// released) and refuses what cannot become one, at once.
pub struct VenueApp<'a> {
    pub account: AccountId,
    pub book: &'a mut FixBook,
    pub instruments: &'a [FixInstrument],
    pub requests: &'a mut Vec<Request>,
    pub now: String,
    pub now_ms: i64,
    /// The account's API key, for Logon with Username/Password.
    pub credentials: Option<(String, String)>,
    /// The CompID logged on for the account now, if another: a Logon is
    /// refused (one FIX session per account at a time).
    pub busy: Option<String>,
}

fn text(message: &Message, tag: u32) -> Option<String> {
    message.text(tag).map(str::to_owned)
}

impl VenueApp<'_> {
    fn instrument(&self, message: &Message) -> Option<&FixInstrument> {
        let symbol = message.text(tag::SYMBOL)?;
        self.instruments.iter().find(|i| i.symbol == symbol)
    }

    fn reject_order(&self, message: &Message, reason: &str, why: &str, outbox: &mut Outbox<'_>) {
        // Side as sent (a required field: the dictionary has seen to it).
        let side = message.text(tag::SIDE).unwrap_or("1");
        let exec_id = gateway_exec_id();
        let reject = new_order_reject(self.account, message.text(tag::CL_ORD_ID).unwrap_or(""), message.text(tag::SYMBOL).unwrap_or(""), side, reason, why, &self.now, &exec_id);
        outbox.send(reject.msg_type, Vec::new(), reject.body);
    }

    fn cancel_reject(&self, message: &Message, why: &str, unknown: bool, outbox: &mut Outbox<'_>) {
        self.cancel_reject_with(message, why, if unknown { "1" } else { "99" }, None, outbox);
    }

    /// An OrderCancelReject about the account's own order `order` (0: its
    /// NewOrderSingle is still on its way), which stays as it is: its
    /// OrderID and its status (New, Partially filled, or Pending New), as
    /// FIX 4.4 has them, not an unknown order's NONE and Rejected.
    fn own_cancel_reject(&self, message: &Message, why: &str, reason: &str, order: OrderId, own: &FixOrder, outbox: &mut Outbox<'_>) {
        let known = if order == 0 { ("NONE".to_string(), "A") } else { (order.to_string(), if own.notional != 0 { "1" } else { "0" }) };
        self.cancel_reject_with(message, why, reason, Some(known), outbox);
    }

    /// A replace refused for `why` (CxlRejReason 99): about the account's
    /// own order if `own` is, else as about an unknown order.
    fn refuse_change(&self, message: &Message, why: &str, order: OrderId, own: Option<&FixOrder>, outbox: &mut Outbox<'_>) {
        match own {
            Some(own) => self.own_cancel_reject(message, why, "99", order, own, outbox),
            None => self.cancel_reject(message, why, false, outbox),
        }
    }

    /// An OrderCancelReject with CxlRejReason `reason`; `known`, the order's
    /// OrderID and OrdStatus where it is the account's own.
    fn cancel_reject_with(&self, message: &Message, why: &str, reason: &str, known: Option<(String, &str)>, outbox: &mut Outbox<'_>) {
        let response_to = if message.msg_type() == b"G" { "2" } else { "1" };
        // Not the account's own order (unknown, or another account's):
        // NONE, whatever OrderID the request named (docs/fix.md).
        let (order_id, status) = known.unwrap_or_else(|| ("NONE".to_string(), "8"));
        let body = vec![
            field(tag::CL_ORD_ID, message.text(tag::CL_ORD_ID).unwrap_or("")),
            field(tag::ORDER_ID, order_id),
            field(tag::ORD_STATUS, status),
            field(tag::ORIG_CL_ORD_ID, message.text(tag::ORIG_CL_ORD_ID).unwrap_or("")),
            field(tag::TEXT, why),
            field(tag::CXL_REJ_REASON, reason),
            field(tag::CXL_REJ_RESPONSE_TO, response_to),
        ];
        outbox.send("9", Vec::new(), body);
    }

    /// A price or quantity in whole ticks or lots (of the width the engine
    /// takes), or why not.
    fn units<T: TryFrom<i128>>(value: &[u8], unit: Decimal, what: &'static str) -> Result<T, AmountError> {
        let decimal = Decimal::parse(value).ok_or(AmountError::NotDecimal { what })?;
        let units = decimal.whole_units(unit).ok_or_else(|| AmountError::NotMultiple { what, value: String::from_utf8_lossy(value).into_owned(), unit: unit.to_text() })?;
        T::try_from(units).map_err(|_| AmountError::OutOfRange { what })
    }

    fn new_order(&mut self, message: &Message, outbox: &mut Outbox<'_>) {
        let Some(cl_ord_id) = text(message, tag::CL_ORD_ID) else {
            return self.reject_order(message, "99", "ClOrdID missing", outbox);
        };
        if cl_ord_id.len() > MAX_CL_ORD_ID {
            return self.reject_order(message, "99", "ClOrdID longer than 60 characters", outbox);
        }
        let key = (self.account, cl_ord_id.clone());
        if self.book.by_cl_ord_id.contains_key(&key) || self.book.pending.contains_key(&key) || self.book.seen.contains(&key) {
            return self.reject_order(message, "6", "duplicate ClOrdID: an order with it was already taken", outbox);
        }
        let Some(instrument) = self.instrument(message).cloned() else {
            return self.reject_order(message, "1", "unknown symbol", outbox);
        };
        let side = match message.get(tag::SIDE) {
            Some(b"1") => Side::Buy,
            Some(b"2") => Side::Sell,
            _ => return self.reject_order(message, "99", "only Side 1 (buy) and 2 (sell) are supported", outbox),
        };
        let order_type = match message.get(tag::ORD_TYPE) {
            Some(b"1") => OrderType::Market,
            Some(b"2") => OrderType::Limit,
            _ => return self.reject_order(message, "99", "only OrdType 1 (market) and 2 (limit) are supported", outbox),
        };
        let tif = match message.get(tag::TIME_IN_FORCE) {
            None | Some(b"1") => if order_type == OrderType::Market { TimeInForce::Ioc } else { TimeInForce::Gtc },
            Some(b"3") => TimeInForce::Ioc,
            Some(b"4") => TimeInForce::Fok,
            // A Day order would rest past the day it was meant for: this
            // venue has no trading day to end it, so it is refused rather
            // than taken as GTC.
            Some(b"0") => return self.reject_order(message, "99", "TimeInForce 0 (Day) is not supported: the venue has no trading day; send 1 (GTC), 3 (IOC) or 4 (FOK)", outbox),
            _ => return self.reject_order(message, "99", "only TimeInForce 1, 3 and 4 are supported", outbox),
        };
        let Some(qty) = message.get(tag::ORDER_QTY) else {
            return self.reject_order(message, "13", "OrderQty missing", outbox);
        };
        let qty = match Self::units::<u64>(qty, instrument.qty_unit, "OrderQty") {
            Ok(qty) => qty,
            Err(why) => return self.reject_order(message, "13", &why.to_string(), outbox),
        };
        let price = match (order_type, message.get(tag::PRICE)) {
            (OrderType::Limit, None) => return self.reject_order(message, "99", "a limit order needs a Price", outbox),
            (OrderType::Limit, Some(price)) => match Self::units::<i64>(price, instrument.price_unit, "Price") {
                Ok(price) => price,
                Err(why) => return self.reject_order(message, "99", &why.to_string(), outbox),
            },
            (OrderType::Market, _) => 0,
        };
        let post_only = message.text(tag::EXEC_INST).is_some_and(|v| v.split(' ').any(|i| i == "6"));
        let stp = match message.get(tag::SELF_TRADE_PREVENTION) {
            None => SelfTradePrevention::None,
            Some(b"N") => SelfTradePrevention::CancelNewest,
            Some(b"O") => SelfTradePrevention::CancelOldest,
            Some(b"B") => SelfTradePrevention::CancelBoth,
            Some(_) => return self.reject_order(message, "99", "SelfTradePrevention (7928) must be N, O or B", outbox),
        };
        let budget = match message.number(tag::CASH_ORDER_QTY) {
            Some(budget) if order_type == OrderType::Market && side == Side::Buy => Some(budget),
            Some(_) => return self.reject_order(message, "99", "CashOrderQty is for market buys (in the quote asset's units)", outbox),
            None if message.get(tag::CASH_ORDER_QTY).is_some() => return self.reject_order(message, "99", "CashOrderQty must be a whole number of quote units", outbox),
            None => None,
        };
        // Passing over a number a binary client gave one of the account's
        // open orders (known here by it in decimal), which the engine
        // would refuse as a duplicate.
        let mut cid = self.book.next_cid;
        while self.book.holds_cid(self.account, cid) {
            cid += 1;
        }
        self.book.next_cid = cid + 1;
        let sent = FixOrder { account: self.account, cl_ord_id: cl_ord_id.clone(), instrument: instrument.id, side, order_type, tif, qty, price, notional: 0 };
        let placed = Placed::default();
        self.book.pending.insert(key, Pending::Order { placed: placed.clone(), order: sent });
        let command = Command::Place(PlaceOrder { account: self.account, instrument: instrument.id, cid, side, order_type, tif, price, qty, post_only, stp, budget });
        self.requests.push(Request { command, annex: Annex { kind: b'D', cl_ord_id, orig_cl_ord_id: String::new() }, link: Link::Records(placed) });
    }

    /// The engine id of the order a cancel or replace names (OrigClOrdID,
    /// or OrderID).
    fn target(&self, message: &Message) -> Option<OrderId> {
        if let Some(orig) = message.text(tag::ORIG_CL_ORD_ID)
            && let Some(order) = self.book.order_by_cl_ord_id(self.account, orig)
        {
            return Some(order);
        }
        message.number(tag::ORDER_ID)
    }

    fn cancel_or_replace(&mut self, message: &Message, outbox: &mut Outbox<'_>) {
        let Some(cl_ord_id) = text(message, tag::CL_ORD_ID).filter(|c| c.len() <= MAX_CL_ORD_ID) else {
            return self.cancel_reject(message, "ClOrdID missing or longer than 60 characters", false, outbox);
        };
        let orig = text(message, tag::ORIG_CL_ORD_ID).unwrap_or_default();
        if orig.len() > MAX_CL_ORD_ID {
            return self.cancel_reject(message, "OrigClOrdID longer than 60 characters", false, outbox);
        }
        // An order whose NewOrderSingle is still on its way to the engine
        // has no order id yet: the request names the place, and the
        // sequencer, which took the place first (it came first), puts in
        // the id it gave it. A replace's new name that is still on its way
        // is refused: the replace may yet be refused.
        let pending = if orig.is_empty() || self.book.order_by_cl_ord_id(self.account, &orig).is_some() { None } else { self.book.pending.get(&(self.account, orig.clone())) };
        let (order, link, own) = match pending {
            Some(Pending::Rename) => return self.cancel_reject(message, "the replace that gave the order this ClOrdID is not acknowledged yet: send this after its ExecutionReport", false, outbox),
            Some(Pending::Order { placed, order }) => (0, Link::Names(placed.clone()), Some(order.clone())),
            None => {
                let Some(order) = self.target(message) else {
                    return self.cancel_reject(message, "unknown_order", true, outbox);
                };
                (order, Link::None, self.book.orders.get(&order).filter(|o| o.account == self.account).cloned())
            }
        };
        let kind = message.msg_type()[0];
        // The account's own order: what the request says of it must be so
        // (another account's gets a missing order's answers, below).
        if let Some(own) = &own {
            if message.get(tag::SYMBOL).is_some() && self.instrument(message).map(|i| i.id) != Some(own.instrument) {
                return self.own_cancel_reject(message, "Symbol is not the order's", "99", order, own, outbox);
            }
            let side = match message.get(tag::SIDE) {
                None => own.side,
                Some(b"1") => Side::Buy,
                Some(b"2") => Side::Sell,
                Some(_) => return self.own_cancel_reject(message, "only Side 1 (buy) and 2 (sell) are supported", "99", order, own, outbox),
            };
            if side != own.side {
                return self.own_cancel_reject(message, "Side is not the order's", "99", order, own, outbox);
            }
            if kind == b'G' {
                if message.get(tag::TIME_IN_FORCE).is_some_and(|t| t != b"1") {
                    return self.own_cancel_reject(message, "an open order is GTC: a replace keeps TimeInForce 1", "99", order, own, outbox);
                }
                if message.get(tag::ORD_TYPE).is_some_and(|t| t != b"2") {
                    return self.own_cancel_reject(message, "an open order is a limit order: a replace keeps OrdType 2", "99", order, own, outbox);
                }
                let taken = (self.account, cl_ord_id.clone());
                if self.book.by_cl_ord_id.contains_key(&taken) || self.book.pending.contains_key(&taken) {
                    return self.own_cancel_reject(message, "duplicate ClOrdID: an open or pending order of the account has it", "6", order, own, outbox);
                }
            }
        }
        let command = if kind == b'F' {
            Command::Cancel { account: self.account, order }
        } else {
            // Only this account's orders are known here: another
            // account's must get exactly the answers a missing one gets
            // (Price missing, unknown symbol, then the engine's
            // unknown_order), or ids could be scanned for live orders.
            let known = own;
            let Some(instrument) = known.as_ref().and_then(|o| self.instruments.iter().find(|i| i.id == o.instrument)).or_else(|| self.instrument(message)).cloned() else {
                return self.refuse_change(message, "unknown symbol", order, known.as_ref(), outbox);
            };
            let Some(qty) = message.get(tag::ORDER_QTY) else {
                return self.refuse_change(message, "OrderQty missing", order, known.as_ref(), outbox);
            };
            let qty = match Self::units::<u64>(qty, instrument.qty_unit, "OrderQty") {
                Ok(0) => return self.refuse_change(message, "OrderQty must be above 0", order, known.as_ref(), outbox),
                Ok(qty) => qty,
                Err(why) => return self.refuse_change(message, &why.to_string(), order, known.as_ref(), outbox),
            };
            let price = match message.get(tag::PRICE) {
                Some(price) => match Self::units::<i64>(price, instrument.price_unit, "Price") {
                    Ok(price) => price,
                    Err(why) => return self.refuse_change(message, &why.to_string(), order, known.as_ref(), outbox),
                },
                None => match known {
                    Some(order) => order.price,
                    None => return self.refuse_change(message, "Price missing", order, known.as_ref(), outbox),
                },
            };
            Command::Replace { account: self.account, order, price, qty }
        };
        if kind == b'G' {
            // The new name is taken from now until the replace is applied
            // or refused: another order or replace cannot have it meanwhile.
            self.book.pending.insert((self.account, cl_ord_id.clone()), Pending::Rename);
        }
        self.requests.push(Request { command, annex: Annex { kind, cl_ord_id, orig_cl_ord_id: orig }, link });
    }

    fn mass_cancel(&mut self, message: &Message, outbox: &mut Outbox<'_>) {
        let cl_ord_id = text(message, tag::CL_ORD_ID).unwrap_or_default();
        let refuse = |why: &str, outbox: &mut Outbox<'_>| {
            let body = vec![
                field(tag::CL_ORD_ID, &cl_ord_id),
                field(tag::ORDER_ID, "NONE"),
                field(tag::TEXT, why),
                field(tag::MASS_CANCEL_REQUEST_TYPE, message.text(tag::MASS_CANCEL_REQUEST_TYPE).unwrap_or("")),
                field(tag::MASS_CANCEL_RESPONSE, "0"),
                field(tag::MASS_CANCEL_REJECT_REASON, "99"),
            ];
            outbox.send("r", Vec::new(), body);
        };
        if cl_ord_id.len() > MAX_CL_ORD_ID {
            return refuse("ClOrdID longer than 60 characters", outbox);
        }
        if self.book.seen.contains(&(self.account, cl_ord_id.clone())) {
            return refuse("duplicate ClOrdID: a mass cancel with it was already taken", outbox);
        }
        let instrument = match message.get(tag::MASS_CANCEL_REQUEST_TYPE) {
            Some(b"7") => None,
            Some(b"1") => match self.instrument(message) {
                Some(instrument) => Some(instrument.id),
                None => return refuse("unknown symbol", outbox),
            },
            _ => return refuse("only MassCancelRequestType 1 (by symbol) and 7 (all) are supported", outbox),
        };
        let command = Command::CancelAll { account: self.account, instrument };
        self.requests.push(Request { command, annex: Annex { kind: b'q', cl_ord_id, orig_cl_ord_id: String::new() }, link: Link::None });
    }
}

impl Application for VenueApp<'_> {
    fn on_logon(&mut self, logon: &Message) -> Result<(), LogonRefusal> {
        match &self.credentials {
            Some(credentials) if !credentials_match(credentials, logon) => return Err(LogonRefusal { text: BAD_CREDENTIALS.into() }),
            // Bound by CompID in the configuration: credentials optional,
            // but a Username naming another account is not this session.
            None if logon.text(553).is_some_and(|user| user.parse::<AccountId>().ok() != Some(self.account)) => {
                return Err(LogonRefusal { text: format!("Logon refused: this CompID trades for account {}, not the one Username (553) names", self.account) });
            }
            _ => {}
        }
        match &self.busy {
            Some(other) => Err(LogonRefusal { text: busy_text(self.account, other) }),
            None => Ok(()),
        }
    }

    fn on_message(&mut self, message: &Message, _shape: &Shape, outbox: &mut Outbox<'_>) {
        match message.msg_type() {
            b"D" => self.new_order(message, outbox),
            b"F" | b"G" => self.cancel_or_replace(message, outbox),
            b"q" => self.mass_cancel(message, outbox),
            // A BusinessMessageReject is never answered with one (two
            // sides that did would answer each other for ever).
            b"j" => {}
            _ => outbox.business_reject(message, 3, "Unsupported Message Type"),
        }
    }
}

/// The Logout text of a Logon while the account is logged on as `other`.
pub(crate) fn busy_text(account: AccountId, other: &str) -> String {
    format!("Logon refused: account {account} is logged on as {other} (one FIX session per account at a time)")
}

/// The Logout text of a Logon with a wrong Username or Password.
pub(crate) const BAD_CREDENTIALS: &str = "Logon refused: bad Username (553) or Password (554)";

/// The Logon carries this Username (553) and Password (554); the
/// password compared in constant time. A Username is an account id, read
/// as a number (`03` is `3`), as a Logon's session is found by it.
pub(crate) fn credentials_match((user, password): &(String, String), logon: &Message) -> bool {
    let same_user = |u: &str| u == user || u.parse::<AccountId>().is_ok_and(|a| a.to_string() == *user);
    match (logon.text(553), logon.text(554)) {
        (Some(u), Some(p)) => same_user(u) && crate::config::keys_match(&pad(password), &pad(p)),
        _ => false,
    }
}

fn pad(text: &str) -> [u8; 32] {
    let mut key = [0u8; 32];
    let bytes = text.as_bytes();
    let n = bytes.len().min(32);
    key[..n].copy_from_slice(&bytes[..n]);
    if bytes.len() > 32 {
        // Longer than any key: never equal to a configured one.
        key[0] ^= 0xff;
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;
    use crossbook_engine::{Engine, InstrumentSpec, Symbol};

    fn symbol(text: &str) -> Symbol {
        Symbol::new(text).expect("a valid symbol")
    }

    /// A unit whose digits a u64 cannot carry is refused by name, not
    /// read as 1 by market data while FIX reads it as written.
    #[test]
    fn units_past_what_market_data_carries_are_refused() {
        let mut config = crate::config::Config::default();
        config.instruments[0].fix_price_unit = "18446744073709551615".into();
        assert!(instruments(&config.instruments).is_ok());
        for (unit, refused) in [("18446744073709551616", true), ("0.0000000000000000000000000001", false), ("0.0000000000000000000000000000001", true), ("0", true)] {
            config.instruments[0].fix_price_unit = unit.into();
            let checked = instruments(&config.instruments);
            assert_eq!(checked.is_err(), refused, "{unit}");
            if let Err(e) = checked {
                assert!(e.to_string().contains("fix_price_unit") && e.to_string().contains("at most 30 digits"), "{e}");
            }
        }
    }

    fn text(message: &Outgoing, tag: u32) -> Option<&str> {
        message.body.iter().find(|(t, _)| *t == tag).and_then(|(_, v)| std::str::from_utf8(v).ok())
    }

    /// Engine events to FIX messages, with no server around: a FIX order
    /// (journaled with its annex) rests, a binary order of another account
    /// fills it, and the open-order refusal of a second FIX order is
    /// answered with the gateway's own ExecID without using up its
    /// ClOrdID.
    #[test]
    fn engine_reports_become_fix_messages() {
        let units = |text: &str| Decimal::parse(text.as_bytes()).expect("a decimal");
        let instruments = [FixInstrument { id: 1, symbol: "BTC-USD".into(), price_unit: units("1"), qty_unit: units("0.01") }];
        let mut engine = Engine::new();
        let mut builder = crossbook_protocol::reports::ReportBuilder::new();
        let mut book = FixBook::new();
        let spec = InstrumentSpec {
            id: 1,
            symbol: symbol("BTC-USD"),
            base: 1,
            quote: 2,
            tick_size: 1,
            lot_size: 1,
            min_qty: 1,
            max_qty: 1_000,
            min_price: 1,
            max_price: 1_000_000,
            maker_bps: 0,
            taker_bps: 0,
        };
        let mut setup = vec![Command::AddAsset { id: 1, name: symbol("BTC") }, Command::AddAsset { id: 2, name: symbol("USD") }, Command::AddInstrument(spec)];
        for account in [1, 2] {
            setup.extend([Command::OpenAccount { account }, Command::Deposit { account, asset: 1, amount: 1_000 }, Command::Deposit { account, asset: 2, amount: 1_000_000 }]);
        }
        let mut events = Vec::new();
        for command in &setup {
            engine.apply(command, &mut events);
        }
        let mut follow = |book: &mut FixBook, command: Command, annex: Option<Annex>, refused: bool| {
            events.clear();
            let mut reports = Vec::new();
            if refused {
                if let Command::Place(place) = &command {
                    reports.push(Addressed { account: place.account, report: crossbook_protocol::ExecutionReport::open_order_refusal(place) });
                }
            } else {
                engine.apply(&command, &mut events);
                builder.reports(&command, &events, &mut reports);
            }
            let seq = if refused { 0 } else { engine.seq() };
            book.follow(&FixEvent { seq, command, annex, reports, refused }, &instruments, "20261123-00:00:00.000")
        };
        let place = |account, cid, side, price, qty| {
            Command::Place(PlaceOrder { account, instrument: 1, cid, side, order_type: OrderType::Limit, tif: TimeInForce::Gtc, price, qty, post_only: false, stp: SelfTradePrevention::None, budget: None })
        };
        let annex = |id: &str| Some(Annex { kind: b'D', cl_ord_id: id.into(), orig_cl_ord_id: String::new() });

        let out = follow(&mut book, place(1, FIX_CID_BASE + 1, Side::Sell, 100, 500), annex("A1"), false);
        assert_eq!(out.len(), 1);
        let new = &out[0];
        assert_eq!((new.account, new.msg_type), (1, "8"));
        for (tag, value) in [(tag::CL_ORD_ID, "A1"), (tag::EXEC_TYPE, "0"), (tag::ORD_STATUS, "0"), (tag::ORDER_QTY, "5"), (tag::PRICE, "100"), (tag::SIDE, "2"), (tag::LEAVES_QTY, "5"), (tag::CUM_QTY, "0")] {
            assert_eq!(text(new, tag), Some(value), "tag {tag}");
        }
        let order_id = text(new, tag::ORDER_ID).expect("OrderID").to_owned();

        // Account 2's binary order takes 2.00 of it: only account 1's side
        // is FIX's to report (account 2 has no FIX session here, but the
        // book reports every account's fills; the gateway routes them).
        let out = follow(&mut book, place(2, 7, Side::Buy, 100, 200), None, false);
        let fill = out.iter().find(|m| m.account == 1).expect("the maker's fill");
        for (tag, value) in [(tag::CL_ORD_ID, "A1"), (tag::EXEC_TYPE, "F"), (tag::ORD_STATUS, "1"), (tag::LAST_QTY, "2"), (tag::LAST_PX, "100"), (tag::CUM_QTY, "2"), (tag::LEAVES_QTY, "3"), (tag::ORDER_ID, order_id.as_str())] {
            assert_eq!(text(fill, tag), Some(value), "tag {tag}");
        }

        // Refused before the engine: the gateway's ExecID, OrdRejReason 99,
        // and the ClOrdID free for another try.
        let out = follow(&mut book, place(1, FIX_CID_BASE + 2, Side::Sell, 101, 100), annex("A2"), true);
        assert_eq!(out.len(), 1);
        let refusal = &out[0];
        for (tag, value) in [(tag::CL_ORD_ID, "A2"), (tag::EXEC_TYPE, "8"), (tag::ORD_STATUS, "8"), (tag::ORD_REJ_REASON, "99"), (tag::TEXT, "open order limit reached"), (tag::ORDER_ID, "NONE")] {
            assert_eq!(text(refusal, tag), Some(value), "tag {tag}");
        }
        assert!(text(refusal, tag::EXEC_ID).is_some_and(|id| id.starts_with("gw-")));
        assert!(!book.seen.contains(&(1, "A2".to_string())), "a refused ClOrdID is not used up");
        let out = follow(&mut book, place(1, FIX_CID_BASE + 3, Side::Sell, 101, 100), annex("A2"), false);
        assert_eq!(text(&out[0], tag::EXEC_TYPE), Some("0"));
        assert!(book.seen.contains(&(1, "A2".to_string())));

        // A checkpoint restores the same book (open orders, ClOrdIDs, the
        // fills' notional, the next client id); damage is refused.
        let bytes = book.checkpoint();
        let restored = FixBook::restore(&bytes).expect("a checkpoint restores");
        assert_eq!(restored.checkpoint(), bytes);
        assert_eq!(restored.order_by_cl_ord_id(1, "A1"), book.order_by_cl_ord_id(1, "A1"));
        assert_eq!(restored.order_by_cl_ord_id(1, "A2"), book.order_by_cl_ord_id(1, "A2"));
        assert_eq!(restored.next_cid, book.next_cid);
        assert!(restored.seen.contains(&(1, "A1".to_string())), "an open order's ClOrdID stays taken");
        for cut in 0..bytes.len() {
            assert!(FixBook::restore(&bytes[..cut]).is_err(), "cut at {cut}");
        }
    }

    /// FIX bytes to engine commands, with no server around: a session
    /// with the venue application logs on, then a NewOrderSingle becomes a
    /// `place` (price and quantity in ticks and lots, the gateway's client
    /// id, the ClOrdID in the annex), a Day order and a cancel of an
    /// unknown ClOrdID are answered at once, with no command.
    #[test]
    fn fix_messages_become_engine_commands() {
        use crossbook_fix::session::{Action, Session, SessionConfig};
        use crossbook_fix::wire::Builder;
        let units = |text: &str| Decimal::parse(text.as_bytes()).expect("a decimal");
        let instruments = [FixInstrument { id: 1, symbol: "BTC-USD".into(), price_unit: units("1"), qty_unit: units("0.01") }];
        let mut book = FixBook::new();
        let mut session = Session::new(SessionConfig::new("CROSSBOOK", "ALICE"), std::sync::Arc::new(crossbook_fix::dictionary::Dictionary::builtin()));
        let now = 1_790_000_000_000i64;
        session.connect(now);
        let mut next = 1u64;
        let mut message = |msg_type: &str, body: &[(u32, &str)]| {
            let mut b = Builder::new();
            b.str(35, msg_type).num(34, next).str(49, "ALICE").str(52, &crossbook_fix::time::format_timestamp(now)).str(56, "CROSSBOOK");
            for (tag, value) in body {
                b.str(*tag, value);
            }
            next += 1;
            b.finish("FIX.4.4")
        };
        let mut feed = |book: &mut FixBook, raw: Vec<u8>| {
            let mut requests = Vec::new();
            let mut actions = Vec::new();
            let mut app = VenueApp { account: 1, book, instruments: &instruments, requests: &mut requests, now: "20261123-00:00:00.000".into(), now_ms: now, credentials: None, busy: None };
            session.on_message(&raw, now, &mut app, &mut actions);
            let sent: Vec<Message> = actions.iter().filter_map(|a| if let Action::Send(bytes) = a { Message::parse(bytes).ok() } else { None }).collect();
            (requests, sent)
        };
        let (requests, sent) = feed(&mut book, message("A", &[(98, "0"), (108, "30")]));
        assert!(requests.is_empty());
        assert_eq!(sent.iter().map(|m| m.msg_type().to_vec()).collect::<Vec<_>>(), [b"A".to_vec()]);

        let (requests, sent) = feed(&mut book, message("D", &[(11, "A1"), (38, "2.5"), (40, "2"), (44, "100"), (54, "1"), (55, "BTC-USD"), (59, "3"), (60, "20261123-00:00:00")]));
        assert!(sent.is_empty(), "nothing is answered before the engine has decided");
        // Where the sequencer is to write A1's order id.
        let Some(Request { link: Link::Records(placed), .. }) = requests.first() else { panic!("a place that records its order id: {requests:?}") };
        let placed = placed.clone();
        let expected = Request {
            command: Command::Place(PlaceOrder {
                account: 1,
                instrument: 1,
                cid: FIX_CID_BASE + 1,
                side: Side::Buy,
                order_type: OrderType::Limit,
                tif: TimeInForce::Ioc,
                price: 100,
                qty: 250,
                post_only: false,
                stp: SelfTradePrevention::None,
                budget: None,
            }),
            annex: Annex { kind: b'D', cl_ord_id: "A1".into(), orig_cl_ord_id: String::new() },
            link: Link::Records(placed.clone()),
        };
        assert_eq!(requests, [expected]);

        let (requests, sent) = feed(&mut book, message("D", &[(11, "A2"), (38, "1"), (40, "2"), (44, "100"), (54, "1"), (55, "BTC-USD"), (59, "0"), (60, "20261123-00:00:00")]));
        assert!(requests.is_empty());
        assert_eq!(sent.len(), 1);
        assert_eq!((sent[0].text(tag::EXEC_TYPE), sent[0].text(tag::CL_ORD_ID), sent[0].text(tag::ORD_REJ_REASON)), (Some("8"), Some("A2"), Some("99")));
        assert!(sent[0].text(tag::TEXT).is_some_and(|t| t.starts_with("TimeInForce 0 (Day) is not supported")));

        let (requests, sent) = feed(&mut book, message("F", &[(11, "C1"), (41, "NOBODY"), (54, "1"), (55, "BTC-USD"), (60, "20261123-00:00:00")]));
        assert!(requests.is_empty());
        assert_eq!(sent.len(), 1);
        assert_eq!((sent[0].msg_type(), sent[0].text(tag::CXL_REJ_REASON), sent[0].text(tag::CXL_REJ_RESPONSE_TO)), (&b"9"[..], Some("1"), Some("1")));
        assert_eq!((sent[0].text(tag::ORDER_ID), sent[0].text(tag::ORD_STATUS)), (Some("NONE"), Some("8")));

        // A1 is still on its way to the engine: a replace and a cancel
        // name its place, for the sequencer to put in its order id.
        let (requests, sent) = feed(&mut book, message("G", &[(11, "A3"), (38, "2"), (40, "2"), (41, "A1"), (54, "1"), (55, "BTC-USD"), (60, "20261123-00:00:00")]));
        assert!(sent.is_empty());
        let replace = Request {
            command: Command::Replace { account: 1, order: 0, price: 100, qty: 200 },
            annex: Annex { kind: b'G', cl_ord_id: "A3".into(), orig_cl_ord_id: "A1".into() },
            link: Link::Names(placed.clone()),
        };
        assert_eq!(requests, [replace], "a replace without Price keeps the price A1 was sent with");
        let (requests, sent) = feed(&mut book, message("F", &[(11, "C2"), (41, "A1"), (54, "1"), (55, "BTC-USD"), (60, "20261123-00:00:00")]));
        assert!(sent.is_empty());
        let cancel = Request { command: Command::Cancel { account: 1, order: 0 }, annex: Annex { kind: b'F', cl_ord_id: "C2".into(), orig_cl_ord_id: "A1".into() }, link: Link::Names(placed.clone()) };
        assert_eq!(requests, [cancel]);
        // What it says of the order is checked against what A1 was sent as.
        let (requests, sent) = feed(&mut book, message("F", &[(11, "C3"), (41, "A1"), (54, "2"), (55, "BTC-USD"), (60, "20261123-00:00:00")]));
        assert!(requests.is_empty());
        assert_eq!((sent[0].text(tag::CXL_REJ_REASON), sent[0].text(tag::TEXT)), (Some("99"), Some("Side is not the order's")));
        // The order stays as it is: Pending New, no OrderID yet (an
        // unknown order's reject, above, says Rejected).
        assert_eq!((sent[0].text(tag::ORDER_ID), sent[0].text(tag::ORD_STATUS)), (Some("NONE"), Some("A")));
        // A3, the name the replace gives, is not the order's until the
        // replace is applied: it could yet be refused.
        let (requests, sent) = feed(&mut book, message("F", &[(11, "C4"), (41, "A3"), (54, "1"), (55, "BTC-USD"), (60, "20261123-00:00:00")]));
        assert!(requests.is_empty());
        assert_eq!(
            (sent[0].text(tag::CXL_REJ_REASON), sent[0].text(tag::TEXT)),
            (Some("99"), Some("the replace that gave the order this ClOrdID is not acknowledged yet: send this after its ExecutionReport"))
        );
    }

    #[test]
    fn annexes_round_trip_and_refuse_junk() {
        let annex = Annex { kind: b'G', cl_ord_id: "new-7".into(), orig_cl_ord_id: "old-6".into() };
        assert_eq!(Annex::decode(&annex.encode()), Some(annex));
        assert_eq!(Annex::decode(b"X\x00\x00"), None);
        assert_eq!(Annex::decode(b"D\x05ab"), None);
    }
}
