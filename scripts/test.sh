#!/usr/bin/env bash
# Runs the whole workspace's tests against real, throw-away redis-server processes.
# Installs redis-server with apt-get if it is missing (needs root or sudo).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1; then
  echo "redis-server not found; installing it with apt-get" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server >/dev/null
fi
redis-server --version

# The tests start their own servers on free loopback ports; none is needed running.
cargo test --workspace --all-features --no-fail-fast "$@"
