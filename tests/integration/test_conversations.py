"""Whole conversations end to end (issue 10): `specregen infer --turns all` against the emulator
in conversation mode, checked from the raw log alone.

The dataset: glaive's conversations (LLaMA-Factory's ShareGPT conversion, 265 distinct rows, 156
with tool loops) plus 35 made-up conversations with parallel calls, 300 in all. The emulator
follows each conversation's own next step, or diverges from it (`divergence_rate`), so both
matching and differing calls happen. The checks below read the dataset messages and the raw log
directly (an oracle written here, not the plan's code): every request's assistant history is
the model's own earlier answers, results answer the model's call ids, a matching call goes on,
a differing one stops with the reason the rules give.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specregen.cli import app
from specregen.emulator.config import EmulatorConfig
from specregen.emulator.server import serve_in_thread
from specregen.records import Prompt
from specregen.sources import read_source
from specregen.store.rawlog import RawLog
from tests.support import SHARED, get_tokenizer

pytestmark = pytest.mark.integration

GLAIVE = SHARED / "datasets" / "B1_glaive_llamafactory_sharegpt_demo.jsonl"
CITY = {"type": "function", "function": {
    "name": "city_info", "description": "Facts about a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "fact": {"type": "string"}}}}}


def parallel_conversation(i: int) -> dict:
    """Two (or three) calls at once, their results, an answer; then a follow-up question."""
    cities = ["Paris", "Rome", "Oslo"][: 2 + i % 2]
    calls = [{"id": f"p{n}", "type": "function", "function": {
        "name": "city_info", "arguments": json.dumps({"city": c, "fact": "population"})}}
        for n, c in enumerate(cities)]
    return {"sample_id": f"parallel-{i}", "tools": [CITY], "turns": "all", "messages": [
        {"role": "system", "content": "You answer with facts."},
        {"role": "user", "content": f"Compare the populations of {' and '.join(cities)} ({i})."},
        {"role": "assistant", "content": "", "tool_calls": calls},
        *[{"role": "tool", "tool_call_id": f"p{n}", "content": f"{c}: {n + 1} million"}
          for n, c in enumerate(cities)],
        {"role": "assistant", "content": "Here is the comparison."},
        {"role": "user", "content": "Which is largest?"},
        {"role": "assistant", "content": "The last one."}]}


def write_conversations(path: Path, n_parallel: int = 35, n_glaive: int | None = None,
                        copies: int = 1) -> Path:
    """glaive's conversations (`copies` of each: copy c asks its first question with " (c)"
    added, a conversation of its own to the emulator too) and `n_parallel` made-up ones."""
    lines = []
    for record in read_source("sharegpt", GLAIVE, dataset="B1_glaive", turns="all",
                              limit=n_glaive):
        if not isinstance(record, Prompt):
            continue
        for c in range(copies):
            messages = [dict(m) for m in record.messages]
            if c:
                first = next(m for m in messages if m["role"] == "user")
                first["content"] += f" ({c})"
            lines.append({"sample_id": record.sample_id + (f"-{c}" if c else ""),
                          "messages": messages, "tools": record.tools, "turns": "all"})
    lines += [parallel_conversation(i) for i in range(n_parallel)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def read_lines(path: Path) -> dict[str, dict]:
    return {row["sample_id"]: row for row in map(json.loads, path.read_text().splitlines())}


def finals_by_conversation(out: Path) -> dict[str, list[dict]]:
    by: dict[str, list[dict]] = defaultdict(list)
    for record in RawLog(str(out)).iter_records():
        if record.get("final"):
            by[record["conversation"]["id"]].append(record)
    for records in by.values():
        records.sort(key=lambda r: (r["conversation"]["user_turn"], r["conversation"]["step"]))
    return by


# -- the oracle ------------------------------------------------------------------------------


def dataset_turns(messages: list[dict]) -> tuple[list[dict], list[tuple[list[dict], list]]]:
    """(system messages, [(user messages, [(assistant message, its tool results)])])."""
    system = [m for m in messages[: next(i for i, m in enumerate(messages)
                                         if m["role"] == "user")]]
    turns: list[tuple[list[dict], list]] = []
    for m in messages[len(system):]:
        if m["role"] == "user":
            if not turns or turns[-1][1]:
                turns.append(([], []))
            turns[-1][0].append(m)
        elif m["role"] == "assistant":
            turns[-1][1].append((m, []))
        else:
            turns[-1][1][-1][1].append(m)
    return system, turns


def call_key(name: str, arguments: str) -> tuple[str, str]:
    try:
        return name, json.dumps(json.loads(arguments), sort_keys=True)
    except ValueError:
        return name, arguments


def response_message(record: dict) -> dict:
    return record["response"]["choices"][0]["message"]


def response_calls(record: dict) -> list[dict]:
    return response_message(record).get("tool_calls") or []


def check_conversation(row: dict, records: list[dict], *, qwen3: bool = False) -> str:
    """Asserts the regeneration rules on one conversation's final records; returns its stop.

    `qwen3`: the text before calls is sent without the newlines vLLM returns around it (the
    template writes them back), so it is compared without them."""
    system, turns = dataset_turns(row["messages"])
    k = j = 0
    sent: list[dict] = list(system) + turns[0][0]  # what the next request must hold
    for n, record in enumerate(records):
        where = f"{row['sample_id']} record {n}"
        assert record["conversation"] == {"id": row["sample_id"], "user_turn": k, "step": j}
        assert record["sample_id"] == f"{row['sample_id']}/t{k}/s{j}"
        messages = record["request"]["messages"]
        assert [m["role"] for m in messages] == [m["role"] for m in sent], where
        for got, want in zip(messages, sent, strict=True):
            if want["role"] != "assistant":
                assert got == want, where
                continue
            # the model's own earlier answer, as the server returned it
            content = want["content"] or ""
            if qwen3 and want.get("tool_calls"):
                content = content.strip("\n")
            assert got["content"] == content, where
            assert got.get("reasoning_content") == want.get("reasoning"), where
            assert [(c["id"], c["function"]["name"], c["function"]["arguments"])
                    for c in got.get("tool_calls") or []] == [
                (c["id"], c["function"]["name"], c["function"]["arguments"])
                for c in want.get("tool_calls") or []], where
        last = n == len(records) - 1
        if record["status"] == "failed":
            assert last, where
            return "error"
        message = response_message(record)
        if record["response"]["choices"][0]["finish_reason"] == "length":
            assert last, where
            return "length"
        steps = turns[k][1]
        step = steps[j] if j < len(steps) else None
        theirs = (step[0].get("tool_calls") or []) if step else []
        mine = response_calls(record)
        if mine and not theirs:
            assert last, where
            return "model_called_dataset_answered"
        if theirs and not mine:
            assert last, where
            return "model_answered_dataset_called"
        sent.append(message)
        if mine:
            want = Counter(call_key(c["function"]["name"], c["function"]["arguments"])
                           for c in theirs)
            if Counter(call_key(c["function"]["name"], c["function"]["arguments"])
                       for c in mine) != want:
                assert last, where
                return "calls_differ"
            results = {call_key(c["function"]["name"], c["function"]["arguments"]): r
                       for c, r in zip(theirs, step[1], strict=True)}
            for c in mine:
                result = results[call_key(c["function"]["name"], c["function"]["arguments"])]
                sent.append({**result, "tool_call_id": c["id"]})
            j += 1
            assert not last, f"{where}: matching calls but the conversation stopped"
            continue
        if k + 1 == len(turns):
            assert last, where
            return "end"
        k, j = k + 1, 0
        sent += turns[k][0]
        assert not last, f"{where}: turn answered but the next user turn was not asked"
    raise AssertionError(f"{row['sample_id']}: no final answer at all")


def run_infer(src: Path, out: Path, url: str, *extra: str) -> None:
    result = CliRunner().invoke(app, [
        "infer", str(src), "--out", str(out), "--base-url", url, "--turns", "all",
        "--tokenizer", "mini", *extra])
    assert result.exit_code == 0, result.output


@pytest.fixture(scope="module")
def tok():
    return get_tokenizer("mini")


def test_glaive_conversations_regenerate_turn_by_turn(tmp_path, tok):
    src = write_conversations(tmp_path / "conversations.jsonl")
    rows = read_lines(src)
    assert len(rows) == 300
    out = tmp_path / "rawlog"
    config = EmulatorConfig(seed=4, conversations=str(src), divergence_rate=0.25,
                            reasoning_tokens_mean=30, content_tokens_mean=20)
    with serve_in_thread(config, tok) as emu:
        run_infer(src, out, emu.openrouter_url, "--model", "moonshotai/kimi-k2.5",
                  "--concurrency", "24", "--no-stream")
    by = finals_by_conversation(out)
    assert sorted(by) == sorted(rows)
    stops = Counter(check_conversation(rows[cid], by[cid]) for cid in rows)
    # both matching and diverging conversations, with tool loops and later user turns
    assert stops["end"] >= 100 and stops["calls_differ"] > 0
    assert stops["model_called_dataset_answered"] + stops["model_answered_dataset_called"] > 0
    requests = [r for records in by.values() for r in records]
    assert any(r["conversation"]["step"] >= 1 for r in requests)  # after tool results
    assert any(r["conversation"]["user_turn"] >= 2 for r in requests)  # later user turns
    # parallel calls kept: the model's answer called several tools at once, and the next
    # request holds every result, addressed to the model's own ids
    went_on = [records[1] for cid, records in by.items()
               if cid.startswith("parallel-") and len(response_calls(records[0])) >= 2
               and len(records) > 1]
    assert len(went_on) >= 10
    for record in went_on:
        tools = [m for m in record["request"]["messages"] if m["role"] == "tool"]
        assert len(tools) >= 2 and {m["tool_call_id"] for m in tools} == {
            c["id"] for c in record["request"]["messages"][2]["tool_calls"]}


@pytest.mark.parametrize("copies", [
    1, pytest.param(3, marks=pytest.mark.slow, id="1000-conversations")])
def test_sigkill_mid_conversations_then_rerun_reaches_the_same_outcomes(tmp_path, tok, copies):
    n_parallel = 35 if copies == 1 else 1000 - 265 * copies
    src = write_conversations(tmp_path / "conversations.jsonl", n_parallel=n_parallel,
                              copies=copies)
    assert len(read_lines(src)) == (300 if copies == 1 else 1000)
    window = 16 if copies == 1 else 32
    config = EmulatorConfig(seed=8, conversations=str(src), divergence_rate=0.25,
                            latency="fixed", latency_mean=0.1,
                            reasoning_tokens_mean=30, content_tokens_mean=20)
    whole, split = tmp_path / "whole", tmp_path / "split"
    with serve_in_thread(config, tok) as emu:
        run_infer(src, whole, emu.openrouter_url, "--model", "moonshotai/kimi-k2.5",
                  "--concurrency", str(window), "--no-stream")
        reference_paid = emu.stats()["chat_requests"]
    with serve_in_thread(config, tok) as emu:
        cmd = [sys.executable, "-m", "specregen.cli", "infer", str(src), "--out", str(split),
               "--base-url", emu.openrouter_url, "--model", "moonshotai/kimi-k2.5",
               "--turns", "all", "--tokenizer", "mini", "--concurrency", str(window),
               "--no-stream"]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and _finals(split) < reference_paid // 3:
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert 0 < _finals(split) < reference_paid, "the kill did not land mid-run"
        second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert second.returncode == 0, second.stderr[-2000:]
        paid = emu.stats()["chat_requests"]
    a, b = finals_by_conversation(whole), finals_by_conversation(split)
    assert sorted(a) == sorted(b)
    for cid in a:
        assert [r["sample_id"] for r in a[cid]] == [r["sample_id"] for r in b[cid]], cid
        assert [r["fingerprint"] for r in a[cid]] == [r["fingerprint"] for r in b[cid]], cid
        assert [response_message(r) for r in a[cid]] == [response_message(r) for r in b[cid]]
    # every request final exactly once, and only what was in flight at the kill paid twice
    ids = [r["sample_id"] for records in b.values() for r in records]
    assert len(ids) == len(set(ids)) == reference_paid
    assert paid - reference_paid <= window, (paid, reference_paid)


def _finals(out: Path) -> int:
    if not out.exists():
        return 0
    return sum(1 for r in RawLog(str(out)).iter_records() if r.get("final"))


def test_qwen3_conversations(tmp_path):
    src = write_conversations(tmp_path / "conversations.jsonl", n_parallel=12, n_glaive=60)
    rows = read_lines(src)
    out = tmp_path / "rawlog"
    config = EmulatorConfig(profile="vllm-hermes", model="Qwen/Qwen3-8B", seed=5,
                            conversations=str(src), divergence_rate=0.25,
                            reasoning_tokens_mean=30, content_tokens_mean=20)
    with serve_in_thread(config, get_tokenizer_qwen3()) as emu:
        result = CliRunner().invoke(app, [
            "infer", str(src), "--out", str(out), "--base-url", emu.url, "--turns", "all",
            "--model", "Qwen/Qwen3-8B", "--dialect", "vllm", "--format", "qwen3",
            "--tokenizer", "mini-qwen3", "--concurrency", "12", "--thinking"])
        assert result.exit_code == 0, result.output
    by = finals_by_conversation(out)
    assert sorted(by) == sorted(rows)
    stops = Counter(check_conversation(rows[cid], by[cid], qwen3=True) for cid in rows)
    assert stops["end"] > 0 and sum(stops.values()) == len(rows)
    requests = [r for records in by.values() for r in records]
    assert any(r["conversation"]["step"] >= 1 for r in requests)
    # Qwen3's switch travelled with every request, and the history carried the reasoning
    # (check_conversation compared it with each answer's)
    assert all(r["request"]["chat_template_kwargs"] == {"enable_thinking": True}
               for r in requests)
    assert any(m.get("reasoning_content") for r in requests for m in r["request"]["messages"]
               if m["role"] == "assistant")


def test_pipeline_inference_stage_runs_conversation_chunks(tmp_path, tok):
    import asyncio

    from specregen.config import parse_config
    from specregen.pipeline.inference import chunk_inferred, infer_chunk
    from specregen.pipeline.layout import DatasetRun
    from specregen.pipeline.prompts import prepare_prompts, read_chunk

    src = write_conversations(tmp_path / "conversations.jsonl", n_parallel=0, n_glaive=40)
    config_emu = EmulatorConfig(seed=2, conversations=str(src), divergence_rate=0.25,
                                reasoning_tokens_mean=30, content_tokens_mean=20)
    with serve_in_thread(config_emu, tok) as emu:
        config = parse_config({
            "storage": str(tmp_path / "store"), "chunk_size": 16,
            "endpoint": {"base_url": emu.openrouter_url, "model": "moonshotai/kimi-k2.5",
                         "concurrency": 8, "stream": False},
            "datasets": [{"name": "B1_glaive", "adapter": "sharegpt", "source": str(GLAIVE),
                          "limit": 40, "turns": "all"}]})
        run = DatasetRun(config, config.datasets[0])
        manifest = prepare_prompts(run)
        assert manifest.counts["prompts"] == 40 and manifest.counts["chunks"] == 3
        rows = read_lines(src)
        for chunk in range(3):
            prompts = read_chunk(run, chunk)
            assert all(p.turns == "all" for p in prompts)
            summary = asyncio.run(infer_chunk(run, chunk, api_key=None))
            assert summary["conversations"] == len(prompts) == summary["prompts"]
            assert sum(summary["conversation_stops"].values()) == len(prompts)
            # the chunk is final: every conversation in it stopped
            assert chunk_inferred(run, chunk) == summary
            by = finals_by_conversation(Path(run.rawlog_url(chunk)))
            assert sorted(by) == sorted(p.sample_id for p in prompts)
            stops = Counter(check_conversation(rows[cid], by[cid]) for cid in by)
            assert dict(stops) == summary["conversation_stops"]
        paid = emu.stats()["chat_requests"]
        again = asyncio.run(infer_chunk(run, 0, api_key=None))
        assert emu.stats()["chat_requests"] == paid and again == chunk_inferred(run, 0)


def test_the_pipeline_checks_the_context_like_infer(tmp_path, tok):
    """`endpoint.max_context_tokens` in a pipeline config: a first request over the limit is
    not sent (the chunk's `rejected`, the run summary's `rejected_requests`), a later one that
    outgrew it stops its conversation with `length`, nothing paid; the oracle is the server's
    own `prompt_tokens` for the same requests sent without a limit."""
    import asyncio

    import numpy as np

    from specregen.config import parse_config
    from specregen.pipeline.inference import infer_chunk
    from specregen.pipeline.layout import DatasetRun
    from specregen.pipeline.prompts import prepare_prompts
    from specregen.pipeline.summary import summarize

    src = write_conversations(tmp_path / "conversations.jsonl", n_parallel=0, n_glaive=40)
    config_emu = EmulatorConfig(seed=4, conversations=str(src), divergence_rate=0.1,
                                reasoning_tokens_mean=30, content_tokens_mean=20)

    def stage(emu, store: str, limit: int | None) -> tuple[DatasetRun, list[dict]]:
        config = parse_config({
            "storage": str(tmp_path / store), "chunk_size": 20,
            "endpoint": {"base_url": emu.openrouter_url, "model": "moonshotai/kimi-k2.5",
                         "concurrency": 8, "stream": False, "sampling": {"max_tokens": 200},
                         "max_context_tokens": limit},
            "datasets": [{"name": "B1_glaive", "adapter": "sharegpt", "source": str(GLAIVE),
                          "limit": 40, "turns": "all"}]})
        run = DatasetRun(config, config.datasets[0])
        prepare_prompts(run)
        return run, [asyncio.run(infer_chunk(run, c, api_key=None)) for c in range(2)]

    def finals(run: DatasetRun) -> list[dict]:
        return [r for c in range(2) for r in RawLog(run.rawlog_url(c)).iter_records()
                if r.get("final")]

    with serve_in_thread(config_emu, tok) as emu:
        free, _ = stage(emu, "free", None)
        sizes = {r["sample_id"]: r["usage"]["prompt_tokens"] for r in finals(free)}
        limit = int(np.percentile(list(sizes.values()), 60)) + 200
        limited, chunks = stage(emu, "limited", limit)
        records = finals(limited)
        refused = [r for r in records if r.get("error_class") == "context_length"]
        assert refused and all("response" not in r and r["http_status"] is None
                               and sizes[r["sample_id"]] + 200 > limit for r in refused)
        assert all(r["usage"]["prompt_tokens"] + 200 <= limit
                   for r in records if r.get("error_class") != "context_length")
        first_over = {sid.split("/t0/")[0] for sid, n in sizes.items()
                      if "/t0/s0" in sid and n + 200 > limit}
        assert first_over and sum(c["rejected"] for c in chunks) == len(first_over)
        assert sum(c["conversation_stops"].get("length", 0) for c in chunks) >= len(
            {r["conversation"]["id"] for r in refused})
        manifest = prepare_prompts(limited)
        assert summarize(limited, manifest, chunks, None, None, 0.0)["rejected_requests"] == \
            len(first_over)
        paid = emu.stats()["chat_requests"]
        assert [asyncio.run(infer_chunk(limited, c, api_key=None)) for c in range(2)] == chunks
        assert emu.stats()["chat_requests"] == paid


def test_a_conversation_that_outgrows_the_context_stops_with_length(tmp_path, tok):
    """`--max-context-tokens`: a later request that no longer fits is not sent; the conversation
    stops with `length` (a final raw-log record, nothing paid), a rerun sends nothing, and the
    samples carry the stop. The oracle is the server's own count: the same requests sent
    without a limit (same seed, same bodies, same answers) report their `prompt_tokens`."""
    import numpy as np
    import pyarrow.parquet as pq

    src = write_conversations(tmp_path / "conversations.jsonl", n_parallel=12, n_glaive=60)
    rows = read_lines(src)
    config = EmulatorConfig(seed=6, conversations=str(src), divergence_rate=0.1,
                            reasoning_tokens_mean=30, content_tokens_mean=20)
    free, limited = tmp_path / "free", tmp_path / "limited"
    common = ("--model", "moonshotai/kimi-k2.5", "--concurrency", "12", "--no-stream",
              "--max-tokens", "200")
    with serve_in_thread(config, tok) as emu:
        run_infer(src, free, emu.openrouter_url, *common)
        sizes = {r["sample_id"]: r["usage"]["prompt_tokens"]
                 for records in finals_by_conversation(free).values() for r in records}
        limit = int(np.percentile(list(sizes.values()), 60)) + 200
        result = CliRunner().invoke(app, [
            "infer", str(src), "--out", str(limited), "--base-url", emu.openrouter_url,
            "--turns", "all", "--tokenizer", "mini", "--max-context-tokens", str(limit),
            *common])
        assert result.exit_code == 0, result.output
        assert "length (cut, or outgrew the context)" in result.output
        by = finals_by_conversation(limited)
        refused = [r for records in by.values() for r in records
                   if r.get("error_class") == "context_length"]
        assert len(refused) >= 5
        for record in refused:
            # never sent, and rightly so by the server's own count of the same request
            assert record["status"] == "failed" and "response" not in record
            assert record["http_status"] is None and record["cost_usd"] is None
            assert sizes[record["sample_id"]] + 200 > limit, record["sample_id"]
            assert by[record["conversation"]["id"]][-1] is record  # the conversation's last
        for records in by.values():
            for record in records:
                if record.get("error_class") != "context_length":
                    assert record["usage"]["prompt_tokens"] + 200 <= limit
                    assert record["usage"]["prompt_tokens"] == sizes[record["sample_id"]]
        # a first request over the limit is a rejected line (nothing ran), not a stop
        first_over = {cid for cid in rows if sizes[f"{cid}/t0/s0"] + 200 > limit}
        assert set(by) == set(rows) - first_over
        outgrown = {r["conversation"]["id"] for r in refused}
        # The rerun reaches the same outcomes and pays nothing.
        paid = emu.stats()["chat_requests"]
        before = len(list(RawLog(str(limited)).iter_records()))
        again = CliRunner().invoke(app, [
            "infer", str(src), "--out", str(limited), "--base-url", emu.openrouter_url,
            "--turns", "all", "--tokenizer", "mini", "--max-context-tokens", str(limit),
            *common])
        assert again.exit_code == 0, again.output
        assert emu.stats()["chat_requests"] == paid
        assert len(list(RawLog(str(limited)).iter_records())) == before
    # The samples: every sample of an outgrown conversation says `length`; none says so
    # otherwise unless an answer was cut.
    tokens = tmp_path / "tokens.parquet"
    result = CliRunner().invoke(app, ["reconstruct", str(limited), "--prompts", str(src),
                                      "--tokenizer", "mini", "--out", str(tokens)])
    assert result.exit_code == 0, result.output
    samples = pq.read_table(tokens, columns=["conversation_id", "stop_reason",
                                             "finish_reason"]).to_pylist()
    assert {s["conversation_id"] for s in samples} >= outgrown
    for sample in samples:
        if sample["conversation_id"] in outgrown:
            assert sample["stop_reason"] == "length"
        elif sample["stop_reason"] == "length":
            assert any(r["response"]["choices"][0]["finish_reason"] == "length"
                       for r in by[sample["conversation_id"]])


def get_tokenizer_qwen3():
    from specregen.models.tokenizer import load_tokenizer

    return load_tokenizer("mini-qwen3")
