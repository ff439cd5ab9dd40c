"""Batch mode under a real Prefect worker (issue 11): the dataset run submits its batches and
suspends, which frees the worker; the scheduled `batch-poll` deployment resumes it once the
batches are done, and the same worker runs it to publication.

Everything is deployed by `specregen deploy` from the config (the dataset deployment and the
poller), onto a process worker with ONE slot: that the poller's runs get that slot while the
dataset run waits is what shows the wait holds no worker.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
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

POOL = "specregen-process"
DATASET = "B3_magicoder"


async def _state(flow_run_id):
    from prefect.client.orchestration import get_client

    async with get_client() as client:
        return (await client.read_flow_run(flow_run_id)).state


def _wait_state(flow_run_id, names: set[str], timeout: float, worker_log: Path):
    deadline = time.monotonic() + timeout
    while True:
        state = asyncio.run(_state(flow_run_id))
        if state is not None and state.name in names:
            return state
        assert state is None or state.name not in ("Failed", "Crashed"), (
            state.message, worker_log.read_text()[-4000:])
        assert time.monotonic() < deadline, (
            f"state {state.name if state else None}, wanted {names}",
            worker_log.read_text()[-4000:])
        time.sleep(0.5)


def _run(deployment: str):
    from prefect.deployments import run_deployment

    return run_deployment(deployment, timeout=0).id


def test_batch_run_suspends_frees_the_worker_and_the_poller_resumes_it(prefect_server,
                                                                       tmp_path):
    from prefect.settings import PREFECT_API_URL

    from deployments.deploy import deploy

    config = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())
    # Batch mode: the demo's whole-conversation dataset needs realtime (config check).
    config["datasets"] = [d for d in config["datasets"] if d.get("turns") != "all"]
    # Batches never finish until the test says so (the emulator reads batch_delay at each poll).
    base = EmulatorConfig(seed=4, literal_marker_rate=0.0, batch_delay=3600)
    with serve_in_thread(base, load_tokenizer("mini")) as emulator:
        config["storage"] = str(tmp_path / "store")
        config["chunk_size"] = 10
        config["probe"] = "off"  # every request of the dataset is then a batch request
        config["endpoint"].update(
            base_url=emulator.openrouter_url, mode="batch",
            batch={"api": "openrouter", "poll_seconds": 0.3},
            provider={"only": ["moonshotai"], "allow_fallbacks": False})
        path = tmp_path / "pipeline.yaml"
        path.write_text(yaml.safe_dump(config))
        env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(),
               "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_WORKER_PREFETCH_SECONDS": "1"}
        prefect = [sys.executable, "-m", "prefect"]
        # `specregen deploy` (infra/deploy.sh): the poller's schedule is on in batch mode.
        deployed = deploy(path, root=REPO, pool=POOL, log=lambda line: None)
        assert f"dataset/{DATASET}" in deployed.created + deployed.updated
        worker_log = tmp_path / "worker.log"
        with worker_log.open("w") as log:
            worker = subprocess.Popen(
                [*prefect, "worker", "start", "--pool", POOL, "--type", "process", "--limit",
                 "1"], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        try:
            dataset_run_id = _run(f"dataset/{DATASET}")
            _wait_state(dataset_run_id, {"Suspended"}, 300, worker_log)
            chunks = emulator.state.batches.created
            assert chunks >= 2  # 10 per chunk
            assert emulator.stats()["chat_requests"] == 0
            assert not emulator.state.batches.results_reads  # nothing finished yet

            # The worker's only slot is free: the poller runs on it while the dataset waits,
            # and leaves the run suspended (its batches still run).
            poll = _run("batch-poll/batch-poll")
            _wait_state(poll, {"Completed"}, 300, worker_log)
            assert asyncio.run(_state(dataset_run_id)).name == "Suspended"

            emulator.state.config = dataclasses.replace(base, batch_delay=0.0)
            poll = _run("batch-poll/batch-poll")
            _wait_state(poll, {"Completed"}, 300, worker_log)
            # Resumed, picked up by the same worker again, and run to the end.
            final = _wait_state(dataset_run_id, {"Completed"}, 300, worker_log)
            assert final.name == "Completed"
            assert emulator.state.batches.created == chunks  # nothing submitted twice
            assert emulator.state.batches.snapshot()["max_submissions_per_request"] == 1
            assert emulator.stats()["chat_requests"] == 0
            latest = Path(config["storage"]) / DATASET / "published" / "LATEST.json"
            assert latest.exists()
        finally:
            os.killpg(worker.pid, signal.SIGTERM)
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait(10)
