#!/usr/bin/env python3
"""What each lock kind's cycle costs the Redis server, in instructions and commands, beside
the peers' cycles measured in the same run.

    python3 scripts/kind_cost.py [--only WORD,..] [--cycles N]

A throw-away redis-server (`$REDIS_SERVER`, else `redis-server` from PATH) on a free
loopback port runs under valgrind's callgrind, which counts the instructions it executes
(the same on every run, unlike times on a shared machine). Every figure is on one basis:
the **whole server** (reading and parsing commands, scripts and the commands they call,
replies, notices written to subscribers) **minus `serverCron`** (the timer that runs
whatever the load), per cycle, over N pipelined cycles (256 by default) sent after a
warm-up pass of the same cycles. Commands per cycle count every command Redis ran
(`INFO commandstats`), the calls inside scripts included.

Each row sends what a client sends to one server (no call ids), with the scripts of
`lua/` joined as `crates/lockwarden-core/src/store/redis/scripts.rs` joins them: where the
server has functions (Redis 7), the plain take and a semaphore's acquire and release as
functions (`FCALL`), and two rows send the take as a script (`EVALSHA`), as to Redis 6.2
or a user without `FUNCTION LOAD`. A row
whose cycle wakes a waiter has a subscriber connection on the channels it publishes to,
as a waiting client has. The peers are written as their public projects send them, for
this measurement only: `hexcowboy/rslock` (`SET key value NX PX ttl`, its
compare-and-delete script) and `swarthy/redis-semaphore` (its acquire script over a
sorted set, `ZREM` to release; a refused acquire polls).

`--only` keeps the rows of some groups: `peer` (rslock, redis-semaphore), `lock`, `claim`,
`multi`, `rw`, `fair`, `permit`, `rate` (e.g. `--only peer,lock`; `scripts/script_cost.sh`
runs those two). `rate` counts rate decisions (`lua/rate_limit.lua`, a policy of 100 per
second, 20 at once: admitted on a key without a bucket, on one with a debt, refused, and
under two policies) beside a minimal GCRA script, redis-cell's algorithm written in Lua
for this comparison only, on the same keys in the same states, and prints their ratios.
The group `floor` (run only when asked for) measures prototypes that are not the
library's, to show where a target's floor lies: the plain take written first (`HSETNX`,
then `PEXPIRE .. NX`, Redis 7), a waiter's mark of one field (which a release's count
cannot tell from its own hold), one named by the holder it waits on (found with
`HRANDFIELD`; the library writes two fields), and a semaphore whose holds live in its
leases only (released with `ZREM` and `EXISTS`).
Needs valgrind and callgrind_annotate (apt-get install valgrind). A full run takes a few
minutes.
"""
import argparse
import hashlib
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
LUA = os.path.join(ROOT, "lua")
LEASE = 30000
# How long a waiter stays registered: long enough for a pass under callgrind, which runs
# Redis some fifty times slower.
WAIT = 600000


# ---------------------------------------------------------------------------------------
# The server under callgrind


class Server:
    """redis-server under callgrind, spoken to over one connection (plus subscribers)."""

    def __init__(self):
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self.dir = tempfile.mkdtemp()
        binary = os.environ.get("REDIS_SERVER", "redis-server")
        self.proc = subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={self.dir}/cg",
             binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.conn = self.connect()
        self.dumps = 0
        # Valkey answers a `redis_version` of the Redis it is compatible with, and its own.
        valkey = self.info_field("server", "valkey_version")
        self.version = (f"Valkey {valkey}" if valkey != "?"
                        else f"Redis {self.info_field('server', 'redis_version')}")

    def connect(self):
        deadline = time.monotonic() + 60
        while True:
            try:
                return Conn(socket.create_connection(("127.0.0.1", self.port)))
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def call(self, *args):
        return self.conn.call(*args)

    def info_field(self, section, name):
        for line in self.call("INFO", section).decode().splitlines():
            if line.startswith(name + ":"):
                return line.split(":", 1)[1].strip()
        return "?"

    def load(self, source):
        return self.call("SCRIPT", "LOAD", source).decode()

    def commands(self):
        """Every command run since the last CONFIG RESETSTAT, the counters' own excluded."""
        total = 0
        for line in self.call("INFO", "commandstats").decode().splitlines():
            if not line.startswith("cmdstat_"):
                continue
            name, rest = line[len("cmdstat_"):].split(":", 1)
            if name in ("config|resetstat", "info"):
                continue
            total += int(dict(kv.split("=") for kv in rest.split(","))["calls"])
        return total

    def measured(self, send):
        """Instructions (whole server minus serverCron) and commands while `send` runs."""
        self.call("CONFIG", "RESETSTAT")
        control = ["callgrind_control", "-z", str(self.proc.pid)]
        subprocess.run(control, check=True, capture_output=True)
        send()
        control[1] = "-d"
        subprocess.run(control, check=True, capture_output=True)
        self.dumps += 1
        dump = f"{self.dir}/cg.{self.dumps}"
        for _ in range(100):
            if os.path.exists(dump):
                break
            time.sleep(0.1)
        out = subprocess.run(
            ["callgrind_annotate", "--inclusive=yes", "--threshold=100", "--auto=no", dump],
            check=True, capture_output=True, text=True).stdout
        total = cron = 0
        for line in out.splitlines():
            words = line.split()
            if len(words) < 2 or not words[0][0].isdigit():
                continue
            if "PROGRAM TOTALS" in line:
                total = int(words[0].replace(",", ""))
            elif ":serverCron " in line:
                cron = int(words[0].replace(",", ""))
        return total - cron, self.commands()

    def close(self):
        try:
            self.conn.sock.sendall(b"*2\r\n$8\r\nSHUTDOWN\r\n$6\r\nNOSAVE\r\n")
        except OSError:
            pass
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class Conn:
    """One RESP2 connection."""

    def __init__(self, sock):
        self.sock = sock
        self.replies = sock.makefile("rb")

    def call(self, *args):
        return self.pipeline([args])[0]

    def pipeline(self, commands):
        self.sock.sendall(b"".join(encode(c) for c in commands))
        return [self.reply() for _ in commands]

    def reply(self):
        line = self.replies.readline()
        kind, rest = line[:1], line[1:-2]
        if kind == b"-":
            return Error(rest.decode())
        if kind == b"+":
            return rest
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self.replies.read(n + 2)[:-2]
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.reply() for _ in range(n)]
        raise RuntimeError(f"unreadable reply {line!r}")

    def drain(self, messages):
        for _ in range(messages):
            self.reply()


class Error(str):
    pass


def encode(args):
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        arg = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    return b"".join(out)


# ---------------------------------------------------------------------------------------
# Rows: a row sends, per cycle, a list of commands, each with what its reply must be.


class Step:
    """One command and a check of its reply (a value, or a function that says yes)."""

    def __init__(self, args, expect=None):
        self.args, self.expect = args, expect

    def check(self, reply):
        if isinstance(reply, Error):
            raise RuntimeError(f"{self.args[0]} answered {reply}")
        ok = self.expect is None or (
            self.expect(reply) if callable(self.expect) else reply == self.expect)
        if not ok:
            raise RuntimeError(f"{' '.join(map(str, self.args[:2]))}: unexpected {reply!r}")


def run(server, steps_of, cycles, before=None, subscribe=None):
    """Measures `steps_of(i, round)` for i in range(cycles), after a warm-up round; `before`
    (unmeasured) runs ahead of each round's cycles; `subscribe(i)` names a channel a
    subscriber listens on. Returns (instructions, commands) per cycle."""
    listener = None
    if subscribe:
        listener = server.connect()
        channels = [subscribe(i) for i in range(cycles)]
        listener.sock.sendall(encode(["SUBSCRIBE", *channels]))
        listener.drain(len(channels))
    result = None
    for rnd in range(2):
        if before:
            steps = [s for i in range(cycles) for s in before(i, rnd)]
            for step, reply in zip(steps, server.conn.pipeline([s.args for s in steps])):
                step.check(reply)
        steps = [s for i in range(cycles) for s in steps_of(i, rnd)]
        replies = []

        def send():
            replies.extend(server.conn.pipeline([s.args for s in steps]))

        if rnd == 0:
            send()
        else:
            result = server.measured(send)
        for step, reply in zip(steps, replies):
            step.check(reply)
        if listener:
            listener.sock.settimeout(0.5)
            try:
                while True:
                    listener.reply()
            except (socket.timeout, OSError):
                pass
            listener.sock.settimeout(None)
    if listener:
        listener.sock.close()
    instructions, commands = result
    return instructions / cycles, commands / cycles


# ---------------------------------------------------------------------------------------
# The scripts as the client sends them to one server (see scripts.rs)

SCRIPTS = {
    "acquire": ("acquire.lua",),
    "release": ("once.lua", "release.lua"),
    "multi_acquire": ("once.lua", "token.lua", "multi_acquire.lua"),
    "read": ("clock.lua", "once.lua", "token.lua", "rw_prelude.lua", "rw_read_acquire.lua"),
    "write": ("clock.lua", "once.lua", "token.lua", "rw_prelude.lua", "rw_write_acquire.lua"),
    "rw_release": ("clock.lua", "once.lua", "token.lua", "rw_prelude.lua", "rw_release.lua"),
    "fair_acquire": ("clock.lua", "once.lua", "token.lua", "fair_prelude.lua", "fair_acquire.lua"),
    "fair_release": ("clock.lua", "once.lua", "token.lua", "fair_prelude.lua", "fair_release.lua"),
    "permits_acquire": ("permits_prelude.lua", "permits_acquire.lua"),
    "permits_release": ("permits_prelude.lua", "permits_release.lua"),
}
# The lines of a script's variants the client picks (scripts.rs): an acquire of a semaphore
# takes an idle one first, its first attempt on one server does not look for its place.
VARIANTS = {"permits_acquire": [("\nlocal taking = false\n", "\nlocal taking = true\n")]}


def source(name):
    text = "".join(open(os.path.join(LUA, f)).read() for f in SCRIPTS[name])
    for written, sent in VARIANTS.get(name, []):
        assert written in text, f"{name}: no line {written!r}"
        text = text.replace(written, sent)
    return text


def replaced(text, old, new):
    """`text` with `old` written as `new`; fails if `text` has no `old` (a script drifted)."""
    if old not in text:
        raise RuntimeError(f"no {old!r} in the script")
    return text.replace(old, new)


def unfenced(text):
    return replaced(text, "\nlocal fenced = true\n", "\nlocal fenced = false\n")


def waiting(text):
    """The take of an attempt that waits (an earlier one was refused): a refusal marks."""
    return replaced(text, "\nlocal waiting = false\n", "\nlocal waiting = true\n")


# How acquire.lua marks a lock a waiter is refused (`~w1`, `~w2`).
MARK = "redis.call('HSET', KEYS[1], '~w1', '1', '~w2', '1')"


def function_library(text):
    """A script as scripts.rs makes it a Redis function: a library of its own, named (as
    its one function) by the script's digest. Returns (name, library)."""
    name = "lockwarden_" + hashlib.sha1(text.encode()).hexdigest()
    return name, (f"#!lua name={name}\nredis.register_function('{name}', "
                  f"function(KEYS, ARGV)\n{text}end)\n")


class Lockwarden:
    """The calls of a lockwarden client to one server, by kind. Where the server has
    functions (Redis 7) the plain take and a semaphore's acquire and release go as ones
    (`FCALL`), as the client sends them; `scripts=True` sends them as scripts (`EVALSHA`), as to Redis
    6.2 or a user without `FUNCTION LOAD`."""

    def __init__(self, server, scripts=False):
        self.sha = {name: server.load(source(name)) for name in SCRIPTS}
        # The plain take's variants, each with its command and what names it: (FCALL,
        # function) or (EVALSHA, digest).
        takes = {"acquire": source("acquire"), "unfenced": unfenced(source("acquire")),
                 "waiting": waiting(source("acquire")), "permits": source("permits_acquire"),
                 "permits_release": source("permits_release")}
        self.take = {}
        for name, text in takes.items():
            self.take[name] = ("EVALSHA", server.load(text))
            function, library = function_library(text)
            loaded = server.call("FUNCTION", "LOAD", library)
            if scripts or (isinstance(loaded, Error) and "already exists" not in loaded):
                continue
            self.take[name] = ("FCALL", function)
        self.client = str(uuid.uuid4())
        self.holders = 0

    def holder(self):
        """A holder made for one acquisition, as the client names them."""
        self.holders += 1
        return f"{self.client}:{self.holders}"

    @staticmethod
    def key(name):
        k = f"lockwarden:{{{name}}}"
        return {"lock": k, "fence": k + ":fence", "channel": k + ":released",
                "done": k + ":done", "queue": k + ":queue", "deadlines": k + ":deadlines",
                "leases": k + ":leases", "writers": k + ":writers", "readers": k + ":readers",
                "readable": k + ":readable", "waiting": k + ":waiting",
                "waiting_until": k + ":waiting-until", "granted": k + ":granted"}

    # The plain lock and claims
    def acquire(self, k, holder, fenced=True, expect=None, waits=False):
        """An attempt; `waits`: one after a refusal, whose refusal marks the lock."""
        variant = "waiting" if waits else ("acquire" if fenced else "unfenced")
        command, name = self.take[variant]
        return Step([command, name, 2, k["lock"], k["fence"], holder, LEASE], expect)

    def claim(self, k, holder, expect=None):
        command, name = self.take["acquire"]
        return Step([command, name, 3, k["lock"], k["fence"], k["done"], holder, LEASE],
                    expect)

    def release_alone(self, k, holder, marked=False):
        """A fresh holder's release: HDEL of its field and of a waiter's mark, and the
        notice only if it deleted a mark (`marked`: HDEL then answers 3)."""
        if not marked:
            return [Step(["HDEL", k["lock"], holder, "~w1", "~w2"], 1)]
        return [Step(["HDEL", k["lock"], holder, "~w1", "~w2"], 3),
                Step(["PUBLISH", k["channel"], "0"])]

    def release(self, k, holder, expect=0):
        return [Step(["EVALSHA", self.sha["release"], 2, k["lock"], k["fence"], holder,
                      k["channel"], ""], expect)]

    def complete(self, k, holder):
        return [Step(["EVALSHA", self.sha["release"], 3, k["lock"], k["fence"], k["done"],
                      holder, k["channel"], "", "done", 60000], 0)]

    def multi(self, ks, holder):
        keys = [name for k in ks for name in (k["lock"], k["fence"])]
        return Step(["EVALSHA", self.sha["multi_acquire"], len(keys), *keys, holder, LEASE, "1"],
                    lambda r: isinstance(r, list) and r[0] == 1)

    # Read-write
    @staticmethod
    def rw_keys(k):
        return [5, k["lock"], k["leases"], k["fence"], k["writers"], k["readers"]]

    def read(self, k, holder, register=0, expect=None):
        return Step(["EVALSHA", self.sha["read"], *self.rw_keys(k), holder, LEASE, "1",
                     register, "0"], expect)

    def write(self, k, holder, register=0, expect=None):
        return Step(["EVALSHA", self.sha["write"], *self.rw_keys(k), holder, LEASE, register,
                     "1"], expect)

    def rw_release(self, k, holder, side):
        return [Step(["EVALSHA", self.sha["rw_release"], *self.rw_keys(k), holder, side,
                      k["channel"], k["readable"], ""], 0)]

    # Fair
    @staticmethod
    def fair_keys(k):
        return [4, k["lock"], k["fence"], k["queue"], k["deadlines"]]

    def fair(self, k, holder, expect=None):
        return Step(["EVALSHA", self.sha["fair_acquire"], *self.fair_keys(k), holder, LEASE,
                     WAIT, k["channel"] + ":", "1", "0", "1"], expect)

    def fair_release(self, k, holder):
        return [Step(["EVALSHA", self.sha["fair_release"], *self.fair_keys(k), holder,
                      k["channel"] + ":", ""], 0)]

    def wake_channel(self, k):
        return k["channel"] + ":" + self.client

    # Semaphores: one sorted set at the lock's name, and the fencing key
    @staticmethod
    def permits_keys(k):
        return [2, k["lock"], k["fence"]]

    @staticmethod
    def permit_member(holder):
        """A hold's first member (and its place in line): `<permits>:<lease ms>:<holder>`."""
        return f"1:{LEASE}:{holder}"

    def permit(self, k, holder, capacity, register=0, expect=None):
        command, name = self.take["permits"]
        return Step([command, name, *self.permits_keys(k),
                     self.permit_member(holder), LEASE, f"-{capacity}", register,
                     k["granted"]], expect)

    def permit_release(self, k, holder, waiting=0):
        """A release of a semaphore the client has seen no waiters of: ZREM, the capacity
        with the last hold, the count of the line; the grant script when someone waits."""
        steps = [Step(["ZREM", k["lock"], self.permit_member(holder)], 1),
                 Step(["ZREMRANGEBYRANK", k["lock"], -1, 0]),
                 Step(["ZCOUNT", k["lock"], "1e15", "+inf"], waiting)]
        if waiting:
            command, name = self.take["permits_release"]
            steps.append(Step([command, name, *self.permits_keys(k), "", k["granted"]],
                              released))
        return steps

    def permit_release_script(self, k, holder):
        """A release of a contended semaphore (the client has waiters of its own in line,
        or its last release of it left waiters): the script that grants."""
        command, name = self.take["permits_release"]
        return [Step([command, name, *self.permits_keys(k), self.permit_member(holder),
                      k["granted"]], released)]


def is_token(reply):
    return isinstance(reply, int) and reply > 0


def released(reply):
    """A semaphore release's answer: 0, or 1 with waiters maybe left in line."""
    return reply in (0, 1)


def refused(reply):
    """A refused attempt: bare (-2 - pttl) or {0, ms}."""
    return isinstance(reply, int) and reply < 0 or isinstance(reply, list) and reply[0] == 0


class Rslock:
    """hexcowboy/rslock's calls: SET NX PX with a random value, a compare-and-delete script."""

    UNLOCK = ('\nif redis.call("GET", KEYS[1]) == ARGV[1] then\n'
              '  return redis.call("DEL", KEYS[1])\nelse\n  return 0\nend\n')

    def __init__(self, server):
        self.unlock_sha = server.load(self.UNLOCK)

    @staticmethod
    def value():
        # rslock's value: 20 random bytes.
        return bytes(random.getrandbits(8) for _ in range(20))

    @staticmethod
    def lock(key, value, expect=b"OK"):
        return Step(["SET", key, value, "NX", "PX", LEASE], expect)

    def unlock(self, key, value):
        return Step(["EVALSHA", self.unlock_sha, 1, key, value], 1)


class RedisSemaphore:
    """swarthy/redis-semaphore's calls: its acquire script over a sorted set of holders
    scored by the client's clock, and ZREM to release."""

    ACQUIRE = """
  local key = KEYS[1]
  local limit = tonumber(ARGV[1])
  local identifier = ARGV[2]
  local lockTimeout = tonumber(ARGV[3])
  local now = tonumber(ARGV[4])
  local expiredTimestamp = now - lockTimeout

  redis.call('zremrangebyscore', key, '-inf', expiredTimestamp)

  if redis.call('zcard', key) < limit then
    redis.call('zadd', key, now, identifier)
    redis.call('pexpire', key, lockTimeout)
    return 1
  else
    return 0
  end"""

    def __init__(self, server):
        self.sha = server.load(self.ACQUIRE)

    def acquire(self, key, identifier, limit, expect=1):
        now = int(time.time() * 1000)
        return Step(["EVALSHA", self.sha, 1, key, limit, identifier, LEASE, now], expect)

    @staticmethod
    def release(key, identifier):
        return Step(["ZREM", key, identifier], 1)


# ---------------------------------------------------------------------------------------


def rows(server, n):
    lw, rs, sem = Lockwarden(server), Rslock(server), RedisSemaphore(server)
    def keys(prefix, i, rnd=None):
        return lw.key(f"{prefix}{i}" if rnd is None else f"{prefix}{rnd}:{i}")

    # Who holds each key of a handoff row: the cycle's waiter takes over from it.
    held = {}

    def handoff(row, i, take):
        """The holder of key i of `row`, replaced by `take()`'s new one."""
        before = held.get((row, i))
        held[(row, i)] = take()
        return before, held[(row, i)]

    yield ("rslock: SET NX PX + compare-and-delete", "peer", lambda: run(
        server, lambda i, rnd: (lambda v: [rs.lock(f"rs{i}", v), rs.unlock(f"rs{i}", v)])(
            rs.value()), n))

    def rslock_handoff(i, rnd):
        old, new = handoff("rs", i, rs.value)
        return [rs.lock(f"rsh{i}", new, None), rs.unlock(f"rsh{i}", old), rs.lock(f"rsh{i}", new)]

    yield ("rslock handoff: refused SET NX, release, SET NX", "peer", lambda: run(
        server, rslock_handoff, n,
        before=lambda i, rnd: [rs.lock(f"rsh{i}", held.setdefault(("rs", i), rs.value()))]
        if rnd == 0 else []))

    yield ("redis-semaphore: acquire + ZREM (limit 10)", "peer", lambda: run(
        server, lambda i, rnd: (lambda h: [sem.acquire(f"sem{i}", h, 10), sem.release(
            f"sem{i}", h)])(lw.holder()), n))

    def semaphore_handoff(i, rnd):
        old, new = handoff("sem", i, lw.holder)
        return [sem.acquire(f"semh{i}", new, 1, 0), sem.release(f"semh{i}", old),
                sem.acquire(f"semh{i}", new, 1)]

    yield ("redis-semaphore handoff: refused acquire, ZREM, acquire (limit 1)", "peer",
           lambda: run(server, semaphore_handoff, n, before=lambda i, rnd: [
               sem.acquire(f"semh{i}", held.setdefault(("sem", i), lw.holder()), 1)]
               if rnd == 0 else []))

    def lock_cycle(prefix, fenced=True, fresh=False, via=lw):
        def steps(i, rnd):
            k, h = keys(prefix, i, rnd if fresh else None), via.holder()
            return [via.acquire(k, h, fenced, is_token if fenced else 0),
                    *via.release_alone(k, h)]
        return steps

    yield ("lock: acquire + release (a fresh holder's)", "lock", lambda: run(
        server, lock_cycle("l"), n))
    yield ("lock on a key never taken before", "lock", lambda: run(
        server, lock_cycle("lf", fresh=True), n))
    yield ("lock without fencing tokens", "lock", lambda: run(
        server, lock_cycle("lu", fenced=False), n))

    def lock_reentrant(i, rnd):
        k, h = keys("lr", i), lw.holder()
        return [lw.acquire(k, h, True, is_token), *lw.release(k, h)]

    yield ("lock, holder handed out: acquire + release script", "lock", lambda: run(
        server, lock_reentrant, n))

    def lock_handoff(prefix, via=lw):
        def steps(i, rnd):
            k = keys(prefix, i)
            old, new = handoff(prefix, i, via.holder)
            return [via.acquire(k, new, True, refused, waits=True),
                    *via.release_alone(k, old, marked=True),
                    via.acquire(k, new, True, is_token, waits=True)]

        def before(i, rnd):
            if rnd:
                return []
            holder = held.setdefault((prefix, i), via.holder())
            return [via.acquire(keys(prefix, i), holder, True, is_token)]
        return lambda: run(server, steps, n, before=before,
                           subscribe=lambda i: keys(prefix, i)["channel"])

    yield ("lock handoff: refused attempt, release, acquire", "lock", lock_handoff("lh"))
    # As sent to Redis 6.2, or by a user without FUNCTION LOAD: the take as a script.
    scripted = Lockwarden(server, scripts=True)
    yield ("lock, the take as a script (EVALSHA): acquire + release", "lock", lambda: run(
        server, lock_cycle("ls", via=scripted), n))
    yield ("lock handoff, the take as a script (EVALSHA)", "lock", lock_handoff(
        "lsh", via=scripted))

    def claim_cycle(i, rnd):
        k, h = keys("c", i, rnd), lw.holder()
        return [lw.claim(k, h, is_token), *lw.complete(k, h)]

    yield ("claim: claim + complete (fresh keys)", "claim", lambda: run(
        server, claim_cycle, n))

    def multi_cycle(i, rnd):
        ks, h = [keys(f"m{j}-", i) for j in range(3)], lw.holder()
        return [lw.multi(ks, h)] + [s for k in ks for s in lw.release(k, h)]

    yield ("multi-lock of 3: acquire + 3 releases", "multi", lambda: run(
        server, multi_cycle, n))

    def read_cycle(i, rnd):
        k, h = keys("rw", i), lw.holder()
        return [lw.read(k, h, 0, is_token), *lw.rw_release(k, h, "r")]

    def write_cycle(i, rnd):
        k, h = keys("ww", i), lw.holder()
        return [lw.write(k, h, 0, is_token), *lw.rw_release(k, h, "w")]

    yield ("read lock: read + release", "rw", lambda: run(server, read_cycle, n))
    yield ("write lock: write + release", "rw", lambda: run(server, write_cycle, n))

    def readers_waiting(count):
        writers = {}

        def before(i, rnd):
            k = keys(f"ra{count}-", i, rnd)
            writers[(i, rnd)] = w = lw.holder()
            return [lw.write(k, w, 0, is_token)] + [
                lw.read(k, lw.holder(), WAIT, refused) for _ in range(count)]

        def release(i, rnd):
            return lw.rw_release(keys(f"ra{count}-", i, rnd), writers[(i, rnd)], "w")
        return before, release

    for count in (1, 16):
        before, release = readers_waiting(count)
        yield (f"write release admitting {count} waiting reader{'s' if count > 1 else ''}",
               "rw", lambda before=before, release=release, count=count: run(
                   server, release, n, before=before,
                   subscribe=lambda i: keys(f"ra{count}-", i, 1)["readable"]))

    def fair_cycle(i, rnd):
        k, h = keys("f", i), lw.holder()
        return [lw.fair(k, h, is_token), *lw.fair_release(k, h)]

    yield ("fair lock: acquire + release", "fair", lambda: run(server, fair_cycle, n))

    def fair_handoff(i, rnd):
        # The holder releases to the queue's head, which holds it from the grant's notice;
        # then the next one queues behind it.
        k = keys("fh", i)
        old, new = handoff("fh", i, lw.holder)
        return [lw.fair(k, new, refused), *lw.fair_release(k, old)]

    yield ("fair handoff: the next one queues, the holder releases to it", "fair", lambda: run(
        server, fair_handoff, n, subscribe=lambda i: lw.wake_channel(keys("fh", i)),
        before=lambda i, rnd: [lw.fair(keys("fh", i), held.setdefault(("fh", i), lw.holder()),
                                       is_token)] if rnd == 0 else []))

    def permit_cycle(i, rnd):
        k, h = keys("p", i), lw.holder()
        return [lw.permit(k, h, 10, 0, is_token), *lw.permit_release(k, h)]

    yield ("permit: acquire + release (semaphore of 10)", "permit", lambda: run(
        server, permit_cycle, n))

    def permit_handoff(i, rnd):
        k = keys("ph", i)
        old, new = handoff("ph", i, lw.holder)
        return [lw.permit(k, new, 1, WAIT, refused), *lw.permit_release(k, old, waiting=1)]

    yield ("permit handoff, first seen: the next one waits in line, the holder's plain "
           "release finds it, the grant follows", "permit", lambda: run(
               server, permit_handoff, n, subscribe=lambda i: keys("ph", i)["granted"],
               before=lambda i, rnd: [lw.permit(keys("ph", i), held.setdefault(
                   ("ph", i), lw.holder()), 1, 0, is_token)] if rnd == 0 else []))

    def permit_handoff_script(i, rnd):
        k = keys("phs", i)
        old, new = handoff("phs", i, lw.holder)
        return [lw.permit(k, new, 1, WAIT, refused), *lw.permit_release_script(k, old)]

    yield ("permit handoff, contended: the next one waits in line, the holder's release "
           "is the script that grants", "permit", lambda: run(
               server, permit_handoff_script, n, subscribe=lambda i: keys("phs", i)["granted"],
               before=lambda i, rnd: [lw.permit(keys("phs", i), held.setdefault(
                   ("phs", i), lw.holder()), 1, 0, is_token)] if rnd == 0 else []))


# ---------------------------------------------------------------------------------------
# Prototypes (the group `floor`): not the library's scripts, each a way the library could
# go, measured to show what it would cost.

WRITE_FIRST = """
if redis.call('HSETNX', KEYS[1], ARGV[1], '1') == 1 then
  if redis.call('PEXPIRE', KEYS[1], ARGV[2], 'NX') == 1 then
    local token = redis.call('INCR', KEYS[2])
    if token ~= 1 then
      return token
    end
    local clock = redis.call('TIME')
    local text = clock[1] .. string.sub('000000', #clock[2] + 1) .. clock[2]
    redis.call('SET', KEYS[2], text, 'PX', ARGV[2])
    return tonumber(text)
  end
  redis.call('HDEL', KEYS[1], ARGV[1])
  return -2 - redis.call('PTTL', KEYS[1])
end
return {2, 0}
"""

LEASES_ONLY = """
local clock = redis.call('TIME')
local now = clock[1] * 1000 + math.floor(clock[2] / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local used = redis.call('ZCARD', KEYS[2])
local capacity = tonumber(redis.call('HGET', KEYS[1], 'permits') or ARGV[4])
if used == 0 then capacity = tonumber(ARGV[4]) end
if redis.call('EXISTS', KEYS[4]) == 0 and used + 1 <= capacity then
  local deadline = now + ARGV[2]
  redis.call('ZADD', KEYS[2], deadline, ARGV[1])
  if used == 0 then
    redis.call('HSET', KEYS[1], 'permits', ARGV[4])
    redis.call('PEXPIREAT', KEYS[1], deadline)
    redis.call('PEXPIREAT', KEYS[2], deadline)
  end
  return redis.call('INCR', KEYS[3])
end
return -1
"""


def floors(server, n):
    lw = Lockwarden(server)
    held = {}
    write_first = server.load(WRITE_FIRST)
    leases_only = server.load(LEASES_ONLY)
    # A mark named by the holder it waits on, found with HRANDFIELD (the hash holds the
    # holder's field, or that and its mark), in place of the library's two fields:
    # `HDEL lock <holder> <holder>:w`.
    text = replaced(waiting(source("acquire")), MARK,
                    "local field = redis.call('HRANDFIELD', KEYS[1]) "
                    "if string.sub(field, -2) ~= ':w' then "
                    "redis.call('HSET', KEYS[1], field .. ':w', '1') end")
    by_holder, library = function_library(text)
    server.call("FUNCTION", "LOAD", "REPLACE", library)

    def take(sha, k, holder, expect):
        return Step(["EVALSHA", sha, 2, k["lock"], k["fence"], holder, LEASE], expect)

    def prototype(prefix, attempt, release, waited_release):
        """A cycle and a handoff of a prototype: `attempt(k, holder, expect)`,
        `release(k, holder)` nobody waiting, `waited_release(k, holder)` a waiter's."""
        def cycle(i, rnd):
            k, h = lw.key(f"{prefix}{i}"), lw.holder()
            return [attempt(k, h, is_token), *release(k, h)]

        def handoff(i, rnd):
            k = lw.key(f"{prefix}h{i}")
            old = held[(prefix, i)]
            held[(prefix, i)] = new = lw.holder()
            return [attempt(k, new, refused), *waited_release(k, old),
                    attempt(k, new, is_token)]

        def before(i, rnd):
            if rnd:
                return []
            held[(prefix, i)] = lw.holder()
            return [attempt(lw.key(f"{prefix}h{i}"), held[(prefix, i)], is_token)]
        return (lambda: run(server, cycle, n),
                lambda: run(server, handoff, n, before=before,
                            subscribe=lambda i: lw.key(f"{prefix}h{i}")["channel"]))

    def notifying(k, h):
        """`HDEL` then the notice, whoever waits (the library's release before marks)."""
        return [Step(["HDEL", k["lock"], h], 1), Step(["PUBLISH", k["channel"], "0"])]

    cycle, handoff = prototype("fw", lambda k, h, e: take(write_first, k, h, e),
                               notifying, notifying)
    yield ("floor: a take written first (HSETNX, PEXPIRE NX): cycle", "floor", cycle)
    yield ("floor: a take written first (HSETNX, PEXPIRE NX): handoff", "floor", handoff)

    def marked(function, fields, waited):
        """A prototype's attempt by `function`; its release `HDEL lock <holder>
        ..fields(holder)` answers 1 nobody waiting, `waited` where a waiter marked the hold
        (then the notice)."""
        def attempt(k, h, e):
            return Step(["FCALL", function, 2, k["lock"], k["fence"], h, LEASE], e)
        return (attempt,
                lambda k, h: [Step(["HDEL", k["lock"], h, *fields(h)], 1)],
                lambda k, h: [Step(["HDEL", k["lock"], h, *fields(h)], waited),
                              Step(["PUBLISH", k["channel"], "0"])])

    # A mark of one field: cheaper, but a release's count (1) cannot tell its own hold
    # from another's mark, so the library writes two.
    one_field, library = function_library(
        replaced(waiting(source("acquire")), MARK, "redis.call('HSET', KEYS[1], '~w', '1')"))
    server.call("FUNCTION", "LOAD", "REPLACE", library)
    cycle, handoff = prototype("of", *marked(one_field, lambda h: ("~w",), 2))
    yield ("floor: a waiter's mark of one field (ambiguous; FCALL): cycle", "floor", cycle)
    yield ("floor: a waiter's mark of one field (ambiguous; FCALL): handoff", "floor", handoff)
    cycle, handoff = prototype("bh", *marked(by_holder, lambda h: (h + ":w",), 2))
    yield ("floor: a mark named by its holder (HRANDFIELD, <holder>:w; FCALL): cycle", "floor",
           cycle)
    yield ("floor: a mark named by its holder (HRANDFIELD, <holder>:w; FCALL): handoff",
           "floor", handoff)

    def permit(i, rnd):
        k, h = lw.key(f"lo{i}"), lw.holder()
        keys = [4, k["lock"], k["leases"], k["fence"], k["waiting"]]
        return [Step(["EVALSHA", leases_only, *keys, h, LEASE, 1, 10, "0", 0, k["granted"]],
                     is_token),
                Step(["ZREM", k["leases"], h], 1), Step(["EXISTS", k["waiting"]], 0)]

    yield ("floor: a permit held in the leases only: acquire + ZREM + EXISTS", "floor",
           lambda: run(server, permit, n))


# ---------------------------------------------------------------------------------------
# Rate decisions (the group `rate`): lua/rate_limit.lua as the client sends it, beside a
# minimal GCRA script, redis-cell's algorithm (`CL.THROTTLE key max_burst count period
# quantity`: emission interval = period / count, tolerance = interval x (max_burst + 1), the
# TAT read, compared, written with its expiry, a five-number reply) written in Lua, for
# this comparison only, on the same keys in the same states.

# The same file bench workload 10 times beside a decision.
CELL = open(os.path.join(ROOT, "crates", "lockwarden-bench", "lua", "gcra_cell.lua")).read()
# The decision bench 10 times as a floor: no TIME, the clock read from the key's expiry.
EXPIRY = open(os.path.join(ROOT, "crates", "lockwarden-bench", "lua", "gcra_expiry.lua")).read()

# Each decision's pair: (row of lua/rate_limit.lua, row of the minimal GCRA script).
RATE_PAIRS = (
    ("rate: admitted, a key without a bucket",
     "minimal GCRA: admitted, a key without a bucket"),
    ("rate: admitted, a key with a debt", "minimal GCRA: admitted, a key with a debt"),
    ("rate: refused", "minimal GCRA: refused"),
)


def rates(server, n):
    """A policy of 100 per second, 20 at once (the arguments the client sends: the µs a
    decision adds, the most debt it may find, the spec), and the same for redis-cell's
    arguments; keys without a bucket are new in each round."""
    one = server.load("return 1")
    cell = server.load(CELL)
    rate = server.load(open(os.path.join(LUA, "rate_limit.lua")).read())

    def bucket(name, policy="second"):
        return f"lockwarden:rate:{{api:{name}}}:{policy}"

    def admitted(reply):
        return int(reply if not isinstance(reply, list) else reply[0]) >= 0

    def refused(reply):
        return int(reply if not isinstance(reply, list) else reply[0]) < 0

    def cell_is(state):
        return lambda reply: isinstance(reply, list) and reply[0] == state

    policy = (10000, 190000, "10000:20")
    # A debt that grows but never refuses: one per second, a million at once.
    deep = (1000000, 999999000000, "1000000:1000000")
    shut = (3600000000, 0, "3600000000:1")
    day = (864000, 86399136000, "864000:100000")

    def row(call, expect, before=None):
        return lambda: run(server, lambda i, rnd: [Step(call(i, rnd), expect)], n,
                           before=before)

    def charge_shut(key, call):
        return lambda i, rnd: [Step(call, None)] if rnd == 0 and i == 0 else []

    yield ("EVALSHA of return 1 (one key)", "rate", row(
        lambda i, rnd: ["EVALSHA", one, 1, bucket(f"one{rnd}:{i}")], 1))
    yield (RATE_PAIRS[0][0], "rate", row(
        lambda i, rnd: ["EVALSHA", rate, 1, bucket(f"fresh{rnd}:{i}"), *policy], admitted))
    yield (RATE_PAIRS[0][1], "rate", row(
        lambda i, rnd: ["EVALSHA", cell, 1, bucket(f"cfresh{rnd}:{i}"), 19, 100, 1, 1],
        cell_is(0)))
    yield (RATE_PAIRS[1][0], "rate", row(
        lambda i, rnd: ["EVALSHA", rate, 1, bucket("deep"), *deep], admitted))
    yield (RATE_PAIRS[1][1], "rate", row(
        lambda i, rnd: ["EVALSHA", cell, 1, bucket("cdeep"), 999999, 1000000, 1000000, 1],
        cell_is(0)))
    yield (RATE_PAIRS[2][0], "rate", row(
        lambda i, rnd: ["EVALSHA", rate, 1, bucket("shut"), *shut], refused,
        before=charge_shut("shut", ["EVALSHA", rate, 1, bucket("shut"), *shut])))
    yield (RATE_PAIRS[2][1], "rate", row(
        lambda i, rnd: ["EVALSHA", cell, 1, bucket("cshut"), 0, 1, 3600, 1], cell_is(1),
        before=charge_shut("cshut", ["EVALSHA", cell, 1, bucket("cshut"), 0, 1, 3600, 1])))
    yield ("rate: two policies, admitted, a debt under each", "rate", row(
        lambda i, rnd: ["EVALSHA", rate, 2, bucket("deep2"), bucket("deep2", "day"), *deep,
                        *day], admitted))
    expiry = server.load(EXPIRY)
    yield ("clock from the key's expiry (ms): admitted, a debt", "rate", row(
        lambda i, rnd: ["EVALSHA", expiry, 1, bucket("edeep"), 1, 999999000000],
        lambda reply: int(reply) >= 0))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="comma-separated groups of rows to run")
    parser.add_argument("--cycles", type=int, default=256)
    args = parser.parse_args()
    for tool in ("valgrind", "callgrind_annotate", "callgrind_control"):
        if not shutil.which(tool):
            sys.exit(f"needs {tool} (apt-get install valgrind)")
    only = [w for w in args.only.split(",") if w]
    server = Server()
    try:
        print(f"{server.version} under callgrind: whole server minus serverCron, per "
              f"cycle, {args.cycles} pipelined cycles after a warm-up")
        print(f"| cycle | instructions | commands |")
        print(f"|---|---:|---:|")
        every = list(rows(server, args.cycles)) + list(rates(server, args.cycles))
        if "floor" in only:
            every += list(floors(server, args.cycles))
        measured = {}
        for name, group, measure in every:
            if only and group not in only:
                continue
            instructions, commands = measure()
            measured[name] = instructions
            print(f"| {name} | {instructions / 1000:,.1f}k | {commands:.2f} |", flush=True)
        pairs = [(ours, cell) for ours, cell in RATE_PAIRS if ours in measured]
        if pairs:
            print("\n| rate decision | lockwarden | minimal GCRA | ratio |\n|---|---:|---:|---:|")
            for ours, cell in pairs:
                print(f"| {ours[len('rate: '):]} | {measured[ours]:,.0f} | "
                      f"{measured[cell]:,.0f} | {measured[ours] / measured[cell]:.2f} |")
    finally:
        server.close()


if __name__ == "__main__":
    main()
