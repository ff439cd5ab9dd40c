"""The deployments a pipeline config needs, as data (no Prefect import).

One `dataset/<NAME>` per dataset of the config (the parent finds them by that name and each can
be re-run and retried alone), the scheduled parent `pipeline/nightly`, `probe/probe`,
`batch-poll/batch-poll` (its schedule active exactly when the config is in batch mode) and
`reconstruct-chunks/spread` (the chunk groups of `reconstruct_spread`). `specregen deploy`
(deployments/deploy.py) applies them; this list is the only place they are written down.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specregen.config import PipelineConfig

WORK_POOL = "specregen-process"
WORK_QUEUE = "default"
DATASET_FLOW = "dataset"  # flows/dataset.py; flows/pipeline.py runs `dataset/<NAME>`
NIGHTLY_CRON = "0 3 * * *"
BATCH_POLL_SECONDS = 300


@dataclass(frozen=True)
class DeploymentSpec:
    flow: str  # the flow's name (a deployment is named flow/name)
    name: str
    entrypoint: str  # path/to/file.py:function, from the checkout
    description: str
    parameters: dict[str, Any] = field(default_factory=dict)
    tags: tuple[str, ...] = ()
    cron: str | None = None  # in UTC
    interval_s: float | None = None
    schedule_active: bool = True

    @property
    def full_name(self) -> str:
        return f"{self.flow}/{self.name}"

    def schedule_text(self) -> str:
        if self.cron is not None:
            return f"cron {self.cron} UTC"
        if self.interval_s is not None:
            state = "" if self.schedule_active else ", paused: the config is not in batch mode"
            return f"every {self.interval_s:g} s{state}"
        return ""


def config_parameter(config_path: str | Path, root: Path) -> str:
    """The config's path as the deployments name it: relative to the checkout when inside it
    (valid on every worker, each in its own checkout), else absolute."""
    path = Path(config_path).resolve()
    try:
        return path.relative_to(root.resolve()).as_posix()
    except ValueError:
        return str(path)


def deployment_specs(config: PipelineConfig, config_param: str) -> list[DeploymentSpec]:
    """Every deployment of `config`; `config_param` is the path the flow runs read it from."""
    specs = [
        DeploymentSpec(
            flow=DATASET_FLOW, name=d.name, entrypoint="flows/dataset.py:dataset_flow",
            description=f"{d.name}: {d.adapter} rows from {d.source} through the pipeline "
                        "(the tool-call gate is mandatory)",
            parameters={"config_path": config_param, "dataset": d.name},
            tags=("dataset",))
        for d in config.datasets
    ]
    specs += [
        DeploymentSpec(
            flow="pipeline", name="nightly", entrypoint="flows/pipeline.py:pipeline_flow",
            description="every dataset of the config, each as its own dataset/<NAME> run",
            parameters={"config_path": config_param, "use_deployments": True},
            cron=NIGHTLY_CRON),
        DeploymentSpec(
            flow="probe", name="probe", entrypoint="flows/probe.py:probe_flow",
            description="how the configured endpoint returns tool calls, before a paid run",
            parameters={"config_path": config_param}),
        DeploymentSpec(
            flow="batch-poll", name="batch-poll", entrypoint="flows/batch.py:batch_poll_flow",
            description="batch mode: collects finished batches of suspended dataset runs and "
                        "resumes them (docs/batch.md)",
            parameters={"config_path": config_param}, tags=("batch",),
            interval_s=BATCH_POLL_SECONDS,
            schedule_active=config.endpoint.mode == "batch"),
        DeploymentSpec(
            flow="reconstruct-chunks", name="spread",
            entrypoint="flows/chunks.py:reconstruct_chunks_flow",
            description="a group of one dataset's reconstruction chunks on another worker "
                        "(reconstruct_spread > 1)"),
    ]
    return specs
