#!/usr/bin/env python3
"""Reference model of the crossbook matching engine.

    python3 reference/model.py [--check] FILE

Reads the command file FILE (docs/formats.md) and writes the event file to
standard output, following the rules in docs/engine.md. It is written to be
obviously right rather than fast, and shares nothing with the Rust engine:
the differential tests compare the two outputs byte for byte.

A syntax error in FILE is reported as `FILE:LINE: message` on standard
error, with exit status 2 and nothing on standard output.

With --check, the invariants listed at the end of engine.md are checked
after every command; a broken one raises AssertionError naming the
command's sequence number (the events produced so far are written first).

Python 3.11, standard library only. Integers only.
"""

import re
import sys

MAX_SUPPLY = 2**62

U32_MAX = 2**32 - 1
U64_MAX = 2**64 - 1
I64_MIN = -(2**63)
I64_MAX = 2**63 - 1

FEE_ACCOUNT = 0


def ceil_div(a, b):
    """ceil(a / b) for an integer a of any sign and an integer b > 0."""
    assert b > 0
    return -((-a) // b)


# --------------------------------------------------------------------------
# Command file syntax (docs/formats.md, "Command file")
# --------------------------------------------------------------------------

class CommandSyntaxError(Exception):
    pass


NAME_RE = re.compile(r"[A-Za-z0-9_.\-]{1,16}")
SYMBOL_RE = re.compile(r"[A-Za-z0-9_.\-/]{1,32}")
UNSIGNED_RE = re.compile(r"[0-9]+")
SIGNED_RE = re.compile(r"-?[0-9]+")
BLANKS_RE = re.compile(r"[ \t]+")

ENUMS = {
    "side": ("buy", "sell"),
    "type": ("limit", "market"),
    "tif": ("gtc", "ioc", "fok"),
    "stp": ("none", "cancel_newest", "cancel_oldest", "cancel_both"),
    "post_only": ("0", "1"),
}

# verb -> {key: form}; every key is required unless it is in OPTIONAL.
FIELDS = {
    "asset": {"id": "u32", "name": "name"},
    "instrument": {
        "id": "u32", "symbol": "symbol", "base": "u32", "quote": "u32",
        "tick_size": "u64", "lot_size": "u64",
        "min_qty": "u64", "max_qty": "u64",
        "min_price": "i64", "max_price": "i64",
        "maker_bps": "i64", "taker_bps": "i64",
    },
    "open": {"account": "u64"},
    "deposit": {"account": "u64", "asset": "u32", "amount": "u64"},
    "withdraw": {"account": "u64", "asset": "u32", "amount": "u64"},
    "place": {
        "account": "u64", "instrument": "u32", "cid": "u64",
        "side": "side", "type": "type", "tif": "tif",
        "price": "i64", "qty": "u64",
        "post_only": "post_only", "stp": "stp", "budget": "u64",
    },
    "cancel": {"account": "u64", "order": "u64"},
    "replace": {"account": "u64", "order": "u64", "price": "i64", "qty": "u64"},
    "amend": {"account": "u64", "order": "u64", "qty": "u64"},
    "cancel_all": {"account": "u64", "instrument": "u32"},
    "halt": {"instrument": "u32"},
    "resume": {"instrument": "u32"},
}

# verb -> {key: default}. place's `price` is special: required for a limit
# order and forbidden for a market order (checked in parse_line).
OPTIONAL = {
    "place": {"post_only": "0", "stp": "none", "budget": None, "price": None},
    "cancel_all": {"instrument": None},
}


def parse_integer(text, lowest, highest, signed):
    pattern = SIGNED_RE if signed else UNSIGNED_RE
    if not pattern.fullmatch(text):
        raise CommandSyntaxError("not an integer: %r" % text)
    negative = text.startswith("-")
    digits = text.lstrip("-").lstrip("0")
    if len(digits) > 20:  # far out of range; also keeps int() from refusing
        raise CommandSyntaxError("integer out of range: %r" % text)
    value = int(digits) if digits else 0
    if negative:
        value = -value
    if value < lowest or value > highest:
        raise CommandSyntaxError("integer out of range: %r" % text)
    return value


def parse_value(form, text):
    if form == "u32":
        return parse_integer(text, 0, U32_MAX, signed=False)
    if form == "u64":
        return parse_integer(text, 0, U64_MAX, signed=False)
    if form == "i64":
        return parse_integer(text, I64_MIN, I64_MAX, signed=True)
    if form == "name":
        if not NAME_RE.fullmatch(text):
            raise CommandSyntaxError("bad name: %r" % text)
        return text
    if form == "symbol":
        if not SYMBOL_RE.fullmatch(text):
            raise CommandSyntaxError("bad symbol: %r" % text)
        return text
    if form in ENUMS:
        if text not in ENUMS[form]:
            raise CommandSyntaxError("bad value: %r" % text)
        return text
    raise AssertionError("unknown form " + form)


def parse_line(line):
    """Returns None for an ignored line, else (verb, {key: value})."""
    stripped = line.strip(" \t")
    if stripped == "" or stripped.startswith("#"):
        return None
    words = BLANKS_RE.split(stripped)
    verb = words[0]
    if verb not in FIELDS:
        raise CommandSyntaxError("unknown command %r" % verb)
    forms = FIELDS[verb]
    fields = {}
    for word in words[1:]:
        if "=" not in word:
            raise CommandSyntaxError("expected key=value, got %r" % word)
        key, text = word.split("=", 1)
        if key not in forms:
            raise CommandSyntaxError("unknown key %r for %s" % (key, verb))
        if key in fields:
            raise CommandSyntaxError("repeated key %r" % key)
        fields[key] = parse_value(forms[key], text)
    optional = OPTIONAL.get(verb, {})
    for key in forms:
        if key not in fields:
            if key in optional:
                fields[key] = optional[key]
            else:
                raise CommandSyntaxError("missing key %r" % key)
    if verb == "place":
        if fields["type"] == "limit" and fields["price"] is None:
            raise CommandSyntaxError("a limit order needs a price")
        if fields["type"] == "market" and fields["price"] is not None:
            raise CommandSyntaxError("a market order takes no price")
        fields["post_only"] = fields["post_only"] == "1"
    return verb, fields


def parse_file(path):
    """Returns a list of (verb, fields); raises CommandSyntaxError with the
    message already prefixed by FILE:LINE."""
    with open(path, "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the "\n" that ends the last line
    commands = []
    for number, raw in enumerate(lines, start=1):
        try:
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise CommandSyntaxError("not UTF-8") from None
            if line.endswith("\r"):
                line = line[:-1]  # a CRLF line end
            command = parse_line(line)
        except CommandSyntaxError as e:
            raise CommandSyntaxError("%s:%d: %s" % (path, number, e)) from None
        if command is not None:
            commands.append(command)
    return commands


# --------------------------------------------------------------------------
# The engine
# --------------------------------------------------------------------------

class Instrument:
    def __init__(self, f):
        self.id = f["id"]
        self.symbol = f["symbol"]
        self.base = f["base"]
        self.quote = f["quote"]
        self.tick_size = f["tick_size"]
        self.lot_size = f["lot_size"]
        self.min_qty = f["min_qty"]
        self.max_qty = f["max_qty"]
        self.min_price = f["min_price"]
        self.max_price = f["max_price"]
        self.maker_bps = f["maker_bps"]
        self.taker_bps = f["taker_bps"]
        # side -> {price: [orders, oldest first]}
        self.book = {"buy": {}, "sell": {}}
        self.halted = False

    def unit_lock(self, price):
        """Quote units locked per lot by a limit buy at `price`."""
        value = price * self.tick_size
        return value + ceil_div(value * self.taker_bps, 10000)

    def taker_cost(self, price, qty):
        """What a taker buy pays for qty lots at price: N + taker_fee."""
        notional = price * qty * self.tick_size
        return notional + ceil_div(notional * self.taker_bps, 10000)

    def taker_proceeds(self, price, qty):
        """What a taker sell receives for qty lots at price: N - taker_fee."""
        notional = price * qty * self.tick_size
        return notional - ceil_div(notional * self.taker_bps, 10000)

    def best_price(self, side):
        """Best price on `side` (highest bid, lowest ask), None if empty."""
        levels = self.book[side]
        if not levels:
            return None
        if side == "buy":
            return max(levels)
        return min(levels)


class Order:
    def __init__(self, order_id, account, instrument, f):
        self.id = order_id
        self.account = account
        self.instrument = instrument
        self.cid = f["cid"]
        self.side = f["side"]
        self.type = f["type"]
        self.tif = f["tif"]
        self.price = f["price"]  # None for a market order
        self.qty = f["qty"]
        self.filled = 0
        self.remaining = f["qty"]
        self.post_only = f["post_only"]
        self.stp = f["stp"]
        self.budget = f["budget"]
        self.unspent = 0  # a market buy's budget lock not yet spent


def opposite(side):
    return "sell" if side == "buy" else "buy"


class Engine:
    def __init__(self, check=False):
        self.check = check
        self.assets = {}  # id -> name
        self.instruments = {}  # id -> Instrument
        self.accounts = {FEE_ACCOUNT}
        self.balances = {}  # (account, asset) -> [available, locked]
        self.supply = {}  # asset -> deposits minus withdrawals
        self.orders = {}  # id -> Order, resting orders only
        self.out = []  # event lines
        self.seq = 0
        self.before = {}  # (account, asset) -> (available, locked) at start

    # ---- events and balances ------------------------------------------

    def emit(self, kind, *pairs):
        parts = [str(self.seq), kind]
        for key, value in pairs:
            parts.append("%s=%s" % (key, value))
        self.out.append(" ".join(parts) + "\n")

    def available(self, account, asset):
        return self.balances.get((account, asset), [0, 0])[0]

    def balance(self, account, asset):
        """The [available, locked] pair, to be changed in place; records
        its value at the start of the command the first time it is used."""
        key = (account, asset)
        if key not in self.balances:
            self.balances[key] = [0, 0]
        pair = self.balances[key]
        if key not in self.before:
            self.before[key] = (pair[0], pair[1])
        return pair

    def add_available(self, account, asset, amount):
        pair = self.balance(account, asset)
        pair[0] += amount
        assert pair[0] >= 0, "seq %d: negative available" % self.seq

    def add_locked(self, account, asset, amount):
        pair = self.balance(account, asset)
        pair[1] += amount
        assert pair[1] >= 0, "seq %d: negative locked" % self.seq

    def lock(self, account, asset, amount):
        self.add_available(account, asset, -amount)
        self.add_locked(account, asset, amount)

    def unlock(self, account, asset, amount):
        self.add_locked(account, asset, -amount)
        self.add_available(account, asset, amount)

    def emit_balances(self):
        for key in sorted(self.before):
            now = tuple(self.balances[key])
            if now != self.before[key]:
                self.emit("balance", ("account", key[0]), ("asset", key[1]),
                          ("available", now[0]), ("locked", now[1]))

    # ---- orders -----------------------------------------------------------

    def resting_lock(self, order):
        """(asset, amount) that a resting (limit) order has locked."""
        inst = self.instruments[order.instrument]
        if order.side == "buy":
            return inst.quote, order.remaining * inst.unit_lock(order.price)
        return inst.base, order.remaining * inst.lot_size

    def release_taker(self, order):
        """Release what a taker that will not rest still has locked."""
        inst = self.instruments[order.instrument]
        if order.type == "market" and order.side == "buy":
            self.unlock(order.account, inst.quote, order.unspent)
            order.unspent = 0
        else:
            asset, amount = self.resting_lock(order)
            self.unlock(order.account, asset, amount)

    def rest(self, order):
        levels = self.instruments[order.instrument].book[order.side]
        levels.setdefault(order.price, []).append(order)
        self.orders[order.id] = order

    def unlink(self, order):
        """Take a resting order out of its queue (and the level if empty)."""
        levels = self.instruments[order.instrument].book[order.side]
        queue = levels[order.price]
        queue.remove(order)
        if not queue:
            del levels[order.price]

    def cancel_resting(self, order, reason):
        self.unlink(order)
        del self.orders[order.id]
        asset, amount = self.resting_lock(order)
        self.unlock(order.account, asset, amount)
        self.emit("cancelled", ("order", order.id), ("account", order.account),
                  ("remaining", order.remaining), ("reason", reason))

    def has_open_cid(self, account, cid):
        for order in self.orders.values():
            if order.account == account and order.cid == cid:
                return True
        return False

    # ---- matching ---------------------------------------------------------

    def affordable(self, inst, price, most, budget):
        """Largest q in 0..=most with taker_cost(price, q) <= budget."""
        if inst.taker_cost(price, most) <= budget:
            return most
        low, high = 0, most  # cost(low) <= budget < cost(high)
        while high - low > 1:
            middle = (low + high) // 2
            if inst.taker_cost(price, middle) <= budget:
                low = middle
            else:
                high = middle
        return low

    def settle(self, inst, maker, taker, qty):
        price = maker.price
        notional = price * qty * inst.tick_size
        base_units = qty * inst.lot_size
        maker_fee = ceil_div(notional * inst.maker_bps, 10000)
        taker_fee = ceil_div(notional * inst.taker_bps, 10000)
        if taker.side == "buy":
            buyer, buyer_fee, seller, seller_fee = taker, taker_fee, maker, maker_fee
        else:
            buyer, buyer_fee, seller, seller_fee = maker, maker_fee, taker, taker_fee

        self.add_locked(seller.account, inst.base, -base_units)
        self.add_available(seller.account, inst.quote, notional - seller_fee)

        self.add_available(buyer.account, inst.base, base_units)
        if buyer.type == "limit":
            locked = qty * inst.unit_lock(buyer.price)
            self.add_locked(buyer.account, inst.quote, -locked)
            self.add_available(buyer.account, inst.quote,
                               locked - (notional + buyer_fee))
        else:
            self.add_locked(buyer.account, inst.quote, -(notional + buyer_fee))
            buyer.unspent -= notional + buyer_fee
            assert buyer.unspent >= 0

        self.add_available(FEE_ACCOUNT, inst.quote, maker_fee + taker_fee)

        for order in (maker, taker):
            order.filled += qty
            order.remaining -= qty
        self.emit("trade", ("instrument", inst.id), ("price", price),
                  ("qty", qty), ("maker", maker.id),
                  ("maker_account", maker.account), ("taker", taker.id),
                  ("taker_account", taker.account),
                  ("taker_side", taker.side), ("maker_fee", maker_fee),
                  ("taker_fee", taker_fee),
                  ("maker_remaining", maker.remaining),
                  ("taker_remaining", taker.remaining))

    def match(self, taker):
        """The matching loop; returns True if the taker is stp-stopped."""
        inst = self.instruments[taker.instrument]
        other = opposite(taker.side)
        levels = inst.book[other]
        while taker.remaining > 0:
            # 1. stop on an empty side or a best price that does not cross
            best = inst.best_price(other)
            if best is None:
                return False
            if taker.type == "limit":
                if taker.side == "buy" and best > taker.price:
                    return False
                if taker.side == "sell" and best < taker.price:
                    return False
            # 2. the oldest order at the best level
            maker = levels[best][0]
            # 3. self-trade prevention
            if maker.account == taker.account and taker.stp != "none":
                if taker.stp == "cancel_newest":
                    return True
                if taker.stp == "cancel_oldest":
                    self.cancel_resting(maker, "stp")
                    continue
                if taker.stp == "cancel_both":
                    self.cancel_resting(maker, "stp")
                    return True
                raise AssertionError(taker.stp)
            # 4. quantity
            qty = min(maker.remaining, taker.remaining)
            if taker.type == "market" and taker.side == "buy":
                qty = self.affordable(inst, best, qty, taker.unspent)
            if qty == 0:
                return False
            # 5. settle; a filled maker leaves the book
            self.settle(inst, maker, taker, qty)
            if maker.remaining == 0:
                self.unlink(maker)
                del self.orders[maker.id]
        return False

    def finish_taker(self, order, stopped):
        """What happens to a taker after the matching loop (place)."""
        if order.remaining > 0:
            if stopped:
                self.emit("cancelled", ("order", order.id),
                          ("account", order.account),
                          ("remaining", order.remaining), ("reason", "stp"))
                self.release_taker(order)
            elif order.type == "limit" and order.tif == "gtc":
                self.rest(order)
            else:
                self.emit("cancelled", ("order", order.id),
                          ("account", order.account),
                          ("remaining", order.remaining), ("reason", "ioc"))
                self.release_taker(order)
        if order.type == "market" and order.side == "buy":
            self.release_taker(order)  # whatever is left of the budget

    def fok_can_fill(self, inst, account, f, budget):
        """Check 12 of place: can this FOK order fill completely now?"""
        side = f["side"]
        levels = inst.book[opposite(side)]
        prices = sorted(levels, reverse=(side == "sell"))  # priority order
        market_buy = f["type"] == "market" and side == "buy"
        min_proceeds = f["budget"] if f["type"] == "market" and side == "sell" else None
        needed = f["qty"]
        cost = 0
        received = 0
        for price in prices:
            if f["type"] == "limit":
                if side == "buy" and price > f["price"]:
                    break
                if side == "sell" and price < f["price"]:
                    break
            for maker in levels[price]:
                if needed == 0:
                    break
                if maker.account == account and f["stp"] != "none":
                    if f["stp"] == "cancel_oldest":
                        continue  # skipped
                    return False  # cancel_newest, cancel_both: walk ends
                step = min(maker.remaining, needed)
                if market_buy:
                    cost += inst.taker_cost(price, step)
                if min_proceeds is not None:
                    received += inst.taker_proceeds(price, step)
                needed -= step
            if needed == 0:
                break
        if needed > 0:
            return False
        if market_buy and cost > budget:
            return False
        if min_proceeds is not None and received < min_proceeds:
            return False
        return True

    # ---- commands -----------------------------------------------------------

    def run(self, commands):
        for verb, f in commands:
            self.seq += 1
            self.before = {}
            reason = getattr(self, "do_" + verb)(f)
            if reason is not None:
                assert not self.before, "seq %d: a rejected command changed state" % self.seq
                self.emit("rejected", ("reason", reason))
            else:
                self.emit_balances()
            if self.check:
                self.check_invariants()

    def do_asset(self, f):
        if f["id"] in self.assets or f["name"] in self.assets.values():
            return "duplicate_asset"
        self.assets[f["id"]] = f["name"]
        self.supply[f["id"]] = 0
        self.emit("asset_added", ("asset", f["id"]), ("name", f["name"]))

    def do_instrument(self, f):
        if f["id"] in self.instruments or any(
                i.symbol == f["symbol"] for i in self.instruments.values()):
            return "duplicate_instrument"
        if f["base"] not in self.assets or f["quote"] not in self.assets:
            return "unknown_asset"
        if (f["base"] == f["quote"]
                or f["tick_size"] == 0
                or f["lot_size"] == 0
                or f["min_qty"] == 0
                or f["min_qty"] > f["max_qty"]
                or f["min_price"] < 1
                or f["min_price"] > f["max_price"]
                or f["taker_bps"] < 0
                or f["taker_bps"] > 10000
                or f["maker_bps"] > f["taker_bps"]
                or f["maker_bps"] + f["taker_bps"] < 0
                or f["max_price"] * f["max_qty"] * f["tick_size"] > MAX_SUPPLY
                or f["max_qty"] * f["lot_size"] > MAX_SUPPLY):
            return "invalid_instrument"
        self.instruments[f["id"]] = Instrument(f)
        self.emit("instrument_added", ("instrument", f["id"]),
                  ("symbol", f["symbol"]))

    def do_open(self, f):
        if f["account"] in self.accounts:
            return "duplicate_account"
        self.accounts.add(f["account"])
        self.emit("account_opened", ("account", f["account"]))

    def do_deposit(self, f):
        account, asset, amount = f["account"], f["asset"], f["amount"]
        if account not in self.accounts:
            return "unknown_account"
        if asset not in self.assets:
            return "unknown_asset"
        if amount == 0:
            return "invalid_amount"
        if self.supply[asset] + amount > MAX_SUPPLY:
            return "balance_overflow"
        self.supply[asset] += amount
        self.add_available(account, asset, amount)
        self.emit("deposited", ("account", account), ("asset", asset),
                  ("amount", amount))

    def do_withdraw(self, f):
        account, asset, amount = f["account"], f["asset"], f["amount"]
        if account not in self.accounts:
            return "unknown_account"
        if asset not in self.assets:
            return "unknown_asset"
        if amount == 0:
            return "invalid_amount"
        if amount > self.available(account, asset):
            return "insufficient_funds"
        self.supply[asset] -= amount
        self.add_available(account, asset, -amount)
        self.emit("withdrawn", ("account", account), ("asset", asset),
                  ("amount", amount))

    def do_place(self, f):
        account = f["account"]
        side, type_, tif, price, qty = (f["side"], f["type"], f["tif"],
                                        f["price"], f["qty"])
        market_buy = type_ == "market" and side == "buy"
        # 1-3
        if account not in self.accounts:
            return "unknown_account"
        if account == FEE_ACCOUNT:
            return "fee_account"
        if f["instrument"] not in self.instruments:
            return "unknown_instrument"
        inst = self.instruments[f["instrument"]]
        # 4
        if type_ == "market" and tif == "gtc":
            return "invalid_time_in_force"
        if f["post_only"] and not (type_ == "limit" and tif == "gtc"):
            return "invalid_time_in_force"
        # 5
        if f["budget"] is not None and (type_ != "market" or f["budget"] == 0
                                        or (side == "sell" and tif != "fok")):
            return "invalid_budget"
        # 6
        if inst.halted:
            return "instrument_halted"
        if qty == 0 or qty < inst.min_qty or qty > inst.max_qty:
            return "invalid_quantity"
        # 7-8
        if type_ == "limit" and price <= 0:
            return "invalid_price"
        if type_ == "limit" and (price < inst.min_price or price > inst.max_price):
            return "price_out_of_band"
        # 9
        if self.has_open_cid(account, f["cid"]):
            return "duplicate_client_order_id"
        # 10
        if side == "buy" and type_ == "limit":
            lock_asset, lock = inst.quote, qty * inst.unit_lock(price)
            if lock > self.available(account, inst.quote):
                return "insufficient_funds"
        elif side == "sell":
            lock_asset, lock = inst.base, qty * inst.lot_size
            if lock > self.available(account, inst.base):
                return "insufficient_funds"
        else:  # market buy
            available = self.available(account, inst.quote)
            if f["budget"] is not None:
                lock_asset, lock = inst.quote, f["budget"]
                if f["budget"] > available:
                    return "insufficient_funds"
            else:
                lock_asset, lock = inst.quote, available
                if available == 0:
                    return "insufficient_funds"
        # 11
        if f["post_only"]:
            if side == "buy":
                best_ask = inst.best_price("sell")
                if best_ask is not None and best_ask <= price:
                    return "post_only_would_take"
            else:
                best_bid = inst.best_price("buy")
                if best_bid is not None and best_bid >= price:
                    return "post_only_would_take"
        # 12 (for a market buy, `lock` is the budget the walk may spend)
        if tif == "fok" and not self.fok_can_fill(inst, account, f, lock):
            return "fok_cannot_fill"

        order = Order(self.seq, account, inst.id, f)
        self.lock(account, lock_asset, lock)
        if market_buy:
            order.unspent = lock
        pairs = [("order", order.id), ("account", account),
                 ("instrument", inst.id), ("cid", order.cid), ("side", side),
                 ("type", type_), ("tif", tif)]
        if type_ == "limit":
            pairs.append(("price", price))
        pairs.append(("qty", qty))
        self.emit("accepted", *pairs)
        stopped = self.match(order)
        self.finish_taker(order, stopped)
        if tif == "fok":
            assert order.remaining == 0, "seq %d: FOK did not fill" % self.seq

    def owned_order(self, f):
        """Checks 1-3 of cancel, replace and amend: (order, None), or
        (None, reason)."""
        if f["account"] not in self.accounts:
            return None, "unknown_account"
        if f["order"] not in self.orders:
            return None, "unknown_order"
        order = self.orders[f["order"]]
        if order.account != f["account"]:
            return None, "not_owner"
        return order, None

    def do_cancel(self, f):
        order, refused = self.owned_order(f)
        if refused:
            return refused
        self.cancel_resting(order, "user")

    def do_amend(self, f):
        qty = f["qty"]
        # 1-3
        order, refused = self.owned_order(f)
        if refused:
            return refused
        # 4
        if qty <= order.filled:
            self.cancel_resting(order, "replace")
            return None
        # 5: only ever lower, never under the instrument's minimum
        inst = self.instruments[order.instrument]
        if qty > order.qty or qty < inst.min_qty:
            return "invalid_quantity"
        lock_asset, old_lock = self.resting_lock(order)
        order.qty = qty
        order.remaining = qty - order.filled
        _, new_lock = self.resting_lock(order)
        self.unlock(order.account, lock_asset, old_lock - new_lock)
        self.emit("replaced", ("order", order.id), ("price", order.price),
                  ("qty", qty), ("remaining", order.remaining),
                  ("priority", "kept"))
        return None

    def do_replace(self, f):
        price, qty = f["price"], f["qty"]
        # 1-3
        order, refused = self.owned_order(f)
        if refused:
            return refused
        # 4
        if qty <= order.filled:
            self.cancel_resting(order, "replace")
            return None
        inst = self.instruments[order.instrument]
        # 5-7
        if inst.halted and not (price == order.price and qty < order.qty):
            return "instrument_halted"
        if qty < inst.min_qty or qty > inst.max_qty:
            return "invalid_quantity"
        if price <= 0:
            return "invalid_price"
        if price < inst.min_price or price > inst.max_price:
            return "price_out_of_band"
        # 8
        lock_asset, old_lock = self.resting_lock(order)
        if order.side == "buy":
            new_lock = (qty - order.filled) * inst.unit_lock(price)
        else:
            new_lock = (qty - order.filled) * inst.lot_size
        if new_lock - old_lock > self.available(order.account, lock_asset):
            return "insufficient_funds"
        # 9
        if order.post_only:
            if order.side == "buy":
                best_ask = inst.best_price("sell")
                if best_ask is not None and best_ask <= price:
                    return "post_only_would_take"
            else:
                best_bid = inst.best_price("buy")
                if best_bid is not None and best_bid >= price:
                    return "post_only_would_take"

        self.lock(order.account, lock_asset, new_lock - old_lock)
        if price == order.price and qty <= order.qty:
            order.qty = qty
            order.remaining = qty - order.filled
            self.emit("replaced", ("order", order.id), ("price", price),
                      ("qty", qty), ("remaining", order.remaining),
                      ("priority", "kept"))
            return None
        self.unlink(order)
        del self.orders[order.id]
        order.price = price
        order.qty = qty
        order.remaining = qty - order.filled
        self.emit("replaced", ("order", order.id), ("price", price),
                  ("qty", qty), ("remaining", order.remaining),
                  ("priority", "lost"))
        stopped = self.match(order)
        if order.remaining > 0:
            if stopped:
                self.emit("cancelled", ("order", order.id),
                          ("account", order.account),
                          ("remaining", order.remaining), ("reason", "stp"))
                self.release_taker(order)
            else:
                self.rest(order)
        return None

    def do_cancel_all(self, f):
        account, instrument = f["account"], f["instrument"]
        if account not in self.accounts:
            return "unknown_account"
        if instrument is not None and instrument not in self.instruments:
            return "unknown_instrument"
        ids = sorted(order.id for order in self.orders.values()
                     if order.account == account
                     and (instrument is None or order.instrument == instrument))
        for order_id in ids:
            self.cancel_resting(self.orders[order_id], "cancel_all")
        self.emit("mass_cancelled", ("account", account), ("count", len(ids)))

    def do_halt(self, f):
        inst = self.instruments.get(f["instrument"])
        if inst is None:
            return "unknown_instrument"
        if inst.halted:
            return "instrument_halted"
        inst.halted = True
        self.emit("halted", ("instrument", f["instrument"]))

    def do_resume(self, f):
        inst = self.instruments.get(f["instrument"])
        if inst is None:
            return "unknown_instrument"
        if not inst.halted:
            return "not_halted"
        inst.halted = False
        self.emit("resumed", ("instrument", f["instrument"]))

    # ---- invariants (--check) ---------------------------------------------

    def check_invariants(self):
        seq = self.seq

        def fail(what):
            raise AssertionError("seq %d: invariant broken: %s" % (seq, what))

        expected_locks = {}  # (account, asset) -> sum of resting locks
        seen = set()
        for inst in self.instruments.values():
            for side, levels in inst.book.items():
                for price, queue in levels.items():
                    if not queue:
                        fail("empty level %d %s %d" % (inst.id, side, price))
                    for order in queue:
                        if order.id in seen:
                            fail("order %d twice in the books" % order.id)
                        seen.add(order.id)
                        if self.orders.get(order.id) is not order:
                            fail("order %d in a book but not open" % order.id)
                        if (order.instrument != inst.id or order.side != side
                                or order.price != price):
                            fail("order %d in the wrong level" % order.id)
                        if order.type != "limit" or order.tif != "gtc":
                            fail("order %d rests but is not limit gtc" % order.id)
                        if not order.remaining > 0:
                            fail("order %d rests with nothing left" % order.id)
                        if order.filled + order.remaining != order.qty:
                            fail("order %d: filled + remaining != qty" % order.id)
                        asset, amount = self.resting_lock(order)
                        key = (order.account, asset)
                        expected_locks[key] = expected_locks.get(key, 0) + amount
            bid, ask = inst.best_price("buy"), inst.best_price("sell")
            if bid is not None and ask is not None and not bid < ask:
                fail("book %d crossed: bid %d >= ask %d" % (inst.id, bid, ask))
        if seen != set(self.orders):
            fail("open orders not in a book: %s" % sorted(set(self.orders) - seen))

        cids = set()
        for order in self.orders.values():
            if (order.account, order.cid) in cids:
                fail("account %d has two open orders with cid %d"
                     % (order.account, order.cid))
            cids.add((order.account, order.cid))

        totals = {}
        for key, (available, locked) in self.balances.items():
            if available < 0 or locked < 0:
                fail("negative balance %s" % (key,))
            if locked != expected_locks.get(key, 0):
                fail("%s locked %d, resting orders lock %d"
                     % (key, locked, expected_locks.get(key, 0)))
            totals[key[1]] = totals.get(key[1], 0) + available + locked
        for key in expected_locks:
            if key not in self.balances:
                fail("resting lock with no balance %s" % (key,))
        for asset, supply in self.supply.items():
            if totals.get(asset, 0) != supply:
                fail("asset %d: balances total %d, deposits - withdrawals %d"
                     % (asset, totals.get(asset, 0), supply))
            if supply > MAX_SUPPLY:
                fail("asset %d above MAX_SUPPLY" % asset)


# --------------------------------------------------------------------------

def write_out(lines):
    chunk = 4096
    for start in range(0, len(lines), chunk):
        sys.stdout.write("".join(lines[start:start + chunk]))
    sys.stdout.flush()


def main(argv):
    args = argv[1:]
    check = False
    if args and args[0] == "--check":
        check = True
        args = args[1:]
    if len(args) != 1:
        sys.stderr.write("usage: model.py [--check] FILE\n")
        return 2
    path = args[0]
    try:
        commands = parse_file(path)
    except CommandSyntaxError as e:
        sys.stderr.write("%s\n" % e)
        return 2
    except OSError as e:
        sys.stderr.write("%s: %s\n" % (path, e.strerror))
        return 2
    engine = Engine(check=check)
    try:
        engine.run(commands)
    except AssertionError:
        write_out(engine.out)  # the events up to the failure, for diagnosis
        raise
    write_out(engine.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
