#!/usr/bin/env python3
"""What a rate decision costs Redis itself, in instructions, beside a minimal GCRA script.

    python3 scripts/rate_cost.py [LUA_DIR]

A throw-away redis-server ($REDIS_SERVER, else redis-server on PATH) on a free loopback
port runs under valgrind's callgrind, which counts the instructions it executes (the
same on every run, unlike times on a shared machine). Each row sends 256 calls in one
pipeline after a pipeline of 256 that warms it up (scripts compiled, connection
buffers grown), and divides the whole server's instructions (reading, parsing, the
script, the commands it calls, the replies), less `serverCron`'s, by 256.

The rows: `EVALSHA` of `return 1` (the floor of any script call); a minimal GCRA script,
redis-cell's algorithm (`CL.THROTTLE key max_burst count period quantity`: emission
interval = period / count, tolerance = interval x (max_burst + 1), TAT read, compared,
written with its expiry, a five-number reply) written in Lua here, for this comparison
only; and lockwarden's `lua/rate_limit.lua` (of LUA_DIR, `lua/` by default) with the
arguments the client sends for a policy of 100 per second, 20 at once: admitted on a key
without a bucket, admitted on one with a debt, refused, and under two policies. Same
policies, same keys, same state in both scripts' rows.

Needs valgrind and callgrind_control (apt-get install valgrind).
"""
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

CALLS = 256
LUA = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "lua")

# redis-cell's GCRA (src/cell/mod.rs), in Lua, on the server's clock in µs.
CELL = """
local burst = tonumber(ARGV[1])
local count = tonumber(ARGV[2])
local period = tonumber(ARGV[3])
local quantity = tonumber(ARGV[4])
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local interval = period * 1000000 / count
local tolerance = interval * (burst + 1)
local increment = interval * quantity
local tat = redis.call('GET', KEYS[1])
if tat then tat = tonumber(tat) else tat = now end
local new_tat = math.max(tat, now) + increment
local diff = now - (new_tat - tolerance)
if diff < 0 then
  local retry = -1
  if increment <= tolerance then retry = -diff end
  local ttl = tat - now
  local next = tolerance - ttl
  local remaining = 0
  if next > -interval then remaining = math.floor(next / interval) end
  return {1, burst + 1, remaining, retry, ttl}
end
local ttl = new_tat - now
redis.call('SET', KEYS[1], new_tat, 'PX', math.ceil(ttl / 1000))
local next = tolerance - ttl
local remaining = 0
if next > -interval then remaining = math.floor(next / interval) end
return {0, burst + 1, remaining, -1, ttl}
"""


class Server:
    """A redis-server under callgrind, spoken to over one connection."""

    def __init__(self):
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        probe.close()
        self.dir = tempfile.mkdtemp()
        binary = os.environ.get("REDIS_SERVER") or "redis-server"
        self.proc = subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={self.dir}/cg",
             binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            try:
                self.sock = socket.create_connection(("127.0.0.1", port))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        self.replies = self.sock.makefile("rb")
        self.dumps = 0

    @staticmethod
    def encode(args):
        out = b"*%d\r\n" % len(args)
        for arg in args:
            arg = str(arg).encode()
            out += b"$%d\r\n%s\r\n" % (len(arg), arg)
        return out

    def pipeline(self, calls):
        self.sock.sendall(b"".join(self.encode(c) for c in calls))
        return [self.reply() for _ in calls]

    def call(self, *args):
        return self.pipeline([args])[0]

    def reply(self):
        line = self.replies.readline()
        kind, rest = line[:1], line[1:-2]
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind in (b"+", b":"):
            return rest
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self.replies.read(n + 2)[:-2]
        return [self.reply() for _ in range(int(rest))]

    def per_call(self, calls):
        """Instructions of the whole server, less serverCron's, per call of `calls`."""
        subprocess.run(["callgrind_control", "-z", str(self.proc.pid)], check=True, capture_output=True)
        replies = self.pipeline(calls)
        subprocess.run(["callgrind_control", "-d", str(self.proc.pid)], check=True, capture_output=True)
        self.dumps += 1
        dump = f"{self.dir}/cg.{self.dumps}"
        for _ in range(100):
            if os.path.exists(dump):
                break
            time.sleep(0.1)
        time.sleep(0.3)
        out = subprocess.run(
            ["callgrind_annotate", "--inclusive=yes", "--threshold=100", "--auto=no", dump],
            check=True, capture_output=True, text=True).stdout
        total = cron = 0
        for line in out.splitlines():
            words = line.split()
            if not words or not words[0].replace(",", "").isdigit():
                continue
            count = int(words[0].replace(",", ""))
            if "PROGRAM TOTALS" in line:
                total = count
            elif ":serverCron " in line:
                cron = max(cron, count)
        return (total - cron) / len(calls), replies

    def close(self):
        self.sock.sendall(self.encode(["SHUTDOWN", "NOSAVE"]))
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def main():
    if not shutil.which("valgrind"):
        sys.exit("needs valgrind (apt-get install valgrind)")
    redis = Server()
    try:
        measure(redis)
    finally:
        redis.close()


def measure(redis):
    one = redis.call("SCRIPT", "LOAD", "return 1").decode()
    cell = redis.call("SCRIPT", "LOAD", CELL).decode()
    rate = redis.call("SCRIPT", "LOAD", open(os.path.join(LUA, "rate_limit.lua")).read()).decode()
    rounds = [0]

    def bucket(name, policy="second"):
        return f"lockwarden:rate:{{api:{name}}}:{policy}"

    def row(label, call, expect):
        """`call(key name)` makes one call; the pipelines use fresh names each row."""
        rounds[0] += 1
        r = rounds[0]
        redis.pipeline([call(f"w{r}:{i}") for i in range(CALLS)])
        n, replies = redis.per_call([call(f"m{r}:{i}") for i in range(CALLS)])
        wrong = [x for x in replies if not expect(x)]
        if wrong:
            raise RuntimeError(f"{label}: unexpected replies such as {wrong[0]!r}")
        return n

    admitted_cell = lambda x: x[0] == b"0"
    refused_cell = lambda x: x[0] == b"1"
    admitted = lambda x: int(x if not isinstance(x, list) else x[0]) >= 0
    refused = lambda x: int(x if not isinstance(x, list) else x[0]) < 0
    # 100 per second, 20 at once: interval 10,000 µs, tolerance 200,000 µs; a request of 1.
    policy = (10000, 190000, "10000:20")
    # For a key with a debt that grows but never refuses: one per second, a million at once.
    deep = (1000000, 999999000000, "1000000:1000000")

    floor = row("EVALSHA return 1", lambda k: ("EVALSHA", one, 1, bucket(k)), lambda x: x == b"1")
    cell_fresh = row("cell, admitted, no bucket",
                     lambda k: ("EVALSHA", cell, 1, bucket(k), 19, 100, 1, 1), admitted_cell)
    cell_deep = row("cell, admitted, a debt",
                    lambda k: ("EVALSHA", cell, 1, bucket("deep-cell"), 999999, 1000000, 1000000, 1),
                    admitted_cell)
    redis.call("EVALSHA", cell, 1, bucket("shut-cell"), 0, 1, 3600, 1)
    cell_refused = row("cell, refused",
                       lambda k: ("EVALSHA", cell, 1, bucket("shut-cell"), 0, 1, 3600, 1), refused_cell)
    ours_fresh = row("ours, admitted, no bucket",
                     lambda k: ("EVALSHA", rate, 1, bucket(k), *policy), admitted)
    ours_deep = row("ours, admitted, a debt",
                    lambda k: ("EVALSHA", rate, 1, bucket("deep"), *deep), admitted)
    shut = (3600000000, 0, "3600000000:1")
    redis.call("EVALSHA", rate, 1, bucket("shut"), *shut)
    ours_refused = row("ours, refused",
                       lambda k: ("EVALSHA", rate, 1, bucket("shut"), *shut), refused)
    day = (864000, 86399136000, "864000:100000")
    ours_two = row("ours, two policies, admitted, a debt",
                   lambda k: ("EVALSHA", rate, 2, bucket("deep2"), bucket("deep2", "day"), *deep, *day),
                   admitted)

    print(f"Redis instructions per call (callgrind, whole server less serverCron, "
          f"{CALLS} pipelined calls after as many warming up; {os.path.normpath(LUA)}):")
    print(f"  {'call':<52} {'ours':>9} {'minimal GCRA':>13} {'ratio':>6}")
    print(f"  {'EVALSHA of return 1 (one key)':<52} {floor:>9,.0f}")
    for label, ours, base in (
        ("admitted, a key without a bucket", ours_fresh, cell_fresh),
        ("admitted, a key with a debt", ours_deep, cell_deep),
        ("refused", ours_refused, cell_refused),
    ):
        print(f"  {label:<52} {ours:>9,.0f} {base:>13,.0f} {ours / base:>6.2f}")
    print(f"  {'two policies, admitted, a debt under each':<52} {ours_two:>9,.0f}")


if __name__ == "__main__":
    main()
