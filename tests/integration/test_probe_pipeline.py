"""Probe before paying: the pipeline probes an endpoint it has no profile for, refuses before the
first paid request when tool calls come back unrecoverable, and probes again when the endpoint
changes. Both paths: the library (`run_dataset`) and Prefect (`dataset_flow`).

Requests are counted at the emulator: a refused dataset costs exactly the probe's requests.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest
import yaml

from specregen.config import load_config
from specregen.emulator.config import EmulatorConfig
from specregen.emulator.server import serve_in_thread
from specregen.pipeline.layout import DatasetRun
from specregen.pipeline.probing import probe_key, probe_stage, profile_parts, read_profile
from specregen.pipeline.run import run_dataset
from specregen.probe.model import PROFILE_VERSION
from specregen.store.fs import Store
from tests.support import REPO, get_tokenizer

STRIPS = "strips_content_beside_calls"  # the family's trait

pytestmark = pytest.mark.integration

LIMIT = 4


def emulator(profile: str):
    config = EmulatorConfig(profile=profile, seed=8, tool_call_rate=0.9, literal_marker_rate=0.0)
    return serve_in_thread(config, get_tokenizer("mini"))


@pytest.fixture(scope="module")
def stripped():
    with emulator("stripped") as emu:
        yield emu


@pytest.fixture(scope="module")
def good():
    with emulator("openrouter") as emu:
        yield emu


def write_config(tmp_path: Path, emu, *, names=("B1_glaive", "B3_magicoder"), **top) -> Path:
    config = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())
    config.update({"storage": str(tmp_path / "store"), "chunk_size": 10, **top})
    config["endpoint"]["base_url"] = emu.openrouter_url
    config["datasets"] = [{**d, "limit": LIMIT} for d in config["datasets"] if d["name"] in names]
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def dataset_run(path: Path, name: str) -> DatasetRun:
    config = load_config(path)
    return DatasetRun(config, config.dataset(name))


def requests_during(emu, work):
    before = emu.stats()["chat_requests"]
    result = work()
    return result, emu.stats()["chat_requests"] - before


def test_library_refuses_a_stripped_endpoint_having_paid_only_for_the_probe(tmp_path, stripped):
    run = dataset_run(write_config(tmp_path, stripped), "B1_glaive")
    result, sent = requests_during(stripped, lambda: asyncio.run(run_dataset(run, None)))
    assert result.outcome == "refused"
    probe = result.summary["probe"]
    assert probe["status"] == "probed" and probe["requests"] > 0
    assert sent == probe["requests"]  # not one request for the dataset itself
    assert "markers stripped" in result.summary["refusal"]
    assert "refusing to start" in result.summary["refusal"]
    assert result.summary["cost_usd"] == probe["cost_usd"] > 0
    assert not run.store.exists("B1_glaive", "rawlog")
    profile, _ = read_profile(run)
    assert profile is not None and profile.probe_requests == sent
    # The stored profile refuses the next run at once: nothing is sent at all.
    again, sent = requests_during(stripped, lambda: asyncio.run(run_dataset(run, None)))
    assert (again.outcome, again.summary["probe"]["status"], sent) == ("refused", "stored", 0)


def run_artifact(state, key: str):
    """The artifact `key` of the flow run that ended in `state` (None when it wrote none)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        ArtifactFilterKey,
    )

    async def read():
        async with get_client() as client:
            found = await client.read_artifacts(artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=[key]),
                flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id])))
            return found[0] if found else None

    return asyncio.run(read())


def test_prefect_refuses_a_stripped_endpoint_before_paying(prefect_server, tmp_path, stripped):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    from flows.dataset import dataset_flow

    config = write_config(tmp_path, stripped)
    state, sent = requests_during(stripped, lambda: asyncio.run(
        dataset_flow(str(config), "B1_glaive", return_state=True)))
    assert state.is_failed()
    assert "refusing to start" in (state.message or "")
    run = dataset_run(config, "B1_glaive")
    profile, _ = read_profile(run)
    assert profile is not None and sent == profile.probe_requests > 0
    assert not run.store.exists("B1_glaive", "rawlog")

    async def probe_artifacts():
        async with get_client() as client:
            # Other tests on this session's server write the same key: the newest is ours.
            return await client.read_artifacts(artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=["b1-glaive-probe"])),
                sort=ArtifactSort.CREATED_DESC, limit=1)

    artifacts = asyncio.run(probe_artifacts())
    assert artifacts, "the probe's outcome is an artifact in the UI"
    text = artifacts[0].data
    assert "Refused before paying" in text
    assert f"| requests sent by this probe | {sent} |" in text
    # The refusal is the chain's outcome, not a task's crash: the run summary is published
    # (the same artifact a published run gets), then the flow run fails.
    summary = run_artifact(state, "b1-glaive-summary")
    assert summary is not None, "a refused run still publishes its summary"
    assert summary.data.startswith("# B1_glaive: refused")
    assert "refusing to start" in summary.data
    assert f"| endpoint probe | probed, {sent} requests |" in summary.data


def test_prefect_fails_a_gate_after_publishing_the_run_summary(prefect_server, tmp_path,
                                                               stripped):
    """Probe off, so the stripped provider's calls are paid for and the gate fails them: the
    flow run ends Failed with the gate's reason, and its summary artifact is there first."""
    from flows.dataset import dataset_flow

    config = write_config(tmp_path, stripped, names=("B1_glaive",), probe="off")
    state, sent = requests_during(stripped, lambda: asyncio.run(
        dataset_flow(str(config), "B1_glaive", return_state=True)))
    assert state.is_failed()
    assert "gate failed" in (state.message or "")
    assert sent == LIMIT
    run = dataset_run(config, "B1_glaive")
    assert not run.store.exists("B1_glaive", "published", "LATEST.json")
    summary = run_artifact(state, "b1-glaive-summary")
    assert summary is not None, "a failed gate still publishes the run summary"
    assert summary.data.startswith("# B1_glaive: gate_failed")
    assert f"| requests sent | {LIMIT} |" in summary.data
    assert "| gate report | " in summary.data and "report.md" in summary.data
    # The gate's own report is out too, as before.
    assert run_artifact(state, "b1-glaive-gate-report") is not None


def test_a_changed_endpoint_is_probed_again(tmp_path, good):
    path = write_config(tmp_path, good, names=("B1_glaive",))
    run = dataset_run(path, "B1_glaive")
    first, sent = requests_during(good, lambda: probe_stage(run, None))
    assert (first.status, first.refusal) == ("probed", None) and sent == first.requests > 0
    assert first.run.traits == first.profile.traits() and first.run.traits is not None
    # Reconstruction's fingerprint includes the traits it will use.
    assert first.run.reconstruct_fp != run.reconstruct_fp
    stored, sent = requests_during(good, lambda: probe_stage(run, None))
    assert (stored.status, stored.requests, sent) == ("stored", 0, 0)
    assert stored.run.reconstruct_fp == first.run.reconstruct_fp

    config = yaml.safe_load(path.read_text())
    config["endpoint"]["sampling"]["temperature"] = 0.6
    path.write_text(yaml.safe_dump(config))
    changed = dataset_run(path, "B1_glaive")
    assert probe_key(changed) != probe_key(run)
    again, sent = requests_during(good, lambda: probe_stage(changed, None))
    assert again.status == "probed" and sent == again.requests > 0
    assert len(run.store.list("_probe")) == 2


def test_an_old_profile_is_probed_again(tmp_path, good):
    run = dataset_run(write_config(tmp_path, good, names=("B1_glaive",)), "B1_glaive")
    old = {"kind": "specregen.provider_profile", "version": PROFILE_VERSION - 1}
    Store(run.config.storage).write_bytes(json.dumps(old).encode(), *profile_parts(run))
    outcome, sent = requests_during(good, lambda: probe_stage(run, None))
    assert outcome.status == "probed" and sent > 0
    assert any(f"version {PROFILE_VERSION - 1}" in note for note in outcome.notes)
    assert read_profile(run)[0] is not None  # replaced by a current one


def test_probe_modes(tmp_path, stripped, caplog):
    # auto: a config whose datasets need no tool calls is not probed (one that has such a
    # dataset probes for all of them: the traits enter every dataset's fingerprint).
    auto = dataset_run(write_config(tmp_path / "auto", stripped, names=("B3_magicoder",)),
                       "B3_magicoder")
    outcome, sent = requests_during(stripped, lambda: probe_stage(auto, None))
    assert (outcome.status, sent, outcome.run.traits) == ("not_needed", 0, None)
    # required: every dataset gets a profile; one without tool calls is not refused by it.
    required = dataset_run(write_config(tmp_path / "req", stripped, probe="required"),
                           "B3_magicoder")
    outcome, sent = requests_during(stripped, lambda: probe_stage(required, None))
    assert outcome.status == "probed" and sent > 0 and outcome.refusal is None
    assert outcome.run.traits == outcome.profile.traits()
    # off: never probes nor refuses, says what that costs, and ignores a stored profile.
    off_path = write_config(tmp_path / "req", stripped, probe="off")  # same storage as above
    off = dataset_run(off_path, "B1_glaive")
    with caplog.at_level(logging.WARNING, logger="specregen.pipeline.probing"):
        result, sent = requests_during(stripped, lambda: asyncio.run(run_dataset(off, None)))
    assert "probe: off" in caplog.text
    assert result.outcome == "gate_failed"  # it paid, and the gate caught the stripped calls
    assert sent == result.summary["requests_sent"] == LIMIT
    assert result.summary["probe"]["status"] == "off"


def test_reconstruction_gets_the_stored_traits(tmp_path, good, monkeypatch):
    import specregen.pipeline.reconstruction as reconstruction

    seen = []
    real = reconstruction.reconstruct_records

    def spy(records, fmt, **kwargs):
        seen.append(kwargs.get("traits"))
        return real(records, fmt, **kwargs)

    monkeypatch.setattr(reconstruction, "reconstruct_records", spy)
    run = dataset_run(write_config(tmp_path, good, names=("B1_glaive",)), "B1_glaive")
    result = asyncio.run(run_dataset(run, None))
    assert result.outcome == "published", result.summary
    stored = read_profile(run)[0]
    assert stored is not None and seen == [stored.traits()]
    # The published run is found again by a fingerprint that includes those traits.
    again, sent = requests_during(good, lambda: asyncio.run(run_dataset(run, None)))
    assert (again.outcome, sent) == ("skipped", 0)


def test_a_probe_that_gets_no_answer_refuses_and_stores_nothing(tmp_path):
    config = EmulatorConfig(profile="openrouter", seed=8, rate_5xx=1.0)
    with serve_in_thread(config, get_tokenizer("mini")) as down:
        path = write_config(tmp_path, down, names=("B1_glaive",))
        data = yaml.safe_load(path.read_text())
        data["endpoint"]["retry"] = {"max_attempts": 2, "base_delay": 0.001, "max_delay": 0.001}
        path.write_text(yaml.safe_dump(data))
        run = dataset_run(path, "B1_glaive")
        outcome, sent = requests_during(down, lambda: probe_stage(run, None))
    assert outcome.status == "failed" and sent == outcome.requests > 0
    assert "answered none of the probe's" in (outcome.refusal or "")
    assert outcome.run.traits is None
    # An outage must not become a stored verdict: the next run probes again.
    assert read_profile(run)[0] is None and not run.store.exists(*profile_parts(run))


def test_prefect_probes_then_pays_then_skips(prefect_server, tmp_path, good):
    """A recoverable endpoint: the flow probes once, pays for the dataset, and a second run is
    skipped with no request (the skip check finds the run by the fingerprint with the traits)."""
    from flows.dataset import dataset_flow

    config = write_config(tmp_path, good, names=("B1_glaive",))
    result, sent = requests_during(good, lambda: asyncio.run(
        dataset_flow(str(config), "B1_glaive")))
    assert result["outcome"] == "published"
    probe = result["probe"]
    assert probe["status"] == "probed" and sent == probe["requests"] + LIMIT
    assert result["cost_usd"] > probe["cost_usd"] > 0
    run = dataset_run(config, "B1_glaive")
    stored = read_profile(run)[0]
    assert stored is not None
    assert probe["traits"] == stored.traits().to_dict()
    again, sent = requests_during(good, lambda: asyncio.run(
        dataset_flow(str(config), "B1_glaive")))
    assert (again["outcome"], sent) == ("skipped", 0)


def test_the_probe_flow_stores_what_the_datasets_read(prefect_server, tmp_path, good):
    from flows.probe import probe_flow

    config = write_config(tmp_path, good, names=("B1_glaive",))
    profile, sent = requests_during(good, lambda: asyncio.run(probe_flow(str(config))))
    assert sent == profile["probe_requests"] > 0
    run = dataset_run(config, "B1_glaive")
    stored = read_profile(run)[0]
    assert stored is not None and stored.to_dict() == profile
    # The dataset then finds it: no second probe before paying.
    outcome, sent = requests_during(good, lambda: probe_stage(run, None))
    assert (outcome.status, sent) == ("stored", 0)


@pytest.mark.parametrize(("profile", "dialect", "strips"),
                         [("vllm-hermes", "vllm", False), ("sglang", "sglang", True)])
def test_a_qwen3_endpoint_is_probed_and_its_traits_reach_reconstruction(
        tmp_path, monkeypatch, profile, dialect, strips):
    """configs/demo-qwen3.yaml's glaive dataset, not streamed: the probe runs before paying,
    finds how the server returns the text before calls, and reconstruction gets those traits."""
    import specregen.pipeline.reconstruction as reconstruction
    from specregen.models.tokenizer import load_tokenizer

    seen = []
    real = reconstruction.reconstruct_records

    def spy(records, fmt, **kwargs):
        seen.append(kwargs.get("traits"))
        return real(records, fmt, **kwargs)

    monkeypatch.setattr(reconstruction, "reconstruct_records", spy)
    config = yaml.safe_load((REPO / "configs" / "demo-qwen3.yaml").read_text())
    emu_config = EmulatorConfig(profile=profile, model=config["endpoint"]["model"], seed=8,
                                reasoning_tokens_mean=60, content_tokens_mean=40)
    with serve_in_thread(emu_config, load_tokenizer(config["tokenizer"])) as emu:
        config.update({"storage": str(tmp_path / "store"), "chunk_size": 10})
        config["endpoint"].update({"base_url": emu.url, "dialect": dialect, "stream": False,
                                   "return_token_ids": False})
        config["datasets"] = [{**d, "limit": LIMIT} for d in config["datasets"]
                              if d["name"] == "B1_glaive"]
        path = tmp_path / "pipeline.yaml"
        path.write_text(yaml.safe_dump(config))
        run = dataset_run(path, "B1_glaive")
        result, sent = requests_during(emu, lambda: asyncio.run(run_dataset(run, None)))
    assert result.outcome == "published", result.summary
    probe = result.summary["probe"]
    assert probe["status"] == "probed" and sent == probe["requests"] + LIMIT
    stored = read_profile(run)[0]
    assert stored is not None and stored.tool_calls_recoverable is True
    assert stored.findings.family.get(STRIPS) is strips, stored.findings.evidence
    assert stored.findings.counts_stop_token is True
    assert seen == [stored.traits()]


def test_prefect_ends_a_budget_stop_with_its_summary_and_resumes_it(prefect_server, tmp_path,
                                                                   good):
    """A spent budget is the chain's `stopped` outcome under Prefect too: the chunk's task
    returns its stop (not cached: it is not final), the summary is published, the flow run
    fails; the next run with room in the budget asks only what is missing, and publishes."""
    from flows.dataset import dataset_flow

    config = write_config(tmp_path, good, names=("B1_glaive",), probe="off")
    settings = yaml.safe_load(config.read_text())
    settings["endpoint"]["budget_usd"] = 1e-9  # spent by the first answer
    settings["endpoint"]["concurrency"] = 1
    config.write_text(yaml.safe_dump(settings))
    state, sent = requests_during(good, lambda: asyncio.run(
        dataset_flow(str(config), "B1_glaive", return_state=True)))
    assert state.is_failed()
    assert "inference stopped (budget)" in (state.message or "")
    assert 0 < sent < LIMIT
    summary = run_artifact(state, "b1-glaive-summary")
    assert summary is not None, "a stopped run still publishes its summary"
    assert summary.data.startswith("# B1_glaive: stopped")

    settings["endpoint"]["budget_usd"] = None
    config.write_text(yaml.safe_dump(settings))
    state, again = requests_during(good, lambda: asyncio.run(
        dataset_flow(str(config), "B1_glaive", return_state=True)))
    assert state.is_completed(), state.message
    assert sent + again == LIMIT, "nothing paid for is asked twice"
    assert dataset_run(config, "B1_glaive").store.exists("B1_glaive", "published", "LATEST.json")
