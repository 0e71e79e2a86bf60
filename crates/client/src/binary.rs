//! The binary order-entry protocol (`docs/protocol.md`), client side.

use crate::{ClientError, DEFAULT_TIMEOUT, read_some};
use crossbook_protocol::{API_KEY_BYTES, ClientMessage, Decoded, MAX_FRAME, ServerMessage, decode_server, encode_client};
use std::io::Write;
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// The API key field of a Login: `key`'s bytes, zero-padded. A longer key
/// is cut at `API_KEY_BYTES` (no configured key is longer, but its first
/// bytes could be one: refuse such a key before calling this).
pub fn api_key(key: &str) -> [u8; API_KEY_BYTES] {
    let mut field = [0u8; API_KEY_BYTES];
    let bytes = &key.as_bytes()[..key.len().min(API_KEY_BYTES)];
    field[..bytes.len()].copy_from_slice(bytes);
    field
}

/// One connection to the binary port.
pub struct Client {
    stream: TcpStream,
    buffer: Vec<u8>,
    timeout: Duration,
}

impl Client {
    /// Connects (no login yet), with Nagle off.
    pub fn connect(address: &str) -> Result<Client, ClientError> {
        Client::connect_within(address, DEFAULT_TIMEOUT)
    }

    /// [`Client::connect`], giving up on each of the address's resolutions
    /// after `patience`.
    pub fn connect_within(address: &str, patience: Duration) -> Result<Client, ClientError> {
        let mut last = None;
        let mut connected = None;
        for resolved in address.to_socket_addrs()? {
            match TcpStream::connect_timeout(&resolved, patience) {
                Ok(stream) => {
                    connected = Some(stream);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let stream = match (connected, last) {
            (Some(stream), _) => stream,
            (None, Some(e)) => return Err(e.into()),
            (None, None) => return Err(std::io::Error::new(std::io::ErrorKind::NotFound, format!("{address} resolves to no address")).into()),
        };
        stream.set_nodelay(true)?;
        // Short socket reads; `recv` keeps its own deadline.
        stream.set_read_timeout(Some(Duration::from_millis(100)))?;
        Ok(Client { stream, buffer: Vec::new(), timeout: DEFAULT_TIMEOUT })
    }

    /// Connects and logs in as `account` with `key`; `last_seen` is the
    /// last report sequence number already had (0: replay everything kept;
    /// `u64::MAX`: nothing). Returns the server's answer, accepted or not.
    pub fn login(address: &str, account: u64, key: &str, last_seen: u64) -> Result<(Client, ServerMessage), ClientError> {
        Client::login_within(address, account, key, last_seen, DEFAULT_TIMEOUT)
    }

    /// [`Client::login`], giving up after `patience` for the connection and
    /// again for the answer.
    pub fn login_within(address: &str, account: u64, key: &str, last_seen: u64, patience: Duration) -> Result<(Client, ServerMessage), ClientError> {
        let mut client = Client::connect_within(address, patience)?;
        client.set_timeout(patience);
        client.send(&ClientMessage::Login { account, api_key: api_key(key), last_seen })?;
        let reply = client.recv()?.ok_or(ClientError::Closed)?;
        client.set_timeout(DEFAULT_TIMEOUT);
        Ok((client, reply))
    }

    /// How long `recv` waits (10 s unless changed).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    pub fn send(&mut self, message: &ClientMessage) -> Result<(), ClientError> {
        let mut frame = Vec::new();
        encode_client(message, &mut frame);
        self.send_bytes(&frame)
    }

    /// Writes raw bytes (a test of what the server does with them).
    pub fn send_bytes(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        self.stream.write_all(bytes)?;
        Ok(())
    }

    /// The next message; `Ok(None)` once the server has closed the
    /// connection with nothing more buffered; `TimedOut` after the
    /// time-out.
    pub fn recv(&mut self) -> Result<Option<ServerMessage>, ClientError> {
        let deadline = Instant::now() + self.timeout;
        loop {
            match decode_server(&self.buffer, MAX_FRAME) {
                Ok(Decoded::Message(message, used)) => {
                    self.buffer.drain(..used);
                    return Ok(Some(message));
                }
                Ok(Decoded::NeedMore) => {}
                Err(reason) => return Err(ClientError::Garbled(reason.to_string())),
            }
            if Instant::now() > deadline {
                return Err(ClientError::TimedOut);
            }
            if !read_some(&mut self.stream, &mut self.buffer)? {
                // A last whole frame may have come with the end.
                return match decode_server(&self.buffer, MAX_FRAME) {
                    Ok(Decoded::Message(message, used)) => {
                        self.buffer.drain(..used);
                        Ok(Some(message))
                    }
                    _ => Ok(None),
                };
            }
        }
    }

    /// Bytes received and not yet returned by `recv`.
    pub fn buffered(&self) -> usize {
        self.buffer.len()
    }

    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }

    /// The socket, for a caller that polls many sessions itself; the
    /// bytes already buffered come with it.
    pub fn into_parts(self) -> (TcpStream, Vec<u8>) {
        (self.stream, self.buffer)
    }
}

/// One line for a server message, as `crossbook order` prints it:
/// `report seq=3 fill order=12 ...`, `balance asset=2 ...`.
pub fn describe(message: &ServerMessage) -> String {
    use crossbook_engine::Side;
    use crossbook_protocol::ReportKind;
    let side = |side: Side| if side == Side::Buy { "buy" } else { "sell" };
    match message {
        ServerMessage::LoginAccepted { account, next_seq, .. } => format!("login-accepted account={account} next_seq={next_seq}"),
        ServerMessage::LoginRejected { reason } => format!("login-rejected reason={reason}"),
        ServerMessage::ExecutionReport(r) => {
            let kind = match r.kind {
                ReportKind::Accepted => "accepted",
                ReportKind::PartialFill => "partial_fill",
                ReportKind::Fill => "fill",
                ReportKind::Cancelled => "cancelled",
                ReportKind::Replaced => "replaced",
                ReportKind::Rejected => "rejected",
                ReportKind::CancelAllDone => "cancel_all_done",
            };
            let reason = match (r.refusal(), r.cancel_reason()) {
                (Some(refusal), _) => format!(" reason={}", refusal.name()),
                (_, Some(cancel)) => format!(" reason={}", cancel.name()),
                _ => String::new(),
            };
            format!(
                "report seq={} {kind} order={} cid={} instrument={} side={} price={} last_qty={} last_price={} cum_qty={} leaves_qty={} fee={}{reason}",
                r.seq,
                r.order,
                r.cid,
                r.instrument,
                side(r.side),
                r.price,
                r.last_qty,
                r.last_price,
                r.cum_qty,
                r.leaves_qty,
                r.fee
            )
        }
        ServerMessage::Heartbeat => "heartbeat".into(),
        ServerMessage::Logout { reason } => match crossbook_protocol::ProtocolError::from_code(*reason) {
            Some(known) => format!("logout reason={known}"),
            None => format!("logout reason={reason}"),
        },
        ServerMessage::Error { reason } => format!("error reason={reason}"),
        ServerMessage::Balance { request, asset, available, locked } => format!("balance request={request} asset={asset} available={available} locked={locked}"),
        ServerMessage::OpenOrder(o) => format!(
            "open-order request={} order={} cid={} instrument={} side={} price={} qty={} cum_qty={} leaves_qty={}",
            o.request,
            o.order,
            o.cid,
            o.instrument,
            side(o.side),
            o.price,
            o.qty,
            o.cum_qty,
            o.leaves_qty
        ),
        ServerMessage::QueryDone { request, count, as_of } => format!("query-done request={request} count={count} as_of={as_of}"),
        ServerMessage::Redirect { leader } => match crossbook_protocol::redirect_address(leader) {
            address if address.is_empty() => "redirect leader=unknown".into(),
            address => format!("redirect leader={address}"),
        },
    }
}
