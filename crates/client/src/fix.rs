//! A FIX 4.4 initiator for `crossbook serve`'s FIX port (`docs/fix.md`):
//! the standard header on every message, MsgSeqNum counted, Logon by
//! Username (553) and Password (554). It does no session recovery of its
//! own (no store, no resend): a caller that wants a fresh sequence logs on
//! with ResetSeqNumFlag.

use crate::{ClientError, DEFAULT_TIMEOUT, read_some};
use crossbook_fix::time::format_timestamp;
use crossbook_fix::wire::{Builder, Frame, Message, frame, printable};
use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The server's CompID on the embedded defaults.
pub const DEFAULT_TARGET: &str = "CROSSBOOK";
/// Largest message read back.
const MAX_MESSAGE: usize = 1 << 20;

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// Writes messages with the header and the next MsgSeqNum.
pub struct Writer {
    pub comp_id: String,
    pub target: String,
    /// The next MsgSeqNum (34) to send.
    pub next_out: u64,
}

impl Writer {
    pub fn new(comp_id: &str) -> Writer {
        Writer { comp_id: comp_id.into(), target: DEFAULT_TARGET.into(), next_out: 1 }
    }

    /// One message: BeginString, BodyLength, MsgType, MsgSeqNum,
    /// SenderCompID, SendingTime, TargetCompID, then `body` in order, then
    /// CheckSum.
    pub fn message(&mut self, msg_type: &str, body: &[(u32, &str)]) -> Vec<u8> {
        let mut b = Builder::new();
        b.str(35, msg_type).num(34, self.next_out).str(49, &self.comp_id).str(52, &format_timestamp(now_ms())).str(56, &self.target);
        for (tag, value) in body {
            b.str(*tag, value);
        }
        self.next_out += 1;
        b.finish("FIX.4.4")
    }
}

/// One FIX connection.
pub struct Initiator {
    stream: TcpStream,
    buffer: Vec<u8>,
    pub writer: Writer,
    timeout: Duration,
}

impl Initiator {
    /// Connects as `comp_id` (no Logon yet).
    pub fn connect(address: &str, comp_id: &str) -> Result<Initiator, ClientError> {
        let stream = TcpStream::connect(address)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_millis(100)))?;
        Ok(Initiator { stream, buffer: Vec::new(), writer: Writer::new(comp_id), timeout: DEFAULT_TIMEOUT })
    }

    /// How long `recv` waits (10 s unless changed).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    pub fn send(&mut self, msg_type: &str, body: &[(u32, &str)]) -> Result<(), ClientError> {
        let raw = self.writer.message(msg_type, body);
        self.send_bytes(&raw)
    }

    /// Writes raw bytes (a test of what the server does with them).
    pub fn send_bytes(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        self.stream.write_all(bytes)?;
        Ok(())
    }

    /// Logs on as `account` with `key` (HeartBtInt 30; with `reset`,
    /// ResetSeqNumFlag Y: both sides start over at 1). Returns the Logon
    /// reply; anything else is `Refused` with the message.
    pub fn logon(&mut self, account: u64, key: &str, reset: bool) -> Result<Message, ClientError> {
        let account = account.to_string();
        let mut body = vec![(98, "0"), (108, "30")];
        if reset {
            body.push((141, "Y"));
        }
        body.extend([(553, account.as_str()), (554, key)]);
        self.send("A", &body)?;
        let reply = self.recv()?.ok_or(ClientError::Closed)?;
        if reply.msg_type() == b"A" { Ok(reply) } else { Err(ClientError::Refused(printable(reply.raw()))) }
    }

    /// The next message; `Ok(None)` once the server has closed the
    /// connection; `TimedOut` after the time-out.
    pub fn recv(&mut self) -> Result<Option<Message>, ClientError> {
        let deadline = Instant::now() + self.timeout;
        loop {
            match frame(&self.buffer, MAX_MESSAGE) {
                Frame::Message(n) => {
                    let raw: Vec<u8> = self.buffer.drain(..n).collect();
                    return Message::parse(&raw).map(Some).map_err(|e| ClientError::Garbled(format!("{e}: {}", printable(&raw))));
                }
                Frame::NeedMore => {}
                Frame::Garbage(_) => {
                    return Err(ClientError::Garbled(format!("not FIX (is this a FIX port?): {}", printable(&self.buffer[..self.buffer.len().min(64)]))));
                }
                Frame::TooLong => return Err(ClientError::Garbled(format!("a message longer than {MAX_MESSAGE} bytes"))),
            }
            if Instant::now() > deadline {
                return Err(ClientError::TimedOut);
            }
            if !read_some(&mut self.stream, &mut self.buffer)? {
                return match frame(&self.buffer, MAX_MESSAGE) {
                    Frame::Message(n) => {
                        let raw: Vec<u8> = self.buffer.drain(..n).collect();
                        Message::parse(&raw).map(Some).map_err(|e| ClientError::Garbled(e.to_string()))
                    }
                    _ => Ok(None),
                };
            }
        }
    }

    /// The next message that is not a Heartbeat (0).
    pub fn next_app(&mut self) -> Result<Message, ClientError> {
        loop {
            let message = self.recv()?.ok_or(ClientError::Closed)?;
            if message.msg_type() != b"0" {
                return Ok(message);
            }
        }
    }

    /// Waits (up to the time-out) for the server to close the connection,
    /// keeping what it sent meanwhile; whether it did.
    pub fn wait_closed(&mut self) -> Result<bool, ClientError> {
        let deadline = Instant::now() + self.timeout;
        while Instant::now() < deadline {
            if !read_some(&mut self.stream, &mut self.buffer)? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }

    /// The socket and the writer, for a caller that polls many sessions
    /// itself; the bytes already buffered come with them.
    pub fn into_parts(self) -> (TcpStream, Writer, Vec<u8>) {
        (self.stream, self.writer, self.buffer)
    }
}
