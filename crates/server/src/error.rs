//! Why `crossbook serve` could not start or had to stop.
//!
//! Every variant is something an operator acts on differently: fix the
//! configuration, look at the data directory (recovery or corruption), free
//! the disk (the journal), look at the FIX stores, or at the machine (a
//! socket or thread that could not be set up). A client never sees these:
//! it gets the protocol's own errors (`docs/protocol.md`, `docs/fix.md`).

use crate::fix::FixError;
use crossbook_journal::{Corruption, JournalError, RecoveryError};

#[derive(Debug)]
pub enum ServeError {
    /// The configuration cannot be served (which key, and why), or its
    /// reference data cannot be set up.
    Config(crate::config::ConfigError),
    /// Recovery could not rebuild the venue from the data directory.
    Recovery(RecoveryError),
    /// Reading the journal back to rebuild the report histories failed.
    History(Corruption),
    /// The journal failed (a write or sync: a full disk, say): nothing more
    /// can be made durable, so the venue stops.
    Journal(JournalError),
    /// The FIX gateway could not start.
    Fix(FixError),
    /// A socket, the poll or a thread could not be set up, or failed.
    Io { what: String, source: std::io::Error },
    /// The replicated log (NATS JetStream) could not be reached or read.
    Replication(crossbook_replication::ReplicationError),
    /// Another node leads now (the log moved on past this one's last
    /// append, or its lease was lost): this node stops acknowledging at
    /// once; started again, it follows.
    Deposed(String),
    /// The local journal holds commands the replicated log does not, in a
    /// way start-up cannot repair on its own.
    Diverged(String),
}

impl ServeError {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ServeError {
        let what = what.into();
        move |source| ServeError::Io { what, source }
    }
}

impl ServeError {
    /// NATS could not be reached or answered with an error (not ready
    /// yet, electing): worth trying again, unlike a corrupt log or a
    /// journal that disagrees with it.
    pub fn is_nats_unavailable(&self) -> bool {
        matches!(self, ServeError::Replication(crossbook_replication::ReplicationError::Nats(_)))
    }
}

impl std::fmt::Display for ServeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServeError::Config(e) => write!(f, "configuration: {e}"),
            ServeError::Recovery(e) => write!(f, "recovery: {e}"),
            ServeError::History(e) => write!(f, "rebuilding the report histories from the journal: {e}"),
            ServeError::Journal(e) => write!(f, "journal: {e}"),
            ServeError::Fix(e) => write!(f, "FIX gateway: {e}"),
            ServeError::Io { what, source } => write!(f, "{what}: {source}"),
            ServeError::Replication(e) => write!(f, "replication: {e}"),
            ServeError::Deposed(why) => write!(f, "no longer the leader: {why}"),
            ServeError::Diverged(why) => write!(f, "the local journal and the replicated log disagree: {why}"),
        }
    }
}

impl From<crossbook_replication::ReplicationError> for ServeError {
    fn from(e: crossbook_replication::ReplicationError) -> ServeError {
        match e {
            crossbook_replication::ReplicationError::Deposed(why) => ServeError::Deposed(why),
            other => ServeError::Replication(other),
        }
    }
}

/// Each message already says what caused it (`configuration: <why>`), so
/// no source is chained: a reporter that prints the chain (anyhow's `{:#}`)
/// would say it twice.
impl std::error::Error for ServeError {}

impl From<JournalError> for ServeError {
    fn from(e: JournalError) -> ServeError {
        ServeError::Journal(e)
    }
}

impl From<crate::config::ConfigError> for ServeError {
    fn from(e: crate::config::ConfigError) -> ServeError {
        ServeError::Config(e)
    }
}

impl From<RecoveryError> for ServeError {
    fn from(e: RecoveryError) -> ServeError {
        ServeError::Recovery(e)
    }
}

impl From<FixError> for ServeError {
    fn from(e: FixError) -> ServeError {
        ServeError::Fix(e)
    }
}
