//! The binary order-entry protocol, version 1 (`docs/protocol.md`).
//!
//! Frames are `length u32 | version u8 | type u8 | body`, little-endian,
//! one fixed body length per message type. Decoding never panics, never
//! trusts a length beyond the configured maximum, and never allocates.

use crossbook_engine::codec::{DecodeError, Reader, Writer, order_type_code, side_code, stp_code, tif_code};
use crossbook_engine::*;

pub mod reports;

pub const VERSION: u8 = 1;
/// Default bound on a frame (bytes after the length field).
pub const MAX_FRAME: usize = 256;
pub const API_KEY_BYTES: usize = 32;

/// Why a frame was refused; the code is what LoginRejected, Logout and
/// Error carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ProtocolError {
    BadLength = 1,
    UnsupportedVersion = 2,
    UnknownType = 3,
    BadValue = 4,
    FrameTooLong = 5,
    NotLoggedIn = 6,
    BadCredentials = 7,
    AlreadyLoggedIn = 8,
    /// The server takes no more connections (its limit, or shutting down).
    ServerBusy = 9,
    /// The server can no longer make commands durable (a journal write or
    /// sync failed: a full disk, say) and stops; it acknowledges nothing
    /// more.
    JournalFailed = 10,
    /// The connection did not log in within `limits.login_timeout_s`.
    LoginTimeout = 11,
    /// This node stopped leading (a replicated venue): reconnect to the
    /// leader.
    NotLeader = 12,
}

impl ProtocolError {
    pub fn code(self) -> u8 {
        self as u8
    }

    pub fn from_code(code: u8) -> Option<ProtocolError> {
        use ProtocolError::*;
        [BadLength, UnsupportedVersion, UnknownType, BadValue, FrameTooLong, NotLoggedIn, BadCredentials, AlreadyLoggedIn, ServerBusy, JournalFailed, LoginTimeout, NotLeader]
            .into_iter()
            .find(|e| e.code() == code)
    }

    pub fn name(self) -> &'static str {
        match self {
            ProtocolError::BadLength => "bad_length",
            ProtocolError::UnsupportedVersion => "unsupported_version",
            ProtocolError::UnknownType => "unknown_type",
            ProtocolError::BadValue => "bad_value",
            ProtocolError::FrameTooLong => "frame_too_long",
            ProtocolError::NotLoggedIn => "not_logged_in",
            ProtocolError::BadCredentials => "bad_credentials",
            ProtocolError::AlreadyLoggedIn => "already_logged_in",
            ProtocolError::ServerBusy => "server_busy",
            ProtocolError::JournalFailed => "journal_failed",
            ProtocolError::LoginTimeout => "login_timeout",
            ProtocolError::NotLeader => "not_leader",
        }
    }
}

impl std::fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::error::Error for ProtocolError {}

impl From<DecodeError> for ProtocolError {
    fn from(error: DecodeError) -> Self {
        match error {
            DecodeError::BadValue { .. } => ProtocolError::BadValue,
            _ => ProtocolError::BadLength,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NewOrder {
    pub cid: ClientOrderId,
    pub instrument: InstrumentId,
    pub side: Side,
    pub order_type: OrderType,
    pub tif: TimeInForce,
    pub post_only: bool,
    pub stp: SelfTradePrevention,
    pub price: i64,
    pub qty: u64,
    /// 0 on the wire: none.
    pub budget: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientMessage {
    Login { account: AccountId, api_key: [u8; API_KEY_BYTES], last_seen: u64 },
    NewOrder(NewOrder),
    Cancel { order: OrderId },
    Replace { order: OrderId, price: i64, qty: u64 },
    CancelAll { instrument: Option<InstrumentId> },
    Heartbeat,
    Logout,
    /// The account's balances: answered by a `Balance` per asset, then
    /// `QueryDone` with the same `request`.
    QueryBalances { request: u64 },
    /// The account's open orders (of one instrument, or all): an
    /// `OpenOrder` each, then `QueryDone`.
    QueryOpenOrders { request: u64, instrument: Option<InstrumentId> },
}

impl ClientMessage {
    /// The engine command this message asks for on behalf of `account`
    /// (`None` for session messages).
    pub fn to_command(&self, account: AccountId) -> Option<Command> {
        match *self {
            ClientMessage::NewOrder(o) => Some(Command::Place(PlaceOrder {
                account,
                instrument: o.instrument,
                cid: o.cid,
                side: o.side,
                order_type: o.order_type,
                tif: o.tif,
                price: o.price,
                qty: o.qty,
                post_only: o.post_only,
                stp: o.stp,
                budget: o.budget,
            })),
            ClientMessage::Cancel { order } => Some(Command::Cancel { account, order }),
            ClientMessage::Replace { order, price, qty } => Some(Command::Replace { account, order, price, qty }),
            ClientMessage::CancelAll { instrument } => Some(Command::CancelAll { account, instrument }),
            ClientMessage::Login { .. } | ClientMessage::Heartbeat | ClientMessage::Logout | ClientMessage::QueryBalances { .. } | ClientMessage::QueryOpenOrders { .. } => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ReportKind {
    Accepted = 1,
    PartialFill = 2,
    Fill = 3,
    Cancelled = 4,
    Replaced = 5,
    Rejected = 6,
    /// A CancelAll is done: `last_qty` says how many orders it cancelled
    /// (0 when none were open), `instrument` what it was for (0: all).
    /// Each cancelled order also has its own `Cancelled` report, before it.
    CancelAllDone = 7,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExecutionReport {
    pub seq: u64,
    pub kind: ReportKind,
    pub order: OrderId,
    pub cid: ClientOrderId,
    pub instrument: InstrumentId,
    pub side: Side,
    pub price: i64,
    pub last_qty: u64,
    pub last_price: i64,
    pub cum_qty: u64,
    pub leaves_qty: u64,
    pub fee: i64,
    pub reason: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerMessage {
    LoginAccepted { seq: u64, account: AccountId, next_seq: u64 },
    LoginRejected { reason: ProtocolError },
    ExecutionReport(ExecutionReport),
    Heartbeat,
    Logout { reason: u8 },
    Error { reason: ProtocolError },
    /// One asset of a `QueryBalances` answer.
    Balance { request: u64, asset: AssetId, available: u64, locked: u64 },
    /// One order of a `QueryOpenOrders` answer.
    OpenOrder(OpenOrder),
    /// The end of a query's answer: `count` messages came before it, the
    /// state after command `as_of` (every report up to it was sent first).
    QueryDone { request: u64, count: u32, as_of: u64 },
    /// This node does not take orders (a follower of a replicated venue):
    /// the leader's binary address, `host:port` zero-padded (all zeros: no
    /// leader is known right now).
    Redirect { leader: [u8; REDIRECT_BYTES] },
}

/// The bytes of a Redirect's address field.
pub const REDIRECT_BYTES: usize = 64;

/// A Redirect's address field from `host:port` (cut at `REDIRECT_BYTES`).
pub fn redirect_field(address: &str) -> [u8; REDIRECT_BYTES] {
    let mut field = [0u8; REDIRECT_BYTES];
    let bytes = &address.as_bytes()[..address.len().min(REDIRECT_BYTES)];
    field[..bytes.len()].copy_from_slice(bytes);
    field
}

/// A Redirect's address as text (empty: none known).
pub fn redirect_address(field: &[u8; REDIRECT_BYTES]) -> String {
    let end = field.iter().position(|b| *b == 0).unwrap_or(REDIRECT_BYTES);
    String::from_utf8_lossy(&field[..end]).into_owned()
}

/// An open order, as a `QueryOpenOrders` answer lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenOrder {
    pub request: u64,
    pub order: OrderId,
    pub cid: ClientOrderId,
    pub instrument: InstrumentId,
    pub side: Side,
    pub price: i64,
    /// Its quantity, filled lots included.
    pub qty: u64,
    pub cum_qty: u64,
    pub leaves_qty: u64,
}

/// What a decoder found at the start of a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decoded<T> {
    /// A whole message, and the bytes it took.
    Message(T, usize),
    /// The frame is not complete yet: read more and try again.
    NeedMore,
}

/// Body length of each client message type.
/// The longest body of any message type, client or server, with its
/// version and type bytes: the default frame bound must take every message
/// (a longer message type would otherwise be refused as `frame_too_long`
/// by a server on its defaults).
pub const LONGEST_FRAME: usize = {
    let mut longest = 0;
    let mut kind = 0u8;
    loop {
        let body = match (client_body(kind), server_body(kind)) {
            (Some(a), Some(b)) => if a > b { a } else { b },
            (Some(a), None) | (None, Some(a)) => a,
            (None, None) => 0,
        };
        if body > longest {
            longest = body;
        }
        if kind == u8::MAX {
            break;
        }
        kind += 1;
    }
    2 + longest
};
const _: () = assert!(LONGEST_FRAME <= MAX_FRAME);

const fn client_body(kind: u8) -> Option<usize> {
    Some(match kind {
        1 => 8 + API_KEY_BYTES + 8,
        2 => 8 + 4 + 5 + 8 + 8 + 8,
        3 => 8,
        4 => 8 + 8 + 8,
        5 => 4,
        6 | 7 => 0,
        8 => 8,
        9 => 8 + 4,
        _ => return None,
    })
}

const fn server_body(kind: u8) -> Option<usize> {
    Some(match kind {
        101 => 24,
        102 => 9,
        103 => 8 + 1 + 8 + 8 + 4 + 1 + 8 + 8 + 8 + 8 + 8 + 8 + 1,
        104 => 8,
        105 | 106 => 9,
        107 => 8 + 8 + 4 + 8 + 8,
        108 => 8 + 8 + 8 + 8 + 4 + 1 + 8 + 8 + 8 + 8,
        109 => 8 + 8 + 4 + 8,
        110 => 8 + REDIRECT_BYTES,
        _ => return None,
    })
}

/// One frame split off a buffer: `(type, body, total bytes)`.
type Frame<'a> = (u8, &'a [u8], usize);

/// Splits off one frame, after checking the length against `max_frame` and
/// the body length against the type.
fn frame(buffer: &[u8], max_frame: usize, body_len: fn(u8) -> Option<usize>) -> Result<Option<Frame<'_>>, ProtocolError> {
    if buffer.len() < 4 {
        return Ok(None);
    }
    let length = u32::from_le_bytes([buffer[0], buffer[1], buffer[2], buffer[3]]) as usize;
    if length > max_frame {
        return Err(ProtocolError::FrameTooLong);
    }
    if length < 2 {
        return Err(ProtocolError::BadLength);
    }
    if buffer.len() < 4 + length {
        // Version and type can be judged before the body arrives.
        if buffer.len() > 4 && buffer[4] != VERSION {
            return Err(ProtocolError::UnsupportedVersion);
        }
        return Ok(None);
    }
    if buffer[4] != VERSION {
        return Err(ProtocolError::UnsupportedVersion);
    }
    let kind = buffer[5];
    let expected = body_len(kind).ok_or(ProtocolError::UnknownType)?;
    if length - 2 != expected {
        return Err(ProtocolError::BadLength);
    }
    Ok(Some((kind, &buffer[6..4 + length], 4 + length)))
}

/// Decodes one client message from the start of `buffer`.
pub fn decode_client(buffer: &[u8], max_frame: usize) -> Result<Decoded<ClientMessage>, ProtocolError> {
    let Some((kind, body, used)) = frame(buffer, max_frame, client_body)? else {
        return Ok(Decoded::NeedMore);
    };
    let mut r = Reader::new(body);
    let message = match kind {
        1 => {
            let account = r.u64()?;
            let mut api_key = [0u8; API_KEY_BYTES];
            api_key.copy_from_slice(r.take(API_KEY_BYTES)?);
            ClientMessage::Login { account, api_key, last_seen: r.u64()? }
        }
        2 => {
            let cid = r.u64()?;
            let instrument = r.u32()?;
            let side = r.side()?;
            let order_type = r.order_type()?;
            let tif = r.tif()?;
            let post_only = r.flag("post_only")?;
            let stp = r.stp()?;
            let price = r.i64()?;
            let qty = r.u64()?;
            let budget = r.u64()?;
            if instrument == 0 {
                return Err(ProtocolError::BadValue);
            }
            ClientMessage::NewOrder(NewOrder {
                cid,
                instrument,
                side,
                order_type,
                tif,
                post_only,
                stp,
                price,
                qty,
                budget: (budget != 0).then_some(budget),
            })
        }
        3 => ClientMessage::Cancel { order: r.u64()? },
        4 => ClientMessage::Replace { order: r.u64()?, price: r.i64()?, qty: r.u64()? },
        5 => {
            let instrument = r.u32()?;
            ClientMessage::CancelAll { instrument: (instrument != 0).then_some(instrument) }
        }
        6 => ClientMessage::Heartbeat,
        7 => ClientMessage::Logout,
        8 => ClientMessage::QueryBalances { request: r.u64()? },
        9 => {
            let request = r.u64()?;
            let instrument = r.u32()?;
            ClientMessage::QueryOpenOrders { request, instrument: (instrument != 0).then_some(instrument) }
        }
        _ => return Err(ProtocolError::UnknownType),
    };
    Ok(Decoded::Message(message, used))
}

fn begin(out: &mut Vec<u8>, kind: u8, body: usize) {
    out.extend_from_slice(&((body + 2) as u32).to_le_bytes());
    out.push(VERSION);
    out.push(kind);
}

/// Appends the frame of `message` to `out`.
pub fn encode_client(message: &ClientMessage, out: &mut Vec<u8>) {
    let kind = match message {
        ClientMessage::Login { .. } => 1,
        ClientMessage::NewOrder(_) => 2,
        ClientMessage::Cancel { .. } => 3,
        ClientMessage::Replace { .. } => 4,
        ClientMessage::CancelAll { .. } => 5,
        ClientMessage::Heartbeat => 6,
        ClientMessage::Logout => 7,
        ClientMessage::QueryBalances { .. } => 8,
        ClientMessage::QueryOpenOrders { .. } => 9,
    };
    begin(out, kind, client_body(kind).unwrap_or(0));
    let mut w = Writer { out };
    match *message {
        ClientMessage::Login { account, api_key, last_seen } => {
            w.u64(account);
            w.out.extend_from_slice(&api_key);
            w.u64(last_seen);
        }
        ClientMessage::NewOrder(o) => {
            w.u64(o.cid);
            w.u32(o.instrument);
            w.u8(side_code(o.side));
            w.u8(order_type_code(o.order_type));
            w.u8(tif_code(o.tif));
            w.u8(u8::from(o.post_only));
            w.u8(stp_code(o.stp));
            w.i64(o.price);
            w.u64(o.qty);
            w.u64(o.budget.unwrap_or(0));
        }
        ClientMessage::Cancel { order } => w.u64(order),
        ClientMessage::Replace { order, price, qty } => {
            w.u64(order);
            w.i64(price);
            w.u64(qty);
        }
        ClientMessage::CancelAll { instrument } => w.u32(instrument.unwrap_or(0)),
        ClientMessage::Heartbeat | ClientMessage::Logout => {}
        ClientMessage::QueryBalances { request } => w.u64(request),
        ClientMessage::QueryOpenOrders { request, instrument } => {
            w.u64(request);
            w.u32(instrument.unwrap_or(0));
        }
    }
}

fn report_kind(code: u8) -> Result<ReportKind, ProtocolError> {
    use ReportKind::*;
    [Accepted, PartialFill, Fill, Cancelled, Replaced, Rejected, CancelAllDone]
        .into_iter()
        .find(|k| *k as u8 == code)
        .ok_or(ProtocolError::BadValue)
}

fn protocol_reason(code: u8) -> Result<ProtocolError, ProtocolError> {
    ProtocolError::from_code(code).ok_or(ProtocolError::BadValue)
}

/// Decodes one server message from the start of `buffer` (for clients and
/// the load generator).
pub fn decode_server(buffer: &[u8], max_frame: usize) -> Result<Decoded<ServerMessage>, ProtocolError> {
    let Some((kind, body, used)) = frame(buffer, max_frame, server_body)? else {
        return Ok(Decoded::NeedMore);
    };
    let mut r = Reader::new(body);
    // Every server message starts with its sequence number (`frame` has
    // refused unknown types and short bodies); most do not keep it.
    let seq = r.u64()?;
    let message = match kind {
        101 => ServerMessage::LoginAccepted { seq, account: r.u64()?, next_seq: r.u64()? },
        102 => ServerMessage::LoginRejected { reason: protocol_reason(r.u8()?)? },
        103 => ServerMessage::ExecutionReport(ExecutionReport {
            seq,
            kind: report_kind(r.u8()?)?,
            order: r.u64()?,
            cid: r.u64()?,
            instrument: r.u32()?,
            side: r.side()?,
            price: r.i64()?,
            last_qty: r.u64()?,
            last_price: r.i64()?,
            cum_qty: r.u64()?,
            leaves_qty: r.u64()?,
            fee: r.i64()?,
            reason: r.u8()?,
        }),
        104 => ServerMessage::Heartbeat,
        105 => ServerMessage::Logout { reason: r.u8()? },
        106 => ServerMessage::Error { reason: protocol_reason(r.u8()?)? },
        107 => ServerMessage::Balance { request: r.u64()?, asset: r.u32()?, available: r.u64()?, locked: r.u64()? },
        108 => ServerMessage::OpenOrder(OpenOrder {
            request: r.u64()?,
            order: r.u64()?,
            cid: r.u64()?,
            instrument: r.u32()?,
            side: r.side()?,
            price: r.i64()?,
            qty: r.u64()?,
            cum_qty: r.u64()?,
            leaves_qty: r.u64()?,
        }),
        109 => ServerMessage::QueryDone { request: r.u64()?, count: r.u32()?, as_of: r.u64()? },
        110 => {
            let mut leader = [0u8; REDIRECT_BYTES];
            leader.copy_from_slice(r.take(REDIRECT_BYTES)?);
            ServerMessage::Redirect { leader }
        }
        _ => return Err(ProtocolError::UnknownType),
    };
    Ok(Decoded::Message(message, used))
}

/// Appends the frame of `message` to `out`.
pub fn encode_server(message: &ServerMessage, out: &mut Vec<u8>) {
    let kind = match message {
        ServerMessage::LoginAccepted { .. } => 101,
        ServerMessage::LoginRejected { .. } => 102,
        ServerMessage::ExecutionReport(_) => 103,
        ServerMessage::Heartbeat => 104,
        ServerMessage::Logout { .. } => 105,
        ServerMessage::Error { .. } => 106,
        ServerMessage::Balance { .. } => 107,
        ServerMessage::OpenOrder(_) => 108,
        ServerMessage::QueryDone { .. } => 109,
        ServerMessage::Redirect { .. } => 110,
    };
    begin(out, kind, server_body(kind).unwrap_or(0));
    let mut w = Writer { out };
    match *message {
        ServerMessage::LoginAccepted { seq, account, next_seq } => {
            w.u64(seq);
            w.u64(account);
            w.u64(next_seq);
        }
        ServerMessage::LoginRejected { reason } | ServerMessage::Error { reason } => {
            w.u64(0);
            w.u8(reason.code());
        }
        ServerMessage::ExecutionReport(e) => {
            w.u64(e.seq);
            w.u8(e.kind as u8);
            w.u64(e.order);
            w.u64(e.cid);
            w.u32(e.instrument);
            w.u8(side_code(e.side));
            w.i64(e.price);
            w.u64(e.last_qty);
            w.i64(e.last_price);
            w.u64(e.cum_qty);
            w.u64(e.leaves_qty);
            w.i64(e.fee);
            w.u8(e.reason);
        }
        ServerMessage::Heartbeat => w.u64(0),
        ServerMessage::Logout { reason } => {
            w.u64(0);
            w.u8(reason);
        }
        ServerMessage::Balance { request, asset, available, locked } => {
            w.u64(0);
            w.u64(request);
            w.u32(asset);
            w.u64(available);
            w.u64(locked);
        }
        ServerMessage::OpenOrder(o) => {
            w.u64(0);
            w.u64(o.request);
            w.u64(o.order);
            w.u64(o.cid);
            w.u32(o.instrument);
            w.u8(side_code(o.side));
            w.i64(o.price);
            w.u64(o.qty);
            w.u64(o.cum_qty);
            w.u64(o.leaves_qty);
        }
        ServerMessage::QueryDone { request, count, as_of } => {
            w.u64(0);
            w.u64(request);
            w.u32(count);
            w.u64(as_of);
        }
        ServerMessage::Redirect { leader } => {
            w.u64(0);
            w.out.extend_from_slice(&leader);
        }
    }
}

#[cfg(test)]
mod tests;
