"""The inspector, the report and the probe name no family: they read a format's layout tokens
(`ChatFormat.markers`) and probe rules, so a Qwen3 sample is laid out by Qwen3's tokens and a
format without probe rules is refused before anything is sent."""

from __future__ import annotations

import asyncio
import json

import pytest

from specregen.client.config import EndpointConfig
from specregen.inspect.view import build_view
from specregen.models.chat_format import ChatFormat, CompletionMarkers
from specregen.models.kimi_k25.probe import RULES as KIMI_RULES
from specregen.models.probe_rules import ProbeRules
from specregen.models.qwen3 import served as qserved
from specregen.models.qwen3 import vllm_legacy as vl
from specregen.models.registry import get_format, probe_rules
from specregen.models.tokenizer import load_tokenizer
from specregen.probe.run import run_scenarios
from specregen.probe.scenarios import ProbeSetupError, build_scenarios
from specregen.reconstruct import reconstruct
from specregen.report.stats import DatasetStats
from specregen.store.token_samples import token_file_meta, write_token_samples

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def qwen() -> ChatFormat:
    return get_format("qwen3", load_tokenizer("mini-qwen3"))


def qwen_sample(fmt, sample_id, *, reasoning, content, calls):
    """A Qwen3 answer as a vLLM hermes server returns it, reconstructed (exact by its ids)."""
    request = {"model": "Qwen/Qwen3-8B", "messages": [{"role": "user", "content": "Paris?"}],
               "tools": TOOLS}
    if reasoning is None:
        request["chat_template_kwargs"] = {"enable_thinking": False}
    truth = qserved.model_ids(fmt.tok, reasoning=reasoning, content=content, calls=calls)
    prompt = vl.encode_prompt(request, fmt.tok)
    parsed = vl.parse(vl.decode_output(truth, fmt.tok, truncated=False), request,
                      vl.MarkerIds.of(fmt.tok), stream=False, prompt_ids=prompt)
    message = {"role": "assistant", "content": parsed.content, "reasoning": parsed.reasoning}
    if parsed.calls:
        message["tool_calls"] = [{"id": f"chatcmpl-tool-{k:032x}", "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}}
                                 for k, c in enumerate(parsed.calls)]
    response = {"choices": [{"index": 0, "message": message,
                             "finish_reason": parsed.finish_reason}],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(truth)}}
    sample = reconstruct(sample_id, request, response, fmt, reference_completion_ids=truth)
    assert sample.input_ids[sample.prompt_len:] == truth, sample.flags
    return sample


def text_of(view, part, call=None) -> str:
    return "".join(t.text for t in view.completion
                   if t.part == part and (call is None or t.call == call) and t.special is None)


def test_both_formats_name_their_layout_tokens(qwen):
    from specregen.models.kimi_k25 import KimiK25

    assert isinstance(KimiK25.markers, CompletionMarkers)
    # Qwen3 has no section: the first call's own opener starts the calls, and a call's body
    # (name and arguments, one JSON object) has no separate id part.
    assert qwen.markers.names() == ("</think>", "<tool_call>", "</tool_call>", "<|im_end|>")
    assert (qwen.markers.calls_end, qwen.markers.arguments_begin) == (None, None)


def test_a_qwen3_sample_is_laid_out_by_qwen3_tokens(qwen):
    sample = qwen_sample(qwen, "q", reasoning="Use the tool.", content="Checking.",
                         calls=[("get_weather", '{"city": "Paris"}'),
                                ("get_weather", '{"city": "Lima"}')])
    view = build_view(sample, qwen.tok, markers=qwen.markers)
    # Hand-checked against the template: `<think>\nR\n</think>\n\nC\n<tool_call>\n{...}\n
    # </tool_call>\n<tool_call>\n{...}\n</tool_call><|im_end|>`.
    assert text_of(view, "reasoning") == "\nUse the tool.\n"
    assert text_of(view, "content") == "\n\nChecking.\n"
    assert text_of(view, "tool_arguments", 0) == (
        '\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n')
    assert text_of(view, "tool_arguments", 1) == (
        '\n{"name": "get_weather", "arguments": {"city": "Lima"}}\n')
    assert text_of(view, "tool_markers") == "\n"  # between the two calls
    names = [(t.special, t.part, t.call) for t in view.completion if t.special]
    # A call's opener and closer belong to it (as K2.5's call markers do).
    assert names == [("<think>", "reasoning", None), ("</think>", "reasoning", None),
                     ("<tool_call>", "tool_markers", 0), ("</tool_call>", "tool_markers", 0),
                     ("<tool_call>", "tool_markers", 1), ("</tool_call>", "tool_markers", 1),
                     ("<|im_end|>", "end", None)]
    assert view.line_breaks == frozenset({"<|im_end|>"})
    assert view.literal == set()


def test_the_report_splits_qwen3_lengths_by_the_format_the_shard_records(qwen, tmp_path):
    samples = [
        qwen_sample(qwen, "a", reasoning="Think.", content="Sure.",
                    calls=[("get_weather", '{"city": "Oslo"}')]),
        qwen_sample(qwen, "b", reasoning=None, content="Sunny in Oslo.", calls=[]),
        qwen_sample(qwen, "c", reasoning="Think more.", content="", calls=[]),
    ]
    path = tmp_path / "shard.parquet"
    write_token_samples(samples, path, token_file_meta(qwen, "mini-qwen3"))
    stats = DatasetStats()
    stats.add_shard(path, "accepted", qwen.tok, "shard")  # no markers: read from the shard
    got = [tuple(int(x) for x in row) for row in zip(
        stats.length_array("reasoning"), stats.length_array("content"),
        stats.length_array("tool_section"), strict=True)]
    for sample, (reasoning, content, calls) in zip(samples, got, strict=True):
        view = build_view(sample, qwen.tok, markers=qwen.markers)
        parts = [t.part for t in view.completion]
        # The report counts the reasoning without its end token; the walk shows it last.
        assert reasoning == parts.count("reasoning") - ("</think>" in
                                                        [t.special for t in view.completion])
        assert content == parts.count("content")
        assert calls == sum(p.startswith("tool_") for p in parts)
    assert got[1][0] == 0 and got[1][2] == 0  # thinking off, no call
    assert got[0][2] > 0 and got[2][2] == 0


def test_the_report_names_a_shard_whose_format_it_cannot_load(tmp_path):
    from specregen.report.stats import ReportError

    kimi = get_format("kimi-k2.5", load_tokenizer("mini"))
    fmt = get_format("qwen3", load_tokenizer("mini-qwen3"))
    sample = qwen_sample(fmt, "a", reasoning=None, content="Hi.", calls=[])
    path = tmp_path / "shard.parquet"
    write_token_samples([sample], path, token_file_meta(fmt, "mini-qwen3"))
    with pytest.raises(ReportError, match="shard-x"):
        DatasetStats().add_shard(path, "accepted", kimi.tok, "shard-x")


def test_each_format_names_its_bundled_tokenizer():
    from specregen.models.registry import bundled_tokenizer, format_names

    for name in format_names():
        alias = bundled_tokenizer(name)
        assert alias is not None
        get_format(name, load_tokenizer(alias))  # it holds every token the format needs


def test_infer_counts_with_its_own_formats_tokenizer_variable_only(monkeypatch):
    from specregen.client.preflight import context_check
    from specregen.errors import UsageError
    from specregen.models.registry import tokenizer_env

    variable = tokenizer_env("kimi-k2.5")
    assert variable and tokenizer_env("qwen3") is None
    monkeypatch.setenv(variable, "mini")
    kimi = EndpointConfig(base_url="http://127.0.0.1:9", model="moonshotai/kimi-k2.5")
    assert context_check(kimi, None, 2000) is not None  # counted with the variable's tokenizer
    # A Qwen3 run never counts with the K2.5 tokenizer the variable names.
    qwen3 = EndpointConfig(base_url="http://127.0.0.1:9", model="Qwen/Qwen3-8B")
    with pytest.raises(UsageError) as refused:
        context_check(qwen3, None, 2000)
    assert variable not in (refused.value.hint or "")
    assert context_check(qwen3, "mini-qwen3", 2000) is not None


def test_probe_rules_come_from_the_format(qwen):
    kimi = probe_rules("kimi-k2.5")
    assert isinstance(kimi, ProbeRules)
    assert kimi.id_form == "functions.NAME:IDX"
    # Qwen3's model writes no ids: the servers' are the form (models/qwen3/probe.py).
    qwen3 = probe_rules("qwen3")
    assert isinstance(qwen3, ProbeRules)
    assert (qwen3.id_form, qwen3.placeholder) == ("server", None)


def test_a_format_without_probe_rules_is_refused_before_any_request(monkeypatch):
    import dataclasses

    from specregen.models import registry

    # A family whose descriptor has no `make_probe_rules` (every registered one has today).
    module = "specregen.models.qwen3.family"
    bare = dataclasses.replace(registry.family("qwen3"), make_probe_rules=None)
    monkeypatch.setitem(registry._loaded, module, bare)
    assert probe_rules("qwen3") is None
    cfg = EndpointConfig(base_url="http://127.0.0.1:9", model="Qwen/Qwen3-8B")
    assert cfg.format_name == "qwen3"
    with pytest.raises(ProbeSetupError, match="qwen3 format has no endpoint probe"):
        # Port 9 on loopback: a request would fail; the refusal comes first.
        asyncio.run(run_scenarios(cfg, None, build_scenarios(1, rules=KIMI_RULES)))


def test_the_inspector_reads_the_format_the_file_records(qwen, tmp_path):
    from specregen.cli.inspect import _run
    from specregen.inspect.source import Selection

    sample = qwen_sample(qwen, "a", reasoning="Hm.", content="Ok.",
                         calls=[("get_weather", json.dumps({"city": "Rome"}))])
    path = tmp_path / "tokens.parquet"
    write_token_samples([sample], path, token_file_meta(qwen, "mini-qwen3"))
    page = tmp_path / "page.html"
    assert _run(path, Selection(), page, None, None, None, False) == 1
    assert "tool-call arguments" in page.read_text(encoding="utf-8")
