#!/usr/bin/env bash
# Start a throwaway PgBouncer on loopback in front of the test PostgreSQL server (.ci/postgres.sh), in transaction
# pooling as clusters run it; writes $DIR/env.sh exporting FLCTL_TEST_PGBOUNCER (the tests read it).
#   .ci/pgbouncer.sh [DIR]        start (Debian's pgbouncer package must be installed, the server up)
#   .ci/pgbouncer.sh stop [DIR]   stop it (by the PID in its pid file)
# Every database of the server is reachable through it by name (the tests make one each), as the same user.
set -euo pipefail
DIR=${2:-/tmp/flctl-pgbouncer}
[ "${1:-}" = "stop" ] || DIR=${1:-/tmp/flctl-pgbouncer}
PIDFILE=$DIR/pgbouncer.pid
if [ "${1:-}" = "stop" ]; then
  if [ -f "$PIDFILE" ] && pid=$(cat "$PIDFILE") && kill "$pid" 2>/dev/null; then
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done   # down before a next start
  fi
  exit 0
fi
PORT=${FLCTL_PGBOUNCER_PORT:-56432}
PG_PORT=${FLCTL_PG_PORT:-55432}
if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
  echo "pgbouncer already running in $DIR"
else
  rm -rf "$DIR" && mkdir -p "$DIR"
  # trust, as the server: PgBouncer still wants the user in its auth_file. default_pool_size: the server
  # connections of one database, shared by every client in transaction pooling (the server allows 200 in all).
  echo '"postgres" ""' > "$DIR/userlist.txt"
  cat > "$DIR/pgbouncer.ini" <<EOF
[databases]
* = host=127.0.0.1 port=$PG_PORT
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $PORT
unix_socket_dir =
auth_type = trust
auth_file = $DIR/userlist.txt
pool_mode = transaction
default_pool_size = 20
max_client_conn = 1000
pidfile = $PIDFILE
logfile = $DIR/log
admin_users = postgres
EOF
  chown -R postgres: "$DIR"
  # PgBouncer refuses to run as root; -d: it daemonizes once it listens, so the tests find it up
  runuser -u postgres -- pgbouncer -d -q "$DIR/pgbouncer.ini"
fi
echo "export FLCTL_TEST_PGBOUNCER=postgresql://postgres@127.0.0.1:$PORT/flctl" > "$DIR/env.sh"
echo "pgbouncer up on 127.0.0.1:$PORT (transaction pooling, in front of 127.0.0.1:$PG_PORT)"
