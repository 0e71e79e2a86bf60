//! Market data's state as bytes, for the server's snapshots: what cannot
//! be rebuilt from the engine's state (trade ids, recent trades, candles)
//! and the resting orders the books are summed from.
//!
//! Layout (little-endian): magic `XBMD`, version u32 (1), seq u64, time_ms
//! u64, counters (orders, trades, cancels: u64 each), instruments u32; per
//! instrument: id u32, next trade id u64, trades u32 then each (id u64,
//! price i64, qty u64, time_ms u64, buyer_is_maker u8, seq u64), then for
//! each of the 12 intervals a count u32 and its candles (open_ms u64, open,
//! high, low, close i64, volume u64, quote_volume u128, taker_buy_volume
//! u64, taker_buy_quote_volume u128, trades u64, first_trade u64,
//! last_trade u64); then resting orders u64 and each (id u64, instrument
//! id u32, side u8, price i64, remaining u64); then (version 2) the
//! accounts' orders and trades (`accounts.rs`, `Accounts::encode`); then
//! (version 3) the operator's transfers by reference (`transfers.rs`,
//! `Transfers::encode`); then (version 4) the halted instruments: count
//! u32 and their ids u32. Version 3 is still read (nothing halted).

use crate::candles::{Candle, KEPT};
use crate::{Live, MarketData, Trade};
use crossbook_engine::Side;

const MAGIC: &[u8; 4] = b"XBMD";
const VERSION: u32 = 4;

/// What is wrong with a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodecError(pub String);

impl std::fmt::Display for CodecError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CodecError {}

pub fn encode(market: &MarketData) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(MAGIC);
    put32(&mut out, VERSION);
    for value in [market.seq, market.time_ms, market.counters.orders, market.counters.trades, market.counters.cancels] {
        put64(&mut out, value);
    }
    put32(&mut out, market.instruments.len() as u32);
    for data in &market.instruments {
        put32(&mut out, data.info.id);
        put64(&mut out, data.next_trade_id);
        put32(&mut out, data.trades.len() as u32);
        for t in &data.trades {
            put64(&mut out, t.id);
            put64(&mut out, t.price as u64);
            put64(&mut out, t.qty);
            put64(&mut out, t.time_ms);
            out.push(u8::from(t.buyer_is_maker));
            put64(&mut out, t.seq);
        }
        for series in &data.candles.series {
            put32(&mut out, series.len() as u32);
            for c in series {
                for value in [c.open_ms, c.open as u64, c.high as u64, c.low as u64, c.close as u64, c.volume] {
                    put64(&mut out, value);
                }
                out.extend_from_slice(&c.quote_volume.to_le_bytes());
                put64(&mut out, c.taker_buy_volume);
                out.extend_from_slice(&c.taker_buy_quote_volume.to_le_bytes());
                for value in [c.trades, c.first_trade, c.last_trade] {
                    put64(&mut out, value);
                }
            }
        }
    }
    let mut orders: Vec<(&u64, &Live)> = market.orders.iter().filter(|(_, l)| l.resting).collect();
    orders.sort_unstable_by_key(|(id, _)| **id);
    put64(&mut out, orders.len() as u64);
    for (id, live) in orders {
        put64(&mut out, *id);
        put32(&mut out, market.instruments[live.instrument as usize].info.id);
        out.push(match live.side {
            Side::Buy => 0,
            Side::Sell => 1,
        });
        put64(&mut out, live.price as u64);
        put64(&mut out, live.remaining);
    }
    let ids: Vec<u32> = market.instruments.iter().map(|d| d.info.id).collect();
    market.accounts.encode(&mut out, &ids);
    market.transfers.encode(&mut out);
    let halted: Vec<u32> = market.instruments.iter().filter(|d| d.halted).map(|d| d.info.id).collect();
    put32(&mut out, halted.len() as u32);
    for id in halted {
        put32(&mut out, id);
    }
    out
}

/// Restores `market` (fresh, with the configured instruments) from
/// [`encode`]'s bytes; the books are summed from the resting orders. On
/// an error `market` may be partly restored: start again from a fresh one.
pub fn restore(market: &mut MarketData, bytes: &[u8]) -> Result<(), CodecError> {
    let mut r = Reader::new(bytes);
    if r.take(4)? != MAGIC {
        return Err(CodecError("not a market-data checkpoint".into()));
    }
    let version = r.u32()?;
    if !(3..=VERSION).contains(&version) {
        return Err(CodecError(format!("market-data checkpoint of version {version}, this build reads {VERSION}")));
    }
    market.seq = r.u64()?;
    market.time_ms = r.u64()?;
    market.counters.orders = r.u64()?;
    market.counters.trades = r.u64()?;
    market.counters.cancels = r.u64()?;
    let count = r.u32()?;
    for _ in 0..count {
        let id = r.u32()?;
        let index = *market.by_id.get(&id).ok_or_else(|| CodecError(format!("instrument {id} is not in the configuration")))? as usize;
        let data = &mut market.instruments[index];
        data.next_trade_id = r.u64()?;
        let trades = r.count(false, 41)?;
        data.trades.clear();
        for _ in 0..trades {
            let (id, price, qty, time_ms) = (r.u64()?, r.u64()? as i64, r.u64()?, r.u64()?);
            let buyer_is_maker = r.u8()? == 1;
            data.trades.push_back(Trade { id, price, qty, time_ms, buyer_is_maker, seq: r.u64()? });
        }
        for index in 0..KEPT {
            let candles = r.count(false, 112)?;
            let series = &mut data.candles.series[index];
            series.clear();
            for _ in 0..candles {
                let open_ms = r.u64()?;
                let (open, high, low, close) = (r.u64()? as i64, r.u64()? as i64, r.u64()? as i64, r.u64()? as i64);
                let volume = r.u64()?;
                let quote_volume = r.u128()?;
                let taker_buy_volume = r.u64()?;
                let taker_buy_quote_volume = r.u128()?;
                let (trades, first_trade, last_trade) = (r.u64()?, r.u64()?, r.u64()?);
                series.push_back(Candle { open_ms, open, high, low, close, volume, quote_volume, taker_buy_volume, taker_buy_quote_volume, trades, first_trade, last_trade });
            }
        }
    }
    let orders = r.count(true, 29)?;
    market.orders.clear();
    for data in &mut market.instruments {
        data.book = Default::default();
    }
    for _ in 0..orders {
        let id = r.u64()?;
        let instrument = r.u32()?;
        let index = *market.by_id.get(&instrument).ok_or_else(|| CodecError(format!("order {id}: instrument {instrument} is not in the configuration")))?;
        let side = match r.u8()? {
            0 => Side::Buy,
            1 => Side::Sell,
            other => return Err(CodecError(format!("order {id}: side {other}"))),
        };
        let (price, remaining) = (r.u64()? as i64, r.u64()?);
        market.instruments[index as usize].book.add(side, price, remaining);
        market.orders.insert(id, Live { instrument: index, side, price, remaining, resting: true, rests: true });
    }
    let by_id = market.by_id.clone();
    market.accounts.restore(&mut r, &|id| by_id.get(&id).copied())?;
    market.transfers.restore(&mut r)?;
    if version >= 4 {
        for _ in 0..r.count(false, 4)? {
            let id = r.u32()?;
            let index = *market.by_id.get(&id).ok_or_else(|| CodecError(format!("halted instrument {id} is not in the configuration")))?;
            market.instruments[index as usize].halted = true;
        }
    }
    r.end()?;
    let seq = market.seq;
    market.diffs_from(seq);
    Ok(())
}

fn put32(out: &mut Vec<u8>, value: u32) {
    out.extend_from_slice(&value.to_le_bytes());
}

fn put64(out: &mut Vec<u8>, value: u64) {
    out.extend_from_slice(&value.to_le_bytes());
}

/// Reads fixed-width little-endian fields, every read bounds-checked (the
/// server's own checkpoints are read with it too).
pub struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes, at: 0 }
    }

    pub fn take(&mut self, n: usize) -> Result<&'a [u8], CodecError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len()).ok_or_else(|| CodecError(format!("truncated at byte {}", self.at)))?;
        let slice = &self.bytes[self.at..end];
        self.at = end;
        Ok(slice)
    }

    pub fn u8(&mut self) -> Result<u8, CodecError> {
        Ok(self.take(1)?[0])
    }

    pub fn u32(&mut self) -> Result<u32, CodecError> {
        let mut word = [0u8; 4];
        word.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(word))
    }

    pub fn u64(&mut self) -> Result<u64, CodecError> {
        let mut word = [0u8; 8];
        word.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(word))
    }

    pub fn u128(&mut self) -> Result<u128, CodecError> {
        let mut word = [0u8; 16];
        word.copy_from_slice(self.take(16)?);
        Ok(u128::from_le_bytes(word))
    }

    pub fn i64(&mut self) -> Result<i64, CodecError> {
        Ok(self.u64()? as i64)
    }

    pub fn i128(&mut self) -> Result<i128, CodecError> {
        Ok(self.u128()? as i128)
    }

    /// Every byte read.
    pub fn end(&self) -> Result<(), CodecError> {
        if self.at == self.bytes.len() { Ok(()) } else { Err(CodecError(format!("{} bytes left over", self.bytes.len() - self.at))) }
    }

    /// A count (u32, or u64 with `wide`) of items of at least `item_bytes`
    /// each, refused when the bytes left cannot hold them.
    pub fn count(&mut self, wide: bool, item_bytes: usize) -> Result<usize, CodecError> {
        let count = if wide { self.u64()? } else { u64::from(self.u32()?) };
        let left = (self.bytes.len() - self.at) as u64;
        if count.saturating_mul(item_bytes as u64) > left {
            return Err(CodecError(format!("a count of {count} with {left} bytes left")));
        }
        Ok(count as usize)
    }
}
