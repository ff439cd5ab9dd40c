#!/usr/bin/env bash
# Creates the work pool and, when OPENROUTER_API_KEY is set, the Secret block the configs name
# (api_key_secret: openrouter-api-key); the automations that recover lost workers
# (infra/automations.py); then deploys every flow of deployments/prefect.yaml.
# Needs a running server (infra/server.sh) and a pipeline config at $SPECREGEN_CONFIG
# (default configs/pipeline.yaml).
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$root"
export SPECREGEN_ROOT="$root"
export SPECREGEN_CONFIG="${SPECREGEN_CONFIG:-configs/pipeline.yaml}"
prefect work-pool create "${SPECREGEN_WORK_POOL:-specregen-process}" --type process \
    --overwrite >/dev/null
if [ -n "${OPENROUTER_API_KEY:-}" ]; then
    python - <<'PY'
import os
from prefect.blocks.system import Secret
Secret(value=os.environ["OPENROUTER_API_KEY"]).save("openrouter-api-key", overwrite=True)
print("saved the Secret block openrouter-api-key")
PY
fi
python "$root/infra/automations.py"
# The batch-poll deployment's schedule is active only for a batch-mode config (docs/batch.md).
if [ -z "${SPECREGEN_BATCH_POLL:-}" ]; then
    SPECREGEN_BATCH_POLL=$(python -c 'import sys
from specregen.config import load_config
try:
    print(str(load_config(sys.argv[1]).endpoint.mode == "batch").lower())
except Exception as exc:
    print(f"warning: batch-poll schedule left off: {exc}", file=sys.stderr)
    print("false")' "$SPECREGEN_CONFIG")
fi
export SPECREGEN_BATCH_POLL
prefect --no-prompt deploy --prefect-file deployments/prefect.yaml --all
