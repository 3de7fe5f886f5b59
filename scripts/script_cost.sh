#!/usr/bin/env bash
# What the plain lock's two scripts cost Redis itself, per cycle, with no client in the
# way: a throw-away redis-server on a free loopback port runs ROUNDS rounds of 64 acquires
# then 64 releases (fed by `redis-cli --pipe`), and INFO commandstats says how many
# commands ran (script-inner calls included) and how long the scripts took.
#
#   scripts/script_cost.sh [acquire.lua] [release.lua] [ROUNDS]
#
# Each script runs after lua/once.lua (the acquire also after lua/token.lua), as the
# client sends it, with a fresh holder's arguments (no call id: one server never resends
# a call).
set -euo pipefail
cd "$(dirname "$0")/.."
acquire=${1:-lua/acquire.lua} release=${2:-lua/release.lua} rounds=${3:-2000}
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" --daemonize yes >/dev/null
until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.05; done
a=$(redis-cli -p "$port" SCRIPT LOAD "$(cat lua/once.lua lua/token.lua "$acquire")")
r=$(redis-cli -p "$port" SCRIPT LOAD "$(cat lua/once.lua "$release")")
python3 - "$a" "$r" "$rounds" > "$dir/cycles.resp" <<'PY'
import sys
acquire, release, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
def cmd(*args):
    out = "*%d\r\n" % len(args)
    for a in map(str, args):
        out += "$%d\r\n%s\r\n" % (len(a.encode()), a)
    return out
for _ in range(rounds):
    sys.stdout.write("".join(cmd("EVALSHA", acquire, 2, "{k%d}" % k, "{k%d}:fence" % k, "holder", 30000, 1, "") for k in range(64)))
    sys.stdout.write("".join(cmd("EVALSHA", release, 2, "{k%d}" % k, "{k%d}:fence" % k, "holder", "{k%d}:released" % k, "", "") for k in range(64)))
PY
redis-cli -p "$port" CONFIG RESETSTAT >/dev/null
redis-cli -p "$port" --pipe < "$dir/cycles.resp" | tail -1
redis-cli -p "$port" INFO commandstats | tr -d '\r' | python3 -c '
import sys
cycles = int(sys.argv[1]) * 64
inner = script_us = evalsha = 0
for line in sys.stdin:
    if not line.startswith("cmdstat_"):
        continue
    name, rest = line[len("cmdstat_"):].split(":", 1)
    if name in ("config|resetstat", "info", "echo"):
        continue
    stats = dict(kv.split("=") for kv in rest.strip().split(","))
    calls, usec = int(stats["calls"]), int(stats["usec"])
    per_call = float(stats["usec_per_call"])
    print(f"  {name:16} {calls / cycles:5.2f} per cycle  {per_call:5.2f} µs per call")
    if name == "evalsha":
        evalsha, script_us = calls / cycles, usec / cycles
    else:
        inner += calls / cycles
print(f"commands per cycle: {evalsha + inner:.2f} ({evalsha:.0f} EVALSHA + {inner:.2f} inside)")
print(f"script time per cycle: {script_us:.2f} µs (Redis'"'"'s own clock, no I/O)")
' "$rounds"
