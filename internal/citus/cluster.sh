#!/usr/bin/env bash
# Starts (or stops) a Citus cluster of a coordinator and two workers as
# three local PostgreSQL 15 clusters under DIR, from installed Citus
# binaries (see build.sh), and prints the coordinator's URL:
#
#   internal/citus/cluster.sh start /tmp/citus     # prints the URL
#   export QUEEN_TEST_CITUS_URL=$(internal/citus/cluster.sh url /tmp/citus)
#   internal/citus/cluster.sh stop /tmp/citus
#
# Ports: PORT (default 9700) for the coordinator, PORT+1 and PORT+2 for the
# workers. WORKERS=1 starts and adds only the first worker (a one-worker
# cluster for examples/bench's -citus-url-1). Production-like settings as
# the benchmarks use (fsync on).
# Run as root, the clusters belong to the postgres user.
set -euo pipefail
cmd=${1:?usage: cluster.sh start|stop|url DIR}
dir=${2:?usage: cluster.sh start|stop|url DIR}
port=${PORT:-9700}
bin=${PGBIN:-/usr/lib/postgresql/15/bin}
workers=${WORKERS:-2}
case $workers in 1 | 2) ;; *) echo "WORKERS must be 1 or 2" >&2; exit 2 ;; esac
names=(coordinator worker1 worker2)

as_owner() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
url() { echo "postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable"; }

case $cmd in
url)
  url
  ;;
start)
  mkdir -p "$dir"
  [ "$(id -u)" = 0 ] && chown postgres "$dir"
  for i in $(seq 0 "$workers"); do
    d="$dir/${names[$i]}"
    p=$((port + i))
    if [ ! -d "$d" ]; then
      as_owner "$bin/initdb" -D "$d" -U postgres --auth=trust >/dev/null
      cat >>"$d/postgresql.conf" <<CONF
shared_preload_libraries = 'citus'
port = $p
listen_addresses = '127.0.0.1'
unix_socket_directories = '$d'
max_connections = 300
max_prepared_transactions = 200
shared_buffers = 512MB
wal_buffers = 16MB
max_wal_size = 4GB
checkpoint_timeout = 15min
wal_level = logical
citus.shard_count = 32
# No background 2PC recovery: it prunes pg_dist_transaction, where TestOnCitus
# counts two-phase commits. After a crash run recover_prepared_transactions().
citus.recover_2pc_interval = -1
CONF
    fi
    as_owner "$bin/pg_ctl" -D "$d" -l "$d/log" -w start >/dev/null
  done
  psql_at() { as_owner "$bin/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$1" -U postgres -d postgres -c "$2"; }
  for i in $(seq 0 "$workers"); do psql_at $((port + i)) "CREATE EXTENSION IF NOT EXISTS citus" >/dev/null; done
  psql_at "$port" "SELECT citus_set_coordinator_host('127.0.0.1', $port)" >/dev/null
  for i in $(seq 1 "$workers"); do
    psql_at "$port" "SELECT citus_add_node('127.0.0.1', $((port + i))) WHERE NOT EXISTS (SELECT 1 FROM pg_dist_node WHERE nodeport = $((port + i)))" >/dev/null
  done
  url
  ;;
stop)
  for i in 2 1 0; do
    d="$dir/${names[$i]}"
    [ -d "$d" ] && as_owner "$bin/pg_ctl" -D "$d" -m fast -w stop >/dev/null 2>&1 || true
  done
  ;;
*)
  echo "usage: cluster.sh start|stop|url DIR" >&2
  exit 2
  ;;
esac
