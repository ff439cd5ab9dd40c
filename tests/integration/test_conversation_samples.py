"""Whole conversations end to end against the emulator: `specregen infer --turns all`, then
`specregen reconstruct RAWLOG --prompts`, then `specregen gate` (issue 10, items 4 and 5).

The emulator follows the dataset's conversations (or diverges from them, seeded) and returns
the ids it generated and the prompt it rendered (`--return-token-ids`). Those are the truth
here: the raw log is copied without them (as from a provider that returns no ids) before it is
reconstructed, and every sample's prompt must equal the server's prompt of the turn's last
request, and its loss mask must be 1 exactly on the ids the server says the model generated
in that turn, answer after answer -- unless the server rendered an earlier answer otherwise,
which is then flagged `history_rerendered`.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specregen.cli import app
from specregen.emulator.config import EmulatorConfig
from specregen.emulator.server import serve_in_thread
from specregen.models.tokenizer import load_tokenizer
from specregen.store.rawlog import RawLog
from specregen.store.token_samples import read_token_samples
from tests.support import strip_server_ids

pytestmark = pytest.mark.integration

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


def call(call_id: str, city: str) -> dict:
    return {"id": call_id, "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}


def conversations(n: int) -> list[dict]:
    """Two user turns each: a call, its result, an answer; then two parallel calls."""
    out = []
    for i in range(n):
        out.append({"sample_id": f"conv{i}", "tools": [WEATHER], "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": f"What is the weather in Paris, day {i}?"},
            {"role": "assistant", "content": "", "tool_calls": [call("a", "Paris")]},
            {"role": "tool", "tool_call_id": "a", "content": "18C"},
            {"role": "assistant", "content": "It is 18C."},
            {"role": "user", "content": "And the weather in Rome and Oslo?"},
            {"role": "assistant", "content": "", "tool_calls": [call("b", "Rome"),
                                                                call("c", "Oslo")]},
            {"role": "tool", "tool_call_id": "b", "content": "25C"},
            {"role": "tool", "tool_call_id": "c", "content": "5C"},
            {"role": "assistant", "content": "25C and 5C."}]})
    return out


def run(tmp_path: Path, config: EmulatorConfig, tokenizer: str, *infer_args: str,
        n: int = 8, blind: bool = True) -> tuple[list, dict[str, dict], Path]:
    """infer against the emulator, strip the truth from the raw log (unless not `blind`),
    reconstruct; returns the samples, the truth (final records by request id) and the token
    file."""
    prompts = tmp_path / "conversations.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in conversations(n)))
    config = EmulatorConfig(**{**config.__dict__, "conversations": str(prompts)})
    raw = tmp_path / "raw"
    model = "qwen/qwen3-8b" if tokenizer == "mini-qwen3" else "moonshotai/kimi-k2.5"
    profile = tmp_path / "profile.json"
    dialect = {"openrouter": "openrouter", "vllm-hermes": "vllm"}.get(config.profile,
                                                                       config.profile[:6])
    with serve_in_thread(config, load_tokenizer(tokenizer)) as emu:
        url = emu.openrouter_url if config.profile == "openrouter" else emu.url
        # What a pipeline run has: the endpoint probe's findings (the provider's parsers and
        # detokenizer), for reconstruction below.
        endpoint = tmp_path / "endpoint.json"
        endpoint.write_text(json.dumps({"stream": "--no-stream" not in infer_args}))
        probed = CliRunner().invoke(app, [
            "probe", "--out", str(profile), "--base-url", url, "--model", model,
            "--dialect", dialect, "--tokenizer", tokenizer, "--requests", "2",
            "--config", str(endpoint)])
        assert probed.exit_code == 0, probed.output
        result = CliRunner().invoke(app, [
            "infer", str(prompts), "--out", str(raw), "--base-url", url, "--model", model,
            "--dialect", dialect, "--turns", "all", "--return-token-ids", "--concurrency", "4",
            "--tokenizer", tokenizer, *infer_args])
    assert result.exit_code == 0, result.output
    truth = {r["sample_id"]: r for r in RawLog(str(raw)).iter_records() if r.get("final")}
    source = raw
    if blind:
        source = strip_server_ids(raw, tmp_path / "blind")
    tokens = tmp_path / "tokens.parquet"
    result = CliRunner().invoke(app, ["reconstruct", str(source), "--tokenizer", tokenizer,
                                      "--out", str(tokens), "--prompts", str(prompts),
                                      "--provider-profile", str(profile)])
    assert result.exit_code == 0, result.output
    return list(read_token_samples(tokens)), truth, tokens


def turn_records(truth: dict[str, dict], sample) -> list[dict]:
    """The final records of the sample's user turn, in step order."""
    prefix = f"{sample.sample_id}/s"
    steps = sorted(int(rid[len(prefix):]) for rid in truth if rid.startswith(prefix))
    return [truth[f"{prefix}{j}"] for j in steps]


def mask_runs(sample) -> list[list[int]]:
    runs, start = [], None
    for i, bit in enumerate([*sample.loss_mask, 0]):
        if bit and start is None:
            start = i
        elif not bit and start is not None:
            runs.append(sample.input_ids[start:i])
            start = None
    return runs


def generated(record: dict, stop_id: int) -> list[int]:
    """The ids the server says the model generated, with its stop id (servers differ on
    returning it; the model always wrote it when it stopped)."""
    ids = list(record["reference_completion_ids"])
    finish = record["response"]["choices"][0]["finish_reason"]
    return ids if ids[-1:] == [stop_id] or finish == "length" else [*ids, stop_id]


def assert_masks_are_the_generated_ids(samples, truth, stop_id, *, rerendered=()):
    for sample in samples:
        records = turn_records(truth, sample)
        last = records[-1]
        # The prompt is the server's prompt of the turn's last request; its count is usage's.
        assert sample.input_ids[: sample.prompt_len] == last["prompt_token_ids"], \
            sample.sample_id
        assert sample.usage_prompt_delta == 0
        expected = [generated(r, stop_id) for r in records]
        if sample.sample_id in rerendered:
            assert "history_rerendered" in sample.flags and sample.status == "flagged"
            expected = expected[-1:]
        else:
            assert "history_rerendered" not in sample.flags, sample.sample_id
        assert mask_runs(sample) == expected, sample.sample_id


@pytest.mark.parametrize("profile", ["openrouter", "vllm", "sglang"])
def test_k25_conversations_mask_exactly_what_the_model_generated(tmp_path, profile):
    samples, truth, tokens = run(tmp_path, EmulatorConfig(profile=profile, seed=5,
                                                          divergence_rate=0.3), "mini")
    stop_id = load_tokenizer("mini").added_tokens["<|im_end|>"]
    assert_masks_are_the_generated_ids(samples, truth, stop_id)
    assert all(s.status == "ok" for s in samples), [(s.sample_id, s.flags) for s in samples]
    # One sample per user turn reached, in prompt order; both outcomes occur.
    ids = [s.sample_id for s in samples]
    assert ids == sorted(ids, key=lambda x: (int(x[4:].split("/")[0]), x))
    stops = Counter(s.stop_reason for s in samples if s.user_turn == 0)
    assert stops["end"] and sum(stops.values()) > stops["end"], stops
    assert {s.stop_reason for s in samples} <= {"end", "calls_differ", "length", "error",
                                                "model_called_dataset_answered",
                                                "model_answered_dataset_called"}
    assert any(sum(s.loss_mask) > s.completion_len for s in samples)  # tool loops masked

    # The gate passes them and its report says how the conversations ended.
    out = tmp_path / "gate"
    result = CliRunner().invoke(app, ["gate", str(tokens), "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    conv = report["conversations"]
    ended = {s.conversation_id: s.stop_reason for s in samples}
    assert conv["conversations"] == len(ended) == 8
    assert conv["by_stop_reason"] == dict(Counter(ended.values()))
    assert conv["ended"] == list(ended.values()).count("end")
    turns = Counter(1 + max(s.user_turn for s in samples if s.conversation_id == c)
                    for c in ended)
    assert conv["user_turns"] == {str(k): v for k, v in sorted(turns.items())}
    assert "Conversations by how they ended" in (out / "report.html").read_text()


def test_sglang_renumbered_history_ids_never_pass_as_trusted(tmp_path):
    # Non-streamed, SGLang rebuilds ids as functions.NAME:{history + the model's index}: from
    # the second user turn on, the ids it returns -- and the next request's history -- are not
    # what the model wrote. Without the probe's finding that the provider renumbers, the answer
    # is flagged itself (`tool_id_index_unexpected`); with it, the answer's ids are undone and
    # the history no longer matches (`history_rerendered`, tests/unit/
    # test_conversation_samples.py). Either way no turn-1 sample is trusted.
    config = EmulatorConfig(profile="sglang", seed=5, divergence_rate=0.0)
    samples, truth, _ = run(tmp_path, config, "mini", "--no-stream", n=3)
    assert [s.sample_id for s in samples] == [f"conv{i}/t{k}" for i in range(3)
                                              for k in range(2)]
    assert {s.sample_id: s.status for s in samples} == {
        f"conv{i}/t{k}": "flagged" if k else "ok" for i in range(3) for k in range(2)}
    stop_id = load_tokenizer("mini").added_tokens["<|im_end|>"]
    assert_masks_are_the_generated_ids([s for s in samples if s.user_turn == 0], truth, stop_id)


@pytest.mark.parametrize("stream", ["--stream", "--no-stream"])
def test_qwen3_conversations_mask_exactly_what_the_model_generated(tmp_path, stream):
    # (Streamed, vLLM's qwen3 parser sends the reasoning of a tool loop's later answers as
    # content -- the prompt's last think block is closed -- which reconstruction reads back.)
    config = EmulatorConfig(profile="vllm-hermes", format="qwen3", model="qwen/qwen3-8b",
                            seed=5, divergence_rate=0.3)
    samples, truth, _ = run(tmp_path, config, "mini-qwen3", stream)
    stop_id = load_tokenizer("mini-qwen3").added_tokens["<|im_end|>"]
    assert_masks_are_the_generated_ids(samples, truth, stop_id)
    assert any(sum(s.loss_mask) > s.completion_len for s in samples)
    assert all(s.status == "ok" for s in samples), [(s.sample_id, s.flags) for s in samples]


def test_reconstruct_asks_for_the_prompts_of_a_conversation_log(tmp_path):
    config = EmulatorConfig(profile="openrouter", seed=5, divergence_rate=0.0)
    run(tmp_path, config, "mini", n=1)
    result = CliRunner().invoke(app, ["reconstruct", str(tmp_path / "raw"), "--tokenizer",
                                      "mini", "--out", str(tmp_path / "t.parquet")])
    assert result.exit_code == 2
    assert "1 whole conversation(s)" in result.output and "--prompts" in result.output
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({**conversations(2)[1], "turns": "all"}) + "\n")
    result = CliRunner().invoke(app, ["reconstruct", str(tmp_path / "raw"), "--tokenizer",
                                      "mini", "--out", str(tmp_path / "t.parquet"),
                                      "--prompts", str(other)], terminal_width=200)
    assert result.exit_code == 2
    assert "has no line for conversation(s) 'conv0'" in result.output
    assert not (tmp_path / "t.parquet").exists()


def test_pipeline_builds_conversation_samples_gates_and_publishes_them(tmp_path, monkeypatch):
    """A `messages` dataset with `turns: all` through the library chain: the reconstruct
    stage writes one sample per user turn at its conversation's place, masks exactly on the
    emulator's generated ids; the gate reports the conversations; the export keeps the masks."""
    import asyncio

    import yaml

    from specregen.config import load_config
    from specregen.pipeline.layout import DatasetRun
    from specregen.pipeline.run import run_dataset
    from specregen.sources import read_source
    from specregen.store.fs import Store

    rows = [{"id": p["sample_id"], "messages": p["messages"], "tools": p["tools"]}
            for p in conversations(6)]
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # The emulator knows the conversations as the adapter gives them (the same first users).
    book = tmp_path / "book.jsonl"
    book.write_text("".join(
        json.dumps({"sample_id": p.sample_id, "messages": p.messages, "tools": p.tools,
                    "turns": "all"}) + "\n"
        for p in read_source("messages", str(source), dataset="D", turns="all")))
    config = EmulatorConfig(profile="openrouter", seed=5, divergence_rate=0.3,
                            conversations=str(book))
    with serve_in_thread(config, load_tokenizer("mini")) as emu:
        (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump({
            "storage": str(tmp_path / "store"), "tokenizer": "mini", "chunk_size": 4,
            "export_specforge": True,
            "endpoint": {"base_url": emu.openrouter_url, "model": "moonshotai/kimi-k2.5",
                         "dialect": "openrouter", "api_key_env": "SPECREGEN_DEMO_KEY",
                         "return_token_ids": True, "concurrency": 4},
            "datasets": [{"name": "D", "adapter": "messages", "source": str(source),
                          "turns": "all", "gate": {"max_quarantine_share": 0.5}}]}))
        monkeypatch.setenv("SPECREGEN_DEMO_KEY", "sk-test")
        pipeline = load_config(tmp_path / "pipeline.yaml")
        run = DatasetRun(pipeline, pipeline.datasets[0])
        result = asyncio.run(run_dataset(run, None))
    assert result.outcome == "published", result.summary
    # (The probe's traits enter the later fingerprints: one folder per stage here.)
    dataset_dir = Path(Store(pipeline.storage).path(run.name))
    files = sorted(dataset_dir.glob("reconstruct/*/*.parquet"))
    samples = [s for f in files for s in read_token_samples(f)]
    cids = [p.sample_id for p in read_source("messages", str(source), dataset="D",
                                             turns="all")]
    # Prompt order, turns in order, one sample per user turn reached.
    assert [s.conversation_id for s in samples] == sorted(
        (s.conversation_id for s in samples), key=cids.index)
    assert all(s.sample_id == f"{s.conversation_id}/t{s.user_turn}" for s in samples)
    truth = {}
    for chunk in (dataset_dir / "rawlog").iterdir():
        truth.update({r["sample_id"]: r for r in RawLog(str(chunk)).iter_records()
                      if r.get("final")})
    stop_id = load_tokenizer("mini").added_tokens["<|im_end|>"]
    assert_masks_are_the_generated_ids(samples, truth, stop_id)
    (report_file,) = dataset_dir.glob("gate/*/report.json")
    report = json.loads(report_file.read_text())
    assert report["conversations"]["conversations"] == len(cids) == 6
    assert report["conversations"]["samples"] == len(samples)
    # The published trainer rows keep the masks of the conversation samples.
    (train,) = dataset_dir.glob("published/*/train.jsonl")
    rows = {row["id"]: row for row in map(json.loads, train.read_text().splitlines())}
    assert rows and all(rows[s.sample_id]["loss_mask"] == s.loss_mask
                        for s in samples if s.sample_id in rows)
    assert {(r["metadata"]["conversation_id"], r["metadata"]["user_turn"]) for r in
            rows.values()} <= {(s.conversation_id, s.user_turn) for s in samples}
    # The same inputs give the same bytes: a chunk reconstructed again is identical.
    from specregen.pipeline.probing import with_stored_traits
    from specregen.pipeline.reconstruction import reconstruct_chunk

    first = files[0].read_bytes()
    files[0].unlink()
    files[0].with_suffix(".json").unlink()
    reconstruct_chunk(with_stored_traits(run), 0)
    assert files[0].read_bytes() == first
