//! The streams sent on a clock, as Binance sends them: `<symbol>@depth@100ms`
//! and `@depth@1000ms` (the book's diffs of an interval as one,
//! `DepthDiff::merge`), the partial book streams with those suffixes (the
//! best levels once an interval when the book changed), `@ticker` and
//! `@miniTicker` (every second) and `@kline_<interval>` (every two seconds: every candle touched
//! since the last message, as it is now), and crossbook's own
//! `@trade@100ms` (an interval's trades in one message). The plain `@depth`,
//! `@depth5` (10, 20), `@trade` and `@bookTicker` send every batch's
//! (`docs/marketdata.md`, "Streams").
//!
//! Per instrument and stream: at most one message an interval. A change
//! after a quiet interval goes out at once; changes within an interval of
//! the last message wait for its end, together. All of a stream's
//! subscribers share its clock, so they all see the same messages, and
//! merged diffs follow each other without gaps (each `U` the previous
//! `u` plus one) whatever interval they cover. Nothing is kept for a stream nobody
//! follows: a first subscriber's diffs start with the next batch, and
//! Binance's procedure (the snapshot taken after subscribing) takes it from
//! there.
//!
//! The clock is the market-data thread's (`Instant`): when a message goes
//! out is not part of the state and not in the journal; what it says is
//! (the diffs cover journal sequence numbers, `E` is the journal's time of
//! the last batch it covers).

use super::{Hub, Outgoing, Subscriber, fan_out};
use crossbook_marketdata::candles::INTERVALS;
use crossbook_marketdata::{DepthDiff, InstrumentUpdate, Trade, render};
use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

/// The all-market mini ticker stream's name.
pub(crate) const ALL_MINI: &str = "!miniTicker@arr";

/// The partial book streams' sizes.
pub(crate) const PARTIAL_LEVELS: [usize; 3] = [5, 10, 20];

/// The depth streams' speeds: the suffix and its interval.
const SPEEDS: [(&str, Duration); 2] = [("@100ms", Duration::from_millis(100)), ("@1000ms", Duration::from_millis(1000))];

/// Binance's: the 24-hour ticker every second, candles every two.
const TICKER_EVERY: Duration = Duration::from_millis(1000);
const KLINE_EVERY: Duration = Duration::from_millis(2000);
const TRADES_EVERY: Duration = Duration::from_millis(100);

/// The most trades one `@trade@100ms` message lists (the newest; its `n`
/// says how many the interval had).
pub(crate) const TRADES_LISTED: usize = 100;

/// Every stream of a symbol, by its name after `<symbol>@`, at its place
/// in a [`Followed`]: `depth`, the partial books, the trades and the top
/// of the book (sent every batch), then those sent on a clock.
static SUFFIXES: LazyLock<Vec<String>> = LazyLock::new(|| {
    let mut all = vec!["depth".to_string()];
    all.extend(PARTIAL_LEVELS.map(|n| format!("depth{n}")));
    all.extend(["trade", "aggTrade", "bookTicker"].map(String::from));
    all.extend(SPEEDS.map(|(speed, _)| format!("depth{speed}")));
    for (speed, _) in SPEEDS {
        all.extend(PARTIAL_LEVELS.map(|n| format!("depth{n}{speed}")));
    }
    all.extend(["ticker", "miniTicker", "trade@100ms"].map(String::from));
    all.extend(INTERVALS.map(|(interval, _)| format!("kline_{interval}")));
    all
});
pub(crate) const DEPTH: usize = 0;
/// `@depth5`, `@depth10`, `@depth20`: by their place in `PARTIAL_LEVELS`.
pub(crate) const PARTIAL: usize = 1;
pub(crate) const TRADE: usize = 4;
pub(crate) const AGG_TRADE: usize = 5;
pub(crate) const BOOK_TICKER: usize = 6;
/// By speed.
const DIFF: usize = 7;
/// By speed, then by levels.
const PARTIAL_SPEED: usize = 9;
const TICKER: usize = 15;
const MINI_TICKER: usize = 16;
const TRADES: usize = 17;
/// By interval.
const KLINE: usize = 18;
const KINDS: usize = KLINE + INTERVALS.len();

/// The streams of one symbol that somebody follows: found with one look
/// at the subscriptions (the names from `<symbol>@` on), where making each
/// stream's name and looking it up cost some thirty allocations a batch
/// per instrument while anybody at all was subscribed.
pub(crate) struct Followed<'a>([Option<&'a str>; KINDS]);

impl<'a> Followed<'a> {
    pub(crate) fn of(subscribers: &'a BTreeMap<String, Vec<Subscriber>>, symbol: &str) -> Followed<'a> {
        let prefix = format!("{}@", symbol.to_ascii_lowercase());
        let mut names = [None; KINDS];
        let from = subscribers.range::<str, _>((Bound::Included(prefix.as_str()), Bound::Unbounded));
        for name in from.map(|(name, _)| name).take_while(|name| name.starts_with(&prefix)) {
            if let Some(kind) = SUFFIXES.iter().position(|suffix| *suffix == name[prefix.len()..]) {
                names[kind] = Some(name.as_str());
            }
        }
        Followed(names)
    }

    /// The stream of `kind` (`DEPTH`, `TRADE`, ...), if followed.
    pub(crate) fn name(&self, kind: usize) -> Option<&'a str> {
        self.0[kind]
    }

    pub(crate) fn none(&self) -> bool {
        self.0.iter().all(Option::is_none)
    }
}

/// One throttled stream of an instrument.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Stream {
    /// `@depth@100ms` (0) or `@depth@1000ms` (1).
    Diff(usize),
    /// `@depth5@100ms`, `@depth10@...`: the partial books of a speed.
    Partial(usize),
    Ticker,
    MiniTicker,
    /// `@kline_<interval>`, by its index in `INTERVALS`.
    Kline(usize),
    Trades,
    /// `!miniTicker@arr`: every instrument's that traded, in one message.
    AllMini,
}

impl Stream {
    fn every(self) -> Duration {
        match self {
            Stream::Diff(speed) | Stream::Partial(speed) => SPEEDS[speed].1,
            Stream::Ticker | Stream::MiniTicker | Stream::AllMini => TICKER_EVERY,
            Stream::Kline(_) => KLINE_EVERY,
            Stream::Trades => TRADES_EVERY,
        }
    }
}

/// What one stream of an instrument owes its subscribers.
#[derive(Default)]
struct Slot {
    /// Something changed since the last message.
    owed: bool,
    /// The journal time of the last batch owed.
    time_ms: u64,
    /// `Diff`: the diffs since the last message, merged.
    diff: Option<DepthDiff>,
    /// `Kline`: the first trade since the last message.
    first_trade: u64,
    /// `Trades`: the newest trades since the last message, and how many
    /// there were.
    trades: VecDeque<Trade>,
    count: u64,
    /// `AllMini`: the instruments that traded since the last message.
    traded: std::collections::BTreeSet<usize>,
    /// When the last message went out.
    sent: Option<Instant>,
    /// `Kline`: the newest candle of the last message if it was open then
    /// (its open time), and when the message that closes it is due: the
    /// next message includes it again, closed once its time is over.
    open_candle: Option<u64>,
    close_due: Option<Instant>,
}

impl Slot {
    /// `None`: nothing sent yet, so at once.
    fn due(&self, every: Duration) -> Option<Instant> {
        self.sent.map(|sent| sent + every)
    }

    /// When this slot has a message to send next, if it has one (`now`
    /// if it never sent one).
    fn next_message(&self, every: Duration, now: Instant) -> Option<Instant> {
        let owed = self.owed.then(|| self.due(every).unwrap_or(now));
        match (owed, self.close_due) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// The throttled streams' state, kept by the market-data thread.
#[derive(Default)]
pub(crate) struct Throttle {
    slots: BTreeMap<(usize, Stream), Slot>,
    /// The earliest time a message is due, if one is owed (so that
    /// neither a batch nor the wait for one looks at every slot).
    next: Option<Instant>,
}

impl Throttle {
    /// What a batch changed for an instrument, kept for the throttled
    /// streams somebody follows.
    pub(crate) fn changed(&mut self, streams: &Followed, all_mini: bool, update: &InstrumentUpdate, time_ms: u64) {
        let followed = |kind: usize| streams.name(kind).is_some();
        let index = update.index;
        if let Some(diff) = &update.depth {
            for speed in 0..SPEEDS.len() {
                if followed(DIFF + speed) {
                    let slot = self.owe(index, time_ms, Stream::Diff(speed));
                    match slot.diff.as_mut() {
                        Some(pending) => pending.merge(diff),
                        None => slot.diff = Some(diff.clone()),
                    }
                }
                if (0..PARTIAL_LEVELS.len()).any(|level| followed(PARTIAL_SPEED + speed * PARTIAL_LEVELS.len() + level)) {
                    self.owe(index, time_ms, Stream::Partial(speed));
                }
            }
        }
        let Some(first) = update.trades.first() else { return };
        if followed(TICKER) {
            self.owe(index, time_ms, Stream::Ticker);
        }
        if followed(MINI_TICKER) {
            self.owe(index, time_ms, Stream::MiniTicker);
        }
        if all_mini {
            // One slot for all instruments (kept under index 0).
            self.owe(0, time_ms, Stream::AllMini).traded.insert(index);
        }
        for interval in 0..INTERVALS.len() {
            if followed(KLINE + interval) {
                let slot = self.owe(index, time_ms, Stream::Kline(interval));
                if slot.first_trade == 0 {
                    slot.first_trade = first.id;
                }
            }
        }
        if followed(TRADES) {
            let slot = self.owe(index, time_ms, Stream::Trades);
            slot.count += update.trades.len() as u64;
            slot.trades.extend(update.trades.iter().copied());
            let extra = slot.trades.len().saturating_sub(TRADES_LISTED);
            slot.trades.drain(..extra);
        }
    }

    fn owe(&mut self, index: usize, time_ms: u64, stream: Stream) -> &mut Slot {
        let slot = self.slots.entry((index, stream)).or_default();
        if !slot.owed {
            let due = slot.due(stream.every()).unwrap_or_else(Instant::now);
            self.next = Some(self.next.map_or(due, |next| next.min(due)));
        }
        slot.owed = true;
        slot.time_ms = time_ms;
        slot
    }

    /// When the next message is due, if one is owed.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.next
    }

    /// Sends every message due by `now`.
    pub(crate) fn flush(&mut self, hub: &Hub, now: Instant) {
        if self.next.is_none_or(|next| next > now) {
            return;
        }
        let due: Vec<(usize, Stream)> =
            self.slots.iter().filter(|((_, stream), slot)| slot.next_message(stream.every(), now).is_some_and(|due| due <= now)).map(|(key, _)| *key).collect();
        // What stays owed is due after `now`; what is sent now is due again
        // an interval from now, once owed (or when its open candle closes).
        self.next = self.slots.iter().filter(|(key, _)| !due.contains(key)).filter_map(|((_, stream), slot)| slot.next_message(stream.every(), now)).min();
        if due.is_empty() {
            return;
        }
        let subscribers = hub.subscribers();
        let state = hub.read();
        let mut outgoing = Outgoing::new();
        let now_ms = crate::now_ms();
        for key in due {
            let Some(slot) = self.slots.get_mut(&key) else { continue };
            let (index, stream) = key;
            let data = &state.instruments[index];
            let symbol = data.info.binance.to_ascii_lowercase();
            let time_ms = slot.time_ms;
            let mut send = |name: String, payloads: &dyn Fn() -> Vec<String>| fan_out(&subscribers, &mut outgoing, &name, payloads);
            match stream {
                Stream::Diff(speed) => {
                    if let Some(diff) = slot.diff.take() {
                        send(format!("{symbol}@depth{}", SPEEDS[speed].0), &|| vec![render::depth_update_text(data, &diff, time_ms)]);
                    }
                }
                Stream::Partial(speed) => {
                    for levels in PARTIAL_LEVELS {
                        send(format!("{symbol}@depth{levels}{}", SPEEDS[speed].0), &|| vec![render::partial_depth(&state, data, levels).to_string()]);
                    }
                }
                // The tickers are drawn from the state as it is now (the
                // book's top too, which a later batch may have moved
                // without a trade): their `E` is its time.
                Stream::Ticker => send(format!("{symbol}@ticker"), &|| vec![render::ticker_update(&state, index, state.time_ms).to_string()]),
                Stream::MiniTicker => send(format!("{symbol}@miniTicker"), &|| vec![render::mini_ticker_update(&state, index, state.time_ms).to_string()]),
                Stream::AllMini => {
                    let traded = std::mem::take(&mut slot.traded);
                    send(ALL_MINI.to_string(), &|| vec![serde_json::Value::Array(traded.iter().map(|&i| render::mini_ticker_update(&state, i, state.time_ms)).collect()).to_string()]);
                }
                Stream::Kline(interval) => {
                    let first = std::mem::take(&mut slot.first_trade);
                    // A message that only closes a candle covers no batch:
                    // its `E` is the state's time.
                    let time_ms = if slot.owed { time_ms } else { state.time_ms };
                    let candles = render::kline_updates(data, interval, first, slot.open_candle, time_ms, now_ms);
                    // The newest candle sent, if still open, is sent again
                    // closed once its time is over (by this server's
                    // clock, the one the journal stamps commands with),
                    // not sooner than the stream's interval.
                    let newest = candles.last().and_then(|c| Some((c["k"]["t"].as_u64()?, c["k"]["T"].as_u64()?, c["k"]["x"].as_bool()?)));
                    (slot.open_candle, slot.close_due) = match newest {
                        Some((open_ms, close_ms, false)) => {
                            let closes = now + Duration::from_millis((close_ms + 1).saturating_sub(now_ms));
                            (Some(open_ms), Some(closes.max(now + KLINE_EVERY)))
                        }
                        _ => (None, None),
                    };
                    if let Some(due) = slot.close_due {
                        self.next = Some(self.next.map_or(due, |next| next.min(due)));
                    }
                    if !candles.is_empty() {
                        send(format!("{symbol}@kline_{}", INTERVALS[interval].0), &|| candles.iter().map(ToString::to_string).collect());
                    }
                }
                Stream::Trades => {
                    let (trades, count) = (std::mem::take(&mut slot.trades), std::mem::take(&mut slot.count));
                    send(format!("{symbol}@trade@100ms"), &|| vec![render::trades_text(data, trades.iter().copied(), count, time_ms)]);
                }
            }
            slot.owed = false;
            slot.sent = Some(now);
        }
        drop(state);
        drop(subscribers);
        hub.deliver_all(outgoing);
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Connection, Wrap};
    use super::*;
    use std::sync::Arc;

    #[test]
    fn every_stream_of_a_symbol_has_its_place() {
        assert_eq!(SUFFIXES.len(), KINDS);
        for (kind, suffix) in [
            (DEPTH, "depth"),
            (PARTIAL, "depth5"),
            (PARTIAL + 2, "depth20"),
            (TRADE, "trade"),
            (AGG_TRADE, "aggTrade"),
            (BOOK_TICKER, "bookTicker"),
            (DIFF, "depth@100ms"),
            (DIFF + 1, "depth@1000ms"),
            (PARTIAL_SPEED, "depth5@100ms"),
            (PARTIAL_SPEED + 5, "depth20@1000ms"),
            (TICKER, "ticker"),
            (MINI_TICKER, "miniTicker"),
            (TRADES, "trade@100ms"),
            (KLINE, "kline_1m"),
            (KINDS - 1, "kline_1M"),
        ] {
            assert_eq!(SUFFIXES[kind], suffix);
        }
    }

    #[test]
    fn a_symbols_followed_streams_are_its_own() {
        let (out, _messages) = tokio::sync::mpsc::unbounded_channel();
        let connection = Arc::new(Connection { id: 1, out, waiting: 0.into(), dropped: false.into(), wake: tokio::sync::Notify::new() });
        let mut subscribers = BTreeMap::new();
        for name in ["btcusd@trade", "btcusd@kline_1w", "btcusdt@depth", "btcusd@nonsense", ALL_MINI, "btcusc@depth"] {
            subscribers.insert(name.to_string(), vec![Subscriber { connection: connection.clone(), wrap: Wrap::Raw }]);
        }
        let followed = Followed::of(&subscribers, "BTCUSD");
        assert_eq!(followed.name(TRADE), Some("btcusd@trade"));
        assert_eq!(followed.name(KLINE + crossbook_marketdata::candles::interval("1w").unwrap()), Some("btcusd@kline_1w"));
        assert_eq!(followed.name(DEPTH), None, "another symbol's, whose name starts the same");
        assert_eq!((0..KINDS).filter(|&kind| followed.name(kind).is_some()).count(), 2);
        assert!(Followed::of(&subscribers, "ETHUSD").none());
    }
}
