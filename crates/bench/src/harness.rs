//! The harness behind `crossbook bench`: throughput, latency percentiles,
//! a stage split, a machine-readable report with its provenance, the
//! journal's figures, and comparison against a baseline report. The
//! `crossbook` binary only parses the flags into [`Options`].

use anyhow::{Context, Result, bail};
use crossbook_engine::{Command, Engine, Event};
use crossbook_marketdata::{CommandContext, InstrumentInfo, MarketData};
use crossbook_workload::{Workload, generate};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// A generated workload, or exchange-core's recorded flow.
#[derive(Clone, Debug)]
pub enum WorkloadSource {
    Generated(Workload),
    ExchangeCore(PathBuf),
}

pub const EXCHANGE_CORE_SINGLE: &str = "exchange-core-single";

impl WorkloadSource {
    /// Why `name` names no workload the bench runs (the known ones listed),
    /// if it does not: for a caller that says so before anything else.
    pub fn unknown(name: &str) -> Option<String> {
        if name == EXCHANGE_CORE_SINGLE || Workload::from_name(name).is_some() {
            return None;
        }
        let known: Vec<&str> = Workload::ALL.iter().map(|w| w.name()).chain([EXCHANGE_CORE_SINGLE]).collect();
        Some(format!("unknown workload {name:?}; known: {}", known.join(", ")))
    }

    pub fn parse(name: &str, flow: Option<PathBuf>) -> Result<WorkloadSource> {
        if let Some(why) = WorkloadSource::unknown(name) {
            bail!("{why}");
        }
        match Workload::from_name(name) {
            Some(workload) => Ok(WorkloadSource::Generated(workload)),
            None => Ok(WorkloadSource::ExchangeCore(crossbook_compat::flow_dir(flow)?)),
        }
    }

    fn name(&self) -> &str {
        match self {
            WorkloadSource::Generated(w) => w.name(),
            WorkloadSource::ExchangeCore(_) => EXCHANGE_CORE_SINGLE,
        }
    }

    /// The commands: generated, or the whole flow (set-up included; the
    /// count is ignored).
    fn commands(&self, seed: u64, count: Option<usize>) -> Result<Vec<Command>> {
        match self {
            WorkloadSource::Generated(w) => Ok(generate(*w, seed, count.unwrap_or(1_000_000))),
            WorkloadSource::ExchangeCore(dir) => {
                let mut commands = crossbook_compat::commands(dir)?;
                if let Some(count) = count.filter(|&count| count > commands.len()) {
                    eprintln!("note: the flow has {} commands: --commands {count} takes all of them", commands.len());
                }
                commands.truncate(count.unwrap_or(usize::MAX));
                Ok(commands)
            }
        }
    }
}

pub struct Options {
    pub workload: WorkloadSource,
    /// `None`: the workload's default size.
    pub commands: Option<usize>,
    pub seed: u64,
    pub latency: bool,
    pub journal: Option<PathBuf>,
    pub json: bool,
    pub compare: Option<PathBuf>,
    pub threshold_percent: f64,
    /// Test hook: a busy wait of this many nanoseconds per command in the
    /// throughput pass, to prove that `--compare` catches a slower build.
    pub slow_ns: u64,
    /// Throughput passes, each on a fresh engine (1: the cold figure only).
    pub passes: usize,
}

/// Warm-engine figures: `passes` throughput passes over the same commands,
/// each on a fresh engine, as `bench/versus/exchange-core` measures its
/// peer (passes 1 and 2 warm caches, branch predictors and the allocator;
/// the median of passes 3 to N is the figure `scripts/versus` compares).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Warm {
    pub ns_per_command_by_pass: Vec<f64>,
    pub warm_ns_per_command: f64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Latency {
    pub min: u64,
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    #[serde(rename = "p99.9")]
    pub p99_9: u64,
    #[serde(rename = "p99.99")]
    pub p99_99: u64,
    pub max: u64,
}

/// Nanoseconds per command spent in each stage, each measured in its own
/// pass over the same commands (so no clock is read inside a stage).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Stages {
    /// Risk checks, matching and settlement: the engine's `apply`.
    pub engine: f64,
    /// The engine's time split by sampled stage clocks (builds with the
    /// `stage-clock` feature only; `null` otherwise).
    pub risk_check: Option<f64>,
    pub matching: Option<f64>,
    pub settlement: Option<f64>,
    /// Deriving the `balance` lines (`BalanceLines`) and writing every
    /// event as text (the event file format).
    pub event_encoding: f64,
    /// Following the engine's events in market data as `crossbook
    /// serve`'s market-data thread does (`MarketData::apply_command`:
    /// books, trades, candles, every account's orders and trades), timed
    /// alone over events recorded beforehand. Absent from reports older
    /// than this figure.
    #[serde(default)]
    pub market_data: f64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Report {
    pub schema: u32,
    pub workload: String,
    pub seed: u64,
    pub commands: usize,
    pub orders: usize,
    pub trades: u64,
    pub commands_per_s: f64,
    pub orders_per_s: f64,
    pub trades_per_s: f64,
    pub latency_ns: Option<Latency>,
    pub stages_ns_per_command: Stages,
    /// SHA-256 of the event file the run produced: a faster build that
    /// computes something else is caught.
    pub events_sha256: String,
    pub command_line: String,
    pub git_commit: String,
    pub git_dirty: bool,
    pub build_profile: String,
    pub cpu_model: String,
    pub date: String,
    /// With `--journal DIR`: the journal's figures (side by side with
    /// in-memory runs, medians of rounds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub journal: Option<JournalFigures>,
    /// With `--passes N` (N > 1): every pass's figure and the warm median.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm: Option<Warm>,
}

/// `passes` throughput passes, each on a fresh engine; the first is pass 1
/// of `measure` (already run).
fn warm_passes(commands: &[Command], first_ns: f64, passes: usize) -> Option<Warm> {
    if passes < 2 {
        return None;
    }
    let mut by_pass = vec![first_ns];
    let mut events: Vec<Event> = Vec::with_capacity(1 << 12);
    for _ in 1..passes {
        let mut engine = Engine::new();
        let started = Instant::now();
        replay(&mut engine, commands, &mut events);
        by_pass.push(started.elapsed().as_nanos() as f64 / commands.len() as f64);
    }
    let mut warm: Vec<f64> = by_pass[by_pass.len().min(2).min(passes - 1)..].to_vec();
    warm.sort_by(f64::total_cmp);
    let middle = warm.len() / 2;
    let median = if warm.len() % 2 == 1 { warm[middle] } else { (warm[middle - 1] + warm[middle]) / 2.0 };
    Some(Warm { ns_per_command_by_pass: by_pass, warm_ns_per_command: median })
}

fn busy_wait(nanos: u64) {
    if nanos == 0 {
        return;
    }
    let start = Instant::now();
    while (start.elapsed().as_nanos() as u64) < nanos {
        std::hint::spin_loop();
    }
}

pub fn measure(options: &Options) -> Result<(Report, Vec<Command>)> {
    let commands = options.workload.commands(options.seed, options.commands)?;
    let count = commands.len();

    // Pass 1: throughput, nothing measured per command.
    let mut engine = Engine::new();
    let mut events: Vec<Event> = Vec::with_capacity(1 << 12);
    let _ = crossbook_engine::stages::take();
    let started = Instant::now();
    let trades = if options.slow_ns == 0 {
        replay(&mut engine, &commands, &mut events)
    } else {
        for command in &commands {
            events.clear();
            engine.apply(command, &mut events);
            busy_wait(options.slow_ns);
        }
        engine.trades()
    };
    let seconds = started.elapsed().as_secs_f64();
    let sampled = crossbook_engine::stages::take().filter(|t| t.samples > 0);

    // Pass 2: per-command latency on a fresh engine. The two clock reads
    // around each command cost about 40 ns; that is why throughput comes
    // from pass 1.
    let latency = if options.latency {
        let mut histogram = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
        let mut engine = Engine::new();
        for command in &commands {
            events.clear();
            let start = Instant::now();
            engine.apply(command, &mut events);
            histogram.saturating_record((start.elapsed().as_nanos() as u64).max(1));
        }
        Some(Latency {
            min: histogram.min(),
            p50: histogram.value_at_quantile(0.50),
            p90: histogram.value_at_quantile(0.90),
            p99: histogram.value_at_quantile(0.99),
            p99_9: histogram.value_at_quantile(0.999),
            p99_99: histogram.value_at_quantile(0.9999),
            max: histogram.max(),
        })
    } else {
        None
    };

    // Pass 3: the same again, deriving the `balance` lines and writing
    // every event as text and hashing it: the bytes `crossbook run` writes.
    let mut engine = Engine::new();
    let mut text = Vec::with_capacity(1 << 20);
    let mut digest = Sha256::new();
    let mut balance_lines = crossbook_engine::BalanceLines::new();
    let started = Instant::now();
    for command in &commands {
        events.clear();
        engine.apply(command, &mut events);
        balance_lines.append(&engine, &mut events);
        for event in &events {
            crossbook_text::write_event(&mut text, event);
        }
        if text.len() >= 1 << 20 {
            digest.update(&text);
            text.clear();
        }
    }
    digest.update(&text);
    let encode_seconds = started.elapsed().as_secs_f64();
    let events_sha256 = digest.finalize().iter().map(|b| format!("{b:02x}")).collect();

    // Pass 4: market data following the events of every command, timed
    // alone over events recorded beforehand.
    let market_ns = {
        let recorded = Recorded::of(&commands);
        let mut market = MarketData::new(InstrumentInfo::of_commands(&commands), 0);
        let started = Instant::now();
        follow_market(&mut market, &commands, &recorded);
        started.elapsed().as_secs_f64() * 1e9 / count as f64
    };

    let orders = commands.iter().filter(|c| matches!(c, Command::Place(_))).count();
    let engine_ns = seconds * 1e9 / count as f64;
    let (git_commit, git_dirty) = git_state();
    let report = Report {
        schema: 1,
        workload: options.workload.name().to_string(),
        seed: options.seed,
        commands: count,
        orders,
        trades,
        commands_per_s: count as f64 / seconds,
        orders_per_s: orders as f64 / seconds,
        trades_per_s: trades as f64 / seconds,
        latency_ns: latency,
        stages_ns_per_command: {
            // Sampled proportions applied to the unperturbed engine time.
            let total: u64 = sampled.map_or(0, |t| t.nanos.iter().sum());
            let share = |stage: crossbook_engine::stages::Stage| {
                sampled.filter(|_| total > 0).map(|t| engine_ns * t.nanos[stage as usize] as f64 / total as f64)
            };
            use crossbook_engine::stages::Stage;
            Stages {
                engine: engine_ns,
                risk_check: share(Stage::Risk),
                matching: share(Stage::Matching),
                settlement: share(Stage::Settlement),
                event_encoding: (encode_seconds * 1e9 / count as f64 - engine_ns).max(0.0),
                market_data: market_ns,
            }
        },
        events_sha256,
        command_line: std::env::args().collect::<Vec<_>>().join(" "),
        git_commit,
        git_dirty,
        build_profile: if cfg!(debug_assertions) { "debug".into() } else { "release".into() },
        cpu_model: cpu_model(),
        date: utc_now(),
        journal: None,
        warm: warm_passes(&commands, engine_ns, options.passes),
    };
    Ok((report, commands))
}

pub fn run(options: Options) -> Result<()> {
    if let Some(path) = &options.compare {
        return compare(&options, path);
    }
    let (mut report, commands) = measure(&options)?;
    if let Some(dir) = &options.journal {
        report.journal = Some(journal_figures(&commands, dir)?);
    }
    if options.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_text(&report);
        if let Some(figures) = &report.journal {
            figures.print();
        }
    }
    Ok(())
}

fn print_text(r: &Report) {
    println!("workload {} seed {} commands {}", r.workload, r.seed, r.commands);
    println!("commands_per_s {:.0}", r.commands_per_s);
    println!("orders {} orders_per_s {:.0}", r.orders, r.orders_per_s);
    println!("trades {} trades_per_s {:.0}", r.trades, r.trades_per_s);
    if let Some(l) = &r.latency_ns {
        println!(
            "latency_ns min {} p50 {} p90 {} p99 {} p99.9 {} p99.99 {} max {}",
            l.min, l.p50, l.p90, l.p99, l.p99_9, l.p99_99, l.max
        );
    }
    let st = &r.stages_ns_per_command;
    match (st.risk_check, st.matching, st.settlement) {
        (Some(risk), Some(matching), Some(settlement)) => println!(
            "stages_ns_per_command engine {:.1} (risk_check {risk:.1} matching {matching:.1} settlement {settlement:.1}) event_encoding {:.1} market_data {:.1}",
            st.engine, st.event_encoding, st.market_data
        ),
        _ => println!(
            "stages_ns_per_command engine {:.1} event_encoding {:.1} market_data {:.1} (build with --features stage-clock to split the engine)",
            st.engine, st.event_encoding, st.market_data
        ),
    }
    if let Some(warm) = &r.warm {
        for (pass, ns) in warm.ns_per_command_by_pass.iter().enumerate() {
            println!("pass {} ns_per_command {ns:.1}", pass + 1);
        }
        let passes = warm.ns_per_command_by_pass.len();
        let first = if passes >= 3 { 3 } else { 2 };
        println!("warm_ns_per_command {:.1} (median of passes {first}-{passes})", warm.warm_ns_per_command);
    }
    println!("events_sha256 {}", r.events_sha256);
    println!("provenance commit {}{} profile {} cpu {:?} date {}", r.git_commit, if r.git_dirty { " (dirty)" } else { "" }, r.build_profile, r.cpu_model, r.date);
}

/// One figure beside its baseline. `higher_is_better` decides which way is
/// a regression.
struct Row {
    name: &'static str,
    baseline: f64,
    now: f64,
    higher_is_better: bool,
    /// Flagged past the threshold (tail latencies are shown, not flagged:
    /// on a shared machine they move by more than any useful threshold).
    gated: bool,
}

fn compare(options: &Options, path: &Path) -> Result<()> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let baseline: Report = serde_json::from_str(&text).with_context(|| format!("{} is not a bench report", path.display()))?;
    let flow = match &options.workload {
        WorkloadSource::ExchangeCore(dir) => Some(dir.clone()),
        WorkloadSource::Generated(_) => None,
    };
    let workload = WorkloadSource::parse(&baseline.workload, flow)?;
    let rerun = Options {
        workload,
        commands: Some(baseline.commands),
        seed: baseline.seed,
        latency: baseline.latency_ns.is_some(),
        journal: None,
        json: false,
        compare: None,
        threshold_percent: options.threshold_percent,
        slow_ns: options.slow_ns,
        passes: 1,
    };
    let (now, _) = measure(&rerun)?;
    let mut rows = vec![
        Row { name: "commands_per_s", baseline: baseline.commands_per_s, now: now.commands_per_s, higher_is_better: true, gated: true },
        Row { name: "orders_per_s", baseline: baseline.orders_per_s, now: now.orders_per_s, higher_is_better: true, gated: true },
        Row { name: "trades_per_s", baseline: baseline.trades_per_s, now: now.trades_per_s, higher_is_better: true, gated: false },
    ];
    if let (Some(b), Some(n)) = (&baseline.latency_ns, &now.latency_ns) {
        for (name, b, n, gated) in [
            ("latency_ns_p50", b.p50, n.p50, true),
            ("latency_ns_p90", b.p90, n.p90, false),
            ("latency_ns_p99", b.p99, n.p99, false),
            ("latency_ns_p99.9", b.p99_9, n.p99_9, false),
            ("latency_ns_max", b.max, n.max, false),
        ] {
            rows.push(Row { name, baseline: b as f64, now: n as f64, higher_is_better: false, gated });
        }
    }
    println!("comparing {} (commit {}, {}) with this build (commit {})", path.display(), baseline.git_commit, baseline.date, now.git_commit);
    println!("{:<20} {:>16} {:>16} {:>9}", "figure", "baseline", "now", "change");
    let mut regressions = Vec::new();
    for row in &rows {
        let change = if row.baseline == 0.0 { 0.0 } else { 100.0 * (row.now - row.baseline) / row.baseline };
        let worse = if row.higher_is_better { -change } else { change };
        let flag = if row.gated && worse > options.threshold_percent {
            regressions.push(row.name);
            "  REGRESSION"
        } else {
            ""
        };
        println!("{:<20} {:>16.0} {:>16.0} {:>+8.1}%{flag}", row.name, row.baseline, row.now, change);
    }
    if now.events_sha256 != baseline.events_sha256 {
        println!("events_sha256 differs: baseline {} now {}", baseline.events_sha256, now.events_sha256);
        bail!("this build computes different events from the baseline's");
    }
    println!("events_sha256 same");
    if !regressions.is_empty() {
        bail!("regression past {}%: {}", options.threshold_percent, regressions.join(", "));
    }
    println!("no regression past {}%", options.threshold_percent);
    Ok(())
}

fn git_state() -> (String, bool) {
    let run = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let commit = run(&["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty = run(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    (commit, dirty)
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// The current UTC time as `YYYY-MM-DDTHH:MM:SSZ` (civil-from-days, after
/// Howard Hinnant's algorithm).
fn utc_now() -> String {
    let seconds = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()) as i64;
    let (days, rest) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rest / 3600, rest % 3600 / 60, rest % 60)
}

/// Applies every command; returns the number of trades. Kept out of line so
/// that `scripts/instructions` can count exactly this loop with callgrind's
/// `--toggle-collect='crossbook_bench::harness::replay*'`.
#[inline(never)]
pub fn replay(engine: &mut Engine, commands: &[Command], events: &mut Vec<Event>) -> u64 {
    let trades_before = engine.trades();
    for command in commands {
        events.clear();
        engine.apply(command, events);
    }
    engine.trades() - trades_before
}

/// Every command's events, recorded from an engine run: the input of
/// market data's pass.
pub struct Recorded {
    events: Vec<Event>,
    /// Where each command's events end in `events`.
    ends: Vec<usize>,
}

impl Recorded {
    pub fn of(commands: &[Command]) -> Recorded {
        let mut engine = Engine::new();
        let mut recorded = Recorded { events: Vec::with_capacity(commands.len() * 2), ends: Vec::with_capacity(commands.len()) };
        for command in commands {
            engine.apply(command, &mut recorded.events);
            recorded.ends.push(recorded.events.len());
        }
        recorded
    }
}

/// Commands per batch in market data's pass: the server hands its
/// market-data thread a released batch at a time, and takes the batch's
/// updates (depth diffs, trades) once per batch.
pub const MARKET_BATCH: usize = 64;

/// Applies every command's recorded events to `market`, with the command
/// itself, as the server's market-data thread does, taking the updates
/// every [`MARKET_BATCH`] commands. Kept out of line so that
/// `scripts/instructions` can count exactly this loop
/// (`STAGE=market-data`).
#[inline(never)]
pub fn follow_market(market: &mut MarketData, commands: &[Command], recorded: &Recorded) {
    let mut start = 0;
    for (index, (command, &end)) in commands.iter().zip(&recorded.ends).enumerate() {
        let seq = index as u64 + 1;
        let context = CommandContext { command, client_id: None, gateway: false };
        market.apply_command(seq, seq / 1024, Some(context), &recorded.events[start..end]);
        if (index + 1) % MARKET_BATCH == 0 || index + 1 == commands.len() {
            market.advance(seq, seq / 1024);
            std::hint::black_box(market.take_updates());
        }
        start = end;
    }
}

/// The file that marks a directory as the bench's own scratch directory.
const SCRATCH_MARKER: &str = ".crossbook-bench";

/// Takes `dir` as the journal bench's scratch directory: a new one, an
/// empty one, or one an earlier bench left (its marker in it). Anything
/// else is refused: the bench writes journals there and removes them, and
/// a directory given by mistake (a venue's data, `.`) must not lose what
/// is in it.
fn claim_scratch(dir: &Path) -> Result<()> {
    match std::fs::read_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        Err(e) => bail!("{}: {e}", dir.display()),
        Ok(mut entries) => {
            if entries.next().is_some() && !dir.join(SCRATCH_MARKER).exists() {
                bail!(
                    "{} is not empty and is not a directory an earlier bench left (no {SCRATCH_MARKER} in it): \
                     the bench writes journals in its --journal directory and removes them, so give it a new or empty one",
                    dir.display()
                );
            }
        }
    }
    std::fs::write(dir.join(SCRATCH_MARKER), "crossbook bench's scratch directory: the journals it writes here (async/, sync/) are removed by the next bench\n")
        .with_context(|| format!("writing in {}", dir.display()))?;
    Ok(())
}

/// The journal figures of `crossbook bench --journal DIR`: in rounds, the
/// commands applied in memory, journaled in async mode, journaled in sync
/// mode, and recovered from the sync journal; medians of each, so that the
/// ratios compare figures taken side by side.
pub fn journal_figures(commands: &[crossbook_engine::Command], dir: &Path) -> Result<JournalFigures> {
    use crossbook_journal::{CommitStats, Durability, Journal, JournalConfig, recover as recover_dir};
    use std::time::Duration;
    const ROUNDS: usize = 5;
    let mut memory = Vec::new();
    let mut journaled: [Vec<(f64, CommitStats)>; 2] = [Vec::new(), Vec::new()];
    let mut replay = Vec::new();
    let modes = [("async", Durability::Async { interval: Duration::from_millis(10) }), ("sync", Durability::Sync)];
    claim_scratch(dir)?;
    // Never a directory a running venue holds (its LOCK).
    drop(crossbook_journal::lock_dir(dir)?);
    let clear = || {
        for (name, _) in &modes {
            let _ = std::fs::remove_dir_all(dir.join(name));
        }
    };
    for _ in 0..ROUNDS {
        clear();
        let mut engine = crossbook_engine::Engine::new();
        let mut events: Vec<Event> = Vec::with_capacity(1 << 12);
        let started = Instant::now();
        for command in commands {
            events.clear();
            engine.apply(command, &mut events);
        }
        memory.push(commands.len() as f64 / started.elapsed().as_secs_f64());
        for (index, (name, durability)) in modes.iter().enumerate() {
            let path = dir.join(name);
            let recovered = recover_dir(&path)?;
            let mut engine = recovered.engine;
            let mut journal = Journal::open(&path, JournalConfig { durability: *durability, ..JournalConfig::default() }, &recovered.end)?;
            let started = Instant::now();
            for command in commands {
                let seq = engine.seq() + 1;
                journal.append(seq, command)?;
                events.clear();
                engine.apply(command, &mut events);
            }
            journal.flush()?;
            let elapsed = started.elapsed().as_secs_f64();
            let stats = journal.close()?;
            journaled[index].push((commands.len() as f64 / elapsed, stats));
        }
        let started = Instant::now();
        let recovered = recover_dir(&dir.join("sync"))?;
        replay.push(recovered.replayed as f64 / started.elapsed().as_secs_f64());
    }
    clear();
    for name in [SCRATCH_MARKER, "LOCK"] {
        let _ = std::fs::remove_file(dir.join(name));
    }
    // Gone if nothing else is in it.
    let _ = std::fs::remove_dir(dir);
    let median = |values: &mut Vec<f64>| {
        values.sort_by(|a, b| a.total_cmp(b));
        values[values.len() / 2]
    };
    let memory = median(&mut memory);
    let mut figures = JournalFigures { rounds: ROUNDS, in_memory_commands_per_s: memory, ..JournalFigures::default() };
    for (index, (name, _)) in modes.iter().enumerate() {
        let mut rates: Vec<f64> = journaled[index].iter().map(|(r, _)| *r).collect();
        let rate = median(&mut rates);
        let stage = (1e9 / rate - 1e9 / memory).max(0.0);
        if *name == "async" {
            figures.async_commands_per_s = rate;
            figures.async_ns_per_command = stage;
        } else {
            let syncs: u64 = journaled[index].iter().map(|(_, s)| s.syncs).sum();
            let records: u64 = journaled[index].iter().map(|(_, s)| s.records).sum();
            let nanos: u64 = journaled[index].iter().map(|(_, s)| s.sync_nanos).sum();
            figures.sync_commands_per_s = rate;
            figures.sync_ns_per_command = stage;
            if syncs > 0 {
                figures.fsync_us = nanos as f64 / syncs as f64 / 1000.0;
                figures.commands_per_group_commit = records as f64 / syncs as f64;
            }
        }
    }
    figures.recovery_replay_commands_per_s = median(&mut replay);
    Ok(figures)
}

/// What `crossbook bench --journal DIR` measured: medians of `rounds`
/// rounds, each running the commands in memory, through the journal in
/// `async` and `sync` mode, and replaying the sync journal in recovery.
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug, Default, PartialEq)]
pub struct JournalFigures {
    pub rounds: usize,
    pub in_memory_commands_per_s: f64,
    pub async_commands_per_s: f64,
    pub sync_commands_per_s: f64,
    pub recovery_replay_commands_per_s: f64,
    /// Average time of one group commit's fdatasync, and the commands it
    /// covered.
    pub fsync_us: f64,
    pub commands_per_group_commit: f64,
    /// The journal's stage: journaled minus in-memory, per command.
    pub async_ns_per_command: f64,
    pub sync_ns_per_command: f64,
}

impl JournalFigures {
    pub fn print(&self) {
        let memory = self.in_memory_commands_per_s;
        let share = |rate: f64| 100.0 * rate / memory;
        println!("journal_rounds {} (medians)", self.rounds);
        println!("in_memory commands_per_s {memory:.0}");
        println!("journal_async commands_per_s {:.0} ({:.0}% of in-memory)", self.async_commands_per_s, share(self.async_commands_per_s));
        println!(
            "journal_sync commands_per_s {:.0} ({:.0}% of in-memory) fsync_us {:.1} commands_per_group_commit {:.1}",
            self.sync_commands_per_s,
            share(self.sync_commands_per_s),
            self.fsync_us,
            self.commands_per_group_commit
        );
        println!("recovery_replay commands_per_s {:.0} ({:.0}% of in-memory)", self.recovery_replay_commands_per_s, share(self.recovery_replay_commands_per_s));
        println!("stages_ns_per_command journal_async {:.1} journal_sync {:.1} (journaled minus in-memory, medians)", self.async_ns_per_command, self.sync_ns_per_command);
    }
}
