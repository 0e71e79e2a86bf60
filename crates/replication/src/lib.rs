//! crossbook's replicated command log on NATS JetStream
//! (`docs/replication.md`): the messages (`batch`), the log and the
//! leader lease (`log`).

pub mod batch;
pub mod log;

pub use log::{Appender, Config, Delivered, Leader, Log, Position, Reader, ReplicationError};
