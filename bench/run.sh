#!/usr/bin/env bash
# pg_eventview benchmark suite: starts a throwaway cluster, runs bench/bench.py, stops the cluster.
#   bash bench/run.sh            full run (1M / 4M events, ~14 min on 2 cores)
#   bash bench/run.sh --quick    smoke run (100k / 200k events, ~2.5 min)
#   bash bench/run.sh --freshness [--quick]   end-to-end freshness instead (bench/freshness.sh)
#   bash bench/run.sh --peers [--quick]       against pg_ivm, hand-written triggers and the floors (bench/peers.py)
# The cluster runs with production durability: fsync = on, synchronous_commit = on.
# Other arguments go to bench.py (see `python3 bench/bench.py --help`).
# Installs what is missing and a release build of pg_eventview first (BENCH_NO_INSTALL=1 uses
# whatever is installed in the system PostgreSQL 15 as it is).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p bench/out   # every file a run writes goes here (ignored by git)
if [ "${1:-}" = --freshness ]; then
  shift
  exec bash bench/freshness.sh "$@"
fi
DRIVER=bench/bench.py
PRELOAD=()
if [ "${1:-}" = --peers ]; then
  shift
  DRIVER=bench/peers.py
  # pg_eventview preloaded as in production, so that every commit runs the wake-up check
  # (the worker itself stays idle: nothing but the driver refreshes); pg_ivm beside it when it is
  # installed (peers.py says so when it is not).
  libraries=pg_eventview
  if [ -f "$(/usr/lib/postgresql/15/bin/pg_config --sharedir)/extension/pg_ivm.control" ]; then
    libraries="pg_eventview, pg_ivm"
  fi
  PRELOAD=("shared_preload_libraries = '$libraries'" "eventview.worker = off")
fi
if [ "${BENCH_NO_INSTALL:-0}" != 1 ]; then
  bash scripts/setup.sh
  echo "bench: installing a release build of pg_eventview" >&2
  cargo pgrx install --release --pg-config /usr/lib/postgresql/15/bin/pg_config >bench/out/install.log 2>&1 \
    || { tail -40 bench/out/install.log; exit 1; }
fi
DIR=${BENCH_DIR:-/tmp/pg_eventview_bench}
PORT=${BENCH_PORT:-55440}

# The cluster is throwaway: stopped and deleted on exit (it holds several GB after a full run);
# BENCH_KEEP=1 keeps the data directory for inspection.
cleanup() {
  bash scripts/cluster.sh stop "$DIR"
  if [ "${BENCH_KEEP:-0}" != 1 ]; then rm -rf "$DIR"; fi
}
trap cleanup EXIT
echo "bench: starting cluster in $DIR on port $PORT" >&2
bash scripts/cluster.sh start "$DIR" "$PORT" \
  "shared_buffers = '1GB'" \
  "work_mem = '64MB'" \
  "maintenance_work_mem = '512MB'" \
  "max_wal_size = '16GB'" \
  "min_wal_size = '8GB'" \
  "checkpoint_timeout = '1h'" \
  "log_min_messages = warning" \
  "fsync = on" \
  "synchronous_commit = on" \
  "${PRELOAD[@]}"
python3 "$DRIVER" --host 127.0.0.1 --port "$PORT" "$@"
