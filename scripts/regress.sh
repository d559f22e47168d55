#!/usr/bin/env bash
# Runs the pg_regress expected-output tests against a throwaway cluster of our own.
# The installed extension is used (scripts/test.sh installs it first).
#   scripts/regress.sh            compare against pg_regress/expected
#   scripts/regress.sh --accept   overwrite expected files with the results (review the diff!)
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=/tmp/pg_eventview_regress
PORT=${PGEV_REGRESS_PORT:-55433}
PG_REGRESS="$(/usr/lib/postgresql/15/bin/pg_config --pkglibdir)/pgxs/src/test/regress/pg_regress"
OUT=$(mktemp -d /tmp/pg_eventview_regress_out.XXXXXX)
chmod 777 "$OUT"
bash scripts/cluster.sh start "$DIR" "$PORT"
trap 'bash scripts/cluster.sh stop "$DIR"' EXIT
/usr/lib/postgresql/15/bin/psql -X -q -h "$DIR" -p "$PORT" -U postgres -d postgres \
  -c "CREATE DATABASE pg_eventview_regress"
status=0
# Same settings as cargo pgrx regress: terse errors, warnings and above only.
PGOPTIONS="-c client_min_messages=warning" \
"$PG_REGRESS" --use-existing --host="$DIR" --port="$PORT" --user=postgres \
  --bindir=/usr/lib/postgresql/15/bin \
  --inputdir=pg_regress --outputdir="$OUT" --dbname=pg_eventview_regress \
  --schedule=pg_regress/schedule || status=$?
if [ "${1:-}" = "--accept" ]; then
  mkdir -p pg_regress/expected
  cp "$OUT"/results/*.out pg_regress/expected/
  echo "regress: expected files updated from $OUT/results"
  exit 0
fi
if [ $status -ne 0 ]; then
  echo "regress: FAILED, differences:"; cat "$OUT/regression.diffs" 2>/dev/null | head -300
fi
exit $status
