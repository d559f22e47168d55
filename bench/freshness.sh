#!/usr/bin/env bash
# pg_eventview end-to-end freshness: starts a throwaway cluster with the background worker
# preloaded, runs bench/freshness.py against it, stops and deletes the cluster on exit.
#   bash bench/freshness.sh            60 s at 5,000 events/s
#   bash bench/freshness.sh --quick    15 s
#   bash bench/freshness.sh --sweep 5000,10000,20000,30000 --duration 20   rates one after the other
# Other arguments go to freshness.py (see `python3 bench/freshness.py --help`).
# Installs what is missing and a release build of pg_eventview first (BENCH_NO_INSTALL=1 uses
# whatever is installed in the system PostgreSQL 15 as it is).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p bench/out   # every file a run writes goes here (ignored by git)
if [ "${BENCH_NO_INSTALL:-0}" != 1 ]; then
  bash scripts/setup.sh
  echo "freshness: installing a release build of pg_eventview" >&2
  cargo pgrx install --release --pg-config /usr/lib/postgresql/15/bin/pg_config >bench/out/install.log 2>&1 \
    || { tail -40 bench/out/install.log; exit 1; }
fi
DIR=${FRESHNESS_DIR:-/tmp/pg_eventview_freshness}
PORT=${FRESHNESS_PORT:-55460}
DB=freshness

cleanup() {
  bash scripts/cluster.sh stop "$DIR"
  if [ "${BENCH_KEEP:-0}" != 1 ]; then rm -rf "$DIR"; fi
}
trap cleanup EXIT
echo "freshness: starting cluster in $DIR on port $PORT" >&2
# The worker of database $DB calls eventview.run_maintenance() every second; the database is
# created by freshness.py (until then the postmaster restarts the worker every 5 s).
bash scripts/cluster.sh start "$DIR" "$PORT" \
  "shared_preload_libraries = 'pg_eventview'" \
  "eventview.databases = '$DB'" \
  "eventview.naptime = '1s'" \
  "shared_buffers = '1GB'" \
  "work_mem = '64MB'" \
  "maintenance_work_mem = '512MB'" \
  "min_wal_size = '8GB'" \
  "max_wal_size = '16GB'" \
  "checkpoint_timeout = '1h'" \
  "log_min_messages = warning" \
  "fsync = on" \
  "synchronous_commit = on"
python3 bench/freshness.py --host 127.0.0.1 --port "$PORT" --dbname "$DB" "$@"
