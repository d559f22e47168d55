#!/usr/bin/env bash
# Runs every test of pg_eventview on this machine, installing what is missing first.
#   0. habits, in seconds: cargo fmt --check and eventview-core's plain cargo test (before
#      anything is installed: no PostgreSQL needed for definitions, JSONPaths, the jsonb reader
#      and the generated SQL against its golden files), then, once installed, cargo clippy
#      -D warnings
#   1. cargo pgrx test: #[pg_test] units inside Postgres
#   2. pg_regress: expected-output tests of what users see (scripts/regress.sh)
#   3. pytest: integration tests against real clusters (differential, crash, concurrency, upgrades)
# Ends with one line "tests: N passed, M failed" counting individual tests of all of them.
set -uo pipefail
cd "$(dirname "$0")/.."

LOG=$(mktemp -d /tmp/pg_eventview_test.XXXXXX)
passed=0; failed=0; rc=0

echo "== cargo fmt --check, cargo test -p eventview-core"
if ! cargo fmt --all -- --check >"$LOG/fmt.log" 2>&1; then
  rc=1; failed=$((failed + 1)); echo "cargo fmt: files are not formatted (cargo fmt --all fixes them):"; head -40 "$LOG/fmt.log"
fi
cargo test -p eventview-core >"$LOG/core.log" 2>&1; core_rc=$?
grep -E "test result:" "$LOG/core.log"
[ $core_rc -eq 0 ] || { rc=1; grep -E "FAILED|panicked" -A5 "$LOG/core.log" | head -40; }
p=$(grep -oE "test result: [a-zA-Z]+\. [0-9]+ passed; [0-9]+ failed" "$LOG/core.log" | awk '{s+=$4; f+=$6} END {print s+0, f+0}')
passed=$((passed + ${p% *})); failed=$((failed + ${p#* }))
if [ $core_rc -ne 0 ] && [ "${p#* }" = "0" ]; then failed=$((failed + 1)); tail -20 "$LOG/core.log"; fi

bash scripts/setup.sh || { echo "tests: $passed passed, $((failed + 1)) failed"; exit 1; }

echo "== cargo clippy"
if ! cargo clippy --workspace --all-targets -- -D warnings >"$LOG/clippy.log" 2>&1; then
  rc=1; failed=$((failed + 1)); echo "cargo clippy: warnings:"; grep -E "^(warning|error)" -A8 "$LOG/clippy.log" | head -60
fi

echo "== cargo pgrx test (in-backend tests)"
PGDATA_TEST=/tmp/pg_eventview_pgrx_data
mkdir -p "$PGDATA_TEST"; [ "$(id -u)" -eq 0 ] && chown postgres:postgres "$PGDATA_TEST"
RUNAS=(); [ "$(id -u)" -eq 0 ] && RUNAS=(--runas postgres --pgdata "$PGDATA_TEST")
cargo pgrx test pg15 -p pg_eventview "${RUNAS[@]}" >"$LOG/unit.log" 2>&1; unit_rc=$?
grep -E "^test |test result:" "$LOG/unit.log"
[ $unit_rc -eq 0 ] || rc=1
p=$(grep -oE "test result: [a-zA-Z]+\. [0-9]+ passed; [0-9]+ failed" "$LOG/unit.log" | awk '{s+=$4; f+=$6} END {print s+0, f+0}')
passed=$((passed + ${p% *})); failed=$((failed + ${p#* }))
if [ $unit_rc -ne 0 ] && [ "${p#* }" = "0" ]; then failed=$((failed + 1)); tail -40 "$LOG/unit.log"; fi

# cargo pgrx test installs a build with the test-only `tests` schema; what users get (and what
# pg_regress and the integration tests must exercise) is the plain build.
echo "== building and installing the extension"
cargo pgrx install --pg-config /usr/lib/postgresql/15/bin/pg_config >"$LOG/install.log" 2>&1 \
  || { tail -50 "$LOG/install.log"; echo "tests: $passed passed, $((failed + 1)) failed"; exit 1; }

echo "== pg_regress (expected output)"
if bash scripts/regress.sh >"$LOG/regress.log" 2>&1; then
  n=$(grep -oE "All [0-9]+ tests passed" "$LOG/regress.log" | grep -oE "[0-9]+")
  passed=$((passed + ${n:-0})); echo "pg_regress: ${n:-0} passed"
else
  rc=1; cat "$LOG/regress.log" | tail -80
  n=$(grep -cE "^(not ok|test .* FAILED|.* \.\.\. FAILED)" "$LOG/regress.log"); failed=$((failed + ${n:-1}))
  ok=$(grep -cE "\.\.\. ok" "$LOG/regress.log"); passed=$((passed + ${ok:-0}))
fi

echo "== pytest (integration: differential, crash, concurrency)"
python3 -m pytest -q tests/ 2>&1 | tee "$LOG/pytest.log" | tail -15
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
pp=$(grep -oE "[0-9]+ passed" "$LOG/pytest.log" | tail -1 | grep -oE "[0-9]+"); passed=$((passed + ${pp:-0}))
pf=$(grep -oE "[0-9]+ (failed|error)" "$LOG/pytest.log" | tail -1 | grep -oE "[0-9]+"); failed=$((failed + ${pf:-0}))
if [ $rc -ne 0 ] && [ $failed -eq 0 ]; then failed=1; fi

echo "logs: $LOG"
echo "tests: $passed passed, $failed failed"
exit $rc
