//! Writing commands and events in their text form.

use crossbook_engine::*;
use std::fmt::Write as _;

fn side(side: Side) -> &'static str {
    match side {
        Side::Buy => "buy",
        Side::Sell => "sell",
    }
}

fn order_type(order_type: OrderType) -> &'static str {
    match order_type {
        OrderType::Limit => "limit",
        OrderType::Market => "market",
    }
}

fn tif(tif: TimeInForce) -> &'static str {
    match tif {
        TimeInForce::Gtc => "gtc",
        TimeInForce::Ioc => "ioc",
        TimeInForce::Fok => "fok",
    }
}

fn stp(stp: SelfTradePrevention) -> &'static str {
    match stp {
        SelfTradePrevention::None => "none",
        SelfTradePrevention::CancelNewest => "cancel_newest",
        SelfTradePrevention::CancelOldest => "cancel_oldest",
        SelfTradePrevention::CancelBoth => "cancel_both",
    }
}

/// Appends `command` as one line of a command file (no line end).
pub fn write_command(out: &mut String, command: &Command) {
    // Writing to a String cannot fail.
    let _ = match command {
        Command::AddAsset { id, name } => write!(out, "asset id={id} name={name}"),
        Command::AddInstrument(s) => write!(
            out,
            "instrument id={} symbol={} base={} quote={} tick_size={} lot_size={} min_qty={} max_qty={} min_price={} max_price={} maker_bps={} taker_bps={}",
            s.id, s.symbol, s.base, s.quote, s.tick_size, s.lot_size, s.min_qty, s.max_qty, s.min_price, s.max_price, s.maker_bps, s.taker_bps
        ),
        Command::OpenAccount { account } => write!(out, "open account={account}"),
        Command::Deposit { account, asset, amount } => write!(out, "deposit account={account} asset={asset} amount={amount}"),
        Command::Withdraw { account, asset, amount } => write!(out, "withdraw account={account} asset={asset} amount={amount}"),
        Command::Place(p) => {
            let _ = write!(
                out,
                "place account={} instrument={} cid={} side={} type={} tif={}",
                p.account,
                p.instrument,
                p.cid,
                side(p.side),
                order_type(p.order_type),
                tif(p.tif)
            );
            if p.order_type == OrderType::Limit {
                let _ = write!(out, " price={}", p.price);
            }
            let _ = write!(out, " qty={}", p.qty);
            if p.post_only {
                out.push_str(" post_only=1");
            }
            if p.stp != SelfTradePrevention::None {
                let _ = write!(out, " stp={}", stp(p.stp));
            }
            match p.budget {
                Some(budget) => write!(out, " budget={budget}"),
                None => Ok(()),
            }
        }
        Command::Cancel { account, order } => write!(out, "cancel account={account} order={order}"),
        Command::Replace { account, order, price, qty } => write!(out, "replace account={account} order={order} price={price} qty={qty}"),
        Command::Amend { account, order, qty } => write!(out, "amend account={account} order={order} qty={qty}"),
        Command::CancelAll { account, instrument } => match instrument {
            Some(instrument) => write!(out, "cancel_all account={account} instrument={instrument}"),
            None => write!(out, "cancel_all account={account}"),
        },
        Command::Halt { instrument } => write!(out, "halt instrument={instrument}"),
        Command::Resume { instrument } => write!(out, "resume instrument={instrument}"),
    };
}

struct Line<'a> {
    out: &'a mut Vec<u8>,
    numbers: itoa::Buffer,
}

impl Line<'_> {
    #[inline]
    fn word(&mut self, text: &str) {
        self.out.extend_from_slice(text.as_bytes());
    }

    #[inline]
    fn text(&mut self, key: &str, value: &str) {
        self.out.push(b' ');
        self.word(key);
        self.out.push(b'=');
        self.word(value);
    }

    #[inline]
    fn int<I: itoa::Integer>(&mut self, key: &str, value: I) {
        self.out.push(b' ');
        self.word(key);
        self.out.push(b'=');
        let digits = self.numbers.format(value);
        self.out.extend_from_slice(digits.as_bytes());
    }
}

/// Appends `event` as one line of an event file, line end included.
pub fn write_event(out: &mut Vec<u8>, event: &Event) {
    let mut numbers = itoa::Buffer::new();
    out.extend_from_slice(numbers.format(event.seq).as_bytes());
    let mut line = Line { out, numbers };
    line.out.push(b' ');
    match event.kind {
        EventKind::Rejected { reason } => {
            line.word("rejected");
            line.text("reason", reason.name());
        }
        EventKind::AssetAdded { asset, name } => {
            line.word("asset_added");
            line.int("asset", asset);
            line.text("name", name.as_str());
        }
        EventKind::InstrumentAdded { instrument, symbol } => {
            line.word("instrument_added");
            line.int("instrument", instrument);
            line.text("symbol", symbol.as_str());
        }
        EventKind::Halted { instrument } => {
            line.word("halted");
            line.int("instrument", instrument);
        }
        EventKind::Resumed { instrument } => {
            line.word("resumed");
            line.int("instrument", instrument);
        }
        EventKind::AccountOpened { account } => {
            line.word("account_opened");
            line.int("account", account);
        }
        EventKind::Deposited { account, asset, amount } => {
            line.word("deposited");
            line.int("account", account);
            line.int("asset", asset);
            line.int("amount", amount);
        }
        EventKind::Withdrawn { account, asset, amount } => {
            line.word("withdrawn");
            line.int("account", account);
            line.int("asset", asset);
            line.int("amount", amount);
        }
        EventKind::Accepted { order, account, instrument, cid, side: s, order_type: t, tif: f, price, qty } => {
            line.word("accepted");
            line.int("order", order);
            line.int("account", account);
            line.int("instrument", instrument);
            line.int("cid", cid);
            line.text("side", side(s));
            line.text("type", order_type(t));
            line.text("tif", tif(f));
            if t == OrderType::Limit {
                line.int("price", price);
            }
            line.int("qty", qty);
        }
        EventKind::Trade {
            instrument,
            price,
            qty,
            maker,
            maker_account,
            taker,
            taker_account,
            taker_side,
            maker_fee,
            taker_fee,
            maker_remaining,
            taker_remaining,
        } => {
            line.word("trade");
            line.int("instrument", instrument);
            line.int("price", price);
            line.int("qty", qty);
            line.int("maker", maker);
            line.int("maker_account", maker_account);
            line.int("taker", taker);
            line.int("taker_account", taker_account);
            line.text("taker_side", side(taker_side));
            line.int("maker_fee", maker_fee);
            line.int("taker_fee", taker_fee);
            line.int("maker_remaining", maker_remaining);
            line.int("taker_remaining", taker_remaining);
        }
        EventKind::Cancelled { order, account, remaining, reason } => {
            line.word("cancelled");
            line.int("order", order);
            line.int("account", account);
            line.int("remaining", remaining);
            line.text("reason", reason.name());
        }
        EventKind::Replaced { order, price, qty, remaining, priority_kept } => {
            line.word("replaced");
            line.int("order", order);
            line.int("price", price);
            line.int("qty", qty);
            line.int("remaining", remaining);
            line.text("priority", if priority_kept { "kept" } else { "lost" });
        }
        EventKind::MassCancelled { account, count } => {
            line.word("mass_cancelled");
            line.int("account", account);
            line.int("count", count);
        }
        EventKind::Balance { account, asset, available, locked } => {
            line.word("balance");
            line.int("account", account);
            line.int("asset", asset);
            line.int("available", available);
            line.int("locked", locked);
        }
    }
    line.out.push(b'\n');
}
