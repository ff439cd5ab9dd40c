#!/usr/bin/env bash
# A process worker for the deployments: runs flow runs as subprocesses of this checkout. Start
# one per machine (or several); they share the pool. Extra arguments go to `prefect worker
# start` (e.g. --name gpu-box-1 --limit 4: at most 4 flow runs at once on this worker).
set -euo pipefail
source "$(dirname "$0")/env.sh"
exec prefect worker start --pool "${SPECREGEN_WORK_POOL:-specregen-process}" "$@"
