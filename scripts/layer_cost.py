#!/usr/bin/env python3
"""What each HTTP layer costs the client, in instructions per request, under callgrind.

Runs `layer_cost APP N` (crates/lockwarden-bench/src/bin/layer_cost.rs: N requests
through one axum app in process, over the in-memory store, no network, no Redis) at two
sizes and divides the difference by the requests between them, so start-up cancels
out. Counted, not timed: the figure does not move with the shared machine's load, so two
builds can be compared to a few dozen instructions. The network, the kernel and Redis are
not in it: workload 7 of the bench measures those.

With `--redis`, the client runs over a redis-server this script starts on a free
loopback port (not under callgrind: only the client's instructions are counted, redis-rs
included), and two apps with no library but redis-rs join: `raw-rate` (the rate script
sent raw from the handler) and `raw-rate-mw` (the same from an axum middleware, the
thinnest rate-limit layer one can write) and `raw-lock` (`lock-handler`'s commands
sent raw from the handler). The count then moves a little from run to run
(how often the runtime wakes while a reply is on its way).

    python3 scripts/layer_cost.py [--redis] [--only rate-layer,lock-layer] [--requests 10000]
"""

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

APPS = ["plain", "rate-handler", "rate-layer", "lock-handler", "lock-layer", "limit-layer"]
REDIS_APPS = ["plain", "raw-rate", "raw-rate-mw", "rate-handler", "rate-layer", "raw-lock",
              "lock-handler", "lock-layer", "limit-layer"]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def instructions(binary, app, n, url):
    with tempfile.TemporaryDirectory() as tmp:
        run = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg", binary, app,
             str(n), *([url] if url else [])], capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"{app} {n}: exit {run.returncode}\n{run.stderr[-2000:]}")
    found = re.search(r"Collected : (\d+)", run.stderr)
    if not found:
        sys.exit(f"{app}: no instruction count in callgrind's output")
    return int(found.group(1))


def redis_server(workdir):
    """A redis-server on a free loopback port (REDIS_SERVER names another binary), ready."""
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    server = subprocess.Popen(
        [os.environ.get("REDIS_SERVER", "redis-server"), "--port", str(port), "--bind",
         "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", workdir],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port)).close()
            return server, f"redis://127.0.0.1:{port}"
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                sys.exit("redis-server did not start")
            time.sleep(0.1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="comma-separated apps")
    parser.add_argument("--requests", type=int, default=10000)
    parser.add_argument("--redis", action="store_true", help="over a real redis-server")
    args = parser.parse_args()
    apps = [a for a in args.only.split(",") if a] or (REDIS_APPS if args.redis else APPS)
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "lockwarden-bench", "--bin",
                    "layer_cost"], cwd=ROOT, check=True)
    binary = os.path.join(ROOT, "target", "release", "layer_cost")
    if not args.redis:
        table(binary, apps, args.requests, None)
        return
    with tempfile.TemporaryDirectory() as workdir:
        server, url = redis_server(workdir)
        try:
            table(binary, apps, args.requests, url)
        finally:
            server.kill()
            server.wait()


def table(binary, apps, requests, url):
    print("| app | instructions per request | − no lock |\n|---|---:|---:|")
    base = None
    for app in apps:
        small, large = (instructions(binary, app, n, url) for n in (1000, 1000 + requests))
        per = (large - small) / requests
        if app == "plain":
            base = per
        extra = f"{per - base:,.0f}" if base is not None and app != "plain" else ""
        print(f"| {app} | {per:,.0f} | {extra} |", flush=True)


if __name__ == "__main__":
    main()
