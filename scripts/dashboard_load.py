"""The dashboard open in Chromium while the venue is busy: what the page
costs the venue, and whether it keeps up.

Starts `crossbook serve` (defaults, a fresh data directory, free ports),
opens the dashboard in Debian's Chromium (Playwright, headless), and runs
`crossbook load --rate RATE --duration SECONDS` (4 binary sessions, open
loop) with the page open. Prints the load's figures (order to
acknowledgement), the page's status every half second, the CPU seconds
Chromium's processes and the server took during the run, the messages the
server sent (all to the page) and whether it dropped the page as a slow
consumer, and whether the page's book caught up with the journal. Every
process runs on this machine's cores: the figures say what a page costs
a venue that shares them, not what it costs on a machine of its own.

    scripts/dashboard-load [RATE] [SECONDS] [--binary target/release/crossbook] [--chromium /usr/bin/chromium]
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from playwright.sync_api import sync_playwright

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHROMIUM_ARGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


def cpu_seconds(pids):
    """User plus system CPU seconds of the live processes among `pids`."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            pass
    return total / ticks


def chromium_pids():
    """Every Chromium process (browser, renderers, GPU, utilities): those
    whose executable is Debian's `/usr/lib/chromium/chromium`."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/exe").startswith("/usr/lib/chromium/"):
                    pids.append(int(entry))
            except OSError:
                pass
    return pids


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rate", nargs="?", default="50000")
    parser.add_argument("seconds", nargs="?", default="10")
    parser.add_argument("--binary", default=os.path.join(REPO, "target", "release", "crossbook"))
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()
    data = tempfile.mkdtemp(prefix="crossbook-dashboard-load-")
    server = subprocess.Popen(
        [args.binary, "serve", "--listen", "127.0.0.1:0", "--fix-listen", "", "--market-listen", "127.0.0.1:0", "--data", data],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    found, log = {}, []

    def read():
        for line in server.stderr:
            log.append(line.rstrip())
            match = re.match(r"market data on http://([^/]+)/", line)
            if match:
                found["market"] = match.group(1)
            if line.startswith("listening on "):
                found["binary"] = line.split()[2]

    threading.Thread(target=read, daemon=True).start()
    deadline = time.time() + 30
    while time.time() < deadline and not ("binary" in found and "market" in found):
        time.sleep(0.05)
    if not ("binary" in found and "market" in found):
        server.kill()
        raise SystemExit("the server did not start")
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 860})
            page.goto(f"http://{found['market']}/")
            page.wait_for_function("document.getElementById('status').textContent === 'live'", timeout=15000)
            pids = chromium_pids()
            before = (cpu_seconds(pids), cpu_seconds([server.pid]))
            load = subprocess.Popen([args.binary, "load", "--address", found["binary"], "--rate", args.rate, "--duration", args.seconds],
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            started = time.time()
            statuses = []
            while load.poll() is None:
                status = page.text_content("#status")
                if not statuses or statuses[-1][1] != status:
                    statuses.append((round(time.time() - started, 1), status))
                time.sleep(0.5)
            after = (cpu_seconds(pids), cpu_seconds([server.pid]))
            for line in load.stdout.read().splitlines():
                print(f"load: {line}")
            for at, status in statuses:
                print(f"page at {at:5.1f} s: {status}")
            print(f"cpu_seconds chromium {after[0] - before[0]:.1f} server {after[1] - before[1]:.1f} (over {time.time() - started:.1f} s)")
            # Caught up: the page's book at the journal's end.
            time.sleep(3)
            stats = page.evaluate("fetch('/crossbook/stats').then(r => r.json())")
            book = page.evaluate("window.crossbook.book && window.crossbook.book.lastUpdateId")
            print(f"page_book_update_id {book} journal_seq {stats['seq']} messages_sent {stats['messagesSent']} slow_clients_dropped {stats['slowClientsDropped']}")
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(data, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
