#!/usr/bin/env bash
# pg_eventview benchmark on Citus (API.md section 10, issue #26): starts a coordinator and two
# workers of its own (production durability), runs bench/citus.py (ingest through the
# coordinator, refresh over 32 shards against a single-node refresh, point reads, realtime
# point reads), stops and deletes the clusters on exit. Skipped, with one line, where Citus is not installed for the
# server's PostgreSQL (it is in no package registry: build it by hand from its public source).
# Installs a release build of pg_eventview first (BENCH_NO_INSTALL=1 uses what is installed).
set -euo pipefail
cd "$(dirname "$0")/.."
PG_LIB=$(/usr/lib/postgresql/15/bin/pg_config --pkglibdir)
if [ ! -f "$PG_LIB/citus.so" ]; then
  echo "citus: skipped: Citus is not installed for PostgreSQL 15 ($PG_LIB/citus.so is missing)"
  exit 0
fi
mkdir -p bench/out   # every file a run writes goes here (ignored by git)
if [ "${BENCH_NO_INSTALL:-0}" != 1 ]; then
  bash scripts/setup.sh
  echo "citus: installing a release build of pg_eventview" >&2
  cargo pgrx install --release --pg-config /usr/lib/postgresql/15/bin/pg_config >bench/out/install.log 2>&1 \
    || { tail -40 bench/out/install.log; exit 1; }
fi
BASE=${CITUS_BENCH_DIR:-/tmp/pg_eventview_citus_bench}
PORT=${CITUS_BENCH_PORT:-55470}
NODES=(0 1 2)
cleanup() {
  for i in "${NODES[@]}"; do
    bash scripts/cluster.sh stop "$BASE/n$i"
  done
  if [ "${BENCH_KEEP:-0}" != 1 ]; then rm -rf "$BASE"; fi
}
trap cleanup EXIT
for i in "${NODES[@]}"; do
  bash scripts/cluster.sh start "$BASE/n$i" $((PORT + i)) \
    "shared_preload_libraries = 'citus,pg_eventview'" \
    "eventview.worker = off" \
    "wal_level = logical" \
    "max_prepared_transactions = 100" \
    "max_connections = 200" \
    "shared_buffers = '1GB'" \
    "work_mem = '64MB'" \
    "min_wal_size = '4GB'" \
    "max_wal_size = '8GB'" \
    "checkpoint_timeout = '1h'" \
    "log_min_messages = warning" \
    "fsync = on" \
    "synchronous_commit = on"
done
python3 bench/citus.py --host 127.0.0.1 --port "$PORT" "$@"
