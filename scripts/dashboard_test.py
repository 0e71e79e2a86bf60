"""The dashboard in a real browser.

Starts `crossbook serve` on free ports with a fresh data directory, opens
the dashboard (http://<market data>/) in Debian's Chromium driven by
Playwright, trades through the binary protocol (`crossbook load`: a few
hundred orders, then 20,000 a second for 3 s, which the page must follow
without falling behind the feed), and checks that the page shows what the REST API says: the order book ladder
(`GET /api/v3/depth`), the recent trades (`GET /api/v3/trades`), the last
candle (`GET /api/v3/klines`) and the last price (`GET
/api/v3/ticker/24hr`). Then it hands the page a diff with a gap and checks
that the page says it is out of sync and resyncs, halts and resumes an
instrument (its button marked), lists a new instrument by a configuration
reload (its button appears without a page reload, and its book shows an
order placed on it). A second page whose first order-book request fails
must retry and go live; a narrow (phone) page must show the chart. The
server is paused (SIGSTOP): the page must say it is stalled, then (15 s
on) disconnected while it connects again, and live again once the
server goes on (SIGCONT). Then it stops the server and checks that
the page says the connection is lost and shows no figures, and starts a
fresh venue (other data) on the same port: the page must come back
without the old venue's trades. Writes screenshots (target/dashboard.png
by default, and siblings). Ends with "N passed, M failed".

    scripts/dashboard-test [--binary target/release/crossbook] [--chromium /usr/bin/chromium]
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

from playwright.sync_api import sync_playwright

from servetest import Checks, start_server

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Chromium's own network traffic is refused on this machine: keep it quiet.
CHROMIUM_ARGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


def get(address, path):
    with urllib.request.urlopen(f"http://{address}{path}", timeout=10) as response:
        return json.loads(response.read())


def wait_for(page, predicate_js, timeout_s=15):
    try:
        page.wait_for_function(predicate_js, timeout=timeout_s * 1000)
        return True
    except Exception:
        return False


def converge(probe, passed=lambda ok: ok, timeout_s=8.0):
    """`probe()` gives (ok, detail); asked again every 200 ms until
    `passed(ok)` or `timeout_s`; the last answer."""
    deadline = time.monotonic() + timeout_s
    while True:
        ok, detail = probe()
        if passed(ok) or time.monotonic() > deadline:
            return ok, detail
        time.sleep(0.2)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--binary", default=os.path.join(REPO, "target", "release", "crossbook"))
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--screenshot", default=os.path.join(REPO, "target", "dashboard.png"))
    args = parser.parse_args()
    checks = Checks()
    data = tempfile.mkdtemp(prefix="crossbook-dashboard-")
    # The built-in venue, with the operator's endpoints on (to halt BTCUSD).
    token = "dashboard-test-operator-token"
    config = os.path.join(data, "crossbook.toml")
    with open(os.path.join(REPO, "crossbook.toml")) as f:
        text = f.read().replace('admin_token = ""', f'admin_token = "{token}"', 1)
    with open(config, "w") as f:
        f.write(text)
    server, binary_address, market = start_server(args.binary, os.path.join(data, "data"), config)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 860})
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"http://{market}/")
            checks.check("the page goes live", wait_for(page, "document.getElementById('status').textContent === 'live'"),
                         page.text_content("#status"))
            # Trade: a few hundred orders (closed loop, two sessions), then
            # a busy venue (open loop, 20,000 orders a second for 3 s).
            subprocess.run([args.binary, "load", "--address", binary_address, "--connections", "2", "--count", "600", "--duration", "30"],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            checks.check("the page shows the first trades", wait_for(page, "document.querySelectorAll('#trades .row').length > 0"),
                         page.text_content("#status"))
            subprocess.run([args.binary, "load", "--address", binary_address, "--rate", "20000", "--duration", "3"],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            seq = get(market, "/crossbook/stats")["seq"]
            checks.check("the page has followed the feed to the end",
                         wait_for(page, f"window.crossbook.book && window.crossbook.book.lastUpdateId >= {seq - 5} && document.querySelectorAll('#trades .row').length > 0"),
                         page.evaluate("window.crossbook.book && window.crossbook.book.lastUpdateId"))
            # The page and the REST API converge once the feed's last
            # messages are in: `@kline_1m` goes out at most every 2 s, so
            # each comparison is retried (up to 8 s) rather than made once
            # after a fixed pause.
            def ladder_is_depth():
                depth = get(market, "/api/v3/depth?symbol=BTCUSD&limit=15")
                ladder = page.evaluate("""() => ({
                    bids: [...document.querySelectorAll('#bids .row')].map(r => [r.dataset.price, r.dataset.qty]),
                    asks: [...document.querySelectorAll('#asks .row')].map(r => [r.dataset.price, r.dataset.qty]),
                })""")
                return (ladder["bids"] == depth["bids"], ladder["asks"] == depth["asks"]), \
                    (f"{ladder['bids'][:3]} vs {depth['bids'][:3]}", f"{ladder['asks'][:3]} vs {depth['asks'][:3]}")
            (bids_ok, asks_ok), (bids, asks) = converge(lambda: ladder_is_depth(), lambda ok: all(ok))
            checks.check("the ladder's bids are GET /api/v3/depth's", bids_ok, bids)
            checks.check("the ladder's asks are GET /api/v3/depth's", asks_ok, asks)

            def trades_are_rest():
                trades = get(market, "/api/v3/trades?symbol=BTCUSD&limit=40")
                shown = page.evaluate("[...document.querySelectorAll('#trades .row')].map(r => [Number(r.dataset.id), r.dataset.price, r.dataset.qty])")
                expected = [[t["id"], t["price"], t["qty"]] for t in reversed(trades)]
                return shown == expected, f"{shown[:3]} vs {expected[:3]}"
            checks.check("the trades list is GET /api/v3/trades's, newest first", *converge(trades_are_rest))

            def candle_is_kline():
                kline = get(market, "/api/v3/klines?symbol=BTCUSD&interval=1m&limit=1")[-1]
                candle = page.evaluate("({...document.getElementById('candle').dataset})")
                wanted = {"openTime": str(kline[0]), "open": kline[1], "high": kline[2], "low": kline[3], "close": kline[4], "volume": kline[5]}
                return candle == wanted, f"{candle} vs {wanted}"
            checks.check("the last candle is GET /api/v3/klines's", *converge(candle_is_kline))

            def last_price_is_ticker():
                ticker = get(market, "/api/v3/ticker/24hr?symbol=BTCUSD")
                shown = page.text_content("#last-price")
                return shown == ticker["lastPrice"], f"{shown} vs {ticker['lastPrice']}"
            checks.check("the last price is the 24-hour ticker's", *converge(last_price_is_ticker))
            checks.check("the venue's figures are shown", page.text_content("#stat-seq") not in ("", "-"), page.text_content("#stat-seq"))
            precision = page.evaluate("window.crossbook.pricePrecision")
            spread = page.text_content("#spread")
            checks.check("the spread is written in the instrument's decimals",
                         spread.startswith("spread ") and (len(spread.split(".")[1]) if "." in spread else 0) == precision and "e" not in spread[len("spread "):],
                         f"{spread} ({precision} decimals)")
            history = page.evaluate("window.crossbook.statusHistory")
            checks.check("the page kept up with the busy venue (never dropped, never out of sync)",
                         not any(h.startswith(("disconnected", "out of sync")) for h in history), history)
            os.makedirs(os.path.dirname(args.screenshot), exist_ok=True)
            page.screenshot(path=args.screenshot)
            # A diff with a gap: the page says so, and resyncs.
            page.evaluate("""() => {
                const last = window.crossbook.book.lastUpdateId;
                window.crossbookOnMessage({ data: JSON.stringify({ stream: 'btcusd@depth@100ms',
                    data: { e: 'depthUpdate', U: last + 10, u: last + 11, b: [], a: [] } }) });
            }""")
            checks.check("a gap in the diffs shows as out of sync",
                         wait_for(page, "window.crossbook.statusHistory.some(s => s.startsWith('out of sync'))", 5),
                         page.evaluate("window.crossbook.statusHistory"))
            checks.check("and the page resyncs", wait_for(page, "document.getElementById('status').textContent === 'live'"), page.text_content("#status"))
            # The operator halts BTCUSD: its button says so; resumed, no more.
            operator = lambda path: urllib.request.urlopen(urllib.request.Request(
                f"http://{market}/crossbook/admin/v1/{path}", data=b"symbol=BTCUSD", headers={"Authorization": f"Bearer {token}"}), timeout=10).read()
            operator("halt")
            checks.check("a halted instrument is marked on its button",
                         wait_for(page, "document.querySelector('#symbols button[data-symbol=\"BTCUSD\"]').classList.contains('halted')", 5),
                         page.evaluate("document.querySelector('#symbols').innerHTML"))
            page.screenshot(path=args.screenshot.replace(".png", "-halted.png"))
            operator("resume")
            checks.check("and unmarked once resumed",
                         wait_for(page, "!document.querySelector('#symbols button[data-symbol=\"BTCUSD\"]').classList.contains('halted')", 5),
                         page.evaluate("document.querySelector('#symbols').innerHTML"))
            # The operator lists ETH-USD (SIGHUP): the page shows its
            # button without a reload, and its book once selected.
            eth = ('\n[[assets]]\nid = 3\nname = "ETH"\ndecimals = 0\n\n[[instruments]]\nid = 2\nsymbol = "ETH-USD"\nbase = 3\nquote = 2\n'
                   'tick_size = 1\nlot_size = 1\nmin_qty = 1\nmax_qty = 1000000\nmin_price = 1\nmax_price = 10000000\nmaker_bps = 0\ntaker_bps = 0\n')
            with open(config, "a") as f:
                f.write(eth)
            server.send_signal(signal.SIGHUP)
            checks.check("an instrument listed by a reload gets its button",
                         wait_for(page, "!!document.querySelector('#symbols button[data-symbol=\"ETHUSD\"]')", 10),
                         page.evaluate("document.querySelector('#symbols').innerHTML"))
            subprocess.run([args.binary, "order", "--address", binary_address, "place", "--instrument", "2", "--side", "buy", "--qty", "7", "--price", "1234"],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            page.click('#symbols button[data-symbol="ETHUSD"]')
            checks.check("and its book shows the order placed on it",
                         wait_for(page, "document.getElementById('status').textContent === 'live' && [...document.querySelectorAll('#bids .row')].some(r => r.dataset.price === '1234' && r.dataset.qty === '7')", 10),
                         page.evaluate("[...document.querySelectorAll('#bids .row')].map(r => [r.dataset.price, r.dataset.qty])"))
            page.screenshot(path=args.screenshot.replace(".png", "-listed.png"))
            page.click('#symbols button[data-symbol="BTCUSD"]')
            checks.check("back on BTCUSD, live", wait_for(page, "document.getElementById('status').textContent === 'live'"), page.text_content("#status"))
            # A page whose first order-book request fails asks again.
            failing = browser.new_page(viewport={"width": 1400, "height": 860})
            failing.on("pageerror", lambda e: errors.append(str(e)))
            refused = []

            def refuse_first(route):
                if not refused:
                    refused.append(route.request.url)
                    route.abort()
                else:
                    route.continue_()
            failing.route("**/api/v3/depth*", refuse_first)
            failing.goto(f"http://{market}/")
            went_live = wait_for(failing, "window.crossbook.statusHistory.some(s => s.startsWith('order book not loaded')) && document.getElementById('status').textContent === 'live' && document.querySelectorAll('#bids .row').length > 0")
            checks.check("a failed order-book request is retried, and the page goes live", went_live and bool(refused),
                         f"{refused} {failing.evaluate('window.crossbook.statusHistory')}")
            checks.check("and it said so meanwhile", any(h.startswith("order book not loaded") for h in failing.evaluate("window.crossbook.statusHistory")),
                         failing.evaluate("window.crossbook.statusHistory"))
            failing.close()
            # A phone's screen: one column, the chart shown.
            narrow = browser.new_page(viewport={"width": 375, "height": 812})
            narrow.on("pageerror", lambda e: errors.append(str(e)))
            narrow.goto(f"http://{market}/")
            wait_for(narrow, "document.getElementById('status').textContent === 'live'")
            box = narrow.evaluate("(() => { const r = document.getElementById('chart').getBoundingClientRect(); return [r.width, r.height]; })()")
            wide = narrow.evaluate("document.documentElement.scrollWidth")
            checks.check("on a narrow screen the chart is shown, and nothing is wider than the screen",
                         box[0] > 300 and box[1] > 200 and wide <= 375, f"chart {box}, page {wide} px wide")
            narrow.screenshot(path=args.screenshot.replace(".png", "-narrow.png"), full_page=True)
            narrow.close()
            # The server frozen: the page says it is stalled, then live.
            server.send_signal(signal.SIGSTOP)
            stalled = wait_for(page, "document.getElementById('status').textContent.startsWith('stalled')", 12)
            page.screenshot(path=args.screenshot.replace(".png", "-stalled.png"))
            # Still frozen: the page drops the connection and makes another.
            dropped = wait_for(page, "document.getElementById('status').textContent.startsWith('disconnected: no answer')", 15)
            server.send_signal(signal.SIGCONT)
            checks.check("a frozen server shows as stalled", stalled, page.evaluate("window.crossbook.statusHistory"))
            checks.check("and, still frozen 15 s on, as disconnected (a new connection on its way)", dropped, page.evaluate("window.crossbook.statusHistory"))
            checks.check("and live once it goes on", wait_for(page, "document.getElementById('status').textContent === 'live'"),
                         page.evaluate("window.crossbook.statusHistory"))
            # Prices longer than a float's 15 to 17 digits are ordered and
            # subtracted exactly (as floats these two are equal).
            arithmetic = page.evaluate("""(() => {
                const p = window.crossbook.pricePrecision;
                const [a, b] = [`99999999999999999${p ? '.' + '9'.repeat(p) : ''}`, `100000000000000000${p ? '.' + '0'.repeat(p) : ''}`];
                const P = window.crossbookPrices;
                return [P.compare(a, b), P.compare(b, a), P.compare(a, a), P.difference(b, a), p];
            })()""")
            precision = arithmetic[4]
            one_unit = "1" if precision == 0 else "0." + "0" * (precision - 1) + "1"
            checks.check("long prices are compared and subtracted exactly", arithmetic[:4] == [-1, 1, 0, one_unit], arithmetic)
            # ETHUSD is shown when the venue stops; the fresh venue below
            # does not list it.
            page.click('#symbols button[data-symbol="ETHUSD"]')
            wait_for(page, "document.getElementById('status').textContent === 'live'")
            # The server stops: the page says the connection is lost.
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)
            checks.check("a stopped server shows as disconnected",
                         wait_for(page, "document.getElementById('status').textContent.startsWith('disconnected')"), page.text_content("#status"))
            checks.check("and dims what it shows, which is not current", page.evaluate("document.body.classList.contains('stale')"),
                         page.evaluate("document.body.className"))
            checks.check("and shows no figures of the venue that stopped",
                         wait_for(page, "['stat-seq', 'stat-orders', 'stat-trades', 'stat-sessions'].every(id => document.getElementById(id).textContent === '-')", 5),
                         page.evaluate("['stat-seq', 'stat-orders', 'stat-sessions'].map(id => document.getElementById(id).textContent)"))
            # A fresh venue on the same port: the page comes back without
            # the old one's trades (whose ids were higher than the new ones').
            with open(config, "w") as f:
                f.write(text)
            server, binary_address, _ = start_server(args.binary, os.path.join(data, "fresh"), config, market=market)
            checks.check("the page comes back on a fresh venue", wait_for(page, "document.getElementById('status').textContent === 'live'", 20),
                         page.evaluate("window.crossbook.statusHistory"))
            checks.check("without the instrument the fresh venue does not list, and on one it does",
                         wait_for(page, "!document.querySelector('#symbols button[data-symbol=\"ETHUSD\"]') && window.crossbook.symbol === 'BTCUSD'", 5),
                         page.evaluate("[window.crossbook.symbol, document.querySelector('#symbols').innerHTML]"))
            checks.check("and no longer dimmed", not page.evaluate("document.body.classList.contains('stale')"), page.evaluate("document.body.className"))
            checks.check("without the old venue's trades",
                         wait_for(page, "document.querySelectorAll('#trades .row').length === 0", 5),
                         page.evaluate("[...document.querySelectorAll('#trades .row')].slice(0, 3).map(r => r.dataset.id)"))
            # Another fresh venue, with the same instruments but fewer
            # commands than the one before it: the counters went back, so
            # the page starts over (stopped and started within a poll or
            # across several, the last counters seen are compared).
            subprocess.run([args.binary, "order", "--address", binary_address, "place", "--side", "buy", "--qty", "1", "--price", "100"],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            seq = get(market, "/crossbook/stats")["seq"]
            wait_for(page, f"document.getElementById('stat-seq').textContent === '{seq}'", 5)
            restarts = page.evaluate("window.crossbook.venueRestarts")
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)
            wait_for(page, "document.getElementById('status').textContent.startsWith('disconnected')")
            server, binary_address, _ = start_server(args.binary, os.path.join(data, "fresh2"), config, market=market)
            checks.check("a venue whose counters went back starts the page over",
                         wait_for(page, f"window.crossbook.venueRestarts > {restarts} && document.getElementById('status').textContent === 'live'", 20),
                         page.evaluate("[window.crossbook.venueRestarts, window.crossbook.statusHistory.slice(-4)]"))
            checks.check("no script errors on the page", not errors, errors)
            browser.close()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(timeout=30)
        # Kept for a look when a check failed.
        if checks.failed:
            print(f"data: {data}")
        else:
            shutil.rmtree(data, ignore_errors=True)
    print(f"screenshot: {args.screenshot}")
    print(f"{checks.passed} passed, {checks.failed} failed")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
