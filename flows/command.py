"""`specregen run` on the Prefect side: a server that dies with us, tagged runs, quiet console.

- Without `PREFECT_API_URL`, a temporary local server (telemetry off) that stops when this
  process ends, SIGKILL included (`flows.server`).
- Every flow and task run started here carries the tags `specregen` and
  `specregen-pid:HOST:PID:START`; on the next start, runs still RUNNING/PENDING whose process is
  gone are marked Crashed (a SIGKILL leaves them RUNNING for ever otherwise).
- The console shows one line per log record: tracebacks go to the Prefect UI / API logs, and to
  the console only with `--debug`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from pathlib import Path
from typing import Any

from specregen.errors import SpecregenError, UsageError, debug_enabled

OWNER_TAG = "specregen"
PID_TAG = "specregen-pid:"


def process_start(pid: int) -> str:
    """The process's start time in clock ticks since boot (Linux), so a reused pid is told
    apart; '' where /proc is not available."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


def owner_tag() -> str:
    pid = os.getpid()
    return f"{PID_TAG}{socket.gethostname()}:{pid}:{process_start(pid)}"


def owner_alive(tag: str) -> bool:
    """Whether the process named by an owner tag still runs; another host's counts as alive."""
    try:
        host, pid_text, start = tag.removeprefix(PID_TAG).rsplit(":", 2)
        pid = int(pid_text)
    except ValueError:
        return True
    if host != socket.gethostname():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not start or process_start(pid) == start


async def mark_orphans_crashed() -> tuple[int, int]:
    """Mark Crashed the flow and task runs left RUNNING/PENDING by a specregen process that is
    gone; returns (flow runs, task runs) marked."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
        FlowRunFilterTags,
        TaskRunFilter,
        TaskRunFilterState,
        TaskRunFilterStateType,
        TaskRunFilterTags,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    live = [StateType.RUNNING, StateType.PENDING]
    flows = tasks = 0
    async with get_client() as client:
        flow_runs = await client.read_flow_runs(flow_run_filter=FlowRunFilter(
            state=FlowRunFilterState(type=FlowRunFilterStateType(any_=live)),
            tags=FlowRunFilterTags(all_=[OWNER_TAG]),
        ))
        task_runs = await client.read_task_runs(task_run_filter=TaskRunFilter(
            state=TaskRunFilterState(type=TaskRunFilterStateType(any_=live)),
            tags=TaskRunFilterTags(all_=[OWNER_TAG]),
        ))
        state = "its process was killed; marked crashed at the next start"
        for flow_run in flow_runs:
            if _orphaned(flow_run.tags):
                await client.set_flow_run_state(flow_run.id, Crashed(message=state), force=True)
                flows += 1
        for task_run in task_runs:
            if _orphaned(task_run.tags):
                await client.set_task_run_state(task_run.id, Crashed(message=state), force=True)
                tasks += 1
    return flows, tasks


def _orphaned(run_tags: list[str]) -> bool:
    owner = next((t for t in run_tags if t.startswith(PID_TAG)), None)
    return owner is not None and not owner_alive(owner)


class _OneLine(logging.Formatter):
    """Wraps a console formatter: the record without its traceback (other handlers, such as
    the API log handler, still get it)."""

    def __init__(self, inner: logging.Formatter | None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        saved = record.exc_info, record.exc_text, record.stack_info
        record.exc_info = record.exc_text = record.stack_info = None
        try:
            return self.inner.format(record)
        finally:
            record.exc_info, record.exc_text, record.stack_info = saved


def console_without_tracebacks() -> None:
    """Prefect's console handlers print one line per record (unless debugging)."""
    if debug_enabled():
        return
    from prefect.logging.handlers import PrefectConsoleHandler

    loggers = [logging.getLogger()] + [
        lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)
    ]
    for lg in loggers:
        for handler in lg.handlers:
            if isinstance(handler, PrefectConsoleHandler) and not isinstance(
                handler.formatter, _OneLine
            ):
                handler.setFormatter(_OneLine(handler.formatter))


def drain_prefect_workers() -> None:
    """Send the logs and events still queued before the server they go to stops."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=10)
    EventsWorker.drain_all(timeout=10)


def run_pipeline(
    config_path: Path, datasets: list[str] | None = None, *, wait: float = 0.0, log=print
) -> list[dict[str, Any]]:
    """Run the config's datasets under Prefect; raises DatasetsFailedError naming each cause."""
    from flows.server import free_port, local_server, telemetry_off, using_api
    from specregen.config import ConfigError, load_config

    telemetry_off()
    try:
        config = load_config(config_path)  # a wrong field fails here, before anything starts
        for name in datasets or []:
            config.dataset(name)
    except ConfigError as exc:
        if isinstance(exc, SpecregenError):
            raise
        raise UsageError(str(exc)) from None
    if os.environ.get("PREFECT_API_URL"):
        return run_flows(config_path, datasets, wait=wait, log=log)
    with local_server(port=free_port(), ui=False, log=log) as api_url, using_api(api_url):
        return run_flows(config_path, datasets, wait=wait, log=log)


def run_flows(
    config_path: Path, datasets: list[str] | None, *, wait: float = 0.0, log=print
) -> list[dict[str, Any]]:
    """The pipeline flow against the server at PREFECT_API_URL, after the orphan sweep."""
    from prefect import tags

    from flows.pipeline import pipeline_flow

    console_without_tracebacks()
    try:
        flows, tasks = asyncio.run(mark_orphans_crashed())
    except Exception as exc:  # the sweep is housekeeping: never a reason not to run
        log(f"could not look for runs left by killed processes: {exc}")
    else:
        if flows or tasks:
            log(f"marked {flows} flow runs and {tasks} task runs of killed processes crashed")
    try:
        with tags(OWNER_TAG, owner_tag()):
            return asyncio.run(pipeline_flow(str(Path(config_path).resolve()),
                                             datasets=datasets or None, lease_wait=wait))
    finally:
        drain_prefect_workers()
