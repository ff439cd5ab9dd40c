"""Qwen3's probe rules (`models/qwen3/probe.py`) and what the probe reads with them, without a
server: raw `<tool_call>` text, server-made ids, the model's own arguments, and whether the
provider strips the text before the calls (SGLang) or returns it as written (vLLM)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from specregen.models.kimi_k25.probe import RULES as KIMI_RULES
from specregen.models.probe_rules import ProbeRules
from specregen.models.qwen3 import Qwen3
from specregen.models.qwen3.probe import RULES, Qwen3ProbeRules
from specregen.models.registry import get_format, probe_rules, reads_provider_traits
from specregen.models.tokenizer import load_tokenizer
from specregen.probe.classify import (
    classify_calls,
    compare_with_raw,
    id_form_of,
    observation_recoverable,
    observe,
    summarize,
)
from specregen.probe.model import ScenarioResult
from specregen.probe.notes import finding_notes, profile_notes
from specregen.probe.scenarios import WEATHER_TOOL
from specregen.probe.traits import infer_findings
from specregen.records import ToolCall
from specregen.wire.response import normalize_response

STRIPS = "strips_content_beside_calls"  # the family's trait

ARGS = {"city": "Paris"}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
VLLM_ID = "chatcmpl-tool-" + "ab" * 16
SGLANG_ID = "call_" + "c" * 24
MESSAGES = [{"role": "user", "content": "What's the weather in Paris right now? Use the tool."}]


@pytest.fixture(scope="module")
def fmt() -> Qwen3:
    return get_format("qwen3", load_tokenizer("mini-qwen3"))


def test_the_registry_gives_qwen3_its_probe_rules():
    rules = probe_rules("qwen3")
    assert isinstance(rules, ProbeRules) and isinstance(rules, Qwen3ProbeRules)
    assert (rules.id_form, rules.placeholder, rules.reasoning_end, rules.thinking_switch) == (
        "server", None, "</think>", "enable_thinking")
    assert reads_provider_traits("qwen3")


def test_raw_calls_are_read_with_the_formats_parser():
    text = f"Let me check.\n{CALL}\n{CALL.replace('Paris', 'Rome')}"
    raw = RULES.raw_calls(text, truncated=False)
    assert raw is not None and raw.parsed and raw.start == len("Let me check.\n")
    assert [(c.id, c.name, json.loads(c.arguments)) for c in raw.calls] == [
        ("", "get_weather", ARGS), ("", "get_weather", {"city": "Rome"})]
    # hermes reads no call when a block is not JSON: the markers stay, unparsed.
    broken = RULES.raw_calls("x<tool_call>\n{not json}\n</tool_call>", truncated=False)
    assert broken is not None and (broken.parsed, broken.calls, broken.start) == (False, [], 1)
    assert RULES.raw_calls("no markers here", truncated=False) is None
    assert RULES.raw_calls(None, truncated=False) is None
    # Cut by max_tokens inside the last block: the whole calls before it still count.
    cut = f"{CALL}\n<tool_call>\n{{\"name\": \"get_wea"
    assert RULES.raw_calls(cut, truncated=False).parsed is False
    partial = RULES.raw_calls(cut, truncated=True)
    assert partial.parsed and len(partial.calls) == 1


def test_a_call_body_without_its_tags_looks_stripped():
    assert RULES.looks_stripped('{"name": "get_weather", "arguments": {"city": "Paris"}}')
    assert RULES.looks_stripped('Sure.\n\n{"name": "f", "arguments": {}}\n')
    assert not RULES.looks_stripped("It is sunny in Paris {today}.")
    assert not RULES.looks_stripped('{"city": "Paris"}')
    assert not RULES.looks_stripped(None)


def test_server_ids_are_the_form_and_carry_no_index():
    for call_id in (VLLM_ID, SGLANG_ID, ""):
        assert RULES.id_is_canonical(call_id, "get_weather", 0)
        assert RULES.id_index(call_id) is None
    calls = [ToolCall(VLLM_ID, "get_weather", "{}")]
    assert id_form_of(calls, RULES) == ("server", VLLM_ID)
    # An id no known server makes is "other": reconstruction flags it, nothing is lost.
    odd = [ToolCall("functions.get_weather:0", "get_weather", "{}")]
    assert id_form_of(odd, RULES) == ("other", "functions.get_weather:0")
    assert RULES.id_index("functions.get_weather:3") is None


def test_written_calls_are_the_arguments_exactly_as_the_model_wrote_them():
    compact = '<tool_call>\n{"name": "get_weather", "arguments":{"city":"Paris"} }\n</tool_call>'
    text = f"<think>\nHm.\n</think>\n\nOk.\n{CALL}\n{compact}"
    assert RULES.calls_start(text) == text.index("<tool_call>")
    assert RULES.calls_start("<think>\nHm.\n</think>\n\nNo calls.") is None
    written = RULES.written_calls(text)
    assert written == [("", '{"city": "Paris"}'), ("", '{"city":"Paris"}')]
    # hermes (non-streamed) re-dumps: the canonical call is verbatim, the compact one is not.
    dumped = [ToolCall(VLLM_ID, "get_weather", json.dumps(ARGS))] * 2
    assert compare_with_raw(dumped, written) == ("reserialized", "unknown")
    assert compare_with_raw(dumped[:1], written[:1]) == ("verbatim", "kept")
    # A block cut off before its arguments: nothing to compare with.
    assert RULES.written_calls('<tool_call>\n{"name": "get_wea') == [("", "")]


def test_assembled_as_returned_is_the_formats_assembly(fmt):
    completion = normalize_response(response(reasoning="\nHm.\n", content="\n\nOk.\n",
                                             calls=[(VLLM_ID, json.dumps(ARGS))]))
    ours = RULES.assemble_as_returned(fmt, completion, thinking=True, truncated=False, history=0)
    assert ours.ids == fmt.assemble("\nHm.\n", "\n\nOk.\n", completion.tool_calls,
                                    thinking=True, truncated=False).ids
    assert "arguments_canonical_assumed" in ours.flags  # non-streamed: re-dumped by hermes
    # Streamed (the client's record of the stream is there): the arguments are the model's.
    completion.content_at_calls = (len("\n\nOk.\n"),)
    streamed = RULES.assemble_as_returned(fmt, completion, thinking=True, truncated=False,
                                          history=0)
    assert "arguments_canonical_assumed" not in streamed.flags
    assert streamed.ids == ours.ids
    kimi = get_format("kimi-k2.5", load_tokenizer("mini"))
    with pytest.raises(TypeError, match=r"need the Qwen3 format, not kimi-k2\.5"):
        RULES.assemble_as_returned(kimi, completion, thinking=True, truncated=False, history=0)


# ---------------------------------------------------------------------------------------------
# Observations and the strip finding, from answers built as vLLM and SGLang return them


def response(*, reasoning: str | None = None, content: str | None, calls=(),
             usage: dict[str, int] | None = None, token_ids: list[int] | None = None,
             finish: str | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning"] = reasoning
    if calls:
        message["tool_calls"] = [{"id": i, "type": "function",
                                  "function": {"name": "get_weather", "arguments": a}}
                                 for i, a in calls]
    choice: dict[str, Any] = {"index": 0, "message": message,
                              "finish_reason": finish or ("tool_calls" if calls else "stop")}
    if token_ids is not None:
        choice["token_ids"] = token_ids
    return {"choices": [choice], "usage": usage or {}}


def request(thinking: bool, tools: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "Qwen/Qwen3-8B", "messages": MESSAGES,
                            "chat_template_kwargs": {"enable_thinking": thinking}}
    if tools:
        body["tools"] = [WEATHER_TOOL]
    return body


def answer(fmt: Qwen3, written: str, *, thinking: bool, tools: bool = True,
           **fields: Any) -> dict[str, Any]:
    """The response to the model's text `written`, counted as a provider counts it (the stop
    token included), with the fields a parser returned for it."""
    ids = [*fmt.tok.encode_ordinary(written), fmt.stop_id]
    prompt = fmt.encode_prompt(MESSAGES, [WEATHER_TOOL] if tools else None, thinking=thinking)
    usage = {"prompt_tokens": len(prompt), "completion_tokens": len(ids)}
    return response(usage=usage, **fields)


def look(fmt: Qwen3, body: dict[str, Any], *, thinking: bool, index: int = 0, tools=True):
    return observe(index, request(thinking, tools), body, rules=RULES, fmt=fmt)


PLAIN = "<think>\nA prime has two divisors.\n</think>\n\nA prime is divisible only by 1 and itself."


def plain_answer(fmt: Qwen3) -> dict[str, Any]:
    # A clean base for counting: it settles counts_stop_token (0 -> counted).
    return answer(fmt, PLAIN, thinking=True, tools=False,
                  reasoning="\nA prime has two divisors.\n",
                  content="\n\nA prime is divisible only by 1 and itself.")


def scenario(*observations) -> ScenarioResult:
    result = ScenarioResult(name="tools", description="", tool_mode="tools", tools_sent=True,
                            thinking=None)
    return summarize(result, list(observations))


def test_vllm_returns_the_text_before_the_calls_as_written(fmt):
    written = f"<think>\nCall it.\n</think>\n\nLet me check.\n{CALL}"
    body = answer(fmt, written, thinking=True, reasoning="\nCall it.\n",
                  content="\n\nLet me check.\n", calls=[(VLLM_ID, json.dumps(ARGS))])
    obs = look(fmt, body, thinking=True)
    assert (obs.calls_where, obs.id_form, obs.id_example) == ("structured", "server", VLLM_ID)
    assert obs.content_beside_calls == "padded" and obs.bare_content_offset is None
    assert observation_recoverable(obs) is True
    findings = infer_findings([scenario(obs, look(fmt, plain_answer(fmt), thinking=True,
                                                  index=1, tools=False))], RULES)
    assert findings.family.get(STRIPS) is False, findings.evidence
    assert findings.counts_stop_token is True
    # No Qwen3 id carries a count, and no parser deletes a placeholder: both stay unknown,
    # and the evidence says why.
    assert findings.renumbers_tool_ids is None and findings.deletes_no_content is None
    assert "the format has no placeholder" in findings.evidence["deletes_no_content"]


def test_sglang_strips_it_and_the_count_shows_the_separators_were_written(fmt):
    written = f"<think>\nCall it.\n</think>\n\nLet me check.\n{CALL}"
    body = answer(fmt, written, thinking=True, reasoning="\nCall it.\n",
                  content="Let me check.", calls=[(SGLANG_ID, json.dumps(ARGS))])
    obs = look(fmt, body, thinking=True)
    assert obs.content_beside_calls == "bare"
    assert (obs.bare_content_offset, obs.bare_content_restored) == (0, True)
    plain = look(fmt, plain_answer(fmt), thinking=True, index=1, tools=False)
    findings = infer_findings([scenario(obs, plain)], RULES)
    assert findings.family.get(STRIPS) is True, findings.evidence
    # Without a count base (no tokenizer, or no clean answer) nothing can tell.
    alone = infer_findings([scenario(obs)], RULES)
    assert alone.counts_stop_token is None and alone.family.get(STRIPS) is None


def test_a_bare_text_vllm_kept_is_not_taken_for_stripping(fmt):
    """The known false alarm: thinking off, the model wrote "Sure." right before its call; vLLM
    returns it as written. Restoring the separators would add a token the provider never
    counted, so the count votes false."""
    written = f"Sure.{CALL}"
    body = answer(fmt, written, thinking=False, content="Sure.",
                  calls=[(VLLM_ID, json.dumps(ARGS))])
    obs = look(fmt, body, thinking=False)
    assert obs.content_beside_calls == "bare" and obs.bare_content_restored is True
    assert obs.bare_content_offset < 0
    plain = look(fmt, plain_answer(fmt), thinking=True, index=1, tools=False)
    findings = infer_findings([scenario(obs, plain)], RULES)
    assert findings.family.get(STRIPS) is False, findings.evidence


def test_a_bare_text_in_a_stream_is_used_as_returned_and_counted_so(fmt):
    """Streamed (the client's record of the stream is there), the format's assembly restores
    nothing: usage equal to our count then shows the text was written bare, not stripped."""
    written = f"Sure.{CALL}"
    body = answer(fmt, written, thinking=False, content="Sure.",
                  calls=[(VLLM_ID, json.dumps(ARGS))])
    body["choices"][0]["specregen_stream"] = {"content_at_calls": [len("Sure.")],
                                              "call_fragments": [3]}
    obs = look(fmt, body, thinking=False)
    assert obs.content_beside_calls == "bare"
    assert (obs.bare_content_offset, obs.bare_content_restored) == (0, False)
    plain = look(fmt, plain_answer(fmt), thinking=True, index=1, tools=False)
    findings = infer_findings([scenario(obs, plain)], RULES)
    assert findings.family.get(STRIPS) is False, findings.evidence


def test_the_models_ids_settle_the_strip_finding(fmt):
    written = f"<think>\nCall it.\n</think>\n\nLet me check.\n{CALL}"
    ids = [*fmt.tok.encode_ordinary(written), fmt.stop_id]
    kept = look(fmt, response(reasoning="\nCall it.\n", content="\n\nLet me check.\n",
                              calls=[(VLLM_ID, json.dumps(ARGS))], token_ids=ids),
                thinking=True)
    stripped = look(fmt, response(reasoning="\nCall it.\n", content="Let me check.",
                                  calls=[(SGLANG_ID, json.dumps(ARGS))], token_ids=ids),
                    thinking=True, index=1)
    assert (kept.content_as_written, stripped.content_as_written) == (True, False)
    assert (kept.arguments, kept.whitespace) == ("verbatim", "kept")
    assert infer_findings([scenario(kept)], RULES).family.get(STRIPS) is False
    assert infer_findings([scenario(stripped)], RULES).family.get(STRIPS) is True
    both = infer_findings([scenario(kept, stripped)], RULES)
    assert both.family.get(STRIPS) is None
    assert "contradictory" in both.evidence["strips_content_beside_calls"]


def test_whitespace_only_text_says_nothing(fmt):
    # vLLM nulls it, SGLang empties it: both parsers drop it, so neither votes.
    written = f"<think>\nCall it.\n</think>\n\n{CALL}"
    for content in (None, ""):
        body = answer(fmt, written, thinking=True, reasoning="\nCall it.\n", content=content,
                      calls=[(VLLM_ID, json.dumps(ARGS))])
        obs = look(fmt, body, thinking=True)
        assert obs.content_beside_calls is None and obs.bare_content_offset is None
        findings = infer_findings([scenario(obs)], RULES)
        assert findings.family.get(STRIPS) is None


def test_raw_calls_without_tools_are_recoverable(fmt):
    written = f"<think>\nCall it.\n</think>\n\n{CALL}"
    body = answer(fmt, written, thinking=True, tools=False, reasoning="\nCall it.\n",
                  content=f"\n\n{CALL}")
    obs = look(fmt, body, thinking=True, tools=False)
    assert (obs.calls_where, obs.raw_section_parsed, obs.arguments) == (
        "raw_content", True, "verbatim")
    assert observation_recoverable(obs) is True
    assert obs.completion_offset == 0 and obs.reference_match is None


def test_markers_deleted_by_a_provider_are_stripped_calls(fmt):
    completion = normalize_response(response(
        content='{"name": "get_weather", "arguments": {"city": "Paris"}}', finish="stop"))
    assert classify_calls(completion, RULES).where == "stripped"


def test_the_strip_finding_is_examined_only_for_formats_that_read_it(fmt):
    written = f"<think>\nCall it.\n</think>\n\nLet me check.\n{CALL}"
    body = answer(fmt, written, thinking=True, reasoning="\nCall it.\n",
                  content="\n\nLet me check.\n", calls=[(VLLM_ID, json.dumps(ARGS))])
    results = [scenario(look(fmt, body, thinking=True))]
    for rules in (None, KIMI_RULES):
        findings = infer_findings(results, rules)
        assert findings.family.get(STRIPS) is None
        assert "strips_content_beside_calls" not in findings.evidence
        assert not any(n.startswith("strips_content") for n in finding_notes(findings))
    qwen = infer_findings(results, RULES)
    assert any(n.startswith("strips_content_beside_calls: returns the text before tool calls"
                            " as written") for n in finding_notes(qwen, RULES))


def test_an_unknown_id_is_explained_in_qwen3_terms():
    result = ScenarioResult(name="tools", description="", tool_mode="tools", tools_sent=True,
                            thinking=None, calls_where="structured", id_form="other",
                            id_example="functions.get_weather:0")
    notes = profile_notes([result], {"tools": True, "system_prompt": False}, thinking=None,
                          tokenizer=None, rules=RULES)
    assert any("reconstruction ignores them" in n and "tool_id_unexpected" in n for n in notes)
    kimi = profile_notes([result], {"tools": True, "system_prompt": False}, thinking=None,
                         tokenizer=None, rules=KIMI_RULES)
    assert any("flags tool_id_rewritten" in n for n in kimi)


def test_the_finding_reaches_reconstruction_through_the_profiles_traits(fmt):
    """The chain: answers -> finding -> `ProviderProfile.traits()` -> `reconstruct`. A bare text
    a provider returned as written (ids that do not say which server made them) is rebuilt
    exactly only once the probe said it does not strip."""
    from specregen.client.config import EndpointConfig
    from specregen.probe.run import build_profile
    from specregen.reconstruct import reconstruct

    written = f"Sure.{CALL}"
    body = answer(fmt, written, thinking=False, content="Sure.",
                  calls=[("call_0", json.dumps(ARGS))])
    plain = look(fmt, plain_answer(fmt), thinking=True, index=1, tools=False)
    cfg = EndpointConfig(base_url="http://127.0.0.1:9/v1", model="Qwen/Qwen3-8B")
    profile = build_profile(cfg, [scenario(look(fmt, body, thinking=False), plain)],
                            tool_mode="tools", requests=2, tokenizer="mini-qwen3")
    traits = profile.traits()
    assert traits.get(STRIPS) is False
    assert any(n.startswith("strips_content_beside_calls: returns the text before tool calls"
                            " as written") for n in profile.notes)
    ids = [*fmt.tok.encode_ordinary(written), fmt.stop_id]
    guessed = reconstruct("s", request(False), body, fmt, reference_completion_ids=ids)
    known = reconstruct("s", request(False), body, fmt, reference_completion_ids=ids,
                        traits=traits)
    assert guessed.reference_match == "text_diff"  # a "\n" restored that was never removed
    assert known.reference_match == "exact" and known.input_ids[-len(ids):] == ids
