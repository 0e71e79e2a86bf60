"""Binance's signed REST API, driven by real client libraries.

Starts `crossbook serve` on free ports with a fresh data directory and
trades on it with ccxt's `binance` class, configured the way a user points
it at a Binance-compatible host (its `urls['api']` replaced by the venue's),
as accounts 3 and 4 trading with each other: limit orders that rest, market
orders by quantity and by cost, a limit order that crosses, post-only,
cancels, edit_order (cancel-replace), open orders, order queries, balances and own trades, the book, the
ticker, candles and public trades afterwards. Every answer is checked
against what the venue's rules say it must be (prices, quantities, fees and
their rounding, order states, locks, balance changes), and the error
mapping too (InsufficientFunds, OrderNotFound, BadSymbol,
OrderImmediatelyFillable, AuthenticationError). Then python-binance's
`Client`, as account 6, places, queries and cancels an order. Last, the
server is stopped and its journal replayed by the engine (`crossbook
journal inspect` + `crossbook run`): every trade ccxt saw must be a `trade`
event with the same price, quantity and fees, and the final balances of
the accounts must be the engine's. Ends with "N passed, M failed".

    scripts/trading-test [--binary target/release/crossbook]
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request

import ccxt
from binance.client import Client
from binance.exceptions import BinanceAPIException

from servetest import Checks, OutOfTime, start_server, time_limit

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SYMBOL = "BTC/USD"          # ccxt's symbol of the default venue's BTC-USD
BINANCE_SYMBOL = "BTCUSD"   # its Binance symbol
# The default configuration (crossbook.toml, also what `serve` runs without
# --config): every demo account starts with these deposits, BTC (asset 1)
# and USD (asset 2) both with 0 decimals, tick 1, lot 1, maker -1 bps (a
# rebate), taker 5 bps, fees in USD.
DEPOSIT = {"BTC": 1099511627776, "USD": 1125899906842624}
ASSET_ID = {"BTC": 1, "USD": 2}
MAKER_BPS, TAKER_BPS = -1, 5
A, B, POOR, PYB = 3, 4, 5, 6   # the two ccxt traders, the one short of funds, python-binance's
TIME_LIMIT_S = 300             # the whole run
HTTP_TIMEOUT_S = 10            # every request


def fee(notional, bps):
    """docs/engine.md: a fee is rounded up, a rebate toward zero."""
    if bps >= 0:
        return -(-notional * bps // 10000)
    return -(notional * -bps // 10000)


def unit_lock(price):
    """docs/engine.md "Locks": a limit buy locks qty * unit_lock(price) (tick 1)."""
    return price + fee(price, TAKER_BPS)


def ccxt_client(market, account, key=None, secret=None):
    """ccxt.binance pointed at the venue, the documented way."""
    base = f"http://{market}"
    exchange = ccxt.binance({
        "apiKey": key or f"demo-key-{account}",
        "secret": secret or f"demo-secret-{account}",
        "enableRateLimit": False,
        "timeout": HTTP_TIMEOUT_S * 1000,
        "options": {
            "defaultType": "spot",
            "fetchMarkets": {"types": ["spot"]},
            "fetchCurrencies": False,
            "fetchMargins": False,
            "fetchOpenOrders": {"warnWithoutSymbol": False},
        },
    })
    exchange.urls["api"] = {
        "public": base + "/api/v3",
        "private": base + "/api/v3",
        "v1": base + "/api/v1",
        "sapi": base + "/sapi/v1",
    }
    return exchange


def python_binance_client(market, account):
    class VenueClient(Client):
        API_URL = f"http://{market}/api"
    return VenueClient(f"demo-key-{account}", f"demo-secret-{account}", requests_params={"timeout": HTTP_TIMEOUT_S})


# ---------------------------------------------------------------------------
# The ccxt part


class Trade:
    """One expected fill: the taker's order (by name), the maker's, price, qty."""

    def __init__(self, taker, taker_account, taker_side, maker, maker_account, price, qty):
        self.taker, self.taker_account, self.taker_side = taker, taker_account, taker_side
        self.maker, self.maker_account = maker, maker_account
        self.price, self.qty = price, qty
        self.cost = price * qty
        self.taker_fee = fee(self.cost, TAKER_BPS)
        self.maker_fee = fee(self.cost, MAKER_BPS)

    def seen_by(self, account):
        """What fetch_my_trades of `account` must say about it."""
        if account == self.taker_account:
            return {"order": self.taker, "side": self.taker_side, "takerOrMaker": "taker", "fee": self.taker_fee}
        return {"order": self.maker, "side": "sell" if self.taker_side == "buy" else "buy", "takerOrMaker": "maker", "fee": self.maker_fee}


def balance_of(exchange):
    balance = exchange.fetch_balance()
    return {asset: {k: balance[asset][k] for k in ("free", "used", "total")} for asset in ("BTC", "USD")}


def check_order(checks, name, order, **wanted):
    got = {k: order.get(k) for k in wanted}
    checks.check(f"{name}: " + ", ".join(f"{k}={v}" for k, v in wanted.items()), got == wanted,
                 f"got {got}; info {order.get('info')}")


def check_fills(checks, name, order, expected):
    """The fills of a new order's FULL answer, against the expected trades."""
    fills = [(t["price"], t["amount"], t["cost"], (t.get("fee") or {}).get("cost"), (t.get("fee") or {}).get("currency"))
             for t in order.get("trades") or []]
    wanted = [(e.price, e.qty, e.cost, e.taker_fee, "USD") for e in expected]
    checks.check(f"{name}: fills (price, amount, cost, fee, currency) {wanted}", fills == wanted, f"got {fills}")
    total_fee = sum(e.taker_fee for e in expected)
    got_fee = order.get("fee") or {}
    checks.check(f"{name}: order fee {total_fee} USD", (got_fee.get("cost"), got_fee.get("currency")) == (total_fee, "USD"), f"got {got_fee}")


def ccxt_part(checks, market, state):
    a = ccxt_client(market, A)
    b = ccxt_client(market, B)
    ids = state["ids"]           # our name of an order -> its id
    expected = state["expected"]  # the fills, in order

    def load():
        markets = a.load_markets()
        b.load_markets()
        m = markets.get(SYMBOL)
        checks.check(f"load_markets: {SYMBOL} is a spot market", m is not None and m["spot"] and m["active"], f"markets: {list(markets)}")
        if m:
            got = (m["id"], m["base"], m["quote"], m["precision"]["amount"], m["precision"]["price"],
                   m["limits"]["amount"]["min"], m["limits"]["amount"]["max"], m["limits"]["price"]["min"], m["limits"]["price"]["max"])
            checks.equal("load_markets: id, base, quote, precision, limits are the instrument's",
                         got, (BINANCE_SYMBOL, "BTC", "USD", 1, 1, 1, 1000000, 1, 10000000))
    checks.run("load_markets", load)

    def empty_book():
        book = a.fetch_order_book(SYMBOL)
        checks.check("fetch_order_book: a fresh venue's book is empty", book["bids"] == [] and book["asks"] == [], f"got {book}")
    checks.run("fetch_order_book (fresh)", empty_book)

    def initial_balances():
        for name, ex in (("A", a), ("B", b)):
            bal = balance_of(ex)
            state[f"start_{name}"] = bal
            want = {asset: {"free": DEPOSIT[asset], "used": 0, "total": DEPOSIT[asset]} for asset in DEPOSIT}
            checks.equal(f"fetch_balance: account {A if name == 'A' else B} starts with its deposits", bal, want)
    checks.run("fetch_balance (start)", initial_balances)

    # Two asks from A, a bid from B: they rest.
    def rest_orders():
        o = a.create_order(SYMBOL, "limit", "sell", 5, 20001)
        ids["A1"] = o["id"]
        check_order(checks, "create_order limit sell 5 @ 20001 rests", o, symbol=SYMBOL, type="limit", side="sell",
                    price=20001, amount=5, filled=0, remaining=5, status="open")
        o = a.create_order(SYMBOL, "limit", "sell", 4, 20005)
        ids["A2"] = o["id"]
        check_order(checks, "create_order limit sell 4 @ 20005 rests", o, symbol=SYMBOL, type="limit", side="sell",
                    price=20005, amount=4, filled=0, remaining=4, status="open")
        o = b.create_order(SYMBOL, "limit", "buy", 3, 18001)
        ids["B1"] = o["id"]
        check_order(checks, "create_order limit buy 3 @ 18001 rests", o, symbol=SYMBOL, type="limit", side="buy",
                    price=18001, amount=3, filled=0, remaining=3, status="open")
    checks.run("create_order (resting)", rest_orders)

    def locks():
        bal = balance_of(a)
        start = state["start_A"]
        checks.equal("fetch_balance: two resting sells lock 5 + 4 BTC (free/used)",
                     (bal["BTC"]["free"], bal["BTC"]["used"], bal["USD"]["used"]), (start["BTC"]["total"] - 9, 9, 0))
        bal = balance_of(b)
        start = state["start_B"]
        lock = 3 * unit_lock(18001)
        checks.equal(f"fetch_balance: a resting buy 3 @ 18001 locks 3 * (18001 + ceil(18001 * 5 / 10000)) = {lock} USD (free/used)",
                     (bal["USD"]["free"], bal["USD"]["used"], bal["BTC"]["used"]), (start["USD"]["total"] - lock, lock, 0))
        # Per lot: 3 * (18001 + 10) = 54033, not 54003 + ceil(27.0015) = 54031.
    checks.run("fetch_balance (locks)", locks)

    def book_with_orders():
        book = a.fetch_order_book(SYMBOL)
        checks.equal("fetch_order_book: the resting orders", (book["bids"], book["asks"]), ([[18001, 3]], [[20001, 5], [20005, 4]]))
    checks.run("fetch_order_book (resting)", book_with_orders)

    # B takes by quantity: all of A1 and 2 of A2.
    def market_by_amount():
        e1 = Trade("B2", B, "buy", "A1", A, 20001, 5)
        e2 = Trade("B2", B, "buy", "A2", A, 20005, 2)
        expected.extend([e1, e2])
        o = b.create_order(SYMBOL, "market", "buy", 7)
        ids["B2"] = o["id"]
        cost = e1.cost + e2.cost
        check_order(checks, "create_order market buy 7", o, symbol=SYMBOL, type="market", side="buy", amount=7, filled=7,
                    remaining=0, cost=cost, status="closed")
        checks.check(f"create_order market buy 7: average {cost}/7", abs((o.get("average") or 0) - cost / 7) < 1e-9, f"got {o.get('average')}")
        check_fills(checks, "create_order market buy 7", o, [e1, e2])
    checks.run("create_order market by amount", market_by_amount)

    # B takes by cost: 30000 USD buys one lot at 20005 (20005 + 11 fee), not two.
    def market_by_cost():
        e3 = Trade("B3", B, "buy", "A2", A, 20005, 1)
        expected.append(e3)
        o = b.create_market_buy_order_with_cost(SYMBOL, 30000)
        ids["B3"] = o["id"]
        check_fills(checks, "create_market_buy_order_with_cost 30000", o, [e3])
        checks.check("create_market_buy_order_with_cost 30000: cost + fee within 30000, one more lot would not be",
                     o.get("cost") == e3.cost and e3.cost + e3.taker_fee <= 30000 < 2 * e3.cost + fee(2 * e3.cost, TAKER_BPS),
                     f"cost {o.get('cost')}")
        # Binance: a quoteOrderQty market order executes the quantity the
        # quote amount buys (liquidity is left here: 1 lot at 20005), so it
        # is FILLED with origQty = executedQty.
        check_order(checks, "create_market_buy_order_with_cost 30000 (liquidity left)", o, symbol=SYMBOL, type="market", side="buy",
                    filled=1, amount=1, remaining=0, status="closed")
    checks.run("create_market_buy_order_with_cost", market_by_cost)

    # A sells into B's bid: A is the taker, B1 is partly filled.
    def crossing_limit():
        e4 = Trade("A3", A, "sell", "B1", B, 18001, 2)
        expected.append(e4)
        o = a.create_order(SYMBOL, "limit", "sell", 2, 18001)
        ids["A3"] = o["id"]
        check_order(checks, "create_order limit sell 2 @ 18001 crosses the bid", o, symbol=SYMBOL, type="limit", side="sell",
                    price=18001, amount=2, filled=2, remaining=0, cost=e4.cost, status="closed")
        check_fills(checks, "create_order limit sell 2 @ 18001", o, [e4])
    checks.run("create_order crossing limit", crossing_limit)

    def orders_after_trades():
        check_order(checks, "fetch_order: the first ask is filled", a.fetch_order(ids["A1"], SYMBOL),
                    id=ids["A1"], status="closed", filled=5, remaining=0, amount=5, cost=100005, price=20001, side="sell")
        check_order(checks, "fetch_order: the second ask is partly filled", a.fetch_order(ids["A2"], SYMBOL),
                    id=ids["A2"], status="open", filled=3, remaining=1, amount=4, cost=60015, price=20005, side="sell")
        check_order(checks, "fetch_order: the bid is partly filled", b.fetch_order(ids["B1"], SYMBOL),
                    id=ids["B1"], status="open", filled=2, remaining=1, amount=3, cost=36002, price=18001, side="buy")
        check_order(checks, "fetch_order: the market buy by amount", b.fetch_order(ids["B2"], SYMBOL),
                    id=ids["B2"], status="closed", filled=7, remaining=0, cost=140015, type="market", side="buy")
        check_order(checks, "fetch_order: the market buy by cost", b.fetch_order(ids["B3"], SYMBOL),
                    id=ids["B3"], filled=1, cost=20005, type="market", side="buy")
        opened = a.fetch_open_orders(SYMBOL)
        checks.equal("fetch_open_orders: A's only open order is the second ask, 3 of 4 filled",
                     [(o["id"], o["filled"], o["remaining"], o["status"]) for o in opened], [(ids["A2"], 3, 1, "open")])
    checks.run("fetch_order after the trades", orders_after_trades)

    def cancel():
        o = b.cancel_order(ids["B1"], SYMBOL)
        check_order(checks, "cancel_order: the partly filled bid", o, id=ids["B1"], status="canceled", filled=2, remaining=1)
        check_order(checks, "fetch_order: the cancelled bid", b.fetch_order(ids["B1"], SYMBOL),
                    id=ids["B1"], status="canceled", filled=2, remaining=1, amount=3)
        checks.equal("fetch_open_orders: B has none after the cancel", b.fetch_open_orders(SYMBOL), [])
        bal = balance_of(b)
        checks.equal("fetch_balance: the cancel released B's USD lock", bal["USD"]["used"], 0)
    checks.run("cancel_order", cancel)

    # A bid from B that stays, then post-only from A: one that rests, one that would cross.
    def post_only():
        o = b.create_order(SYMBOL, "limit", "buy", 1, 19000)
        ids["B4"] = o["id"]
        check_order(checks, "create_order limit buy 1 @ 19000 rests", o, status="open", filled=0, remaining=1)
        o = a.create_order(SYMBOL, "limit", "sell", 1, 20100, {"postOnly": True})
        ids["A4"] = o["id"]
        check_order(checks, "create_order post-only sell 1 @ 20100 rests (LIMIT_MAKER)", o, status="open", postOnly=True, type="limit",
                    price=20100, amount=1)
        check_order(checks, "fetch_order: the post-only order", a.fetch_order(ids["A4"], SYMBOL), status="open", postOnly=True, remaining=1)
        check_order(checks, "cancel_order: the post-only order", a.cancel_order(ids["A4"], SYMBOL), status="canceled", filled=0, remaining=1)
        checks.raises("create_order post-only sell 1 @ 18500 across the 19000 bid raises OrderImmediatelyFillable",
                      ccxt.OrderImmediatelyFillable, lambda: a.create_order(SYMBOL, "limit", "sell", 1, 18500, {"postOnly": True}))
        both = b.fetch_open_orders()
        checks.equal("fetch_open_orders without a symbol: B's bid", [(o["id"], o["symbol"]) for o in both], [(ids["B4"], SYMBOL)])
    checks.run("post-only", post_only)

    def errors():
        checks.raises("cancel_order of an unknown id raises OrderNotFound", ccxt.OrderNotFound, lambda: a.cancel_order("987654321", SYMBOL))
        checks.raises("cancel_order of an already cancelled order raises OrderNotFound", ccxt.OrderNotFound,
                      lambda: b.cancel_order(ids["B1"], SYMBOL))
        checks.raises("cancel_order of a filled order raises OrderNotFound", ccxt.OrderNotFound, lambda: a.cancel_order(ids["A1"], SYMBOL))
        checks.raises("fetch_order of an unknown id raises OrderNotFound", ccxt.OrderNotFound, lambda: a.fetch_order("987654321", SYMBOL))
        checks.raises("fetch_order of the other account's order raises OrderNotFound", ccxt.OrderNotFound,
                      lambda: b.fetch_order(ids["A2"], SYMBOL))
        checks.raises("cancel_order of the other account's order raises OrderNotFound", ccxt.OrderNotFound,
                      lambda: b.cancel_order(ids["A2"], SYMBOL))
        check_order(checks, "fetch_order: the other account's cancel left the order alone", a.fetch_order(ids["A2"], SYMBOL),
                    status="open", remaining=1)
        poor = ccxt_client(market, POOR)
        before = checks.run("fetch_balance of account 5", balance_of, poor)
        checks.raises(f"account {POOR} buying for 2^51 USD (it has 2^50) raises InsufficientFunds", ccxt.InsufficientFunds,
                      lambda: poor.create_market_buy_order_with_cost(SYMBOL, 2 ** 51))
        checks.equal(f"fetch_balance: account {POOR}'s refused order changed nothing", checks.run("fetch_balance of account 5", balance_of, poor), before)
        checks.raises("fetch_order_book of an unknown ccxt symbol raises BadSymbol (ccxt itself)", ccxt.BadSymbol,
                      lambda: a.fetch_order_book("ETH/USD"))
        checks.raises("GET /api/v3/depth?symbol=ETHUSD raises BadSymbol (the venue's -1121)", ccxt.BadSymbol,
                      lambda: a.publicGetDepth({"symbol": "ETHUSD"}))
        checks.raises("GET /api/v3/openOrders?symbol=ETHUSD (signed) raises BadSymbol", ccxt.BadSymbol,
                      lambda: a.privateGetOpenOrders({"symbol": "ETHUSD"}))
        checks.raises("POST /api/v3/order symbol=ETHUSD (signed) raises BadSymbol", ccxt.BadSymbol,
                      lambda: a.privatePostOrder({"symbol": "ETHUSD", "side": "BUY", "type": "LIMIT", "timeInForce": "GTC",
                                                  "quantity": "1", "price": "100"}))
        checks.raises("a wrong secret raises AuthenticationError (fresh instance)", ccxt.AuthenticationError,
                      lambda: ccxt_client(market, A, secret="not-the-secret").fetch_balance())
        checks.raises("an unknown API key raises AuthenticationError (fresh instance)", ccxt.AuthenticationError,
                      lambda: ccxt_client(market, A, key="no-such-key").fetch_balance())
    checks.run("error mapping", errors)

    def order_history():
        got = [(o["id"], o["status"], o["filled"]) for o in a.fetch_orders(SYMBOL)]
        checks.equal("fetch_orders (allOrders): every order of A, its status and fill", got,
                     [(ids.get("A1"), "closed", 5), (ids.get("A2"), "open", 3), (ids.get("A3"), "closed", 2), (ids.get("A4"), "canceled", 0)])
        checks.equal("fetch_closed_orders of A", [o["id"] for o in a.fetch_closed_orders(SYMBOL)], [ids.get("A1"), ids.get("A3")])
        checks.equal("fetch_canceled_orders of A", [o["id"] for o in a.fetch_canceled_orders(SYMBOL)], [ids.get("A4")])
        got = [(o["id"], o["filled"]) for o in b.fetch_orders(SYMBOL)]
        checks.equal("fetch_orders (allOrders): every order of B and its fill", got,
                     [(ids.get("B1"), 2), (ids.get("B2"), 7), (ids.get("B3"), 1), (ids.get("B4"), 0)])
    checks.run("fetch_orders", order_history)

    # The book, the ticker, candles and public trades after all that.
    def market_data():
        book = a.fetch_order_book(SYMBOL)
        checks.equal("fetch_order_book after the trades: B's bid and what is left of A's ask", (book["bids"], book["asks"]),
                     ([[19000, 1]], [[20005, 1]]))
        t = a.fetch_ticker(SYMBOL)
        prices = [e.price for e in expected]
        want = {"symbol": SYMBOL, "open": prices[0], "high": max(prices), "low": min(prices), "last": prices[-1], "close": prices[-1],
                "baseVolume": sum(e.qty for e in expected), "quoteVolume": sum(e.cost for e in expected),
                "bid": 19000, "bidVolume": 1, "ask": 20005, "askVolume": 1}
        checks.equal("fetch_ticker after the trades", {k: t.get(k) for k in want}, want)
        last = a.fetch_last_prices([SYMBOL]).get(SYMBOL) or {}
        checks.equal("fetch_last_prices (GET /api/v3/ticker/price): the last trade's price", (last.get("symbol"), last.get("price")), (SYMBOL, prices[-1]))
    checks.run("book and ticker", market_data)

    def own_trades():
        for account, ex in ((A, a), (B, b)):
            mine = ex.fetch_my_trades(SYMBOL)
            state["my_trades"][account] = mine
            got = [(t["symbol"], t["order"], t["side"], t["takerOrMaker"], t["price"], t["amount"], t["cost"],
                    (t["fee"] or {}).get("cost"), (t["fee"] or {}).get("currency")) for t in mine]
            want = []
            for e in expected:
                if account in (e.taker_account, e.maker_account):
                    s = e.seen_by(account)
                    want.append((SYMBOL, ids.get(s["order"]), s["side"], s["takerOrMaker"], e.price, e.qty, e.cost, s["fee"], "USD"))
            checks.equal(f"fetch_my_trades of account {account}: order, side, maker/taker, price, amount, cost, fee, currency", got, want)
        times = [t["timestamp"] for account in (A, B) for t in state["my_trades"].get(account, [])]
        checks.check("fetch_my_trades: the trades' times are during this run",
                     times and all(state["started_ms"] - 5000 <= x <= time.time() * 1000 + 5000 for x in times), f"{times}")
        ta = sorted(t["id"] for t in state["my_trades"].get(A, []))
        tb = sorted(t["id"] for t in state["my_trades"].get(B, []))
        checks.check("fetch_my_trades: both sides of each trade carry the same trade id", ta == tb and len(ta) == len(expected), f"{ta} vs {tb}")
    checks.run("fetch_my_trades", own_trades)

    def balances():
        for name, account, ex in (("A", A, a), ("B", B, b)):
            bal = balance_of(ex)
            state["final_balance"][account] = bal
            start = state[f"start_{name}"]
            btc = usd = 0
            for t in state["my_trades"][account]:
                sign = 1 if t["side"] == "buy" else -1
                btc += sign * t["amount"]
                usd += -sign * t["cost"] - t["fee"]["cost"]
            got = (bal["BTC"]["total"] - start["BTC"]["total"], bal["USD"]["total"] - start["USD"]["total"])
            checks.equal(f"fetch_balance: account {account}'s change of BTC and USD totals is what its trades imply (fees included)",
                         got, (btc, usd))
            # The same from the expected fills alone.
            btc_e = usd_e = 0
            for e in expected:
                if account in (e.taker_account, e.maker_account):
                    s = e.seen_by(account)
                    sign = 1 if s["side"] == "buy" else -1
                    btc_e += sign * e.qty
                    usd_e += -sign * e.cost - s["fee"]
            checks.equal(f"fetch_balance: account {account}'s change is the venue's rules' ({btc_e} BTC, {usd_e} USD)", got, (btc_e, usd_e))
        bal = state["final_balance"][A]
        checks.equal("fetch_balance: A's lock is the 1 BTC left of its ask (used BTC, used USD, free BTC)",
                     (bal["BTC"]["used"], bal["USD"]["used"], bal["BTC"]["free"]), (1, 0, bal["BTC"]["total"] - 1))
        bal = state["final_balance"][B]
        lock = unit_lock(19000)
        checks.equal(f"fetch_balance: B's lock is its bid's {lock} USD (used USD, used BTC, free USD)",
                     (bal["USD"]["used"], bal["BTC"]["used"], bal["USD"]["free"]), (lock, 0, bal["USD"]["total"] - lock))
    checks.run("fetch_balance (end)", balances)

    def candles_and_trades():
        mine = state["my_trades"][A]
        first = min(t["timestamp"] for t in mine)
        candles = a.fetch_ohlcv(SYMBOL, "1m", since=first // 60000 * 60000)
        want = {}
        for t in sorted(mine, key=lambda t: int(t["id"])):
            minute = t["timestamp"] // 60000 * 60000
            c = want.setdefault(minute, [minute, t["price"], t["price"], t["price"], t["price"], 0])
            c[2], c[3], c[4], c[5] = max(c[2], t["price"]), min(c[3], t["price"]), t["price"], c[5] + t["amount"]
        got = [c for c in candles if c[5]]
        checks.equal("fetch_ohlcv 1m: the candles (time, OHLC, volume) of the trades", got, sorted(want.values()))
        checks.equal("fetch_ohlcv 1m: the volume is all the trades'", sum(c[5] for c in candles), sum(e.qty for e in expected))
        public = a.fetch_trades(SYMBOL)
        checks.equal("fetch_trades (aggTrades): price, amount, taker side of every trade",
                     [(t["price"], t["amount"], t["side"]) for t in public], [(e.price, e.qty, e.taker_side) for e in expected])
        public = a.fetch_trades(SYMBOL, params={"fetchTradesMethod": "publicGetTrades"})
        by_id = {t["id"]: t for t in mine}
        checks.equal("fetch_trades (trades): ids, prices, amounts, times are those of fetch_my_trades",
                     [(t["id"], t["price"], t["amount"], t["timestamp"]) for t in public],
                     [(t["id"], t["price"], t["amount"], t["timestamp"]) for t in sorted(by_id.values(), key=lambda t: int(t["id"]))])
    checks.run("fetch_ohlcv and fetch_trades", candles_and_trades)

    # edit_order: Binance's cancel-replace (POST /api/v3/order/cancelReplace):
    # B's bid cancelled and a new one placed in its stead.
    def edit():
        o = b.edit_order(ids["B4"], SYMBOL, "limit", "buy", 2, 18500)
        ids["B5"] = o["id"]
        check_order(checks, "edit_order: B's bid 1 @ 19000 becomes a new order 2 @ 18500", o, symbol=SYMBOL, type="limit", side="buy",
                    price=18500, amount=2, filled=0, remaining=2, status="open")
        checks.check("edit_order: the new order has an id of its own", o["id"] not in (None, ids["B4"]), f"got {o['id']}")
        check_order(checks, "fetch_order: the edited bid is cancelled", b.fetch_order(ids["B4"], SYMBOL), status="canceled", filled=0)
        checks.equal("fetch_open_orders: B's only open order is the new bid",
                     [(o["id"], o["price"], o["amount"]) for o in b.fetch_open_orders(SYMBOL)], [(ids["B5"], 18500, 2)])
        checks.equal("fetch_order_book: the new bid in the old one's stead", a.fetch_order_book(SYMBOL)["bids"], [[18500, 2]])
        lock = unit_lock(18500) * 2
        checks.equal(f"fetch_balance: B's lock is the new bid's {lock} USD", balance_of(b)["USD"]["used"], lock)
        def refused(name, order_id):
            # ccxt raises ExchangeError for -2022 on spot; the body says
            # which half failed.
            try:
                b.edit_order(order_id, SYMBOL, "limit", "buy", 1, 18000)
                checks.check(name, False, "no error")
            except ccxt.ExchangeError as e:
                text = str(e)
                checks.check(name, '"code":-2022' in text and '"cancelResult":"FAILURE"' in text and '"newOrderResult":"NOT_ATTEMPTED"' in text, text)
        tested = b.create_order(SYMBOL, "limit", "buy", 1, 18000, {"test": True})
        checks.check("create_order with test=True (POST /api/v3/order/test) answers without an order", tested.get("id") is None, f"got {tested}")
        refused("edit_order of the cancelled bid: -2022, the cancel failed, nothing placed", ids["B4"])
        refused("edit_order of the other account's order: -2022, unknown to B, nothing placed", ids["A2"])
        checks.equal("fetch_open_orders: still only the new bid", [o["id"] for o in b.fetch_open_orders(SYMBOL)], [ids["B5"]])
        check_order(checks, "fetch_order: A's order untouched", a.fetch_order(ids["A2"], SYMBOL), status="open", remaining=1)
        state["final_balance"][B] = balance_of(b)
    checks.run("edit_order", edit)


# ---------------------------------------------------------------------------
# python-binance


def python_binance_part(checks, market, state):
    client = checks.run("python-binance: Client (pings)", python_binance_client, market, PYB)
    if client is None:
        return

    def balances(account):
        return {b["asset"]: (int(b["free"]), int(b["locked"])) for b in account["balances"]}

    def steps():
        checks.equal("python-binance: ping", client.ping(), {})
        now = time.time() * 1000
        server = client.get_server_time()["serverTime"]
        checks.check("python-binance: get_server_time is now", abs(server - now) < 5000, f"server {server}, here {now}")
        average = client.get_avg_price(symbol=BINANCE_SYMBOL)
        with urllib.request.urlopen(f"http://{market}/api/v3/avgPrice?symbol={BINANCE_SYMBOL}", timeout=HTTP_TIMEOUT_S) as answer:
            rest = json.load(answer)
        checks.equal("python-binance: get_avg_price is GET /api/v3/avgPrice's", (average.get("mins"), average.get("price")), (5, rest["price"]))
        start = balances(client.get_account())
        checks.equal(f"python-binance: get_account of account {PYB}: its deposits, nothing locked", start,
                     {asset: (amount, 0) for asset, amount in DEPOSIT.items()})
        o = client.create_order(symbol=BINANCE_SYMBOL, side="BUY", type="LIMIT", timeInForce="GTC", quantity=2, price="15001")
        got = {k: o.get(k) for k in ("symbol", "side", "type", "timeInForce", "price", "origQty", "executedQty", "status")}
        checks.equal("python-binance: create_order LIMIT GTC BUY 2 @ 15001 rests", got,
                     {"symbol": BINANCE_SYMBOL, "side": "BUY", "type": "LIMIT", "timeInForce": "GTC", "price": "15001",
                      "origQty": "2", "executedQty": "0", "status": "NEW"})
        order_id = o["orderId"]
        got = client.get_order(symbol=BINANCE_SYMBOL, orderId=order_id)
        checks.equal("python-binance: get_order", {k: got.get(k) for k in ("orderId", "clientOrderId", "status", "price", "origQty")},
                     {"orderId": order_id, "clientOrderId": o["clientOrderId"], "status": "NEW", "price": "15001", "origQty": "2"})
        opened = client.get_open_orders(symbol=BINANCE_SYMBOL)
        checks.equal("python-binance: get_open_orders", [(x["orderId"], x["status"]) for x in opened], [(order_id, "NEW")])
        lock = 2 * unit_lock(15001)
        checks.equal(f"python-binance: get_account: the order locks 2 * (15001 + ceil(15001 * 5 / 10000)) = {lock} USD",
                     balances(client.get_account())["USD"], (DEPOSIT["USD"] - lock, lock))
        cancelled = client.cancel_order(symbol=BINANCE_SYMBOL, orderId=order_id)
        checks.equal("python-binance: cancel_order (DELETE with a form body)", (cancelled.get("orderId"), cancelled.get("status")),
                     (order_id, "CANCELED"))
        checks.equal("python-binance: get_order after the cancel", client.get_order(symbol=BINANCE_SYMBOL, orderId=order_id).get("status"),
                     "CANCELED")
        key = client.stream_get_listen_key()
        checks.check("python-binance: stream_get_listen_key (POST /api/v3/userDataStream) gives a key",
                     isinstance(key, str) and len(key) > 0, f"got {key!r}")
        checks.equal("python-binance: stream_keepalive (PUT)", client.stream_keepalive(key), {})
        checks.equal("python-binance: stream_close (DELETE)", client.stream_close(key), {})
        try:
            client.stream_keepalive(key)
            checks.check("python-binance: a closed listen key is refused with -1125", False, "no error")
        except BinanceAPIException as e:
            checks.equal("python-binance: a closed listen key is refused with -1125", e.code, -1125)
        end = balances(client.get_account())
        state["final_balance"][PYB] = {asset: {"free": f, "used": l} for asset, (f, l) in end.items()}
        checks.equal("python-binance: get_account after the cancel: the lock is released", end, start)
    checks.run("python-binance", steps)


# ---------------------------------------------------------------------------
# The engine's record


def journal_part(checks, binary, data, state):
    def replay():
        scratch = tempfile.mkdtemp(prefix="crossbook-trading-replay-")
        commands = os.path.join(scratch, "cmds.txt")
        events = os.path.join(scratch, "events.txt")
        with open(commands, "w") as out:
            subprocess.run([binary, "journal", "inspect", data], stdout=out, stderr=subprocess.PIPE, check=True, timeout=60)
        with open(events, "w") as out:
            subprocess.run([binary, "run", "--commands", commands], stdout=out, stderr=subprocess.PIPE, check=True, timeout=60)
        with open(events) as f:
            lines = f.read().splitlines()
        subprocess.run(["rm", "-rf", scratch], timeout=30)
        return lines
    lines = checks.run("the journal replays (crossbook journal inspect, crossbook run)", replay)
    if lines is None:
        return
    trades, balances = [], {}
    for line in lines:
        parts = line.split()
        if len(parts) < 2:
            continue
        fields = dict(p.split("=", 1) for p in parts[2:] if "=" in p)
        if parts[1] == "trade":
            trades.append(fields)
        elif parts[1] == "balance":
            balances[(int(fields["account"]), int(fields["asset"]))] = (int(fields["available"]), int(fields["locked"]))

    seen = {}
    for account, mine in state["my_trades"].items():
        for t in mine:
            role = t["takerOrMaker"]
            match = [e for e in trades
                     if e[role] == t["order"] and int(e[f"{role}_account"]) == account and int(e["price"]) == t["price"]
                     and int(e["qty"]) == t["amount"] and int(e[f"{role}_fee"]) == t["fee"]["cost"]]
            checks.check(f"journal: account {account}'s trade {t['id']} ({role} of order {t['order']}, {t['amount']} @ {t['price']}, "
                         f"fee {t['fee']['cost']}) is a trade event", len(match) == 1,
                         f"{len(match)} trade events match; the trade events: {trades}")
            if len(match) == 1:
                seen.setdefault(id(match[0]), match[0])
    checks.equal("journal: the engine made exactly the trades ccxt saw (count)", len(trades), len(seen))
    fees = sum(int(e["maker_fee"]) + int(e["taker_fee"]) for e in trades)
    checks.equal("journal: the fee account (0) holds the trades' fees", balances.get((0, ASSET_ID["USD"])), (fees, 0))
    for account, bal in sorted(state["final_balance"].items()):
        for asset in ("BTC", "USD"):
            checks.equal(f"journal: account {account}'s last {asset} balance (available, locked) is what the API last said (free, used)",
                         balances.get((account, ASSET_ID[asset])), (bal[asset]["free"], bal[asset]["used"]))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--binary", default=os.path.join(REPO, "target", "release", "crossbook"))
    args = parser.parse_args()
    checks = Checks()

    time_limit(TIME_LIMIT_S)

    data = tempfile.mkdtemp(prefix="crossbook-trading-")
    server, _, market = start_server(args.binary, data)
    print(f"venue: http://{market}/ data {data}", flush=True)
    state = {"started_ms": time.time() * 1000, "ids": {}, "expected": [], "my_trades": {}, "final_balance": {}}
    try:
        ccxt_part(checks, market, state)
        python_binance_part(checks, market, state)
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=30)
        checks.equal("the server stops on SIGTERM with status 0", code, 0)
        journal_part(checks, args.binary, data, state)
    except OutOfTime:
        checks.check("the run ends in time", False, f"still running after {TIME_LIMIT_S} s")
    except Exception as e:
        checks.check("the run", False, f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
    finally:
        signal.alarm(0)
        if server.poll() is None:
            server.kill()
            server.wait(timeout=10)
    if checks.failed == 0:
        subprocess.run(["rm", "-rf", data], timeout=30)
    print(f"{checks.passed} passed, {checks.failed} failed")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
