"""`specregen deploy` against a real Prefect server, with a real process worker (issue 21).

The deployments come from the config alone (no YAML edited): deploying again updates them, a
dataset added to the config is deployed, one removed is reported and deleted only with
`--prune`. Then, on the worker: a dataset run against an endpoint that is not up yet fails
naming it; once it is up, `specregen retry` re-runs that run in place and it publishes; and
with one dataset's deployment deleted, `pipeline/nightly` fails that dataset alone while the
others publish.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from specregen.emulator.config import EmulatorConfig
from specregen.emulator.server import serve_in_thread
from specregen.models.tokenizer import load_tokenizer
from tests.support import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DATASETS = ("B1_glaive", "B2_opencodeinstruct", "B3_magicoder")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(path: Path, storage: Path, url: str, names=DATASETS) -> Path:
    config = yaml.safe_load((REPO / "configs" / "pipeline.yaml").read_text())
    config["storage"] = str(storage)
    config["endpoint"]["base_url"] = url
    config["chunk_size"] = 6
    by_name = {d["name"]: d for d in config["datasets"]}
    extra = {"name": "B2_again", "adapter": "opencodeinstruct",
             "source": "bundled:B2_opencodeinstruct"}
    config["datasets"] = [{**(by_name.get(n) or extra), "limit": 6} for n in names]
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


async def _deployments() -> dict[str, object]:
    from prefect.client.orchestration import get_client

    async with get_client() as client:
        found = await client.read_deployments()
        flows = {f.id: f.name for f in await client.read_flows()}
    return {f"{flows[d.flow_id]}/{d.name}": d for d in found}


async def _final_state(flow_run_id, timeout: float, log: Path):
    from prefect.client.orchestration import get_client

    deadline = time.monotonic() + timeout
    async with get_client() as client:
        while True:
            state = (await client.read_flow_run(flow_run_id)).state
            if state is not None and state.is_final():
                return state
            assert time.monotonic() < deadline, (state, log.read_text()[-4000:])
            await asyncio.sleep(0.5)


def run_and_wait(deployment: str, log: Path, timeout: float = 300):
    from prefect.deployments import run_deployment

    run = run_deployment(deployment, timeout=0)
    return run.id, asyncio.run(_final_state(run.id, timeout, log))


def published(storage: Path, dataset: str) -> bool:
    return (storage / dataset / "published" / "LATEST.json").is_file()


def test_deploy_from_the_config_retry_in_place_and_a_missing_deployment(prefect_server,
                                                                         tmp_path):
    from prefect.settings import PREFECT_API_URL

    from deployments.deploy import deploy, retry_dataset

    port = free_port()  # the endpoint: nothing listens there until the emulator starts
    url = f"http://127.0.0.1:{port}/api/v1"
    storage = tmp_path / "store"
    config = write_config(tmp_path / "pipeline.yaml", storage, url)

    # The session's server may hold deployments of earlier tests: new or updated, each once.
    first = deploy(config, root=REPO, log=lambda line: None)
    specs = [f"dataset/{n}" for n in DATASETS] + [
        "pipeline/nightly", "probe/probe", "batch-poll/batch-poll", "reconstruct-chunks/spread"]
    assert sorted(first.created + first.updated) == sorted(specs)
    again = deploy(config, root=REPO, log=lambda line: None)
    assert again.created == [] and sorted(again.updated) == sorted(specs)
    deployed = asyncio.run(_deployments())
    nightly = deployed["pipeline/nightly"]
    assert [(s.schedule.cron, s.schedule.timezone, s.active) for s in nightly.schedules] == [
        ("0 3 * * *", "UTC", True)]  # one schedule, however often deployed
    assert [s.active for s in deployed["batch-poll/batch-poll"].schedules] == [False]
    assert deployed["dataset/B2_opencodeinstruct"].parameters == {
        "config_path": str(config), "dataset": "B2_opencodeinstruct"}

    # A dataset added: deployed by deploying again. One removed: reported, kept, then pruned.
    write_config(config, storage, url, (*DATASETS, "B2_again"))
    added = deploy(config, root=REPO, log=lambda line: None)
    assert added.created == ["dataset/B2_again"]
    write_config(config, storage, url)
    kept = deploy(config, root=REPO, log=lambda line: None)
    assert "dataset/B2_again" in kept.orphans and kept.pruned == []
    assert "dataset/B2_again" in asyncio.run(_deployments())
    from deployments.deploy import report_lines

    said = "\n".join(report_lines(kept, config))
    assert "dataset/B2_again: its dataset is no longer in the config" in said and "--prune" in said
    pruned = deploy(config, root=REPO, prune=True, log=lambda line: None)
    assert "dataset/B2_again" in pruned.pruned
    assert "dataset/B2_again" not in asyncio.run(_deployments())

    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(),
           "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_WORKER_PREFETCH_SECONDS": "1"}
    worker_log = tmp_path / "worker.log"
    with worker_log.open("w") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "prefect", "worker", "start", "--pool", first.pool],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # The endpoint is not up: the dataset run fails at once, naming it.
        _, state = run_and_wait("dataset/B2_opencodeinstruct", worker_log)
        assert state.is_failed(), state
        assert f"cannot reach the endpoint {url}" in state.message
        assert not published(storage, "B2_opencodeinstruct")

        with serve_in_thread(EmulatorConfig(seed=3), load_tokenizer("mini"), port=port):
            # Retried in place: the same flow run, now published.
            retried = retry_dataset("B2_opencodeinstruct", watch=True, log=lambda line: None)
            assert published(storage, "B2_opencodeinstruct")
            assert retried == str(_latest_run_id("dataset/B2_opencodeinstruct"))

            # One dataset's deployment gone: that dataset fails, the others publish.
            deleted = asyncio.run(_deployments())["dataset/B3_magicoder"]
            asyncio.run(_delete(deleted.id))
            _, state = run_and_wait("pipeline/nightly", worker_log)
        assert state.is_failed(), state
        assert "B3_magicoder (no deployment dataset/B3_magicoder" in state.message
        assert "the other 2 finished" in state.message
        assert published(storage, "B1_glaive") and published(storage, "B2_opencodeinstruct")
        assert not published(storage, "B3_magicoder")
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(10)


def _latest_run_id(deployment: str):
    async def main():
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

        async with get_client() as client:
            found = await client.read_deployment_by_name(deployment)
            runs = await client.read_flow_runs(deployment_filter=DeploymentFilter(
                id=DeploymentFilterId(any_=[found.id])))
        assert len(runs) == 1, runs  # retried in place: no second run
        return runs[0].id

    return asyncio.run(main())


async def _delete(deployment_id) -> None:
    from prefect.client.orchestration import get_client

    async with get_client() as client:
        await client.delete_deployment(deployment_id)
