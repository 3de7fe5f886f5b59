#!/usr/bin/env bash
# What the plain lock's two scripts cost Redis itself, per cycle, with no client in the
# way: a throw-away redis-server on a free loopback port runs ROUNDS rounds of 64 acquires
# then 64 releases (fed by `redis-cli --pipe`).
#
#   scripts/script_cost.sh [--instructions] [acquire.lua] [release.lua] [ROUNDS]
#
# By default INFO commandstats says how many commands ran (script-inner calls included)
# and how long the scripts took: times, which vary a lot on a shared machine.
#
# With --instructions the server runs under valgrind's callgrind, which counts the
# instructions it executes (parsing, scripts, replies): the same on every run, so a
# change of a few hundred per cycle shows. It prints the instructions per cycle of the
# two scripts and, in the same run, of the single-instance lock that the Redis docs'
# distributed-locks page describes (`SET key value NX PX`, then a script that deletes
# the key if it still holds the value), and their ratio. Needs valgrind; ROUNDS
# defaults to 50 there (a run takes about 15 s).
#
# Each script runs after lua/once.lua (the acquire also after lua/token.lua), as the
# client sends it to one server, with a fresh holder's arguments (and no call id: one
# server never sends a call twice). With --instructions it also counts the cycle a
# client sends for a holder made for its acquisition and never handed out: the acquire
# script, then HDEL + PUBLISH instead of the release script; and that cycle for a client
# built without fencing tokens (the acquire script's variant with `local fenced = false`).
set -euo pipefail
cd "$(dirname "$0")/.."
instructions=false
if [ "${1:-}" = "--instructions" ]; then
  instructions=true
  shift
  command -v valgrind >/dev/null || { echo "--instructions needs valgrind (apt-get install valgrind)" >&2; exit 2; }
fi
acquire=${1:-lua/acquire.lua} release=${2:-lua/release.lua}
rounds=${3:-$($instructions && echo 50 || echo 2000)}
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; wait; rm -rf "$dir"' EXIT
server=(redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir")
if $instructions; then
  valgrind --tool=callgrind --callgrind-out-file="$dir/cg.out" "${server[@]}" >"$dir/valgrind.log" 2>&1 &
  valgrind_pid=$!
else
  "${server[@]}" --daemonize yes >/dev/null
fi
until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.05; done
a=$(redis-cli -p "$port" SCRIPT LOAD "$(cat lua/once.lua lua/token.lua "$acquire")")
u=$(redis-cli -p "$port" SCRIPT LOAD \
  "$(cat lua/once.lua lua/token.lua "$acquire" | sed 's/^local fenced = true$/local fenced = false/')")
r=$(redis-cli -p "$port" SCRIPT LOAD "$(cat lua/once.lua "$release")")
unlock=$(redis-cli -p "$port" SCRIPT LOAD \
  "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0")
python3 - "$a" "$r" "$unlock" "$rounds" "$dir" "$u" <<'PY'
import sys
acquire, release, unlock, rounds, out, unfenced = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6]
def cmd(*args):
    out = "*%d\r\n" % len(args)
    for a in map(str, args):
        out += "$%d\r\n%s\r\n" % (len(a.encode()), a)
    return out
with open(out + "/cycles.resp", "w") as f:
    for _ in range(rounds):
        f.write("".join(cmd("EVALSHA", acquire, 2, "{k%d}" % k, "{k%d}:fence" % k, "holder", 30000, 1) for k in range(64)))
        f.write("".join(cmd("EVALSHA", release, 2, "{k%d}" % k, "{k%d}:fence" % k, "holder", "{k%d}:released" % k, "") for k in range(64)))
# How a client releases the hold of a holder made for it and never handed out: HDEL of
# its field (the hash goes with it), then the notice.
for name, sha in (("fresh", acquire), ("unfenced", unfenced)):
    with open("%s/%s.resp" % (out, name), "w") as f:
        for _ in range(rounds):
            f.write("".join(cmd("EVALSHA", sha, 2, "{k%d}" % k, "{k%d}:fence" % k, "holder", 30000, 1) for k in range(64)))
            f.write("".join(cmd("HDEL", "{k%d}" % k, "holder") + cmd("PUBLISH", "{k%d}:released" % k, "0") for k in range(64)))
with open(out + "/baseline.resp", "w") as f:
    for _ in range(rounds):
        f.write("".join(cmd("SET", "{b%d}" % k, "holder", "NX", "PX", 30000) for k in range(64)))
        f.write("".join(cmd("EVALSHA", unlock, 1, "{b%d}" % k, "holder") for k in range(64)))
PY

if $instructions; then
  # Instructions per cycle of one pass over `file`, after a pass that warms it up (keys
  # and fencing keys made, scripts compiled), as in a client's steady state.
  per_cycle() {
    redis-cli -p "$port" --pipe <"$1" >/dev/null
    callgrind_control -z "$valgrind_pid" >/dev/null 2>&1
    redis-cli -p "$port" --pipe <"$1" | grep -q 'errors: 0,' || { echo "$1: Redis answered errors" >&2; exit 1; }
    callgrind_control -d "$valgrind_pid" >/dev/null 2>&1
    local dump
    dump=$(ls -t "$dir"/cg.out.* | head -1)
    awk -v cycles=$((rounds * 64)) '/^(summary|totals):/ { printf "%.0f", $2 / cycles; exit }' "$dump"
  }
  ours=$(per_cycle "$dir/cycles.resp")
  fresh=$(per_cycle "$dir/fresh.resp")
  unfenced=$(per_cycle "$dir/unfenced.resp")
  base=$(per_cycle "$dir/baseline.resp")
  echo "Redis instructions per cycle (callgrind, $rounds rounds of 64 after a warm-up):"
  printf '  %-52s %9s\n' "$(basename "$acquire") + $(basename "$release")" "$ours" \
    "$(basename "$acquire") + HDEL + PUBLISH (a fresh holder's)" "$fresh" \
    "the same without fencing tokens" "$unfenced" \
    "SET NX PX + compare-and-delete script (baseline)" "$base"
  python3 -c "print('  ratios to the baseline: %.2f, %.2f, %.2f' % ($ours / $base, $fresh / $base, $unfenced / $base))"
  exit 0
fi

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
