"""Batch mode (issue 11) against the emulator's batch APIs, both shapes, in-process.

What is counted is counted at the emulator: batches created, submissions per custom_id, result
reads per batch. Processing delay is zero unless a test needs a batch to be still running.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from specregen.client import batch as batch_mod
from specregen.client.batch import Ledger, run_batch_inference
from specregen.client.config import EndpointConfig
from specregen.client.engine import run_inference
from specregen.client.request import build_request
from specregen.emulator.config import EmulatorConfig
from specregen.emulator.server import serve_in_thread
from specregen.models.tokenizer import load_tokenizer
from specregen.records import Prompt
from specregen.store.rawlog import RawLog
from specregen.wire.request import request_fingerprint

SHAPES = {"openrouter": ("openrouter", "openrouter"), "openai-files": ("moonshot", "moonshot")}
BASE = EmulatorConfig(reasoning_tokens_mean=12, content_tokens_mean=8, tool_call_rate=0.0)


@pytest.fixture(scope="module")
def emulators():
    tok = load_tokenizer("mini")
    with serve_in_thread(dataclasses.replace(BASE, profile="openrouter"), tok) as orr, \
            serve_in_thread(dataclasses.replace(BASE, profile="moonshot"), tok) as moon:
        yield {"openrouter": orr, "openai-files": moon}


def setup(emulators, api: str, **knobs):
    emu = emulators[api]
    emu.state.config = dataclasses.replace(BASE, profile=emu.state.config.profile, **knobs)
    emu.state.batches.reset()
    emu.state.batches.batches.clear()
    emu.state.reset()
    return emu


def config(emu, api: str, **extra) -> EndpointConfig:
    dialect = SHAPES[api][1]
    data = {
        "base_url": emu.openrouter_url if api == "openrouter" else emu.url,
        "model": "moonshotai/kimi-k2.5", "dialect": dialect, "mode": "batch",
        "batch": {"api": api, "poll_seconds": 0.02, "max_requests": 100},
        "prices": {"prompt_per_million": 0.6, "completion_per_million": 2.5},
        "retry": {"max_attempts": 6, "base_delay": 0.0},
        **extra,
    }
    if api == "openrouter":
        data["provider"] = {"only": ["moonshotai"]}
    return EndpointConfig.load(data)


def prompts(n: int, start: int = 0) -> list[Prompt]:
    return [Prompt(sample_id=f"s{i}", messages=[{"role": "user", "content": f"question {i}"}])
            for i in range(start, start + n)]


def run(cfg, out, items, **kw):
    async def main():
        async with RawLog(str(out)) as log:
            return await run_batch_inference(items, cfg, log, api_key=None, **kw)
    return asyncio.run(main())


def finals(out) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {}
    for record in RawLog(str(out)).iter_records():
        if record["final"]:
            found.setdefault(record["sample_id"], []).append(record)
    return found


@pytest.mark.parametrize("api", list(SHAPES))
def test_every_sample_final_once_in_batches_of_at_most_the_limit(emulators, api, tmp_path):
    emu = setup(emulators, api)
    cfg = config(emu, api)
    summary = run(cfg, tmp_path, prompts(250))
    assert summary.ok == 250 and summary.failed == 0
    got = finals(tmp_path)
    assert sorted(got) == sorted(f"s{i}" for i in range(250))
    assert all(len(v) == 1 for v in got.values())
    stats = emu.state.batches.snapshot()
    assert stats["batches_created"] == 3 == summary.batches_submitted
    assert max(b["requests"] for b in stats["batches"].values()) <= 100
    assert stats["max_submissions_per_request"] == 1
    # The stored request is the realtime request minus `stream`: same fingerprint, so the raw
    # log cannot tell the modes apart.
    realtime = cfg.model_copy(update={"mode": "realtime"})
    for record in got["s7"]:
        body = build_request(prompts(1, 7)[0], realtime)
        assert body.get("stream") is True and "stream" not in record["request"]
        assert record["fingerprint"] == request_fingerprint(body)
        assert record["response"]["choices"][0]["message"]["content"] is not None


@pytest.mark.parametrize("api", list(SHAPES))
def test_failed_and_expired_requests_are_resubmitted_in_later_batches(emulators, api, tmp_path):
    emu = setup(emulators, api, batch_failure_rate=0.2, batch_expire_rate=0.1)
    # 30% lost per round: 12 attempts make a permanent failure of one of 200 a 1e-4 event.
    summary = run(config(emu, api, retry={"max_attempts": 12}), tmp_path, prompts(200))
    assert summary.ok == 200
    assert summary.batches_submitted > 2  # the first round's failures went in later batches
    assert summary.errors.get("server_error", 0) > 0
    assert summary.errors.get("batch_expired", 0) > 0
    got = finals(tmp_path)
    assert len(got) == 200 and all(len(v) == 1 for v in got.values())
    # Attempt numbers continue per sample: a resubmitted one has attempts 1..k, final last.
    attempts: dict[str, list[int]] = {}
    for record in RawLog(str(tmp_path)).iter_records():
        attempts.setdefault(record["sample_id"], []).append(record["attempt"])
    assert any(len(a) > 1 for a in attempts.values())
    assert all(a == list(range(1, len(a) + 1)) for a in attempts.values())


def test_realtime_fallback_sends_failed_batch_requests_realtime(emulators, tmp_path):
    emu = setup(emulators, "openrouter", batch_failure_rate=0.3)
    cfg = config(emu, "openrouter", batch_fallback="realtime")
    summary = run(cfg, tmp_path, prompts(100))
    assert summary.ok == 100
    assert summary.batches_submitted == 1
    assert summary.sent_realtime > 0
    assert emu.state.chat_requests == summary.sent_realtime  # realtime only for those
    assert all(len(v) == 1 for v in finals(tmp_path).values())


def test_batch_and_realtime_share_one_raw_log(emulators, tmp_path):
    emu = setup(emulators, "openrouter")
    cfg = config(emu, "openrouter")

    async def realtime():
        async with RawLog(str(tmp_path)) as log:
            return await run_inference(prompts(40), cfg.model_copy(update={"mode": "realtime"}),
                                       log, api_key=None)

    assert asyncio.run(realtime()).ok == 40
    summary = run(cfg, tmp_path, prompts(100))
    assert summary.skipped == 40 and summary.ok == 60
    assert emu.state.batches.snapshot()["requests_submitted"] == 60


def test_a_crash_between_submit_and_record_finds_the_batch_again(emulators, tmp_path,
                                                                 monkeypatch):
    emu = setup(emulators, "openai-files")
    cfg = config(emu, "openai-files")
    real = Ledger.submitted
    calls = {"n": 0}

    def crash_on_second(self, batch, batch_id):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt("killed after the provider took batch 2")
        return real(self, batch, batch_id)

    monkeypatch.setattr(Ledger, "submitted", crash_on_second)
    with pytest.raises(KeyboardInterrupt):
        run(cfg, tmp_path, prompts(250))
    assert emu.state.batches.created == 2
    monkeypatch.setattr(Ledger, "submitted", real)
    summary = run(cfg, tmp_path, prompts(250))
    assert summary.batches_recovered == 1
    assert summary.ok == 250
    stats = emu.state.batches.snapshot()
    assert stats["batches_created"] == 3  # batch 2 was found, not sent again
    assert stats["max_submissions_per_request"] == 1
    assert all(len(v) == 1 for v in finals(tmp_path).values())


def test_an_intent_that_never_reached_the_provider_is_sent_on_rerun(emulators, tmp_path,
                                                                    monkeypatch):
    emu = setup(emulators, "openrouter")
    cfg = config(emu, "openrouter")

    async def boom(self, payload, marker):
        raise KeyboardInterrupt("killed before the POST")

    monkeypatch.setattr(batch_mod.BatchAPI, "submit", boom)
    with pytest.raises(KeyboardInterrupt):
        run(cfg, tmp_path, prompts(50))
    monkeypatch.undo()
    assert emu.state.batches.created == 0
    summary = run(cfg, tmp_path, prompts(50))
    assert summary.ok == 50 and summary.batches_recovered == 0
    assert emu.state.batches.created == 1
    ledger = Ledger(RawLog(str(tmp_path))).load()
    assert len(ledger) == 1 and all(b.done for b in ledger.values())  # the same intent


def test_wait_false_returns_while_batches_run_and_never_reads_results_twice(emulators,
                                                                          tmp_path):
    emu = setup(emulators, "openrouter", batch_delay=0.6)
    cfg = config(emu, "openrouter")
    first = run(cfg, tmp_path, prompts(150), wait=False)
    assert first.batches_open == 2 and first.requests_in_batches == 150 and first.ok == 0
    again = run(cfg, tmp_path, prompts(150), wait=False)
    assert again.batches_submitted == 0 and again.batches_open == 2  # nothing sent twice
    time.sleep(0.7)
    done = run(cfg, tmp_path, prompts(150), wait=False)
    assert done.ok == 150 and done.batches_open == 0 and done.batches_submitted == 0
    reads = dict(emu.state.batches.results_reads)
    final = run(cfg, tmp_path, prompts(150), wait=False)
    assert final.skipped == 150 and final.batches_submitted == 0
    assert dict(emu.state.batches.results_reads) == reads  # finished results not read again
    assert emu.state.batches.created == 2
    # The output's cost view spans the passes: what one uninterrupted run of the same prompts
    # costs (and reports as this run's own cost), with half of it saved.
    setup(emulators, "openrouter")
    whole = run(cfg, tmp_path / "whole", prompts(150))
    assert final.cost_usd == 0.0
    assert final.spent_total_usd == pytest.approx(whole.cost_usd, abs=1e-6)
    assert final.projected_total_usd == pytest.approx(whole.cost_usd, abs=1e-6)
    assert final.savings_total_usd == pytest.approx(whole.cost_usd, rel=1e-3)


def test_budget_counts_batch_prices(emulators, tmp_path):
    emu = setup(emulators, "openrouter")
    # One batch of 100 first: its mean cost projects the rest; the budget holds ~1.5 batches.
    cfg = config(emu, "openrouter")
    probe = run(cfg, tmp_path / "probe", prompts(100))
    per = probe.cost_usd / 100
    limited = config(emu, "openrouter", budget_usd=round(per * 150, 9),
                     sampling={"max_tokens": 400})
    emu.state.batches.reset()
    summary = run(limited, tmp_path / "run", prompts(300, start=1000))
    assert summary.stopped_reason == "budget"
    assert summary.cost_usd <= limited.budget_usd * 1.15  # mean-based projection
    assert summary.abandoned > 0 and summary.ok + summary.abandoned == 300


def test_batch_cost_is_the_discounted_realtime_cost(emulators, tmp_path):
    emu = setup(emulators, "openrouter")
    cfg = config(emu, "openrouter")
    batch = run(cfg, tmp_path / "b", prompts(80))

    async def realtime():
        async with RawLog(str(tmp_path / "r")) as log:
            return await run_inference(prompts(80), cfg.model_copy(update={"mode": "realtime"}),
                                       log, api_key=None)

    real = asyncio.run(realtime())
    assert real.completion_tokens == batch.completion_tokens
    assert batch.cost_usd == pytest.approx(0.5 * real.cost_usd, rel=1e-6)
    assert batch.realtime_equivalent_usd == pytest.approx(real.cost_usd, rel=1e-3)
    assert batch.savings_usd == pytest.approx(real.cost_usd - batch.cost_usd, rel=1e-3)


def test_batches_are_split_by_bytes_too(emulators, tmp_path):
    emu = setup(emulators, "openrouter")
    long = [Prompt(sample_id=f"L{i}", messages=[{"role": "user", "content": "x " * 2000 + str(i)}])
            for i in range(30)]
    cfg = config(emu, "openrouter", batch={"api": "openrouter", "poll_seconds": 0.02,
                                           "max_requests": 100, "max_bytes": 40_000})
    captured: list[int] = []
    real_payload = batch_mod.BatchAPI.payload

    def spy(self, items, marker):
        data = real_payload(self, items, marker)
        if marker != "x" * 24:
            captured.append(len(data))
        return data

    batch_mod.BatchAPI.payload = spy
    try:
        summary = run(cfg, tmp_path, long)
    finally:
        batch_mod.BatchAPI.payload = real_payload
    assert summary.ok == 30
    assert len(captured) >= 3 and max(captured) <= 40_000


def test_batch_mode_on_openrouter_needs_one_pinned_provider():
    from specregen.client.config import ConfigError

    with pytest.raises(ConfigError, match=r"provider\.only"):
        EndpointConfig.load({"base_url": "http://127.0.0.1:1/api/v1", "model": "m",
                             "mode": "batch"})


def test_a_refused_key_stops_the_batch_run_naming_the_variable(emulators, tmp_path):
    from specregen.client.engine import FatalAPIError

    emu = setup(emulators, "openai-files", require_key="sk-right-key-123")

    async def main(key):
        async with RawLog(str(tmp_path)) as log:
            return await run_batch_inference(prompts(20), config(emu, "openai-files"), log,
                                             api_key=key)

    with pytest.raises(FatalAPIError) as info:
        asyncio.run(main("sk-wrong-key-456"))
    assert "OPENROUTER_API_KEY" in str(info.value) and "sk-wrong" not in str(info.value)
    assert info.value.exit_code == 3
    assert emu.state.batches.created == 0
    assert asyncio.run(main("sk-right-key-123")).ok == 20


def test_an_unreachable_batch_api_is_exit_6_with_a_rerun_hint(tmp_path, monkeypatch):
    from specregen.client.batch_api import BatchAPIError

    cfg = EndpointConfig.load({"base_url": "http://127.0.0.1:9/v1", "model": "m",
                               "dialect": "moonshot", "mode": "batch",
                               "batch": {"api": "openai-files"}})
    slept = []

    async def no_wait(seconds):
        slept.append(seconds)

    async def main():
        async with RawLog(str(tmp_path)) as log:
            return await run_batch_inference(prompts(3), cfg, log, api_key=None)

    # The call retries back off for seconds; not worth waiting for here.
    monkeypatch.setattr("specregen.client.batch_api._sleep", no_wait)
    with pytest.raises(BatchAPIError) as info:
        asyncio.run(main())
    assert slept  # it did retry
    assert info.value.exit_code == 6 and "run again" in info.value.one_line()
    # The intent was recorded before the attempt: a rerun looks for it, then sends it.
    assert len(Ledger(RawLog(str(tmp_path))).load()) == 1


def test_answers_for_prompts_gone_from_the_input_are_kept_not_final(emulators, tmp_path):
    emu = setup(emulators, "openrouter", batch_delay=0.3)
    cfg = config(emu, "openrouter")
    assert run(cfg, tmp_path, prompts(20), wait=False).batches_open == 1
    time.sleep(0.35)
    half = run(cfg, tmp_path, prompts(10), wait=False)  # the input lost s10..s19 meanwhile
    assert half.ok == 10 and half.batches_open == 0
    gone = {f"s{i}" for i in range(10, 20)}
    kept = [r for r in RawLog(str(tmp_path)).iter_records() if r["sample_id"] in gone]
    assert len(kept) == 10 and all(not r["final"] and r["response"] for r in kept)
    again = run(cfg, tmp_path, prompts(20))
    assert again.skipped == 10 and again.ok == 10  # their prompts are back: asked again


def test_a_batch_the_provider_forgot_is_sent_again(emulators, tmp_path):
    emu = setup(emulators, "openrouter", batch_delay=30.0)
    cfg = config(emu, "openrouter")
    assert run(cfg, tmp_path, prompts(30), wait=False).batches_open == 1
    emu.state.batches.batches.clear()  # deleted on the provider's side
    emu.state.config = dataclasses.replace(emu.state.config, batch_delay=0.0)
    summary = run(cfg, tmp_path, prompts(30))
    assert summary.ok == 30 and summary.batches_submitted == 1
    assert summary.errors == {"batch_lost": 30}
