# Sourced by the infra scripts: a project-local Prefect home on loopback, SQLite, no telemetry.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PREFECT_HOME="${PREFECT_HOME:-$root/.prefect}"
export PREFECT_SERVER_API_HOST="${PREFECT_SERVER_API_HOST:-127.0.0.1}"
export PREFECT_SERVER_API_PORT="${PREFECT_SERVER_API_PORT:-4200}"
export PREFECT_API_URL="${PREFECT_API_URL:-http://$PREFECT_SERVER_API_HOST:$PREFECT_SERVER_API_PORT/api}"
export PREFECT_SERVER_ANALYTICS_ENABLED=false
export PREFECT_SERVER_UI_SHOW_PROMOTIONAL_CONTENT=false
export DO_NOT_TRACK=1
venv="${SPECREGEN_VENV:-$root/.venv}"
export PATH="$venv/bin:$PATH"
export SPECREGEN_ROOT="$root"
