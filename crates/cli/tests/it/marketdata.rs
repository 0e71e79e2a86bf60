//! Market data over HTTP and WebSocket against the engine it follows.
//!
//! While `crossbook load` trades, a client written here from
//! `docs/marketdata.md` keeps a local book by Binance's documented
//! procedure (buffer the `@depth` diffs, take a REST snapshot, apply the
//! diffs after it, check that each follows the last) and drops its
//! connection at random moments, recovering the same way. At the end its
//! book equals `GET /api/v3/depth` and the book of the engine recovered
//! from the journal; its trades equal the engine's trades replayed from the
//! journal (prices, sizes, sides, times); the candles and the 24-hour
//! ticker equal what those trades imply. Then bad input: each costs only
//! its own connection.

use crate::serve::{Server, spawn_with};
use crate::support::TempDir;
use crossbook_engine::{Engine, EventKind, Side};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};
use tungstenite::stream::MaybeTlsStream;
use tungstenite::{Message, WebSocket};

type Socket = WebSocket<MaybeTlsStream<TcpStream>>;

/// One HTTP/1.1 GET: status and body.
pub(crate) fn http_get(address: &str, path: &str) -> (u16, String) {
    raw_http(address, format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n").as_bytes())
}

fn raw_http(address: &str, request: &[u8]) -> (u16, String) {
    let mut stream = TcpStream::connect(address).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let _ = stream.write_all(request);
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    let text = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, body.to_string())
}

fn json_get(address: &str, path: &str) -> Value {
    let (status, body) = http_get(address, path);
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
}

fn connect(address: &str, path: &str) -> Socket {
    let (socket, _) = tungstenite::connect(format!("ws://{address}{path}")).unwrap_or_else(|e| panic!("WebSocket {path}: {e}"));
    polled(socket)
}

/// `socket` with a 100 ms read timeout (a read finding nothing gives
/// back control).
fn polled(socket: Socket) -> Socket {
    if let MaybeTlsStream::Plain(stream) = socket.get_ref() {
        stream.set_read_timeout(Some(Duration::from_millis(100))).expect("timeout");
    }
    socket
}

/// [`connect`] once the server has a connection slot free (connections
/// closed a moment ago give theirs back when the server has seen them go:
/// asked again for 10 s while it answers 503).
fn connect_when_free(address: &str, path: &str) -> Socket {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match tungstenite::connect(format!("ws://{address}{path}")) {
            Err(tungstenite::Error::Http(ref r)) if r.status() == 503 && Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Ok((socket, _)) => return polled(socket),
            Err(e) => panic!("WebSocket {path}: {e}"),
        }
    }
}

/// The next text message, `None` on a read timeout (or on a read a
/// signal cut short: with a read timeout set, the kernel does not restart
/// it); panics if closed.
fn next_text(socket: &mut Socket) -> Option<Value> {
    loop {
        match socket.read() {
            Ok(Message::Text(text)) => return Some(serde_json::from_str(text.as_str()).expect("JSON")),
            Ok(Message::Close(frame)) => panic!("closed: {frame:?}"),
            Ok(_) => {}
            Err(tungstenite::Error::Io(e)) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut | std::io::ErrorKind::Interrupted) => return None,
            Err(e) => panic!("read: {e}"),
        }
    }
}

fn number(value: &Value) -> i64 {
    value.as_str().and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("not an integer string: {value}"))
}

fn levels(value: &Value) -> BTreeMap<i64, i64> {
    value.as_array().expect("levels").iter().map(|l| (number(&l[0]), number(&l[1]))).collect()
}

/// A book as Binance's procedure keeps it.
#[derive(Debug, Default, PartialEq, Eq)]
struct LocalBook {
    bids: BTreeMap<i64, i64>,
    asks: BTreeMap<i64, i64>,
    last: u64,
}

impl LocalBook {
    /// The same levels as `rest` (a REST snapshot taken once the feed was
    /// quiet), as of a command no later than its `lastUpdateId`: the last
    /// diff ends with the last command that changed the book, and the
    /// snapshot's id is the last command of all.
    fn assert_matches(&self, rest: &LocalBook, what: &str) {
        assert_eq!((&self.bids, &self.asks), (&rest.bids, &rest.asks), "{what}: the levels");
        assert!(self.last <= rest.last, "{what}: the book at {} is past the snapshot's {}", self.last, rest.last);
    }

    fn from_snapshot(snapshot: &Value) -> LocalBook {
        LocalBook { bids: levels(&snapshot["bids"]), asks: levels(&snapshot["asks"]), last: snapshot["lastUpdateId"].as_u64().expect("lastUpdateId") }
    }

    /// Applies a diff by the procedure: `Some(true)` applied, `Some(false)`
    /// older than the book (dropped), `None` if it does not follow on.
    fn apply(&mut self, diff: &Value, first: bool) -> Option<bool> {
        let (from, to) = (diff["U"].as_u64().expect("U"), diff["u"].as_u64().expect("u"));
        if to <= self.last {
            return Some(false);
        }
        let follows = if first { from <= self.last + 1 } else { from == self.last + 1 };
        if !follows {
            return None;
        }
        for (side, key) in [(&mut self.bids, "b"), (&mut self.asks, "a")] {
            for (price, qty) in levels(&diff[key]) {
                if qty == 0 {
                    side.remove(&price);
                } else {
                    side.insert(price, qty);
                }
            }
        }
        self.last = to;
        Some(true)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SeenTrade {
    price: i64,
    qty: i64,
    time: u64,
    buyer_is_maker: bool,
}

fn trade_of(value: &Value, price: &str, qty: &str, time: &str, maker: &str) -> (u64, SeenTrade) {
    let id = value.get("t").or_else(|| value.get("id")).or_else(|| value.get("a")).and_then(Value::as_u64).expect("trade id");
    (id, SeenTrade { price: number(&value[price]), qty: number(&value[qty]), time: value[time].as_u64().expect("time"), buyer_is_maker: value[maker].as_bool().expect("maker") })
}

/// A trade of `@aggTrade` or `GET /api/v3/aggTrades`: each its own
/// aggregate, first and last trade id its own.
fn aggregate_of(value: &Value) -> (u64, SeenTrade) {
    let id = value["a"].as_u64();
    assert_eq!((value["f"].as_u64(), value["l"].as_u64()), (id, id), "an aggregate of one trade: {value}");
    trade_of(value, "p", "q", "T", "m")
}

/// The client: keeps a local book and every trade, dropping its
/// connection every few hundred milliseconds until `stop` holds the REST
/// snapshot's update id once trading stopped, and then the feed has been
/// quiet for half a second.
fn follow_feed(address: &str, stop: &std::sync::atomic::AtomicU64, trades: &mut BTreeMap<u64, SeenTrade>, aggregates: &mut BTreeMap<u64, SeenTrade>) -> (LocalBook, u32) {
    let mut seed = 0x9e37_79b9u64;
    let mut connections = 0;
    loop {
        connections += 1;
        let mut socket = connect(address, "/stream?streams=btcusd@depth/btcusd@trade/btcusd@aggTrade");
        // Diffs buffered from the moment the stream is open; then the
        // snapshot; then the buffer and what follows, by the procedure.
        let mut buffered = Vec::new();
        while let Some(message) = next_text(&mut socket) {
            buffered.push(message);
            if buffered.len() > 3 {
                break;
            }
        }
        let mut book = LocalBook::from_snapshot(&json_get(address, "/api/v3/depth?symbol=BTCUSD&limit=5000"));
        for t in json_get(address, "/api/v3/trades?symbol=BTCUSD&limit=1000").as_array().expect("trades") {
            let (id, trade) = trade_of(t, "price", "qty", "time", "isBuyerMaker");
            trades.insert(id, trade);
        }
        for t in json_get(address, "/api/v3/aggTrades?symbol=BTCUSD&limit=1000").as_array().expect("aggregate trades") {
            let (id, trade) = aggregate_of(t);
            aggregates.insert(id, trade);
        }
        let mut first = true;
        let mut quiet_since = Instant::now();
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let stay = Duration::from_millis(200 + (seed >> 33) % 600);
        let opened = Instant::now();
        loop {
            let message = if buffered.is_empty() { next_text(&mut socket) } else { Some(buffered.remove(0)) };
            let quiet_at = stop.load(std::sync::atomic::Ordering::Acquire);
            match message {
                Some(message) => {
                    quiet_since = Instant::now();
                    let data = &message["data"];
                    if message["stream"] == "btcusd@depth" {
                        let before = book.last;
                        match book.apply(data, first) {
                            Some(true) => first = false,
                            Some(false) => {}
                            None => panic!("diff {}..={} does not follow {before} (first: {first})", data["U"], data["u"]),
                        }
                    } else if message["stream"] == "btcusd@aggTrade" {
                        let (id, trade) = aggregate_of(data);
                        aggregates.insert(id, trade);
                    } else {
                        let (id, trade) = trade_of(data, "p", "q", "T", "m");
                        trades.insert(id, trade);
                    }
                }
                None if quiet_at > 0 && quiet_since.elapsed() > Duration::from_millis(500) => return (book, connections),
                None => {}
            }
            if quiet_at == 0 && opened.elapsed() > stay {
                break;
            }
        }
        drop(socket);
    }
}

/// The engine's book and trades (with their journal times), replayed from
/// the data directory.
fn engine_truth(data: &Path) -> (BTreeMap<i64, i64>, BTreeMap<i64, i64>, Vec<SeenTrade>) {
    let mut engine = Engine::new();
    let mut events = Vec::new();
    let mut trades = Vec::new();
    crossbook_journal::scan_timed_from(data, 1, |_, time, payload, _| {
        let (command, _) = crossbook_journal::format::split_payload(payload)?;
        events.clear();
        engine.apply(&command, &mut events);
        for event in &events {
            if let EventKind::Trade { price, qty, taker_side, .. } = event.kind {
                trades.push(SeenTrade { price, qty: qty as i64, time, buyer_is_maker: taker_side == Side::Sell });
            }
        }
        Ok(())
    })
    .expect("the journal reads back");
    let (mut bids, mut asks) = (BTreeMap::new(), BTreeMap::new());
    for (side, price, qty, _) in engine.depth(1).unwrap_or_default() {
        match side {
            Side::Buy => bids.insert(price, qty as i64),
            Side::Sell => asks.insert(price, qty as i64),
        };
    }
    (bids, asks, trades)
}

fn start(dir: &Path, config: Option<&Path>) -> Server {
    let data = dir.join("data");
    let mut args = vec!["--listen".to_string(), "127.0.0.1:0".to_string(), "--data".to_string(), data.to_string_lossy().into_owned()];
    if let Some(config) = config {
        args.extend(["--config".to_string(), config.to_string_lossy().into_owned()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    spawn_with(&args, &[])
}

fn load(address: &str, seconds: u32, rate: u32) -> std::process::Child {
    load_with(address, &["--connections", "4", "--duration", &seconds.to_string(), "--rate", &rate.to_string()])
}

/// `crossbook load` against `address` with `args`, running.
fn load_with(address: &str, args: &[&str]) -> std::process::Child {
    std::process::Command::new(env!("CARGO_BIN_EXE_crossbook"))
        .args(["load", "--address", address])
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("crossbook load")
}

#[test]
fn a_local_book_kept_from_the_feed_equals_rest_and_the_engine_and_so_do_trades_and_candles() {
    feed_differential("md-feed", &[]);
}

/// The same with the real-time streams sent at most every 5 ms
/// (`market_data.send_interval_us`): diffs that cover what came within
/// an interval still follow each other without a gap.
#[test]
fn the_feed_differential_holds_with_a_send_interval() {
    feed_differential("md-feed-interval", &[("send_interval_us = 0 ", "send_interval_us = 5000 ")]);
}

/// While `crossbook load` trades, a client keeps a local book from the
/// feed by Binance's procedure (dropping its connection at random), then
/// its book, trades, candles and ticker are compared with REST and the
/// engine's, on the repository's configuration with `edits`.
fn feed_differential(name: &str, edits: &[(&str, &str)]) {
    let dir = TempDir::new(name);
    let config = (!edits.is_empty()).then(|| edited_config(&dir.0, "edited.toml", edits));
    let server = start(&dir.0, config.as_deref());
    let market = server.market_address.clone();
    assert!(!market.is_empty(), "{:?}", server.startup);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let client = {
        let (market, stop) = (market.clone(), stop.clone());
        std::thread::spawn(move || {
            let (mut trades, mut aggregates) = (BTreeMap::new(), BTreeMap::new());
            let (book, connections) = follow_feed(&market, &stop, &mut trades, &mut aggregates);
            (book, connections, trades, aggregates)
        })
    };
    let mut trading = load(&server.address, 3, 2_000);
    assert!(trading.wait().expect("load").success());
    // Quiet: the snapshot's update id no longer moves.
    let mut last = 0;
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let id = json_get(&market, "/api/v3/depth?symbol=BTCUSD&limit=1")["lastUpdateId"].as_u64().expect("id");
        if id == last {
            break;
        }
        last = id;
    }
    stop.store(last, std::sync::atomic::Ordering::Release);
    let (book, connections, trades, aggregates) = client.join().expect("the client");
    let rest = LocalBook::from_snapshot(&json_get(&market, "/api/v3/depth?symbol=BTCUSD&limit=5000"));
    book.assert_matches(&rest, "the local book and GET /api/v3/depth");
    assert!(connections >= 3, "the client reconnected ({connections} connections)");
    let klines = json_get(&market, "/api/v3/klines?symbol=BTCUSD&interval=1m&limit=1000");
    assert_eq!(json_get(&market, "/api/v3/uiKlines?symbol=BTCUSD&interval=1m&limit=1000"), klines, "uiKlines are klines");
    let longer: Vec<(&str, serde_json::Value)> = ["1h", "1d", "3d", "1w", "1M"].into_iter().map(|i| (i, json_get(&market, &format!("/api/v3/klines?symbol=BTCUSD&interval={i}")))).collect();
    let ticker = json_get(&market, "/api/v3/ticker/24hr?symbol=BTCUSD");
    let price = json_get(&market, "/api/v3/ticker/price?symbol=BTCUSD");
    assert_eq!((&price["symbol"], &price["price"]), (&ticker["symbol"], &ticker["lastPrice"]), "ticker/price is the 24 h ticker's last price");
    assert_eq!(json_get(&market, "/api/v3/ticker/price"), serde_json::json!([price]), "ticker/price of every symbol (one here)");
    assert!(server.terminate().success());

    let (bids, asks, engine_trades) = engine_truth(&dir.0.join("data"));
    assert_eq!((&book.bids, &book.asks), (&bids, &asks), "the local book and the engine's");
    assert!(engine_trades.len() > 100, "{} trades", engine_trades.len());
    let seen: Vec<SeenTrade> = trades.values().copied().collect();
    assert_eq!(trades.keys().copied().collect::<Vec<_>>(), (1..=engine_trades.len() as u64).collect::<Vec<_>>(), "trade ids 1.. without gaps");
    assert_eq!(seen, engine_trades, "the feed's trades and the engine's");
    assert_eq!(aggregates, trades, "@aggTrade (with GET /api/v3/aggTrades) and @trade (with GET /api/v3/trades)");

    // Candles of every length and the ticker, from the engine's trades:
    // each candle's open and close time, prices, volume and count.
    type Candles = BTreeMap<(u64, u64), (i64, i64, i64, i64, i64, u64)>;
    let candles_of = |period: &dyn Fn(u64) -> (u64, u64)| {
        let mut candles = Candles::new();
        for t in &engine_trades {
            let c = candles.entry(period(t.time)).or_insert((t.price, t.price, t.price, t.price, 0, 0));
            c.1 = c.1.max(t.price);
            c.2 = c.2.min(t.price);
            c.3 = t.price;
            c.4 += t.qty;
            c.5 += 1;
        }
        candles
    };
    let served = |klines: &serde_json::Value| -> Candles {
        klines
            .as_array()
            .expect("klines")
            .iter()
            .map(|k| {
                let times = (k[0].as_u64().expect("open time"), k[6].as_u64().expect("close time"));
                (times, (number(&k[1]), number(&k[2]), number(&k[3]), number(&k[4]), number(&k[5]), k[8].as_u64().expect("count")))
            })
            .collect()
    };
    let aligned = |length: u64| move |time: u64| (time - time % length, time - time % length + length - 1);
    const DAY: u64 = 86_400_000;
    assert_eq!(served(&klines), candles_of(&aligned(60_000)), "GET /api/v3/klines and the candles of the engine's trades");
    for (interval, klines) in &longer {
        let period: Box<dyn Fn(u64) -> (u64, u64)> = match *interval {
            "1h" => Box::new(aligned(3_600_000)),
            "1d" => Box::new(aligned(DAY)),
            "3d" => Box::new(aligned(3 * DAY)),
            // Monday to Sunday: 1970-01-05 was the first Monday.
            "1w" => Box::new(|time: u64| {
                let open = (time - 4 * DAY) / (7 * DAY) * (7 * DAY) + 4 * DAY;
                (open, open + 7 * DAY - 1)
            }),
            // Calendar months, counted from 1970.
            _ => Box::new(|time: u64| {
                let (mut open, mut year, mut month) = (0u64, 1970u64, 0usize);
                loop {
                    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
                    let days = [31, if leap { 29 } else { 28 }, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][month];
                    if time < open + days * DAY {
                        return (open, open + days * DAY - 1);
                    }
                    open += days * DAY;
                    (year, month) = if month == 11 { (year + 1, 0) } else { (year, month + 1) };
                }
            }),
        };
        assert_eq!(served(klines), candles_of(&*period), "GET /api/v3/klines?interval={interval} and the engine's trades");
    }
    assert_eq!(ticker["count"].as_u64(), Some(engine_trades.len() as u64));
    assert_eq!(number(&ticker["volume"]), engine_trades.iter().map(|t| t.qty).sum::<i64>());
    assert_eq!(number(&ticker["lastPrice"]), engine_trades.last().expect("a trade").price);
    assert_eq!(number(&ticker["highPrice"]), engine_trades.iter().map(|t| t.price).max().expect("a trade"));
    assert_eq!(number(&ticker["lowPrice"]), engine_trades.iter().map(|t| t.price).min().expect("a trade"));
}

/// The streams sent on a clock (`docs/marketdata.md`, "Streams"): while
/// `crossbook load` trades, one connection follows `@depth@100ms` and
/// `@depth@1000ms` (a local book from each by Binance's procedure),
/// `@depth5@100ms`, `@trade@100ms`, `@ticker`, `@kline_1m` and
/// `!miniTicker@arr` (and another, opened as ccxt does at `/ws/0`,
/// `@miniTicker`). Each stream
/// sends at most one message an interval (counted against the time the
/// connection was open, which only a slower machine lengthens), the merged
/// diffs follow each other without gaps and build the book of `GET
/// /api/v3/depth`, the trades lists hold every trade once, in order, and
/// the last partial book, ticker and candle are what REST says at the end.
#[test]
fn the_streams_on_a_clock_send_an_interval_at_a_time_and_end_on_the_final_state() {
    let dir = TempDir::new("md-clock");
    let server = start(&dir.0, None);
    let market = server.market_address.clone();
    let streams = ["depth@100ms", "depth@1000ms", "depth5@100ms", "trade@100ms", "ticker", "kline_1m"];
    let path = format!("/stream?streams={}/!miniTicker@arr", streams.map(|s| format!("btcusd@{s}")).join("/"));
    // `/ws/<n>` (up to four digits) is a connection with no stream yet, as
    // ccxt opens them; it subscribes to `@miniTicker`. Five digits are an
    // unknown stream.
    let refused = tungstenite::connect(format!("ws://{market}/ws/12345"));
    assert!(matches!(refused, Err(tungstenite::Error::Http(ref r)) if r.status() == 400), "{refused:?}");
    let mut mini = connect(&market, "/ws/0");
    mini.send(Message::Text(r#"{"method":"SUBSCRIBE","params":["btcusd@miniTicker"],"id":7}"#.into())).expect("send");
    let deadline = Instant::now() + Duration::from_secs(5);
    let answer = loop {
        if let Some(answer) = next_text(&mut mini) {
            break answer;
        }
        assert!(Instant::now() < deadline, "no answer to SUBSCRIBE");
    };
    assert_eq!(answer, serde_json::json!({"result": null, "id": 7}));
    let opened = Instant::now();
    let mut socket = connect(&market, &path);
    // Subscribed: the snapshot both local books start from.
    let snapshot = json_get(&market, "/api/v3/depth?symbol=BTCUSD&limit=5000");
    let mut books = [LocalBook::from_snapshot(&snapshot), LocalBook::from_snapshot(&snapshot)];
    let mut applied = [0usize; 2];
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    let mut last: BTreeMap<String, Value> = BTreeMap::new();
    let mut trade_ids: Vec<u64> = Vec::new();
    let mut listed_all = true;
    let mut trading = load(&server.address, 3, 2_000);
    let mut quiet_since: Option<Instant> = None;
    // Until trading has stopped and nothing came for 2.5 s (a candle
    // message is due at most every 2 s).
    loop {
        match next_text(&mut socket) {
            Some(message) => {
                quiet_since = None;
                let stream = message["stream"].as_str().expect("stream").to_string();
                let data = &message["data"];
                *counts.entry(stream.clone()).or_default() += 1;
                match stream.as_str() {
                    "btcusd@depth@100ms" | "btcusd@depth@1000ms" => {
                        let which = usize::from(stream.ends_with("1000ms"));
                        let before = books[which].last;
                        match books[which].apply(data, applied[which] == 0) {
                            Some(true) => applied[which] += 1,
                            Some(false) => {}
                            None => panic!("{stream}: diff {}..={} does not follow {before}", data["U"], data["u"]),
                        }
                    }
                    "btcusd@trade@100ms" => {
                        let listed = data["t"].as_array().expect("t");
                        assert!(!listed.is_empty() && listed.len() <= 100, "{} trades listed", listed.len());
                        listed_all &= data["n"].as_u64() == Some(listed.len() as u64);
                        trade_ids.extend(listed.iter().map(|t| t["t"].as_u64().expect("trade id")));
                    }
                    _ => {}
                }
                last.insert(stream, data.clone());
            }
            None => {
                if trading.try_wait().expect("load").is_some() && quiet_since.get_or_insert_with(Instant::now).elapsed() > Duration::from_millis(3500) {
                    break;
                }
            }
        }
    }
    let open_ms = opened.elapsed().as_millis() as u64;
    assert!(trading.wait().expect("load").success());
    for (stream, every_ms) in [("depth@100ms", 100), ("depth@1000ms", 1000), ("depth5@100ms", 100), ("trade@100ms", 100), ("ticker", 1000), ("kline_1m", 2000)] {
        let count = counts.get(&format!("btcusd@{stream}")).copied().unwrap_or(0);
        assert!(count >= 2, "{stream}: {count} messages");
        assert!(count <= open_ms / every_ms + 1, "{stream}: {count} messages in {open_ms} ms, one every {every_ms} ms at most");
    }
    let rest = LocalBook::from_snapshot(&json_get(&market, "/api/v3/depth?symbol=BTCUSD&limit=5000"));
    books[0].assert_matches(&rest, "the book from @depth@100ms and GET /api/v3/depth");
    books[1].assert_matches(&rest, "the book from @depth@1000ms and GET /api/v3/depth");
    let top = json_get(&market, "/api/v3/depth?symbol=BTCUSD&limit=5");
    assert_eq!((&last["btcusd@depth5@100ms"]["bids"], &last["btcusd@depth5@100ms"]["asks"]), (&top["bids"], &top["asks"]), "the last @depth5@100ms");
    let ticker = json_get(&market, "/api/v3/ticker/24hr?symbol=BTCUSD");
    let count = ticker["count"].as_u64().expect("count");
    assert!(count > 100, "{count} trades");
    assert!(trade_ids.windows(2).all(|w| w[0] < w[1]), "trades in order, each once");
    if listed_all {
        assert_eq!(trade_ids, (1..=count).collect::<Vec<_>>(), "every trade in the @trade@100ms lists");
    } else {
        assert_eq!(trade_ids.last().copied(), Some(count), "the newest trade listed last");
    }
    let mut mini_last = None;
    while let Some(message) = next_text(&mut mini) {
        mini_last = Some(message);
    }
    let mini_last = mini_last.expect("@miniTicker messages");
    assert_eq!(
        (&mini_last["e"], &mini_last["c"], &mini_last["o"], &mini_last["h"], &mini_last["l"], &mini_last["v"], &mini_last["q"]),
        (&serde_json::json!("24hrMiniTicker"), &ticker["lastPrice"], &ticker["openPrice"], &ticker["highPrice"], &ticker["lowPrice"], &ticker["volume"], &ticker["quoteVolume"]),
        "the last @miniTicker"
    );
    let all = last["!miniTicker@arr"].as_array().expect("!miniTicker@arr is an array");
    assert_eq!(all.len(), 1, "the one instrument that traded: {all:?}");
    assert_eq!((&all[0]["s"], &all[0]["c"], &all[0]["v"]), (&serde_json::json!("BTCUSD"), &ticker["lastPrice"], &ticker["volume"]), "the last !miniTicker@arr");
    assert!(counts["!miniTicker@arr"] <= open_ms / 1000 + 1, "!miniTicker@arr: {} messages in {open_ms} ms", counts["!miniTicker@arr"]);
    let ticked = &last["btcusd@ticker"];
    assert_eq!((ticked["n"].as_u64(), &ticked["c"], &ticked["v"]), (Some(count), &ticker["lastPrice"], &ticker["volume"]), "the last @ticker");
    let kline = json_get(&market, "/api/v3/klines?symbol=BTCUSD&interval=1m&limit=1");
    let k = &last["btcusd@kline_1m"]["k"];
    assert_eq!(
        (k["t"].as_u64(), &k["o"], &k["h"], &k["l"], &k["c"], &k["v"]),
        (kline[0][0].as_u64(), &kline[0][1], &kline[0][2], &kline[0][3], &kline[0][4], &kline[0][5]),
        "the last @kline_1m and GET /api/v3/klines"
    );
    assert!(server.terminate().success());
}

/// A candle sent while open is sent again, closed (`x`), once its time is
/// over, though no later trade comes: a client that keeps candles by `x`
/// finishes the last one of a burst. Waits for a minute to end (up to a
/// minute: the smallest interval).
#[test]
fn a_candle_is_sent_closed_when_its_minute_ends() {
    let dir = TempDir::new("md-kline-close");
    let server = start(&dir.0, None);
    let market = server.market_address.clone();
    let mut socket = connect(&market, "/ws/btcusd@kline_1m");
    let now_ms = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis() as u64;
    // The trades inside one minute.
    let left = 60_000 - now_ms() % 60_000;
    if left < 5_000 {
        std::thread::sleep(Duration::from_millis(left + 200));
    }
    let mut trading = load_with(&server.address, &["--connections", "2", "--count", "200", "--duration", "3"]);
    assert!(trading.wait().expect("load").success());
    let deadline = Instant::now() + Duration::from_secs(70);
    let mut open: Option<Value> = None;
    let closed = loop {
        assert!(Instant::now() < deadline, "no closing message; last open: {open:?}");
        let Some(message) = next_text(&mut socket) else { continue };
        let k = message["k"].clone();
        if k["x"] == Value::Bool(true) {
            break message;
        }
        open = Some(message);
    };
    let open = open.expect("the candle sent while open");
    let (k, was) = (&closed["k"], &open["k"]);
    assert_eq!(k["t"], was["t"], "the candle sent open is the one closed: {closed} after {open}");
    for field in ["T", "o", "h", "l", "c", "v", "n", "f", "L", "q"] {
        assert_eq!(k[field], was[field], "{field}: nothing traded since");
    }
    let close_time = k["T"].as_u64().expect("T");
    assert!(now_ms() > close_time, "sent after the candle's end");
    let rest = json_get(&market, "/api/v3/klines?symbol=BTCUSD&interval=1m&limit=1");
    assert_eq!((rest[0][0].as_u64(), &rest[0][4], &rest[0][5]), (k["t"].as_u64(), &k["c"], &k["v"]), "GET /api/v3/klines");
    assert!(server.terminate().success());
}

/// HTTP connections are bounded in number and in how long one may take
/// to send a request's header and body: idle ones (never a request, or
/// kept alive after one) are closed after `header_timeout_s`, a stalled
/// body is answered 408 after as long, one declared past `max_body` 413
/// at once; past
/// `max_http_connections` a new one is closed at once, and the port
/// serves again as soon as one is gone.
#[test]
fn http_connections_are_bounded_in_number_and_in_time() {
    let dir = TempDir::new("md-http-bounds");
    let config = edited_config(&dir.0, "bounds.toml", &[("max_http_connections = 1024 ", "max_http_connections = 4 "), ("header_timeout_s = 30 ", "header_timeout_s = 3 ")]);
    let server = start(&dir.0, Some(&config));
    let market = server.market_address.clone();
    let mut idle: Vec<TcpStream> = (0..4).map(|_| TcpStream::connect(&market).expect("connect")).collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut fifth = TcpStream::connect(&market).expect("connect");
    // (Well before the idle ones' 3 s are up, however slow the machine.)
    assert!(closed_within(&mut fifth, Duration::from_secs(2)), "a fifth connection is closed at once");
    // Half a header, then nothing: closed with the others after 3 s.
    idle[0].write_all(b"GET /api/v3/ping HTTP/1.1\r\nHost: x\r\n").expect("write");
    for stream in &mut idle {
        assert!(closed_within(stream, Duration::from_secs(10)), "an idle connection is closed after header_timeout_s");
    }
    // What a connection says before the server closes it (at most 10 s).
    let said = |stream: &mut TcpStream| {
        stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        let mut text = Vec::new();
        let _ = stream.read_to_end(&mut text);
        String::from_utf8_lossy(&text).to_string()
    };
    // A whole header, then half the body it declares: every connection
    // is answered 408 after 3 s and closed (a body left unread would be
    // drained with no time limit, holding the connection for good).
    let mut stalled: Vec<TcpStream> = (0..4).map(|_| TcpStream::connect(&market).expect("connect")).collect();
    for stream in &mut stalled {
        stream.write_all(b"POST /api/v3/order HTTP/1.1\r\nHost: x\r\nX-MBX-APIKEY: demo-key-1\r\nContent-Length: 50\r\n\r\nsymbol=BTC").expect("write");
    }
    for stream in &mut stalled {
        let text = said(stream);
        assert!(text.starts_with("HTTP/1.1 408") && text.contains("did not arrive within 3 s"), "{text}");
    }
    assert_eq!(http_get(&market, "/api/v3/ping"), (200, "{}".to_string()));
    // A body declared longer than max_body: 413 at once, not read.
    let mut large = TcpStream::connect(&market).expect("connect");
    large.write_all(b"POST /api/v3/order HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n").expect("write");
    let text = said(&mut large);
    assert!(text.starts_with("HTTP/1.1 413") && text.contains("-1000"), "{text}");
    // The port serves again; a kept-alive connection idle after its answer
    // is closed too.
    let mut kept = TcpStream::connect(&market).expect("connect");
    kept.write_all(b"GET /api/v3/ping HTTP/1.1\r\nHost: x\r\n\r\n").expect("write");
    kept.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    let mut answer = [0u8; 512];
    let n = kept.read(&mut answer).expect("an answer");
    assert!(String::from_utf8_lossy(&answer[..n]).starts_with("HTTP/1.1 200"), "{}", String::from_utf8_lossy(&answer[..n]));
    assert!(closed_within(&mut kept, Duration::from_secs(10)), "a kept-alive connection idle after its answer is closed");
    // WebSockets are not HTTP connections: five at once are fine.
    let mut sockets: Vec<Socket> = (0..5).map(|_| connect(&market, "/ws/btcusd@trade")).collect();
    assert_eq!(http_get(&market, "/api/v3/ping"), (200, "{}".to_string()));
    for socket in &mut sockets {
        socket.send(Message::Text(r#"{"method":"LIST_SUBSCRIPTIONS","id":1}"#.into())).expect("send");
        let deadline = Instant::now() + Duration::from_secs(5);
        while next_text(socket).is_none() {
            assert!(Instant::now() < deadline, "no answer");
        }
    }
    assert!(server.terminate().success());
}

/// A configuration with tight market-data limits.
fn tight_config(dir: &Path) -> std::path::PathBuf {
    let base = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../crossbook.toml")).expect("crossbook.toml");
    let text = base
        .replace("queue = 4096                   # messages waiting", "queue = 512                    # messages waiting")
        .replace("max_streams = 1024 ", "max_streams = 20 ")
        .replace("max_messages_per_s = 10 ", "max_messages_per_s = 5 ")
        .replace("max_connections = 1024 ", "max_connections = 8 ");
    assert!(
        text.contains("queue = 512 ") && text.contains("max_streams = 20 ") && text.contains("max_messages_per_s = 5 ") && text.contains("max_connections = 8 "),
        "crossbook.toml's [market_data] lines changed"
    );
    let path = dir.join("tight.toml");
    std::fs::write(&path, text).expect("config");
    path
}

#[test]
fn bad_input_at_the_market_data_port_costs_only_its_own_connection() {
    let dir = TempDir::new("md-hostile");
    let config = tight_config(&dir.0);
    let server = start(&dir.0, Some(&config));
    let market = server.market_address.clone();
    // REST errors, Binance-shaped.
    for (path, code) in [
        ("/api/v3/depth?symbol=NOPE", -1121),
        ("/api/v3/depth?symbol=BTCUSD&limit=abc", -1100),
        ("/api/v3/depth?symbol=BTCUSD&symbol=BTCUSD", -1101),
        ("/api/v3/klines?symbol=BTCUSD", -1102),
        ("/api/v3/klines?symbol=BTCUSD&interval=7m", -1120),
        ("/api/v3/trades?symbol=BTCUSD&extra=1", -1104),
        ("/api/v3/depth?symbol=%ZZ", -1100),
        // An optional parameter sent empty is refused, not taken as absent
        // (a ticker would answer every instrument).
        ("/api/v3/ticker/24hr?symbol=", -1100),
        ("/api/v3/ticker/bookTicker?symbols=", -1100),
        ("/api/v3/depth?symbol=BTCUSD&limit=", -1100),
        ("/api/v3/klines?symbol=BTCUSD&interval=1m&timeZone=", -1100),
        // A mandatory one sent empty is missing.
        ("/api/v3/depth?symbol=", -1102),
        // A parameter not read is -1104 whatever its value; `symbol` is
        // checked before the endpoint's other parameters.
        ("/api/v3/time?x=%FF", -1104),
        ("/api/v3/trades?limit=0", -1102),
        ("/api/v3/depth?limit=0&symbol=XX", -1121),
        ("/api/v3/klines?interval=zz", -1102),
    ] {
        let (status, body) = http_get(&market, path);
        let answer: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"));
        assert_eq!((status, answer["code"].as_i64()), (400, Some(code)), "{path}: {body}");
        assert!(answer["msg"].as_str().is_some_and(|m| !m.is_empty()));
    }
    let many = format!("/api/v3/depth?{}", (0..65).map(|i| format!("p{i}=1")).collect::<Vec<_>>().join("&"));
    let (status, body) = http_get(&market, &many);
    assert_eq!((status, serde_json::from_str::<Value>(&body).ok().and_then(|v| v["code"].as_i64())), (400, Some(-1101)), "65 parameters: {body}");
    assert_eq!(http_get(&market, "/api/v3/nothing").0, 404);
    // Garbage and a huge header: refused, the next request is served.
    let (status, _) = raw_http(&market, b"GARBAGE\r\n\r\n");
    assert!(status == 400 || status == 0, "{status}");
    let huge = format!("GET /api/v3/ping HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n", "a".repeat(1 << 20));
    let (status, _) = raw_http(&market, huge.as_bytes());
    assert!(status == 431 || status == 400 || status == 0, "{status}");
    assert_eq!(http_get(&market, "/api/v3/ping"), (200, "{}".to_string()));
    // An unknown stream is refused at the upgrade, and so is a query
    // string on /ws/<streams> (read by nobody).
    let refused = tungstenite::connect(format!("ws://{market}/ws/btcusd@nothing"));
    assert!(matches!(refused, Err(tungstenite::Error::Http(ref r)) if r.status() == 400), "{refused:?}");
    let refused = tungstenite::connect(format!("ws://{market}/ws/btcusd@trade?streams=btcusd@depth"));
    assert!(matches!(refused, Err(tungstenite::Error::Http(ref r)) if r.status() == 400), "{refused:?}");

    // Upgrades that never complete (the client asks and hangs up) give
    // their slot back.
    for _ in 0..20 {
        let mut stream = TcpStream::connect(&market).expect("connect");
        let _ = stream.write_all(
            format!("GET /ws/btcusd@trade HTTP/1.1\r\nHost: {market}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n").as_bytes(),
        );
    }
    // Connections past the limit are refused; the ones open go on.
    let mut open: Vec<Socket> = (0..8).map(|_| connect_when_free(&market, "/ws/btcusd@trade")).collect();
    let refused = tungstenite::connect(format!("ws://{market}/ws/btcusd@trade"));
    assert!(matches!(refused, Err(tungstenite::Error::Http(ref r)) if r.status() == 503), "{refused:?}");
    for socket in &mut open {
        socket.send(Message::Text(r#"{"method":"LIST_SUBSCRIPTIONS","id":1}"#.into())).expect("send");
        let deadline = Instant::now() + Duration::from_secs(5);
        let answer = loop {
            if let Some(answer) = next_text(socket) {
                break answer;
            }
            assert!(Instant::now() < deadline, "no answer");
        };
        assert_eq!(answer["result"], serde_json::json!(["btcusd@trade"]));
    }
    // A message past max_message (thousands of subscriptions in one
    // request) closes its connection only.
    let thousands: Vec<String> = (0..5_000).map(|_| "btcusd@trade".to_string()).collect();
    let request = serde_json::json!({"method": "SUBSCRIBE", "params": thousands, "id": 1}).to_string();
    let _ = open[0].send(Message::Text(request.into()));
    let gone = (0..100).any(|_| match open[0].read() {
        Ok(Message::Close(_)) | Err(tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed | tungstenite::Error::Protocol(_)) => true,
        Err(tungstenite::Error::Io(e)) => !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut | std::io::ErrorKind::Interrupted),
        _ => false,
    });
    assert!(gone, "a 60 KB request closes its connection");
    open[1].send(Message::Text(r#"{"method":"LIST_SUBSCRIPTIONS","id":2}"#.into())).expect("the others go on");
    drop(open);

    // Requests: invalid JSON, an unknown method, too many streams, then a
    // flood of messages closes the connection.
    let mut socket = connect_when_free(&market, "/ws");
    let ask = |socket: &mut Socket, text: &str| -> Value {
        socket.send(Message::Text(text.into())).expect("send");
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(answer) = next_text(socket) {
                return answer;
            }
            assert!(Instant::now() < deadline, "no answer to {text}");
        }
    };
    assert_eq!(ask(&mut socket, "{nope")["error"]["code"], 3);
    assert_eq!(ask(&mut socket, r#"{"method":"FLY","id":1}"#)["error"]["code"], 2);
    assert_eq!(ask(&mut socket, r#"{"method":"SET_PROPERTY","id":3}"#)["error"]["code"], 2);
    // A request of max_message bytes, more than the server reads at a
    // time, arrives whole.
    let padded = format!(r#"{{"method":"LIST_SUBSCRIPTIONS",{}"id":4}}"#, " ".repeat(4096 - 38));
    assert_eq!(padded.len(), 4096);
    assert_eq!(ask(&mut socket, &padded), serde_json::json!({"result": [], "id": 4}));
    std::thread::sleep(Duration::from_millis(1100));
    let many: Vec<String> = ["1m", "3m", "5m", "15m", "30m", "1h", "2h", "4h", "6h", "8h", "12h", "1d"]
        .iter()
        .map(|i| format!("btcusd@kline_{i}"))
        .chain(["depth", "depth@100ms", "depth@1000ms", "depth5", "depth10", "depth20", "trade", "bookTicker", "ticker"].iter().map(|k| format!("btcusd@{k}")))
        .collect();
    let answer = ask(&mut socket, &serde_json::json!({"method": "SUBSCRIBE", "params": many, "id": 7}).to_string());
    assert_eq!((answer["error"]["code"].as_i64(), answer["id"].as_i64()), (Some(2), Some(7)), "{answer}");
    let answer = ask(&mut socket, r#"{"method":"SUBSCRIBE","params":["btcusd@trade","btcusd@depth"],"id":8}"#);
    assert_eq!(answer, serde_json::json!({"result": null, "id": 8}));
    assert_eq!(ask(&mut socket, r#"{"method":"LIST_SUBSCRIPTIONS","id":9}"#)["result"], serde_json::json!(["btcusd@trade", "btcusd@depth"]));
    std::thread::sleep(Duration::from_millis(1100));
    // Five a second at most, in any second (a sliding window): one, then
    // three 0.9 s later, then three 0.2 s after those: six within the
    // last second (a count started afresh each second from the first
    // message, as it was, let them all through).
    for (n, pause) in [(0, 0), (1, 900), (2, 0), (3, 0), (4, 200), (5, 0), (6, 0)] {
        std::thread::sleep(Duration::from_millis(pause));
        if socket.send(Message::Text(format!(r#"{{"method":"LIST_SUBSCRIPTIONS","id":{n}}}"#).into())).is_err() {
            break;
        }
    }
    let closed = (0..200).find_map(|_| match socket.read() {
        Ok(Message::Close(frame)) => Some(frame.map(|f| (u16::from(f.code), f.reason.to_string()))),
        Ok(_) => None,
        Err(tungstenite::Error::Io(_)) => None,
        Err(_) => Some(None),
    });
    let (code, reason) = closed.flatten().expect("closed with a reason");
    assert_eq!(code, 1008);
    assert!(reason.contains("too many messages"), "{reason}");

    // A client that never reads falls behind and is dropped with a
    // reason, while another keeps getting every trade. (Its heaviest
    // streams, so that the kernel's socket buffers fill quickly too.)
    let heavy: Vec<String> = ["5", "10", "20"].iter().flat_map(|n| ["", "@100ms", "@1000ms"].map(|speed| format!("btcusd@depth{n}{speed}"))).collect();
    let mut slow = connect(&market, &format!("/ws/{}", heavy.join("/")));
    let mut reader = connect(&market, "/ws/btcusd@trade");
    // Trading until the slow client is dropped (bounded: on a busy
    // machine the load's rate, and so the feed's, is lower).
    let mut trading = load(&server.address, 60, 5_000);
    let mut trades_seen = 0;
    let until = Instant::now() + Duration::from_secs(60);
    let mut dropped = None;
    while dropped.is_none() && Instant::now() < until {
        if next_text(&mut reader).is_some() {
            trades_seen += 1;
        }
        dropped = server.drain().into_iter().find(|line| line.contains("slow consumer"));
    }
    let _ = trading.kill();
    let _ = trading.wait();
    let dropped = dropped.expect("the client that never reads was dropped");
    assert!(dropped.contains("slow consumer: more than 512 messages waiting"), "{dropped}");
    assert!(trades_seen > 100, "the reading client went on ({trades_seen} trades)");
    if let MaybeTlsStream::Plain(stream) = slow.get_ref() {
        stream.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    }
    let reason = loop {
        match slow.read() {
            Ok(Message::Close(frame)) => break frame.map(|f| f.reason.to_string()).unwrap_or_default(),
            Ok(_) => {}
            Err(e) => panic!("the slow client was not told why: {e}"),
        }
    };
    assert!(reason.starts_with("slow consumer"), "{reason}");
    assert_eq!(http_get(&market, "/api/v3/ping").0, 200);
    assert!(server.terminate().success());
}

/// Waits (20 s at most) until market data has applied every command
/// journaled so far: a marker order (account 3, client order id `cid`,
/// resting far below the market) is placed, and `/crossbook/stats` is
/// asked until market data's `seq` reaches the marker's (its order id is
/// its command's sequence number). Market data follows the journal on a
/// thread of its own: an acknowledged order may not be in it yet.
fn market_data_has_caught_up(server: &Server, cid: u64) {
    let (mut client, _) = crate::serve::Client::login(&server.address, 3, "demo-key-3");
    client.send(&crate::serve::limit(cid, Side::Buy, 90, 1, crossbook_engine::TimeInForce::Gtc));
    let report = client.report();
    assert_eq!(report.kind, crossbook_protocol::ReportKind::Accepted, "the marker order: {report:?}");
    let marker = report.order;
    let deadline = Instant::now() + Duration::from_secs(20);
    while json_get(&server.market_address, "/crossbook/stats")["seq"].as_u64().unwrap_or(0) < marker {
        assert!(Instant::now() < deadline, "market data did not reach seq {marker}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// After a `kill -9` and a restart, the feeds carry on from the journal:
/// the same book, trades (ids and times), candles and ticker as before,
/// rebuilt from the gateways' checkpoints in a snapshot and the journal
/// after it; new trades take the next ids.
#[test]
fn the_feeds_carry_on_after_a_restart() {
    let dir = TempDir::new("md-restart");
    let base = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../crossbook.toml")).expect("crossbook.toml");
    let text = base
        .replace("snapshot_every = 100000 ", "snapshot_every = 300 ")
        .replace("history_commands = 1000000 ", "history_commands = 400 ");
    assert!(text.contains("snapshot_every = 300 ") && text.contains("history_commands = 400 "), "crossbook.toml's lines changed");
    let config = dir.0.join("restart.toml");
    std::fs::write(&config, text).expect("config");
    let server = start(&dir.0, Some(&config));
    let market = server.market_address.clone();
    let mut trading = load_with(&server.address, &["--connections", "2", "--count", "3000", "--duration", "60"]);
    assert!(trading.wait().expect("load").success());
    market_data_has_caught_up(&server, 1);
    let views = |market: &str| {
        (
            json_get(market, "/api/v3/depth?symbol=BTCUSD&limit=5000"),
            json_get(market, "/api/v3/trades?symbol=BTCUSD&limit=1000"),
            json_get(market, "/api/v3/klines?symbol=BTCUSD&interval=1m&limit=1000"),
            json_get(market, "/api/v3/klines?symbol=BTCUSD&interval=1h&limit=1000"),
            json_get(market, "/api/v3/klines?symbol=BTCUSD&interval=1M&limit=1000"),
        )
    };
    let (depth, trades, minutes, hours, months) = views(&market);
    let ticker = json_get(&market, "/api/v3/ticker/24hr?symbol=BTCUSD");
    server.kill();

    let server = start(&dir.0, Some(&config));
    let line = server.startup.iter().find(|l| l.starts_with("rebuilt ")).expect("a rebuilt line").clone();
    assert!(line.contains("from the gateways' checkpoints at seq "), "{line}");
    let market = server.market_address.clone();
    let (depth_after, trades_after, minutes_after, hours_after, months_after) = views(&market);
    assert_eq!((&depth_after["bids"], &depth_after["asks"]), (&depth["bids"], &depth["asks"]), "the book");
    assert_eq!(trades_after, trades, "the last 1,000 trades, ids and times");
    assert_eq!((minutes_after, hours_after, months_after), (minutes, hours, months), "the candles");
    // The window ends at the last command's journal time: the same.
    assert_eq!(json_get(&market, "/api/v3/ticker/24hr?symbol=BTCUSD"), ticker, "the 24-hour ticker");
    let last_id = trades.as_array().and_then(|t| t.last()).and_then(|t| t["id"].as_u64()).expect("a trade");
    // Trading until the load reports a fill (its 300 orders have always
    // traded; the summary line says what it saw if one day they do not).
    let mut summaries = Vec::new();
    for _ in 0..5 {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_crossbook"))
            .args(["load", "--address", &server.address, "--connections", "2", "--count", "300", "--duration", "60"])
            .output()
            .expect("crossbook load");
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let summary = String::from_utf8_lossy(&output.stdout).lines().next().unwrap_or_default().to_string();
        let fills: u64 = summary.split_whitespace().skip_while(|w| *w != "fills").nth(1).and_then(|n| n.parse().ok()).unwrap_or(0);
        summaries.push(summary);
        if fills > 0 {
            break;
        }
    }
    market_data_has_caught_up(&server, 2);
    let newer = json_get(&market, "/api/v3/trades?symbol=BTCUSD&limit=1000");
    let ids: Vec<u64> = newer.as_array().expect("trades").iter().map(|t| t["id"].as_u64().expect("id")).collect();
    assert!(
        ids.contains(&(last_id + 1)),
        "new trades go on from id {}: {} trades from {:?} to {:?}, after {summaries:?}",
        last_id + 1,
        ids.len(),
        ids.first(),
        ids.last()
    );
    assert!(ids.windows(2).all(|w| w[1] == w[0] + 1), "ids without gaps");
    assert!(server.terminate().success());
}

/// `market_data.send_interval_us` (`docs/marketdata.md`, "When messages
/// go out"), here a second: after a send, the changes wait until the
/// second is up (nothing comes sooner) and go out together, as one
/// `@depth` diff that follows the previous one without a gap (checked
/// where both orders were placed well within the second), each trade
/// still its own `@trade` message; the book kept from the diffs is
/// REST's.
#[test]
fn a_send_interval_holds_the_changes_within_it_and_sends_them_together() {
    let dir = TempDir::new("md-interval");
    let config = edited_config(&dir.0, "interval.toml", &[("send_interval_us = 0 ", "send_interval_us = 1000000 ")]);
    let server = start(&dir.0, Some(&config));
    let market = server.market_address.clone();
    let mut socket = connect(&market, "/stream?streams=btcusd@depth/btcusd@trade");
    let mut book = LocalBook::from_snapshot(&json_get(&market, "/api/v3/depth?symbol=BTCUSD&limit=100"));
    let (mut buyer, _) = crate::serve::Client::login(&server.address, 1, "demo-key-1");
    let (mut seller, _) = crate::serve::Client::login(&server.address, 2, "demo-key-2");
    let place = |client: &mut crate::serve::Client, cid: u64, side: Side, price: i64, qty: u64| {
        client.send(&crate::serve::limit(cid, side, price, qty, crossbook_engine::TimeInForce::Gtc));
        let report = client.report();
        assert_eq!(report.kind, crossbook_protocol::ReportKind::Accepted, "{report:?}");
        report.order
    };
    // Everything the feed sends until `done` says it has all it waits
    // for, each message with when it came.
    type Seen = [(Instant, Value)];
    let mut read_until = |done: &dyn Fn(&Seen) -> bool| {
        let mut seen: Vec<(Instant, Value)> = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !done(&seen) {
            assert!(Instant::now() < deadline, "the feed sent {seen:?} in 20 s");
            if let Some(message) = next_text(&mut socket) {
                seen.push((Instant::now(), message));
            }
        }
        seen
    };
    let depth_until = |seq: u64| move |seen: &Seen| seen.iter().any(|(_, m)| m["data"]["e"] == "depthUpdate" && m["data"]["u"].as_u64() >= Some(seq));

    let first = place(&mut buyer, 1, Side::Buy, 100, 2);
    let sent_at_once = read_until(&depth_until(first));
    let (at, _) = sent_at_once[0];
    let (second, third) = (place(&mut buyer, 2, Side::Sell, 105, 1), place(&mut seller, 1, Side::Sell, 100, 1));
    let placed_by = at.elapsed();
    let sent_later = read_until(&|seen: &Seen| depth_until(third)(seen) && seen.iter().any(|(_, m)| m["data"]["e"] == "trade"));
    let waited = sent_later[0].0 - at;
    assert!(waited >= Duration::from_millis(500), "the next send came {waited:?} after the first, within the second");

    let diffs: Vec<&Value> = sent_at_once.iter().chain(&sent_later).map(|(_, m)| &m["data"]).filter(|d| d["e"] == "depthUpdate").collect();
    for diff in &diffs {
        assert_eq!(book.apply(diff, false), Some(true), "{diff} follows the book at {}", book.last);
    }
    book.assert_matches(&LocalBook::from_snapshot(&json_get(&market, "/api/v3/depth?symbol=BTCUSD&limit=100")), "the book from the diffs and GET /api/v3/depth");
    assert_eq!((book.bids.get(&100), book.asks.get(&105)), (Some(&1), Some(&1)), "{book:?}");
    if placed_by < Duration::from_millis(200) {
        // Both placed well within the second: one diff covers them.
        let last = diffs.last().expect("a diff");
        assert_eq!((last["U"].as_u64(), last["u"].as_u64()), (Some(second), Some(third)), "{diffs:?}");
    }
    let trades: Vec<&Value> = sent_later.iter().map(|(_, m)| &m["data"]).filter(|d| d["e"] == "trade").collect();
    assert_eq!(trades.len(), 1, "{trades:?}");
    assert_eq!((number(&trades[0]["p"]), number(&trades[0]["q"]), &trades[0]["m"]), (100, 1, &Value::Bool(true)), "{trades:?}");
    assert!(server.terminate().success());
}

/// A TCP connection to `address` from the loopback address `source`.
fn connect_from(source: &str, address: &str) -> TcpStream {
    let to: std::net::SocketAddr = address.parse().expect("address");
    let from: std::net::SocketAddr = format!("{source}:0").parse().expect("source");
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    socket.bind(&from.into()).expect("bind");
    socket.connect(&to.into()).expect("connect");
    socket.into()
}

/// One client address holds at most `max_http_connections_per_address`
/// HTTP connections and `max_connections_per_address` WebSocket ones:
/// past them its next is closed at once (HTTP) or refused with 429
/// (WebSocket), while another address is served, and a connection that
/// ends gives its address's place back.
#[test]
fn one_client_address_cannot_take_every_connection() {
    let dir = TempDir::new("md-per-address");
    let edits = [("max_http_connections_per_address = 256 ", "max_http_connections_per_address = 2 "), ("max_connections_per_address = 256 ", "max_connections_per_address = 2 ")];
    let config = edited_config(&dir.0, "per-address.toml", &edits);
    let server = start(&dir.0, Some(&config));
    let market = server.market_address.clone();
    // HTTP: two idle connections from 127.0.0.3 hold its share.
    let idle: Vec<TcpStream> = (0..2).map(|_| connect_from("127.0.0.3", &market)).collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut third = connect_from("127.0.0.3", &market);
    assert!(closed_within(&mut third, Duration::from_secs(2)), "a third connection from one address is closed at once");
    let mut other = connect_from("127.0.0.4", &market);
    other.write_all(b"GET /api/v3/ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").expect("write");
    let mut answer = String::new();
    other.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let _ = other.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "another address is served: {answer}");
    server.expect_log("market_data.max_http_connections_per_address");
    // One of the two gone, the address is served again.
    let mut idle = idle;
    drop(idle.remove(0));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut again = connect_from("127.0.0.3", &market);
        let _ = again.write_all(b"GET /api/v3/ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let mut answer = String::new();
        again.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        let _ = again.read_to_string(&mut answer);
        if answer.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(Instant::now() < deadline, "the address's place was not given back: {answer:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(idle);
    // WebSocket: two from 127.0.0.5, the third refused with 429 and
    // -1003; another address is let in; one closed frees a place.
    // The socket, or the refusal's status and body.
    let upgrade = |source: &str| {
        tungstenite::client(format!("ws://{market}/ws/btcusd@trade"), connect_from(source, &market)).map(|(socket, _)| socket).map_err(|e| match e {
            tungstenite::HandshakeError::Failure(tungstenite::Error::Http(response)) => (response.status().as_u16(), String::from_utf8_lossy(response.body().as_deref().unwrap_or_default()).into_owned()),
            other => (0, other.to_string()),
        })
    };
    let mut open: Vec<_> = (0..2).map(|_| upgrade("127.0.0.5").expect("a WebSocket within the address's share")).collect();
    let (status, body) = upgrade("127.0.0.5").map(|_| ()).expect_err("a third WebSocket from one address is refused");
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("-1003") && body.contains("at most 2 per address"), "{body}");
    let mut elsewhere = upgrade("127.0.0.6").expect("another address's WebSocket");
    let _ = elsewhere.close(None);
    let mut first = open.remove(0);
    let _ = first.close(None);
    let _ = first.read();
    drop(first);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match upgrade("127.0.0.5") {
            Ok(_) => break,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("the address's place was not given back: {e:?}"),
        }
    }
}

/// The repository's `crossbook.toml` with each `(line start, instead)`
/// replaced, written as `name` in `dir` (a line that is not there any
/// more fails the test: the file changed).
fn edited_config(dir: &Path, name: &str, edits: &[(&str, &str)]) -> std::path::PathBuf {
    let mut text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../crossbook.toml")).expect("crossbook.toml");
    for (line, instead) in edits {
        assert!(text.contains(line), "crossbook.toml's [market_data] lines changed: no {line:?}");
        text = text.replacen(line, instead, 1);
    }
    let path = dir.join(name);
    std::fs::write(&path, text).expect("config");
    path
}

/// Whether the server closed `stream` (a read gives 0, or fails) within
/// `within`.
fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    stream.set_read_timeout(Some(within)).expect("timeout");
    let mut buffer = [0u8; 4096];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut | std::io::ErrorKind::Interrupted) => return false,
            Err(_) => return true,
        }
    }
}

/// Waits (20 s at most, else panics with `why`) until the server counts
/// `count` WebSocket connections (`/crossbook/stats`).
fn web_sockets_reach(server: &Server, count: u64, why: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while json_get(&server.market_address, "/crossbook/stats")["webSockets"].as_u64() != Some(count) {
        assert!(Instant::now() < deadline, "{why}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `crossbook watch`, the feed's measuring client (`docs/benchmarks.md`),
/// reads the WebSocket frames itself: each of its connections times every
/// `@trade` message it was sent (the count is the venue's trades, times
/// the connections), it answers the server's pings (here every second: a
/// watch that did not would be closed for silence after 3 s), and it
/// reports the server's Close with its reason.
#[test]
fn crossbook_watch_times_every_trade_answers_pings_and_reports_the_close() {
    let dir = TempDir::new("md-watch");
    let config = edited_config(&dir.0, "pings.toml", &[("ping_interval_s = 20 ", "ping_interval_s = 1 ")]);
    let server = start(&dir.0, Some(&config));
    let watch = std::process::Command::new(env!("CARGO_BIN_EXE_crossbook"))
        .args(["watch", "--address", &server.market_address, "--connections", "3", "--duration", "60", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("crossbook watch");
    web_sockets_reach(&server, 3, "the watch never had its 3 connections");
    let mut trading = load_with(&server.address, &["--connections", "2", "--count", "2000", "--duration", "60"]);
    assert!(trading.wait().expect("load").success());
    market_data_has_caught_up(&server, 1);
    // Several pings' time, answered.
    std::thread::sleep(Duration::from_millis(4500));
    let stats = json_get(&server.market_address, "/crossbook/stats");
    let trades = stats["trades"].as_u64().expect("trades");
    assert!(trades > 100, "the load traded: {stats}");
    assert!(server.terminate().success());
    let watched = watch.wait_with_output().expect("the watch ends with the server");
    let (out, err) = (String::from_utf8_lossy(&watched.stdout), String::from_utf8_lossy(&watched.stderr));
    assert!(watched.status.success(), "{out}{err}");
    let report: Value = serde_json::from_str(&out).expect("the watch's JSON report");
    assert_eq!(report["closed_by_server"], serde_json::json!(vec!["server shutting down"; 3]), "{report}");
    assert_eq!(report["trades_timed"].as_u64(), Some(3 * trades), "{report}");
    // And the depth diffs.
    let messages = report["messages"].as_u64().expect("messages");
    assert!(messages > 3 * trades, "{report}");
    assert!(report["bytes"].as_u64().expect("bytes") > 100 * messages, "{report}");
}

/// A client that sends requests and never reads their answers fills its
/// socket; the server does not wait on it for ever (its connection slot
/// would be held as long): past three ping intervals of a write waiting,
/// it is closed (`not reading`), and its slot is given back.
#[test]
fn a_client_that_never_reads_its_answers_is_closed() {
    let dir = TempDir::new("md-not-reading");
    let config = edited_config(
        &dir.0,
        "not-reading.toml",
        &[("ping_interval_s = 20 ", "ping_interval_s = 1 "), ("max_messages_per_s = 10 ", "max_messages_per_s = 1000000 ")],
    );
    let server = start(&dir.0, Some(&config));
    let mut socket = connect(&server.market_address, "/ws");
    // Streams enough that each LIST_SUBSCRIPTIONS answer is some 700
    // bytes (none of them sends anything while nobody trades but the
    // candles and tickers, now and then).
    let intervals = ["1m", "3m", "5m", "15m", "30m", "1h", "2h", "4h", "6h", "8h", "12h", "1d", "3d", "1w", "1M"];
    let mut streams: Vec<String> = intervals.iter().map(|name| format!("btcusd@kline_{name}")).collect();
    streams.extend(["depth", "depth@100ms", "depth@1000ms", "trade", "aggTrade", "bookTicker", "depth5", "depth10", "depth20"].map(|kind| format!("btcusd@{kind}")));
    socket.send(Message::Text(serde_json::json!({"method": "SUBSCRIBE", "params": streams, "id": 0}).to_string().into())).expect("subscribe");
    let answer = loop {
        if let Some(answer) = next_text(&mut socket) {
            break answer;
        }
    };
    assert_eq!(answer, serde_json::json!({"result": null, "id": 0}));
    // Requests until the socket takes no more (the server stopped reading
    // them, its answers waiting), never reading.
    if let MaybeTlsStream::Plain(stream) = socket.get_ref() {
        stream.set_write_timeout(Some(Duration::from_secs(2))).expect("timeout");
    }
    let mut sent = 0u64;
    while sent < 1_000_000 && socket.send(Message::Text(format!(r#"{{"method":"LIST_SUBSCRIPTIONS","id":{sent}}}"#).into())).is_ok() {
        sent += 1;
    }
    assert!(sent < 1_000_000, "the server read a million requests without a reader of its answers");
    server.expect_log_within("closed: not reading: a write waited 3 s", Duration::from_secs(30));
    web_sockets_reach(&server, 0, "the connection's slot was not given back");
    drop(socket);
    assert!(server.terminate().success());
}

/// The same over plain HTTP: a client that pipelines requests and never
/// reads the answers is closed once a write has waited three ping
/// intervals (and a second), not kept with its connection's slot.
#[test]
fn an_http_client_that_never_reads_its_answers_is_closed() {
    let dir = TempDir::new("md-http-not-reading");
    let config = edited_config(&dir.0, "http-not-reading.toml", &[("ping_interval_s = 20 ", "ping_interval_s = 1 ")]);
    let server = start(&dir.0, Some(&config));
    let mut stream = TcpStream::connect(&server.market_address).expect("connect");
    stream.set_write_timeout(Some(Duration::from_secs(2))).expect("timeout");
    let request = format!("GET /api/v3/exchangeInfo HTTP/1.1\r\nHost: {}\r\n\r\n", server.market_address);
    let mut sent = 0u64;
    while sent < 1_000_000 && stream.write_all(request.as_bytes()).is_ok() {
        sent += 1;
    }
    assert!(sent < 1_000_000, "the server read a million requests without a reader of its answers");
    server.expect_log_within("closed: not reading (a write waited 4 s)", Duration::from_secs(30));
    // Its slot is back: the server answers, and stops cleanly.
    assert_eq!(http_get(&server.market_address, "/api/v3/ping").0, 200);
    drop(stream);
    assert!(server.terminate().success());
}
