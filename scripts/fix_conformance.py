#!/usr/bin/env python3
"""Run the QuickFIX FIX 4.4 acceptance scripts against a FIX acceptor.

Standard library only (Python 3.11). Reimplements the QuickFIX Ruby runner
(test/Reflector.rb, ReflectorClient.rb, FixParser.rb, Comparator.rb) closely:

* lines: `#` comment, blank, `iCONNECT`, `I<msg>`, `E<msg>`, `eDISCONNECT`,
  and the numbered forms `i1,CONNECT`, `I2,<msg>`, `E1,<msg>`, `e2,DISCONNECT`,
  `i1,DISCONNECT` (a digit followed by a comma; `I35=0|...` is connection 1).
  Files are CRLF; one trailing CR/LF is stripped like Ruby's chomp.
* `<TIME>`, `<TIME+n>`, `<TIME-n>`: UTC, `YYYYMMDD-HH:MM:SS` (seconds, as in
  QuickFIX's runner; the expected echoes' BodyLength values assume it), or
  with `.sss` under --time-ms. Substituted when the line is executed.
* "fixify" on I and E lines: if the text starts with `8=`, insert
  `9=<len>` right after the first field unless some `<SOH>9=` field is
  present, and append `10=<sum>` unless a `<SOH>10=...<SOH>` tail is present
  (the checksum covers the fields as sent, including a deliberately wrong
  9=). Text not starting with `8=` is sent byte for byte.
* E comparison: same field count, same tags in the same order; tags listed
  in fields.fmt match by regex (start-anchored by default, see
  --regex-mode), all others literally -- 9= included.
* eDISCONNECT: the acceptor must close the connection within the limit
  without sending anything further.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

SOH = "\x01"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONF_DIR = os.environ.get("FIX_CONFORMANCE_DIR") or os.path.normpath(os.path.join(REPO, "..", "shared", "conformance"))
DEFAULT_SCRIPTS = os.path.join(CONF_DIR, "fix44")
DEFAULT_SERVER_CMD = (
    "target/release/crossbook serve --config scripts/fix-conformance.toml"
    " --listen 127.0.0.1:0 --fix-listen 127.0.0.1:{port} --market-listen '' --data {data}"
)


def vis(s: str | bytes) -> str:
    """Printable form of a FIX message: SOH shown as '|'."""
    if isinstance(s, bytes):
        s = s.decode("latin-1")
    return s.replace(SOH, "|").replace("\r", "\\r").replace("\n", "\\n")


class Fail(Exception):
    """A script step failed: message plus optional expected/received."""

    def __init__(self, msg: str, expected: str | None = None, received: str | None = None):
        super().__init__(msg)
        self.expected = expected
        self.received = received


# --------------------------------------------------------------------------
# script parsing
# --------------------------------------------------------------------------

@dataclass
class Step:
    line: int
    kind: str  # connect | disconnect | send | expect | expect_disconnect
    cid: int
    text: str = ""  # raw message text (before time substitution / fixify)


_NUMBERED = re.compile(r"^[IEie]\d,")


def chomp(line: str) -> str:
    if line.endswith("\r\n"):
        return line[:-2]
    if line.endswith("\n") or line.endswith("\r"):
        return line[:-1]
    return line


def parse_script(path: str) -> list[Step]:
    with open(path, "rb") as f:
        data = f.read().decode("latin-1")
    steps: list[Step] = []
    for n, raw in enumerate(data.split("\n"), 1):
        line = chomp(raw + "\n")  # like Ruby's chomp!: drops "\r\n" or "\n"
        if not line or line.startswith("#"):
            continue
        if _NUMBERED.match(line):
            cid, body = int(line[1]), line[3:]
        else:
            cid, body = 1, line[1:]
        c = line[0]
        if c == "I":
            steps.append(Step(n, "send", cid, body))
        elif c == "E":
            steps.append(Step(n, "expect", cid, body))
        elif c == "i" and body == "CONNECT":
            steps.append(Step(n, "connect", cid))
        elif c == "i" and body == "DISCONNECT":
            steps.append(Step(n, "disconnect", cid))
        elif c == "e" and body == "DISCONNECT":
            steps.append(Step(n, "expect_disconnect", cid))
        elif c == "e" and body == "CONNECT":
            raise ValueError(f"{path}:{n}: eCONNECT (initiator-side script) is not supported")
        else:
            raise ValueError(f"{path}:{n}: syntax error: {vis(line)}")
    return steps


# --------------------------------------------------------------------------
# message construction (QuickFIX Reflector.rb timify!/fixify!)
# --------------------------------------------------------------------------

_TIME = re.compile(r"<TIME(?:([+-])(\d+))?>")


def fmt_time(t: dt.datetime, ms: bool) -> str:
    s = t.strftime("%Y%m%d-%H:%M:%S")
    return s + (".%03d" % (t.microsecond // 1000)) if ms else s


def timify(text: str, ms: bool = False, now: dt.datetime | None = None) -> str:
    now = now or dt.datetime.now(dt.timezone.utc)

    def sub(m: re.Match) -> str:
        t = now
        if m.group(1):
            secs = int(m.group(2))
            t = now + dt.timedelta(seconds=secs if m.group(1) == "+" else -secs)
        return fmt_time(t, ms)

    return _TIME.sub(sub, text)


def checksum(data: bytes | str) -> int:
    if isinstance(data, str):
        data = data.encode("latin-1")
    return sum(data) % 256


_HAS_LEN = re.compile("\x019=.*?\x01")
_HEAD = re.compile("^8=.*?\x01")
_CSUM_TAIL = re.compile("\x0110=.*\x01$")


@dataclass
class Fixed:
    text: str
    len_given: bool = False
    sum_given: bool = False
    raw: bool = False  # no leading 8= field: sent exactly as written


def fixify(text: str) -> Fixed:
    """Insert BodyLength after 8= and append CheckSum unless supplied."""
    has_len = _HAS_LEN.search(text) is not None
    m = _HEAD.match(text)
    if not m:
        return Fixed(text, raw=True)
    head, rest = m.group(0), text[m.end():]
    cs = _CSUM_TAIL.search(rest)
    tail = ""
    if cs:
        tail = cs.group(0)[1:]  # "10=...<SOH>" (keep the SOH before it in rest)
        rest = rest[: cs.start() + 1]
    length = "" if has_len else "9=%d%s" % (len(rest.encode("latin-1")), SOH)
    if not cs:
        tail = "10=%03d%s" % (checksum(head + length + rest), SOH)
    return Fixed(head + length + rest + tail, has_len, cs is not None)


def split_fields(msg: str) -> list[tuple[str, str]]:
    parts = msg.split(SOH)
    while parts and parts[-1] == "":  # Ruby String#split drops trailing empties
        parts.pop()
    out = []
    for p in parts:
        tag, _, val = p.partition("=")
        out.append((tag, val))
    return out


def load_patterns(path: str) -> dict[str, re.Pattern]:
    pats: dict[str, re.Pattern] = {}
    with open(path, "rb") as f:
        for raw in f.read().decode("latin-1").splitlines():
            raw = raw.strip("\r\n")
            if not raw:
                continue
            tag, _, rx = raw.partition("=")
            pats[str(int(tag))] = re.compile(rx)
    return pats


def compare(expected: str, received: str, pats: dict[str, re.Pattern], mode: str) -> str | None:
    """None if equal, else the reason (QuickFIX Comparator semantics)."""
    e, r = split_fields(expected), split_fields(received)
    if len(e) != len(r) or [t for t, _ in e] != [t for t, _ in r]:
        et, rt = [t for t, _ in e], [t for t, _ in r]
        missing = [t for t in et if t not in rt]
        extra = [t for t in rt if t not in et]
        hint = []
        if missing:
            hint.append("missing tags " + ",".join(missing))
        if extra:
            hint.append("unexpected tags " + ",".join(extra))
        if not hint:
            hint.append("tag order differs")
        if len(e) != len(r):
            return "number of fields differs: expected %d, received %d (%s)" % (len(e), len(r), "; ".join(hint))
        i = next(i for i in range(len(e)) if et[i] != rt[i])
        return "field %d: expected tag %s but found tag %s (%s)" % (i + 1, et[i], rt[i], "; ".join(hint))
    diffs = []
    for (et, ev), (rt, rv) in zip(e, r):
        rx = pats.get(et)
        if rx is None:
            if ev != rv:
                diffs.append("tag %s: expected %r but was %r" % (et, ev, rv))
        else:
            ok = {"search": rx.search, "match": rx.match, "full": rx.fullmatch}[mode](rv)
            if not ok:
                diffs.append("tag %s: value %r does not match /%s/" % (et, rv, rx.pattern))
    if not diffs:
        return None
    # a wrong BodyLength is usually a symptom: show the next difference too
    return "; ".join(diffs[:3]) + (" ..." if len(diffs) > 3 else "")


# --------------------------------------------------------------------------
# connections
# --------------------------------------------------------------------------

_TRAILER = re.compile(rb"10=(\d{3})\x01")


class Conn:
    def __init__(self, host: str, port: int, deadline: float, trace, cid: int = 1):
        self.trace, self.cid = trace, cid
        left = max(0.1, deadline - time.monotonic())
        try:
            self.sock = socket.create_connection((host, port), timeout=left)
        except OSError as e:
            raise Fail(f"cannot connect to {host}:{port}: {e}")
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setblocking(False)
        self.buf = bytearray()
        self.eof = False

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def send(self, data: bytes) -> None:
        self.sock.setblocking(True)
        try:
            self.sock.sendall(data)
        except OSError as e:
            raise Fail(f"send failed, connection dropped by the acceptor ({e.__class__.__name__})")
        finally:
            self.sock.setblocking(False)

    def _fill(self, deadline: float) -> bool:
        """Read more bytes; False on timeout. Sets eof on close/reset."""
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        r, _, _ = select.select([self.sock], [], [], left)
        if not r:
            return False
        try:
            chunk = self.sock.recv(65536)
        except BlockingIOError:
            return True
        except ConnectionResetError:
            self.eof = True
            return True
        if not chunk:
            self.eof = True
        self.buf += chunk
        return True

    def _extract(self) -> bytes | None:
        b = self.buf
        if not b:
            return None
        if not b.startswith(b"8="[: len(b)]):
            raise Fail("framing error: data does not start with 8=", received=vis(bytes(b)))
        i = b.find(b"\x019=")
        if i < 0:
            return None
        j = b.find(b"\x01", i + 3)
        if j < 0:
            return None
        try:
            length = int(b[i + 3 : j])
        except ValueError:
            raise Fail("framing error: bad BodyLength", received=vis(bytes(b)))
        end = j + 1 + length
        if len(b) < end + 7:
            return None
        m = _TRAILER.match(b, end)
        if not m:
            raise Fail(
                f"framing error: BodyLength {length} does not end right before '10=nnn<SOH>'",
                received=vis(bytes(b)),
            )
        msg, given = bytes(b[: m.end()]), int(m.group(1))
        del b[: m.end()]
        want = checksum(msg[:end])
        if given != want:
            raise Fail(f"acceptor sent a wrong CheckSum (should be {want:03d})", received=vis(msg))
        return msg

    def read_message(self, deadline: float, limit: float) -> str:
        while True:
            msg = self._extract()
            if msg is not None:
                s = msg.decode("latin-1")
                self.trace("<-", s, None, self.cid)
                return s
            if self.eof:
                extra = f" (partial data: {vis(bytes(self.buf))})" if self.buf else ""
                raise Fail("was disconnected, expected a message" + extra)
            if not self._fill(deadline):
                extra = f" (partial data: {vis(bytes(self.buf))})" if self.buf else ""
                raise Fail(f"no message within {limit:g} s" + extra)

    def expect_disconnect(self, deadline: float, limit: float) -> None:
        while True:
            if self.buf:
                # give a complete message a moment to arrive, for the report
                end = time.monotonic() + 0.2
                while not self.eof and self._fill(end):
                    pass
                raise Fail("expected disconnection, got data", received=vis(bytes(self.buf)))
            if self.eof:
                self.trace("<-", "<disconnected>", None, self.cid)
                self.close()
                return
            if not self._fill(deadline):
                raise Fail(f"connection still open {limit:g} s after eDISCONNECT began")


# --------------------------------------------------------------------------
# acceptor process
# --------------------------------------------------------------------------

def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def listening(port: int) -> bool | None:
    """True/False from /proc/net/tcp{,6}; None if /proc is unavailable."""
    seen = False
    for fn in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(fn) as f:
                next(f)
                seen = True
                for row in f:
                    cols = row.split()
                    if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                        return True
        except OSError:
            continue
    return False if seen else None


class Server:
    """One acceptor process with its own temp dir; start() then stop()."""

    def __init__(self, template: str, host: str, script: str, wait: float, cwd: str):
        self.template, self.script, self.wait, self.cwd = template, script, wait, cwd
        self.proc = None
        self.root = tempfile.mkdtemp(prefix="fixconf-")
        self.data = os.path.join(self.root, "data")
        os.mkdir(self.data)
        self.log_path = os.path.join(self.root, "acceptor.log")
        self.port = free_port(host)
        self.host = host
        self.log = open(self.log_path, "wb")

    def start(self) -> None:
        host, wait = self.host, self.wait
        cmd = self.template.format(port=self.port, data=self.data, host=host, script=self.script)
        self.argv = shlex.split(cmd)
        try:
            self.proc = subprocess.Popen(
                self.argv, cwd=self.cwd, stdin=subprocess.DEVNULL, stdout=self.log,
                stderr=subprocess.STDOUT, start_new_session=True,
            )
        except OSError as e:
            raise Fail(f"cannot start acceptor {cmd!r}: {e}")
        end = time.monotonic() + wait
        while True:
            if self.proc.poll() is not None:
                raise Fail(f"acceptor exited with status {self.proc.returncode} before listening")
            st = listening(self.port)
            if st is None:  # no /proc: probe by connecting
                try:
                    socket.create_connection((host, self.port), timeout=0.5).close()
                    st = True
                except OSError:
                    st = False
            if st:
                return
            if time.monotonic() > end:
                raise Fail(f"acceptor not listening on {host}:{self.port} after {wait:g} s")
            time.sleep(0.05)

    def log_tail(self, n: int = 15) -> str:
        try:
            if not self.log.closed:
                self.log.flush()
            with open(self.log_path, "rb") as f:
                lines = f.read().decode("utf-8", "replace").splitlines()[-n:]
        except OSError:
            return ""
        return "".join("\n    | " + vis(l) for l in lines) if lines else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait()
        if not self.log.closed:
            self.log.close()

    def cleanup(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


# --------------------------------------------------------------------------
# running a script
# --------------------------------------------------------------------------

@dataclass
class Result:
    name: str
    ok: bool
    seconds: float
    line: int = 0
    reason: str = ""
    expected: str | None = None
    received: str | None = None
    note: str = ""


def run_steps(steps: list[Step], host: str, port: int, opts, trace) -> None:
    conns: dict[int, Conn] = {}
    script_end = time.monotonic() + opts.script_timeout
    pats = opts.patterns
    try:
        for st in steps:
            opts.cur_line = st.line
            now = time.monotonic()
            if now > script_end:
                raise Fail(f"script time limit of {opts.script_timeout:g} s exceeded")

            def dl(limit: float) -> float:
                return min(now + limit, script_end)

            if st.kind == "connect":
                trace("..", f"c{st.cid} connect {host}:{port}", st.line)
                if st.cid in conns:
                    conns.pop(st.cid).close()
                conns[st.cid] = Conn(host, port, dl(opts.expect_timeout), trace, st.cid)
            elif st.kind == "disconnect":
                trace("..", f"c{st.cid} close", st.line)
                c = conns.pop(st.cid, None)
                if c is None:
                    raise Fail(f"i{st.cid},DISCONNECT: connection {st.cid} is not open")
                c.close()
            elif st.kind == "send":
                c = conns.get(st.cid)
                if c is None:
                    raise Fail("unable to send: connection %d is not open" % st.cid)
                msg = fixify(timify(st.text, opts.time_ms)).text
                trace("->", msg, st.line, st.cid)
                c.send(msg.encode("latin-1"))
            elif st.kind == "expect":
                c = conns.get(st.cid)
                if c is None:
                    raise Fail("cannot expect: connection %d is not open" % st.cid)
                exp = fixify(timify(st.text, opts.time_ms)).text
                trace("..", f"c{st.cid} expect {vis(exp)}", st.line)
                got = c.read_message(dl(opts.expect_timeout), opts.expect_timeout)
                why = compare(exp, got, pats, opts.regex_mode)
                if why:
                    raise Fail(why, expected=vis(exp), received=vis(got))
            elif st.kind == "expect_disconnect":
                c = conns.get(st.cid)
                if c is None:
                    raise Fail("eDISCONNECT: connection %d is not open" % st.cid)
                trace("..", f"c{st.cid} expect disconnect", st.line)
                c.expect_disconnect(dl(opts.disconnect_timeout), opts.disconnect_timeout)
                conns.pop(st.cid, None)
    finally:
        for c in conns.values():
            c.close()


def run_script(path: str, opts) -> Result:
    name = os.path.basename(path)
    t0 = time.monotonic()
    opts.cur_line = 0

    def trace(arrow: str, text: str, line: int | None = None, cid: int | None = None) -> None:
        if opts.verbose:
            where = f"L{line:<3}" if line else "    "
            c = f"c{cid} " if cid else ""
            print(f"  {time.monotonic() - t0:7.3f} {where} {arrow} {c}{vis(text)}", flush=True)

    if opts.verbose:
        print(f"== {name}", flush=True)
    server = None
    try:
        try:
            steps = parse_script(path)
        except ValueError as e:
            raise Fail(f"script parse error: {e}")
        if opts.address:
            host, port = opts.address
        else:
            server = Server(opts.server_cmd, opts.host, path, opts.start_timeout, opts.cwd)
            server.start()
            host, port = server.host, server.port
            trace("..", f"acceptor pid {server.proc.pid} on {host}:{port}: {' '.join(server.argv)}")
        run_steps(steps, host, port, opts, trace)
        ok, fail = True, None
    except Fail as f:
        ok, fail = False, f
    except Exception as e:  # a bug in the runner: report it, keep going
        ok, fail = False, Fail(f"runner error: {e.__class__.__name__}: {e}")
    finally:
        if server is not None:
            server.stop()
    res = Result(name, ok, time.monotonic() - t0)
    if not ok:
        res.line, res.reason = opts.cur_line, str(fail)
        res.expected, res.received = fail.expected, fail.received
        if server is not None:
            res.note = f"acceptor log: {server.log_path}{server.log_tail(8)}"
    if server is not None and ok and not opts.keep:
        server.cleanup()
    return res


# --------------------------------------------------------------------------
# dry run and self-check
# --------------------------------------------------------------------------

def dry_run(paths: list[str], opts) -> int:
    bad = 0
    for p in paths:
        print(f"== {os.path.basename(p)}")
        try:
            steps = parse_script(p)
        except ValueError as e:
            print(f"  PARSE ERROR {e}")
            bad += 1
            continue
        for st in steps:
            head = f"  L{st.line:<3} c{st.cid}"
            if st.kind in ("send", "expect"):
                fx = fixify(timify(st.text, opts.time_ms))
                flags = []
                if fx.raw:
                    flags.append("raw: no leading 8=, sent as written")
                else:
                    flags.append("9 given" if fx.len_given else "9 computed")
                    flags.append("10 given" if fx.sum_given else "10 computed")
                    if st.kind == "send":
                        flags.extend(wire_problems(fx.text))
                verb = "send  " if st.kind == "send" else "expect"
                print(f"{head} {verb} {vis(fx.text)}   [{', '.join(flags)}]")
            else:
                print(f"{head} {st.kind}")
    print(f"{len(paths) - bad} parsed, {bad} failed")
    return 1 if bad else 0


def wire_problems(msg: str) -> list[str]:
    """Describe what is deliberately wrong with an outgoing message."""
    out = []
    f = split_fields(msg)
    if [t for t, _ in f[:3]] != ["8", "9", "35"]:
        out.append("first three tags are not 8,9,35")
    m = re.search("\x019=(\\d+)\x01", msg)
    t = msg.rfind(SOH + "10=")
    if m and t >= 0:
        body = len(msg[m.end():t + 1].encode("latin-1"))
        if body != int(m.group(1)):
            out.append(f"BAD BodyLength: says {m.group(1)}, actual {body}")
        cs = msg[t + 4 : -1]
        if cs != "%03d" % checksum(msg[: t + 1]):
            out.append(f"BAD CheckSum: says {cs}, actual {checksum(msg[: t + 1]):03d}")
    return out


def self_check(paths: list[str], opts) -> int:
    errors = 0

    def check(cond: bool, what: str) -> None:
        nonlocal errors
        if not cond:
            errors += 1
            print("SELF-CHECK FAILED:", what)

    # 1. checksum against messages whose checksum is known from elsewhere
    known = [
        # QuickFIX/J MessageTest
        "8=FIX.4.2\x019=12\x0135=A\x01108=30\x0110=026\x01",
        # the FIX 4.4 Heartbeat built by the quickfix-py wheel (QuickFIX C++)
        "8=FIX.4.4\x019=19\x0135=0\x0149=TW\x0156=ISLD\x0110=003\x01",
        # QuickFIX/J 3.0.0 NewOrderSingle
        "8=FIX.4.4\x019=60\x0135=D\x0149=TW\x0156=ISLD\x0111=id\x0140=1\x0154=1"
        "\x0160=20261123-08:49:55.520\x0110=005\x01",
    ]
    for k in known:
        t = k.rfind("\x0110=")
        check("%03d" % checksum(k[: t + 1]) == k[t + 4 : -1], f"checksum of {vis(k)}")
        stripped = re.sub("\x019=\\d+", "", k[: t + 1])
        check(fixify(stripped).text == k, f"fixify reproduces {vis(k)}")

    # 2. every E line with an explicit 9=: with the time stamps at the widths
    #    the acceptor sends (52/122 with ms: 21 chars) and the runner echoes
    #    (60 as sent: 17 chars by default), the body length must be the one
    #    the script states. This pins both the 9= rule and the <TIME> format.
    width = {"52": 21, "122": 21, "60": 21 if opts.time_ms else 17}
    n_e = 0
    for p in paths:
        for st in parse_script(p):
            if st.kind != "expect":
                continue
            f = split_fields(timify(st.text, opts.time_ms))
            if len(f) < 2 or f[1][0] != "9":
                continue
            n_e += 1
            body = 0
            for tag, val in f[2:]:
                if tag == "10":
                    continue
                body += len(tag) + 1 + width.get(tag, len(val)) + 1
            check(body == int(f[1][1]),
                  f"{os.path.basename(p)}:{st.line}: 9={f[1][1]} but body is {body}")

    # 3. the deliberately broken I lines keep their defects, others are right
    n_i = 0
    for p in paths:
        base = os.path.basename(p)
        for st in parse_script(p):
            if st.kind != "send":
                continue
            n_i += 1
            fx = fixify(timify(st.text, opts.time_ms))
            probs = wire_problems(fx.text)
            if fx.raw:
                check(fx.text == timify(st.text, opts.time_ms), f"{base}:{st.line} raw line altered")
            elif not fx.len_given and not fx.sum_given:
                bad = [x for x in probs if "BAD" in x]
                check(not bad, f"{base}:{st.line}: computed 9/10 are wrong: {bad}")
                check(fx.text.startswith("8=FIX.4.4\x019=") or fx.text.startswith("8=FIX.4.1\x019=")
                      or fx.text.startswith("8=FIX.3.9\x019="),
                      f"{base}:{st.line}: 9= not right after 8=")
            else:
                check(any("BAD" in x for x in probs), f"{base}:{st.line}: supplied 9/10 but both are right?")

    # spot checks on the cases named in the brief
    def first_send(name: str, contains: str) -> Fixed:
        for p in paths:
            if os.path.basename(p) == name:
                for st in parse_script(p):
                    if st.kind == "send" and contains in st.text:
                        return fixify(timify(st.text, opts.time_ms))
        raise KeyError(name)

    try:
        fx = first_send("1d_InvalidLogonLengthInvalid.def", "9=40")
        check(fx.len_given and not fx.sum_given and "9=40\x01" in fx.text
              and not any("CheckSum" in p for p in wire_problems(fx.text)), "1d: 9=40 kept, 10 correct")
        fx = first_send("2m_BodyLengthValueNotCorrect.def", "9=30")
        check("9=30\x01" in fx.text and not any("CheckSum" in p for p in wire_problems(fx.text)), "2m 9=30")
        fx = first_send("2m_BodyLengthValueNotCorrect.def", "9=111")
        check("9=111\x01" in fx.text, "2m 9=111")
        fx = first_send("3b_InvalidChecksum.def", "10=256")
        check(fx.text.endswith("\x0110=256\x01") and not any("BodyLength" in p for p in wire_problems(fx.text)),
              "3b: 10=256 kept, 9 computed")
        fx = first_send("2t_FirstThreeFieldsOutOfOrder.def", "35=0\x018=")
        check(fx.raw, "2t: line starting 35= sent raw")
        fx = first_send("2t_FirstThreeFieldsOutOfOrder.def", "34=3\x0135=0")
        check(fx.text.startswith("8=FIX.4.4\x019=") and wire_problems(fx.text) == ["first three tags are not 8,9,35"],
              "2t: 9 inserted after 8= (34 still precedes 35), 9 and 10 correct")
    except KeyError as e:
        print(f"(spot check skipped: {e} not among the scripts)")

    print(f"self-check: {n_e} E lines with 9=, {n_i} I lines, {errors} problem(s)")
    return 1 if errors else 0


# --------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------

def collect(targets: list[str]) -> list[str]:
    out: list[str] = []
    for t in targets or [DEFAULT_SCRIPTS]:
        if os.path.isdir(t):
            out += sorted(os.path.join(t, f) for f in os.listdir(t) if f.endswith(".def"))
        elif os.path.isfile(t):
            out.append(t)
        elif os.path.isfile(os.path.join(DEFAULT_SCRIPTS, t)):
            out.append(os.path.join(DEFAULT_SCRIPTS, t))
        elif os.path.isfile(os.path.join(DEFAULT_SCRIPTS, t + ".def")):
            out.append(os.path.join(DEFAULT_SCRIPTS, t + ".def"))
        else:
            sys.exit(f"no such script or directory: {t}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Run QuickFIX FIX 4.4 acceptance scripts (*.def) against a FIX acceptor.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
        "  scripts/fix-conformance                         # all 59 scripts, spawn the default acceptor\n"
        "  scripts/fix-conformance 2c_MsgSeqNumTooLow 14e   # names resolve in the default dir\n"
        "  scripts/fix-conformance --server-cmd 'target/release/crossbook serve --config scripts/fix-conformance.toml"
        " --listen 127.0.0.1:0 --fix-listen 127.0.0.1:{port} --market-listen \"\" --data {data}'\n"
        "  scripts/fix-conformance --address 127.0.0.1:9878 -v 4b_ReceivedTestRequest.def\n"
        "  scripts/fix-conformance --dry-run | less ; scripts/fix-conformance --self-check\n"
        "\nserver-cmd placeholders: {port} {host} {data} (fresh empty dir) {script} (path of the .def);\n"
        "the command runs from the repository root, in its own process group, killed after each script.",
    )
    ap.add_argument("targets", nargs="*", help="script files or directories (default: %s)" % DEFAULT_SCRIPTS)
    ap.add_argument("--server-cmd", default=os.environ.get("FIX_SERVER_CMD", DEFAULT_SERVER_CMD),
                    help="acceptor command template (default: %(default)r)")
    ap.add_argument("--address", metavar="HOST:PORT",
                    help="use an already running acceptor instead of spawning one per script")
    ap.add_argument("--host", default="127.0.0.1", help="address for spawned acceptors (default: %(default)s)")
    ap.add_argument("--fields", default=None, help="fields.fmt (default: next to the scripts' directory)")
    ap.add_argument("--expect-timeout", type=float, default=10.0, help="seconds per E line (default: %(default)s)")
    ap.add_argument("--disconnect-timeout", type=float, default=10.0,
                    help="seconds per eDISCONNECT (default: %(default)s, as QuickFIX)")
    ap.add_argument("--script-timeout", type=float, default=60.0, help="seconds per script (default: %(default)s)")
    ap.add_argument("--start-timeout", type=float, default=10.0,
                    help="seconds to wait for a spawned acceptor to listen (default: %(default)s)")
    ap.add_argument("--regex-mode", choices=("match", "search", "full"), default="match",
                    help="how fields.fmt patterns apply: match = anchored at the start (default), "
                    "search = anywhere (QuickFIX), full = whole value (rejects 122 with .sss)")
    ap.add_argument("--time-ms", action="store_true",
                    help="<TIME> with milliseconds (breaks the scripts' 9= values of echoed orders)")
    ap.add_argument("--keep", action="store_true", help="keep every acceptor's temp dir (default: only on failure)")
    ap.add_argument("-x", "--exitfirst", action="store_true", help="stop after the first failure")
    ap.add_argument("-v", "--verbose", action="store_true", help="trace every step")
    ap.add_argument("--dry-run", action="store_true", help="parse the scripts and print what would be sent/expected")
    ap.add_argument("--self-check", action="store_true", help="check 9=/10= handling against the scripts and exit")
    opts = ap.parse_args(argv)

    paths = collect(opts.targets)
    if opts.dry_run:
        return dry_run(paths, opts)
    if opts.self_check:
        return self_check(paths, opts)

    fields = opts.fields
    if fields is None:
        cand = [os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(paths[0]))), "fields.fmt"),
                os.path.join(CONF_DIR, "fields.fmt")]
        fields = next((c for c in cand if os.path.isfile(c)), cand[-1])
    opts.patterns = load_patterns(fields)
    opts.cwd = REPO
    if opts.address:
        h, _, p = opts.address.rpartition(":")
        opts.address = (h or "127.0.0.1", int(p))

    passed = failed = 0
    for i, p in enumerate(paths):
        if opts.address and i:
            time.sleep(0.1)
        r = run_script(p, opts)
        if r.ok:
            passed += 1
            if opts.verbose:
                print(f"ok   {r.name} ({r.seconds:.1f} s)", flush=True)
        else:
            failed += 1
            first, _, more = r.reason.partition("\n")
            where = f"{r.name}:{r.line}" if r.line else f"{r.name} (acceptor start)"
            print(f"FAIL {where}: {first} ({r.seconds:.1f} s)")
            if more:
                print(more)
            if r.expected is not None:
                print(f"  expected: {r.expected}")
            if r.received is not None:
                print(f"  received: {r.received}")
            if r.note:
                print(f"  {r.note}")
            sys.stdout.flush()
            if opts.exitfirst:
                break
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
