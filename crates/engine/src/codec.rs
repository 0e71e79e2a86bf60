//! The compact binary encoding of commands, as the journal stores them:
//! a tag byte, then fixed-width little-endian fields. Version 3 (version 2
//! is the same without tags 11 and 12, version 1 without tag 10 either;
//! their segments are still read).
//!
//! | tag | command | fields |
//! | --- | --- | --- |
//! | 1 | asset | id u32, name (len u8 + 32 bytes, zero padded) |
//! | 2 | instrument | id u32, symbol (len u8 + 32 bytes), base u32, quote u32, tick_size u64, lot_size u64, min_qty u64, max_qty u64, min_price i64, max_price i64, maker_bps i64, taker_bps i64 |
//! | 3 | open | account u64 |
//! | 4 | deposit | account u64, asset u32, amount u64 |
//! | 5 | withdraw | account u64, asset u32, amount u64 |
//! | 6 | place | account u64, instrument u32, cid u64, side u8, type u8, tif u8, price i64, qty u64, post_only u8, stp u8, has_budget u8, budget u64 |
//! | 7 | cancel | account u64, order u64 |
//! | 8 | replace | account u64, order u64, price i64, qty u64 |
//! | 9 | cancel_all | account u64, has_instrument u8, instrument u32 |
//! | 10 | amend | account u64, order u64, qty u64 |
//! | 11 | halt | instrument u32 |
//! | 12 | resume | instrument u32 |
//!
//! Enumerations: side 0 buy, 1 sell; type 0 limit, 1 market; tif 0 gtc,
//! 1 ioc, 2 fok; stp 0 none, 1 cancel_newest, 2 cancel_oldest,
//! 3 cancel_both; flags 0 or 1. Decoding accepts exactly these values and
//! exactly the encoded length: anything else is an error, never a panic.

use crate::types::*;

pub const COMMAND_FORMAT_VERSION: u32 = 3;

/// The longest encoded command (an instrument).
pub const MAX_COMMAND_BYTES: usize = 1 + 4 + 33 + 4 + 4 + 8 * 8;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    Empty,
    UnknownTag(u8),
    Truncated,
    TrailingBytes(usize),
    BadValue { field: &'static str, value: u64 },
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::Empty => f.write_str("empty record"),
            DecodeError::UnknownTag(tag) => write!(f, "unknown command tag {tag}"),
            DecodeError::Truncated => f.write_str("truncated"),
            DecodeError::TrailingBytes(n) => write!(f, "{n} bytes after the end"),
            DecodeError::BadValue { field, value } => write!(f, "bad value {value} for {field}"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// Appends little-endian fields to a buffer.
pub struct Writer<'a> {
    pub out: &'a mut Vec<u8>,
}

impl Writer<'_> {
    #[inline]
    pub fn u8(&mut self, v: u8) {
        self.out.push(v);
    }
    #[inline]
    pub fn u32(&mut self, v: u32) {
        self.out.extend_from_slice(&v.to_le_bytes());
    }
    #[inline]
    pub fn u64(&mut self, v: u64) {
        self.out.extend_from_slice(&v.to_le_bytes());
    }
    #[inline]
    pub fn i64(&mut self, v: i64) {
        self.out.extend_from_slice(&v.to_le_bytes());
    }
    pub fn symbol(&mut self, s: &Symbol) {
        let text = s.as_str().as_bytes();
        self.u8(text.len() as u8);
        let mut padded = [0u8; Symbol::CAPACITY];
        padded[..text.len()].copy_from_slice(text);
        self.out.extend_from_slice(&padded);
    }
    pub fn spec(&mut self, s: &InstrumentSpec) {
        self.u32(s.id);
        self.symbol(&s.symbol);
        self.u32(s.base);
        self.u32(s.quote);
        self.u64(s.tick_size);
        self.u64(s.lot_size);
        self.u64(s.min_qty);
        self.u64(s.max_qty);
        self.i64(s.min_price);
        self.i64(s.max_price);
        self.i64(s.maker_bps);
        self.i64(s.taker_bps);
    }
}

/// Reads little-endian fields from a byte slice, refusing to run past it.
pub struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes, at: 0 }
    }

    pub fn position(&self) -> usize {
        self.at
    }

    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }

    #[inline]
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.remaining() < n {
            return Err(DecodeError::Truncated);
        }
        let slice = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(slice)
    }

    #[inline]
    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    #[inline]
    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    #[inline]
    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    #[inline]
    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    #[inline]
    pub fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(i64::from_le_bytes(self.array()?))
    }
    #[inline]
    pub fn flag(&mut self, field: &'static str) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(DecodeError::BadValue { field, value: u64::from(v) }),
        }
    }
    pub fn symbol(&mut self, field: &'static str) -> Result<Symbol, DecodeError> {
        let len = self.u8()? as usize;
        let bytes = self.take(Symbol::CAPACITY)?;
        let bad = DecodeError::BadValue { field, value: len as u64 };
        if len > Symbol::CAPACITY || bytes[len..].iter().any(|&b| b != 0) {
            return Err(bad);
        }
        let text = std::str::from_utf8(&bytes[..len]).map_err(|_| bad.clone())?;
        Symbol::new(text).ok_or(bad)
    }
    pub fn spec(&mut self) -> Result<InstrumentSpec, DecodeError> {
        Ok(InstrumentSpec {
            id: self.u32()?,
            symbol: self.symbol("symbol")?,
            base: self.u32()?,
            quote: self.u32()?,
            tick_size: self.u64()?,
            lot_size: self.u64()?,
            min_qty: self.u64()?,
            max_qty: self.u64()?,
            min_price: self.i64()?,
            max_price: self.i64()?,
            maker_bps: self.i64()?,
            taker_bps: self.i64()?,
        })
    }
    #[inline]
    pub fn side(&mut self) -> Result<Side, DecodeError> {
        match self.u8()? {
            0 => Ok(Side::Buy),
            1 => Ok(Side::Sell),
            v => Err(DecodeError::BadValue { field: "side", value: u64::from(v) }),
        }
    }
    #[inline]
    pub fn order_type(&mut self) -> Result<OrderType, DecodeError> {
        match self.u8()? {
            0 => Ok(OrderType::Limit),
            1 => Ok(OrderType::Market),
            v => Err(DecodeError::BadValue { field: "type", value: u64::from(v) }),
        }
    }
    #[inline]
    pub fn tif(&mut self) -> Result<TimeInForce, DecodeError> {
        match self.u8()? {
            0 => Ok(TimeInForce::Gtc),
            1 => Ok(TimeInForce::Ioc),
            2 => Ok(TimeInForce::Fok),
            v => Err(DecodeError::BadValue { field: "tif", value: u64::from(v) }),
        }
    }
    #[inline]
    pub fn stp(&mut self) -> Result<SelfTradePrevention, DecodeError> {
        match self.u8()? {
            0 => Ok(SelfTradePrevention::None),
            1 => Ok(SelfTradePrevention::CancelNewest),
            2 => Ok(SelfTradePrevention::CancelOldest),
            3 => Ok(SelfTradePrevention::CancelBoth),
            v => Err(DecodeError::BadValue { field: "stp", value: u64::from(v) }),
        }
    }
}

pub fn side_code(side: Side) -> u8 {
    match side {
        Side::Buy => 0,
        Side::Sell => 1,
    }
}

pub fn order_type_code(order_type: OrderType) -> u8 {
    match order_type {
        OrderType::Limit => 0,
        OrderType::Market => 1,
    }
}

pub fn tif_code(tif: TimeInForce) -> u8 {
    match tif {
        TimeInForce::Gtc => 0,
        TimeInForce::Ioc => 1,
        TimeInForce::Fok => 2,
    }
}

pub fn stp_code(stp: SelfTradePrevention) -> u8 {
    match stp {
        SelfTradePrevention::None => 0,
        SelfTradePrevention::CancelNewest => 1,
        SelfTradePrevention::CancelOldest => 2,
        SelfTradePrevention::CancelBoth => 3,
    }
}

/// Appends the encoding of `command` to `out`.
pub fn encode_command(command: &Command, out: &mut Vec<u8>) {
    let mut w = Writer { out };
    match command {
        Command::AddAsset { id, name } => {
            w.u8(1);
            w.u32(*id);
            w.symbol(name);
        }
        Command::AddInstrument(spec) => {
            w.u8(2);
            w.spec(spec);
        }
        Command::OpenAccount { account } => {
            w.u8(3);
            w.u64(*account);
        }
        Command::Deposit { account, asset, amount } => {
            w.u8(4);
            w.u64(*account);
            w.u32(*asset);
            w.u64(*amount);
        }
        Command::Withdraw { account, asset, amount } => {
            w.u8(5);
            w.u64(*account);
            w.u32(*asset);
            w.u64(*amount);
        }
        Command::Place(p) => {
            w.u8(6);
            w.u64(p.account);
            w.u32(p.instrument);
            w.u64(p.cid);
            w.u8(side_code(p.side));
            w.u8(order_type_code(p.order_type));
            w.u8(tif_code(p.tif));
            w.i64(p.price);
            w.u64(p.qty);
            w.u8(u8::from(p.post_only));
            w.u8(stp_code(p.stp));
            w.u8(u8::from(p.budget.is_some()));
            w.u64(p.budget.unwrap_or(0));
        }
        Command::Cancel { account, order } => {
            w.u8(7);
            w.u64(*account);
            w.u64(*order);
        }
        Command::Replace { account, order, price, qty } => {
            w.u8(8);
            w.u64(*account);
            w.u64(*order);
            w.i64(*price);
            w.u64(*qty);
        }
        Command::Amend { account, order, qty } => {
            w.u8(10);
            w.u64(*account);
            w.u64(*order);
            w.u64(*qty);
        }
        Command::CancelAll { account, instrument } => {
            w.u8(9);
            w.u64(*account);
            w.u8(u8::from(instrument.is_some()));
            w.u32(instrument.unwrap_or(0));
        }
        Command::Halt { instrument } => {
            w.u8(11);
            w.u32(*instrument);
        }
        Command::Resume { instrument } => {
            w.u8(12);
            w.u32(*instrument);
        }
    }
}

/// Decodes exactly one command from `bytes` (all of them).
pub fn decode_command(bytes: &[u8]) -> Result<Command, DecodeError> {
    let (command, used) = decode_command_prefix(bytes)?;
    if used != bytes.len() {
        return Err(DecodeError::TrailingBytes(bytes.len() - used));
    }
    Ok(command)
}

/// Decodes the command at the start of `bytes`; returns it and how many
/// bytes it took (a journal record may carry more after it).
pub fn decode_command_prefix(bytes: &[u8]) -> Result<(Command, usize), DecodeError> {
    let mut r = Reader::new(bytes);
    let tag = r.u8().map_err(|_| DecodeError::Empty)?;
    let command = match tag {
        1 => Command::AddAsset { id: r.u32()?, name: r.symbol("name")? },
        2 => Command::AddInstrument(r.spec()?),
        3 => Command::OpenAccount { account: r.u64()? },
        4 => Command::Deposit { account: r.u64()?, asset: r.u32()?, amount: r.u64()? },
        5 => Command::Withdraw { account: r.u64()?, asset: r.u32()?, amount: r.u64()? },
        6 => {
            let account = r.u64()?;
            let instrument = r.u32()?;
            let cid = r.u64()?;
            let side = r.side()?;
            let order_type = r.order_type()?;
            let tif = r.tif()?;
            let price = r.i64()?;
            let qty = r.u64()?;
            let post_only = r.flag("post_only")?;
            let stp = r.stp()?;
            let has_budget = r.flag("has_budget")?;
            let budget = r.u64()?;
            Command::Place(PlaceOrder {
                account,
                instrument,
                cid,
                side,
                order_type,
                tif,
                price,
                qty,
                post_only,
                stp,
                budget: has_budget.then_some(budget),
            })
        }
        7 => Command::Cancel { account: r.u64()?, order: r.u64()? },
        8 => Command::Replace { account: r.u64()?, order: r.u64()?, price: r.i64()?, qty: r.u64()? },
        9 => {
            let account = r.u64()?;
            let has = r.flag("has_instrument")?;
            let instrument = r.u32()?;
            Command::CancelAll { account, instrument: has.then_some(instrument) }
        }
        10 => Command::Amend { account: r.u64()?, order: r.u64()?, qty: r.u64()? },
        11 => Command::Halt { instrument: r.u32()? },
        12 => Command::Resume { instrument: r.u32()? },
        other => return Err(DecodeError::UnknownTag(other)),
    };
    Ok((command, r.position()))
}
