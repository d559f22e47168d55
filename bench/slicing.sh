#!/usr/bin/env bash
# pg_eventview benchmark of analysts' slicing (API.md sections 8 and 9): starts a throwaway
# cluster, runs bench/slicing.py (percentiles: storage per group at 1k and 1M events, refresh
# against a max view; unnest: refresh per element against per event; rollups: the refresh of a
# rollup against its source's; --quick: smaller; --only percentile|unnest|rollup: one of them),
# stops and deletes the cluster on exit.
# Installs what is missing and a release build of pg_eventview first (BENCH_NO_INSTALL=1 uses
# whatever is installed in the system PostgreSQL 15 as it is).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p bench/out   # every file a run writes goes here (ignored by git)
if [ "${BENCH_NO_INSTALL:-0}" != 1 ]; then
  bash scripts/setup.sh
  echo "slicing: installing a release build of pg_eventview" >&2
  cargo pgrx install --release --pg-config /usr/lib/postgresql/15/bin/pg_config >bench/out/install.log 2>&1 \
    || { tail -40 bench/out/install.log; exit 1; }
fi
DIR=${SLICING_DIR:-/tmp/pg_eventview_slicing}
PORT=${SLICING_PORT:-55460}
cleanup() {
  bash scripts/cluster.sh stop "$DIR"
  if [ "${BENCH_KEEP:-0}" != 1 ]; then rm -rf "$DIR"; fi
}
trap cleanup EXIT
bash scripts/cluster.sh start "$DIR" "$PORT" \
  "shared_buffers = '1GB'" \
  "work_mem = '64MB'" \
  "maintenance_work_mem = '512MB'" \
  "min_wal_size = '8GB'" \
  "max_wal_size = '16GB'" \
  "checkpoint_timeout = '1h'" \
  "log_min_messages = warning" \
  "fsync = on" \
  "synchronous_commit = on"
python3 bench/slicing.py --host 127.0.0.1 --port "$PORT" "$@"
