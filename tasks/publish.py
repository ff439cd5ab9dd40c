from __future__ import annotations

from prefect import task

from specregen.pipeline.gating import STAGE as GATE
from specregen.pipeline.publish import publish_dataset, publish_fp
from specregen.store.manifest import read_manifest
from tasks.common import dataset_run


@task(name="publish", retries=1)
def publish_task(config_path: str, dataset: str) -> dict:
    run = dataset_run(config_path, dataset)
    gated = read_manifest(run.store, run.name, GATE, run.gate_fp)
    if gated is None:
        raise RuntimeError(f"{dataset}: the gate has not run; nothing is published without it")
    manifest = publish_dataset(run, gated)
    return {"path": run.store.url_of(run.name, "published", publish_fp(run)), **manifest.counts}
