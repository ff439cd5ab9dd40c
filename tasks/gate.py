from __future__ import annotations

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from specregen.pipeline.gating import gate_dataset, read_report
from specregen.pipeline.publish import GateFailedError
from specregen.pipeline.reconstruction import STAGE as RECONSTRUCT
from specregen.store.manifest import read_manifest
from tasks.common import dataset_run


def artifact_key(dataset: str, what: str) -> str:
    # Artifact keys allow lowercase letters, digits and dashes only.
    return f"{dataset.lower().replace('_', '-')}-{what}"


@task(name="tool-call-gate", retries=0)
def gate_task(config_path: str, dataset: str) -> dict:
    """The mandatory gate; its report becomes artifacts; a failing dataset fails here."""
    run = dataset_run(config_path, dataset)
    reconstructed = read_manifest(run.store, run.name, RECONSTRUCT, run.reconstruct_fp)
    if reconstructed is None:
        raise RuntimeError(f"{dataset}: reconstruction has no manifest; it did not finish")
    gated = gate_dataset(run, reconstructed)
    report, markdown = read_report(run)
    create_markdown_artifact(markdown, key=artifact_key(dataset, "gate-report"),
                             description=f"Tool-call gate report of {dataset}")
    create_table_artifact(
        [{"check": check, "quarantined samples": n} for check, n in report["by_check"].items()],
        key=artifact_key(dataset, "gate-checks"),
        description=f"Quarantined samples by gate check, {dataset}: {report['verdict']}",
    )
    if not gated.extra.get("passed"):
        raise GateFailedError(f"{dataset}: gate failed: " + "; ".join(gated.extra["why"]))
    return {"verdict": "pass", **gated.counts}
