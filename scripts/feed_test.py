"""The WebSocket feeds, followed by a client nobody here wrote: ccxt.pro's
`binance` class (PyPI `ccxt`, the same package as the trading test's),
pointed at the venue by its URLs only.

Starts `crossbook serve` on free ports with a fresh data directory, has
`crossbook load` trade on it (binary protocol, 2,000 orders a second for
4 s) and meanwhile keeps, with ccxt.pro, an order book
(`watch_order_book`: ccxt's own implementation of Binance's procedure, a
REST snapshot plus the `@depth@100ms` diffs), every trade
(`watch_trades`: `@trade`), the 24-hour ticker (`watch_ticker`:
`@miniTicker`) and the one-minute candles (`watch_ohlcv`: `@kline_1m`).
Once trading has stopped and the feeds are quiet, each must equal what
the REST API says: the whole book and its update id, every trade id from
the first to the last once with the price, amount, side and time of
`GET /api/v3/trades`, the last price and the volume of
`GET /api/v3/ticker/24hr`, and the last candle of `GET /api/v3/klines`.
Ends with "N passed, M failed".

    scripts/feed-test [--binary target/release/crossbook]
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
import urllib.request

import ccxt.pro

from servetest import Checks, OutOfTime, start_server

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SYMBOL = "BTC/USD"
TIME_LIMIT_S = 120
QUIET_S = 3.0        # a candle message is due at most every 2 s


def get(market, path):
    with urllib.request.urlopen(f"http://{market}{path}", timeout=10) as response:
        return json.loads(response.read())


def client(market):
    """ccxt.pro's binance, its REST and WebSocket URLs the venue's."""
    exchange = ccxt.pro.binance({
        "enableRateLimit": False,
        "options": {"defaultType": "spot", "fetchMarkets": {"types": ["spot"]}, "fetchCurrencies": False, "fetchMargins": False},
    })
    base = f"http://{market}"
    exchange.urls["api"] = {
        "public": base + "/api/v3", "private": base + "/api/v3", "v1": base + "/api/v1", "sapi": base + "/sapi/v1",
        "ws": {"spot": f"ws://{market}/ws"},
    }
    return exchange


async def follow(exchange, seen, name, watch):
    """Calls `watch` until cancelled, noting each answer and when it came."""
    while True:
        answer = await watch()
        seen[name] = answer
        seen["last_message"] = time.monotonic()


async def run(checks, binary, binary_address, market):
    exchange = client(market)
    try:
        await exchange.load_markets()
        checks.equal("load_markets", SYMBOL in exchange.markets, True)
        seen = {"last_message": time.monotonic()}
        trades = {}

        async def watch_trades():
            for t in await exchange.watch_trades(SYMBOL):
                trades[int(t["id"])] = (t["price"], t["amount"], t["side"], t["timestamp"])
            return len(trades)

        tasks = [
            asyncio.create_task(follow(exchange, seen, "book", lambda: exchange.watch_order_book(SYMBOL))),
            asyncio.create_task(follow(exchange, seen, "trades", watch_trades)),
            asyncio.create_task(follow(exchange, seen, "ticker", lambda: exchange.watch_ticker(SYMBOL))),
            asyncio.create_task(follow(exchange, seen, "ohlcv", lambda: exchange.watch_ohlcv(SYMBOL, "1m"))),
        ]
        await asyncio.sleep(1.0)
        load = await asyncio.create_subprocess_exec(binary, "load", "--address", binary_address, "--rate", "2000", "--duration", "4",
                                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        checks.equal("crossbook load ends with status 0", await load.wait(), 0)
        while time.monotonic() - seen["last_message"] < QUIET_S and not any(task.done() for task in tasks):
            await asyncio.sleep(0.2)
        for name, task in zip(["watch_order_book", "watch_trades", "watch_ticker", "watch_ohlcv"], tasks):
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
            checks.equal("watch_order_book: its update id is GET /api/v3/depth's lastUpdateId", book["nonce"], depth["lastUpdateId"])
            checks.equal("watch_order_book: its bids are GET /api/v3/depth's", [list(b[:2]) for b in book["bids"]], wanted_bids)
            checks.equal("watch_order_book: its asks are GET /api/v3/depth's", [list(a[:2]) for a in book["asks"]], wanted_asks)

        # The trades: every one, once, as REST has them.
        ticker = get(market, "/api/v3/ticker/24hr?symbol=BTCUSD")
        count = ticker["count"]
        checks.check("trading made trades", count > 1000, count)
        missing = sorted(set(range(1, count + 1)) - set(trades))
        checks.check("watch_trades: every trade id from 1 to the last", not missing and len(trades) == count,
                     f"{len(trades)} seen of {count}; missing {len(missing)}, the first {missing[:5]}")
        rest_trades = get(market, "/api/v3/trades?symbol=BTCUSD&limit=1000")
        wanted = {t["id"]: (float(t["price"]), float(t["qty"]), "sell" if t["isBuyerMaker"] else "buy", t["time"]) for t in rest_trades}
        wrong = [(i, trades.get(i), t) for i, t in sorted(wanted.items()) if trades.get(i) != t]
        checks.check("watch_trades: the last 1,000 as GET /api/v3/trades has them (price, amount, side, time)", not wrong,
                     f"{len(wrong)} differ; the first (id, seen, REST): {wrong[:3]}")

        # The ticker and the candle.
        mini = seen.get("ticker") or {}
        checks.equal("watch_ticker: last price and volume are GET /api/v3/ticker/24hr's",
                     (mini.get("last"), mini.get("baseVolume")), (float(ticker["lastPrice"]), float(ticker["volume"])))
        kline = get(market, "/api/v3/klines?symbol=BTCUSD&interval=1m&limit=1")[-1]
        candles = seen.get("ohlcv") or [[None]]
        checks.equal("watch_ohlcv: the last candle is GET /api/v3/klines's",
                     candles[-1][:6], [kline[0]] + [float(v) for v in kline[1:6]])
    finally:
        await exchange.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--binary", default=os.path.join(REPO, "target", "release", "crossbook"))
    args = parser.parse_args()
    checks = Checks()

    def out_of_time(signum, frame):
        raise OutOfTime()
    signal.signal(signal.SIGALRM, out_of_time)
    signal.alarm(TIME_LIMIT_S)
    data = tempfile.mkdtemp(prefix="crossbook-feed-")
    server, binary_address, market = start_server(args.binary, data)
    try:
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
