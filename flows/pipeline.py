"""The parent flow: every dataset of a config in parallel; one failing does not stop the others."""

from __future__ import annotations

import asyncio

from prefect import flow, get_run_logger
from prefect.deployments import run_deployment
from prefect.exceptions import ObjectNotFound
from prefect.runtime import flow_run

from flows.dataset import dataset_flow
from specregen.config import load_config
from specregen.errors import EXIT_PARTIAL, PartialFailureError, SpecregenError, UsageError
from specregen.pipeline.publish import GateFailedError
from tasks.artifacts import atable_artifact

DATASET_DEPLOYMENT = "dataset/{dataset}"
_STATE_PREFIX = "Flow run encountered an exception: "
# How long a parent waits for a crashed child to be scheduled again (the automation reacts
# within seconds).
RERUN_GRACE_S = 60.0


class MissingDeploymentError(UsageError):
    """A dataset of the config has no `dataset/<NAME>` deployment on the server."""


class DatasetsFailedError(PartialFailureError):
    """Some datasets failed; the others finished. The message names each one's cause; the exit
    code is the failures' own when they share one (storage, key, busy output...), else 6."""

    def __init__(self, failures: list[dict], results: list[dict]) -> None:
        causes = "; ".join(f"{f['dataset']} ({f['error']})" for f in failures)
        done = len(results) - len(failures)
        tail = f"; the other {done} finished" if done else ""
        super().__init__(f"datasets failed: {causes}{tail}")
        self.failures = failures
        self.results = results
        codes = {f.get("exit_code", EXIT_PARTIAL) for f in failures}
        self.exit_code = codes.pop() if len(codes) == 1 else EXIT_PARTIAL

    def __reduce__(self):  # Prefect pickles a failed flow's exception
        return type(self), (self.failures, self.results)


def failure_of(error: BaseException | None, message: str | None) -> tuple[str, int]:
    """One line naming why a dataset failed, and the exit code of that cause."""
    if isinstance(error, SpecregenError):
        return error.one_line(), error.exit_code
    if isinstance(error, GateFailedError):
        return " ".join(str(error).split()), EXIT_PARTIAL
    if isinstance(error, BaseException):
        text = " ".join(str(error).split())
        return f"{type(error).__name__}: {text}" if text else type(error).__name__, EXIT_PARTIAL
    text = " ".join((message or "no state").split()).removeprefix(_STATE_PREFIX)
    return text, EXIT_PARTIAL


async def await_rerun(flow_run_id, state, grace_s: float = RERUN_GRACE_S, poll_s: float = 2.0):
    """The final state of a child run that crashed, after the rerun automation set it back to
    Scheduled and a worker ran it again; its Crashed state when nobody reran it in `grace_s`."""
    from prefect.client.orchestration import get_client

    waited = 0.0
    async with get_client() as client:
        while True:
            await asyncio.sleep(poll_s)
            current = (await client.read_flow_run(flow_run_id)).state
            if current is None:
                return state
            if current.is_crashed():
                waited += poll_s
                if waited >= grace_s:
                    return current
            elif current.is_final():
                return current
            else:
                waited = 0.0  # running again; a new crash gets its own grace


@flow(name="pipeline", log_prints=False)
async def pipeline_flow(
    config_path: str, datasets: list[str] | None = None, use_deployments: bool = False,
    lease_wait: float = 0.0,
) -> list[dict]:
    """Run the datasets; with `use_deployments`, each as its own deployment run (retryable
    alone from the UI), else as subflows in this process."""
    logger = get_run_logger()
    config = load_config(config_path)
    names = datasets or [d.name for d in config.datasets]
    for name in names:
        config.dataset(name)  # an unknown name fails before anything starts

    async def one(name: str) -> dict:
        if use_deployments:
            deployment = DATASET_DEPLOYMENT.format(dataset=name)
            try:
                run = await run_deployment(
                    deployment,
                    parameters={"config_path": config_path, "dataset": name,
                                "lease_wait": lease_wait},
                    timeout=None,
                    as_subflow=True,
                    idempotency_key=f"{flow_run.get_id()}:{name}",
                )
            except ObjectNotFound:
                # That dataset's failure alone: the others run (a config edited after the
                # last deploy, a deployment deleted by hand).
                missing = MissingDeploymentError(
                    f"no deployment {deployment} on the Prefect server",
                    hint=f"deploy the config again: `specregen deploy --config {config_path}`"
                         " (infra/deploy.sh)")
                logger.error("%s failed: %s", name, missing.one_line())
                return {"dataset": name, "outcome": "failed", "error": missing.one_line(),
                        "exit_code": missing.exit_code}
            state = run.state
            if state is not None and state.is_crashed():  # lost worker: see infra/automations.py
                state = await await_rerun(run.id, state)
        else:
            state = await dataset_flow(config_path, name, lease_wait=lease_wait,
                                       return_state=True)
        if state is not None and state.is_completed():
            if use_deployments:  # its result lives with its own run; the UI shows it
                return {"dataset": name, "outcome": "completed", "flow_run": run.name}
            return await state.aresult()
        error = None
        if state is not None:
            try:
                error = await state.aresult(raise_on_failure=False)
            except Exception:  # a deployment run's result may live elsewhere: use its message
                error = None
        cause, code = failure_of(error if isinstance(error, BaseException) else None,
                                 state.message if state is not None else None)
        cause = cause.removeprefix(f"{name}: ")  # the line names the dataset already
        logger.error("%s failed: %s", name, cause)
        return {"dataset": name, "outcome": "failed", "error": cause, "exit_code": code}

    results = await asyncio.gather(*(one(name) for name in names))
    await atable_artifact(
        [{"dataset": r.get("dataset"), "outcome": r.get("outcome"),
          "accepted": r.get("gate", {}).get("accepted"),
          "quarantined": r.get("gate", {}).get("quarantined"),
          "cost_usd": r.get("cost_usd"), "error": r.get("error", "")} for r in results],
        key="pipeline-summary", description="Datasets of this pipeline run",
    )
    failed = [r for r in results if r.get("outcome") == "failed"]
    if failed:
        raise DatasetsFailedError(failed, list(results))
    return results
