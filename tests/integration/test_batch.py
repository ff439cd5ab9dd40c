"""Batch mode end to end through `specregen infer --mode batch` (issue 11's done-when).

* 20,000 prompts complete, each sample final exactly once, in batches of at most 5,000.
* SIGKILL while a batch is being submitted (the provider created it, the client never heard
  back) and SIGKILL while polling; then rerun: no batch is submitted twice, and results of a
  finished batch are never requested again.

The emulator runs in this process (so it survives the kills and counts what it was asked); the
client is a real `specregen` subprocess.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from specregen.client.batch import Ledger
from specregen.emulator.config import EmulatorConfig
from specregen.emulator.server import serve_in_thread
from specregen.models.tokenizer import load_tokenizer
from specregen.store.rawlog import RawLog

pytestmark = pytest.mark.integration

BASE = EmulatorConfig(reasoning_tokens_mean=12, content_tokens_mean=8, tool_call_rate=0.0)


@pytest.fixture(scope="module")
def emu():
    with serve_in_thread(BASE, load_tokenizer("mini")) as running:
        yield running


def reset(emu, **knobs):
    emu.state.config = dataclasses.replace(BASE, **knobs)
    emu.state.batches.reset()
    emu.state.batches.batches.clear()


def write_inputs(tmp: Path, emu, n: int, max_requests: int, api: str = "openrouter") -> tuple:
    prompts = tmp / "prompts.jsonl"
    with prompts.open("w") as handle:
        for i in range(n):
            handle.write(json.dumps({"sample_id": f"s{i}", "messages": [
                {"role": "user", "content": f"question number {i}"}]}) + "\n")
    cfg = {
        "base_url": emu.openrouter_url if api == "openrouter" else emu.url,
        "model": "moonshotai/kimi-k2.5",
        "dialect": "openrouter" if api == "openrouter" else "moonshot",
        "mode": "batch",
        "batch": {"api": api, "max_requests": max_requests, "poll_seconds": 0.1},
        "prices": {"prompt_per_million": 0.6, "completion_per_million": 2.5},
    }
    if api == "openrouter":
        cfg["provider"] = {"only": ["moonshotai"]}
    config = tmp / "endpoint.yaml"
    config.write_text(yaml.safe_dump(cfg))
    return prompts, config


def infer(prompts: Path, config: Path, out: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "OPENROUTER_API_KEY"}
    return subprocess.Popen(
        [sys.executable, "-m", "specregen.cli", "infer", str(prompts), "--config", str(config),
         "--out", str(out)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def finished(proc: subprocess.Popen, timeout: float = 300) -> str:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, (out + err)[-3000:]
    return out


def final_counts(out: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for record in RawLog(str(out)).iter_records():
        if record["final"]:
            counts[record["sample_id"]] = counts.get(record["sample_id"], 0) + 1
    return counts


def wait_for(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


@pytest.mark.slow
def test_20000_prompts_in_batches_of_at_most_5000(emu, tmp_path):
    reset(emu)
    prompts, config = write_inputs(tmp_path, emu, 20_000, 5_000)
    out = tmp_path / "raw"
    text = finished(infer(prompts, config, out))
    counts = final_counts(out)
    assert len(counts) == 20_000 and set(counts.values()) == {1}
    stats = emu.state.batches.snapshot()
    assert stats["batches_created"] == 4
    assert max(b["requests"] for b in stats["batches"].values()) <= 5_000
    assert stats["max_submissions_per_request"] == 1
    assert "savings vs realtime" in text


@pytest.mark.parametrize("api", ["openrouter", "openai-files"])
def test_sigkill_during_submit_then_rerun_submits_no_batch_twice(emu, tmp_path, api):
    # The second batch's POST is held for 30 s after the emulator created it: the kill lands
    # between "the provider has it" and "the client recorded it".
    reset(emu, batch_submit_delay=30.0)
    prompts, config = write_inputs(tmp_path, emu, 600, 200, api)
    out = tmp_path / "raw"
    first = infer(prompts, config, out)
    try:
        wait_for(lambda: emu.state.batches.created >= 1)
        assert first.poll() is None
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
    assert emu.state.batches.created == 1
    ledger = Ledger(RawLog(str(out))).load()
    assert len(ledger) == 1 and next(iter(ledger.values())).batch_id is None  # never recorded

    emu.state.config = dataclasses.replace(emu.state.config, batch_submit_delay=0.0)
    text = finished(infer(prompts, config, out))
    stats = emu.state.batches.snapshot()
    assert stats["batches_created"] == 3  # the lost one was found by its marker, not resent
    assert stats["max_submissions_per_request"] == 1
    counts = final_counts(out)
    assert len(counts) == 600 and set(counts.values()) == {1}
    assert "1" in text.split("batches submitted / recovered")[1].split("\n")[0]


def test_sigkill_during_polling_then_rerun_reads_each_batch_once(emu, tmp_path):
    reset(emu, batch_delay=2.0)
    prompts, config = write_inputs(tmp_path, emu, 600, 200)
    out = tmp_path / "raw"
    first = infer(prompts, config, out)
    try:
        def all_recorded() -> bool:
            batches = Ledger(RawLog(str(out))).load()
            return len(batches) == 3 and all(b.batch_id for b in batches.values())

        wait_for(all_recorded)
        time.sleep(0.3)  # polling now
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
    assert emu.state.batches.created == 3
    assert not emu.state.batches.results_reads  # killed before any finished

    finished(infer(prompts, config, out))
    stats = emu.state.batches.snapshot()
    assert stats["batches_created"] == 3 and stats["max_submissions_per_request"] == 1
    reads = dict(emu.state.batches.results_reads)
    assert len(reads) == 3
    counts = final_counts(out)
    assert len(counts) == 600 and set(counts.values()) == {1}

    # A third run finds everything final and every batch read: it asks the provider nothing.
    text = finished(infer(prompts, config, out))
    assert dict(emu.state.batches.results_reads) == reads
    assert emu.state.batches.created == 3
    assert "600" in text.split("skipped (already final)")[1].split("\n")[0]


def test_dataset_flow_in_batch_mode_publishes_and_a_rerun_submits_nothing(prefect_server,
                                                                         tmp_path):
    """The Prefect dataset flow with `endpoint.mode: batch`: chunks go out as batches (no
    realtime request at all), the flow waits for them (in process: no deployment here), the
    progress artifact counts batches and requests, and the dataset is published. Running the
    chunks' batch pass again afterwards submits nothing and reads no result again."""
    import asyncio

    from flows.dataset import dataset_flow
    from tasks.batch import batch_chunk_task
    from tasks.common import dataset_run
    from tests.support import REPO

    config = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())
    # Batch mode: the demo's whole-conversation dataset needs realtime (config check).
    config["datasets"] = [d for d in config["datasets"] if d.get("turns") != "all"]
    with serve_in_thread(EmulatorConfig(seed=4, literal_marker_rate=0.0, batch_delay=0.5),
                         load_tokenizer("mini")) as emulator:
        config["storage"] = str(tmp_path / "store")
        config["chunk_size"] = 10
        # The endpoint probe asks in realtime (tests/integration/test_probe_pipeline.py): off
        # here, so that every request the dataset itself makes is counted as a batch request.
        config["probe"] = "off"
        config["endpoint"].update(
            base_url=emulator.openrouter_url, mode="batch",
            batch={"api": "openrouter", "poll_seconds": 0.3},
            provider={"only": ["moonshotai"], "allow_fallbacks": False})
        path = tmp_path / "pipeline.yaml"
        path.write_text(yaml.safe_dump(config))
        result = asyncio.run(dataset_flow(str(path), "B3_magicoder"))
        assert result["outcome"] == "published", result
        stats = emulator.state.batches.snapshot()
        assert emulator.stats()["chat_requests"] == 0
        run = dataset_run(str(path), "B3_magicoder")
        chunks = -(-result["prompts"] // 10)
        assert stats["batches_created"] == chunks
        assert stats["max_submissions_per_request"] == 1
        # The summary's cost is the batch bill (half price on the emulator), all of it paid.
        assert result["cost_usd"] > 0
        assert result["projected_total_usd"] == pytest.approx(result["cost_usd"])
        assert result["realtime_equivalent_usd"] == pytest.approx(2 * result["cost_usd"],
                                                                  rel=1e-3)
        assert result["savings_usd"] == pytest.approx(result["cost_usd"], rel=1e-3)

        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

        async def artifact():
            async with get_client() as client:
                found = await client.read_artifacts(artifact_filter=ArtifactFilter(
                    key=ArtifactFilterKey(any_=["b3-magicoder-progress"])))
            return found[-1]

        progress = asyncio.run(artifact())
        assert f"batches submitted {chunks}, finished {chunks}" in progress.description
        assert f"requests done {result['prompts']}/{result['prompts']}" in progress.description

        reads = dict(emulator.state.batches.results_reads)
        fingerprint = f"{run.prompts_fp}-{run.endpoint_fp}"
        again = asyncio.run(batch_chunk_task.fn(str(path), "B3_magicoder", 0, fingerprint))
        assert again.get("batches_open", 0) == 0
        assert emulator.state.batches.created == chunks
        assert dict(emulator.state.batches.results_reads) == reads


# Long enough that the first poll (deployment and flow run created first) comes before the
# batches finish even on a loaded machine.
DELAY = 8.0


def test_batch_poll_flow_collects_and_resumes_a_suspended_dataset_run(prefect_server,
                                                                      tmp_path):
    """The poller (the scheduled `batch-poll` deployment) finds a Suspended dataset run of its
    config, records what finished, leaves the run suspended while batches run, and resumes it
    once none is open; it submits nothing the run submitted already."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.states import Suspended

    from flows.batch import batch_poll_flow
    from flows.dataset import dataset_flow
    from specregen.pipeline.inference import infer_chunk
    from specregen.pipeline.prompts import prepare_prompts
    from tasks.common import dataset_run
    from tests.support import REPO

    config = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())
    # Batch mode: the demo's whole-conversation dataset needs realtime (config check).
    config["datasets"] = [d for d in config["datasets"] if d.get("turns") != "all"]
    with serve_in_thread(EmulatorConfig(seed=4, batch_delay=DELAY),
                         load_tokenizer("mini")) as emulator:
        config["storage"] = str(tmp_path / "store")
        config["chunk_size"] = 10
        config["endpoint"].update(
            base_url=emulator.openrouter_url, mode="batch",
            batch={"api": "openrouter", "poll_seconds": 0.3},
            provider={"only": ["moonshotai"], "allow_fallbacks": False})
        path = str(tmp_path / "pipeline.yaml")
        Path(path).write_text(yaml.safe_dump(config))
        run = dataset_run(path, "B3_magicoder")
        chunks = prepare_prompts(run).counts["chunks"]
        for chunk in range(chunks):  # what the dataset run did before it suspended
            first = asyncio.run(infer_chunk(run, chunk, api_key=None, wait=False))
            assert first["batches_open"] == 1
        submitted = time.monotonic()

        async def suspended_run():
            # A deployed run (only those can be suspended and resumed), as a worker would
            # have started it; no worker runs here, so a resumed run just waits, Scheduled.
            async with get_client() as client:
                flow_id = await client.create_flow(dataset_flow)
                deployment = await client.create_deployment(
                    flow_id=flow_id, name="batch-test", entrypoint="flows/dataset.py:dataset_flow")
                flow_run = await client.create_flow_run_from_deployment(
                    deployment, parameters={"config_path": path, "dataset": "B3_magicoder"},
                    state=Suspended(timeout_seconds=3600, pause_key="batches-x"))
                return flow_run.id

        async def state_of(flow_run_id):
            async with get_client() as client:
                return (await client.read_flow_run(flow_run_id)).state

        flow_run_id = asyncio.run(suspended_run())
        early = asyncio.run(batch_poll_flow(path))
        assert early == [{"dataset": "B3_magicoder", "flow_run": early[0]["flow_run"],
                          "open": chunks, "resumed": False}]
        assert asyncio.run(state_of(flow_run_id)).name == "Suspended"
        time.sleep(max(0.0, submitted + DELAY + 0.2 - time.monotonic()))
        late = asyncio.run(batch_poll_flow(path))
        assert late[0]["open"] == 0 and late[0]["resumed"] is True
        assert asyncio.run(state_of(flow_run_id)).name != "Suspended"
        assert emulator.state.batches.created == chunks  # nothing submitted twice
        assert emulator.stats()["chat_requests"] == 0
        for chunk in range(chunks):
            done = asyncio.run(infer_chunk(run, chunk, api_key=None, wait=False))
            assert done["batches_open"] == 0 and done["failed"] == 0
