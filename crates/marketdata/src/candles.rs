//! Candles (klines) of every interval from one minute to one day, kept per
//! instrument, updated trade by trade from the trades' journal times.

use std::collections::VecDeque;

/// Binance's intervals from `1m` to `1d`, with their length.
pub const INTERVALS: [(&str, u64); 12] = [
    ("1m", 60_000),
    ("3m", 180_000),
    ("5m", 300_000),
    ("15m", 900_000),
    ("30m", 1_800_000),
    ("1h", 3_600_000),
    ("2h", 7_200_000),
    ("4h", 14_400_000),
    ("6h", 21_600_000),
    ("8h", 28_800_000),
    ("12h", 43_200_000),
    ("1d", 86_400_000),
];

/// Candles kept per interval (Binance's largest `limit`); one-minute
/// candles keep a day and more, for the 24-hour ticker.
pub const CANDLES_KEPT: usize = 1_000;
pub const MINUTE_CANDLES_KEPT: usize = 1_500;

/// The index of an interval's name in [`INTERVALS`].
pub fn interval(name: &str) -> Option<usize> {
    INTERVALS.iter().position(|(n, _)| *n == name)
}

/// One candle: what the trades in `[open_ms, open_ms + length)` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candle {
    pub open_ms: u64,
    pub open: i64,
    pub high: i64,
    pub low: i64,
    pub close: i64,
    /// Lots traded.
    pub volume: u64,
    /// Sum of price (ticks) times lots.
    pub quote_volume: u128,
    /// Lots traded with a buyer as taker, and their price times lots.
    pub taker_buy_volume: u64,
    pub taker_buy_quote_volume: u128,
    pub trades: u64,
    pub first_trade: u64,
    pub last_trade: u64,
}

impl Candle {
    fn new(open_ms: u64, price: i64, trade_id: u64) -> Candle {
        Candle {
            open_ms,
            open: price,
            high: price,
            low: price,
            close: price,
            volume: 0,
            quote_volume: 0,
            taker_buy_volume: 0,
            taker_buy_quote_volume: 0,
            trades: 0,
            first_trade: trade_id,
            last_trade: trade_id,
        }
    }

    fn add(&mut self, price: i64, qty: u64, buyer_took: bool, trade_id: u64) {
        self.high = self.high.max(price);
        self.low = self.low.min(price);
        self.close = price;
        self.volume += qty;
        let quote = price as u128 * u128::from(qty);
        self.quote_volume += quote;
        if buyer_took {
            self.taker_buy_volume += qty;
            self.taker_buy_quote_volume += quote;
        }
        self.trades += 1;
        self.last_trade = trade_id;
    }
}

/// Every interval's candles of one instrument, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Candles {
    pub series: [VecDeque<Candle>; INTERVALS.len()],
}

impl Candles {
    /// Adds a trade at `time_ms` to the candle of every interval holding
    /// it. Times never go back (the sequencer's stamps do not); a trade
    /// stamped before the newest candle (a clock set back across a
    /// restart) counts in the newest.
    pub fn add(&mut self, time_ms: u64, price: i64, qty: u64, buyer_took: bool, trade_id: u64) {
        // Every interval is a whole number of minutes from the epoch, so a
        // trade in the newest one-minute candle is in the newest candle of
        // every interval: no division for it.
        if let Some(minute) = self.series[0].back()
            && time_ms < minute.open_ms + INTERVALS[0].1
            && self.series.iter().all(|series| !series.is_empty())
        {
            for last in self.series.iter_mut().filter_map(VecDeque::back_mut) {
                last.add(price, qty, buyer_took, trade_id);
            }
            return;
        }
        for (index, (_, length)) in INTERVALS.iter().enumerate() {
            let series = &mut self.series[index];
            let open_ms = time_ms - time_ms % length;
            match series.back_mut() {
                Some(last) if last.open_ms >= open_ms => last.add(price, qty, buyer_took, trade_id),
                _ => {
                    let mut candle = Candle::new(open_ms, price, trade_id);
                    candle.add(price, qty, buyer_took, trade_id);
                    series.push_back(candle);
                    let kept = if index == 0 { MINUTE_CANDLES_KEPT } else { CANDLES_KEPT };
                    if series.len() > kept {
                        series.pop_front();
                    }
                }
            }
        }
    }

    /// The candles of interval `index` that open in `[start, end]`, at most
    /// `limit`: the first ones from `start` if it is given, else the last
    /// ones.
    pub fn range(&self, index: usize, start: Option<u64>, end: Option<u64>, limit: usize) -> Vec<Candle> {
        let series = &self.series[index];
        let within = series.iter().filter(|c| start.is_none_or(|s| c.open_ms + INTERVALS[index].1 > s) && end.is_none_or(|e| c.open_ms <= e));
        if start.is_some() {
            within.take(limit).copied().collect()
        } else {
            let all: Vec<Candle> = within.copied().collect();
            all[all.len().saturating_sub(limit)..].to_vec()
        }
    }

    /// The newest candle of interval `index`.
    pub fn last(&self, index: usize) -> Option<&Candle> {
        self.series[index].back()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trades_fall_into_aligned_candles_of_every_interval() {
        let mut candles = Candles::default();
        let day = 86_400_000u64;
        let t0 = 20_000 * day + 59_000; // 00:00:59 UTC
        candles.add(t0, 100, 2, true, 1);
        candles.add(t0 + 500, 105, 1, false, 2);
        candles.add(t0 + 1_000, 99, 3, true, 3); // 00:01:00: a new minute
        let minute = &candles.series[0];
        assert_eq!(minute.len(), 2);
        assert_eq!((minute[0].open_ms, minute[0].open, minute[0].high, minute[0].low, minute[0].close), (20_000 * day, 100, 105, 100, 105));
        assert_eq!((minute[0].volume, minute[0].quote_volume, minute[0].taker_buy_volume, minute[0].trades), (3, 305, 2, 2));
        assert_eq!((minute[1].open_ms, minute[1].first_trade, minute[1].last_trade), (20_000 * day + 60_000, 3, 3));
        let daily = candles.last(interval("1d").unwrap()).unwrap();
        assert_eq!((daily.open, daily.high, daily.low, daily.close, daily.volume, daily.trades), (100, 105, 99, 99, 6, 3));
        assert_eq!(candles.range(0, Some(20_000 * day + 1), None, 10).len(), 2, "a candle open at the start time's minute is in");
        assert_eq!(candles.range(0, None, None, 1)[0].first_trade, 3, "without a start: the last ones");
        assert_eq!(candles.range(0, None, Some(20_000 * day), 10).len(), 1);
    }

    #[test]
    fn series_are_bounded() {
        let mut candles = Candles::default();
        for minute in 0..2_000u64 {
            candles.add(minute * 60_000, 1, 1, true, minute + 1);
        }
        assert_eq!(candles.series[0].len(), MINUTE_CANDLES_KEPT);
        assert_eq!(candles.series[1].len(), 667);
    }
}
