#!/usr/bin/env bash
# Starts (or stops) a throwaway PostgreSQL 15 cluster of our own: own data directory, own port,
# run as the `postgres` OS user (Postgres refuses to run as root).
#   scripts/cluster.sh start DIR PORT [extra postgresql.conf lines...]
#   scripts/cluster.sh stop DIR
# PG_BIN names another PostgreSQL 15 bin directory, e.g. a copy of the install that a long benchmark
# runs on while `cargo pgrx install` replaces the system one.
set -euo pipefail
BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
cmd=$1; dir=$2
as_pg() { if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
case "$cmd" in
  start)
    port=$3; shift 3
    if [ -f "$dir/postmaster.pid" ]; then as_pg "$BIN/pg_ctl" -D "$dir" -m immediate stop >/dev/null 2>&1 || true; fi
    rm -rf "$dir"; mkdir -p "$dir"
    [ "$(id -u)" -eq 0 ] && chown postgres:postgres "$dir"
    as_pg "$BIN/initdb" -D "$dir" -U postgres --auth=trust --no-sync -E UTF8 --locale=C >/dev/null
    {
      echo "port = $port"
      echo "listen_addresses = '127.0.0.1'"
      echo "unix_socket_directories = '$dir'"
      echo "fsync = off"
      echo "max_connections = 50"
      for line in "$@"; do echo "$line"; done
    } >> "$dir/postgresql.conf"
    as_pg "$BIN/pg_ctl" -D "$dir" -l "$dir/server.log" -w start >/dev/null
    ;;
  stop)
    if [ -f "$dir/postmaster.pid" ]; then as_pg "$BIN/pg_ctl" -D "$dir" -m fast -w stop >/dev/null || true; fi
    ;;
  *) echo "usage: $0 start DIR PORT | stop DIR" >&2; exit 2 ;;
esac
