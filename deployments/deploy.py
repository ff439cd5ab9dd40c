"""`specregen deploy` and `specregen retry`: the deployments of a pipeline config on a Prefect
server, and a failed dataset run re-run in place.

Deploying is idempotent: every deployment of `deployments/specs.py` is created or updated (its
schedule replaced), so a dataset added to the config is deployed by deploying again. A
`dataset/<NAME>` deployment whose dataset left the config is reported, and deleted only with
`prune` (its runs, and the data in storage, stay). Flow runs start in the checkout that
deployed (a `set_working_directory` pull step): every worker needs the same checkout at the
same path, and relative paths in the config are read from there.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from deployments.specs import (
    DATASET_FLOW,
    WORK_POOL,
    WORK_QUEUE,
    DeploymentSpec,
    config_parameter,
    deployment_specs,
)
from specregen.errors import PartialFailureError, UnavailableError, UsageError

ROOT = Path(__file__).resolve().parents[1]
# How long `deploy` waits for a server that was just started (infra/server.sh &).
SERVER_WAIT_S = 60.0
RETRYABLE_STATES = ("FAILED", "CRASHED", "CANCELLED")


def project_api_url() -> str:
    """The server this checkout talks to: PREFECT_API_URL (the environment or the active
    Prefect profile), else the one infra/server.sh starts (127.0.0.1:$PREFECT_SERVER_API_PORT,
    default 4200; infra/env.sh says the same). Never Prefect's throwaway temporary server:
    deployments made there vanish with it."""
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return str(PREFECT_API_URL.value())
    host = os.environ.get("PREFECT_SERVER_API_HOST", "127.0.0.1")
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"http://{host}:{os.environ.get('PREFECT_SERVER_API_PORT', '4200')}/api"


def wait_for_server(api_url: str, wait_s: float, log) -> None:
    """Return once the server answers; UnavailableError naming it after `wait_s`."""
    from flows.server import healthy

    deadline = time.monotonic() + wait_s
    said = False
    while not healthy(api_url):
        if time.monotonic() >= deadline:
            raise UnavailableError(
                f"no Prefect server answers at {api_url}",
                hint="start it with `bash infra/server.sh &` (or set PREFECT_API_URL to a"
                     " running server)")
        if not said:
            log(f"waiting up to {wait_s:g} s for the Prefect server at {api_url} ...")
            said = True
        time.sleep(0.5)


@dataclass
class DeployReport:
    api_url: str
    config_param: str
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    schedules: dict[str, str] = field(default_factory=dict)
    orphans: list[str] = field(default_factory=list)  # dataset deployments not in the config
    pruned: list[str] = field(default_factory=list)
    pool: str = WORK_POOL
    pool_created: bool = False


def deploy(config_path: Path, *, prune: bool = False, wait_s: float = SERVER_WAIT_S,
           pool: str | None = None, root: Path | None = None, log=print) -> DeployReport:
    """Create or update every deployment of the config on the project's Prefect server, on
    `pool` (default $SPECREGEN_WORK_POOL, else specregen-process: infra/worker.sh's). Flow
    runs start in `root`: default $SPECREGEN_ROOT (infra/env.sh sets it to its checkout),
    else the checkout of this code."""
    pool = pool or os.environ.get("SPECREGEN_WORK_POOL") or WORK_POOL
    root = root or Path(os.environ.get("SPECREGEN_ROOT") or ROOT)
    from flows.server import telemetry_off, using_api
    from specregen.config import ConfigError, load_config

    telemetry_off()
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    specs = deployment_specs(config, config_parameter(config_path, root))
    api_url = project_api_url()
    wait_for_server(api_url, wait_s, log)
    with using_api(api_url):
        return asyncio.run(_apply(specs, api_url, config_parameter(config_path, root),
                                  prune=prune, pool=pool, root=root))


async def _apply(specs: list[DeploymentSpec], api_url: str, config_param: str, *,
                 prune: bool, pool: str, root: Path) -> DeployReport:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.exceptions import ObjectNotFound

    report = DeployReport(api_url=api_url, config_param=config_param, pool=pool)
    async with get_client() as client:
        report.pool_created = await _ensure_pool(client, pool)
        existing = {f"{DATASET_FLOW}/{d.name}": d for d in await client.read_deployments(
            flow_filter=FlowFilter(name=FlowFilterName(any_=[DATASET_FLOW])))}
        for spec in specs:
            try:
                await client.read_deployment_by_name(spec.full_name)
                known = True
            except ObjectNotFound:
                known = False
            flow_id = await client.create_flow_from_name(spec.flow)
            await client.create_deployment(
                flow_id=flow_id, name=spec.name, entrypoint=spec.entrypoint,
                work_pool_name=pool, work_queue_name=WORK_QUEUE,
                parameters=spec.parameters, description=spec.description,
                tags=list(spec.tags), schedules=_schedules(spec),
                parameter_openapi_schema=_parameter_schema(spec),
                enforce_parameter_schema=True,
                pull_steps=[{"prefect.deployments.steps.set_working_directory": {
                    "directory": str(root.resolve())}}],
            )
            (report.updated if known else report.created).append(spec.full_name)
            if spec.schedule_text():
                report.schedules[spec.full_name] = spec.schedule_text()
        wanted = {s.full_name for s in specs}
        for name, deployment in sorted(existing.items()):
            if name in wanted:
                continue
            report.orphans.append(name)
            if prune:
                await client.delete_deployment(deployment.id)
                report.pruned.append(name)
    return report


async def _ensure_pool(client: Any, pool: str) -> bool:
    """The process work pool, created when missing (infra/deploy.sh also makes it)."""
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound
    from prefect.workers.process import ProcessWorker

    try:
        await client.read_work_pool(pool)
        return False
    except ObjectNotFound:
        await client.create_work_pool(WorkPoolCreate(
            name=pool, type="process",
            base_job_template=ProcessWorker.get_default_base_job_template()))
        return True


def _schedules(spec: DeploymentSpec) -> list[Any]:
    from prefect.client.schemas.actions import DeploymentScheduleCreate
    from prefect.client.schemas.schedules import CronSchedule, IntervalSchedule

    if spec.cron is not None:
        schedule: Any = CronSchedule(cron=spec.cron, timezone="UTC")
    elif spec.interval_s is not None:
        schedule = IntervalSchedule(interval=timedelta(seconds=spec.interval_s))
    else:
        return []
    return [DeploymentScheduleCreate(schedule=schedule, active=spec.schedule_active)]


def _parameter_schema(spec: DeploymentSpec) -> dict[str, Any]:
    """The flow's parameters as the UI's run form and the server's validation read them."""
    from prefect.utilities.callables import parameter_schema

    path, function = spec.entrypoint.split(":")
    module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    return parameter_schema(getattr(module, function)).model_dump_for_openapi()


def report_lines(report: DeployReport, config_path: Path) -> list[str]:
    """What `specregen deploy` prints: each deployment, and what to do about orphans."""
    lines = [f"deployed {report.config_param} to {report.api_url} (work pool {report.pool}"
             + (", created" if report.pool_created else "") + ")"]
    for name in [*report.created, *report.updated]:
        state = "new" if name in report.created else "updated"
        schedule = report.schedules.get(name)
        lines.append(f"  {name}: {state}" + (f", {schedule}" if schedule else ""))
    for name in report.orphans:
        if name in report.pruned:
            lines.append(f"  {name}: deleted (its dataset is no longer in the config; its "
                         "runs and data are kept)")
        else:
            lines.append(f"  {name}: its dataset is no longer in the config; its deployment "
                         f"is kept -- delete it with `specregen deploy --config {config_path} "
                         "--prune`")
    return lines


# -- retry ---------------------------------------------------------------------------------------


class RetryError(UsageError):
    """Nothing to retry: no such deployment, or no failed run of it."""


class RetriedRunFailedError(PartialFailureError):
    """The retried run ended failed again; the message is its state's."""


def retry_dataset(dataset: str, *, watch: bool = False, wait_s: float = 10.0,
                  log=print) -> str:
    """Schedule the newest failed (or crashed, cancelled) run of `dataset/<dataset>` again, in
    place (the UI's Retry button; `prefect flow-run retry ID`): the same flow run, which skips
    every finished chunk. With `watch`, wait for its end. Returns the run's id."""
    from flows.server import telemetry_off, using_api

    telemetry_off()
    api_url = project_api_url()
    wait_for_server(api_url, wait_s, log)
    with using_api(api_url):
        return asyncio.run(_retry(dataset, watch, log))


async def _retry(dataset: str, watch: bool, log) -> str:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.client.schemas.sorting import FlowRunSort
    from prefect.exceptions import ObjectNotFound
    from prefect.states import Scheduled

    name = f"{DATASET_FLOW}/{dataset}"
    async with get_client() as client:
        try:
            deployment = await client.read_deployment_by_name(name)
        except ObjectNotFound:
            raise RetryError(f"no deployment {name} on the Prefect server",
                             hint="deploy the config first: `bash infra/deploy.sh`") from None
        runs = await client.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id])),
            flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(
                any_=[StateType[s] for s in RETRYABLE_STATES]))),
            sort=FlowRunSort.EXPECTED_START_TIME_DESC, limit=1)
        if not runs:
            raise RetryError(f"{name} has no failed, crashed or cancelled run to retry",
                             hint=f"start a new run: prefect deployment run '{name}'")
        run = runs[0]
        await client.set_flow_run_state(run.id, Scheduled(message="Retried by specregen retry"),
                                        force=True)
        log(f"{name}: flow run {run.name} ({run.id}) scheduled again; a worker runs it in "
            "place, skipping every finished chunk")
        if not watch:
            return str(run.id)
        while True:
            await asyncio.sleep(1.0)
            state = (await client.read_flow_run(run.id)).state
            if state is not None and state.is_final():
                break
        if not state.is_completed():
            raise RetriedRunFailedError(
                f"{name}: the retried run ended {state.name}: "
                + " ".join((state.message or "").split()))
        log(f"{name}: flow run {run.name} ({run.id}) completed")
        return str(run.id)
