//! Clients of `crossbook serve`, written from `docs/protocol.md` and
//! `docs/fix.md` alone: [`binary::Client`] for the binary order-entry
//! protocol and [`fix::Initiator`] for FIX 4.4. Both are blocking and
//! small: connect, log in, send, receive with a time-out. `crossbook load`
//! and the end-to-end tests use them; neither knows anything the server's
//! code would tell it.

pub mod binary;
pub mod fix;

use std::time::Duration;

/// How long `recv` waits for a message by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a client call failed.
#[derive(Debug)]
pub enum ClientError {
    /// The socket failed.
    Io(std::io::Error),
    /// The server sent bytes that are not a valid message.
    Garbled(String),
    /// The server closed the connection (or reset it) before the answer.
    Closed,
    /// Nothing came within the time-out.
    TimedOut,
    /// The server refused (a login or logon): what it said.
    Refused(String),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::Io(e) => write!(f, "{e}"),
            ClientError::Garbled(what) => write!(f, "garbled message from the server: {what}"),
            ClientError::Closed => f.write_str("the server closed the connection"),
            ClientError::TimedOut => f.write_str("no answer from the server in time"),
            ClientError::Refused(what) => write!(f, "refused by the server: {what}"),
        }
    }
}

impl std::error::Error for ClientError {}

impl From<std::io::Error> for ClientError {
    fn from(e: std::io::Error) -> ClientError {
        ClientError::Io(e)
    }
}

/// Reads once from `stream` into `buffer`: `Ok(false)` when the peer has
/// closed (or reset) the connection, `Ok(true)` after bytes or a read
/// time-out.
fn read_some(stream: &mut std::net::TcpStream, buffer: &mut Vec<u8>) -> Result<bool, ClientError> {
    use std::io::{ErrorKind, Read};
    let mut chunk = [0u8; 4096];
    match stream.read(&mut chunk) {
        Ok(0) => Ok(false),
        Ok(n) => {
            buffer.extend_from_slice(&chunk[..n]);
            Ok(true)
        }
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => Ok(true),
        Err(e) if matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted) => Ok(false),
        Err(e) => Err(ClientError::Io(e)),
    }
}
