#!/usr/bin/env python3
"""What each HTTP layer costs the client, in instructions per request, under callgrind.

Runs `layer_cost APP N` (crates/lockwarden-bench/src/bin/layer_cost.rs: N requests
through one axum app in process, over the in-memory store, no network, no Redis) at two
sizes and divides the difference by the requests between them, so start-up cancels
out. Counted, not timed: the figure does not move with the shared machine's load, so two
builds can be compared to a few dozen instructions. The network, the kernel and Redis are
not in it: workload 7 of the bench measures those.

    python3 scripts/layer_cost.py [--only rate-layer,lock-layer] [--requests 10000]
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

APPS = ["plain", "rate-handler", "rate-layer", "lock-handler", "lock-layer", "limit-layer"]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def instructions(binary, app, n):
    with tempfile.TemporaryDirectory() as tmp:
        run = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg", binary, app,
             str(n)], capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"{app} {n}: exit {run.returncode}\n{run.stderr[-2000:]}")
    found = re.search(r"Collected : (\d+)", run.stderr)
    if not found:
        sys.exit(f"{app}: no instruction count in callgrind's output")
    return int(found.group(1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="comma-separated apps")
    parser.add_argument("--requests", type=int, default=10000)
    args = parser.parse_args()
    apps = [a for a in args.only.split(",") if a] or APPS
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "lockwarden-bench", "--bin",
                    "layer_cost"], cwd=ROOT, check=True)
    binary = os.path.join(ROOT, "target", "release", "layer_cost")
    print("| app | instructions per request | − no lock |\n|---|---:|---:|")
    base = None
    for app in apps:
        small, large = (instructions(binary, app, n) for n in (1000, 1000 + args.requests))
        per = (large - small) / args.requests
        if app == "plain":
            base = per
        extra = f"{per - base:,.0f}" if base is not None and app != "plain" else ""
        print(f"| {app} | {per:,.0f} | {extra} |", flush=True)


if __name__ == "__main__":
    main()
