"""The ChatFormat registry, and the whole reconstruct -> gate chain through it for Qwen3.

The Qwen3 answers are written by `served.model_ids` (segment by segment, independently of the
format's assembly), returned the way vLLM's qwen3 + hermes parsers return them (plain and
streamed), with the prompt vLLM renders through the Jinja template in transformers; the
generic `reconstruct` must rebuild both id lists exactly, and the gate must accept the samples.
"""

from __future__ import annotations

import json
import random

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from specregen.cli import app
from specregen.gate import GateConfig, check_sample
from specregen.models.chat_format import ChatFormat
from specregen.models.qwen3 import MINI_QWEN3_TOKENIZER_DIR
from specregen.models.qwen3 import served as qserved
from specregen.models.qwen3 import vllm_legacy as vl
from specregen.models.registry import (
    UnknownFormatError,
    canonical_name,
    format_for_model,
    format_source_files,
    get_format,
)
from specregen.models.tokenizer import load_tokenizer
from specregen.reconstruct import reconstruct
from specregen.store.token_samples import read_token_meta

TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
         for n in ("get_weather", "search_files")]
WORDS = ("alpha", "Paris", "résumé", "数据", "x = 1;", "{ok}", "a\nb", "end.", "emoji 🙂",
         "tab\tx", "quote \"q\"")


@pytest.fixture(scope="module")
def qwen():
    return get_format("qwen3", load_tokenizer("mini-qwen3"))


def test_registry_finds_formats_by_name_alias_and_model():
    assert canonical_name("kimi-k25") == "kimi-k2.5"
    assert canonical_name("QWEN3") == "qwen3"
    assert format_for_model("moonshotai/kimi-k2.5") == "kimi-k2.5"
    assert format_for_model("Qwen/Qwen3-8B") == "qwen3"
    assert format_for_model("qwen/qwen3-235b-a22b-2507") == "qwen3"
    with pytest.raises(UnknownFormatError, match=r"'gpt-4o'.*kimi-k2\.5, qwen3"):
        format_for_model("gpt-4o")
    with pytest.raises(UnknownFormatError, match="unknown chat format 'llama'"):
        get_format("llama", load_tokenizer("mini"))


def test_each_format_is_a_chat_format_and_fingerprints_only_its_own_files(qwen):
    kimi = get_format("kimi-k2.5", load_tokenizer("mini"))
    assert isinstance(kimi, ChatFormat) and isinstance(qwen, ChatFormat)
    kimi_files = {p.name for p in format_source_files("kimi-k2.5")}
    qwen_files = {str(p) for p in format_source_files("qwen3")}
    assert "readings.py" in kimi_files and not any("qwen" in f for f in kimi_files)
    assert all("/qwen3/" in f for f in qwen_files) and any(f.endswith(".jinja")
                                                            for f in qwen_files)
    assert kimi.thinking_requested({"chat_template_kwargs": {"thinking": False}}) is False
    assert qwen.thinking_requested({"chat_template_kwargs": {"thinking": False}}) is None
    assert qwen.thinking_requested({"chat_template_kwargs": {"enable_thinking": False}}) is False
    assert qwen.thinking_requested({"reasoning": {"effort": "none"}}) is False


def test_qwen3_option_refused():
    with pytest.raises(ValueError, match="takes no options"):
        get_format("qwen3", load_tokenizer("mini-qwen3"), tools_format="json")


def test_byte_level_decode_bytes_rejoins_split_characters():
    tok = load_tokenizer("mini-qwen3")
    text = "emoji 🙂 数据 <think>x</think> tab\t\n é"
    ids = tok.encode_ordinary(text)
    pieces = [tok.decode_bytes([i]) for i in ids]
    assert b"".join(pieces).decode("utf-8") == text
    # Some token holds part of a character: per-token text decoding would have lost it.
    assert any(not _is_utf8(p) for p in pieces)


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _answer(rng: random.Random):
    thinking = rng.random() < 0.6
    tools = rng.random() < 0.7
    content = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 5)))
    if tools and rng.random() < 0.6:
        content = "" if rng.random() < 0.5 else content
        calls = [(rng.choice(TOOLS)["function"]["name"],
                  json.dumps({"q": rng.choice(WORDS), "n": rng.randint(0, 99)},
                             ensure_ascii=False))
                 for _ in range(rng.randint(1, 3))]
    else:
        calls = []
    reasoning = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6))) if thinking \
        else None
    return reasoning, content, calls, tools


def _served(fmt, request, truth, stream):
    """The response body a vLLM server with the qwen3 + hermes parsers sends for `truth`."""
    prompt = vl.encode_prompt(request, fmt.tok)
    out = vl.decode_output(truth, fmt.tok, truncated=False)
    parsed = vl.parse(out, request, vl.MarkerIds.of(fmt.tok), stream=stream, prompt_ids=prompt)
    message = {"role": "assistant", "content": parsed.content, "reasoning": parsed.reasoning}
    if parsed.calls:
        message["tool_calls"] = [
            {"id": f"chatcmpl-tool-{k:032x}", "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}}
            for k, c in enumerate(parsed.calls)]
    response = {"choices": [{"index": 0, "message": message,
                             "finish_reason": parsed.finish_reason}],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(truth)}}
    return prompt, response


def _requests(n: int, seed: int):
    rng = random.Random(seed)
    for k in range(n):
        reasoning, content, calls, tools = _answer(rng)
        request = {"model": "Qwen/Qwen3-8B",
                   "messages": [{"role": "user", "content": f"question {k}"}]}
        if tools:
            request["tools"] = TOOLS
        if reasoning is None:
            request["chat_template_kwargs"] = {"enable_thinking": False}
        yield k, request, (reasoning, content, calls)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_qwen3_vllm_hermes_answers_reconstruct_exactly_and_pass_the_gate(qwen, stream):
    with_calls = 0
    for k, request, (reasoning, content, calls) in _requests(60, seed=3 + stream):
        request = {**request, "stream": stream}
        truth = qserved.model_ids(qwen.tok, reasoning=reasoning, content=content, calls=calls)
        prompt, response = _served(qwen, request, truth, stream)
        with_calls += bool(calls)
        for reference in (truth, None):
            sample = reconstruct(f"s{k}", request, response, qwen,
                                 reference_completion_ids=reference)
            assert sample.input_ids == prompt + truth, (k, sample.flags)
            assert sample.reference_match == ("exact" if reference else None)
            # Streamed, where content stood among the calls is not known without the ids.
            sent = response["choices"][0]["message"]
            doubt = stream and reference is None and bool(calls and sent["content"])
            assert sample.flags == (["reading_ambiguous"] if doubt else []) or \
                set(sample.flags) <= {"arguments_canonical_assumed",
                                      "content_whitespace_guessed"}, (k, sample.flags)
            assert sample.status == ("flagged" if doubt else "ok"), (k, sample.flags)
            if not doubt:
                decision = check_sample(sample, qwen, GateConfig())
                assert decision.accepted, (k, decision.reason_strings())
    assert with_calls >= 10


def test_gate_quarantines_a_qwen3_call_the_ids_do_not_hold(qwen):
    request = {"model": "Qwen/Qwen3-8B", "tools": TOOLS,
               "messages": [{"role": "user", "content": "q"}]}
    truth = qserved.model_ids(qwen.tok, reasoning="r", content="",
                         calls=[("get_weather", '{"q": "Paris"}')])
    _, response = _served(qwen, request, truth, stream=False)
    sample = reconstruct("s", request, response, qwen, reference_completion_ids=truth)
    assert check_sample(sample, qwen, GateConfig()).accepted
    # The API said another argument value than the ids hold: the round trip must see it.
    sample.api_tool_calls[0] = type(sample.api_tool_calls[0])("", "get_weather",
                                                              '{"q": "Rome"}')
    reasons = check_sample(sample, qwen, GateConfig()).reason_strings()
    assert any(r.startswith("round_trip: call 0: arguments differ") for r in reasons), reasons


def test_cli_reconstruct_picks_qwen3_from_the_model_and_the_gate_reads_it(qwen, tmp_path):
    lines = []
    truths = {}
    for k, request, (reasoning, content, calls) in _requests(12, seed=9):
        truth = qserved.model_ids(qwen.tok, reasoning=reasoning, content=content, calls=calls)
        prompt, response = _served(qwen, request, truth, stream=False)
        truths[f"s{k}"] = prompt + truth
        lines.append(json.dumps({"sample_id": f"s{k}", "request": request,
                                 "response": response}, ensure_ascii=False))
    samples = tmp_path / "samples.jsonl"
    samples.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "tokens.parquet"
    runner = CliRunner()
    result = runner.invoke(app, ["reconstruct", str(samples), "--tokenizer",
                                 str(MINI_QWEN3_TOKENIZER_DIR), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert read_token_meta(out).format["name"] == "qwen3"
    table = pq.read_table(out).to_pylist()
    assert {r["sample_id"]: r["input_ids"] for r in table} == truths
    gate = runner.invoke(app, ["gate", str(out), "--out", str(tmp_path / "gate")])
    assert gate.exit_code == 0, gate.output
    # An explicit --format wins over the model; a Kimi tokenizer cannot serve Qwen3.
    bad = runner.invoke(app, ["reconstruct", str(samples), "--tokenizer", "mini", "--format",
                              "qwen3", "--out", str(tmp_path / "x.parquet")])
    assert bad.exit_code == 2 and "which Qwen3" in bad.output


def test_the_config_format_reaches_requests_fingerprints_and_the_probe(tmp_path):
    from specregen.client.request import build_request
    from specregen.config import ConfigError, parse_config
    from specregen.models.registry import reads_provider_traits
    from specregen.pipeline.layout import DatasetRun, reconstruction_code_fingerprint
    from specregen.records import Prompt

    def config(**top):
        return parse_config({
            "storage": str(tmp_path), "tokenizer": "mini-qwen3", **top,
            "endpoint": {"base_url": "http://127.0.0.1:9/v1", "model": "served-model",
                         "dialect": "vllm", "thinking": False},
            "datasets": [{"name": "d", "adapter": "magicoder", "source": "bundled:B3_magicoder"}],
        })

    qwen_cfg, kimi_cfg = config(format="qwen3"), config(format="kimi-k2.5")
    assert qwen_cfg.format_name == "qwen3" and qwen_cfg.endpoint.format == "qwen3"
    assert kimi_cfg.format_name == "kimi-k2.5"
    # A served name no format claims (vLLM's --served-model-name): the config must say which
    # format, rather than reconstruct with another family's.
    with pytest.raises(ConfigError, match=r"no chat format is known for model 'served-model'"
                                          r".*`format:`"):
        config()
    prompt = Prompt(sample_id="s", messages=[{"role": "user", "content": "hi"}], tools=None,
                    tool_mode="tools", meta={})
    assert build_request(prompt, qwen_cfg.endpoint)["chat_template_kwargs"] == {
        "enable_thinking": False}
    assert build_request(prompt, kimi_cfg.endpoint)["chat_template_kwargs"] == {
        "thinking": False}
    # Only the chosen format's code is in the reconstruct fingerprint.
    assert reconstruction_code_fingerprint("qwen3") != reconstruction_code_fingerprint(
        "kimi-k2.5")
    runs = [DatasetRun(c, c.datasets[0]) for c in (qwen_cfg, kimi_cfg)]
    assert runs[0].reconstruct_fp != runs[1].reconstruct_fp
    # Both read the probe's traits (Qwen3: the stop-token count and the strip finding).
    assert reads_provider_traits("qwen3") and reads_provider_traits("kimi-k2.5")
    with pytest.raises(ConfigError, match="unknown chat format 'llama3'"):
        config(format="llama3")
