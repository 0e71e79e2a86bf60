//! `crossbook`: the thin binary that wires the crates to a command line.

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use crossbook_engine::{Command, Engine, Event};
use crossbook_workload::Workload;
use sha2::{Digest, Sha256};
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::time::Duration;
use crossbook_journal::{Durability, JournalConfig};

/// The allocator for everything the process does (Cargo.toml says why).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod bench;
mod compat;
mod journaled;
mod order;

#[derive(Parser)]
#[command(name = "crossbook", version, about = "An exchange core: order books, matching, accounts, settlement.")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Write a workload's command file to standard output.
    Gen {
        #[arg(long)]
        workload: String,
        #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
        seed: u64,
        #[arg(long, default_value_t = 20_000)]
        commands: usize,
    },
    /// Apply a command file; write the event file to standard output and its
    /// SHA-256 to standard error. With --journal, journal every command
    /// first and print `acked N` as commands become durable instead.
    Run {
        #[arg(long)]
        commands: PathBuf,
        /// Check every invariant after every command (slow; not with
        /// --journal).
        #[arg(long, conflicts_with = "journal")]
        check: bool,
        /// Journal directory: recover what is there, skip the commands it
        /// already holds, journal the rest.
        #[arg(long)]
        journal: Option<PathBuf>,
        /// `sync`: acknowledge after fdatasync; `async`: after the write,
        /// with a sync every 10 ms (with --journal).
        #[arg(long, default_value = "sync", requires = "journal")]
        durability: String,
        /// Write a snapshot every N commands (0: never; with --journal).
        #[arg(long, default_value_t = 0, requires = "journal")]
        snapshot_every: u64,
        /// Start a new journal segment past this many bytes (with --journal).
        #[arg(long, default_value_t = 64 << 20, requires = "journal")]
        segment_bytes: u64,
        /// Snapshots to keep (with --journal).
        #[arg(long, default_value_t = 2, requires = "journal")]
        keep_snapshots: usize,
    },
    /// Rebuild the state from a journal directory; print its last sequence
    /// number and state hash.
    Recover {
        #[arg(long)]
        journal: PathBuf,
    },
    /// Check or print a journal.
    Journal {
        #[command(subcommand)]
        action: JournalAction,
    },
    /// Run the exchange: recover from the data directory, then serve the
    /// binary protocol, FIX 4.4 and market data with the Binance-style
    /// REST and WebSocket APIs until SIGTERM or Ctrl-C.
    Serve {
        /// crossbook.toml (every setting has a default; the assets,
        /// instruments and accounts are the file's, or with `demo = true`
        /// the demo venue's; without a file: the demo venue, on a new data
        /// directory or the demo venue's own only, never on a venue set up
        /// or last served from a file).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Overrides `listen` (e.g. 127.0.0.1:0 for any free port).
        #[arg(long)]
        listen: Option<String>,
        /// Overrides `data_dir`.
        #[arg(long)]
        data: Option<PathBuf>,
        /// Overrides `fix.listen` (the FIX acceptor; "" turns it off).
        #[arg(long)]
        fix_listen: Option<String>,
        /// Overrides `market_data.listen` (HTTP and WebSocket market data
        /// and the dashboard; "" turns it off).
        #[arg(long)]
        market_listen: Option<String>,
    },
    /// A replica of a replicated venue (`[replication]`, docs/replication.md):
    /// follows the log on NATS JetStream, serves the read side (market
    /// data, report replay), refuses orders with a redirect to the leader;
    /// with --standby it takes the lead when the leader is gone.
    Follow {
        /// crossbook.toml, with a [replication] section.
        #[arg(long)]
        config: PathBuf,
        #[arg(long)]
        listen: Option<String>,
        #[arg(long)]
        data: Option<PathBuf>,
        #[arg(long)]
        market_listen: Option<String>,
        /// The FIX address (`""`: off, as a replicated node needs it while
        /// the FIX gateway is not replicated).
        #[arg(long)]
        fix_listen: Option<String>,
        /// This node's name (overrides replication.node).
        #[arg(long)]
        node: Option<String>,
        /// Take the lead when nobody holds it (a hot standby); without it,
        /// a read replica that never leads.
        #[arg(long)]
        standby: bool,
    },
    /// Drive a running `crossbook serve` with N sessions and report
    /// throughput and latency.
    Load {
        /// The server (default: crossbook serve's binary port; its FIX port
        /// with --protocol fix, its market-data port with rest or ws-api).
        #[arg(long)]
        address: Option<String>,
        /// `binary` (docs/protocol.md), `fix` (docs/fix.md), `rest`
        /// (Binance's signed POST /api/v3/order, docs/trading.md) or
        /// `ws-api` (its WebSocket API's order.place, docs/trading.md).
        #[arg(long, default_value = "binary")]
        protocol: String,
        /// What to send (docs/benchmarks.md): `cross-rest`, limit orders
        /// around a mid, half resting, half crossing, resting depth bounded.
        #[arg(long, default_value = "cross-rest")]
        workload: String,
        /// Stop after this many orders in all (and at the latest after
        /// --duration).
        #[arg(long, allow_negative_numbers = true)]
        count: Option<u64>,
        #[arg(long, default_value_t = 4, allow_negative_numbers = true)]
        connections: u64,
        /// The first session's account (the others follow): runs that
        /// should not meet each other's orders use different accounts.
        #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
        first_account: u64,
        /// Seconds of sending.
        #[arg(long, default_value_t = 10.0, allow_negative_numbers = true)]
        duration: f64,
        /// Orders per second over all sessions (open loop); without it,
        /// closed loop with --window orders outstanding per session.
        #[arg(long, allow_negative_numbers = true)]
        rate: Option<f64>,
        #[arg(long, default_value_t = 64, allow_negative_numbers = true)]
        window: u64,
        /// One JSON object on standard output.
        #[arg(long)]
        json: bool,
        /// Write `order cid` for every acknowledged order to this file.
        #[arg(long)]
        acked_out: Option<PathBuf>,
        /// Write `account last_seq` per session: the last report sequence
        /// number each saw.
        #[arg(long)]
        last_seen_out: Option<PathBuf>,
    },
    /// Watch a running `crossbook serve`'s market data: N WebSocket clients
    /// (and optionally K REST depth clients); report messages/s and the
    /// latency of `@trade` messages (docs/benchmarks.md).
    Watch {
        /// The market-data server (crossbook serve's default).
        #[arg(long, default_value = "127.0.0.1:7702")]
        address: String,
        /// Streams each connection subscribes to, comma-separated.
        #[arg(long, default_value = "btcusd@depth,btcusd@trade")]
        streams: String,
        #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
        connections: usize,
        /// Seconds of watching.
        #[arg(long, default_value_t = 10.0, allow_negative_numbers = true)]
        duration: f64,
        /// Clients asking GET /api/v3/depth?limit=100 in a loop meanwhile.
        #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
        depth_clients: usize,
        /// The symbol they ask for.
        #[arg(long, default_value = "BTCUSD")]
        depth_symbol: String,
        /// One JSON object on standard output.
        #[arg(long)]
        json: bool,
    },
    /// Trade by hand over the binary protocol: place, cancel, replace,
    /// cancel-all, balances, open-orders, watch; prints every message the
    /// server sends back, one line each (docs/protocol.md).
    Order {
        /// The server's binary port.
        #[arg(long, global = true, default_value = "127.0.0.1:7700")]
        address: String,
        /// The account to log in as (the demo venue has 1 to 16).
        #[arg(long, global = true, default_value_t = 1)]
        account: u64,
        /// Its login key: its login_key, or its API key when it has none (default: the demo venue's, demo-key-<account>).
        #[arg(long, global = true)]
        key: Option<String>,
        /// Replay the reports after this sequence number first (default:
        /// none, only what this command causes).
        #[arg(long, global = true)]
        last_seen: Option<u64>,
        /// Seconds to wait for the server's answer.
        #[arg(long, global = true, default_value_t = 5.0, allow_negative_numbers = true)]
        timeout: f64,
        /// Seconds to go on printing after the answer.
        #[arg(long, global = true, default_value_t = 0.2, allow_negative_numbers = true)]
        linger: f64,
        #[command(subcommand)]
        action: OrderAction,
    },
    /// Replay another engine's published flow and compare every result.
    Compat {
        #[command(subcommand)]
        engine: CompatEngine,
    },
    /// Run a workload in process and report throughput and latency.
    Bench {
        #[arg(long, default_value = "steady-deep")]
        workload: String,
        /// Commands, set-up included (default 1,000,000; for
        /// exchange-core-single, the whole flow or its first N commands).
        #[arg(long, allow_negative_numbers = true)]
        commands: Option<usize>,
        #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
        seed: u64,
        /// Skip the per-command latency pass (for instruction counting).
        #[arg(long)]
        no_latency: bool,
        /// Also run the workload through the journal (async, then sync)
        /// in this scratch directory, and time recovery from it.
        #[arg(long)]
        journal: Option<PathBuf>,
        /// `text`, or `json`: the machine-readable report with provenance
        /// (a baseline for --compare).
        #[arg(long, default_value = "text")]
        format: String,
        /// Rerun the workload of this baseline report and compare; exits
        /// non-zero on a regression past --threshold or different events.
        /// The baseline says the workload, its size and seed (one pass is
        /// rerun); only an exchange-core flow's folder, --flow, comes from
        /// here: --commands, --seed, --journal, --format, --passes and
        /// --no-latency are refused with it, --workload is not read.
        #[arg(long, conflicts_with_all = ["commands", "seed", "journal", "format", "passes", "no_latency"])]
        compare: Option<PathBuf>,
        /// Percent by which a gated figure may get worse before --compare
        /// calls it a regression.
        #[arg(long, default_value_t = 10.0, allow_negative_numbers = true)]
        threshold: f64,
        /// Test hook: busy-wait this many nanoseconds per command.
        #[arg(long, default_value_t = 0, hide = true)]
        slow_ns: u64,
        /// Throughput passes over the commands, each on a fresh engine;
        /// with 3 or more, the median of passes 3 to N is reported as
        /// `warm_ns_per_command` (what `scripts/versus` compares).
        #[arg(long, default_value_t = 1)]
        passes: usize,
        /// For `--workload exchange-core-single`: the flow folder.
        #[arg(long)]
        flow: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum OrderAction {
    /// A new order (prices in ticks, quantities in lots).
    Place {
        #[arg(long)]
        side: String,
        #[arg(long, allow_negative_numbers = true)]
        qty: u64,
        /// Limit price (not for --type market); a negative one is taken
        /// as written (`--price -1`) and refused by the server.
        #[arg(long, allow_negative_numbers = true)]
        price: Option<i64>,
        #[arg(long, default_value_t = 1)]
        instrument: u32,
        /// `limit` or `market`.
        #[arg(long = "type", default_value = "limit")]
        order_type: String,
        /// `gtc`, `ioc` or `fok` (default: gtc for a limit order, ioc for a
        /// market order, which cannot rest).
        #[arg(long)]
        tif: Option<String>,
        #[arg(long)]
        post_only: bool,
        /// Self-trade prevention: none, cancel-newest, cancel-oldest, cancel-both
        /// (or cancel_newest, ... as docs/protocol.md writes them).
        #[arg(long, default_value = "none")]
        stp: String,
        /// In quote units, at least 1: a market buy's most to spend (fees
        /// included), or a FOK market sell's least proceeds (fees
        /// deducted). Without it: no budget.
        #[arg(long, allow_negative_numbers = true)]
        budget: Option<u64>,
        /// The client order id (default: the clock in microseconds).
        #[arg(long, allow_negative_numbers = true)]
        cid: Option<u64>,
    },
    /// Cancel an open order by the engine's order id.
    Cancel {
        #[arg(long)]
        order: u64,
    },
    /// A new price and total quantity for an open order.
    Replace {
        #[arg(long)]
        order: u64,
        #[arg(long, allow_negative_numbers = true)]
        price: i64,
        #[arg(long, allow_negative_numbers = true)]
        qty: u64,
    },
    /// Cancel every open order (of one instrument).
    CancelAll {
        #[arg(long)]
        instrument: Option<u32>,
    },
    /// The account's balances, every asset: available and locked.
    Balances,
    /// The account's open orders (of one instrument).
    OpenOrders {
        #[arg(long)]
        instrument: Option<u32>,
    },
    /// Print reports as they come (for --duration seconds, or until Ctrl-C).
    Watch {
        #[arg(long, allow_negative_numbers = true)]
        duration: Option<f64>,
    },
}

#[derive(Subcommand)]
enum CompatEngine {
    /// exchange-core's single-pair benchmark flow: every trade, every
    /// reduce and the final book; ends with `N passed, M failed`.
    ExchangeCore {
        /// The flow folder (commands.csv.gz, events.csv.gz, final-book.csv).
        dir: Option<PathBuf>,
        /// The same, as an option; defaults to ../shared/workloads/exchange-core-singlepair.
        #[arg(long, conflicts_with = "dir")]
        flow: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum JournalAction {
    /// Check every record and snapshot; report each problem with its place.
    Verify {
        dir: PathBuf,
        /// Also replay every command from the start and compare each
        /// snapshot's state with the journal's at its command.
        #[arg(long)]
        replay: bool,
    },
    /// Print the journal's commands in the command-file text format.
    Inspect { dir: PathBuf },
    /// Rebuild the state and write a snapshot of it now (a running
    /// `crossbook serve` takes one on SIGUSR1 instead).
    Snapshot {
        dir: PathBuf,
        /// Snapshots to keep.
        #[arg(long, default_value_t = 2)]
        keep: usize,
    },
}

/// A command line that parses but asks for something impossible (`--side
/// up`, `--budget 0`): reported like any error, but the exit status is 2,
/// as for what clap itself cannot read, so a script can tell a mistyped
/// command from a refusal by the server (1).
#[derive(Debug)]
pub(crate) struct Usage(pub(crate) String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// Returns a [`Usage`] error: `usage!("--flag must be ...")`.
/// `crossbook load --window`, at most: far past a session's `in_flight`
/// (1,024 by default), which is all the server takes from it at a time.
const MAX_WINDOW: u64 = 65_536;

/// `crossbook bench --commands`, at most (some 100 bytes each in memory,
/// with their events).
const MAX_BENCH_COMMANDS: usize = 100_000_000;

macro_rules! usage {
    ($($arg:tt)*) => {
        return Err(anyhow::Error::new($crate::Usage(format!($($arg)*))))
    };
}
pub(crate) use usage;

/// A number of seconds from the command line as a duration: refused
/// (never a panic) if it is negative, not a number or past a year.
fn seconds(flag: &str, value: f64) -> Result<Duration> {
    if !(0.0..=31_536_000.0).contains(&value) {
        usage!("{flag} must be a number of seconds from 0 to 31536000 (a year), not {value}");
    }
    Ok(Duration::from_secs_f64(value))
}

/// An address as `host:port` (a name or an IP address, then a port
/// number): anything else is a command line that cannot work, not a
/// server that did not answer.
fn host_and_port(flag: &str, text: String) -> Result<String> {
    host_and_port_like(flag, text, None)
}

/// [`host_and_port`], with the example the message gives (the port the
/// flag's default has).
fn host_and_port_like(flag: &str, text: String, example: Option<&str>) -> Result<String> {
    match text.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok_and(|port| port > 0) => Ok(text),
        _ => usage!("{flag} must be host:port ({}, say), not {text:?}", example.unwrap_or("127.0.0.1:7700")),
    }
}

/// A time that must not be zero (a wait that could never succeed, a run
/// with no time to measure): a millisecond at least, which a socket's
/// time-out can be (1e-12 is not zero, but no time-out can be that short).
fn positive_seconds(flag: &str, value: f64) -> Result<Duration> {
    if !(0.001..=31_536_000.0).contains(&value) {
        usage!("{flag} must be a number of seconds from 0.001 to 31536000 (a year), not {value}");
    }
    seconds(flag, value)
}

fn main() {
    // A tool whose output goes to a pipe that closed (`crossbook load |
    // head`) ends quietly, as a Unix tool does, instead of panicking on
    // its next line; the server keeps Rust's default (a log reader that
    // goes away must not stop the venue: its lines are dropped).
    let server = std::env::args_os().nth(1).is_some_and(|first| first == "serve" || first == "follow");
    if !server {
        // SAFETY: at the start of main, before any thread: only this
        // process's disposition of SIGPIPE changes.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    if let Err(error) = real_main() {
        use std::io::Write;
        let _ = writeln!(std::io::stderr().lock(), "crossbook: {error:#}");
        std::process::exit(if error.downcast_ref::<Usage>().is_some() { 2 } else { 1 });
    }
}

fn real_main() -> Result<()> {
    match Cli::parse().command {
        Cmd::Gen { workload, seed, commands } => gen_command(&workload, seed, commands),
        Cmd::Run { commands, check, journal: None, .. } => run_command(&commands, check),
        Cmd::Run { commands, journal: Some(dir), durability, snapshot_every, segment_bytes, keep_snapshots, .. } => {
            let durability = match durability.as_str() {
                "sync" => Durability::Sync,
                "async" => Durability::Async { interval: Duration::from_millis(10) },
                other => usage!("--durability must be sync or async, not {other:?}"),
            };
            let (least, most) = (crossbook_server::config::MIN_SEGMENT_BYTES, crossbook_server::config::MAX_SEGMENT_BYTES);
            if !(least..=most).contains(&segment_bytes) {
                usage!("--segment-bytes must be {least} to {most}, not {segment_bytes}");
            }
            let config = JournalConfig { durability, segment_bytes, ..JournalConfig::default() };
            journaled::run(&commands, &dir, config, snapshot_every, keep_snapshots)
        }
        Cmd::Recover { journal } => journaled::recover(&journal),
        Cmd::Serve { config, listen, data, fix_listen, market_listen } => serve(config, listen, data, fix_listen, market_listen, |_| Ok(())),
        Cmd::Follow { config, listen, data, market_listen, fix_listen, node, standby } => serve(Some(config), listen, data, fix_listen, market_listen, move |config| {
            let Some(replication) = config.replication.as_mut() else { bail!("crossbook follow needs a [replication] section in the configuration") };
            if let Some(node) = &node {
                replication.node = node.clone();
            }
            replication.candidate = standby;
            Ok(())
        }),
        Cmd::Watch { address, streams, connections, duration, depth_clients, depth_symbol, json } => crossbook_load::watch::run(crossbook_load::watch::WatchOptions {
            address: host_and_port_like("--address", address, Some("127.0.0.1:7702"))?,
            streams: match streams.split(',').filter(|s| !s.is_empty()).map(str::to_string).collect::<Vec<_>>() {
                none if none.is_empty() && connections > 0 => usage!("--streams names no stream (a comma-separated list, as btcusd@depth,btcusd@trade)"),
                streams => streams,
            },
            connections: match (connections, depth_clients) {
                (0, 0) => usage!("--connections and --depth-clients are both 0: nothing to watch"),
                // A thread each.
                (connections, _) if connections > crossbook_load::watch::MAX_CONNECTIONS => {
                    usage!("--connections must be 0 to {}, not {connections}", crossbook_load::watch::MAX_CONNECTIONS)
                }
                (_, clients) if clients > crossbook_load::watch::MAX_DEPTH_CLIENTS => {
                    usage!("--depth-clients must be 0 to {}, not {clients}", crossbook_load::watch::MAX_DEPTH_CLIENTS)
                }
                (connections, _) => connections,
            },
            duration: positive_seconds("--duration", duration)?,
            depth_clients,
            depth_symbol,
            json,
        }),
        Cmd::Load { address, protocol, workload, count, connections, first_account, duration, rate, window, json, acked_out, last_seen_out } => crossbook_load::run(crossbook_load::Options {
            first_account,
            protocol: match protocol.as_str() {
                "binary" => crossbook_load::Protocol::Binary,
                "fix" => crossbook_load::Protocol::Fix,
                "rest" => crossbook_load::Protocol::Rest,
                "ws-api" => crossbook_load::Protocol::WsApi,
                other => usage!("--protocol must be binary, fix, rest or ws-api, not {other:?}"),
            },
            count: {
                if !crossbook_load::WORKLOADS.contains(&workload.as_str()) {
                    usage!("unknown load workload {workload:?}; known: {}", crossbook_load::WORKLOADS.join(", "));
                }
                if count == Some(0) {
                    usage!("--count must be at least 1 (orders to send; without it, as many as --duration allows)");
                }
                if connections == 0 {
                    usage!("--connections must be at least 1");
                }
                if first_account == 0 {
                    usage!("--first-account must be at least 1 (account 0 is the venue's fee account)");
                }
                let accounts = crossbook_server::config::DEMO_ACCOUNTS;
                if first_account.saturating_add(connections - 1) > accounts {
                    usage!("--first-account plus --connections must stay within accounts 1 to {accounts} (one account each): --connections must be 1 to {}, not {connections}", (accounts + 1).saturating_sub(first_account));
                }
                count
            },
            address: {
                let default = match protocol.as_str() {
                    "fix" => "127.0.0.1:7701",
                    "rest" | "ws-api" => "127.0.0.1:7702",
                    _ => "127.0.0.1:7700",
                };
                host_and_port_like("--address", address.unwrap_or_else(|| default.into()), Some(default))?
            },
            connections,
            keys: (1..=crossbook_server::config::DEMO_ACCOUNTS).map(crossbook_server::config::demo_key).collect(),
            secrets: (1..=crossbook_server::config::DEMO_ACCOUNTS).map(crossbook_server::config::demo_secret).collect(),
            duration: positive_seconds("--duration", duration)?,
            rate: match rate {
                Some(rate) if !(0.001..=1e9).contains(&rate) => usage!("--rate must be from 0.001 to 1000000000 orders per second, not {rate}"),
                rate => rate,
            },
            window: match window {
                1..=MAX_WINDOW => window,
                _ => usage!("--window must be 1 to {MAX_WINDOW} (orders each session keeps outstanding), not {window}"),
            },
            json,
            acked_out,
            last_seen_out,
        }),
        Cmd::Order { address, account, key, last_seen, timeout, linger, action } => order::run(order::Options {
            address: host_and_port("--address", address)?,
            account,
            key: match key {
                // The Login's key field is 32 bytes: a longer key would be
                // cut, and its first 32 bytes could be someone's key.
                Some(key) if key.is_empty() || key.len() > crossbook_protocol::API_KEY_BYTES => usage!("--key must be 1 to {} bytes, not {}", crossbook_protocol::API_KEY_BYTES, key.len()),
                Some(key) => key,
                None => crossbook_server::config::demo_key(account),
            },
            last_seen: last_seen.unwrap_or(u64::MAX),
            timeout: positive_seconds("--timeout", timeout)?,
            linger: seconds("--linger", linger)?,
            action: order_action(action)?,
        }),
        Cmd::Compat { engine: CompatEngine::ExchangeCore { dir, flow } } => compat::run(&crossbook_compat::flow_dir(dir.or(flow))?),
        Cmd::Journal { action: JournalAction::Verify { dir, replay } } => journaled::verify(&dir, replay),
        Cmd::Journal { action: JournalAction::Inspect { dir } } => journaled::inspect(&dir),
        Cmd::Journal { action: JournalAction::Snapshot { dir, keep } } => journaled::snapshot(&dir, keep),
        Cmd::Bench { workload: name, commands, seed, no_latency, journal, format, compare, threshold, slow_ns, flow, passes } => {
            let json = match format.as_str() {
                "text" => false,
                "json" => true,
                other => usage!("--format must be text or json, not {other:?}"),
            };
            if let Some(commands) = commands
                && !(1..=MAX_BENCH_COMMANDS).contains(&commands)
            {
                usage!("--commands must be 1 to {MAX_BENCH_COMMANDS} (the bench holds them all in memory), not {commands}");
            }
            if passes == 0 {
                usage!("--passes must be at least 1");
            }
            if flow.is_some() && name != bench::EXCHANGE_CORE_SINGLE {
                usage!("--flow is for --workload {}, not {name}", bench::EXCHANGE_CORE_SINGLE);
            }
            if !(threshold.is_finite() && threshold >= 0.0) {
                usage!("--threshold must be a percentage of 0 or more, not {threshold}");
            }
            if let Some(why) = bench::WorkloadSource::unknown(&name) {
                usage!("{why}");
            }
            bench::run(bench::Options {
                workload: bench::WorkloadSource::parse(&name, flow)?,
                commands,
                seed,
                latency: !no_latency,
                journal,
                json,
                compare,
                threshold_percent: threshold,
                slow_ns,
                passes,
            })
        }
    }
}

fn order_action(action: OrderAction) -> Result<order::Action> {
    Ok(match action {
        OrderAction::Place { side, qty, price, instrument, order_type, tif, post_only, stp, budget, cid } => {
            let order_type = order::parse_type(&order_type)?;
            let price = match (order_type, price) {
                (crossbook_engine::OrderType::Limit, None) => usage!("a limit order needs --price"),
                (crossbook_engine::OrderType::Market, Some(_)) => usage!("a market order has no --price (--budget caps what a market buy spends)"),
                (_, price) => price.unwrap_or(0),
            };
            if instrument == 0 {
                usage!("--instrument must be at least 1 (instrument ids start at 1)");
            }
            // On the wire 0 is "no budget": a budget of 0 typed here would
            // become none.
            if budget == Some(0) {
                usage!("--budget must be at least 1 (leave it out for no budget)");
            }
            let tif = match (&tif, order_type) {
                (Some(tif), _) => order::parse_tif(tif)?,
                (None, crossbook_engine::OrderType::Market) => crossbook_engine::TimeInForce::Ioc,
                (None, _) => crossbook_engine::TimeInForce::Gtc,
            };
            order::Action::Place(crossbook_protocol::NewOrder {
                cid: cid.unwrap_or_else(order::fresh_cid),
                instrument,
                side: order::parse_side(&side)?,
                order_type,
                tif,
                post_only,
                stp: order::parse_stp(&stp)?,
                price,
                qty,
                budget,
            })
        }
        OrderAction::Cancel { order } => order::Action::Cancel { order },
        OrderAction::Replace { order, price, qty } => order::Action::Replace { order, price, qty },
        OrderAction::CancelAll { instrument } => order::Action::CancelAll { instrument },
        OrderAction::Balances => order::Action::Balances,
        OrderAction::OpenOrders { instrument } => order::Action::OpenOrders { instrument },
        OrderAction::Watch { duration } => order::Action::Watch { duration: duration.map(|d| seconds("--duration", d)).transpose()? },
    })
}

fn serve(
    config: Option<PathBuf>,
    listen: Option<String>,
    data: Option<PathBuf>,
    fix_listen: Option<String>,
    market_listen: Option<String>,
    adjust: impl Fn(&mut crossbook_server::config::Config) -> Result<()> + Send + Sync + 'static,
) -> Result<()> {
    // The file (or the built-in configuration) with the command line's
    // overrides: read at start, and again on SIGHUP.
    let has_file = config.is_some();
    let path = config;
    let load = move || -> Result<crossbook_server::config::Config> {
        let mut config = match &path {
            Some(path) => {
                let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
                crossbook_server::config::Config::from_toml(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
            }
            None => crossbook_server::config::Config::default(),
        };
        if let Some(listen) = &listen {
            config.listen = listen.clone();
        }
        if let Some(data) = &data {
            config.data_dir = data.clone();
        }
        if let Some(fix_listen) = &fix_listen {
            config.fix.listen = fix_listen.clone();
        }
        if let Some(market_listen) = &market_listen {
            config.market_data.listen = market_listen.clone();
        }
        adjust(&mut config)?;
        Ok(config)
    };
    let mut config = load()?;
    let load = std::sync::Arc::new(load);
    let reread: Option<std::sync::Arc<crossbook_server::Reread>> = has_file.then(|| {
        let load = load.clone();
        std::sync::Arc::new(move || load().map_err(|e| format!("{e:#}"))) as std::sync::Arc<crossbook_server::Reread>
    });
    let shutdown = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, shutdown.clone()).context("installing the signal handler")?;
    }
    // SIGUSR1: take a snapshot now.
    let snapshot = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGUSR1, snapshot.clone()).context("installing the signal handler")?;
    // SIGHUP: read the configuration again (its new assets, instruments and
    // accounts, its keys: docs/ARCHITECTURE.md).
    let reload = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGHUP, reload.clone()).context("installing the signal handler")?;
    // A replicated node that loses the lead stops acknowledging at once
    // and starts again as a follower (its journal is checked against the
    // log first); anything else ends the process.
    // Such a restart comes while NATS may still be electing (a quorum just
    // back): a replication error then is tried again, for up to
    // `connect_timeout_s`, rather than ending the node.
    // A first start is such a start too: NATS may be electing the
    // stream's leader as it reads the log (JetStream's 503, "temporarily
    // unavailable").
    let mut restarting_since: Option<std::time::Instant> = config.replication.as_ref().map(|_| std::time::Instant::now());
    let patience = std::time::Duration::from_secs(config.replication.as_ref().map_or(0, |r| r.connect_timeout_s));
    // The data directory is held from here to the end, across restarts
    // as a follower: no other process can take it in between.
    let mut lock: Option<(PathBuf, std::sync::Arc<crossbook_journal::DirLock>)> = None;
    loop {
        if lock.as_ref().is_none_or(|(dir, _)| *dir != config.data_dir) {
            // A configuration that cannot be served is refused before the
            // directory is made (as `serve` would, first thing).
            config.check().and_then(|()| config.check_addresses()).map_err(crossbook_server::ServeError::from)?;
            // A reload that moved the data directory lets the old one go
            // (first: the new path may name the same directory).
            drop(lock.take());
            let held = crossbook_journal::lock_dir(&config.data_dir).map_err(crossbook_server::ServeError::from)?;
            lock = Some((config.data_dir.clone(), std::sync::Arc::new(held)));
        }
        let controls = crossbook_server::Controls {
            shutdown: shutdown.clone(),
            snapshot: snapshot.clone(),
            reload: reload.clone(),
            reread: reread.clone(),
            lock: lock.as_ref().map(|(_, held)| held.clone()),
        };
        match crossbook_server::serve(config.clone(), controls, |_| {}) {
            Err(crossbook_server::ServeError::Deposed(why)) if !shutdown.load(std::sync::atomic::Ordering::Acquire) => {
                crossbook_server::log(&format!("no longer the leader ({why}): starting again as a follower"));
                restarting_since = Some(std::time::Instant::now());
                // With the file as it is now (a reload may have changed it).
                match load() {
                    Ok(now) => config = now,
                    Err(e) => crossbook_server::log(&format!("the configuration as it is now does not read ({e:#}): starting again with the one read before")),
                }
            }
            Err(e)
                if e.is_nats_unavailable()
                    && restarting_since.is_some_and(|since| since.elapsed() < patience) && !shutdown.load(std::sync::atomic::Ordering::Acquire) =>
            {
                crossbook_server::log(&format!("replication: {e}; starting again in 500 ms (for up to connect_timeout_s from the first try)"));
                std::thread::sleep(std::time::Duration::from_millis(500));
            }
            Err(e) => return Err(e.into()),
            Ok(summary) => {
                crossbook_server::log(&format!("served {} commands; journal synced at seq {}", summary.commands, summary.seq));
                return Ok(());
            }
        }
    }
}

fn workload(name: &str) -> Result<Workload> {
    match Workload::from_name(name) {
        Some(workload) => Ok(workload),
        None => {
            let known: Vec<&str> = Workload::ALL.iter().map(|w| w.name()).collect();
            usage!("unknown workload {name:?}; known: {}", known.join(", "))
        }
    }
}

fn gen_command(name: &str, seed: u64, count: usize) -> Result<()> {
    // Written as they are made (the same commands `generate` gives): any
    // count streams in constant memory.
    let mut generator = crossbook_workload::generator(workload(name)?, seed);
    let mut engine = crossbook_engine::Engine::new();
    let mut events = Vec::new();
    let stdout = std::io::stdout();
    let mut out = BufWriter::with_capacity(1 << 16, stdout.lock());
    let mut line = String::new();
    writeln!(out, "# crossbook gen --workload {name} --seed {seed} --commands {count}")?;
    for _ in 0..count {
        let command = generator.next(&engine);
        events.clear();
        engine.apply(&command, &mut events);
        let command = &command;
        line.clear();
        crossbook_text::write_command(&mut line, command);
        line.push('\n');
        out.write_all(line.as_bytes())?;
    }
    out.flush()?;
    Ok(())
}

pub(crate) fn read_commands(path: &PathBuf) -> Result<Vec<Command>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let text = match std::str::from_utf8(&bytes) {
        Ok(text) => text,
        Err(e) => {
            // The first bad line is named: a syntax error on a line before
            // the one that is not UTF-8 comes first.
            let line_start = bytes[..e.valid_up_to()].iter().rposition(|b| *b == b'\n').map_or(0, |at| at + 1);
            if let Ok(before) = std::str::from_utf8(&bytes[..line_start]) {
                crossbook_text::parse_commands(before).with_context(|| format!("{}", path.display()))?;
            }
            let line = 1 + bytes[..line_start].iter().filter(|b| **b == b'\n').count();
            anyhow::bail!("{}: line {line}: not UTF-8", path.display());
        }
    };
    crossbook_text::parse_commands(text).with_context(|| format!("{}", path.display()))
}

fn run_command(path: &PathBuf, check: bool) -> Result<()> {
    let commands = read_commands(path)?;
    let mut engine = Engine::new();
    let mut events: Vec<Event> = Vec::new();
    let mut buffer: Vec<u8> = Vec::with_capacity(1 << 16);
    let mut digest = Sha256::new();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut event_count = 0u64;
    let mut balance_lines = crossbook_engine::BalanceLines::new();
    for command in &commands {
        events.clear();
        engine.apply(command, &mut events);
        balance_lines.append(&engine, &mut events);
        if check
            && let Err(broken) = engine.check_invariants() {
                bail!("invariant broken after command {}: {broken}", engine.seq());
            }
        for event in &events {
            crossbook_text::write_event(&mut buffer, event);
        }
        event_count += events.len() as u64;
        if buffer.len() >= 1 << 16 {
            digest.update(&buffer);
            out.write_all(&buffer)?;
            buffer.clear();
        }
    }
    digest.update(&buffer);
    out.write_all(&buffer)?;
    out.flush()?;
    let hash = digest.finalize();
    eprintln!("commands {} events {event_count}", commands.len());
    eprintln!("events-sha256 {}", hex(&hash));
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}


