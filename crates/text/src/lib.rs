//! The line-oriented text formats of `docs/formats.md`.
//!
//! Commands: `verb key=value ...`, one per line, `#` comments. Events:
//! `<seq> <kind> key=value ...`. Hand-written (not serde): the formats are
//! tiny, must be byte-exact, and event writing sits on the `run` hot path.

use crossbook_engine::*;
use std::fmt;

mod write;
pub use write::{write_command, write_event};

/// A syntax error in a command line (meaning is the engine's business).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyntaxError {
    pub message: String,
}

impl fmt::Display for SyntaxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for SyntaxError {}

fn error(message: impl Into<String>) -> SyntaxError {
    SyntaxError { message: message.into() }
}

/// An error with the line it was found on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineError {
    pub line: usize,
    pub error: SyntaxError,
}

impl fmt::Display for LineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.error)
    }
}

impl std::error::Error for LineError {}

/// Parses a whole command file. Blank and `#` lines are skipped.
pub fn parse_commands(text: &str) -> Result<Vec<Command>, LineError> {
    let mut commands = Vec::new();
    // Split at `\n` only: `parse_line` takes the one `\r` a CRLF line end
    // leaves (`str::lines` would take it too, and a second with it).
    for (index, line) in text.split('\n').enumerate() {
        match parse_line(line) {
            Ok(Some(command)) => commands.push(command),
            Ok(None) => {}
            Err(error) => return Err(LineError { line: index + 1, error }),
        }
    }
    Ok(commands)
}

/// Parses one line: `Ok(None)` for a blank or comment line.
pub fn parse_line(line: &str) -> Result<Option<Command>, SyntaxError> {
    let line = line.strip_suffix('\r').unwrap_or(line);
    let trimmed = line.trim_matches(|c| c == ' ' || c == '\t');
    if trimmed.is_empty() || trimmed.starts_with('#') {
        return Ok(None);
    }
    let mut tokens = trimmed.split([' ', '\t']).filter(|t| !t.is_empty());
    let verb = tokens.next().unwrap_or("");
    let mut fields = Fields::default();
    for token in tokens {
        let (key, value) = token.split_once('=').ok_or_else(|| error(format!("expected key=value, found {token:?}")))?;
        if fields.entries.iter().any(|(k, _)| *k == key) {
            return Err(error(format!("repeated key {key:?}")));
        }
        fields.entries.push((key, value));
    }
    let command = match verb {
        "asset" => Command::AddAsset { id: fields.int("id")?, name: fields.symbol("name", 16)? },
        "instrument" => Command::AddInstrument(InstrumentSpec {
            id: fields.int("id")?,
            symbol: fields.symbol("symbol", 32)?,
            base: fields.int("base")?,
            quote: fields.int("quote")?,
            tick_size: fields.int("tick_size")?,
            lot_size: fields.int("lot_size")?,
            min_qty: fields.int("min_qty")?,
            max_qty: fields.int("max_qty")?,
            min_price: fields.int("min_price")?,
            max_price: fields.int("max_price")?,
            maker_bps: fields.int("maker_bps")?,
            taker_bps: fields.int("taker_bps")?,
        }),
        "open" => Command::OpenAccount { account: fields.int("account")? },
        "deposit" => Command::Deposit { account: fields.int("account")?, asset: fields.int("asset")?, amount: fields.int("amount")? },
        "withdraw" => Command::Withdraw { account: fields.int("account")?, asset: fields.int("asset")?, amount: fields.int("amount")? },
        "place" => parse_place(&mut fields)?,
        "cancel" => Command::Cancel { account: fields.int("account")?, order: fields.int("order")? },
        "replace" => Command::Replace {
            account: fields.int("account")?,
            order: fields.int("order")?,
            price: fields.int("price")?,
            qty: fields.int("qty")?,
        },
        "amend" => Command::Amend { account: fields.int("account")?, order: fields.int("order")?, qty: fields.int("qty")? },
        "cancel_all" => Command::CancelAll { account: fields.int("account")?, instrument: fields.optional_int("instrument")? },
        "halt" => Command::Halt { instrument: fields.int("instrument")? },
        "resume" => Command::Resume { instrument: fields.int("instrument")? },
        "" => return Err(error("missing verb")),
        other => return Err(error(format!("unknown command {other:?}"))),
    };
    fields.finish()?;
    Ok(Some(command))
}

fn parse_place(fields: &mut Fields<'_>) -> Result<Command, SyntaxError> {
    let order_type = match fields.take("type")? {
        "limit" => OrderType::Limit,
        "market" => OrderType::Market,
        other => return Err(error(format!("type must be limit or market, not {other:?}"))),
    };
    let price = match order_type {
        OrderType::Limit => fields.int("price")?,
        OrderType::Market => {
            if fields.has("price") {
                return Err(error("a market order has no price"));
            }
            0
        }
    };
    Ok(Command::Place(PlaceOrder {
        account: fields.int("account")?,
        instrument: fields.int("instrument")?,
        cid: fields.int("cid")?,
        side: match fields.take("side")? {
            "buy" => Side::Buy,
            "sell" => Side::Sell,
            other => return Err(error(format!("side must be buy or sell, not {other:?}"))),
        },
        order_type,
        tif: match fields.take("tif")? {
            "gtc" => TimeInForce::Gtc,
            "ioc" => TimeInForce::Ioc,
            "fok" => TimeInForce::Fok,
            other => return Err(error(format!("tif must be gtc, ioc or fok, not {other:?}"))),
        },
        price,
        qty: fields.int("qty")?,
        post_only: match fields.take_optional("post_only") {
            None | Some("0") => false,
            Some("1") => true,
            Some(other) => return Err(error(format!("post_only must be 0 or 1, not {other:?}"))),
        },
        stp: match fields.take_optional("stp") {
            None | Some("none") => SelfTradePrevention::None,
            Some("cancel_newest") => SelfTradePrevention::CancelNewest,
            Some("cancel_oldest") => SelfTradePrevention::CancelOldest,
            Some("cancel_both") => SelfTradePrevention::CancelBoth,
            Some(other) => return Err(error(format!("unknown stp mode {other:?}"))),
        },
        budget: fields.optional_int("budget")?,
    }))
}

/// The `key=value` pairs of one line; each is taken once, and any left over
/// at the end is an unknown key.
#[derive(Default)]
struct Fields<'a> {
    entries: Vec<(&'a str, &'a str)>,
}

impl<'a> Fields<'a> {
    fn has(&self, key: &str) -> bool {
        self.entries.iter().any(|(k, _)| *k == key)
    }

    fn take_optional(&mut self, key: &str) -> Option<&'a str> {
        let position = self.entries.iter().position(|(k, _)| *k == key)?;
        Some(self.entries.swap_remove(position).1)
    }

    fn take(&mut self, key: &str) -> Result<&'a str, SyntaxError> {
        self.take_optional(key).ok_or_else(|| error(format!("missing {key}=")))
    }

    fn int<T: Integer>(&mut self, key: &str) -> Result<T, SyntaxError> {
        let value = self.take(key)?;
        T::parse(value).ok_or_else(|| error(format!("{key}={value}: not {}", T::WHAT)))
    }

    fn optional_int<T: Integer>(&mut self, key: &str) -> Result<Option<T>, SyntaxError> {
        match self.take_optional(key) {
            None => Ok(None),
            Some(value) => T::parse(value).map(Some).ok_or_else(|| error(format!("{key}={value}: not {}", T::WHAT))),
        }
    }

    fn symbol(&mut self, key: &str, max_len: usize) -> Result<Symbol, SyntaxError> {
        let value = self.take(key)?;
        let allowed_slash = max_len > 16;
        let ok = value.len() <= max_len && (allowed_slash || !value.contains('/'));
        match Symbol::new(value) {
            Some(symbol) if ok => Ok(symbol),
            _ => Err(error(format!("{key}={value:?}: 1 to {max_len} of A-Z a-z 0-9 _ . -{}", if allowed_slash { " /" } else { "" }))),
        }
    }

    fn finish(self) -> Result<(), SyntaxError> {
        match self.entries.first() {
            None => Ok(()),
            Some((key, _)) => Err(error(format!("unknown key {key:?}"))),
        }
    }
}

/// Decimal integers with no `+` and no leading spaces; `-` only for signed.
trait Integer: Sized {
    const WHAT: &'static str;
    fn parse(text: &str) -> Option<Self>;
}

fn digits_only(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

macro_rules! unsigned {
    ($t:ty, $what:expr) => {
        impl Integer for $t {
            const WHAT: &'static str = $what;
            fn parse(text: &str) -> Option<Self> {
                if digits_only(text) { text.parse().ok() } else { None }
            }
        }
    };
}

unsigned!(u32, "an integer from 0 to 4294967295");
unsigned!(u64, "an integer from 0 to 18446744073709551615");

impl Integer for i64 {
    const WHAT: &'static str = "an integer from -9223372036854775808 to 9223372036854775807";
    fn parse(text: &str) -> Option<Self> {
        let digits = text.strip_prefix('-').unwrap_or(text);
        if digits_only(digits) { text.parse().ok() } else { None }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_round_trip_through_text() {
        let text = "\
asset id=1 name=BTC
instrument id=1 symbol=BTC-USD base=1 quote=2 tick_size=1 lot_size=1000 min_qty=1 max_qty=1000000 min_price=1 max_price=1000000 maker_bps=-1 taker_bps=5
open account=1
deposit account=1 asset=2 amount=10000000
withdraw account=1 asset=2 amount=5
place account=2 instrument=1 cid=1 side=sell type=limit tif=gtc price=100 qty=10 post_only=1 stp=cancel_both
place account=2 instrument=1 cid=2 side=buy type=market tif=ioc qty=10 stp=none budget=99
cancel account=2 order=8
replace account=2 order=8 price=-3 qty=4
amend account=2 order=8 qty=3
cancel_all account=2
cancel_all account=2 instrument=1
halt instrument=1
resume instrument=1
";
        let commands = parse_commands(text).unwrap();
        assert_eq!(commands.len(), 14);
        let mut written = String::new();
        for command in &commands {
            write_command(&mut written, command);
            written.push('\n');
        }
        assert_eq!(parse_commands(&written).unwrap(), commands);
    }

    /// One `\r` before a line's `\n` is its line end; a second is part
    /// of the line (as the reference model reads it).
    #[test]
    fn one_carriage_return_ends_a_line() {
        assert_eq!(parse_commands("open account=1\r\nopen account=2\r\n").unwrap().len(), 2);
        assert_eq!(parse_commands("open account=1\n\r\n").unwrap().len(), 1, "a line of one \\r is blank");
        for text in ["open account=1\r\r\n", "open account=1 \r\r\n", "open account=1\n\r\r\n"] {
            let err = parse_commands(text).unwrap_err();
            assert_eq!(err.line, if text.starts_with("open account=1\n") { 2 } else { 1 }, "{text:?}");
        }
    }

    #[test]
    fn syntax_errors_name_the_line_and_the_problem() {
        let cases = [
            ("open account=1 account=2", "repeated key"),
            ("open", "missing account="),
            ("open account=-1", "not an integer from 0 to 18446744073709551615"),
            ("open account=+1", "not an integer from 0 to 18446744073709551615"),
            ("open account=18446744073709551616", "not an integer from 0 to 18446744073709551615"),
            ("open account=1 colour=red", "unknown key"),
            ("frobnicate x=1", "unknown command"),
            ("place account=1 instrument=1 cid=1 side=buy type=market tif=ioc price=5 qty=1", "no price"),
            ("place account=1 instrument=1 cid=1 side=up type=limit tif=gtc price=5 qty=1", "side must be"),
            ("asset id=1 name=ABCDEFGHIJKLMNOPQ", "1 to 16"),
            ("asset id=1 name=A/B", "1 to 16"),
            ("open account", "expected key=value"),
        ];
        for (line, expected) in cases {
            let text = format!("# comment\n\n{line}\n");
            let err = parse_commands(&text).unwrap_err();
            assert_eq!(err.line, 3, "{line}");
            assert!(err.error.message.contains(expected), "{line}: {}", err.error);
        }
    }
}
