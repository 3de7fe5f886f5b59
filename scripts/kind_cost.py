#!/usr/bin/env python3
"""What the read-write and fair locks' and the semaphore's scripts cost Redis itself, in
instructions.

    python3 scripts/kind_cost.py [LUA_DIR]

A throw-away redis-server on a free loopback port runs under valgrind's callgrind, which
counts the instructions it executes (the same on every run, unlike times on a shared
machine). Each operation below runs 40 times on fresh keys, with the scripts as a client
sends them to one server (the files of LUA_DIR, `lua/` by default, joined as
store/redis/scripts.rs joins them, no call id); the count of `EVALSHA` (the scripts and
the commands they call) is divided by 40. Each row's set-up runs outside the count. A
granted holder releases as a hot fair lock's holders do: it took the lock up from the
grant's notice, without a call.

Give LUA_DIR the `lua/` of an older checkout (`git worktree add /tmp/old <commit>`) to
compare. `scripts/script_cost.sh --instructions` does the same for the plain lock.
Needs valgrind and callgrind_control (apt-get install valgrind).
"""
import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROUNDS = 40
LUA = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "lua")
RW = ("clock.lua", "once.lua", "token.lua", "rw_prelude.lua")
FAIR = ("clock.lua", "once.lua", "token.lua", "fair_prelude.lua")
PERMITS = ("clock.lua", "token.lua", "permits_prelude.lua")
WRITER = "W" + "x" * 40


def reader(r):
    return f"R{r:02d}" + "y" * 38


class Server:
    """redis-server under callgrind, spoken to over one connection."""

    def __init__(self):
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        probe.close()
        self.dir = tempfile.mkdtemp()
        self.proc = subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={self.dir}/cg",
             "redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
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

    def call(self, *args):
        out = b"*%d\r\n" % len(args)
        for arg in args:
            arg = str(arg).encode()
            out += b"$%d\r\n%s\r\n" % (len(arg), arg)
        self.sock.sendall(out)
        return self.reply()

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

    def load(self, *files):
        source = "".join(open(os.path.join(LUA, f)).read() for f in files)
        return self.call("SCRIPT", "LOAD", source).decode()

    def instructions(self, run):
        """Instructions of EVALSHA while `run` runs."""
        subprocess.run(["callgrind_control", "-z", str(self.proc.pid)], check=True, capture_output=True)
        run()
        subprocess.run(["callgrind_control", "-d", str(self.proc.pid)], check=True, capture_output=True)
        self.dumps += 1
        dump = f"{self.dir}/cg.{self.dumps}"
        for _ in range(50):
            if os.path.exists(dump):
                break
            time.sleep(0.1)
        out = subprocess.run(
            ["callgrind_annotate", "--inclusive=yes", "--threshold=100", "--auto=no", dump],
            check=True, capture_output=True, text=True).stdout
        return next(int(line.split()[0].replace(",", "")) for line in out.splitlines()
                    if ":evalShaCommand " in line)

    def close(self):
        self.sock.sendall(b"*2\r\n$8\r\nSHUTDOWN\r\n$6\r\nNOSAVE\r\n")
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
    wa, ra, rel = (redis.load(*RW, f) for f in ("rw_write_acquire.lua", "rw_read_acquire.lua", "rw_release.lua"))
    fa, fr = (redis.load(*FAIR, f) for f in ("fair_acquire.lua", "fair_release.lua"))
    pa, pr = (redis.load(*PERMITS, f) for f in ("permits_acquire.lua", "permits_release.lua"))
    batch = [0]

    def keys():
        batch[0] += 1
        return range(batch[0] * 1000, batch[0] * 1000 + ROUNDS)

    def rw(i):
        k = f"lockwarden:{{rw{i}}}"
        return [5, k, k + ":leases", k + ":fence", k + ":writers", k + ":readers"]

    def fair(i):
        k = f"lockwarden:{{fair{i}}}"
        return [4, k, k + ":fence", k + ":queue", k + ":deadlines"]

    def sem(i):
        k = f"lockwarden:{{sem{i}}}"
        return [5, k, k + ":leases", k + ":fence", k + ":waiting", k + ":waiting-until"]

    def expect(reply, wanted):
        if reply != wanted:
            raise RuntimeError(f"expected {wanted!r}, got {reply!r}")

    def row(name, setup, op):
        ks = keys()
        for i in ks:
            setup(i)
        n = redis.instructions(lambda: [op(i) for i in ks])
        print(f"  {name:<44} {n / ROUNDS:>9,.0f}")

    def none(_):
        pass

    def read_cycle(i):
        redis.call("EVALSHA", ra, *rw(i), reader(0), 30000, "1", 0, "0")
        expect(redis.call("EVALSHA", rel, *rw(i), reader(0), "r", "w", "r", ""), b"0")

    def write_cycle(i):
        redis.call("EVALSHA", wa, *rw(i), WRITER, 30000, 0, "1")
        expect(redis.call("EVALSHA", rel, *rw(i), WRITER, "w", "w", "r", ""), b"0")

    def readers_waiting(n):
        def setup(i):
            redis.call("EVALSHA", wa, *rw(i), WRITER, 30000, 0, "1")
            for r in range(n):
                expect(redis.call("EVALSHA", ra, *rw(i), reader(r), 30000, "1", 10000, "0")[0], b"0")
        return setup

    def write_release(i):
        expect(redis.call("EVALSHA", rel, *rw(i), WRITER, "w", "w", "r", ""), b"0")

    def fair_cycle(i):
        redis.call("EVALSHA", fa, *fair(i), WRITER, 30000, 5000, "wake:", "1", "0", "1")
        expect(redis.call("EVALSHA", fr, *fair(i), WRITER, "wake:", ""), b"0")

    def one_queued(i):
        redis.call("EVALSHA", fa, *fair(i), WRITER, 30000, 5000, "wake:", "1", "0", "1")
        expect(redis.call("EVALSHA", fa, *fair(i), reader(0), 30000, 5000, "wake:", "1", "0", "1")[0], b"0")

    def fair_release(i):
        expect(redis.call("EVALSHA", fr, *fair(i), WRITER, "wake:", ""), b"0")

    def granted_then_one_queued(i):
        one_queued(i)
        fair_release(i)  # the head, reader(0), is granted the lock
        expect(redis.call("EVALSHA", fa, *fair(i), reader(1), 30000, 5000, "wake:", "1", "0", "1")[0], b"0")

    def granted_release(i):
        expect(redis.call("EVALSHA", fr, *fair(i), reader(0), "wake:", ""), b"0")

    def take_permit(i, holder, capacity, wait="0"):
        k = sem(i)
        return redis.call("EVALSHA", pa, *k, holder, 30000, 1, capacity, "0", wait, k[1] + ":granted")

    def permit_cycle(i):
        take_permit(i, WRITER, 10)
        expect(redis.call("EVALSHA", pr, *sem(i), WRITER, sem(i)[1] + ":granted", ""), b"0")

    def permit_waiting(i):
        take_permit(i, WRITER, 1)
        expect(take_permit(i, reader(0), 1, 10000)[0], b"0")

    def permit_release(i):
        expect(redis.call("EVALSHA", pr, *sem(i), WRITER, sem(i)[1] + ":granted", ""), b"0")

    print(f"Redis instructions per operation (callgrind, {ROUNDS} rounds, scripts of {os.path.normpath(LUA)}):")
    row("read take + release (read-write lock)", none, read_cycle)
    row("write take + release (read-write lock)", none, write_cycle)
    row("write release admitting 1 waiting reader", readers_waiting(1), write_release)
    row("write release admitting 16 waiting readers", readers_waiting(16), write_release)
    row("fair take + release", none, fair_cycle)
    row("fair release granting the queue's head", one_queued, fair_release)
    row("the same by a holder granted it (a hot lock)", granted_then_one_queued, granted_release)
    row("permit take + release (semaphore of 10)", none, permit_cycle)
    row("permit release granting a waiter (of 1)", permit_waiting, permit_release)


if __name__ == "__main__":
    main()
