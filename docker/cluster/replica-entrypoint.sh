#!/bin/sh
# A hot standby of $PRIMARY_HOST: on first start, pg_basebackup -R (standby.signal and
# primary_conninfo written), then run postgres as the image's entrypoint would.
set -eu
if [ ! -s "${PGDATA}/PG_VERSION" ]; then
  mkdir -p "${PGDATA}"
  chown -R postgres:postgres "$(dirname "${PGDATA}")"
  chmod 700 "${PGDATA}"
  until pg_isready -h "${PRIMARY_HOST}" -U "${POSTGRES_USER}" -d "${POSTGRES_DB}"; do sleep 1; done
  gosu postgres sh -c "PGPASSWORD='${POSTGRES_PASSWORD}' pg_basebackup -h '${PRIMARY_HOST}' -U '${POSTGRES_USER}' \
    -D '${PGDATA}' -X stream -R -c fast"
fi
exec gosu postgres postgres -c hot_standby=on -c hot_standby_feedback=on
