#!/usr/bin/env bash
# Deploys a pipeline config to the Prefect server (infra/server.sh): the work pool, the Secret
# block the configs name when OPENROUTER_API_KEY is set (api_key_secret: openrouter-api-key), the
# automations that recover lost workers (infra/automations.py), then `specregen deploy`: one
# dataset/<NAME> deployment per dataset of the config, pipeline/nightly (03:00 UTC), probe/probe,
# batch-poll/batch-poll (active in batch mode) and reconstruct-chunks/spread
# (deployments/specs.py). Run it again after editing the config: new datasets are deployed,
# removed ones reported; extra arguments go to `specregen deploy` (--prune deletes those).
# The config: $SPECREGEN_CONFIG, default configs/pipeline.yaml.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$root"
export SPECREGEN_CONFIG="${SPECREGEN_CONFIG:-configs/pipeline.yaml}"
specregen_wait_for_server
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
exec specregen deploy --config "$SPECREGEN_CONFIG" "$@"
