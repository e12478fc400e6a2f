#!/usr/bin/env bash
# Start a throwaway PostgreSQL server on loopback for the tests; writes $DIR/env.sh exporting FLCTL_TEST_PG.
#   .ci/postgres.sh [DIR]        start (Debian's postgresql package must be installed)
#   .ci/postgres.sh stop [DIR]   stop it (by the PID in its pid file)
# FLCTL_PG_PORT: its port (55432); FLCTL_PG_MAX_CONNECTIONS: connections it allows (200; benchmarks/bench_scale.py's
# 200 simulated workers, each with its own connection, want more beside the tests').
set -euo pipefail
if [ "${1:-}" = "stop" ]; then
  DIR=${2:-/tmp/flctl-pg}
  BIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
  # Fast shutdown, and wait until it is really down, so a following start does not find a dying server.
  [ -f "$DIR/data/postmaster.pid" ] && runuser -u postgres -- "$BIN/pg_ctl" -D "$DIR/data" -m fast -w stop >/dev/null || true
  exit 0
fi
DIR=${1:-/tmp/flctl-pg}
PORT=${FLCTL_PG_PORT:-55432}
BIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
if [ -f "$DIR/data/postmaster.pid" ] && kill -0 "$(head -1 "$DIR/data/postmaster.pid")" 2>/dev/null; then
  echo "postgres already running in $DIR"
else
  rm -rf "$DIR" && mkdir -p "$DIR" && chown postgres: "$DIR"
  runuser -u postgres -- "$BIN/initdb" -D "$DIR/data" -A trust -U postgres >/dev/null
  runuser -u postgres -- "$BIN/pg_ctl" -D "$DIR/data" -l "$DIR/log" -w -o "-h 127.0.0.1 -p $PORT -k $DIR -c max_connections=${FLCTL_PG_MAX_CONNECTIONS:-200} -c fsync=off" start >/dev/null
fi
runuser -u postgres -- "$BIN/psql" -h 127.0.0.1 -p "$PORT" -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname='flctl'" | grep -q 1 \
  || runuser -u postgres -- "$BIN/createdb" -h 127.0.0.1 -p "$PORT" -U postgres flctl
echo "export FLCTL_TEST_PG=postgresql://postgres@127.0.0.1:$PORT/flctl" > "$DIR/env.sh"
echo "postgres up on 127.0.0.1:$PORT"
