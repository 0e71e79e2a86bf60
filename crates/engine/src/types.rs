//! Commands in, events out: the engine's whole interface.
//!
//! Every type here is `Copy` and fixed-size so that a command can be
//! journaled and an event published without allocating.

/// Account id as chosen by the operator. Account 0 is the fee account.
pub type AccountId = u64;
pub type AssetId = u32;
pub type InstrumentId = u32;
/// The sequence number of the `place` command that created the order.
pub type OrderId = u64;
pub type ClientOrderId = u64;

/// The fee account: receives every fee, pays every maker rebate.
pub const FEE_ACCOUNT: AccountId = 0;

/// For every asset, deposits minus withdrawals never exceed this, so that no
/// balance, lock or notional computed from them overflows 64 bits.
pub const MAX_SUPPLY: u64 = 1 << 62;

/// A short name (asset name or instrument symbol) stored inline.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Symbol {
    len: u8,
    bytes: [u8; Symbol::CAPACITY],
}

impl Symbol {
    pub const CAPACITY: usize = 32;

    /// `None` if `text` is empty, longer than [`Symbol::CAPACITY`], or has a
    /// byte outside `A-Z a-z 0-9 _ . - /`.
    pub fn new(text: &str) -> Option<Symbol> {
        let raw = text.as_bytes();
        if raw.is_empty() || raw.len() > Self::CAPACITY {
            return None;
        }
        if !raw.iter().all(|&b| b.is_ascii_alphanumeric() || b"_.-/".contains(&b)) {
            return None;
        }
        let mut bytes = [0u8; Self::CAPACITY];
        bytes[..raw.len()].copy_from_slice(raw);
        Some(Symbol { len: raw.len() as u8, bytes })
    }

    pub fn as_str(&self) -> &str {
        // Only ASCII is ever stored (checked in `new`).
        std::str::from_utf8(&self.bytes[..self.len as usize]).unwrap_or("")
    }
}

impl std::fmt::Debug for Symbol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

impl std::fmt::Display for Symbol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Buy,
    Sell,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OrderType {
    Limit,
    Market,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeInForce {
    Gtc,
    Ioc,
    Fok,
}

/// Self-trade prevention: what happens when a taker meets a resting order of
/// its own account. The taker's mode decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SelfTradePrevention {
    /// Trade with yourself like with anyone else.
    None,
    /// Cancel the rest of the incoming order.
    CancelNewest,
    /// Cancel the resting order and go on matching.
    CancelOldest,
    /// Cancel both.
    CancelBoth,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InstrumentSpec {
    pub id: InstrumentId,
    pub symbol: Symbol,
    pub base: AssetId,
    pub quote: AssetId,
    /// Quote units that one lot costs per tick of price.
    pub tick_size: u64,
    /// Base units in one lot.
    pub lot_size: u64,
    pub min_qty: u64,
    pub max_qty: u64,
    pub min_price: i64,
    pub max_price: i64,
    pub maker_bps: i64,
    pub taker_bps: i64,
}

impl InstrumentSpec {
    /// The first rule of `invalid_instrument` (`docs/engine.md`, the
    /// `instrument` command) this definition breaks, in words; `None` if
    /// it breaks none: what a configuration's error names. The engine
    /// keeps its own check inline (calling this from `add_instrument`
    /// moved `apply`'s register allocation: 497 -> 503 to 506
    /// instructions a command on `steady-deep`); a test holds the two
    /// to the same rules.
    pub fn invalid_because(&self) -> Option<String> {
        // (As the engine's: a product past 128 bits is past 2^62.)
        let max_notional = i128::from(self.max_price).checked_mul(i128::from(self.max_qty)).and_then(|n| n.checked_mul(i128::from(self.tick_size)));
        let max_base = i128::from(self.max_qty).checked_mul(i128::from(self.lot_size));
        let supply = i128::from(MAX_SUPPLY);
        let shown = |product: Option<i128>| product.map_or_else(|| "past 2^127".to_string(), |p| p.to_string());
        Some(if self.base == self.quote {
            format!("base and quote are both asset {}", self.base)
        } else if self.tick_size == 0 {
            "tick_size is 0".into()
        } else if self.lot_size == 0 {
            "lot_size is 0".into()
        } else if self.min_qty == 0 {
            "min_qty is 0".into()
        } else if self.min_qty > self.max_qty {
            format!("min_qty {} is above max_qty {}", self.min_qty, self.max_qty)
        } else if self.min_price < 1 {
            format!("min_price {} is below 1", self.min_price)
        } else if self.min_price > self.max_price {
            format!("min_price {} is above max_price {}", self.min_price, self.max_price)
        } else if !(0..=10_000).contains(&self.taker_bps) {
            format!("taker_bps {} is not 0 to 10000", self.taker_bps)
        } else if self.maker_bps > self.taker_bps {
            format!("maker_bps {} is above taker_bps {}", self.maker_bps, self.taker_bps)
        } else if self.maker_bps + self.taker_bps < 0 {
            format!("maker_bps {} would pay more rebate than taker_bps {} takes", self.maker_bps, self.taker_bps)
        } else if max_notional.is_none_or(|n| n > supply) {
            format!("max_price x max_qty x tick_size ({}) is past 2^62", shown(max_notional))
        } else if max_base.is_none_or(|b| b > supply) {
            format!("max_qty x lot_size ({}) is past 2^62", shown(max_base))
        } else {
            return None;
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlaceOrder {
    pub account: AccountId,
    pub instrument: InstrumentId,
    pub cid: ClientOrderId,
    pub side: Side,
    pub order_type: OrderType,
    pub tif: TimeInForce,
    /// Limit price in ticks; ignored for market orders.
    pub price: i64,
    pub qty: u64,
    pub post_only: bool,
    pub stp: SelfTradePrevention,
    /// Market buys only: the most quote the order may spend, fees included.
    pub budget: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    AddAsset { id: AssetId, name: Symbol },
    AddInstrument(InstrumentSpec),
    OpenAccount { account: AccountId },
    Deposit { account: AccountId, asset: AssetId, amount: u64 },
    Withdraw { account: AccountId, asset: AssetId, amount: u64 },
    Place(PlaceOrder),
    Cancel { account: AccountId, order: OrderId },
    /// `qty` is the new total quantity, filled lots included.
    Replace { account: AccountId, order: OrderId, price: i64, qty: u64 },
    /// A replace at the order's own price that only lowers `qty` (the new
    /// total, filled lots included): the order keeps its place.
    Amend { account: AccountId, order: OrderId, qty: u64 },
    CancelAll { account: AccountId, instrument: Option<InstrumentId> },
    /// Stops trading on an instrument: new orders and replaces are refused
    /// (`instrument_halted`); resting orders stay, and may be cancelled
    /// or amended down.
    Halt { instrument: InstrumentId },
    /// Trading on a halted instrument goes on.
    Resume { instrument: InstrumentId },
}

impl Command {
    /// The account a trading command acts for (place, cancel, replace,
    /// amend, cancel-all).
    pub fn trader(&self) -> Option<AccountId> {
        match *self {
            Command::Place(PlaceOrder { account, .. })
            | Command::Cancel { account, .. }
            | Command::Replace { account, .. }
            | Command::Amend { account, .. }
            | Command::CancelAll { account, .. } => Some(account),
            _ => None,
        }
    }

    /// The open order a cancel, replace or amend names.
    pub fn target_order(&self) -> Option<OrderId> {
        match *self {
            Command::Cancel { order, .. } | Command::Replace { order, .. } | Command::Amend { order, .. } => Some(order),
            _ => None,
        }
    }

    /// The command naming `order` instead (a cancel, replace or amend;
    /// any other command as it is).
    pub fn with_target(mut self, order: OrderId) -> Command {
        if let Command::Cancel { order: target, .. } | Command::Replace { order: target, .. } | Command::Amend { order: target, .. } = &mut self {
            *target = order;
        }
        self
    }
}

/// Why a command was refused. The discriminant is the wire code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum RejectReason {
    UnknownAccount = 1,
    UnknownAsset = 2,
    UnknownInstrument = 3,
    UnknownOrder = 4,
    NotOwner = 5,
    DuplicateAsset = 6,
    DuplicateInstrument = 7,
    DuplicateAccount = 8,
    DuplicateClientOrderId = 9,
    InvalidInstrument = 10,
    InvalidAmount = 11,
    InvalidQuantity = 12,
    InvalidPrice = 13,
    PriceOutOfBand = 14,
    InvalidTimeInForce = 15,
    InvalidBudget = 16,
    InsufficientFunds = 17,
    BalanceOverflow = 18,
    FeeAccount = 19,
    PostOnlyWouldTake = 20,
    FokCannotFill = 21,
    InstrumentHalted = 22,
    NotHalted = 23,
}

impl RejectReason {
    pub const ALL: [RejectReason; 23] = [
        RejectReason::UnknownAccount,
        RejectReason::UnknownAsset,
        RejectReason::UnknownInstrument,
        RejectReason::UnknownOrder,
        RejectReason::NotOwner,
        RejectReason::DuplicateAsset,
        RejectReason::DuplicateInstrument,
        RejectReason::DuplicateAccount,
        RejectReason::DuplicateClientOrderId,
        RejectReason::InvalidInstrument,
        RejectReason::InvalidAmount,
        RejectReason::InvalidQuantity,
        RejectReason::InvalidPrice,
        RejectReason::PriceOutOfBand,
        RejectReason::InvalidTimeInForce,
        RejectReason::InvalidBudget,
        RejectReason::InsufficientFunds,
        RejectReason::BalanceOverflow,
        RejectReason::FeeAccount,
        RejectReason::PostOnlyWouldTake,
        RejectReason::FokCannotFill,
        RejectReason::InstrumentHalted,
        RejectReason::NotHalted,
    ];

    pub fn code(self) -> u8 {
        self as u8
    }

    pub fn from_code(code: u8) -> Option<RejectReason> {
        Self::ALL.get(usize::from(code).wrapping_sub(1)).copied()
    }

    pub fn name(self) -> &'static str {
        match self {
            RejectReason::UnknownAccount => "unknown_account",
            RejectReason::UnknownAsset => "unknown_asset",
            RejectReason::UnknownInstrument => "unknown_instrument",
            RejectReason::UnknownOrder => "unknown_order",
            RejectReason::NotOwner => "not_owner",
            RejectReason::DuplicateAsset => "duplicate_asset",
            RejectReason::DuplicateInstrument => "duplicate_instrument",
            RejectReason::DuplicateAccount => "duplicate_account",
            RejectReason::DuplicateClientOrderId => "duplicate_client_order_id",
            RejectReason::InvalidInstrument => "invalid_instrument",
            RejectReason::InvalidAmount => "invalid_amount",
            RejectReason::InvalidQuantity => "invalid_quantity",
            RejectReason::InvalidPrice => "invalid_price",
            RejectReason::PriceOutOfBand => "price_out_of_band",
            RejectReason::InvalidTimeInForce => "invalid_time_in_force",
            RejectReason::InvalidBudget => "invalid_budget",
            RejectReason::InsufficientFunds => "insufficient_funds",
            RejectReason::BalanceOverflow => "balance_overflow",
            RejectReason::FeeAccount => "fee_account",
            RejectReason::PostOnlyWouldTake => "post_only_would_take",
            RejectReason::FokCannotFill => "fok_cannot_fill",
            RejectReason::InstrumentHalted => "instrument_halted",
            RejectReason::NotHalted => "not_halted",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CancelReason {
    /// A `cancel` command.
    User,
    /// The unfilled rest of an IOC or market order.
    Ioc,
    /// Self-trade prevention.
    Stp,
    /// Replaced to a quantity at or below what was already filled.
    Replace,
    /// A `cancel_all` command.
    CancelAll,
}

impl CancelReason {
    pub fn name(self) -> &'static str {
        match self {
            CancelReason::User => "user",
            CancelReason::Ioc => "ioc",
            CancelReason::Stp => "stp",
            CancelReason::Replace => "replace",
            CancelReason::CancelAll => "cancel_all",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Rejected {
        reason: RejectReason,
    },
    AssetAdded {
        asset: AssetId,
        name: Symbol,
    },
    InstrumentAdded {
        instrument: InstrumentId,
        symbol: Symbol,
    },
    /// Trading on the instrument stopped (`halt`).
    Halted {
        instrument: InstrumentId,
    },
    /// Trading on the instrument went on (`resume`).
    Resumed {
        instrument: InstrumentId,
    },
    AccountOpened {
        account: AccountId,
    },
    Deposited {
        account: AccountId,
        asset: AssetId,
        amount: u64,
    },
    Withdrawn {
        account: AccountId,
        asset: AssetId,
        amount: u64,
    },
    Accepted {
        order: OrderId,
        account: AccountId,
        instrument: InstrumentId,
        cid: ClientOrderId,
        side: Side,
        order_type: OrderType,
        tif: TimeInForce,
        /// Meaningful for limit orders only.
        price: i64,
        qty: u64,
    },
    Trade {
        instrument: InstrumentId,
        price: i64,
        qty: u64,
        maker: OrderId,
        maker_account: AccountId,
        taker: OrderId,
        taker_account: AccountId,
        taker_side: Side,
        maker_fee: i64,
        taker_fee: i64,
        maker_remaining: u64,
        taker_remaining: u64,
    },
    Cancelled {
        order: OrderId,
        account: AccountId,
        remaining: u64,
        reason: CancelReason,
    },
    Replaced {
        order: OrderId,
        price: i64,
        qty: u64,
        remaining: u64,
        priority_kept: bool,
    },
    MassCancelled {
        account: AccountId,
        count: u64,
    },
    /// Never emitted by [`crate::Engine::apply`]: the text format's
    /// `balance` line, derived from the engine's state by
    /// [`crate::BalanceLines`] after the command.
    Balance {
        account: AccountId,
        asset: AssetId,
        available: u64,
        locked: u64,
    },
}

/// One event, stamped with the sequence number of the command that caused it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    pub seq: u64,
    pub kind: EventKind,
}
