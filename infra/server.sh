#!/usr/bin/env bash
# A local Prefect server on 127.0.0.1:4200 with SQLite under .prefect/ (analytics off).
# For anything shared, point PREFECT_SERVER_DATABASE_CONNECTION_URL at PostgreSQL first.
set -euo pipefail
source "$(dirname "$0")/env.sh"
exec prefect server start --host "$PREFECT_SERVER_API_HOST" --port "$PREFECT_SERVER_API_PORT"
