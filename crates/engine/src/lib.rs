//! crossbook's exchange core: order books, matching, accounts, settlement.
//!
//! A pure state machine: [`Engine::apply`] takes a [`Command`] and appends
//! the [`Event`]s it caused. No I/O, no clock, no randomness, no iteration
//! over hash maps: the same commands always give the same events. The rules
//! are specified in `docs/engine.md`.
//!
//! ```
//! use crossbook_engine::*;
//! let mut engine = Engine::new();
//! let mut events = Vec::new();
//! engine.apply(&Command::OpenAccount { account: 7 }, &mut events);
//! assert_eq!(events[0].kind, EventKind::AccountOpened { account: 7 });
//! ```

pub mod arena;
mod balance_lines;
pub mod codec;
pub mod book;
pub(crate) mod cid;
mod engine;
pub mod hash;
mod invariants;
mod snapshot;
pub mod stages;
pub mod table;
pub mod types;

pub use balance_lines::BalanceLines;
pub use engine::{Balance, Engine, OrderView, fee};
pub use snapshot::{STATE_VERSION, StateError};
pub use types::*;
