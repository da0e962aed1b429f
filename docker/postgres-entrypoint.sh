#!/bin/sh
# PostgreSQL for Compose's `postgres` profile, from Debian's package: a
# data directory made at first start with one user and one database from
# the environment (POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_DB), then the
# server in the foreground. Runs as the package's `postgres` user.
set -eu
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
PGDATA=${PGDATA:-/var/lib/postgresql/data}
user=${POSTGRES_USER:-agentry}
db=${POSTGRES_DB:-agentry}
if [ -z "${POSTGRES_PASSWORD:-}" ]; then
  echo "postgres-entrypoint: set POSTGRES_PASSWORD" >&2
  exit 2
fi
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  mkdir -p "$PGDATA"
  chmod 700 "$PGDATA"
  pwfile=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
  # Passwords everywhere, the socket included: with `trust`, any process
  # that reaches the socket is the database's owner.
  "$bin/initdb" -D "$PGDATA" -U "$user" --pwfile="$pwfile" \
    --auth=scram-sha-256 -E UTF8 --no-locale >/dev/null
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  "$bin/pg_ctl" -D "$PGDATA" -o "-c listen_addresses= -k /tmp" -w start >/dev/null
  PGPASSWORD="$POSTGRES_PASSWORD" "$bin/psql" -h /tmp -U "$user" -d postgres -v ON_ERROR_STOP=1 -q \
    -c "CREATE DATABASE \"$db\""
  "$bin/pg_ctl" -D "$PGDATA" -m fast -w stop >/dev/null
  echo "postgres-entrypoint: initialised $PGDATA with database $db" >&2
fi
exec "$bin/postgres" -D "$PGDATA" -c listen_addresses='*' -k /tmp
