#!/usr/bin/env bash
# Installs everything pg_eventview needs to build and test on a fresh Debian 12 machine that has
# only Rust. Idempotent: each step checks first and does nothing when already done.
set -euo pipefail

PGRX_VERSION=0.18.1
PG_MAJOR=15
PG_CONFIG=/usr/lib/postgresql/${PG_MAJOR}/bin/pg_config

need_apt=()
for pkg in postgresql-${PG_MAJOR} postgresql-server-dev-${PG_MAJOR} postgresql-${PG_MAJOR}-cron postgresql-${PG_MAJOR}-partman \
           clang libclang-dev pkg-config libssl-dev build-essential sudo; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || need_apt+=("$pkg")
done
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
if ! python3 -c "import psycopg, pytest" 2>/dev/null; then
  echo "setup: installing psycopg and pytest"
  python3 -m pip install -q --disable-pip-version-check "psycopg[binary]==3.3.9" "pytest==8.*"
fi
echo "setup: done"
