"""The tool-call gate: clean samples pass, every corruption class is quarantined with its reason."""

from __future__ import annotations

import copy
import dataclasses
import json
import time

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from specregen.cli import app
from specregen.cli.gate import OUTPUT_FILES
from specregen.errors import EXIT_PARTIAL
from specregen.gate import CHECKS, GateConfig, check_sample, run_gate
from specregen.gate.declared import by_prompt
from specregen.models.kimi_k25 import (
    ARG_BEGIN,
    CALL_BEGIN,
    CALL_END,
    SECTION_BEGIN,
    SECTION_END,
    KimiK25,
)
from specregen.models.tokenizer import load_tokenizer
from specregen.reconstruct import reconstruct
from specregen.records import Declaration, Prompt, ProviderTraits, TokenSample, ToolCall
from specregen.sources import BUNDLED_SAMPLES, read_source
from specregen.sources.glaive import FUNCTIONS_LEAD_IN
from specregen.store.token_samples import (
    read_token_meta,
    read_token_samples,
    write_token_samples,
)

WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer"},
        },
        "required": ["city"],
    },
}
SEARCH = {
    "name": "search_web",
    "description": "Search the web.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                   "required": ["query"]},
}
TOOLS = [{"type": "function", "function": WEATHER}, {"type": "function", "function": SEARCH}]
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
REQUEST = {
    "model": "moonshotai/kimi-k2.5",
    "messages": [SYSTEM, {"role": "user", "content": "Weather in Paris?"}],
    "tools": TOOLS,
}
PLAIN_REQUEST = {"model": "moonshotai/kimi-k2.5",
                 "messages": [SYSTEM, {"role": "user", "content": "Say hi."}]}
GLAIVE_REQUEST = {
    "model": "moonshotai/kimi-k2.5",
    "messages": [
        {"role": "system", "content": FUNCTIONS_LEAD_IN + "\n" + json.dumps(WEATHER, indent=4)
         + "\n"},
        {"role": "user", "content": "Weather in Paris?"},
    ],
}
ARGS = '{"city": "Paris"}'
# A provider whose parsers its probe knows (vLLM-like: ids as written, nothing deleted, the stop
# token counted, a section opened inside the reasoning left there): equal counts then prove the
# ids, as the gate's clean samples need.
KNOWN = ProviderTraits(renumbers_tool_ids=False, deletes_no_content=False, counts_stop_token=True,
                       ends_reasoning_at_tools=False)


def call(args: str = ARGS, name: str = "get_weather", call_id: str | None = None) -> dict:
    return {"id": call_id or f"functions.{name}:0", "type": "function",
            "function": {"name": name, "arguments": args}}


def raw_section(*calls: tuple[str, str], close: bool = True) -> str:
    body = "".join(f"{CALL_BEGIN}{cid}{ARG_BEGIN}{args}{CALL_END}" for cid, args in calls)
    return SECTION_BEGIN + body + (SECTION_END if close else "")


def response(message: dict, finish: str, usage: dict | None = None) -> dict:
    return {"choices": [{"message": {"role": "assistant", **message}, "finish_reason": finish}],
            "usage": usage or {}}


def build(fmt, message: dict, finish: str = "stop", request: dict = REQUEST,
          sample_id: str = "s", usage: bool = True) -> TokenSample:
    """A reconstructed sample; with `usage`, the provider's counts equal ours (a clean sample)."""
    first = reconstruct(sample_id, request, response(message, finish), fmt, traits=KNOWN)
    if not usage or first.status == "error":
        return first
    # A provider that dropped the reasoning still counted its tokens.
    dropped = 3 if first.thinking and not first.reasoning else 0
    counts = {"prompt_tokens": first.prompt_len, "completion_tokens": first.completion_len
              + dropped, "completion_tokens_details": {"reasoning_tokens": 3}}
    return reconstruct(sample_id, request, response(message, finish, counts), fmt,
                       traits=KNOWN)


def reasons_of(decision) -> dict[str, str]:
    return {r.check: r.detail for r in decision.reasons}


# --- clean samples ----------------------------------------------------------------------------

HISTORY_REQUEST = copy.deepcopy(REQUEST)
HISTORY_REQUEST["messages"] += [
    {"role": "assistant", "content": "", "tool_calls": [call()]},
    {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "rain"},
    {"role": "user", "content": "And in Lyon?"},
]

CLEAN = {
    "structured": ({"reasoning": "Need the weather.", "content": None, "tool_calls": [call()]},
                   "tool_calls", REQUEST),
    "structured_parallel": (
        {"reasoning": "Two things.", "content": "Checking.",
         "tool_calls": [call('{"city": "Paris", "unit": "celsius", "days": 2}'),
                        call('{"query": "Paris events"}', "search_web",
                             "functions.search_web:1")]},
        "tool_calls", REQUEST),
    "structured_args_with_spaces": (
        {"reasoning": "Pad.", "content": None, "tool_calls": [call('  {"city": "Paris"}\n')]},
        "tool_calls", REQUEST),
    "raw_markers_in_content": (
        {"reasoning": "Raw.", "content": "Let me check."
         + raw_section((" functions.get_weather:0 ", ' {"city": "Nice"} '))},
        "tool_calls", REQUEST),
    "history_index": ({"reasoning": "Again.", "content": None,
                       "tool_calls": [call('{"city": "Lyon"}', call_id="functions.get_weather:1")]},
                      "tool_calls", HISTORY_REQUEST),
    "text_with_tools": ({"reasoning": "No tool needed.", "content": "It is sunny."}, "stop",
                        REQUEST),
    "no_tools": ({"reasoning": "Greet.", "content": "Hi! Code: `x = '<|im_end|>'`"}, "stop",
                 PLAIN_REQUEST),
    "instant_mode": ({"content": "Hi."}, "stop",
                     {**PLAIN_REQUEST, "chat_template_kwargs": {"thinking": False}}),
    "truncated_text": ({"reasoning": "Long", "content": "Once upon a"}, "length", PLAIN_REQUEST),
    "truncated_mid_arguments": (
        {"reasoning": "Go.", "content": raw_section(("functions.get_weather:0", '{"ci'),
                                                    close=False)[: -len(CALL_END)]},
        "length", REQUEST),
    "unicode_arguments": ({"reasoning": "中文", "content": None,
                           "tool_calls": [call('{"city": "東京 🌸"}')]}, "tool_calls", REQUEST),
}


@pytest.mark.parametrize("name", sorted(CLEAN))
def test_clean_samples_are_accepted(mini_fmt, name):
    message, finish, request = CLEAN[name]
    sample = build(mini_fmt, message, finish, request)
    assert sample.status == "ok", sample.flags
    decision = check_sample(sample, mini_fmt, GateConfig())
    assert decision.accepted, decision.reason_strings()
    assert decision.verdict == "accepted" and not decision.hard


def test_truncated_call_is_exempt_only_while_it_is_cut(mini_fmt):
    message, finish, request = CLEAN["truncated_mid_arguments"]
    sample = build(mini_fmt, message, finish, request)
    assert sample.tool_calls and sample.tool_calls[-1].arguments == '{"ci'
    assert check_sample(sample, mini_fmt, GateConfig()).accepted
    rejecting = check_sample(sample, mini_fmt, GateConfig(accept_truncated=False))
    assert "accept_truncated" in reasons_of(rejecting)["finish_reason"]


# What an adapter states for GLAIVE_REQUEST's prompt: the function of its system prompt.
GLAIVE_DECLARED = Declaration([{"type": "function", "function": WEATHER}])


def test_system_prompt_declared_tools(mini_fmt):
    """glaive's system_prompt mode: no `tools`; the provider leaves the markers in content.
    The gate judges the calls by the prompt's declaration, as its adapter stated it."""
    message = {"reasoning": "Use it.", "content": raw_section(("functions.get_weather:0", ARGS))}
    sample = build(mini_fmt, message, "stop", GLAIVE_REQUEST)
    assert sample.tool_mode == "system_prompt" and sample.tools is None
    # A provider that did not parse the calls reports `stop`: no disagreement there.
    assert check_sample(sample, mini_fmt, GateConfig(), GLAIVE_DECLARED).accepted

    other = {"reasoning": "Use it.",
             "content": raw_section(("functions.get_time:0", "{}"))}
    undeclared = check_sample(build(mini_fmt, other, "stop", GLAIVE_REQUEST), mini_fmt,
                              GateConfig(allow_stop_with_calls=True), GLAIVE_DECLARED)
    detail = reasons_of(undeclared)["name_declared"]
    assert "'get_time'" in detail and "in the system prompt" in detail
    assert "get_weather" in detail

    bad_args = {"reasoning": "Use it.",
                "content": raw_section(("functions.get_weather:0", '{"city": 3}'))}
    violating = check_sample(build(mini_fmt, bad_args, "stop", GLAIVE_REQUEST), mini_fmt,
                             GateConfig(allow_stop_with_calls=True), GLAIVE_DECLARED)
    assert "type" in reasons_of(violating)["arguments_schema"]


def test_the_gate_reads_no_system_prompt(mini_fmt):
    """Without its prompt's declaration a system_prompt sample declares nothing: the gate
    does not parse the glaive text in its system message itself."""
    message = {"reasoning": "Use it.", "content": raw_section(("functions.get_weather:0", ARGS))}
    sample = build(mini_fmt, message, "stop", GLAIVE_REQUEST)
    detail = reasons_of(check_sample(sample, mini_fmt, GateConfig()))["name_declared"]
    assert "no tools, and the system prompt declares none" in detail
    # A run hands each sample its prompt's declaration, found by the prompt's id.
    report = run_gate([sample], mini_fmt, GateConfig(), dataset="d",
                      declarations=by_prompt({"s": GLAIVE_DECLARED}))
    assert report.totals["quarantined"] == 0, report.examples


@pytest.mark.parametrize("tool_mode", ["system_prompt", "tools"])
def test_bundled_glaive_rows_answered_like_the_dataset_pass(mini_fmt, tool_mode):
    """Real glaive declarations (both modes), answered with glaive's own first turn."""
    adapter, path = BUNDLED_SAMPLES["B1_glaive"]
    prompts = [p for p in read_source(adapter, path, dataset="B1_glaive", tool_mode=tool_mode)
               if isinstance(p, Prompt)]
    samples, reference, declared = [], {}, {}
    for prompt in prompts:
        ref = prompt.meta["reference_first_turn"]
        reference[prompt.sample_id] = ref
        declared[prompt.sample_id] = prompt.declaration
        request = {"messages": prompt.messages}
        if tool_mode == "tools":
            request["tools"] = prompt.tools
        if ref["kind"] == "text":
            message, finish = {"reasoning": "Plain.", "content": ref["content"]}, "stop"
        elif tool_mode == "tools":
            message = {"reasoning": "Call.", "content": None,
                       "tool_calls": [call(ref["arguments"], ref["name"])]}
            finish = "tool_calls"
        else:
            section = raw_section((f"functions.{ref['name']}:0", ref["arguments"]))
            message, finish = {"reasoning": "Call.", "content": section}, "stop"
        samples.append(build(mini_fmt, message, finish, request, sample_id=prompt.sample_id))
    config = GateConfig(allow_stop_with_calls=tool_mode == "system_prompt")
    report = run_gate(samples, mini_fmt, config, dataset="B1_glaive", reference=reference,
                      declarations=by_prompt(declared))
    assert report.passed and report.totals["quarantined"] == 0, report.examples
    trigger = report.trigger_agreement
    called, text = trigger["dataset_called"], trigger["dataset_text"]
    assert called > 5 and text > 5
    assert trigger["model_called"] == trigger["same_tool"] == trigger["same_arguments"] == called
    assert trigger["model_text"] == text


def test_calls_without_any_declaration_are_undeclared(mini_fmt):
    message = {"reasoning": "x", "content": raw_section(("functions.get_weather:0", ARGS))}
    sample = build(mini_fmt, message, "tool_calls", PLAIN_REQUEST)
    detail = reasons_of(check_sample(sample, mini_fmt, GateConfig()))["name_declared"]
    assert "no tools, and the system prompt declares none" in detail


# --- corruption classes -----------------------------------------------------------------------

CORRUPT = {
    # name: (message, finish, request, check expected, words expected in its detail)
    "invalid_json": ({"reasoning": "r", "content": None, "tool_calls": [call('{"city": "Par')]},
                     "tool_calls", REQUEST, "arguments_json", "not JSON"),
    "nan_is_not_json": ({"reasoning": "r", "content": None,
                         "tool_calls": [call('{"city": "Paris", "days": NaN}')]},
                        "tool_calls", REQUEST, "arguments_json", "NaN"),
    "array_arguments": ({"reasoning": "r", "content": None, "tool_calls": [call('["Paris"]')]},
                        "tool_calls", REQUEST, "arguments_json", "array, not an object"),
    "null_arguments": ({"reasoning": "r", "content": None, "tool_calls": [call("null")]},
                       "tool_calls", REQUEST, "arguments_json", "null, not an object"),
    "wrong_type": ({"reasoning": "r", "content": None, "tool_calls": [call('{"city": 75}')]},
                   "tool_calls", REQUEST, "arguments_schema", "type at $.city"),
    "missing_required": ({"reasoning": "r", "content": None,
                          "tool_calls": [call('{"unit": "celsius"}')]},
                         "tool_calls", REQUEST, "arguments_schema", "required"),
    "enum": ({"reasoning": "r", "content": None,
              "tool_calls": [call('{"city": "Paris", "unit": "kelvin"}')]},
             "tool_calls", REQUEST, "arguments_schema", "enum at $.unit"),
    "undeclared_name": ({"reasoning": "r", "content": None,
                         "tool_calls": [call("{}", "get_time")]},
                        "tool_calls", REQUEST, "name_declared", "'get_time' is not declared"),
    "openai_style_id": ({"reasoning": "r", "content": None,
                         "tool_calls": [call(call_id="call_9f8e7d")]},
                        "tool_calls", REQUEST, "reconstruction", "tool_id_rewritten"),
    "wrong_index": ({"reasoning": "r", "content": None,
                     "tool_calls": [call(call_id="functions.get_weather:7")]},
                    "tool_calls", REQUEST, "tool_id_form", "index 7, expected 0"),
    "raw_wrong_index": ({"reasoning": "r",
                         "content": raw_section(("functions.get_weather:3", ARGS))},
                        "tool_calls", REQUEST, "tool_id_form", "index 3, expected 0"),
    "raw_noncanonical_id": ({"reasoning": "r", "content": raw_section(("weather-0", ARGS))},
                            "tool_calls", REQUEST, "tool_id_form", "not functions.NAME:IDX"),
    "marker_text_in_content": ({"reasoning": "r", "content": "Done <|tool_call_end|>",
                                "tool_calls": [call()]},
                               "tool_calls", REQUEST, "marker_text", "content holds"),
    "think_tag_in_content": ({"reasoning": "r", "content": "Sure.</think> Now:"}, "stop",
                             REQUEST, "marker_text", "</think>"),
    "stop_with_calls": ({"reasoning": "r", "content": None, "tool_calls": [call()]}, "stop",
                        REQUEST, "finish_reason", "allow_stop_with_calls"),
    "tool_calls_without_calls": ({"reasoning": "r", "content": "Let me check."}, "tool_calls",
                                 REQUEST, "finish_reason", "no call"),
    "content_filter": ({"reasoning": "r", "content": "Sorry"}, "content_filter", REQUEST,
                       "finish_reason", "'content_filter'"),
    "stripped_markers": ({"reasoning": "r", "content": "functions.get_weather:0" + ARGS},
                         "tool_calls", REQUEST, "reconstruction", "markers_stripped"),
    "dropped_reasoning": ({"content": "Sunny."}, "stop", REQUEST, "reconstruction",
                          "reasoning_missing"),
}
SECTION_IN_REASONING = {"reasoning": "I call it." + raw_section(("functions.get_weather:0", ARGS)),
                        "content": None}


def test_section_inside_reasoning_needs_the_count_to_prove_it(mini_fmt):
    # Without counts, the `</think>` the model may have written before it is unknown.
    unproven = build(mini_fmt, SECTION_IN_REASONING, "tool_calls", usage=False)
    decision = check_sample(unproven, mini_fmt, GateConfig(min_evidence="none"))
    assert "tool_calls_in_reasoning" in reasons_of(decision)["reconstruction"]
    # An equal completion count rules the other readings out: the ids are what was written.
    proven = build(mini_fmt, SECTION_IN_REASONING, "tool_calls")
    assert proven.evidence == "usage_exact"
    assert check_sample(proven, mini_fmt, GateConfig()).accepted


@pytest.mark.parametrize("name", sorted(CORRUPT))
def test_corruptions_are_quarantined_with_their_reason(mini_fmt, name):
    message, finish, request, check, words = CORRUPT[name]
    sample = build(mini_fmt, message, finish, request)
    decision = check_sample(sample, mini_fmt, GateConfig())
    assert not decision.accepted and decision.verdict == "quarantined"
    reasons = reasons_of(decision)
    assert check in reasons, decision.reason_strings()
    assert words in reasons[check], reasons[check]
    assert all(r.check in CHECKS for r in decision.reasons)
    assert not decision.hard, "a corrupt response is not a reconstruction bug"


def test_id_naming_another_function_is_caught(mini_fmt):
    """A canonical id whose NAME differs from the call's name: the ids would parse back to
    another function, so the sample cannot round-trip."""
    sample = build(mini_fmt, {"reasoning": "r", "content": None,
                              "tool_calls": [call(call_id="functions.search_web:0")]},
                   "tool_calls")
    reasons = reasons_of(check_sample(sample, mini_fmt, GateConfig()))
    assert "names 'search_web'" in reasons["tool_id_form"]
    assert "name 'search_web' parses back" in reasons["round_trip"]


def test_marker_text_inside_arguments(mini_fmt):
    sample = build(mini_fmt, {"reasoning": "r", "content": None,
                              "tool_calls": [call('{"city": "<|tool_call_end|>"}')]},
                   "tool_calls")
    decision = check_sample(sample, mini_fmt, GateConfig())
    reasons = reasons_of(decision)
    assert "call 0 arguments holds" in reasons["marker_text"]
    # A server parsing these ids would cut the arguments at the marker text.
    assert "round_trip" in reasons
    assert decision.hard == (sample.status == "ok")


def test_usage_tolerance_is_the_gates_own(mini_fmt):
    sample = build(mini_fmt, {"reasoning": "r", "content": "Sunny."})
    off = dataclasses.replace(sample, usage_completion_delta=12, usage_prompt_delta=0)
    detail = reasons_of(check_sample(off, mini_fmt, GateConfig()))["usage_lengths"]
    assert "+12" in detail and "allowed ±4" in detail
    assert check_sample(off, mini_fmt, GateConfig(completion_tolerance_abs=12)).accepted
    prompt_off = dataclasses.replace(sample, usage_prompt_delta=-1)
    assert "prompt" in reasons_of(check_sample(prompt_off, mini_fmt, GateConfig()))[
        "usage_lengths"]


def test_error_sample_is_quarantined_with_its_error(mini_fmt):
    sample = reconstruct("e", REQUEST, {"choices": []}, mini_fmt)
    decision = check_sample(sample, mini_fmt, GateConfig())
    assert decision.reason_strings() == ["reconstruction: error: response has no 'choices'"]


# --- the round-trip hard invariant ------------------------------------------------------------


def clean_call_sample(fmt, sample_id: str = "s") -> TokenSample:
    message, finish, request = CLEAN["structured"]
    return build(fmt, message, finish, request, sample_id=sample_id)


def forged_arguments(sample: TokenSample) -> TokenSample:
    """An `ok` sample whose ids disagree with what the API returned."""
    api = [ToolCall(c.id, c.name, '{"city": "Lyon"}') for c in sample.api_tool_calls]
    return dataclasses.replace(sample, api_tool_calls=api)


def test_round_trip_mismatch_on_an_ok_sample_is_a_hard_break(mini_fmt):
    sample = forged_arguments(clean_call_sample(mini_fmt))
    assert sample.status == "ok"
    decision = check_sample(sample, mini_fmt, GateConfig())
    assert decision.hard
    assert "arguments differ from the API's at character 10" in reasons_of(decision)["round_trip"]
    flagged = dataclasses.replace(sample, status="flagged", flags=["reasoning_missing"])
    assert not check_sample(flagged, mini_fmt, GateConfig()).hard


def test_marker_written_as_text_instead_of_its_id_is_a_hard_break(mini_fmt):
    """Decoded text is the same either way; only the id structure shows the bug."""
    sample = clean_call_sample(mini_fmt)
    end_id = mini_fmt.ids[CALL_END]
    ids = list(sample.input_ids)
    at = ids.index(end_id, sample.prompt_len)
    ids[at : at + 1] = mini_fmt.tok.encode_ordinary(CALL_END)
    broken = dataclasses.replace(sample, input_ids=ids)
    decision = check_sample(broken, mini_fmt, GateConfig())
    assert decision.hard and "marker ids" in reasons_of(decision)["round_trip"]


def test_ids_from_another_tokenizer_are_a_hard_break(mini_fmt):
    sample = clean_call_sample(mini_fmt)
    alien = dataclasses.replace(sample, input_ids=[*sample.input_ids[:-1], 100_000,
                                                   sample.input_ids[-1]])
    detail = reasons_of(check_sample(alien, mini_fmt, GateConfig()))["round_trip"]
    assert "do not decode" in detail and "another tokenizer" in detail


def test_hard_break_fails_the_dataset_below_the_threshold(mini_fmt):
    clean = clean_call_sample(mini_fmt)
    samples = [dataclasses.replace(clean, sample_id=f"c{i}") for i in range(999)]
    samples.append(forged_arguments(dataclasses.replace(clean, sample_id="forged")))
    report = run_gate(samples, mini_fmt, GateConfig(max_quarantine_share=1.0), dataset="d")
    assert report.verdict == "fail" and not report.passed
    assert report.totals["quarantined"] == 1 and report.totals["hard_invariant_breaks"] == 1
    assert "hard invariant broken" in report.why[0]
    assert report.hard_invariant_examples[0]["sample_id"] == "forged"
    assert "hard invariant" in report.to_markdown()


# --- the dataset verdict ----------------------------------------------------------------------


def mixed_samples(fmt, n: int, bad: int) -> list[TokenSample]:
    clean = clean_call_sample(fmt)
    text = build(fmt, *CLEAN["text_with_tools"][:2])
    message, finish, request, *_ = CORRUPT["enum"]
    corrupt = build(fmt, message, finish, request)
    out = [dataclasses.replace(corrupt, sample_id=f"bad{i}") for i in range(bad)]
    out += [dataclasses.replace(clean if i % 2 else text, sample_id=f"ok{i}")
            for i in range(n - bad)]
    return out


def test_threshold_both_ways(mini_fmt):
    above = run_gate(mixed_samples(mini_fmt, 100, 3), mini_fmt, GateConfig(), dataset="d")
    assert above.verdict == "fail"
    assert above.why == ["quarantined share 3.00% (3 of 100) exceeds the threshold 2.00%"]
    assert above.by_check["arguments_schema"] == 3
    below = run_gate(mixed_samples(mini_fmt, 100, 2), mini_fmt, GateConfig(), dataset="d")
    assert below.verdict == "pass" and "within the threshold" in below.why[0]
    relaxed = run_gate(mixed_samples(mini_fmt, 100, 50), mini_fmt,
                       GateConfig().override({"max_quarantine_share": 1.0}), dataset="d")
    assert relaxed.passed and relaxed.totals["quarantined"] == 50
    assert relaxed.by_check["arguments_schema"] == 50 and relaxed.examples["arguments_schema"]


def test_empty_dataset_fails(mini_fmt):
    report = run_gate([], mini_fmt, GateConfig(), dataset="empty")
    assert report.verdict == "fail" and "no samples" in report.why[0]


def test_callbacks_receive_every_sample_with_its_decision(mini_fmt):
    samples = mixed_samples(mini_fmt, 10, 3)
    got: dict[str, list[str]] = {"ok": [], "bad": []}
    run_gate(iter(samples), mini_fmt, GateConfig(), dataset="d",
             on_accept=lambda s, d: got["ok"].append(s.sample_id),
             on_quarantine=lambda s, d: got["bad"].append(d.sample_id))
    assert got["bad"] == ["bad0", "bad1", "bad2"] and len(got["ok"]) == 7


def test_config_cannot_disable_the_gate():
    with pytest.raises(ValueError, match="cannot be disabled"):
        GateConfig().override({"enabled": False})
    with pytest.raises(ValueError, match="unknown gate setting"):
        GateConfig().override({"max_share": 0.1})
    with pytest.raises(ValueError, match=r"within \[0, 1\]"):
        GateConfig(max_quarantine_share=1.5)
    with pytest.raises(ValueError, match="must be a bool"):
        GateConfig().override({"accept_truncated": "no"})
    assert GateConfig().override({"accept_truncated": False}).accept_truncated is False


# --- the report -------------------------------------------------------------------------------


def test_report_counts_tools_and_keeps_the_shortest_examples(mini_fmt):
    message, finish, request, *_ = CORRUPT["enum"]
    short = build(mini_fmt, message, finish, request, sample_id="short")
    long_message = {**message, "reasoning": "word " * 300}
    long = build(mini_fmt, long_message, finish, request, sample_id="long")
    samples = [long, long, short, long, long]
    report = run_gate(samples, mini_fmt, GateConfig(examples_per_check=2, max_quarantine_share=1.0),
                      dataset="d")
    kept = report.examples["arguments_schema"]
    assert [e["sample_id"] for e in kept] == ["short", "long"]
    assert kept[0]["tokens"] < kept[1]["tokens"]
    assert kept[0]["excerpt"] == '{"city": "Paris", "unit": "kelvin"}'
    assert report.by_tool == [{"name": "get_weather", "calls": 5, "quarantined": 5}]
    json.loads(report.to_json())


def test_report_on_100k_samples_stays_small_and_fast(mini_fmt):
    pool = [build(mini_fmt, m, f, r, sample_id=name) for name, (m, f, r) in CLEAN.items()]
    pool += [build(mini_fmt, m, f, r, sample_id=name)
             for name, (m, f, r, _c, _w) in CORRUPT.items()]
    many_tools = [dataclasses.replace(pool[0], tool_calls=[ToolCall(f"functions.t{i}:0", f"t{i}",
                                                                    "{}")])
                  for i in range(60)]
    pool += many_tools
    samples = (pool[i % len(pool)] for i in range(100_000))
    start = time.process_time()  # CPU time: other processes on the machine do not count
    report = run_gate(samples, mini_fmt, GateConfig(max_quarantine_share=1.0), dataset="big")
    elapsed = time.process_time() - start
    assert report.totals["samples"] == 100_000
    size_json, size_md = len(report.to_json().encode()), len(report.to_markdown().encode())
    assert size_json < 50_000 and size_md < 50_000, (size_json, size_md)
    assert all(len(v) <= 3 for v in report.examples.values())
    assert len(report.by_tool) == 25 and report.tools_not_listed["tools"] > 0
    # A guard against quadratic work or unbounded lists: this failure-heavy mix takes about
    # 5.5 s of CPU (some 55 µs a sample) where it was written.
    assert elapsed < 20, elapsed


def test_markdown_is_a_readable_table_report(mini_fmt):
    samples = mixed_samples(mini_fmt, 20, 2)
    samples.append(build(mini_fmt, *CORRUPT["marker_text_in_content"][:3], sample_id="m|x"))
    md = run_gate(samples, mini_fmt, GateConfig(), dataset="B1_glaive").to_markdown()
    assert md.startswith("# Tool-call gate: B1_glaive — FAIL")
    assert "| `arguments_schema` | 2 | 9.52% |" in md
    # Markers stay visible inside code spans; pipes never break a row.
    assert "`<|tool_call_end|>`" not in md and "\\|tool_call_end\\|" in md
    assert "`m\\|x`" in md
    for line in md.splitlines():
        if line.startswith("|"):
            assert line.endswith("|"), line


# --- trigger agreement ------------------------------------------------------------------------


def test_trigger_agreement_with_the_dataset_answers(mini_fmt):
    weather = clean_call_sample(mini_fmt, "w")
    search = build(mini_fmt, {"reasoning": "r", "content": None,
                              "tool_calls": [call('{"query": "x"}', "search_web")]},
                   "tool_calls", sample_id="q")
    text = build(mini_fmt, *CLEAN["text_with_tools"][:2], sample_id="t")
    samples = [
        dataclasses.replace(weather, sample_id="same_tool_same_args"),
        dataclasses.replace(weather, sample_id="same_tool_other_args"),
        dataclasses.replace(search, sample_id="other_tool"),
        dataclasses.replace(text, sample_id="text_instead_of_call"),
        dataclasses.replace(text, sample_id="text_as_well"),
        dataclasses.replace(weather, sample_id="call_instead_of_text"),
        dataclasses.replace(text, sample_id="no_reference"),
    ]
    ref_call = {"kind": "tool_call", "name": "get_weather"}
    reference = {
        "same_tool_same_args": {**ref_call, "arguments": '{"city":"Paris"}'},
        "same_tool_other_args": {**ref_call, "arguments": '{"city": "Rome"}'},
        "other_tool": {**ref_call, "arguments": '{"city": "Rome"}'},
        "text_instead_of_call": {**ref_call, "arguments": "{}"},
        "text_as_well": {"kind": "text", "content": "Sunny."},
        "call_instead_of_text": {"kind": "text", "content": "I cannot."},
        "no_reference": None,
    }
    report = run_gate(samples, mini_fmt, GateConfig(), dataset="d", reference=reference)
    assert report.trigger_agreement == {
        "dataset_called": 4, "model_called": 3, "same_tool": 2, "same_arguments": 1,
        "dataset_text": 2, "model_text": 1, "no_reference": 1, "other_kind": 0,
    }
    md = report.to_markdown()
    assert "| … the model called a tool too | 3 | 75.00% |" in md
    assert "| … the model called a tool instead | 1 | 50.00% |" in md


# --- the command ------------------------------------------------------------------------------


def write_requests(path, n_clean: int, n_bad: int, tokenizer: str = "mini") -> None:
    lines = []
    fmt = KimiK25(load_tokenizer(tokenizer))

    def answered(message, finish, request):
        # With the counts a faithful provider reports: the gate wants usage as evidence.
        first = reconstruct("x", request, response(message, finish), fmt)
        counts = {"prompt_tokens": first.prompt_len, "completion_tokens": first.completion_len}
        return response(message, finish, counts), first.input_ids[first.prompt_len :]

    # The server's own ids come along (the command takes them): the evidence that proves
    # a structured call whatever the provider's parsers did.
    for i in range(n_clean):
        message, finish, request = CLEAN["structured" if i % 2 else "text_with_tools"]
        body, ids = answered(message, finish, request)
        lines.append({"sample_id": f"ok{i}", "request": request, "response": body,
                      "reference_completion_ids": ids})
    for i in range(n_bad):
        message, finish, request, *_ = CORRUPT["invalid_json" if i % 2 else "wrong_index"]
        body, ids = answered(message, finish, request)
        lines.append({"sample_id": f"bad{i}", "request": request, "response": body,
                      "reference_completion_ids": ids})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gate")
    src = folder / "requests.jsonl"
    write_requests(src, 46, 4)
    out = folder / "tokens.parquet"
    result = CliRunner().invoke(app, ["reconstruct", str(src), "--tokenizer", "mini",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def test_cli_fails_above_the_threshold(tokens, tmp_path):
    out = tmp_path / "gate"
    result = CliRunner().invoke(app, ["gate", str(tokens), "--out", str(out),
                                      "--dataset", "B1_glaive"])
    assert result.exit_code == EXIT_PARTIAL, result.output
    assert "FAIL" in result.output and "exceeds the threshold 2.00%" in result.output
    assert sorted(p.name for p in out.iterdir()) == sorted(OUTPUT_FILES)
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] == "fail"
    assert report["why"] == ["quarantined share 8.00% (4 of 50) exceeds the threshold 2.00%"]
    assert report["by_check"]["arguments_json"] == 2 and report["by_check"]["tool_id_form"] == 2
    accepted = list(read_token_samples(out / "accepted.parquet"))
    assert len(accepted) == 46 and all(s.sample_id.startswith("ok") for s in accepted)
    quarantined = pq.read_table(out / "quarantined.parquet").to_pylist()
    assert {r["sample_id"] for r in quarantined} == {"bad0", "bad1", "bad2", "bad3"}
    assert any(r.startswith("arguments_json: call 0 (get_weather): not JSON")
               for row in quarantined for r in row["reasons"])
    assert (out / "report.md").read_text().startswith("# Tool-call gate: B1_glaive — FAIL")


def test_cli_passes_below_the_threshold(tokens, tmp_path):
    out = tmp_path / "gate"
    result = CliRunner().invoke(app, ["gate", str(tokens), "--out", str(out),
                                      "--max-quarantine-share", "0.1"])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] == "pass" and report["dataset"] == "tokens"
    assert report["config"]["max_quarantine_share"] == 0.1


def test_cli_trigger_agreement_from_prompts(tokens, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    rows = [{"sample_id": f"ok{i}", "messages": [],
             "meta": {"reference_first_turn": {"kind": "tool_call", "name": "get_weather",
                                               "arguments": ARGS}}} for i in range(46)]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "gate"
    result = CliRunner().invoke(app, ["gate", str(tokens), "--out", str(out),
                                      "--prompts", str(prompts)])
    assert result.exit_code == EXIT_PARTIAL, result.output
    trigger = json.loads((out / "report.json").read_text())["trigger_agreement"]
    assert trigger["dataset_called"] == 46 and trigger["model_called"] == 23
    assert trigger["same_arguments"] == 23 and trigger["no_reference"] == 4


def test_cli_bad_inputs_exit_2(tokens, tmp_path):
    runner = CliRunner()
    missing = runner.invoke(app, ["gate", str(tmp_path / "nope.parquet"), "--out",
                                  str(tmp_path / "o")])
    assert missing.exit_code == 2 and "no such file" in missing.output
    not_parquet = tmp_path / "x.parquet"
    not_parquet.write_text("hello")
    result = runner.invoke(app, ["gate", str(not_parquet), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "cannot read" in result.output
    bad_prompts = tmp_path / "p.jsonl"
    bad_prompts.write_text('{"sample_id": "a"}\n{oops\n')
    result = runner.invoke(app, ["gate", str(tokens), "--out", str(tmp_path / "o"),
                                 "--prompts", str(bad_prompts)])
    assert result.exit_code == 2 and "p.jsonl:2: not JSON" in result.output
    result = runner.invoke(app, ["gate", str(tokens), "--out", str(tmp_path / "o"),
                                 "--max-quarantine-share", "2"])
    assert result.exit_code == 2
    result = runner.invoke(app, ["gate", str(tokens), "--out", str(tmp_path / "o"),
                                 "--tokenizer", str(tmp_path)])
    assert result.exit_code == 2 and "tiktoken.model" in result.output
    assert not (tmp_path / "o" / "report.json").exists()


def test_cli_refuses_another_tokenizer_than_the_ids_were_built_with(tokens, tmp_path):
    samples = list(read_token_samples(tokens))
    first = samples[0]
    first.input_ids[1] = 100_000  # an id the mini tokenizer does not have
    alien = tmp_path / "alien.parquet"
    write_token_samples(samples, alien)
    result = CliRunner().invoke(app, ["gate", str(alien), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "was not built with tokenizer 'specregen-mini'" in result.output
    assert not (tmp_path / "o").exists()


def test_cli_system_prompt_samples_declare_what_their_prompt_does(mini_fmt, tmp_path):
    """`specregen gate` over a token file: a prompts line's `declared_tools` (the pipeline's
    chunks hold them) is the declaration; a line without one, or no prompts file, reads the
    sample's own request as the adapters read a row (its tools, else a glaive-style system
    prompt), so a token file gates as it did."""
    message = {"reasoning": "Use it.", "content": raw_section(("functions.get_weather:0", ARGS))}
    sample = build(mini_fmt, message, "stop", GLAIVE_REQUEST, sample_id="g0")
    tokens = tmp_path / "tokens.parquet"
    write_token_samples([sample], tokens)

    def gate(*extra: str) -> list[dict]:
        out = tmp_path / f"gate{len(list(tmp_path.iterdir()))}"
        result = CliRunner().invoke(app, ["gate", str(tokens), "--out", str(out),
                                          "--allow-stop-with-calls", *extra])
        assert result.exit_code in (0, EXIT_PARTIAL), result.output
        return pq.read_table(out / "quarantined.parquet").to_pylist()

    assert gate() == []
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"sample_id": "g0", "messages": []}) + "\n")
    assert gate("--prompts", str(prompts)) == []
    prompts.write_text(json.dumps({"sample_id": "g0", "declared_tools": None}) + "\n")
    (row,) = gate("--prompts", str(prompts))
    assert row["reasons"][0].startswith("name_declared: 'get_weather' is not declared")


# --- the token file names its tokenizer -------------------------------------------------------


def reconstructed_with(tokenizer: str, folder) -> object:
    src = folder / "requests.jsonl"
    write_requests(src, 3, 0, tokenizer)
    out = folder / "tokens.parquet"
    result = CliRunner().invoke(app, ["reconstruct", str(src), "--tokenizer", tokenizer,
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def test_gate_reads_the_tokenizer_from_a_real_vocabulary_file(tmp_path):
    from tests.support import kimi_tokenizer_dir

    kimi = kimi_tokenizer_dir()
    if kimi is None:
        pytest.skip("KIMI_TOKENIZER_DIR is not set to a folder with tiktoken.model")
    tokens = reconstructed_with(str(kimi), tmp_path)
    meta = read_token_meta(tokens)
    assert meta is not None and meta.tokenizer == str(kimi.resolve())
    assert meta.format["name"] == "kimi-k2.5" and len(meta.tokenizer_fingerprint) == 64
    result = CliRunner().invoke(app, ["gate", str(tokens), "--out", str(tmp_path / "gate")])
    assert result.exit_code == 0, result.output
    accepted = tmp_path / "gate" / "accepted.parquet"
    assert read_token_meta(accepted) == meta  # the shards keep naming it
    # Another vocabulary is refused, naming both.
    result = CliRunner().invoke(app, ["gate", str(tokens), "--out", str(tmp_path / "g2"),
                                      "--tokenizer", "mini"])
    assert result.exit_code == 2
    assert "was built with tokenizer" in result.output and "specregen-mini" in result.output


def test_gate_default_tokenizer_and_a_moved_one(tmp_path):
    tokens = reconstructed_with("mini", tmp_path)
    assert read_token_meta(tokens).tokenizer == "mini"
    result = CliRunner().invoke(app, ["gate", str(tokens), "--out", str(tmp_path / "gate")])
    assert result.exit_code == 0, result.output
    # The same vocabulary from another folder is the same tokenizer.
    import shutil

    from specregen.models.tokenizer import MINI_TOKENIZER_DIR

    copy_dir = tmp_path / "mini_copy"
    shutil.copytree(MINI_TOKENIZER_DIR, copy_dir)
    result = CliRunner().invoke(app, ["gate", str(tokens), "--out", str(tmp_path / "g2"),
                                      "--tokenizer", str(copy_dir)])
    assert result.exit_code == 0, result.output


def test_min_evidence_quarantines_weaker_samples_and_the_report_splits_them(mini_fmt):
    message, finish, request = {"reasoning": "r", "content": "Hi."}, "stop", PLAIN_REQUEST
    proven = build(mini_fmt, message, finish, request, sample_id="a")
    unproven = build(mini_fmt, message, finish, request, sample_id="b", usage=False)
    assert unproven.status == "ok"
    assert proven.evidence == "usage_exact" and unproven.evidence == "none"
    report = run_gate([proven, unproven], mini_fmt, GateConfig(max_quarantine_share=1.0),
                      dataset="d")
    assert report.by_check["evidence"] == 1
    assert report.totals["accepted_by_evidence"] == {
        "reference": 0, "logprobs": 0, "usage_exact": 1, "usage_tolerated": 0, "none": 0}
    assert "## Accepted samples by evidence" in report.to_markdown()
    loose = run_gate([proven, unproven], mini_fmt, GateConfig(min_evidence="none"), dataset="d")
    assert loose.totals["accepted_by_evidence"]["none"] == 1
    strict = run_gate([proven], mini_fmt, GateConfig(min_evidence="reference",
                                                     max_quarantine_share=1.0), dataset="d")
    assert strict.totals["accepted"] == 0
    with pytest.raises(ValueError, match="min_evidence"):
        GateConfig(min_evidence="strong")


def test_gate_tolerances_are_reconstructions(mini_fmt):
    config = GateConfig().override({"completion_tolerance_abs": 9, "prompt_tolerance": 2})
    tolerance = config.reconstruct_config().tolerance
    assert (tolerance.prompt, tolerance.completion_abs) == (2, 9)
    assert tolerance == config.tolerance
    # Raising the gate's tolerance raises reconstruction's: a sample 6 tokens off in instant
    # mode is `ok` under both, where the defaults flag it in both.
    message = {"content": "Hi there."}
    first = reconstruct("s", PLAIN_REQUEST | {"chat_template_kwargs": {"thinking": False}},
                        response(message, "stop"), mini_fmt)
    counts = {"prompt_tokens": first.prompt_len, "completion_tokens": first.completion_len + 6}
    args = ("s", PLAIN_REQUEST | {"chat_template_kwargs": {"thinking": False}},
            response(message, "stop", counts), mini_fmt)
    assert reconstruct(*args).status == "flagged"
    raised = reconstruct(*args, config=config.reconstruct_config())
    assert raised.status == "ok"
    assert check_sample(raised, mini_fmt, config).accepted
    assert not check_sample(raised, mini_fmt, GateConfig()).accepted
