#!/usr/bin/env bash
# Writes under a pinned xmin (BENCHMARKS.md, "Writes under a pinned xmin"):
# the SQL write API (outbox.enqueue, migration 020) beside the write it
# replaced (the counter row's upsert, last_sequence + 1, then the insert:
# migrations 011-019, and what one writes by hand), in one run on a private
# PostgreSQL 15 cluster with pg_stat_statements. pgbench offers RATE
# one-event transactions per second to each, over 2,000 aggregates; after a
# minute a session holds BEGIN; SELECT txid_current(); open for MINUTES.
# Prints, per minute, each write's mean execution time and shared buffers
# per call.
#
#   bash bench/pgbench/pinned-writes.sh [RATE=400] [MINUTES=6]
#
# Needs PostgreSQL 15's server binaries (/usr/lib/postgresql/15/bin),
# pgbench, psql and Go (it builds cmd/outbox to migrate the schemas).
set -euo pipefail
rate=${1:-400} minutes=${2:-6}
cd "$(dirname "$0")/../.."
bin=/usr/lib/postgresql/15/bin
dir=$(mktemp -d /tmp/outbox-pinned-writes.XXXXXX)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
run() { if [ "$(id -u)" = 0 ]; then su postgres -c "$*"; else bash -c "$*"; fi; }
[ "$(id -u)" = 0 ] && chown postgres "$dir"
run "$bin/initdb -D $dir/data -A trust -U postgres >/dev/null"
run "$bin/pg_ctl -D $dir/data -l $dir/log -w -o '-p $port -c listen_addresses=127.0.0.1 -c unix_socket_directories=$dir -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all -c max_connections=40' start >/dev/null"
trap 'run "$bin/pg_ctl -D $dir/data -m immediate stop >/dev/null"; rm -rf "$dir"' EXIT
url="postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable"
P="psql -X -q -h 127.0.0.1 -p $port -U postgres -d postgres -v ON_ERROR_STOP=1"
go build -o "$dir/outbox" ./cmd/outbox
$P -c "CREATE EXTENSION pg_stat_statements"
for s in pw_new pw_old; do "$dir/outbox" migrate --database-url "$url" --schema $s >/dev/null; done
# The write before migration 020: the counter row's upsert, then the insert.
$P <<'SQL'
CREATE FUNCTION pw_old.enq(t text, i text) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE seq bigint;
BEGIN
  INSERT INTO pw_old.outbox_aggregates AS a (aggregate_type, aggregate_id, last_sequence) VALUES (t, i, 1)
  ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE SET last_sequence = a.last_sequence + 1
  RETURNING a.last_sequence INTO seq;
  INSERT INTO pw_old.outbox_events (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload_bytes, headers)
  VALUES (pw_old.new_event_id(), t, i, seq, 'T', '{"a":1}'::bytea, '{}');
  RETURN seq;
END $$;
SQL
printf '\\set a random(1, 2000)\nSELECT * FROM pw_new.enqueue(%s, %s || :a, %s, %s::text);\n' "'order'" "'o'" "'T'" "'{\"a\":1}'" > "$dir/new.sql"
printf '\\set a random(1, 2000)\nSELECT pw_old.enq(%s, %s || :a);\n' "'order'" "'o'" > "$dir/old.sql"
secs=$(( (minutes + 1) * 60 + 30 ))
for k in new old; do
  pgbench -h 127.0.0.1 -p $port -U postgres -n -R "$rate" -c 3 -j 1 -T $secs -f "$dir/$k.sql" postgres > "$dir/$k.pgbench" 2>&1 &
done
echo "minute | pinned | old: ms/call | old: buffers/call | new: ms/call | new: buffers/call"
echo "---|---|---|---|---|---"
$P -c "SELECT pg_stat_statements_reset()" >/dev/null
for m in $(seq 0 "$minutes"); do
  sleep 60
  $P -At -F ' | ' -c "SELECT $m, $([ "$m" = 0 ] && echo "'no'" || echo "'yes'"),
    (SELECT round(mean_exec_time::numeric, 3) FROM pg_stat_statements WHERE query LIKE 'SELECT pw_old.enq%'),
    (SELECT round((shared_blks_hit + shared_blks_read)::numeric / calls, 1) FROM pg_stat_statements WHERE query LIKE 'SELECT pw_old.enq%'),
    (SELECT round(mean_exec_time::numeric, 3) FROM pg_stat_statements WHERE query LIKE 'SELECT * FROM pw_new.enqueue%'),
    (SELECT round((shared_blks_hit + shared_blks_read)::numeric / calls, 1) FROM pg_stat_statements WHERE query LIKE 'SELECT * FROM pw_new.enqueue%')"
  $P -c "SELECT pg_stat_statements_reset()" >/dev/null
  if [ "$m" = 0 ]; then
    psql -X -q -h 127.0.0.1 -p $port -U postgres -d postgres -c "BEGIN; SELECT txid_current(); SELECT pg_sleep($(( minutes * 60 + 20 )));" >/dev/null 2>&1 &
  fi
done
wait
