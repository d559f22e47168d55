#!/usr/bin/env bash
# pg_eventview at scale on one node: starts a throwaway cluster with the background worker
# preloaded (off until the sustained run), runs bench/scale.py against it, stops and deletes the
# cluster on exit.
#   bash bench/scale.sh                                   51.2M events, 10-minute sustained run
#   bash bench/scale.sh --per-day 50000 --sustain 60      a smoke run
# Other arguments go to scale.py (see `python3 bench/scale.py --help`). About 20 GB of disk at
# full size. Installs what is missing and a release build of pg_eventview first
# (BENCH_NO_INSTALL=1 uses whatever is installed in the system PostgreSQL 15 as it is).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p bench/out   # every file a run writes goes here (ignored by git)
if [ "${BENCH_NO_INSTALL:-0}" != 1 ]; then
  bash scripts/setup.sh
  echo "scale: installing a release build of pg_eventview" >&2
  cargo pgrx install --release --pg-config /usr/lib/postgresql/15/bin/pg_config >bench/out/install.log 2>&1 \
    || { tail -40 bench/out/install.log; exit 1; }
fi
DIR=${SCALE_DIR:-/tmp/pg_eventview_scale}
PORT=${SCALE_PORT:-55480}
DB=scale
cleanup() {
  bash scripts/cluster.sh stop "$DIR"
  if [ "${BENCH_KEEP:-0}" != 1 ]; then rm -rf "$DIR"; fi
}
trap cleanup EXIT
echo "scale: starting cluster in $DIR on port $PORT" >&2
bash scripts/cluster.sh start "$DIR" "$PORT" \
  "shared_preload_libraries = 'pg_eventview'" \
  "eventview.databases = '$DB'" \
  "eventview.naptime = '1s'" \
  "eventview.worker = off" \
  "shared_buffers = '1GB'" \
  "work_mem = '64MB'" \
  "maintenance_work_mem = '512MB'" \
  "min_wal_size = '1GB'" \
  "max_wal_size = '4GB'" \
  "checkpoint_timeout = '15min'" \
  "log_min_messages = warning" \
  "fsync = on" \
  "synchronous_commit = on"
python3 bench/scale.py --host 127.0.0.1 --port "$PORT" --dbname "$DB" "$@"
