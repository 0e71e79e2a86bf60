"""ccxt.pro, a client nobody here wrote, against the WebSocket side: its
`binance` class (PyPI `ccxt`, the same package as the trading test's),
pointed at the venue by its URLs only.

Starts `crossbook serve` on free ports with a fresh data directory, has
`crossbook load` trade on it (binary protocol, 2,000 orders a second for
4 s) and meanwhile keeps, with ccxt.pro, an order book
(`watch_order_book`: ccxt's own implementation of Binance's procedure, a
REST snapshot plus the `@depth@100ms` diffs), every trade
(`watch_trades`: `@trade`; and on a second client, with
`params={"name": "aggTrade"}`, `@aggTrade`), the 24-hour ticker (`watch_ticker`:
`@miniTicker`; `watch_tickers`, every symbol's: `!miniTicker@arr`), the
best bid and ask (`watch_bids_asks`: `@bookTicker`) and the one-minute
candles (`watch_ohlcv`: `@kline_1m`).
Once trading has stopped and the feeds are quiet, each must equal what
the REST API says: the whole book and its update id, every trade id from
the first to the last once with the price, amount, side and time of
`GET /api/v3/trades`, the last price and the volume of
`GET /api/v3/ticker/24hr`, and the last candle of `GET /api/v3/klines`.
Before that, the WebSocket API (`/ws-api/v3`): the private streams (its
user data stream subscription: `watch_orders`, `watch_my_trades` and
`watch_balance` of an account whose order another account fills in part),
then orders, queries and balances over it (`create_order_ws`,
`fetch_order_ws`, `fetch_open_orders_ws`, `fetch_my_trades_ws`,
`fetch_balance_ws`, `edit_order_ws`, `cancel_order_ws`), each against the
REST answer.
An operator's deposit (`POST /crossbook/admin/v1/deposit`) reaches
`watch_balance` as Binance's `balanceUpdate`.
Ends with "N passed, M failed".

    scripts/ccxt-pro-test [--binary target/release/crossbook]
"""

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

import ccxt.pro

from servetest import Checks, OutOfTime, start_server, time_limit

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SYMBOL = "BTC/USD"
TIME_LIMIT_S = 120
ADMIN_TOKEN = "ccxt-pro-test-operator"
QUIET_S = 3.0        # a candle message is due at most every 2 s


def get(market, path):
    with urllib.request.urlopen(f"http://{market}{path}", timeout=10) as response:
        return json.loads(response.read())


def deposit(market, account, asset, amount, reference):
    """The operator's deposit (`docs/trading.md`, "Deposits and withdrawals")."""
    body = urllib.parse.urlencode({"account": account, "asset": asset, "amount": amount, "reference": reference}).encode()
    request = urllib.request.Request(f"http://{market}/crossbook/admin/v1/deposit", data=body, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def client(market, account=None):
    """ccxt.pro's binance, its REST and WebSocket URLs the venue's (with a
    demo account's key, for the private streams)."""
    credentials = {"apiKey": f"demo-key-{account}", "secret": f"demo-secret-{account}"} if account else {}
    exchange = ccxt.pro.binance({
        **credentials,
        "enableRateLimit": False,
        "options": {"defaultType": "spot", "fetchMarkets": {"types": ["spot"]}, "fetchCurrencies": False, "fetchMargins": False},
    })
    base = f"http://{market}"
    exchange.urls["api"] = {
        "public": base + "/api/v3", "private": base + "/api/v3", "v1": base + "/api/v1", "sapi": base + "/sapi/v1",
        "ws": {"spot": f"ws://{market}/ws", "ws-api": {"spot": f"ws://{market}/ws-api/v3"}},
    }
    return exchange


async def private(checks, market):
    """ccxt.pro's private streams (the WebSocket API's user data stream
    subscription): account 7 rests a sell and watches its orders, its
    trades and its balance while account 8 takes part of it."""
    seller, buyer = client(market, 7), client(market, 8)
    try:
        await seller.load_markets()
        await buyer.load_markets()
        # ccxt.pro subscribes when a watch is first awaited; the order
        # goes in once that has surely been answered (a loaded machine
        # takes longer than an idle one: 2 s, not 0.5).
        orders = asyncio.create_task(seller.watch_orders(SYMBOL))
        await asyncio.sleep(SUBSCRIBED_S)
        placed = await seller.create_order(SYMBOL, "limit", "sell", 2, 10000)
        seen = (await asyncio.wait_for(orders, 10))[-1]
        checks.equal("watch_orders: the new order, open", (seen["id"], seen["status"], seen["amount"], seen["filled"]), (placed["id"], "open", 2.0, 0.0))
        orders = asyncio.create_task(seller.watch_orders(SYMBOL))
        trades = asyncio.create_task(seller.watch_my_trades(SYMBOL))
        balance = asyncio.create_task(seller.watch_balance())
        await asyncio.sleep(SUBSCRIBED_S)
        await buyer.create_order(SYMBOL, "limit", "buy", 1, 10000, {"timeInForce": "IOC"})
        seen = (await asyncio.wait_for(orders, 10))[-1]
        checks.equal("watch_orders: partly filled", (seen["id"], seen["status"], seen["filled"], seen["remaining"]), (placed["id"], "open", 1.0, 1.0))
        trade = (await asyncio.wait_for(trades, 10))[-1]
        # Maker fee -1 bps of 10,000 USD: a rebate of 1 USD.
        checks.equal("watch_my_trades: the fill, as maker, with its rebate",
                     (trade["order"], trade["price"], trade["amount"], trade["takerOrMaker"], trade["fee"]["currency"], trade["fee"]["cost"]),
                     (placed["id"], 10000.0, 1.0, "maker", "USD", -1.0))
        streamed = await asyncio.wait_for(balance, 10)
        fetched = await seller.fetch_balance()
        checks.equal("watch_balance: USD and BTC as fetch_balance has them",
                     [(streamed[c]["free"], streamed[c]["used"]) for c in ("USD", "BTC")], [(fetched[c]["free"], fetched[c]["used"]) for c in ("USD", "BTC")])
        await seller.cancel_order(placed["id"], SYMBOL)

        # Orders, queries and balances over the WebSocket API (ccxt.pro's
        # *_ws methods), each against the REST API's answer.
        ws_order = await seller.create_order_ws(SYMBOL, "limit", "sell", 3, 10050)
        checks.equal("create_order_ws: a resting sell", (ws_order["status"], ws_order["amount"], ws_order["price"]), ("open", 3.0, 10050.0))
        fetched = await seller.fetch_order_ws(ws_order["id"], SYMBOL)
        rest = await seller.fetch_order(ws_order["id"], SYMBOL)
        checks.equal("fetch_order_ws: fetch_order's answer", (fetched["id"], fetched["status"], fetched["remaining"]), (rest["id"], rest["status"], rest["remaining"]))
        open_ws = await seller.fetch_open_orders_ws(SYMBOL)
        checks.equal("fetch_open_orders_ws: the order open", [o["id"] for o in open_ws], [ws_order["id"]])
        taken = await buyer.create_order_ws(SYMBOL, "limit", "buy", 1, 10050, {"timeInForce": "IOC"})
        checks.equal("create_order_ws: an IOC buy filled at the maker's price", (taken["status"], taken["filled"], taken["average"]), ("closed", 1.0, 10050.0))
        mine_ws = await seller.fetch_my_trades_ws(SYMBOL)
        mine = await seller.fetch_my_trades(SYMBOL)
        checks.equal("fetch_my_trades_ws: fetch_my_trades's trades",
                     [(t["id"], t["price"], t["amount"], t["fee"]["cost"]) for t in mine_ws], [(t["id"], t["price"], t["amount"], t["fee"]["cost"]) for t in mine])
        balance_ws = await seller.fetch_balance_ws()
        balance = await seller.fetch_balance()
        # ccxt 4.5.90 parses an account.status answer without the market
        # type, which leaves its spot balances out of the parsed maps (as
        # against Binance itself): compared by the answer it got.
        checks.equal("fetch_balance_ws: the balances of fetch_balance's answer",
                     balance_ws["info"]["balances"], balance["info"]["balances"])
        edited = await seller.edit_order_ws(ws_order["id"], SYMBOL, "limit", "sell", 2, 10060)
        checks.equal("edit_order_ws (order.cancelReplace): a new order 2 @ 10060 in the old one's stead",
                     (edited["status"], edited["amount"], edited["price"], edited["id"] != ws_order["id"]), ("open", 2.0, 10060.0, True))
        old = await seller.fetch_order(ws_order["id"], SYMBOL)
        checks.equal("edit_order_ws: the old order cancelled with 1 of 3 filled", (old["status"], old["filled"]), ("canceled", 1.0))
        checks.equal("fetch_open_orders_ws: the new order alone", [o["id"] for o in await seller.fetch_open_orders_ws(SYMBOL)], [edited["id"]])
        cancelled = await seller.cancel_order_ws(edited["id"], SYMBOL)
        checks.equal("cancel_order_ws: cancelled, nothing filled", (cancelled["status"], cancelled["filled"]), ("canceled", 0.0))
        checks.equal("fetch_open_orders_ws: none left", await seller.fetch_open_orders_ws(SYMBOL), [])
    finally:
        await seller.close()
        await buyer.close()

    # An operator's deposit reaches watch_balance as Binance's
    # balanceUpdate, added to the balance ccxt.pro fetched first.
    funded = client(market, 9)
    funded.options["watchBalance"] = {"fetchBalanceSnapshot": True, "awaitBalanceSnapshot": True}
    try:
        await funded.load_markets()
        balance = asyncio.create_task(funded.watch_balance())
        await asyncio.sleep(SUBSCRIBED_S)
        before = (await funded.fetch_balance())["USD"]["free"]
        done = deposit(market, 9, "USD", 250, "ccxt-pro-deposit-1")
        checks.equal("the operator's deposit is done", done["status"], "DONE")
        streamed = await asyncio.wait_for(balance, 10)
        checks.equal("watch_balance: the deposit added to the free USD (balanceUpdate)", streamed["USD"]["free"], before + 250)
    finally:
        await funded.close()


# How long ccxt.pro is given to subscribe before the event it must see.
SUBSCRIBED_S = 2.0
# The public watchers' names in `seen`.
WATCHERS = ["book", "trades", "ticker", "ohlcv", "tickers", "bids_asks", "agg_trades"]


async def follow(exchange, seen, name, watch):
    """Calls `watch` until cancelled, noting each answer and when it came."""
    while True:
        answer = await watch()
        seen[name] = answer
        seen["last_message"] = time.monotonic()


async def run(checks, binary, binary_address, market):
    exchange = client(market)
    # `@aggTrade` on a client of its own: ccxt keeps one trade cache a
    # symbol, whichever stream fills it.
    aggregating = client(market)
    try:
        await exchange.load_markets()
        checks.equal("load_markets", SYMBOL in exchange.markets, True)
        seen = {"last_message": time.monotonic()}
        trades = {}

        async def watch_trades():
            for t in await exchange.watch_trades(SYMBOL):
                trades[int(t["id"])] = (t["price"], t["amount"], t["side"], t["timestamp"])
            return len(trades)

        aggregates = {}

        async def watch_agg_trades():
            for t in await aggregating.watch_trades(SYMBOL, params={"name": "aggTrade"}):
                aggregates[int(t["id"])] = (t["price"], t["amount"], t["side"], t["timestamp"])
            return len(aggregates)

        tasks = [
            asyncio.create_task(follow(exchange, seen, "book", lambda: exchange.watch_order_book(SYMBOL))),
            asyncio.create_task(follow(exchange, seen, "trades", watch_trades)),
            asyncio.create_task(follow(exchange, seen, "ticker", lambda: exchange.watch_ticker(SYMBOL))),
            asyncio.create_task(follow(exchange, seen, "ohlcv", lambda: exchange.watch_ohlcv(SYMBOL, "1m"))),
            asyncio.create_task(follow(exchange, seen, "tickers", lambda: exchange.watch_tickers())),
            asyncio.create_task(follow(exchange, seen, "bids_asks", lambda: exchange.watch_bids_asks([SYMBOL]))),
            asyncio.create_task(follow(aggregating, seen, "agg_trades", watch_agg_trades)),
        ]
        # Every watcher live before the run: a few trades are made until
        # each has had a message and both trade watchers have the last of
        # them (ccxt.pro subscribes as a watch is first awaited). What
        # they saw of those (and of the private part's trades) is not
        # the run's.
        deadline = time.monotonic() + 30
        while True:
            warm = await asyncio.create_subprocess_exec(binary, "load", "--address", binary_address, "--count", "40", "--duration", "10",
                                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            await warm.wait()
            last = get(market, "/api/v3/ticker/24hr?symbol=BTCUSD")["count"]
            quiet = time.monotonic() + 5
            while time.monotonic() < quiet and not (last in trades and last in aggregates and all(n in seen for n in WATCHERS)):
                await asyncio.sleep(0.1)
            if (last in trades and last in aggregates and all(n in seen for n in WATCHERS)) or time.monotonic() > deadline:
                break
        checks.check("every watcher is live before the run", all(n in seen for n in WATCHERS), sorted(seen))
        # (REST's count may lag what the watchers hold: only what it
        # counted is set aside, and the rest is the run's.)
        for seen_trades in (trades, aggregates):
            for old in [i for i in seen_trades if i <= last]:
                del seen_trades[old]
        first = last + 1
        load = await asyncio.create_subprocess_exec(binary, "load", "--address", binary_address, "--rate", "2000", "--duration", "4",
                                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        checks.equal("crossbook load ends with status 0", await load.wait(), 0)
        while time.monotonic() - seen["last_message"] < QUIET_S and not any(task.done() for task in tasks):
            await asyncio.sleep(0.2)
        for name, task in zip(["watch_order_book", "watch_trades", "watch_ticker", "watch_ohlcv", "watch_tickers", "watch_bids_asks", "watch_trades (aggTrade)"], tasks):
            if task.done():
                checks.check(f"{name} keeps running", False, repr(task.exception())[:300])
            task.cancel()

        # The book: ccxt's, kept from the snapshot and the diffs.
        book = seen.get("book")
        depth = get(market, "/api/v3/depth?symbol=BTCUSD&limit=5000")
        wanted_bids = [[float(p), float(q)] for p, q in depth["bids"]]
        wanted_asks = [[float(p), float(q)] for p, q in depth["asks"]]
        checks.check("watch_order_book: a book on both sides", book is not None and len(wanted_bids) > 0 and len(wanted_asks) > 0, depth)
        if book is not None:
            # The last diff ends with the last command that changed the
            # book; the snapshot's id is the last command of all.
            checks.check("watch_order_book: its update id is at most GET /api/v3/depth's lastUpdateId",
                         book["nonce"] is not None and book["nonce"] <= depth["lastUpdateId"], (book["nonce"], depth["lastUpdateId"]))
            checks.equal("watch_order_book: its bids are GET /api/v3/depth's", [list(b[:2]) for b in book["bids"]], wanted_bids)
            checks.equal("watch_order_book: its asks are GET /api/v3/depth's", [list(a[:2]) for a in book["asks"]], wanted_asks)

        # The trades: every one, once, as REST has them.
        ticker = get(market, "/api/v3/ticker/24hr?symbol=BTCUSD")
        count = ticker["count"]
        checks.check("trading made trades", count > 1000, count)
        missing = sorted(set(range(first, count + 1)) - set(trades))
        checks.check("watch_trades: every trade id of the run, from the first to the last", not missing and len(trades) == count + 1 - first,
                     f"{len(trades)} seen of {count + 1 - first}; missing {len(missing)}, the first {missing[:5]}")
        rest_trades = get(market, "/api/v3/trades?symbol=BTCUSD&limit=1000")
        wanted = {t["id"]: (float(t["price"]), float(t["qty"]), "sell" if t["isBuyerMaker"] else "buy", t["time"]) for t in rest_trades}
        wrong = [(i, trades.get(i), t) for i, t in sorted(wanted.items()) if trades.get(i) != t]
        checks.check("watch_trades: the last 1,000 as GET /api/v3/trades has them (price, amount, side, time)", not wrong,
                     f"{len(wrong)} differ; the first (id, seen, REST): {wrong[:3]}")
        run_aggregates = {i: t for i, t in aggregates.items() if i >= first}
        differ = [(i, run_aggregates.get(i), trades.get(i)) for i in sorted(set(run_aggregates) | set(trades)) if run_aggregates.get(i) != trades.get(i)]
        checks.check("watch_trades with name aggTrade (@aggTrade): every trade of the run, as @trade has it", not differ and len(run_aggregates) == count + 1 - first,
                     f"{len(run_aggregates)} seen of {count + 1 - first}; {len(differ)} differ, the first (id, aggTrade, trade): {differ[:3]}")

        # The ticker and the candle.
        mini = seen.get("ticker") or {}
        checks.equal("watch_ticker: last price and volume are GET /api/v3/ticker/24hr's",
                     (mini.get("last"), mini.get("baseVolume")), (float(ticker["lastPrice"]), float(ticker["volume"])))
        every = (seen.get("tickers") or {}).get(SYMBOL) or {}
        checks.equal("watch_tickers (every symbol): last price and volume are GET /api/v3/ticker/24hr's",
                     (every.get("last"), every.get("baseVolume")), (float(ticker["lastPrice"]), float(ticker["volume"])))
        top = get(market, "/api/v3/ticker/bookTicker?symbol=BTCUSD")
        quote = (seen.get("bids_asks") or {}).get(SYMBOL) or {}
        checks.equal("watch_bids_asks: the best bid and ask are GET /api/v3/ticker/bookTicker's",
                     (quote.get("bid"), quote.get("bidVolume"), quote.get("ask"), quote.get("askVolume")),
                     (float(top["bidPrice"]), float(top["bidQty"]), float(top["askPrice"]), float(top["askQty"])))
        kline = get(market, "/api/v3/klines?symbol=BTCUSD&interval=1m&limit=1")[-1]
        candles = seen.get("ohlcv") or [[None]]
        checks.equal("watch_ohlcv: the last candle is GET /api/v3/klines's",
                     candles[-1][:6], [kline[0]] + [float(v) for v in kline[1:6]])
    finally:
        await exchange.close()
        await aggregating.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--binary", default=os.path.join(REPO, "target", "release", "crossbook"))
    args = parser.parse_args()
    checks = Checks()

    time_limit(TIME_LIMIT_S)
    data = tempfile.mkdtemp(prefix="crossbook-ccxt-pro-")
    # The built-in configuration, with the operator's endpoints on.
    with open(os.path.join(REPO, "crossbook.toml")) as default:
        config = default.read().replace('admin_token = ""', f'admin_token = "{ADMIN_TOKEN}"', 1)
    with open(os.path.join(data, "crossbook.toml"), "w") as file:
        file.write(config)
    server, binary_address, market = start_server(args.binary, os.path.join(data, "data"), os.path.join(data, "crossbook.toml"))
    try:
        asyncio.run(private(checks, market))
        asyncio.run(run(checks, args.binary, binary_address, market))
    except OutOfTime:
        checks.check("the run ends in time", False, f"still running after {TIME_LIMIT_S} s")
    except Exception as e:
        checks.check("the run", False, f"{type(e).__name__}: {e}")
    finally:
        signal.alarm(0)
        server.terminate()
        server.wait(timeout=30)
    subprocess.run(["rm", "-rf", data], timeout=30)
    print(f"{checks.passed} passed, {checks.failed} failed")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
