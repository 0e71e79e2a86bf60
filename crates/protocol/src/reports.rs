//! From engine events to execution reports, each addressed to the account
//! that owns the order: what the binary and FIX gateways send.
//!
//! The engine's events say what happened; a trader wants, per order, what
//! it now stands at (cumulative and remaining quantity). [`ReportBuilder`]
//! keeps the little state that needs: every open order's account, client
//! id, instrument, side, price, quantity and filled quantity. After a
//! restart it is rebuilt from the recovered engine
//! ([`ReportBuilder::from_engine`]).

use crate::{ExecutionReport, ReportKind};
use crossbook_engine::*;
use std::collections::HashMap;

#[derive(Clone, Copy, Debug)]
struct OrderState {
    account: AccountId,
    cid: ClientOrderId,
    instrument: InstrumentId,
    side: Side,
    price: i64,
    qty: u64,
    filled: u64,
}

/// An execution report and the account it is for. Its `seq` is 0 here:
/// the session numbers it when it queues it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Addressed {
    pub account: AccountId,
    pub report: ExecutionReport,
}

#[derive(Default)]
pub struct ReportBuilder {
    orders: HashMap<OrderId, OrderState>,
    /// Open orders per account.
    per_account: HashMap<AccountId, usize>,
}

/// The wire code of a cancel reason (`docs/protocol.md`).
pub fn cancel_code(reason: CancelReason) -> u8 {
    match reason {
        CancelReason::User => 1,
        CancelReason::Ioc => 2,
        CancelReason::Stp => 3,
        CancelReason::Replace => 4,
        CancelReason::CancelAll => 5,
    }
}

/// The cancel reason of a wire code, if it is one.
pub fn cancel_reason(code: u8) -> Option<CancelReason> {
    [CancelReason::User, CancelReason::Ioc, CancelReason::Stp, CancelReason::Replace, CancelReason::CancelAll].into_iter().find(|r| cancel_code(*r) == code)
}

/// Why an order or request was refused: by the engine, or by the server's
/// open-order limit before the engine saw it (`docs/protocol.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    Engine(RejectReason),
    /// `limits.open_orders`: wire code 100, `seq` 0, never journaled.
    OpenOrderLimit,
    /// A follower of a replicated venue takes no orders: wire code 101,
    /// `seq` 0, never journaled (a Redirect to the leader follows).
    NotLeader,
}

/// The wire code of [`Refusal::OpenOrderLimit`]: above every engine
/// reason, so the two can never meet.
pub const OPEN_ORDER_LIMIT: u8 = 100;
/// The wire code of [`Refusal::NotLeader`].
pub const NOT_LEADER: u8 = 101;

impl Refusal {
    pub fn code(self) -> u8 {
        match self {
            Refusal::Engine(reason) => reason.code(),
            Refusal::OpenOrderLimit => OPEN_ORDER_LIMIT,
            Refusal::NotLeader => NOT_LEADER,
        }
    }

    pub fn from_code(code: u8) -> Option<Refusal> {
        match code {
            OPEN_ORDER_LIMIT => Some(Refusal::OpenOrderLimit),
            NOT_LEADER => Some(Refusal::NotLeader),
            code => RejectReason::from_code(code).map(Refusal::Engine),
        }
    }

    /// The name `docs/protocol.md` gives it (the engine's for its own).
    pub fn name(self) -> &'static str {
        match self {
            Refusal::Engine(reason) => reason.name(),
            Refusal::OpenOrderLimit => "open_order_limit",
            Refusal::NotLeader => "not_leader",
        }
    }
}

impl ExecutionReport {
    /// Why a `Rejected` report refused (`None` for any other kind).
    pub fn refusal(&self) -> Option<Refusal> {
        (self.kind == ReportKind::Rejected).then(|| Refusal::from_code(self.reason)).flatten()
    }

    /// Why a `Cancelled` report's order ended (`None` for any other kind).
    pub fn cancel_reason(&self) -> Option<CancelReason> {
        (self.kind == ReportKind::Cancelled).then(|| cancel_reason(self.reason)).flatten()
    }

    /// The refusal of `place` by the open-order limit: not from the
    /// engine, not journaled, so outside the numbered stream (`seq` 0).
    pub fn open_order_refusal(place: &PlaceOrder) -> ExecutionReport {
        ExecutionReport { cid: place.cid, instrument: place.instrument, side: place.side, price: place.price, ..ExecutionReport::unnumbered_refusal(OPEN_ORDER_LIMIT) }
    }

    /// A refusal the server makes itself (a `Refusal` that is not the
    /// engine's): `rejected` with `reason`, `seq` 0, every other field 0
    /// (the caller fills in what it names).
    pub fn unnumbered_refusal(reason: u8) -> ExecutionReport {
        ExecutionReport { reason, ..ReportBuilder::bare(ReportKind::Rejected, 0) }
    }
}

/// Every engine reject code is below [`OPEN_ORDER_LIMIT`].
const _: () = assert!((RejectReason::ALL.len() as u8) < OPEN_ORDER_LIMIT && RejectReason::NotHalted as u8 == RejectReason::ALL.len() as u8);

impl ReportBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    /// The state of every order open in `engine` (after recovery).
    pub fn from_engine(engine: &Engine) -> Self {
        let mut builder = ReportBuilder::default();
        for v in engine.open_order_views() {
            builder.insert(v.id, OrderState { account: v.account, cid: v.cid, instrument: v.instrument, side: v.side, price: v.price, qty: v.qty, filled: v.filled });
        }
        builder
    }

    /// (account, total quantity, filled) of an order being tracked.
    pub fn order(&self, order: OrderId) -> Option<(AccountId, u64, u64)> {
        self.orders.get(&order).map(|s| (s.account, s.qty, s.filled))
    }

    /// Orders tracked (the engine's open orders, once a command is done).
    pub fn open_orders(&self) -> usize {
        self.orders.len()
    }

    /// Open orders of one account.
    pub fn open_orders_of(&self, account: AccountId) -> usize {
        self.per_account.get(&account).copied().unwrap_or(0)
    }

    fn insert(&mut self, order: OrderId, state: OrderState) {
        if self.orders.insert(order, state).is_none() {
            *self.per_account.entry(state.account).or_default() += 1;
        }
    }

    fn remove(&mut self, order: OrderId) -> Option<OrderState> {
        let state = self.orders.remove(&order)?;
        if let Some(count) = self.per_account.get_mut(&state.account) {
            *count -= 1;
            if *count == 0 {
                self.per_account.remove(&state.account);
            }
        }
        Some(state)
    }

    fn report(state: &OrderState, order: OrderId, kind: ReportKind) -> ExecutionReport {
        ExecutionReport {
            seq: 0,
            kind,
            order,
            cid: state.cid,
            instrument: state.instrument,
            side: state.side,
            price: state.price,
            last_qty: 0,
            last_price: 0,
            cum_qty: state.filled,
            leaves_qty: state.qty - state.filled,
            fee: 0,
            reason: 0,
        }
    }

    /// Appends the reports for one command and the events it caused.
    pub fn reports(&mut self, command: &Command, events: &[Event], out: &mut Vec<Addressed>) {
        let mut cancelled = 0u64;
        let mut rejected = false;
        for event in events {
            match event.kind {
                EventKind::Cancelled { reason: CancelReason::CancelAll, .. } => cancelled += 1,
                EventKind::Rejected { .. } => rejected = true,
                _ => {}
            }
        }
        self.order_reports(command, events, out);
        // A CancelAll always gets an answer, even with nothing to cancel.
        if let Command::CancelAll { account, instrument } = *command
            && !rejected
        {
            let mut report = Self::bare(ReportKind::CancelAllDone, 0);
            report.instrument = instrument.unwrap_or(0);
            report.last_qty = cancelled;
            out.push(Addressed { account, report });
        }
    }

    /// A report about no particular order.
    fn bare(kind: ReportKind, order: OrderId) -> ExecutionReport {
        ExecutionReport {
            seq: 0,
            kind,
            order,
            cid: 0,
            instrument: 0,
            side: Side::Buy,
            price: 0,
            last_qty: 0,
            last_price: 0,
            cum_qty: 0,
            leaves_qty: 0,
            fee: 0,
            reason: 0,
        }
    }

    fn order_reports(&mut self, command: &Command, events: &[Event], out: &mut Vec<Addressed>) {
        for event in events {
            match event.kind {
                EventKind::Rejected { reason } => {
                    if let Some(addressed) = self.rejection(command, reason) {
                        out.push(addressed);
                    }
                }
                EventKind::Accepted { order, account, instrument, cid, side, price, qty, .. } => {
                    let state = OrderState { account, cid, instrument, side, price, qty, filled: 0 };
                    self.insert(order, state);
                    out.push(Addressed { account, report: Self::report(&state, order, ReportKind::Accepted) });
                }
                EventKind::Trade { price, qty, maker, taker, maker_fee, taker_fee, .. } => {
                    for (order, fee) in [(maker, maker_fee), (taker, taker_fee)] {
                        if let Some(addressed) = self.fill(order, price, qty, fee) {
                            out.push(addressed);
                        }
                    }
                }
                EventKind::Cancelled { order, reason, .. } => {
                    if let Some(state) = self.remove(order) {
                        let mut report = Self::report(&state, order, ReportKind::Cancelled);
                        report.leaves_qty = 0;
                        report.reason = cancel_code(reason);
                        out.push(Addressed { account: state.account, report });
                    }
                }
                EventKind::Replaced { order, price, qty, .. } => {
                    if let Some(state) = self.orders.get_mut(&order) {
                        state.price = price;
                        state.qty = qty;
                        let state = *state;
                        out.push(Addressed { account: state.account, report: Self::report(&state, order, ReportKind::Replaced) });
                    }
                }
                _ => {}
            }
        }
    }

    fn fill(&mut self, order: OrderId, price: i64, qty: u64, fee: i64) -> Option<Addressed> {
        let state = self.orders.get_mut(&order)?;
        state.filled += qty;
        let state = *state;
        let done = state.filled == state.qty;
        let mut report = Self::report(&state, order, if done { ReportKind::Fill } else { ReportKind::PartialFill });
        report.last_qty = qty;
        report.last_price = price;
        report.fee = fee;
        if done {
            self.remove(order);
        }
        Some(Addressed { account: state.account, report })
    }

    /// The report of a refused command, for the account that sent it (an
    /// order command only; reference data and funds have no order).
    /// Someone else's order is answered exactly as an order that does not
    /// exist (`unknown_order`): order ids are global sequence numbers, and
    /// telling the two apart would let anyone find every live order.
    fn rejection(&self, command: &Command, reason: RejectReason) -> Option<Addressed> {
        let reason = if reason == RejectReason::NotOwner { RejectReason::UnknownOrder } else { reason };
        let (account, report) = match *command {
            Command::Place(p) => (
                p.account,
                ExecutionReport {
                    seq: 0,
                    kind: ReportKind::Rejected,
                    order: 0,
                    cid: p.cid,
                    instrument: p.instrument,
                    side: p.side,
                    price: p.price,
                    last_qty: 0,
                    last_price: 0,
                    cum_qty: 0,
                    leaves_qty: 0,
                    fee: 0,
                    reason: reason.code(),
                },
            ),
            Command::Cancel { account, order } | Command::Replace { account, order, .. } | Command::Amend { account, order, .. } => {
                // Only the owner learns about its own order; anyone else
                // gets a bare rejection.
                let own = self.orders.get(&order).filter(|s| s.account == account);
                let mut report = match own {
                    Some(state) => Self::report(state, order, ReportKind::Rejected),
                    None => Self::bare(ReportKind::Rejected, order),
                };
                report.reason = reason.code();
                (account, report)
            }
            Command::CancelAll { account, instrument } => {
                let mut report = Self::bare(ReportKind::Rejected, 0);
                report.instrument = instrument.unwrap_or(0);
                report.reason = reason.code();
                (account, report)
            }
            _ => return None,
        };
        Some(Addressed { account, report })
    }
}
