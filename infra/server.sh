#!/usr/bin/env bash
# The Prefect server on 127.0.0.1:4200 (PREFECT_SERVER_API_HOST/PORT to change it).
#
# Database, first match wins:
#   PREFECT_SERVER_DATABASE_CONNECTION_URL=postgresql+asyncpg://USER:PASSWORD@HOST:5432/prefect
#       any PostgreSQL (14+, with the pg_trgm extension available): what a cluster uses;
#   SPECREGEN_POSTGRES_DIR=/srv/specregen-pg [SPECREGEN_POSTGRES_PORT=5432]
#       a PostgreSQL that infra/postgres.sh starts in that folder (first time: initdb);
#   neither: SQLite under $PREFECT_HOME (the demo; one machine only: under load SQLite answers
#       "database is locked" and the server answers 503).
set -euo pipefail
source "$(dirname "$0")/env.sh"
if [ -z "${PREFECT_SERVER_DATABASE_CONNECTION_URL:-}" ] && [ -n "${SPECREGEN_POSTGRES_DIR:-}" ]; then
    PREFECT_SERVER_DATABASE_CONNECTION_URL=$(bash "$root/infra/postgres.sh" start \
        "$SPECREGEN_POSTGRES_DIR" "${SPECREGEN_POSTGRES_PORT:-5432}")
    export PREFECT_SERVER_DATABASE_CONNECTION_URL
fi
exec prefect server start --host "$PREFECT_SERVER_API_HOST" --port "$PREFECT_SERVER_API_PORT"
