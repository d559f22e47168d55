#!/usr/bin/env bash
# The main job: installs what is missing, builds and installs pg_eventview, starts a throwaway
# cluster of its own (own data directory and port), runs the demo, and stops the cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --no-python
echo "== building and installing pg_eventview"
cargo pgrx install --pg-config /usr/lib/postgresql/15/bin/pg_config >/tmp/pg_eventview_demo_install.log 2>&1 \
  || { tail -40 /tmp/pg_eventview_demo_install.log; exit 1; }
DIR=/tmp/pg_eventview_demo
PORT=${PGEV_DEMO_PORT:-55434}
bash scripts/cluster.sh start "$DIR" "$PORT"
trap 'bash scripts/cluster.sh stop "$DIR"' EXIT
echo "== demo on a throwaway cluster at $DIR (port $PORT)"
/usr/lib/postgresql/15/bin/psql -X -h "$DIR" -p "$PORT" -U postgres -d postgres -f demo/demo.sql
