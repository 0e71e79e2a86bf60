"""What the scripts that drive `crossbook serve` with real clients share:
starting a server on free ports, and counting checks.

Used by scripts/trading_test.py and scripts/dashboard_test.py (Python puts
a script's own folder on the import path, so `import servetest` finds it).
"""

import re
import signal
import subprocess
import threading
import time


class OutOfTime(BaseException):
    """Raised by the alarm; not an Exception, so no check swallows it."""


def time_limit(seconds):
    """Raises OutOfTime in the main thread after `seconds` (SIGALRM);
    `signal.alarm(0)` cancels it."""
    def out_of_time(signum, frame):
        raise OutOfTime()
    signal.signal(signal.SIGALRM, out_of_time)
    signal.alarm(seconds)


class Checks:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, name, ok, detail=""):
        if ok:
            self.passed += 1
            print(f"ok   {name}", flush=True)
        else:
            self.failed += 1
            print(f"FAIL {name}: {detail}", flush=True)
        return ok

    def equal(self, name, got, wanted):
        return self.check(name, got == wanted, f"got {got!r}, wanted {wanted!r}")

    def run(self, name, fn, *args):
        """Runs a step; an exception fails it (named) and the run goes on."""
        try:
            return fn(*args)
        except OutOfTime:
            raise
        except Exception as e:
            self.check(name, False, f"raised {type(e).__name__}: {e}")
            return None

    def raises(self, name, expected, fn):
        """The call must raise `expected` (an exception class)."""
        try:
            result = fn()
        except OutOfTime:
            raise
        except expected:
            return self.check(name, True)
        except Exception as e:
            return self.check(name, False, f"raised {type(e).__name__}: {e}, wanted {expected.__name__}")
        return self.check(name, False, f"no error, wanted {expected.__name__}; returned {str(result)[:300]}")


def start_server(binary, data, config=None, market="127.0.0.1:0"):
    """Starts `crossbook serve` (binary protocol and market data on free ports,
    or market data on `market`; no FIX) on `data`, with the configuration
    file `config` (default: the built-in one); returns (process, binary
    address, market address)."""
    process = subprocess.Popen(
        [binary, "serve", "--listen", "127.0.0.1:0", "--fix-listen", "", "--market-listen", market, "--data", data]
        + (["--config", config] if config else []),
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    found = {}

    def read():
        for line in process.stderr:
            match = re.match(r"market data on http://([^/]+)/", line)
            if match:
                found["market"] = match.group(1)
            if line.startswith("listening on "):
                found["binary"] = line.split()[2]
        found["eof"] = True

    # Keep reading its log so that it never blocks on a full pipe.
    threading.Thread(target=read, daemon=True).start()
    deadline = time.time() + 30
    while time.time() < deadline and not ("binary" in found and "market" in found) and "eof" not in found:
        time.sleep(0.05)
    if not ("binary" in found and "market" in found):
        process.kill()
        raise SystemExit("the server did not start")
    return process, found["binary"], found["market"]
