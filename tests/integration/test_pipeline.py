"""The Prefect pipeline end to end on the bundled samples, against the emulator."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pyarrow.dataset as pads
import pytest
import yaml

from flows.pipeline import DatasetsFailedError, pipeline_flow
from specregen.emulator.config import EmulatorConfig
from specregen.emulator.server import serve_in_thread
from specregen.pipeline.summary import summary_markdown
from specregen.progress import subscribed
from specregen.store.fs import Store
from specregen.store.manifest import read_manifest
from tests.support import REPO, get_tokenizer

pytestmark = pytest.mark.integration


def write_config(tmp_path: Path, base_url: str, storage: str, **dataset_gate) -> Path:
    config = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())
    config["storage"] = storage
    config["endpoint"]["base_url"] = base_url
    config["chunk_size"] = 10
    for dataset in config["datasets"]:
        dataset["gate"] = {**dataset.get("gate", {}), **dataset_gate}
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def emulator():
    config = EmulatorConfig(seed=4, literal_marker_rate=0.0)
    with serve_in_thread(config, get_tokenizer("mini")) as emu:
        yield emu


def test_pipeline_publishes_every_dataset_then_skips_them(prefect_server, emulator, tmp_path):
    storage = str(tmp_path / "store")
    config = write_config(tmp_path, emulator.openrouter_url, storage)
    datasets = yaml.safe_load(config.read_text())["datasets"]
    states = []  # every stage's progress, as `specregen run`'s board sees it
    with subscribed(states.append):
        results = asyncio.run(pipeline_flow(str(config)))
    assert [r["outcome"] for r in results] == ["published"] * len(datasets), results
    # The demo's whole-conversation dataset: its summary says how the conversations ended
    # (the gate report's numbers), and its reconstruction progress counts conversations, the
    # unit of its total (one conversation gives a sample per user turn reached).
    conv = next(r for r in results if r["dataset"] == "B1_glaive_conversations")
    gate_report = Store(storage).read_json(
        "B1_glaive_conversations", "gate", Path(conv["gate_report"]).parent.name, "report.json")
    expected = gate_report["conversations"]
    assert conv["conversations"] == {
        "count": conv["prompts"], "by_stop_reason": expected["by_stop_reason"],
        "user_turns": expected["user_turns"], "samples": expected["samples"]}
    assert sum(conv["conversations"]["by_stop_reason"].values()) == conv["prompts"]
    assert sum(expected["user_turns"].values()) == conv["prompts"]
    last = {s.stage: s for s in states
            if s.stage.startswith("reconstruct B1_glaive_conversations ") and s.final}
    assert last and sum(s.total for s in last.values()) == conv["prompts"]
    assert sum(s.done + s.failed for s in last.values()) == conv["prompts"]
    assert all(r.get("conversations") is None for r in results if r is not conv)
    assert "conversations by stop reason" in summary_markdown(conv)
    store = Store(storage)
    for result in results:
        published = Path(result["published"]["path"])
        table = pads.dataset(str(published / "data"), format="parquet").to_table()
        assert table.num_rows == result["gate"]["accepted"] > 0
        assert {"input_ids", "loss_mask", "status"} <= set(table.column_names)
        assert (published / "train.jsonl").exists() and (published / "messages.jsonl").exists()
        name = result["dataset"]
        latest = store.read_json(name, "published", "LATEST.json")
        manifest = read_manifest(store, name, "published", latest["fingerprint"])
        for shard in manifest.shards:
            import hashlib

            data = store.read_bytes(name, "published", latest["fingerprint"],
                                    *shard.path.split("/"))
            assert hashlib.sha256(data).hexdigest() == shard.sha256
    requests_before = emulator.stats()["chat_requests"]
    again = asyncio.run(pipeline_flow(str(config)))
    assert [r["outcome"] for r in again] == ["skipped"] * len(results)
    assert emulator.stats()["chat_requests"] == requests_before


def test_corrupting_provider_fails_its_gate_and_is_not_published(prefect_server, tmp_path):
    tok = get_tokenizer("mini")
    with serve_in_thread(EmulatorConfig(profile="stripped", seed=8, tool_call_rate=0.9,
                                        literal_marker_rate=0.0), tok) as emu:
        storage = str(tmp_path / "store")
        config = write_config(tmp_path, emu.openrouter_url, storage)
        # The probe would refuse B1 before paying (tests/integration/test_probe_pipeline.py);
        # with it off, the gate must still catch what the stripped provider returns.
        config.write_text(yaml.safe_dump({**yaml.safe_load(config.read_text()), "probe": "off"}))
        with pytest.raises(DatasetsFailedError, match="B1_glaive"):
            asyncio.run(pipeline_flow(str(config)))
    store = Store(storage)
    assert not store.exists("B1_glaive", "published", "LATEST.json")
    for name in ("B2_opencodeinstruct", "B3_magicoder"):
        assert store.exists(name, "published", "LATEST.json"), name
    gate_dirs = store.list("B1_glaive", "gate")
    report = json.loads(store.read_bytes("B1_glaive", "gate", gate_dirs[0], "report.json"))
    assert report["verdict"] == "fail"
    assert report["by_check"]["reconstruction"] > 0


def test_a_failing_chunk_is_retried_by_prefect(prefect_server, emulator, tmp_path, monkeypatch):
    """An inference chunk that crashes once is retried by its task and the dataset publishes."""
    import tasks.inference as inference_tasks

    real = inference_tasks.infer_chunk
    calls: list[int] = []

    async def crash_once(run, chunk, **kwargs):
        calls.append(chunk)
        if chunk == 0 and calls.count(0) == 1:
            raise ConnectionError("the worker lost its network for a moment")
        return await real(run, chunk, **kwargs)

    monkeypatch.setattr(inference_tasks, "infer_chunk", crash_once)
    config = write_config(tmp_path, emulator.openrouter_url, str(tmp_path / "store"))
    results = asyncio.run(pipeline_flow(str(config), datasets=["B3_magicoder"]))
    assert results[0]["outcome"] == "published"
    assert calls.count(0) == 2
