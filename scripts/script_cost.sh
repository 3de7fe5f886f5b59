#!/usr/bin/env bash
# What the plain lock's cycles cost Redis itself, beside rslock's in the same run: the
# `peer` and `lock` rows of scripts/kind_cost.py (whole server minus serverCron, per
# cycle, under valgrind's callgrind; see its header). Extra arguments are passed on, e.g.
# `--cycles 512`; `REDIS_SERVER` names another server binary (Valkey).
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 scripts/kind_cost.py --only peer,lock "$@"
