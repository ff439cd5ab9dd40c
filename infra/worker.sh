#!/usr/bin/env bash
# A process worker for the deployments (runs flow runs as subprocesses of this checkout).
set -euo pipefail
source "$(dirname "$0")/env.sh"
exec prefect worker start --pool "${SPECREGEN_WORK_POOL:-specregen-process}"
