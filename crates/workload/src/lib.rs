//! Named, seeded workloads (`docs/benchmarks.md` describes each).
//!
//! A generator may look at the engine's state to choose its next command
//! (which orders are still open, where an order rests): [`generate`] runs a
//! private engine alongside, applying each command as it is made. The
//! result depends only on the workload, the seed and the count.

use crossbook_engine::*;

mod mixed;
pub mod multisymbol;
pub mod placecancel;
pub mod rng;
mod steady;

pub use rng::Rng;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// Every command, order type, STP mode and reject reason, on several
    /// instruments and 128 accounts: the differential-test workload.
    Mixed,
    /// One instrument, ~512 resting orders, random sides in a 64-tick band:
    /// the shape of qsl's published benchmark.
    SteadyDeep,
    /// 1.3M orders and cancels, 1,000 accounts, one instrument, 30%
    /// crossing, log-normal sizes: the shape of the 0xInfinity dataset.
    PlaceCancel,
    /// 1,000 instruments, 100,000 accounts, Zipf-like popularity.
    MultiSymbol,
}

impl Workload {
    pub const ALL: [Workload; 4] = [Workload::Mixed, Workload::SteadyDeep, Workload::PlaceCancel, Workload::MultiSymbol];

    pub fn name(self) -> &'static str {
        match self {
            Workload::Mixed => "mixed",
            Workload::SteadyDeep => "steady-deep",
            Workload::PlaceCancel => "place-cancel",
            Workload::MultiSymbol => "multi-symbol",
        }
    }

    pub fn from_name(name: &str) -> Option<Workload> {
        Self::ALL.into_iter().find(|w| w.name() == name)
    }
}

/// Produces commands one at a time, seeing the state the earlier ones left.
pub trait Generator {
    fn next(&mut self, engine: &Engine) -> Command;
}

pub fn generator(workload: Workload, seed: u64) -> Box<dyn Generator> {
    match workload {
        Workload::Mixed => Box::new(mixed::Mixed::new(seed)),
        Workload::SteadyDeep => Box::new(steady::SteadyDeep::new(seed)),
        Workload::PlaceCancel => Box::new(placecancel::PlaceCancel::new(seed)),
        Workload::MultiSymbol => Box::new(multisymbol::MultiSymbol::new(seed)),
    }
}

/// The first `count` commands of `workload` for `seed` (set-up included).
pub fn generate(workload: Workload, seed: u64, count: usize) -> Vec<Command> {
    let mut generator = generator(workload, seed);
    let mut engine = Engine::new();
    let mut events = Vec::new();
    // Reserved up to a bound: `count` is the caller's (a command line's).
    let mut commands = Vec::with_capacity(count.min(1 << 22));
    for _ in 0..count {
        let command = generator.next(&engine);
        events.clear();
        engine.apply(&command, &mut events);
        commands.push(command);
    }
    commands
}

pub(crate) fn symbol(text: &str) -> Symbol {
    Symbol::new(text).expect("generator symbols are valid")
}
