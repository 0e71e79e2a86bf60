//! Deposits and withdrawals made through the operator's endpoints
//! (`docs/trading.md`, "Deposits and withdrawals"), by the reference the
//! operator gave each: a request retried after a lost answer is told what
//! became of the first (and nothing is moved twice), and a reference can
//! be looked up. A function of the journal like the rest of this crate:
//! each transfer's reference is journaled with its command (the REST
//! gateway's annex), and the last [`TRANSFERS_KEPT`] are kept in the
//! checkpoint.

use crate::codec::{CodecError, Reader};
use crossbook_engine::{AccountId, AssetId, RejectReason};
use std::collections::{HashMap, VecDeque};

/// Transfers remembered by reference; the oldest is forgotten past it.
pub const TRANSFERS_KEPT: usize = 1_000_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Deposit,
    Withdrawal,
}

/// One deposit or withdrawal, as the engine took it or refused it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transfer {
    /// The journal sequence number of its command.
    pub seq: u64,
    pub time_ms: u64,
    pub account: AccountId,
    pub asset: AssetId,
    pub amount: u64,
    pub direction: Direction,
    /// Why the engine refused it (nothing moved), if it did.
    pub refused: Option<RejectReason>,
}

/// The transfers kept, by reference, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Transfers {
    /// SipHash (std's), not foldhash: its keys are text a client chooses.
    by_reference: HashMap<String, Transfer>,
    order: VecDeque<String>,
}

impl Transfers {
    pub fn get(&self, reference: &str) -> Option<&Transfer> {
        self.by_reference.get(reference)
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Records `transfer` under `reference` (a reference is journaled once:
    /// its gateway refuses a second use while the first is remembered).
    pub fn record(&mut self, reference: &str, transfer: Transfer) {
        if self.by_reference.insert(reference.to_string(), transfer).is_none() {
            self.order.push_back(reference.to_string());
        }
        while self.order.len() > TRANSFERS_KEPT {
            if let Some(oldest) = self.order.pop_front() {
                self.by_reference.remove(&oldest);
            }
        }
    }

    /// Count u64, then oldest first: reference (length u8, bytes), seq,
    /// time_ms, account u64, asset u32, amount u64, direction u8 (0
    /// deposit, 1 withdrawal), refusal u8 (0, or the reject code).
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.order.len() as u64).to_le_bytes());
        for reference in &self.order {
            let Some(t) = self.by_reference.get(reference) else { continue };
            out.push(reference.len() as u8);
            out.extend_from_slice(reference.as_bytes());
            for value in [t.seq, t.time_ms, t.account] {
                out.extend_from_slice(&value.to_le_bytes());
            }
            out.extend_from_slice(&t.asset.to_le_bytes());
            out.extend_from_slice(&t.amount.to_le_bytes());
            out.push(match t.direction {
                Direction::Deposit => 0,
                Direction::Withdrawal => 1,
            });
            out.push(t.refused.map_or(0, RejectReason::code));
        }
    }

    pub(crate) fn restore(&mut self, r: &mut Reader<'_>) -> Result<(), CodecError> {
        self.by_reference.clear();
        self.order.clear();
        let count = r.count(true, 39)?;
        for _ in 0..count {
            let length = r.u8()? as usize;
            let reference = String::from_utf8(r.take(length)?.to_vec()).map_err(|_| CodecError("a transfer reference that is not UTF-8".into()))?;
            let (seq, time_ms, account, asset, amount) = (r.u64()?, r.u64()?, r.u64()?, r.u32()?, r.u64()?);
            let direction = match r.u8()? {
                0 => Direction::Deposit,
                1 => Direction::Withdrawal,
                other => return Err(CodecError(format!("transfer {reference}: direction {other}"))),
            };
            let refused = match r.u8()? {
                0 => None,
                code => Some(RejectReason::from_code(code).ok_or_else(|| CodecError(format!("transfer {reference}: reject code {code}")))?),
            };
            self.record(&reference, Transfer { seq, time_ms, account, asset, amount, direction, refused });
        }
        Ok(())
    }
}
