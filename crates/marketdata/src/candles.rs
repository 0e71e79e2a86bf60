//! Candles (klines) of every Binance interval from one minute to one
//! month, kept per instrument: those from `1m` to `1d` updated trade by
//! trade from the trades' journal times, and `3d`, `1w` and `1M` drawn from
//! the day candles when asked for (each is a run of whole days), so that a
//! trade updates twelve candles, not fifteen, and snapshots hold twelve
//! series.

use std::borrow::Cow;
use std::collections::VecDeque;

const DAY: u64 = 86_400_000;

/// Binance's intervals from `1m` to `1M`, with their length (`1M`: the
/// longest month's, the stride that reaches the next month from the first
/// day of one). The first [`KEPT`] are kept trade by trade; the others are
/// drawn from the day candles.
pub const INTERVALS: [(&str, u64); 15] = [
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
    ("1d", DAY),
    ("3d", 3 * DAY),
    ("1w", 7 * DAY),
    ("1M", 31 * DAY),
];

/// The intervals kept trade by trade: `1m` to `1d`; `1d` is the last.
pub const KEPT: usize = 12;
const DAILY: usize = KEPT - 1;

/// Candles kept per interval (Binance's largest `limit`); one-minute
/// candles keep a day and more, for the 24-hour ticker.
pub const CANDLES_KEPT: usize = 1_000;
pub const MINUTE_CANDLES_KEPT: usize = 1_500;

/// The index of an interval's name in [`INTERVALS`].
pub fn interval(name: &str) -> Option<usize> {
    INTERVALS.iter().position(|(n, _)| *n == name)
}

/// The open time of interval `index`'s candle holding `time_ms`, aligned
/// as Binance aligns them in UTC: a whole number of lengths from the epoch,
/// but weeks from Monday 00:00 and months from their first day 00:00.
pub fn open_of(index: usize, time_ms: u64) -> u64 {
    match INTERVALS[index].0 {
        "1w" => {
            // The epoch was a Thursday: Mondays are 4 days past a multiple
            // of 7 (a time in the epoch's own week opens at the epoch).
            let shifted = time_ms + 3 * DAY;
            (shifted - shifted % (7 * DAY)).saturating_sub(3 * DAY)
        }
        "1M" => {
            let days = time_ms / DAY;
            let day_of_month = civil_day_of_month(days);
            (days - (day_of_month - 1)) * DAY
        }
        _ => time_ms - time_ms % INTERVALS[index].1,
    }
}

/// The last millisecond of interval `index`'s candle opening at `open_ms`.
pub fn close_of(index: usize, open_ms: u64) -> u64 {
    open_of(index, open_ms + INTERVALS[index].1) - 1
}

/// The day of the month (1 to 31) of the `days`-th day after 1970-01-01
/// in the proleptic Gregorian calendar (Howard Hinnant's `civil_from_days`,
/// for days on or after the epoch).
fn civil_day_of_month(days: u64) -> u64 {
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z - era * 146_097;
    let year_of_era = (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    day_of_year - (153 * month_index + 2) / 5 + 1
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

    /// The next candle of the same run of days folded into this one.
    fn merge(&mut self, next: &Candle) {
        self.high = self.high.max(next.high);
        self.low = self.low.min(next.low);
        self.close = next.close;
        self.volume += next.volume;
        self.quote_volume += next.quote_volume;
        self.taker_buy_volume += next.taker_buy_volume;
        self.taker_buy_quote_volume += next.taker_buy_quote_volume;
        self.trades += next.trades;
        self.last_trade = next.last_trade;
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

/// The kept intervals' candles of one instrument, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Candles {
    pub series: [VecDeque<Candle>; KEPT],
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
        for (index, (_, length)) in INTERVALS[..KEPT].iter().enumerate() {
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

    /// Interval `index`'s candles, oldest first: a kept series as it is,
    /// or one drawn from the day candles. Of a drawn one, the oldest is
    /// left out when the day candles kept may not reach back to its start.
    pub fn series(&self, index: usize) -> Cow<'_, VecDeque<Candle>> {
        if index < KEPT {
            return Cow::Borrowed(&self.series[index]);
        }
        let days = &self.series[DAILY];
        let mut drawn: VecDeque<Candle> = VecDeque::new();
        for day in days {
            let open_ms = open_of(index, day.open_ms);
            match drawn.back_mut() {
                Some(last) if last.open_ms == open_ms => last.merge(day),
                _ => drawn.push_back(Candle { open_ms, ..*day }),
            }
        }
        if days.len() >= CANDLES_KEPT && days.front().is_some_and(|first| drawn.front().is_some_and(|c| c.open_ms < first.open_ms)) {
            drawn.pop_front();
        }
        Cow::Owned(drawn)
    }

    /// The candles of interval `index` that overlap `[start, end]`, at most
    /// `limit`: the first ones from `start` if it is given, else the last
    /// ones.
    pub fn range(&self, index: usize, start: Option<u64>, end: Option<u64>, limit: usize) -> Vec<Candle> {
        let series = self.series(index);
        let within = series.iter().filter(|c| start.is_none_or(|s| close_of(index, c.open_ms) >= s) && end.is_none_or(|e| c.open_ms <= e));
        if start.is_some() {
            within.take(limit).copied().collect()
        } else {
            let all: Vec<Candle> = within.copied().collect();
            all[all.len().saturating_sub(limit)..].to_vec()
        }
    }

    /// The newest candle of interval `index`.
    pub fn last(&self, index: usize) -> Option<Candle> {
        self.series(index).back().copied()
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

    #[test]
    fn weeks_open_on_monday_and_months_on_their_first_day() {
        let (week, month, three_days) = (interval("1w").unwrap(), interval("1M").unwrap(), interval("3d").unwrap());
        // Binance's documented kline: a week from Monday 2017-07-03.
        assert_eq!(open_of(week, 1_499_040_000_000 + 5 * DAY + 7), 1_499_040_000_000);
        assert_eq!(close_of(week, 1_499_040_000_000), 1_499_644_799_999);
        assert_eq!(open_of(week, 1_499_040_000_000 - 1), 1_499_040_000_000 - 7 * DAY);
        // Months: a leap February, one ending a year, and 2000 and 2100
        // (a leap year and not one, though both divide by 100).
        for (inside, first, next) in [
            (1_706_745_600_000 + 14 * DAY, 1_706_745_600_000, 1_709_251_200_000),
            (1_704_067_200_000 - 1, 1_701_388_800_000, 1_704_067_200_000),
            (949_363_200_000 + 28 * DAY + 5, 949_363_200_000, 951_868_800_000),
            (4_105_123_200_000 + 27 * DAY, 4_105_123_200_000, 4_107_542_400_000),
        ] {
            assert_eq!(open_of(month, inside), first);
            assert_eq!(open_of(month, first), first);
            assert_eq!(close_of(month, first), next - 1);
        }
        assert_eq!(open_of(three_days, 5 * DAY + 1), 3 * DAY);
        assert_eq!(close_of(three_days, 3 * DAY), 6 * DAY - 1);
    }

    #[test]
    fn drawn_intervals_equal_candles_kept_trade_by_trade() {
        // Trades every seven hours for 120 days, each candle of 3d, 1w and
        // 1M drawn from the days against one built from the trades.
        let mut candles = Candles::default();
        let start = 1_704_067_200_000 + 3 * 3_600_000; // 2024-01-01 03:00
        let trades: Vec<(u64, i64, u64, bool)> = (0..411u64).map(|n| (start + n * 7 * 3_600_000, 100 + (n * 37 % 23) as i64, 1 + n % 5, n % 3 == 0)).collect();
        for (n, &(time, price, qty, buyer_took)) in trades.iter().enumerate() {
            candles.add(time, price, qty, buyer_took, n as u64 + 1);
        }
        for name in ["3d", "1w", "1M"] {
            let index = interval(name).unwrap();
            let mut built: VecDeque<Candle> = VecDeque::new();
            for (n, &(time, price, qty, buyer_took)) in trades.iter().enumerate() {
                let open_ms = open_of(index, time);
                if built.back().is_none_or(|c| c.open_ms != open_ms) {
                    built.push_back(Candle::new(open_ms, price, n as u64 + 1));
                }
                built.back_mut().unwrap().add(price, qty, buyer_took, n as u64 + 1);
            }
            assert_eq!(*candles.series(index), built, "{name}");
            assert!(built.len() > 3, "{name}: several candles");
        }
        let month = interval("1M").unwrap();
        assert_eq!(candles.range(month, Some(1_706_745_600_000), Some(1_706_745_600_000), 10).len(), 1, "February alone");
        assert_eq!(candles.range(month, Some(1_706_745_600_000 - 1), None, 2)[0].open_ms, 1_704_067_200_000, "January's last millisecond is in January");
        assert_eq!(candles.last(month).map(|c| c.last_trade), Some(411));
    }

    #[test]
    fn a_drawn_candle_the_kept_days_do_not_cover_whole_is_left_out() {
        let mut candles = Candles::default();
        // 1,001 days from a Wednesday: the first day falls out of the
        // kept ones, and with it the first (now partial) week.
        let wednesday = 1_499_040_000_000 + 2 * DAY;
        for day in 0..1_001u64 {
            candles.add(wednesday + day * DAY, 1, 1, true, day + 1);
        }
        let week = interval("1w").unwrap();
        let weeks = candles.series(week);
        assert_eq!(weeks.front().map(|c| c.open_ms), Some(1_499_040_000_000 + 7 * DAY));
        assert_eq!(weeks.front().map(|c| (c.trades, c.first_trade)), Some((7, 6)));
    }
}
