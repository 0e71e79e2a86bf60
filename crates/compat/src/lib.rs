//! exchange-core's single-pair benchmark flow in crossbook: its commands
//! translated into ours ([`commands`], for `crossbook bench --workload
//! exchange-core-single`), and every trade, every reduce and the final book
//! compared with what exchange-core's own book did ([`check`], for
//! `crossbook compat exchange-core`;
//! `../shared/workloads/exchange-core-singlepair/README.md`).
//!
//! The translation, command by command:
//!
//! - `PLACE_ORDER` GTC / IOC: a limit order (STP off: the flow self-trades).
//! - `PLACE_ORDER` FOK_BUDGET: a FOK market order whose budget is the
//!   `price` field (a bid's most to spend, an ask's least to receive).
//! - `MOVE_ORDER`: `replace` to the new price with the same total quantity.
//! - `REDUCE_ORDER` by `size`: `replace` at the same price with the total
//!   quantity less `size` (keeps its place); all of what is left: the
//!   order is removed.
//! - `CANCEL_ORDER`: `cancel`.
//!
//! One instrument (tick 1, lot 1, no fees), every account funded far
//! beyond what it can spend.

use crossbook_engine::*;
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

pub const INSTRUMENT: InstrumentId = 1;

/// Why the flow could not be read or checked.
#[derive(Debug)]
pub enum CompatError {
    /// No flow folder was given and none is at the default places.
    NoFlow,
    /// The folder has no `commands.csv.gz`.
    NotAFlow(PathBuf),
    Io { path: PathBuf, source: std::io::Error },
    /// A line of one of the flow's files that is not what its header says.
    Format { file: &'static str, line: usize, what: String },
}

impl std::fmt::Display for CompatError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CompatError::NoFlow => {
                let here = std::env::current_dir().map_or_else(|_| "this directory".to_string(), |d| d.display().to_string());
                write!(f, "the exchange-core flow is in neither {} nor {} (from {here}): pass --flow DIR (the folder with commands.csv.gz)", DEFAULT_FLOWS[0], DEFAULT_FLOWS[1])
            }
            CompatError::NotAFlow(dir) if !dir.exists() => write!(f, "{} does not exist", dir.display()),
            CompatError::NotAFlow(dir) => write!(f, "{} holds no commands.csv.gz", dir.display()),
            // The cause is `source()`'s (a chain printer adds it).
            CompatError::Io { path, .. } => write!(f, "reading {}", path.display()),
            CompatError::Format { file, line, what } => write!(f, "{file} line {line}: {what}"),
        }
    }
}

impl std::error::Error for CompatError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CompatError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

type Result<T> = std::result::Result<T, CompatError>;

fn format_error(file: &'static str, line: usize, what: impl Into<String>) -> CompatError {
    CompatError::Format { file, line, what: what.into() }
}

/// Where the flow is looked for, from the working directory.
const DEFAULT_FLOWS: [&str; 2] = ["../shared/workloads/exchange-core-singlepair", "shared/workloads/exchange-core-singlepair"];

/// Where the flow lives unless `--flow` says otherwise.
pub fn default_flow() -> Option<PathBuf> {
    DEFAULT_FLOWS
        .iter()
        .map(PathBuf::from)
        .find(|p| p.join("commands.csv.gz").is_file())
}

/// The flow folder: `flow` if given, else the default places.
pub fn flow_dir(flow: Option<PathBuf>) -> Result<PathBuf> {
    match flow.or_else(default_flow) {
        Some(dir) if dir.join("commands.csv.gz").is_file() => Ok(dir),
        Some(dir) => Err(CompatError::NotAFlow(dir)),
        None => Err(CompatError::NoFlow),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Place(PlaceKind),
    Move,
    Reduce,
    Cancel,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PlaceKind {
    Gtc,
    Ioc,
    FokBudget,
}

#[derive(Clone, Copy, Debug)]
struct EcCommand {
    seq: u64,
    kind: Kind,
    order: u64,
    uid: u64,
    side: Side,
    price: i64,
    size: u64,
}

/// A trade or a reduce, as exchange-core reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Trade { maker: u64, maker_uid: u64, price: i64, size: u64, taker_done: bool, maker_done: bool },
    Reduce { price: i64, size: u64 },
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Trade { maker, maker_uid, price, size, taker_done, maker_done } => write!(
                f,
                "TRADE {size} @ {price} with order {maker} of {maker_uid} (taker done {taker_done}, maker done {maker_done})"
            ),
            Outcome::Reduce { price, size } => write!(f, "REDUCE {size} @ {price}"),
        }
    }
}

/// Checks a file's first line: the flow's header, or the file is not
/// what it should be (an empty or foreign file never reads as no rows).
fn header(file: &'static str, first: Option<&str>, expected: &str) -> Result<()> {
    match first {
        Some(line) if line.trim_end() == expected => Ok(()),
        Some(line) => Err(format_error(file, 1, format!("header {:?}, expected {expected:?}", line.chars().take(80).collect::<String>()))),
        None => Err(format_error(file, 1, format!("empty file, expected the header {expected:?}"))),
    }
}

/// The lines of a gzip-compressed CSV file after its header (checked),
/// numbered from 2 as an editor shows them.
fn gz_lines(dir: &Path, file: &'static str, expected: &str) -> Result<impl Iterator<Item = Result<(usize, String)>>> {
    let path = dir.join(file);
    let opened = std::fs::File::open(&path).map_err(|source| CompatError::Io { path: path.clone(), source })?;
    let mut lines = BufReader::new(flate2::read::GzDecoder::new(opened)).lines();
    let first = lines.next().transpose().map_err(|source| CompatError::Io { path: path.clone(), source })?;
    header(file, first.as_deref(), expected)?;
    Ok(lines.enumerate().map(move |(index, line)| line.map(|l| (index + 2, l)).map_err(|source| CompatError::Io { path: path.clone(), source })))
}

fn field<T: std::str::FromStr>(file: &'static str, fields: &[&str], index: usize, what: &str, line: usize) -> Result<T> {
    let value = fields.get(index).copied().unwrap_or("");
    value.parse().map_err(|_| format_error(file, line, format!("bad {what} {value:?}")))
}

fn read_commands(dir: &Path) -> Result<Vec<EcCommand>> {
    let mut commands = Vec::new();
    const FILE: &str = "commands.csv.gz";
    for line in gz_lines(dir, FILE, "seq,command,order_id,uid,action,order_type,price,reserve_bid_price,size")? {
        let (number, line) = line?;
        let f: Vec<&str> = line.split(',').collect();
        if f.len() != 9 {
            return Err(format_error(FILE, number, format!("{} fields, expected 9", f.len())));
        }
        let kind = match (f[1], f[5]) {
            ("PLACE_ORDER", "GTC") => Kind::Place(PlaceKind::Gtc),
            ("PLACE_ORDER", "IOC") => Kind::Place(PlaceKind::Ioc),
            ("PLACE_ORDER", "FOK_BUDGET") => Kind::Place(PlaceKind::FokBudget),
            ("MOVE_ORDER", _) => Kind::Move,
            ("REDUCE_ORDER", _) => Kind::Reduce,
            ("CANCEL_ORDER", _) => Kind::Cancel,
            (command, kind) => return Err(format_error(FILE, number, format!("unknown command {command} {kind}"))),
        };
        let side = match f[4] {
            "BID" => Side::Buy,
            "ASK" => Side::Sell,
            other => return Err(format_error(FILE, number, format!("unknown action {other}"))),
        };
        let seq: u64 = field(FILE, &f, 0, "seq", number)?;
        // Events are matched to commands by it: one used twice, or out of
        // order, would pair them wrongly.
        if let Some(last) = commands.last().map(|c: &EcCommand| c.seq)
            && seq <= last
        {
            return Err(format_error(FILE, number, format!("seq {seq} after {last}: sequence numbers must increase")));
        }
        commands.push(EcCommand {
            seq,
            kind,
            order: field(FILE, &f, 2, "order_id", number)?,
            uid: field(FILE, &f, 3, "uid", number)?,
            side,
            price: field(FILE, &f, 6, "price", number)?,
            size: field(FILE, &f, 8, "size", number)?,
        });
    }
    Ok(commands)
}

fn read_events(dir: &Path) -> Result<Vec<(u64, Outcome)>> {
    let mut events = Vec::new();
    const FILE: &str = "events.csv.gz";
    for line in gz_lines(dir, FILE, "seq,event,active_order_completed,matched_order_id,matched_uid,matched_order_completed,price,size,bidder_hold_price")? {
        let (number, line) = line?;
        let f: Vec<&str> = line.split(',').collect();
        if f.len() != 9 {
            return Err(format_error(FILE, number, format!("{} fields, expected 9", f.len())));
        }
        let seq: u64 = field(FILE, &f, 0, "seq", number)?;
        let outcome = match f[1] {
            "TRADE" => Outcome::Trade {
                maker: field(FILE, &f, 3, "matched_order_id", number)?,
                maker_uid: field(FILE, &f, 4, "matched_uid", number)?,
                price: field(FILE, &f, 6, "price", number)?,
                size: field(FILE, &f, 7, "size", number)?,
                taker_done: field(FILE, &f, 2, "active_order_completed", number)?,
                maker_done: field(FILE, &f, 5, "matched_order_completed", number)?,
            },
            "REDUCE" => Outcome::Reduce { price: field(FILE, &f, 6, "price", number)?, size: field(FILE, &f, 7, "size", number)? },
            other => return Err(format_error(FILE, number, format!("unknown event {other}"))),
        };
        events.push((seq, outcome));
    }
    Ok(events)
}

fn read_final_book(dir: &Path) -> Result<Vec<(Side, i64, u64, u32)>> {
    const FILE: &str = "final-book.csv";
    let path = dir.join(FILE);
    let text = std::fs::read_to_string(&path).map_err(|source| CompatError::Io { path: path.clone(), source })?;
    header(FILE, text.lines().next(), "side,price,volume,orders")?;
    let mut levels = Vec::new();
    for (index, line) in text.lines().enumerate().skip(1) {
        let number = index + 1;
        let f: Vec<&str> = line.split(',').collect();
        let side = match f.first() {
            Some(&"ask") => Side::Sell,
            Some(&"bid") => Side::Buy,
            other => return Err(format_error(FILE, number, format!("unknown side {other:?}"))),
        };
        levels.push((side, field(FILE, &f, 1, "price", number)?, field(FILE, &f, 2, "volume", number)?, field(FILE, &f, 3, "orders", number)?));
    }
    Ok(levels)
}

/// Turns exchange-core commands into ours, against a live engine (a move
/// or reduce needs the order's current quantity).
struct Translator {
    engine: Engine,
    events: Vec<Event>,
    /// exchange-core order id -> ours, and back.
    ours: HashMap<u64, OrderId>,
    theirs: HashMap<OrderId, u64>,
}

fn setup(uids: &[u64]) -> Vec<Command> {
    let name = |s| Symbol::new(s).expect("valid symbol");
    let mut commands = vec![
        Command::AddAsset { id: 1, name: name("BASE") },
        Command::AddAsset { id: 2, name: name("QUOTE") },
        Command::AddInstrument(InstrumentSpec {
            id: INSTRUMENT,
            symbol: name("XBT-USD"),
            base: 1,
            quote: 2,
            tick_size: 1,
            lot_size: 1,
            min_qty: 1,
            max_qty: 100_000_000,
            min_price: 1,
            max_price: 10_000_000,
            maker_bps: 0,
            taker_bps: 0,
        }),
    ];
    for &uid in uids {
        commands.push(Command::OpenAccount { account: uid });
        commands.push(Command::Deposit { account: uid, asset: 1, amount: 1 << 40 });
        commands.push(Command::Deposit { account: uid, asset: 2, amount: 1 << 50 });
    }
    commands
}

impl Translator {
    fn new(uids: &[u64]) -> Translator {
        let mut t = Translator { engine: Engine::new(), events: Vec::new(), ours: HashMap::new(), theirs: HashMap::new() };
        for command in setup(uids) {
            t.engine.apply(&command, &mut t.events);
        }
        t
    }

    fn translate(&self, c: &EcCommand) -> Option<Command> {
        let order = self.ours.get(&c.order).copied();
        match c.kind {
            Kind::Place(kind) => {
                let (order_type, tif, price, budget) = match kind {
                    PlaceKind::Gtc => (OrderType::Limit, TimeInForce::Gtc, c.price, None),
                    PlaceKind::Ioc => (OrderType::Limit, TimeInForce::Ioc, c.price, None),
                    PlaceKind::FokBudget => (OrderType::Market, TimeInForce::Fok, 0, Some(c.price.max(1) as u64)),
                };
                Some(Command::Place(PlaceOrder {
                    account: c.uid,
                    instrument: INSTRUMENT,
                    cid: c.order,
                    side: c.side,
                    order_type,
                    tif,
                    price,
                    qty: c.size,
                    post_only: false,
                    stp: SelfTradePrevention::None,
                    budget,
                }))
            }
            // An order exchange-core no longer has (filled, cancelled) is
            // no order of ours either: the command is refused by both.
            Kind::Move | Kind::Reduce if order.and_then(|o| self.engine.order(o)).is_none() => {
                Some(Command::Replace { account: c.uid, order: order.unwrap_or(u64::MAX), price: c.price.max(1), qty: 1 })
            }
            Kind::Move => {
                let order = order?;
                let view = self.engine.order(order)?;
                Some(Command::Replace { account: c.uid, order, price: c.price, qty: view.qty })
            }
            Kind::Reduce => {
                let order = order?;
                let view = self.engine.order(order)?;
                let remaining = view.qty - view.filled;
                let qty = if c.size >= remaining { view.filled } else { view.qty - c.size };
                Some(Command::Amend { account: c.uid, order, qty })
            }
            Kind::Cancel => Some(Command::Cancel { account: c.uid, order: order.unwrap_or(u64::MAX) }),
        }
    }

    /// Applies one exchange-core command; returns our command and what it
    /// did in exchange-core's terms.
    fn step(&mut self, c: &EcCommand) -> (Option<Command>, Vec<Outcome>) {
        let Some(command) = self.translate(c) else {
            return (None, Vec::new());
        };
        // The price a reduce is reported at: the order's own.
        let resting_price = match command {
            Command::Replace { order, .. } | Command::Amend { order, .. } | Command::Cancel { order, .. } => self.engine.order(order).map(|v| v.price),
            _ => None,
        };
        let remaining_before = match command {
            Command::Replace { order, .. } | Command::Amend { order, .. } => self.engine.order(order).map(|v| v.qty - v.filled),
            _ => None,
        };
        self.events.clear();
        self.engine.apply(&command, &mut self.events);
        let mut outcomes = Vec::new();
        for event in &self.events {
            match event.kind {
                EventKind::Accepted { order, .. } => {
                    self.ours.insert(c.order, order);
                    self.theirs.insert(order, c.order);
                }
                EventKind::Trade { maker, maker_account, price, qty, maker_remaining, taker_remaining, .. } => {
                    outcomes.push(Outcome::Trade {
                        maker: self.theirs.get(&maker).copied().unwrap_or(0),
                        maker_uid: maker_account,
                        price,
                        size: qty,
                        taker_done: taker_remaining == 0,
                        maker_done: maker_remaining == 0,
                    });
                }
                EventKind::Cancelled { remaining, .. } => {
                    let price = resting_price.unwrap_or(c.price);
                    outcomes.push(Outcome::Reduce { price, size: remaining });
                }
                EventKind::Replaced { remaining, priority_kept: true, price, .. } => {
                    let before = remaining_before.unwrap_or(remaining);
                    if before > remaining {
                        outcomes.push(Outcome::Reduce { price, size: before - remaining });
                    }
                }
                _ => {}
            }
        }
        (Some(command), outcomes)
    }
}

fn uids(commands: &[EcCommand]) -> Vec<u64> {
    let mut uids: Vec<u64> = commands.iter().map(|c| c.uid).collect();
    uids.sort_unstable();
    uids.dedup();
    uids
}

/// The flow as crossbook commands (set-up first), for the benchmark.
pub fn commands(dir: &Path) -> Result<Vec<Command>> {
    let flow = read_commands(dir)?;
    let uids = uids(&flow);
    let mut translator = Translator::new(&uids);
    let mut commands = setup(&uids);
    for c in &flow {
        if let (Some(command), _) = translator.step(c) {
            commands.push(command);
        }
    }
    Ok(commands)
}

/// What [`check`] found.
#[derive(Debug)]
pub struct Agreement {
    /// exchange-core commands replayed.
    pub commands: usize,
    /// Trades and reduces exchange-core reported for them.
    pub trades: u64,
    pub reduces: u64,
    /// Levels of exchange-core's final book.
    pub levels: usize,
    /// Checks: one per command (its trades and reduces), one for the
    /// final book.
    pub passed: u64,
    pub failed: u64,
    /// The first check that failed, described.
    pub first_difference: Option<String>,
}

/// Replays the flow in `dir` and compares, command by command, the trades
/// and reduces with exchange-core's, then the final book.
pub fn check(dir: &Path) -> Result<Agreement> {
    let flow = read_commands(dir)?;
    let expected = read_events(dir)?;
    let book = read_final_book(dir)?;
    let mut translator = Translator::new(&uids(&flow));
    let (mut passed, mut failed) = (0u64, 0u64);
    let mut first_difference: Option<String> = None;
    let mut next = 0usize;
    let (mut trades, mut reduces) = (0u64, 0u64);
    for c in &flow {
        let (_, ours) = translator.step(c);
        let start = next;
        while next < expected.len() && expected[next].0 == c.seq {
            next += 1;
        }
        let theirs: Vec<Outcome> = expected[start..next].iter().map(|(_, o)| *o).collect();
        trades += theirs.iter().filter(|o| matches!(o, Outcome::Trade { .. })).count() as u64;
        reduces += theirs.iter().filter(|o| matches!(o, Outcome::Reduce { .. })).count() as u64;
        if ours == theirs {
            passed += 1;
        } else {
            failed += 1;
            if first_difference.is_none() {
                let show = |list: &[Outcome]| if list.is_empty() { "nothing".to_string() } else { list.iter().map(|o| o.to_string()).collect::<Vec<_>>().join("; ") };
                first_difference = Some(format!(
                    "first difference at seq {} ({:?} order {}): exchange-core: {}; crossbook: {}",
                    c.seq,
                    c.kind,
                    c.order,
                    show(&theirs),
                    show(&ours)
                ));
            }
        }
    }
    if next != expected.len() {
        return Err(format_error("events.csv.gz", next + 2, "events for sequence numbers that are not in commands.csv.gz"));
    }
    let ours = translator.engine.depth(INSTRUMENT).unwrap_or_default();
    if ours == book {
        passed += 1;
    } else {
        failed += 1;
        let at = ours.iter().zip(&book).position(|(a, b)| a != b).unwrap_or(ours.len().min(book.len()));
        let level = |level: Option<&(Side, i64, u64, u32)>| match level {
            Some((side, price, qty, orders)) => format!("{} {qty} at {price} ({orders} orders)", if *side == Side::Buy { "bid" } else { "ask" }),
            None => "no level".to_string(),
        };
        let line = format!(
            "final book differs at level {at}: exchange-core {}, crossbook {} ({} vs {} levels)",
            level(book.get(at)),
            level(ours.get(at)),
            book.len(),
            ours.len()
        );
        first_difference.get_or_insert(line);
    }
    Ok(Agreement { commands: flow.len(), trades, reduces, levels: book.len(), passed, failed, first_difference })
}
