//! Where the engine's time goes, for profiling builds.
//!
//! With the `stage-clock` feature, one command in [`SAMPLE_EVERY`] reads a
//! clock at each stage boundary and adds the time since the last boundary
//! to the stage it leaves. Without the feature every function here is an
//! empty inline stub and the engine reads no clock. Either way the readings
//! never influence what the engine does, so its events are the same.
//!
//! A sampled command pays about 20 ns per boundary it crosses, which lands
//! in the stage being measured; `crossbook bench` therefore only takes the
//! *proportions* from the sampled commands and applies them to the
//! unperturbed time per command of its throughput pass.

/// The stages of one command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Lookups and validation of the command, locking funds.
    Risk = 0,
    /// Walking and updating the book: matching, resting, cancelling.
    Matching = 1,
    /// Settling trades: balance moves, fees, trade events.
    Settlement = 2,
}

pub const STAGES: usize = 3;
pub const SAMPLE_EVERY: u64 = 64;

/// Nanoseconds per stage over the sampled commands, and how many.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StageTotals {
    pub nanos: [u64; STAGES],
    pub samples: u64,
}

#[cfg(feature = "stage-clock")]
mod clock {
    use super::*;
    use std::cell::Cell;
    use std::time::Instant;

    thread_local! {
        static ACTIVE: Cell<Option<(Stage, Instant)>> = const { Cell::new(None) };
        static TOTALS: Cell<StageTotals> = const { Cell::new(StageTotals { nanos: [0; STAGES], samples: 0 }) };
    }

    fn close(now: Instant) {
        if let Some((stage, since)) = ACTIVE.get() {
            let mut totals = TOTALS.get();
            totals.nanos[stage as usize] += now.duration_since(since).as_nanos() as u64;
            TOTALS.set(totals);
        }
    }

    pub fn begin(seq: u64) {
        if seq % SAMPLE_EVERY == 0 {
            let mut totals = TOTALS.get();
            totals.samples += 1;
            TOTALS.set(totals);
            ACTIVE.set(Some((Stage::Risk, Instant::now())));
        }
    }

    pub fn enter(stage: Stage) {
        if ACTIVE.get().is_some() {
            let now = Instant::now();
            close(now);
            ACTIVE.set(Some((stage, now)));
        }
    }

    pub fn end() {
        if ACTIVE.get().is_some() {
            close(Instant::now());
            ACTIVE.set(None);
        }
    }

    pub fn take() -> Option<StageTotals> {
        Some(TOTALS.replace(StageTotals::default()))
    }
}

#[cfg(not(feature = "stage-clock"))]
mod clock {
    use super::*;

    #[inline(always)]
    pub fn begin(_seq: u64) {}
    #[inline(always)]
    pub fn enter(_stage: Stage) {}
    #[inline(always)]
    pub fn end() {}
    pub fn take() -> Option<StageTotals> {
        None
    }
}

pub(crate) use clock::{begin, end, enter};

/// The totals of this thread since the last call; `None` in builds without
/// the `stage-clock` feature.
pub fn take() -> Option<StageTotals> {
    clock::take()
}
