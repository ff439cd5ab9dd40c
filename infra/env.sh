# Sourced by the infra scripts: a project-local Prefect home on loopback, SQLite, no telemetry.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PREFECT_HOME="${PREFECT_HOME:-$root/.prefect}"
export PREFECT_SERVER_API_HOST="${PREFECT_SERVER_API_HOST:-127.0.0.1}"
export PREFECT_SERVER_API_PORT="${PREFECT_SERVER_API_PORT:-4200}"
export PREFECT_API_URL="${PREFECT_API_URL:-http://$PREFECT_SERVER_API_HOST:$PREFECT_SERVER_API_PORT/api}"
export PREFECT_SERVER_ANALYTICS_ENABLED=false
export PREFECT_SERVER_UI_SHOW_PROMOTIONAL_CONTENT=false
export DO_NOT_TRACK=1
# Flow runs started by the worker send a heartbeat; infra/deploy.sh adds the automation that
# marks a run Crashed when its heartbeats stop (a killed flow process), Prefect's zombie check.
export PREFECT_FLOWS_HEARTBEAT_FREQUENCY="${PREFECT_FLOWS_HEARTBEAT_FREQUENCY:-60}"
venv="${SPECREGEN_VENV:-$root/.venv}"
export PATH="$venv/bin:$PATH"
export SPECREGEN_ROOT="$root"
# Concurrency-limit leases (the shared request limits, tasks/limits.py) kept in files under
# PREFECT_HOME, so a restarted server still knows them and frees a lost worker's slots when
# they expire (the default keeps them in memory: a restart would leave those slots taken).
export PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE="${PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE:-prefect.server.concurrency.lease_storage.filesystem}"
mkdir -p "$PREFECT_HOME"  # logs of the servers started in the background go there too
# Waits until URL answers at all (any HTTP status; at most SECONDS, default 60): a server just
# started in the background takes a few seconds. `specregen_wait_for URL [SECONDS]`.
specregen_wait_for() {
    python - "$1" "${2:-60}" <<'PY'
import sys, time, urllib.error, urllib.request
url, deadline = sys.argv[1], time.monotonic() + float(sys.argv[2])
while True:
    try:
        urllib.request.urlopen(url, timeout=2)
        break
    except urllib.error.HTTPError:
        break  # it answered
    except OSError:
        if time.monotonic() > deadline:
            sys.exit(f"nothing answers at {url} after {sys.argv[2]} s")
        time.sleep(0.5)
PY
}
specregen_wait_for_server() {
    specregen_wait_for "$PREFECT_API_URL/health" "${1:-60}" \
        || { echo "start the Prefect server: bash infra/server.sh &" >&2; return 1; }
}
