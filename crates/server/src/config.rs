//! `crossbook.toml`: what `crossbook serve` runs with. Every field has a
//! default, so `crossbook serve` with no file starts a working demo venue.

use crossbook_engine::*;
use serde::Deserialize;
use std::path::PathBuf;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Address to listen on for the binary protocol.
    pub listen: String,
    /// Journal and snapshots.
    pub data_dir: PathBuf,
    /// `sync` or `async` (docs/journal.md).
    pub durability: String,
    /// Snapshot every this many commands (0: only at shutdown).
    pub snapshot_every: u64,
    /// A restart rebuilds, for replay to sessions that reconnect, the
    /// reports of at least this many of the last commands (up to twice as
    /// many, and the last 100,000 per account at most): it starts from a
    /// snapshot that far back, so a restart's cost does not grow with the
    /// journal (docs/protocol.md, docs/ARCHITECTURE.md).
    pub history_commands: u64,
    /// A new journal segment starts once the current one reaches this many
    /// bytes (docs/journal.md).
    pub segment_bytes: u64,
    pub limits: Limits,
    pub fix: FixConfig,
    pub market_data: MarketDataConfig,
    /// A replicated venue (`docs/replication.md`); absent: one machine.
    pub replication: Option<ReplicationConfig>,
    /// The demo venue's assets, instruments and accounts (with their
    /// published keys) for each of the three lists a file leaves out.
    /// Without it a file's lists are what it lists: an empty or cut-short
    /// file (read on SIGHUP as it is being written) never opens accounts
    /// anyone can log in to. `crossbook serve` without a file: true.
    #[serde(default)]
    pub demo: bool,
    #[serde(default)]
    pub assets: Vec<AssetConfig>,
    #[serde(default)]
    pub instruments: Vec<InstrumentConfig>,
    #[serde(default)]
    pub accounts: Vec<AccountConfig>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Logged-in sessions per port (binary, FIX); a login past it is
    /// refused (`server_busy`).
    pub max_connections: usize,
    /// Connections per port that have not logged in yet. A new connection
    /// past it closes the oldest of them (`server_busy`), so that idle
    /// connections can never keep a trader out.
    pub max_unauthenticated: usize,
    /// Seconds a connection has to log in (binary: Login accepted; FIX:
    /// Logon) before it is closed (`login_timeout`).
    pub login_timeout_s: u64,
    /// Largest frame accepted (bytes after the length field).
    pub max_frame: usize,
    /// Batches of commands (one per socket read) the FIX readers may have
    /// waiting for the sequencer before they stop reading. Binary-protocol
    /// commands need no queue: the sequencer runs on the gateway's thread.
    pub queue: usize,
    /// Commands one session may have in flight (sent, not yet answered)
    /// before its connection stops being read.
    pub in_flight: u32,
    /// Open orders one account may have; more are refused before they
    /// reach the engine.
    pub open_orders: usize,
}

/// The FIX 4.4 gateway (docs/fix.md).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FixConfig {
    /// Address of the FIX acceptor; empty: no FIX gateway.
    pub listen: String,
    /// Our SenderCompID.
    pub comp_id: String,
    /// `venue` (orders go to the engine) or `echo` (application messages
    /// are sent back, for the FIX acceptance scripts).
    pub application: String,
    /// A QuickFIX-style XML data dictionary; empty: the built-in one.
    pub dictionary: String,
    /// Every Logon starts both sequence numbers at 1.
    pub reset_on_logon: bool,
    /// Largest accepted difference between SendingTime and our clock.
    pub max_latency_s: u64,
    /// Largest message accepted (bytes); a longer one costs the session.
    pub max_message: usize,
    /// Counterparties known by CompID, each bound to an account (others
    /// log on with Username 553 = account id and Password 554 = API key).
    pub sessions: Vec<FixSessionConfig>,
}

/// Market data over HTTP and WebSocket, and the dashboard
/// (`docs/marketdata.md`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MarketDataConfig {
    /// Address of the HTTP and WebSocket server; empty: none.
    pub listen: String,
    /// WebSocket connections at once; one more is refused (HTTP 503).
    pub max_connections: usize,
    /// WebSocket connections at once from one client address; one more is
    /// refused (HTTP 429).
    pub max_connections_per_address: usize,
    /// Streams one WebSocket connection may subscribe to.
    pub max_streams: usize,
    /// Messages waiting to be sent to one WebSocket connection; a client
    /// that falls this far behind is disconnected (`slow consumer`).
    pub queue: usize,
    /// Largest WebSocket message a client may send (bytes).
    pub max_message: usize,
    /// Messages a WebSocket client may send per second; more closes it.
    pub max_messages_per_s: u32,
    /// Seconds between the server's pings; a connection that has sent
    /// nothing (not even a pong) for three of them is closed.
    pub ping_interval_s: u64,
    /// HTTP connections at once (not counting those upgraded to
    /// WebSocket, which `max_connections` bounds); one more is closed as
    /// soon as it is accepted.
    pub max_http_connections: usize,
    /// HTTP connections at once from one client address; one more is
    /// closed as soon as it is accepted.
    pub max_http_connections_per_address: usize,
    /// Seconds an HTTP connection has to send a request's whole header,
    /// from its opening or its previous answer; then it is closed (an
    /// idle keep-alive connection too).
    pub header_timeout_s: u64,
    /// Binance's signed trading endpoints and user data streams on the same
    /// port (`docs/trading.md`); false: market data only.
    pub trading: bool,
    /// Request weight one API key may use per minute (Binance's
    /// REQUEST_WEIGHT limit); past it: HTTP 429, `Retry-After`.
    pub max_weight_per_minute: u32,
    /// New orders one account may place over REST per 10 seconds (Binance's
    /// ORDERS limit); past it: HTTP 429, code -1015.
    pub max_orders_per_10s: u32,
    /// Largest request body (bytes); a longer one is refused (HTTP 413).
    pub max_body: usize,
    /// Milliseconds an order request waits for the engine's answer (its
    /// durable result) before it is answered "status unknown" (-1007).
    pub answer_timeout_ms: u64,
    /// The market-data thread's nice value (0 to 19, Linux): above 0, the
    /// sequencer and the gateways go first where cores are short, and the
    /// feeds and the REST answers wait their turn.
    pub nice: i32,
    /// Microseconds between two sends of the real-time streams (`@depth`,
    /// `@trade`, ...) at most: what comes within them goes out together
    /// when they are up (0: every batch as it comes; at most 1,000,000).
    pub send_interval_us: u64,
    /// Ended orders and trades each account keeps for the signed
    /// endpoints (`allOrders`, `myTrades`, `GET /api/v3/order`): 1 to
    /// 1,000,000 each. Every node of a replicated venue must keep the
    /// same.
    pub orders_kept: usize,
    pub trades_kept: usize,
    /// The operator's endpoints (deposits, withdrawals, balances:
    /// `docs/trading.md`): a request must carry `Authorization: Bearer
    /// <admin_token>`; empty: the endpoints are off. At least
    /// [`MIN_ADMIN_TOKEN`] characters.
    pub admin_token: String,
}

/// The shortest `admin_token` accepted.
pub const MIN_ADMIN_TOKEN: usize = 16;

impl Default for MarketDataConfig {
    fn default() -> Self {
        MarketDataConfig {
            listen: "127.0.0.1:7702".into(),
            max_connections: 1024,
            max_connections_per_address: 256,
            max_streams: 1024,
            queue: 4096,
            max_message: 4096,
            max_messages_per_s: 10,
            ping_interval_s: 20,
            max_http_connections: 1024,
            max_http_connections_per_address: 256,
            header_timeout_s: 30,
            trading: true,
            max_weight_per_minute: 6000,
            max_orders_per_10s: 1000,
            max_body: 8192,
            answer_timeout_ms: 10_000,
            nice: 0,
            send_interval_us: 0,
            orders_kept: crossbook_marketdata::accounts::ORDERS_KEPT,
            trades_kept: crossbook_marketdata::accounts::TRADES_KEPT_PER_ACCOUNT,
            admin_token: String::new(),
        }
    }
}

/// Replication over NATS JetStream (`docs/replication.md`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReplicationConfig {
    /// NATS servers, any of the cluster (`nats://host:port`).
    pub nats: Vec<String>,
    /// The JetStream stream of the command log (its lease bucket is
    /// `<stream>_LEASE`).
    pub stream: String,
    /// Copies of the log and of the lease (3 in a 3-node cluster).
    pub replicas: usize,
    /// This node's name: unique among the venue's nodes.
    pub node: String,
    /// Milliseconds the leader's lease lives without a renewal; the leader
    /// renews it three times as often. A dead leader's lease runs out this
    /// long after its last renewal, and a standby takes over.
    pub lease_ttl_ms: u64,
    /// Whether this node may lead (take the lease when nobody holds it and
    /// it has applied the whole log); `crossbook follow` sets it from
    /// `--standby`.
    pub candidate: bool,
    /// Where clients reach this node's binary port and HTTP port, as the
    /// lease tells other nodes' clients (empty: the listening addresses).
    pub advertise_binary: String,
    pub advertise_rest: String,
    /// Seconds to keep trying to reach NATS at start.
    pub connect_timeout_s: u64,
}

impl Default for ReplicationConfig {
    fn default() -> Self {
        ReplicationConfig {
            nats: vec!["nats://127.0.0.1:4222".into()],
            stream: "CROSSBOOK".into(),
            replicas: 3,
            node: "node-1".into(),
            lease_ttl_ms: 3000,
            candidate: true,
            advertise_binary: String::new(),
            advertise_rest: String::new(),
            connect_timeout_s: 30,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FixSessionConfig {
    /// The counterparty's SenderCompID.
    pub comp_id: String,
    pub account: u64,
}

impl Default for FixConfig {
    fn default() -> Self {
        FixConfig {
            listen: "127.0.0.1:7701".into(),
            comp_id: "CROSSBOOK".into(),
            application: "venue".into(),
            dictionary: String::new(),
            reset_on_logon: false,
            max_latency_s: 120,
            max_message: 65_536,
            sessions: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AssetConfig {
    pub id: u32,
    pub name: String,
    /// The REST API shows amounts of this asset (balances, fees) as
    /// `amount * 10^-decimals`.
    #[serde(default)]
    pub decimals: u32,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstrumentConfig {
    pub id: u32,
    pub symbol: String,
    pub base: u32,
    pub quote: u32,
    pub tick_size: u64,
    pub lot_size: u64,
    pub min_qty: u64,
    pub max_qty: u64,
    pub min_price: i64,
    pub max_price: i64,
    pub maker_bps: i64,
    pub taker_bps: i64,
    /// FIX: the decimal price of one tick (prices on FIX are decimals,
    /// converted exactly: a price that is not a whole number of ticks is
    /// refused).
    #[serde(default = "one")]
    pub fix_price_unit: String,
    /// FIX: the decimal quantity of one lot.
    #[serde(default = "one")]
    pub fix_qty_unit: String,
}

fn one() -> String {
    "1".into()
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccountConfig {
    pub id: u64,
    /// Up to 32 bytes; compared in constant time. Also the REST API's
    /// `X-MBX-APIKEY`.
    pub api_key: String,
    /// The REST API's signing secret (HMAC-SHA256); empty: this account
    /// cannot use the signed REST endpoints.
    #[serde(default)]
    pub api_secret: String,
    /// What the binary protocol's Login and FIX's Password (554) carry
    /// for this account, if not its `api_key` (which REST clients send in
    /// every request's header, where proxies and logs see it); up to 32
    /// bytes. Empty: the `api_key` logs in.
    #[serde(default)]
    pub login_key: String,
    /// Starting balances for a fresh venue: (asset id, amount).
    #[serde(default, deserialize_with = "deposits")]
    pub deposits: Vec<(u32, u64)>,
    /// When a binary or FIX session of the account ends other than by the
    /// venue stopping (a Logout, a lost connection, a protocol error), a
    /// CancelAll of its open orders is journaled for it.
    #[serde(default)]
    pub cancel_on_disconnect: bool,
}

/// Demo accounts in the default configuration (ids 1 to 16).
pub const DEMO_ACCOUNTS: u64 = 16;

/// `nats://host:port` (or `tls://`, or `host:port` alone): what the NATS
/// client takes, checked before it is given the time to try.
fn nats_url(url: &str) -> bool {
    let rest = ["nats://", "tls://"].iter().find_map(|scheme| url.strip_prefix(scheme)).unwrap_or(url);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    match rest.rsplit_once(':') {
        Some((host, port)) => !host.is_empty() && !host.contains('/') && port.parse::<u16>().is_ok(),
        None => !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-'),
    }
}

/// `deposits = [[asset, amount], ...]`, each exactly two numbers (a
/// tuple would take `[1, 2, 3]` as `[1, 2]` and drop the rest unsaid).
fn deposits<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Vec<(u32, u64)>, D::Error> {
    let pairs: Vec<Vec<u64>> = Deserialize::deserialize(deserializer)?;
    pairs
        .into_iter()
        .map(|pair| match pair[..] {
            [asset, amount] => u32::try_from(asset).map(|asset| (asset, amount)).map_err(|_| serde::de::Error::custom(format!("asset id {asset} is past 4294967295"))),
            _ => Err(serde::de::Error::custom(format!("a deposit is [asset id, amount], two numbers, not {pair:?}"))),
        })
        .collect()
}

/// The API key of demo account `id`.
pub fn demo_key(id: u64) -> String {
    format!("demo-key-{id}")
}

/// The REST signing secret of demo account `id`.
pub fn demo_secret(id: u64) -> String {
    format!("demo-secret-{id}")
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 64,
            max_unauthenticated: 16,
            login_timeout_s: 5,
            max_frame: crossbook_protocol::MAX_FRAME,
            queue: 4096,
            in_flight: 1024,
            open_orders: 100_000,
        }
    }
}

impl Default for Config {
    /// A demo venue: BTC and USD, BTC-USD, 16 traders.
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:7700".into(),
            data_dir: PathBuf::from("data"),
            durability: "sync".into(),
            snapshot_every: 100_000,
            history_commands: 1_000_000,
            segment_bytes: 64 << 20,
            limits: Limits::default(),
            fix: FixConfig::default(),
            market_data: MarketDataConfig::default(),
            replication: None,
            // The lists below are the demo venue's already.
            demo: false,
            assets: vec![AssetConfig { id: 1, name: "BTC".into(), decimals: 0 }, AssetConfig { id: 2, name: "USD".into(), decimals: 0 }],
            instruments: vec![InstrumentConfig {
                id: 1,
                symbol: "BTC-USD".into(),
                base: 1,
                quote: 2,
                tick_size: 1,
                lot_size: 1,
                min_qty: 1,
                max_qty: 1_000_000,
                min_price: 1,
                max_price: 10_000_000,
                maker_bps: -1,
                taker_bps: 5,
                fix_price_unit: one(),
                fix_qty_unit: one(),
            }],
            // 16 demo traders, enough for `crossbook load --connections 16`.
            accounts: (1..=DEMO_ACCOUNTS)
                .map(|id| AccountConfig { id, api_key: demo_key(id), api_secret: demo_secret(id), login_key: String::new(), deposits: vec![(1, 1 << 40), (2, 1 << 50)], cancel_on_disconnect: false })
                .collect(),
        }
    }
}

/// Why a configuration cannot be served.
#[derive(Debug)]
pub enum ConfigError {
    /// Not TOML, or not the shape of `crossbook.toml` (the message names
    /// the key and line).
    Parse(toml::de::Error),
    /// An asset name or instrument symbol the engine cannot take.
    BadName { what: &'static str, name: String },
    /// An account's API key is empty or longer than the wire's 32 bytes.
    BadApiKey { account: AccountId },
    /// An account's `login_key` is not 1 to 32 visible ASCII characters.
    BadLoginKey { account: AccountId },
    /// `durability` is neither `sync` nor `async`.
    BadDurability(String),
    /// `fix.application` is neither `venue` nor `echo`.
    BadFixApplication(String),
    /// An instrument's `fix_price_unit` or `fix_qty_unit` is not a
    /// positive decimal.
    BadFixUnit { symbol: String, what: &'static str, value: String },
    /// Two instruments' symbols are written the same way by Binance
    /// (letters and digits only: `BTC-USD` and `BTC_USD` are both
    /// `BTCUSD`), so market data could not tell them apart.
    SymbolClash { symbol: String, binance: String },
    /// Two assets' names are the same in another case: the REST API takes
    /// an asset's name in any case.
    AssetClash { name: String, other: String },
    /// An address that does not parse.
    BadAddress { key: &'static str, value: String },
    /// Two accounts have the same API key (a REST request names its
    /// account by its key alone).
    SharedApiKey { first: AccountId, second: AccountId },
    /// An `[[accounts]]` entry for account 0, the venue's fee account (it
    /// is opened with the venue, holds the fees, and places no orders).
    FeeAccount,
    /// Two assets, instruments or accounts with one id (on a venue that
    /// has run, the second would be read as the first).
    DuplicateId { what: &'static str, id: u64 },
    /// A set-up command the engine refuses (an instrument's fees or
    /// limits, a deposit in an unknown asset, ...): nothing is started.
    Refused { what: String, reason: &'static str },
    /// What the configuration defines for a venue that has run does not
    /// fit its journal (`sequencer::lacking`).
    NotTheVenues(String),
    /// A setting replication cannot work with.
    BadReplication(String),
    /// `market_data.nice` outside 0 to 19.
    BadNice(i32),
    /// `market_data.admin_token` set but shorter than [`MIN_ADMIN_TOKEN`],
    /// or with a character an HTTP header cannot carry as it is.
    BadAdminToken(String),
    /// `market_data.admin_token` set with `market_data.trading = false`:
    /// the operator's endpoints are the trading API's.
    AdminWithoutTrading,
    /// A `[[fix.sessions]]` entry that cannot be served: a CompID bound
    /// twice, the venue's own, empty, or bound to an account the file
    /// does not have; or an empty `fix.comp_id`.
    BadFixSession(String),
    /// A number outside what it can be (`market_data.orders_kept` 1 to
    /// 1,000,000, `market_data.ping_interval_s` 1 to 3,600, ...).
    OutOfRange { key: std::borrow::Cow<'static, str>, value: u64, least: u64, most: u64 },
    /// `data_dir = ""`.
    EmptyDataDir,
    /// A file that lists no assets or no instruments (and does not ask
    /// for the demo venue's): a venue with nothing to trade.
    NothingListed(&'static str),
    /// The built-in configuration (no file) on a venue that was set up, or
    /// last served, from a file: the demo's published keys would open its
    /// accounts (`DEMO_MARKER`).
    NotTheDemo(PathBuf),
}

/// The file in a data directory that says its venue is the demo venue: set
/// up from the built-in configuration and never served from a file since.
/// Without it, the built-in configuration is refused on a venue that has
/// run.
pub const DEMO_MARKER: &str = "DEMO";

/// The smallest `segment_bytes` accepted.
pub const MIN_SEGMENT_BYTES: u64 = 4096;
pub const MAX_SEGMENT_BYTES: u64 = 1 << 40;

/// An asset's name, at most (`docs/formats.md`: an instrument's symbol may
/// be longer and hold a `/`).
pub const ASSET_NAME_BYTES: usize = 16;

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigError::Parse(e) => write!(f, "{e}"),
            ConfigError::BadName { what: what @ "asset name", name } => write!(f, "bad {what} {name:?} (1 to {ASSET_NAME_BYTES} of A-Z a-z 0-9 _ . -)"),
            ConfigError::BadName { what, name } => write!(f, "bad {what} {name:?} (1 to 32 of A-Z a-z 0-9 _ . - /)"),
            ConfigError::BadApiKey { account } => write!(f, "account {account}: the API key must be 1 to 32 visible ASCII characters (! to ~)"),
            ConfigError::BadLoginKey { account } => write!(f, "account {account}: login_key must be 1 to 32 visible ASCII characters (! to ~), or \"\" for the API key"),
            ConfigError::BadDurability(other) => write!(f, "durability must be sync or async, not {other:?}"),
            ConfigError::BadFixApplication(other) => write!(f, "fix.application must be venue or echo, not {other:?}"),
            ConfigError::BadFixUnit { symbol, what, value } => write!(f, "instrument {symbol}: {what} {value:?} is not a positive decimal of at most {} digits whose digits, the point left out, make at most {}", crossbook_fix::decimal::MAX_DIGITS, u64::MAX),
            ConfigError::SymbolClash { symbol, binance } => write!(f, "instrument {symbol}: another instrument's symbol is also written {binance} (letters and digits only), as market data names it"),
            ConfigError::AssetClash { name, other } if name == other => write!(f, "two assets are named {name}"),
            ConfigError::AssetClash { name, other } => write!(f, "assets {other} and {name} have the same name in another case (the REST API reads an asset's name in any case)"),
            ConfigError::NotTheDemo(dir) => write!(
                f,
                "{} holds a venue set up or last served from a configuration file: start it with --config and that file (without one, crossbook serve runs the demo venue, whose accounts' keys are published, and does so only on a new data directory or on the demo venue's own)",
                dir.display()
            ),
            ConfigError::BadAddress { key, value } => write!(f, "{key} {value:?} is not an address (host:port)"),
            ConfigError::BadReplication(why) => write!(f, "replication: {why}"),
            ConfigError::BadNice(nice) => write!(f, "market_data.nice must be 0 to 19, not {nice}"),
            ConfigError::AdminWithoutTrading => write!(f, "market_data.admin_token is set but market_data.trading is false: the operator's endpoints are part of the trading API"),
            ConfigError::BadAdminToken(why) => write!(f, "market_data.admin_token {why}: it takes at least {MIN_ADMIN_TOKEN} visible ASCII characters (! to ~), or none (the operator endpoints off)"),
            ConfigError::BadFixSession(why) => write!(f, "fix: {why}"),
            ConfigError::OutOfRange { key, value, least, most } => write!(f, "{key} must be {least} to {most}, not {value}"),
            ConfigError::EmptyDataDir => write!(f, "data_dir is empty: it names the data directory (\"data\" by default; \".\" for the current one)"),
            ConfigError::NothingListed(what) => write!(
                f,
                "the configuration lists no {what}: a venue's assets and instruments are the file's (`demo = true` takes the demo venue's for each list the file leaves out; without --config, crossbook serve runs the demo venue)"
            ),
            ConfigError::DuplicateId { what, id } => write!(f, "two {what}s have id {id}"),
            ConfigError::FeeAccount => write!(f, "account 0 is the venue's fee account: it has no [[accounts]] entry (no keys, no deposits)"),
            ConfigError::SharedApiKey { first, second } => write!(f, "accounts {first} and {second} have the same API key (the REST API names an account by its key)"),
            ConfigError::Refused { what, reason } => write!(f, "{what} is refused by the engine: {reason} (docs/engine.md says why)"),
            ConfigError::NotTheVenues(why) => write!(
                f,
                "the configuration does not fit the venue's journal: {why}. A venue's assets and instruments stay as they were added (`crossbook journal inspect` shows them), and an asset's supply within 2^62: add new ones under new ids, names and symbols"
            ),
        }
    }
}

impl std::error::Error for ConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ConfigError::Parse(e) => Some(e),
            _ => None,
        }
    }
}

impl Config {
    /// A configuration file: every setting it leaves out has its default,
    /// but the lists (`[[assets]]`, `[[instruments]]`, `[[accounts]]`)
    /// are what it lists, or the demo venue's with `demo = true`.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let mut config: Config = toml::from_str(text).map_err(ConfigError::Parse)?;
        if config.demo {
            let demo = Config::default();
            if config.assets.is_empty() {
                config.assets = demo.assets;
            }
            if config.instruments.is_empty() {
                config.instruments = demo.instruments;
            }
            if config.accounts.is_empty() {
                config.accounts = demo.accounts;
            }
        }
        Ok(config)
    }

    /// The journal's durability mode (async syncs every 10 ms).
    pub fn durability(&self) -> Result<crossbook_journal::Durability, ConfigError> {
        match self.durability.as_str() {
            "sync" => Ok(crossbook_journal::Durability::Sync),
            "async" => Ok(crossbook_journal::Durability::Async { interval: std::time::Duration::from_millis(10) }),
            other => Err(ConfigError::BadDurability(other.to_string())),
        }
    }

    /// The listening addresses resolve (a host name is looked up): at
    /// start, before the data directory is touched, an address that
    /// cannot be one is refused (one already taken is found when bound).
    /// Not on a reload, which takes no address (and must not wait on a
    /// name lookup).
    pub fn check_addresses(&self) -> Result<(), ConfigError> {
        for (key, address, optional) in [("listen", &self.listen, false), ("fix.listen", &self.fix.listen, true), ("market_data.listen", &self.market_data.listen, true)] {
            if optional && address.is_empty() {
                continue;
            }
            if std::net::ToSocketAddrs::to_socket_addrs(address.as_str()).map_or(true, |mut all| all.next().is_none()) {
                return Err(ConfigError::BadAddress { key, value: address.clone() });
            }
        }
        Ok(())
    }

    /// Checks what `serve` needs of the settings before it touches the
    /// data directory: every refusal here names the key.
    pub fn check(&self) -> Result<(), ConfigError> {
        self.durability()?;
        if self.data_dir.as_os_str().is_empty() {
            return Err(ConfigError::EmptyDataDir);
        }
        if self.assets.is_empty() {
            return Err(ConfigError::NothingListed("[[assets]]"));
        }
        if self.instruments.is_empty() {
            return Err(ConfigError::NothingListed("[[instruments]]"));
        }
        if !(0..=19).contains(&self.market_data.nice) {
            return Err(ConfigError::BadNice(self.market_data.nice));
        }
        let ids: [(&'static str, Vec<u64>); 3] = [
            ("asset", self.assets.iter().map(|a| u64::from(a.id)).collect()),
            ("instrument", self.instruments.iter().map(|i| u64::from(i.id)).collect()),
            ("account", self.accounts.iter().map(|a| a.id).collect()),
        ];
        if self.accounts.iter().any(|a| a.id == crossbook_engine::FEE_ACCOUNT) {
            return Err(ConfigError::FeeAccount);
        }
        for (what, mut ids) in ids {
            ids.sort_unstable();
            if let Some(pair) = ids.windows(2).find(|pair| pair[0] == pair[1]) {
                return Err(ConfigError::DuplicateId { what, id: pair[0] });
            }
        }
        // Market data's names: an instrument's symbol in letters and
        // digits, an asset's name in any case (as the REST API reads them).
        crate::market::instruments(self)?;
        for (index, asset) in self.assets.iter().enumerate() {
            if let Some(other) = self.assets[..index].iter().find(|a| a.name.eq_ignore_ascii_case(&asset.name)) {
                return Err(ConfigError::AssetClash { name: asset.name.clone(), other: other.name.clone() });
            }
        }
        // Ids from 1 (instrument 0 is no instrument on the wire), and
        // amounts whose decimals a u64 can show.
        for (key, value, least, most) in self
            .assets
            .iter()
            .flat_map(|a| [(std::borrow::Cow::from("assets.id"), u64::from(a.id), 1, u64::from(u32::MAX)), (format!("assets.decimals (of asset {} {:?})", a.id, a.name).into(), u64::from(a.decimals), 0, 18)])
            .chain(self.instruments.iter().map(|i| ("instruments.id".into(), u64::from(i.id), 1, u64::from(u32::MAX))))
            .chain([("history_commands".into(), self.history_commands, 1, i64::MAX as u64)])
        {
            if !(least..=most).contains(&value) {
                return Err(ConfigError::OutOfRange { key, value, least, most });
            }
        }
        // What a FIX message or an HTTP header can carry as it is.
        let visible = |text: &str| !text.is_empty() && text.len() <= 64 && text.bytes().all(|b| b.is_ascii_graphic());
        for account in &self.accounts {
            if account.api_key.len() > crossbook_protocol::API_KEY_BYTES || !visible(&account.api_key) {
                return Err(ConfigError::BadApiKey { account: account.id });
            }
            if !account.login_key.is_empty() && (account.login_key.len() > crossbook_protocol::API_KEY_BYTES || !visible(&account.login_key)) {
                return Err(ConfigError::BadLoginKey { account: account.id });
            }
        }
        for comp_id in std::iter::once(&self.fix.comp_id).chain(self.fix.sessions.iter().map(|s| &s.comp_id)) {
            if !comp_id.is_empty() && !visible(comp_id) {
                return Err(ConfigError::BadFixSession(format!("CompID {comp_id:?}: 1 to 64 visible ASCII characters (! to ~)")));
            }
        }
        let token = &self.market_data.admin_token;
        if !token.is_empty() && !self.market_data.trading {
            return Err(ConfigError::AdminWithoutTrading);
        }
        if let Some(bad) = token.chars().find(|c| !c.is_ascii_graphic()) {
            return Err(ConfigError::BadAdminToken(format!("has {bad:?}")));
        }
        if !token.is_empty() && token.len() < MIN_ADMIN_TOKEN {
            return Err(ConfigError::BadAdminToken(format!("has {} characters", token.len())));
        }
        let market = &self.market_data;
        for (key, value, least, most) in [
            ("market_data.orders_kept", market.orders_kept as u64, 1, 1_000_000),
            ("market_data.trades_kept", market.trades_kept as u64, 1, 1_000_000),
            ("market_data.ping_interval_s", market.ping_interval_s, 1, 3_600),
            ("market_data.send_interval_us", market.send_interval_us, 0, 1_000_000),
            ("market_data.header_timeout_s", market.header_timeout_s, 1, 3_600),
            ("market_data.max_http_connections", market.max_http_connections as u64, 1, 1_000_000),
            ("market_data.max_http_connections_per_address", market.max_http_connections_per_address as u64, 1, 1_000_000),
            ("market_data.max_connections_per_address", market.max_connections_per_address as u64, 1, 1_000_000),
            ("fix.max_latency_s", self.fix.max_latency_s, 1, 315_360_000),
            // Half a MiB at most: an answer that quotes a message's fields
            // (a refusal names its ClOrdID and Symbol) must fit a FIX
            // store record (1 MiB).
            ("fix.max_message", self.fix.max_message as u64, 1_024, 1 << 19),
            // A zero in any of these would start a venue nobody can use.
            ("limits.max_connections", self.limits.max_connections as u64, 1, 1_000_000),
            ("limits.max_unauthenticated", self.limits.max_unauthenticated as u64, 1, 1_000_000),
            ("limits.login_timeout_s", self.limits.login_timeout_s, 1, 3_600),
            // At least the longest message of the binary protocol.
            ("limits.max_frame", self.limits.max_frame as u64, crossbook_protocol::LONGEST_FRAME as u64, 1 << 24),
            ("segment_bytes", self.segment_bytes, MIN_SEGMENT_BYTES, MAX_SEGMENT_BYTES),
            ("limits.queue", self.limits.queue as u64, 1, 1_000_000),
            ("limits.in_flight", u64::from(self.limits.in_flight), 1, 1_000_000),
            ("limits.open_orders", self.limits.open_orders as u64, 1, 100_000_000),
            ("market_data.max_connections", market.max_connections as u64, 1, 1_000_000),
            ("market_data.max_streams", market.max_streams as u64, 1, 1_000_000),
            ("market_data.queue", market.queue as u64, 1, 10_000_000),
            ("market_data.max_message", market.max_message as u64, 64, 1 << 24),
            ("market_data.max_messages_per_s", u64::from(market.max_messages_per_s), 1, 1_000_000),
            ("market_data.max_weight_per_minute", u64::from(market.max_weight_per_minute), 1, 1_000_000_000),
            ("market_data.max_orders_per_10s", u64::from(market.max_orders_per_10s), 1, 1_000_000_000),
            ("market_data.max_body", market.max_body as u64, 256, 1 << 24),
            ("market_data.answer_timeout_ms", market.answer_timeout_ms, 1, 3_600_000),
        ] {
            if !(least..=most).contains(&value) {
                return Err(ConfigError::OutOfRange { key: key.into(), value, least, most });
            }
        }
        if !matches!(self.fix.application.as_str(), "venue" | "echo") {
            return Err(ConfigError::BadFixApplication(self.fix.application.clone()));
        }
        if self.fix.comp_id.is_empty() {
            return Err(ConfigError::BadFixSession("comp_id (the venue's own) is empty".into()));
        }
        for (index, session) in self.fix.sessions.iter().enumerate() {
            if session.comp_id.is_empty() || session.comp_id == self.fix.comp_id {
                return Err(ConfigError::BadFixSession(format!("a session's comp_id may be neither empty nor the venue's own ({:?}), not {:?}", self.fix.comp_id, session.comp_id)));
            }
            if self.fix.sessions[..index].iter().any(|other| other.comp_id == session.comp_id) {
                return Err(ConfigError::BadFixSession(format!("CompID {:?} is bound twice in sessions", session.comp_id)));
            }
            // (The echo application trades for nobody.)
            if self.fix.application == "venue" && !self.accounts.iter().any(|a| a.id == session.account) {
                return Err(ConfigError::BadFixSession(format!("CompID {:?} is bound to account {}, which has no [[accounts]] entry", session.comp_id, session.account)));
            }
            let bound = self.fix.sessions[..=index].iter().filter(|other| other.account == session.account).count();
            if bound > crate::fix::MAX_COMP_IDS {
                return Err(ConfigError::BadFixSession(format!("account {} has more than {} CompIDs in sessions", session.account, crate::fix::MAX_COMP_IDS)));
            }
        }
        if let Some(replication) = &self.replication {
            if !self.fix.listen.is_empty() {
                return Err(ConfigError::BadReplication("the FIX gateway is not replicated yet: set fix.listen = \"\"".into()));
            }
            if replication.nats.is_empty() {
                return Err(ConfigError::BadReplication("nats lists no NATS server (nats://host:port)".into()));
            }
            for (key, name) in [("node", &replication.node), ("stream", &replication.stream)] {
                let fits = (1..=64).contains(&name.len()) && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
                if !fits {
                    return Err(ConfigError::BadReplication(format!("{key} must be 1 to 64 letters, digits, - and _, not {name:?}")));
                }
            }
            // Refused now, not after `connect_timeout_s` of trying.
            if let Some(url) = replication.nats.iter().find(|url| !nats_url(url)) {
                return Err(ConfigError::BadReplication(format!("nats: {url:?} is not a NATS server's address (nats://host:port)")));
            }
            for (key, address) in [("advertise_binary", &replication.advertise_binary), ("advertise_rest", &replication.advertise_rest)] {
                // The binary protocol's Redirect carries 64 bytes of it.
                let host_port = address.rsplit_once(':').is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0));
                let usable = address.len() <= 64 && host_port && address.bytes().all(|b| b.is_ascii_graphic());
                if !address.is_empty() && !usable {
                    return Err(ConfigError::BadReplication(format!("{key} {address:?}: host:port, at most 64 visible ASCII characters")));
                }
            }
            // JetStream keeps at most 5 copies of a stream (refused now,
            // not after `connect_timeout_s` of asking NATS).
            for (key, value, least, most) in [
                ("replication.replicas", replication.replicas as u64, 1, 5),
                ("replication.lease_ttl_ms", replication.lease_ttl_ms, 300, 3_600_000),
                ("replication.connect_timeout_s", replication.connect_timeout_s, 1, 3_600),
            ] {
                if !(least..=most).contains(&value) {
                    return Err(ConfigError::OutOfRange { key: key.into(), value, least, most });
                }
            }
        }
        let mut keys: std::collections::HashMap<&str, AccountId> = std::collections::HashMap::new();
        for account in &self.accounts {
            if let Some(first) = keys.insert(account.api_key.as_str(), account.id) {
                return Err(ConfigError::SharedApiKey { first, second: account.id });
            }
        }
        Ok(())
    }

    /// The commands that set up a fresh venue: assets, instruments,
    /// accounts and their starting deposits.
    pub fn setup_commands(&self) -> Result<Vec<Command>, ConfigError> {
        let mut commands = Vec::new();
        for asset in &self.assets {
            let name = Symbol::new(&asset.name).ok_or_else(|| ConfigError::BadName { what: "asset name", name: asset.name.clone() })?;
            commands.push(Command::AddAsset { id: asset.id, name });
        }
        for i in &self.instruments {
            let spec = i.spec().ok_or_else(|| ConfigError::BadName { what: "instrument symbol", name: i.symbol.clone() })?;
            commands.push(Command::AddInstrument(spec));
        }
        for account in &self.accounts {
            if account.api_key.is_empty() || account.api_key.len() > crossbook_protocol::API_KEY_BYTES {
                return Err(ConfigError::BadApiKey { account: account.id });
            }
            commands.push(Command::OpenAccount { account: account.id });
            for &(asset, amount) in &account.deposits {
                commands.push(Command::Deposit { account: account.id, asset, amount });
            }
        }
        Ok(commands)
    }

    /// [`Config::setup_commands`], tried on an engine of their own first,
    /// for a venue that is about to apply them: it never starts with part
    /// of its configuration silently missing. (A venue whose journal or
    /// log has them already is not checked again.)
    pub fn checked_setup_commands(&self) -> Result<Vec<Command>, ConfigError> {
        let commands = self.setup_commands()?;
        Self::check_new_asset_names(&commands)?;
        Self::try_out(&commands)?;
        Ok(commands)
    }

    /// The assets `commands` add have names the command files can write
    /// (`docs/formats.md`: 1 to 16, no `/`), so that a journal's commands
    /// can be written out and read back. Only for assets a venue does not
    /// have yet: one it has keeps the name it was added under.
    pub fn check_new_asset_names(commands: &[Command]) -> Result<(), ConfigError> {
        for command in commands {
            if let Command::AddAsset { name, .. } = command
                && (name.as_str().len() > ASSET_NAME_BYTES || name.as_str().contains('/'))
            {
                return Err(ConfigError::BadName { what: "asset name", name: name.as_str().to_string() });
            }
        }
        Ok(())
    }

    /// Applies `commands` (set-up commands) to an engine of their own:
    /// the first the engine refuses, with why.
    pub fn try_out(commands: &[Command]) -> Result<(), ConfigError> {
        let mut engine = crossbook_engine::Engine::new();
        let mut events = Vec::new();
        for command in commands {
            events.clear();
            engine.apply(command, &mut events);
            if let Some(reason) = events.iter().find_map(|e| match e.kind {
                crossbook_engine::EventKind::Rejected { reason } => Some(reason),
                _ => None,
            }) {
                let what = match command {
                    Command::AddAsset { id, name } => format!("asset {id} ({name})"),
                    Command::AddInstrument(spec) => match spec.invalid_because().filter(|_| reason == crossbook_engine::RejectReason::InvalidInstrument) {
                        Some(why) => format!("instrument {} ({}), whose {why},", spec.id, spec.symbol),
                        None => format!("instrument {} ({})", spec.id, spec.symbol),
                    },
                    Command::OpenAccount { account } => format!("account {account}"),
                    // The engine's bound is on the asset's supply (every
                    // deposit of it together), not on this account alone.
                    Command::Deposit { account, asset, amount } if reason == crossbook_engine::RejectReason::BalanceOverflow => {
                        let before: u128 = commands.iter().take_while(|c| !std::ptr::eq(*c, command)).filter_map(|c| match c {
                            Command::Deposit { asset: a, amount, .. } if a == asset => Some(u128::from(*amount)),
                            _ => None,
                        }).sum();
                        format!("account {account}'s deposit of {amount} of asset {asset}, which would take the asset's supply (the deposits before it in the file: {before}) past 2^62,")
                    }
                    Command::Deposit { account, asset, amount } => format!("account {account}'s deposit of {amount} of asset {asset}"),
                    other => format!("{other:?}"),
                };
                return Err(ConfigError::Refused { what, reason: reason.name() });
            }
        }
        Ok(())
    }

    /// Instruments whose decimal units disagree with their assets'
    /// `decimals` (one lot must be `lot_size` base units, and one tick on
    /// one lot `tick_size` quote units): the REST API's prices and
    /// quantities would then not add up to its balances and fees.
    pub fn unit_warnings(&self) -> Vec<String> {
        use crossbook_fix::decimal::Decimal;
        let decimals = |asset: u32| self.assets.iter().find(|a| a.id == asset).map_or(0, |a| a.decimals);
        // a * 10^-sa == b * 10^-sb
        let same = |a: Decimal, b: Decimal| {
            let left = a.mantissa.checked_mul(10i128.checked_pow(b.scale).unwrap_or(0));
            let right = b.mantissa.checked_mul(10i128.checked_pow(a.scale).unwrap_or(0));
            left.is_some() && left == right
        };
        let mut warnings = Vec::new();
        for i in &self.instruments {
            // (An instrument the engine refuses is refused by name, not
            // warned of.)
            if i.tick_size == 0 || i.lot_size == 0 {
                continue;
            }
            let (Some(price), Some(qty)) = (Decimal::parse(i.fix_price_unit.as_bytes()), Decimal::parse(i.fix_qty_unit.as_bytes())) else { continue };
            let lot = Decimal { mantissa: i128::from(i.lot_size), scale: decimals(i.base) };
            if !same(qty, lot) {
                warnings.push(format!("instrument {}: fix_qty_unit {} is not lot_size {} in units of 10^-{} (asset {}'s decimals)", i.symbol, i.fix_qty_unit, i.lot_size, decimals(i.base), i.base));
            }
            let tick = Decimal { mantissa: i128::from(i.tick_size), scale: decimals(i.quote) };
            // Each mantissa is at most 2^64 - 1: their product can pass
            // i128's range, and then it is no tick of any asset.
            let notional = match price.mantissa.checked_mul(qty.mantissa) {
                Some(mantissa) => Decimal { mantissa, scale: price.scale + qty.scale },
                None => {
                    warnings.push(format!("instrument {}: fix_price_unit x fix_qty_unit is past 2^127 in its last digit, no tick_size {} in units of 10^-{} (asset {}'s decimals)", i.symbol, i.tick_size, decimals(i.quote), i.quote));
                    continue;
                }
            };
            if !same(notional, tick) {
                warnings.push(format!("instrument {}: fix_price_unit x fix_qty_unit ({}) is not tick_size {} in units of 10^-{} (asset {}'s decimals)", i.symbol, notional.to_text(), i.tick_size, decimals(i.quote), i.quote));
            }
        }
        warnings
    }
}

/// Compares two keys without an early exit, so the time taken does not
/// tell how much of a guess was right.
pub fn keys_match(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file of `text` on the demo venue (its lists).
    fn demo_with(text: &str) -> Result<Config, ConfigError> {
        Config::from_toml(&format!("demo = true\n{text}"))
    }

    /// What a file can say but no venue could use is refused by name
    /// (audit, 2026-11-27: each of these started, or was cut unsaid).
    #[test]
    fn values_no_venue_could_use_are_refused() {
        let refused = demo_with("[[accounts]]\nid = 1\napi_key = \"k\"\ndeposits = [[1, 2, 3]]").expect_err("refused").to_string();
        assert!(refused.contains("two numbers"), "{refused}");
        let sessions: Vec<String> = (0..17).map(|n| format!("{{ comp_id = \"T{n}\", account = 7 }}")).collect();
        let checked = |text: &str| demo_with(text).unwrap().check().map_err(|e| e.to_string());
        assert!(checked(&format!("[fix]\nsessions = [{}]", sessions[..16].join(", "))).is_ok());
        assert!(checked(&format!("[fix]\nsessions = [{}]", sessions.join(", "))).is_err_and(|e| e.contains("more than 16 CompIDs")));
        assert!(checked("[fix]\ncomp_id = \"A\\u0001B\"").is_err_and(|e| e.contains("visible ASCII")));
        let mut config = Config::default();
        config.accounts[0].api_key = "two words".into();
        assert!(config.check().is_err_and(|e| e.to_string().contains("visible ASCII")));
        for login_key in ["two words", &"k".repeat(33)] {
            let mut config = Config::default();
            config.accounts[0].login_key = login_key.to_string();
            assert!(config.check().is_err_and(|e| e.to_string().starts_with("account 1: login_key must be 1 to 32 visible ASCII")), "{login_key}");
        }
        let mut config = Config::default();
        config.accounts[0].login_key = "a-login-key".into();
        assert!(config.check().is_ok());
        for (edit, said) in [("decimals = 0", "decimals = 19"), ("id = 1\nname = \"BTC\"", "id = 0\nname = \"BTC\"")] {
            let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../crossbook.toml")).unwrap();
            assert!(text.contains(edit), "{edit}");
            let refused = Config::from_toml(&text.replacen(edit, said, 1)).unwrap().check().expect_err("refused").to_string();
            assert!(refused.contains("must be"), "{said}: {refused}");
        }
        // Which asset, and every range in one form (audit, 2026-11-27).
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../crossbook.toml")).unwrap();
        let refused = |edit: &str, to: &str| Config::from_toml(&text.replacen(edit, to, 1)).unwrap().check().map_err(|e| e.to_string());
        assert_eq!(refused("decimals = 0", "decimals = 19"), Err("assets.decimals (of asset 1 \"BTC\") must be 0 to 18, not 19".into()));
        assert_eq!(refused("segment_bytes = 67108864", "segment_bytes = 0"), Err("segment_bytes must be 4096 to 1099511627776, not 0".into()));
        // An asset's name as command files write it (docs/formats.md): 16
        // at most, no `/` (an instrument's symbol may have both).
        let named = |name: &str| refused("name = \"USD\"", &format!("name = \"{name}\"")).and_then(|()| Config::from_toml(&text.replacen("name = \"USD\"", &format!("name = \"{name}\""), 1)).unwrap().checked_setup_commands().map(drop).map_err(|e| e.to_string()));
        assert!(named(&"U".repeat(16)).is_ok());
        for name in ["US/D", &"U".repeat(17)] {
            assert_eq!(named(name), Err(format!("bad asset name {name:?} (1 to 16 of A-Z a-z 0-9 _ . -)")), "{name}");
        }
        let replicated = |extra: &str| checked(&format!("[fix]\nlisten = \"\"\n\n[replication]\nnats = [\"nats://127.0.0.1:4222\"]\nstream = \"S\"\nnode = \"a\"\n{extra}"));
        assert!(replicated("").is_ok());
        assert!(replicated("lease_ttl_ms = 9223372036854775807").is_err());
        // Each key by name, with its range and the value given.
        for (line, said) in [
            ("lease_ttl_ms = 299", "replication.lease_ttl_ms must be 300 to 3600000, not 299"),
            ("replicas = 0", "replication.replicas must be 1 to 5, not 0"),
            ("replicas = 6", "replication.replicas must be 1 to 5, not 6"),
            ("connect_timeout_s = 0", "replication.connect_timeout_s must be 1 to 3600, not 0"),
        ] {
            assert!(replicated(line).is_err_and(|e| e == said), "{line}");
        }
        let long = "n".repeat(65);
        assert!(checked(&format!("[fix]\nlisten = \"\"\n\n[replication]\nnats = [\"nats://h:1\"]\nstream = \"S\"\nnode = \"{long}\"")).is_err_and(|e| e == format!("replication: node must be 1 to 64 letters, digits, - and _, not \"{long}\"")));
        assert!(checked("[fix]\nlisten = \"\"\n\n[replication]\nnats = []\nstream = \"S\"\nnode = \"a\"").is_err_and(|e| e.contains("nats lists no NATS server")));
        assert!(replicated(&format!("advertise_binary = \"{}:7700\"", "h".repeat(70))).is_err_and(|e| e.contains("advertise_binary")));
        assert!(checked("[fix]\nlisten = \"\"\n\n[replication]\nnats = [\"bogus::url\"]\nstream = \"S\"\nnode = \"a\"").is_err_and(|e| e.contains("not a NATS server")));
        assert!(checked(&format!("[fix]\nlisten = \"\"\n\n[replication]\nnats = [\"nats://h:1\"]\nstream = \"{}\"\nnode = \"a\"", "S".repeat(65))).is_err());
    }

    /// In a file, the lists are the file's: an empty or cut-short one (a
    /// reload while an editor writes it) lists nothing and is refused; one
    /// without accounts opens none (never the demo's, whose keys are
    /// published); `demo = true` fills in what it leaves out.
    #[test]
    fn a_files_lists_are_its_own_unless_it_asks_for_the_demos() {
        for text in ["", "# being written\n", "durability = \"async\"\n"] {
            let refused = Config::from_toml(text).unwrap().check().expect_err("refused");
            assert!(refused.to_string().contains("lists no [[assets]]"), "{text:?}: {refused}");
        }
        let demo = Config::default();
        let assets_only = "[[assets]]\nid = 1\nname = \"ETH\"\n\n[[assets]]\nid = 2\nname = \"EUR\"\n";
        let refused = Config::from_toml(assets_only).unwrap().check().expect_err("refused");
        assert!(refused.to_string().contains("lists no [[instruments]]"), "{refused}");
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../crossbook.toml")).unwrap();
        let without_accounts = text[..text.find("\n[[accounts]]\n").unwrap()].to_string();
        let config = Config::from_toml(&without_accounts).unwrap();
        assert!(config.check().is_ok(), "{:?}", config.check().err().map(|e| e.to_string()));
        assert!(config.accounts.is_empty(), "no demo accounts");
        let config = Config::from_toml(&without_accounts.replacen("demo = false", "demo = true", 1)).unwrap();
        assert_eq!(config.accounts.len(), demo.accounts.len());
        let config = demo_with("durability = \"async\"").unwrap();
        assert_eq!((config.assets.len(), config.instruments.len(), config.accounts.len()), (demo.assets.len(), demo.instruments.len(), demo.accounts.len()));
    }

    /// The documented crossbook.toml at the repository root is exactly the
    /// built-in default.
    #[test]
    fn the_documented_file_is_the_default() {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../crossbook.toml")).unwrap();
        let parsed = Config::from_toml(&text).unwrap();
        let default = Config::default();
        assert_eq!(format!("{parsed:?}"), format!("{default:?}"));
        assert_eq!(parsed.setup_commands().unwrap(), default.setup_commands().unwrap());
    }

    #[test]
    fn unknown_fields_and_bad_keys_are_refused() {
        assert!(Config::from_toml("colour = \"red\"").is_err());
        let mut config = Config::default();
        config.accounts[0].api_key = "x".repeat(33);
        assert!(config.setup_commands().is_err());
        // A rebate larger than the taker fee: the engine refuses the
        // instrument, and so does the configuration, before anything runs.
        let mut config = Config::default();
        config.instruments[0].maker_bps = -10;
        config.instruments[0].taker_bps = 5;
        assert!(config.setup_commands().is_ok(), "only the check refuses it");
        let refused = config.checked_setup_commands().expect_err("refused").to_string();
        assert!(refused.contains("invalid_instrument") && refused.contains("whose maker_bps -10 would pay more rebate than taker_bps 5 takes"), "{refused}");
        // Each rule by the keys it reads.
        for (edit, said) in [
            (&(|i: &mut InstrumentConfig| i.tick_size = 0) as &dyn Fn(&mut InstrumentConfig), "whose tick_size is 0,"),
            (&|i: &mut InstrumentConfig| i.min_qty = i.max_qty + 1, "whose min_qty"),
            (&|i: &mut InstrumentConfig| i.maker_bps = i.taker_bps + 1, "is above taker_bps"),
            (&|i: &mut InstrumentConfig| i.taker_bps = 20_000, "taker_bps 20000 is not 0 to 10000"),
        ] {
            let mut config = Config::default();
            edit(&mut config.instruments[0]);
            let refused = config.checked_setup_commands().expect_err("refused").to_string();
            assert!(refused.contains(said), "{refused}");
        }
    }

    #[test]
    fn units_that_disagree_with_the_assets_decimals_are_named() {
        let mut config = Config::default();
        assert!(config.unit_warnings().is_empty(), "{:?}", config.unit_warnings());
        config.assets[0].decimals = 3;
        config.assets[1].decimals = 2;
        config.instruments[0].fix_qty_unit = "0.001".into();
        config.instruments[0].tick_size = 10;
        config.instruments[0].fix_price_unit = "100".into();
        assert!(config.unit_warnings().is_empty(), "{:?}", config.unit_warnings());
        config.instruments[0].fix_price_unit = "0.1".into();
        assert_eq!(config.unit_warnings().len(), 1);
        config.instruments[0].fix_qty_unit = "0.01".into();
        assert_eq!(config.unit_warnings().len(), 2);
        // The largest units: their product is past i128, named, not
        // wrapped (nor a panic).
        config.instruments[0].fix_price_unit = "18446744073709551615".into();
        config.instruments[0].fix_qty_unit = "18446744073709551615".into();
        let warnings = config.unit_warnings();
        assert!(warnings.iter().any(|w| w.contains("past 2^127")), "{warnings:?}");
    }

    #[test]
    fn a_nice_outside_0_to_19_is_refused_by_name() {
        let config = demo_with("[market_data]\nnice = 10").unwrap();
        assert!(config.check().is_ok());
        for nice in [-1, 20] {
            let config = demo_with(&format!("[market_data]\nnice = {nice}")).unwrap();
            let refused = config.check().expect_err("refused");
            assert_eq!(refused.to_string(), format!("market_data.nice must be 0 to 19, not {nice}"));
        }
    }

    #[test]
    fn windows_outside_1_to_a_million_are_refused_by_name() {
        assert!(demo_with("[market_data]\norders_kept = 100\ntrades_kept = 1000000").unwrap().check().is_ok());
        for (key, value) in [("orders_kept", 0), ("trades_kept", 1_000_001)] {
            let refused = demo_with(&format!("[market_data]\n{key} = {value}")).unwrap().check().expect_err("refused");
            assert_eq!(refused.to_string(), format!("market_data.{key} must be 1 to 1000000, not {value}"));
        }
    }

    #[test]
    fn fix_session_bindings_are_checked_at_start() {
        let with = |sessions: &str| demo_with(&format!("[fix]\nsessions = [{sessions}]")).unwrap().check().map_err(|e| e.to_string());
        assert_eq!(with(r#"{ comp_id = "T1", account = 1 }, { comp_id = "T2", account = 2 }"#), Ok(()));
        assert_eq!(with(r#"{ comp_id = "T1", account = 1 }, { comp_id = "T1", account = 2 }"#), Err("fix: CompID \"T1\" is bound twice in sessions".into()));
        assert_eq!(with(r#"{ comp_id = "T9", account = 99 }"#), Err("fix: CompID \"T9\" is bound to account 99, which has no [[accounts]] entry".into()));
        assert!(with(r#"{ comp_id = "CROSSBOOK", account = 1 }"#).is_err_and(|e| e.contains("the venue's own")));
        assert!(with(r#"{ comp_id = "", account = 1 }"#).is_err());
        assert!(demo_with("[fix]\ncomp_id = \"\"").unwrap().check().is_err_and(|e| e.to_string().contains("comp_id (the venue's own) is empty")));
    }

    #[test]
    fn durations_that_would_overflow_a_clock_are_refused_by_name() {
        for (section, key, value, range) in [
            ("market_data", "ping_interval_s", i64::MAX as u64, "1 to 3600"),
            ("market_data", "ping_interval_s", 0, "1 to 3600"),
            ("market_data", "send_interval_us", 1_000_001, "0 to 1000000"),
            ("market_data", "header_timeout_s", 3_601, "1 to 3600"),
            ("market_data", "max_http_connections", 0, "1 to 1000000"),
            ("fix", "max_latency_s", 10_000_000_000_000_000, "1 to 315360000"),
            ("limits", "max_connections", 0, "1 to 1000000"),
            ("limits", "open_orders", 0, "1 to 100000000"),
            ("market_data", "max_weight_per_minute", 0, "1 to 1000000000"),
            ("market_data", "max_body", 0, "256 to 16777216"),
        ] {
            let refused = demo_with(&format!("[{section}]\n{key} = {value}")).unwrap().check().expect_err("refused");
            assert_eq!(refused.to_string(), format!("{section}.{key} must be {range}, not {value}"));
        }
        assert!(Config::default().check().is_ok());
    }

    #[test]
    fn an_admin_token_is_none_or_16_visible_ascii_characters_at_least() {
        for token in ["", "0123456789abcdef"] {
            assert!(demo_with(&format!("[market_data]\nadmin_token = \"{token}\"")).unwrap().check().is_ok(), "{token:?}");
        }
        let fee = demo_with("[[accounts]]\nid = 0\napi_key = \"fees\"").unwrap().check();
        assert!(matches!(fee, Err(ConfigError::FeeAccount)), "{fee:?}");
        let without_trading = demo_with("[market_data]\ntrading = false\nadmin_token = \"0123456789abcdef\"").unwrap().check();
        assert!(matches!(without_trading, Err(ConfigError::AdminWithoutTrading)), "{without_trading:?}");
        let refused = demo_with("[market_data]\nadmin_token = \"short\"").unwrap().check().expect_err("refused");
        assert_eq!(refused.to_string(), "market_data.admin_token has 5 characters: it takes at least 16 visible ASCII characters (! to ~), or none (the operator endpoints off)");
        for token in ["0123456789abcdef é", "0123456789 abcdef"] {
            let refused = demo_with(&format!("[market_data]\nadmin_token = \"{token}\"")).unwrap().check().expect_err("refused");
            assert!(refused.to_string().starts_with("market_data.admin_token has '"), "{refused}");
        }
    }

    #[test]
    fn names_market_data_cannot_tell_apart_are_refused() {
        let base = Config::default();
        let mut config = base.clone();
        let mut other = config.assets[0].clone();
        other.id = 9;
        other.name = other.name.to_ascii_lowercase();
        config.assets.push(other);
        assert_eq!(config.check().expect_err("refused").to_string(), "assets BTC and btc have the same name in another case (the REST API reads an asset's name in any case)");
        let mut config = base.clone();
        config.instruments[0].symbol = "---".into();
        assert!(config.check().expect_err("refused").to_string().starts_with("bad instrument symbol (market data writes its letters and digits, and it has none) \"---\""));
        let mut config = base;
        let mut other = config.instruments[0].clone();
        other.id = 9;
        other.symbol = "btc/usd".into();
        config.instruments.push(other);
        assert!(config.check().expect_err("refused").to_string().contains("also written BTCUSD"));
    }

    #[test]
    fn keys_compare_whole() {
        let a = [7u8; 32];
        let mut b = a;
        assert!(keys_match(&a, &b));
        b[31] = 8;
        assert!(!keys_match(&a, &b));
    }
}
