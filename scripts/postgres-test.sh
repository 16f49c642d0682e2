#!/usr/bin/env bash
# A throwaway PostgreSQL server for the tests of carl's feedback store (tests/test_online_store.py).
#
#   eval "$(bash scripts/postgres-test.sh start)"   # exports CARL_TEST_POSTGRES_URL, CARL_TEST_POSTGRES_DIR
#   bash scripts/postgres-test.sh stop "$CARL_TEST_POSTGRES_DIR"
#
# `start` makes a new cluster in a temp dir, with database carl_test, superuser postgres, trust
# auth, and no TCP listener: the server is reached only through a unix socket in that dir, so it
# never clashes with another PostgreSQL on the machine. fsync is off: the data is thrown away,
# and the tests kill clients, not this server. As root (CI), the server runs as the `postgres`
# user, which Debian's postgresql package creates. Exits 2 when PostgreSQL is not installed
# (Debian: apt-get install postgresql), so callers can tell that from a failure.
set -euo pipefail
PORT=54329

bindir() {
  # readlink: the folder pg_ctl really lives in holds initdb and createdb too, a folder of links may not.
  if command -v pg_ctl >/dev/null 2>&1; then
    dirname "$(readlink -f "$(command -v pg_ctl)")"
    return
  fi
  # Debian and Ubuntu keep the server binaries off PATH, one folder per major version.
  local newest
  newest=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  if [ -n "$newest" ] && [ -x "$newest/pg_ctl" ]; then
    echo "$newest"
    return
  fi
  echo "postgres-test.sh: PostgreSQL is not installed (no pg_ctl on PATH or in /usr/lib/postgresql/*/bin)" >&2
  exit 2
}

# PostgreSQL refuses to run as root: run its programs as the postgres user then.
as_server_user() {
  if [ "$(id -u)" -eq 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

start() {
  local bin dir
  bin=$(bindir)
  if [ "$(id -u)" -eq 0 ] && ! id postgres >/dev/null 2>&1; then
    echo "postgres-test.sh: running as root needs a 'postgres' user to run the server as (Debian's postgresql package creates it)" >&2
    exit 1
  fi
  dir=$(mktemp -d "${TMPDIR:-/tmp}/carl-pg.XXXXXX")
  # A start that fails half-way leaves no server or folder behind.
  trap 'stop "$dir" 2>/dev/null || true' ERR
  if [ "$(id -u)" -eq 0 ]; then chown postgres: "$dir"; fi
  if ! as_server_user "$bin/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --no-sync \
      >"$dir/initdb.log" 2>&1; then
    cat "$dir/initdb.log" >&2
    rm -rf "$dir"
    exit 1
  fi
  if ! as_server_user "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
      -o "-c listen_addresses='' -k $dir -p $PORT -c fsync=off" start >/dev/null; then
    cat "$dir/server.log" >&2
    stop "$dir"
    exit 1
  fi
  as_server_user "$bin/createdb" -h "$dir" -p "$PORT" -U postgres carl_test
  echo "export CARL_TEST_POSTGRES_URL='postgresql+psycopg://postgres@/carl_test?host=$dir&port=$PORT'"
  echo "export CARL_TEST_POSTGRES_DIR='$dir'"
}

stop() {
  local dir=${1:?usage: postgres-test.sh stop DIR}
  if [ -f "$dir/data/postmaster.pid" ]; then
    as_server_user "$(bindir)/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null
  fi
  rm -rf "$dir"
}

case "${1:-}" in
  start) start ;;
  stop) stop "${2:-}" ;;
  *) echo "usage: postgres-test.sh start | stop DIR" >&2; exit 64 ;;
esac
