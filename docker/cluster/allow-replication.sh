#!/bin/sh
# Coordinator init (docker-entrypoint-initdb.d): let the replica connect for streaming replication
# with the same password authentication as ordinary connections.
set -eu
echo "host replication ${POSTGRES_USER} all scram-sha-256" >> "${PGDATA}/pg_hba.conf"
