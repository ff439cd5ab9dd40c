from __future__ import annotations

from prefect import get_run_logger, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact

from specregen.pipeline.gating import STAGE as GATE
from specregen.pipeline.gating import read_report
from specregen.pipeline.steps import gate_step, reconstructed_manifest
from specregen.progress import LogLines, Progress, ProgressState, format_line, publish
from specregen.store.manifest import read_manifest
from tasks.artifacts import link_artifact, markdown_artifact, table_artifact
from tasks.common import dataset_run


def artifact_key(dataset: str, what: str) -> str:
    # Artifact keys allow lowercase letters, digits and dashes only.
    return f"{dataset.lower().replace('_', '-')}-{what}"


@task(name="tool-call-gate", retries=0)
def gate_task(config_path: str, dataset: str) -> dict:
    """The mandatory gate; its report becomes artifacts. Returns the verdict (`passed`,
    `why`) and counts: a failing dataset is the chain's outcome, and the flow fails after its
    run summary (pipeline/chain.py), not here."""
    run = dataset_run(config_path, dataset)
    reconstructed = reconstructed_manifest(run)
    progress = Progress(f"gate {dataset}", total=sum(s.rows for s in reconstructed.shards),
                        interval=2.0, names=("accepted", "quarantined"))
    if read_manifest(run.store, run.name, GATE, run.gate_fp) is None:  # else nothing to watch
        progress.subscribe(publish)  # `specregen run` shows it live
        progress.subscribe(LogLines(get_run_logger().info, every=30.0))
        progress.subscribe(ProgressArtifact(artifact_key(dataset, "gate-progress"),
                                            f"Tool-call gate of {dataset}"))
    gated = gate_step(run, progress)
    progress.close()
    report, markdown = read_report(run)
    markdown_artifact(markdown, key=artifact_key(dataset, "gate-report"),
                      description=f"Tool-call gate report of {dataset}")
    table_artifact(
        [{"check": check, "quarantined samples": n} for check, n in report["by_check"].items()],
        key=artifact_key(dataset, "gate-checks"),
        description=f"Quarantined samples by gate check, {dataset}: {report['verdict']}",
    )
    _report_artifacts(run, dataset, report)
    return gated


def _report_artifacts(run, dataset: str, report: dict) -> None:
    """The report's headline numbers as a table, and a link to report.html."""
    from pathlib import Path

    from specregen.report import headline_rows
    from specregen.report.stage import inference_spend

    table_artifact(
        headline_rows(report, inference_spend(run)),
        key=artifact_key(dataset, "report-headline"),
        description=f"Headline numbers of {dataset}: {report['verdict']}",
    )
    parts = (run.name, "gate", run.gate_fp, "report.html")
    if run.store.exists(*parts):
        url = run.store.url_of(*parts)
        if url.startswith("/"):
            url = Path(url).as_uri()
        link_artifact(url, link_text=f"{dataset} report.html",
                      key=artifact_key(dataset, "report-html"),
                      description=f"Dataset report of {dataset}: lengths, flags, evidence, "
                                  "tool calls, trigger agreement, cost")


class ProgressArtifact:
    """A Prefect progress artifact that carries the numbers of the live view (its description
    is the same summary line)."""

    def __init__(self, key: str, title: str) -> None:
        self.key, self.title = key, title
        self.artifact_id = None

    def __call__(self, state: ProgressState) -> None:
        percent = 100.0 * (state.fraction if state.fraction is not None else 0.0)
        text = f"{self.title}: {format_line(state)}"
        if self.artifact_id is None:
            self.artifact_id = create_progress_artifact(percent, key=self.key, description=text)
        else:
            update_progress_artifact(self.artifact_id, percent, description=text)
