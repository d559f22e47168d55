#!/usr/bin/env bash
# Installs everything pg_eventview needs to build and test on a fresh Debian 12 machine that has
# only Rust. Idempotent: each step checks first and does nothing when already done.
# `--no-python`: without the Python packages the tests and benchmarks use (the demo needs none).
set -euo pipefail

python=yes
[ "${1:-}" = "--no-python" ] && python=no

PGRX_VERSION=0.18.1
PG_MAJOR=15
PG_CONFIG=/usr/lib/postgresql/${PG_MAJOR}/bin/pg_config

need_apt=()
for pkg in postgresql-${PG_MAJOR} postgresql-server-dev-${PG_MAJOR} postgresql-${PG_MAJOR}-cron postgresql-${PG_MAJOR}-partman \
           clang libclang-dev pkg-config libssl-dev build-essential sudo; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || need_apt+=("$pkg")
done
# Debian's own Python when there is none with pip on PATH.
if [ "$python" = yes ] && ! python3 -m pip --version >/dev/null 2>&1; then
  need_apt+=(python3 python3-pip python3-venv)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
fi

if ! cargo pgrx --version 2>/dev/null | grep -q "${PGRX_VERSION}"; then
  echo "setup: installing cargo-pgrx ${PGRX_VERSION} (takes a few minutes)"
  cargo install cargo-pgrx --version "=${PGRX_VERSION}" --locked
fi

PGRX_HOME=${PGRX_HOME:-$HOME/.pgrx}
if ! grep -qs "pg${PG_MAJOR}" "$PGRX_HOME/config.toml"; then
  echo "setup: cargo pgrx init --pg${PG_MAJOR} ${PG_CONFIG}"
  cargo pgrx init --pg${PG_MAJOR} "${PG_CONFIG}"
fi
# Integration tests and benchmarks drive real clusters from Python.
if [ "$python" = yes ] && ! python3 -c "import psycopg, pytest" 2>/dev/null; then
  echo "setup: installing psycopg and pytest"
  if ! python3 -m pip install -q --disable-pip-version-check "psycopg[binary]==3.3.9" "pytest==8.*"; then
    # Debian's python3 refuses installs outside a virtual environment (PEP 668).
    echo "setup: pip could not install psycopg and pytest for $(command -v python3)." >&2
    echo "setup: make a virtual environment and run again from it:" >&2
    echo "setup:   python3 -m venv ~/pg_eventview-venv && . ~/pg_eventview-venv/bin/activate" >&2
    exit 1
  fi
fi
echo "setup: done"
