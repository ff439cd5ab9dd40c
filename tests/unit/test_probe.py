"""The provider probe without a server: classification, summaries, verdicts, refusal, profile."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from specregen.client.config import EndpointConfig
from specregen.client.request import build_request
from specregen.models.kimi_k25 import (
    ARG_BEGIN,
    CALL_BEGIN,
    CALL_END,
    SECTION_BEGIN,
    SECTION_END,
)
from specregen.models.kimi_k25.probe import RULES
from specregen.models.probe_answer import Observation
from specregen.probe import (
    ProbeFatalError,
    ProbeRefusal,
    ProbeSetupError,
    ProfileError,
    ScenarioResult,
    build_profile,
    build_scenarios,
    check_run_against_profile,
    classify_calls,
    load_profile,
    require_recoverable_tool_calls,
    run_scenarios,
    save_profile,
    summarize,
)
from specregen.probe.classify import (
    compare_with_raw,
    failed_observation,
    id_form_of,
    reasoning_field_of,
    recoverable_by_mode,
)
from specregen.probe.classify import observe as observe_with
from specregen.probe.model import PROFILE_VERSION, ParserFindings
from specregen.probe.run import scenario_config
from specregen.probe.scenarios import glaive_probe_prompt, history_messages
from specregen.probe.traits import infer_findings
from specregen.records import ProviderTraits, ToolCall
from specregen.sources import BUNDLED_SAMPLES
from specregen.sources.glaive import FUNCTIONS_LEAD_IN
from specregen.wire.response import normalize_response

ARGS = '{"city": "Paris"}'
# The probe reads every answer here with K2.5's probe rules.
observe = partial(observe_with, rules=RULES)
SECTION = (f"{SECTION_BEGIN}{CALL_BEGIN}functions.get_weather:0{ARG_BEGIN}{ARGS}{CALL_END}"
           f"{SECTION_END}")


def body(
    *,
    content: str | None = None,
    reasoning: str | None = None,
    reasoning_field: str = "reasoning",
    calls: list[tuple[str, str, str]] | None = None,
    finish: str = "stop",
    usage: dict[str, Any] | None = None,
    token_ids: list[int] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        message[reasoning_field] = reasoning
    if calls:
        message["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
            for i, n, a in calls
        ]
    message.update(extra or {})
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish}
    if token_ids is not None:
        choice["token_ids"] = token_ids
    out: dict[str, Any] = {"choices": [choice]}
    if usage is not None:
        out["usage"] = usage
    return out


def where(response: dict[str, Any]) -> str:
    return classify_calls(rules=RULES, completion=normalize_response(response)).where


# ---------------------------------------------------------------------------------------------
# Where calls came back


def test_structured_calls_are_structured():
    finding = classify_calls(rules=RULES, completion=normalize_response(body(
        calls=[("functions.get_weather:0", "get_weather", ARGS)], finish="tool_calls")))
    assert finding.where == "structured"
    assert finding.calls == [ToolCall("functions.get_weather:0", "get_weather", ARGS)]


def test_markers_in_content_are_raw_content_and_parse():
    finding = classify_calls(rules=RULES, completion=normalize_response(
        body(content="Let me check." + SECTION)))
    assert finding.where == "raw_content"
    assert finding.raw_section_parsed is True
    assert finding.calls[0].arguments == ARGS


def test_markers_that_do_not_form_a_section_are_raw_but_unparsed():
    # A partial marker set as seen from a provider (SPEC 4.5: typeclaw PR #344).
    text = f"channel_reply:0{ARG_BEGIN}{ARGS}{SECTION_END}"
    finding = classify_calls(rules=RULES, completion=normalize_response(body(content=text)))
    assert (finding.where, finding.raw_section_parsed, finding.calls) == ("raw_content", False, [])


def test_markers_in_reasoning_are_raw_reasoning():
    assert where(body(content=None, reasoning="I should call it." + SECTION)) == "raw_reasoning"


def test_tool_calls_finish_without_calls_or_markers_is_stripped():
    assert where(body(content="", finish="tool_calls")) == "stripped"


def test_call_like_text_without_markers_is_stripped_even_with_finish_stop():
    assert where(body(content='functions.get_weather:0{"city": "Paris"}')) == "stripped"


def test_a_plain_answer_is_none():
    assert where(body(content="It is sunny in Paris.")) == "none"


def test_reasoning_field_names_the_field_that_carried_text():
    def field(response: dict[str, Any]) -> str:
        return reasoning_field_of(normalize_response(response))

    assert field(body(content="x", reasoning="think", extra={"reasoning_details": [
        {"type": "reasoning.text", "text": "think"}]})) == "reasoning"
    assert field(body(content="x", reasoning="think", reasoning_field="reasoning_content")) == (
        "reasoning_content")
    assert field(body(content="x", extra={"reasoning_details": [
        {"type": "reasoning.text", "text": "think"}]})) == "reasoning_details"
    assert field(body(content="x", reasoning="")) == "none"
    assert field(body(content="x", reasoning=None)) == "none"


def test_id_form():
    one = ToolCall("functions.get_weather:0", "get_weather", ARGS)
    assert id_form_of(rules=RULES, calls=[one]) == ("functions.NAME:IDX", "functions.get_weather:0")
    assert id_form_of(rules=RULES, calls=[ToolCall("functions.get_weather:0", "get_weather", ARGS),
                       ToolCall("call_9f2a", "get_weather", ARGS)]) == ("other", "call_9f2a")
    assert id_form_of(rules=RULES, calls=[]) == ("none", None)


# ---------------------------------------------------------------------------------------------
# Arguments and whitespace


def test_raw_calls_are_read_untrimmed():
    text = f"{SECTION_BEGIN}{CALL_BEGIN} functions.f:0 {ARG_BEGIN}\n{ARGS} {CALL_END}{SECTION_END}"
    assert RULES.written_calls(text) == [(" functions.f:0 ", "\n" + ARGS + " ")]
    assert RULES.written_calls("no section") == []


@pytest.mark.parametrize(
    ("api_args", "raw_args", "expected"),
    [
        (ARGS, ARGS, ("verbatim", "kept")),
        (ARGS, " " + ARGS + "\n", ("trimmed", "lost")),
        ('{"city":"Paris"}', ARGS, ("reserialized", "unknown")),
        ('{"city": "Lyon"}', ARGS, ("changed", "unknown")),
    ],
)
def test_arguments_compared_with_the_models_text(api_args, raw_args, expected):
    api = [ToolCall("functions.f:0", "f", api_args)]
    assert compare_with_raw(api, [("functions.f:0", raw_args)]) == expected


def test_a_trimmed_id_is_lost_whitespace_and_a_renumbered_one_is_not():
    api = [ToolCall("functions.f:1", "f", ARGS)]
    assert compare_with_raw(api, [("functions.f:0", ARGS)]) == ("verbatim", "kept")
    api = [ToolCall("functions.f:0", "f", ARGS)]
    assert compare_with_raw(api, [(" functions.f:0", ARGS)]) == ("verbatim", "lost")
    assert compare_with_raw(api, []) == ("changed", "unknown")


def test_structured_calls_alone_say_unknown_rather_than_guess():
    obs = observe(0, {"messages": []}, body(
        calls=[("functions.get_weather:0", "get_weather", ARGS)], finish="tool_calls"))
    assert (obs.arguments, obs.whitespace, obs.arguments_json) == ("unknown", "unknown", "valid")
    # Surrounding whitespace that arrived proves at least that nobody trimmed it.
    obs = observe(0, {"messages": []}, body(
        calls=[("functions.get_weather:0", "get_weather", " " + ARGS)], finish="tool_calls"))
    assert (obs.arguments, obs.whitespace) == ("unknown", "kept")


def test_raw_markers_are_verbatim():
    obs = observe(0, {"messages": []}, body(content=SECTION))
    assert (obs.calls_where, obs.arguments, obs.whitespace) == ("raw_content", "verbatim", "kept")
    assert obs.id_form == "functions.NAME:IDX"


def test_token_ids_reveal_trimming_and_counts_are_offsets(mini_fmt):
    messages = [{"role": "user", "content": "weather in Paris?"}]
    request = {"messages": messages, "tools": [{"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object"}}}]}
    written = ToolCall("functions.get_weather:0", "get_weather", " " + ARGS)
    truth = mini_fmt.assemble("hmm", "", [written], thinking=True, truncated=False)
    prompt_len = len(mini_fmt.encode_prompt(messages, request["tools"], thinking=True))
    response = body(
        content="", reasoning="hmm", calls=[("functions.get_weather:0", "get_weather", ARGS)],
        finish="tool_calls", token_ids=truth.ids,
        usage={"prompt_tokens": prompt_len, "completion_tokens": len(truth.ids)},
    )
    obs = observe(3, request, response, fmt=mini_fmt)
    assert (obs.arguments, obs.whitespace) == ("trimmed", "lost")
    assert obs.prompt_offset == 0
    # usage minus ours; a lost space may merge into the next token, so counts alone can hide it.
    ours = mini_fmt.assemble("hmm", "", [ToolCall(written.id, written.name, ARGS)],
                             thinking=True, truncated=False)
    assert obs.our_completion_tokens == len(ours.ids)
    assert obs.completion_offset == len(truth.ids) - len(ours.ids)
    assert obs.reference_match == "text_diff"


def test_an_error_body_is_a_failed_observation():
    obs = observe(0, {"messages": []}, {"error": {"code": 502, "message": "upstream"}})
    assert not obs.ok and "upstream" in (obs.error or "")
    obs = failed_observation(1, "bad_request", "HTTP 400: nope", 400, 0.2)
    assert (obs.ok, obs.http_status, obs.error) == (False, 400, "bad_request: HTTP 400: nope")


# ---------------------------------------------------------------------------------------------
# Scenario summaries and verdicts


def scenario(name: str, responses: list[dict[str, Any]], *, tool_mode: str = "tools",
             thinking: bool | None = None) -> ScenarioResult:
    result = ScenarioResult(name=name, description=name, tool_mode=tool_mode,  # type: ignore[arg-type]
                            tools_sent=tool_mode == "tools", thinking=thinking)
    return summarize(result, [observe(i, {"messages": []}, r) for i, r in enumerate(responses)])


STRUCTURED = body(calls=[("functions.get_weather:0", "get_weather", ARGS)], finish="tool_calls")
RAW = body(content=SECTION)
STRIPPED = body(content="", finish="tool_calls")
PLAIN = body(content="It is sunny.")


def test_the_worst_answer_decides_the_scenario():
    s = scenario("tools", [STRUCTURED, STRIPPED, STRUCTURED])
    assert s.calls_where == "stripped"
    assert s.where_counts == {"structured": 2, "stripped": 1}
    assert s.recoverable is False
    s = scenario("tools", [STRUCTURED, PLAIN])
    assert (s.calls_where, s.recoverable) == ("structured", True)


def test_no_call_at_all_is_inconclusive_and_all_failures_say_nothing():
    s = scenario("tools", [PLAIN, PLAIN])
    assert (s.calls_where, s.recoverable) == ("none", None)
    result = ScenarioResult("tools", "tools", "tools", True, None)
    s = summarize(result, [failed_observation(0, "server_error", "HTTP 502: down", 502, 0.1)])
    assert (s.calls_where, s.recoverable) == (None, None)
    assert s.errors == ["server_error: HTTP 502: down"]


def test_proven_reserialisation_is_not_recoverable():
    s = scenario("tools", [STRUCTURED])
    s.observations[0].arguments = "reserialized"
    assert summarize(s, s.observations).recoverable is False


def test_recoverable_by_mode_needs_a_call_and_no_loss():
    scenarios = [
        scenario("tools", [STRUCTURED]),
        scenario("thinking_on", [STRUCTURED], thinking=True),
        scenario("thinking_off", [STRIPPED], thinking=False),
        scenario("system_prompt", [RAW], tool_mode="system_prompt"),
        scenario("glaive", [PLAIN], tool_mode="system_prompt"),
    ]
    # thinking_off does not speak for a run with thinking on (or the server default).
    assert recoverable_by_mode(scenarios, None) == {"tools": True, "system_prompt": True}
    assert recoverable_by_mode(scenarios, False) == {"tools": False, "system_prompt": True}
    inconclusive = [scenario("tools", [PLAIN]), scenario("system_prompt", [PLAIN],
                                                          tool_mode="system_prompt")]
    assert recoverable_by_mode(inconclusive, None) == {"tools": False, "system_prompt": False}


def cfg(**overrides: Any) -> EndpointConfig:
    return EndpointConfig.load({"base_url": "https://openrouter.ai/api/v1",
                                "model": "moonshotai/kimi-k2.5", **overrides})


def stripped_profile():
    results = [scenario("tools", [STRIPPED, STRIPPED]),
               scenario("system_prompt", [RAW], tool_mode="system_prompt")]
    return build_profile(cfg(), results, tool_mode="tools", requests=2)


def test_profile_verdicts_and_notes():
    profile = stripped_profile()
    assert profile.tool_calls_recoverable is False
    assert profile.tool_calls_recoverable_by_mode == {"tools": False, "system_prompt": True}
    assert any("NOT recoverable" in n and "stripped" in n for n in profile.notes)
    assert any("no --tokenizer" in n for n in profile.notes)


def test_refusal_names_model_host_how_mode_and_probe_file():
    profile = stripped_profile()
    with pytest.raises(ProbeRefusal) as info:
        require_recoverable_tool_calls(profile, "tools", probe_file="probe.json")
    message = str(info.value)
    assert message.startswith("the endpoint moonshotai/kimi-k2.5 at openrouter.ai returns tool"
                              " calls with the markers stripped (2 of 2 answers")
    assert "when tools are sent as tools: they cannot be rebuilt token-exact; refusing to" \
           " start. Probe: probe.json" in message
    require_recoverable_tool_calls(profile, "system_prompt")
    with pytest.raises(ValueError, match="tool_mode"):
        require_recoverable_tool_calls(profile, "json")


# ---------------------------------------------------------------------------------------------
# The profile file and the run check


def test_profile_round_trips_through_json(tmp_path):
    profile = stripped_profile()
    path = save_profile(profile, tmp_path / "sub" / "profile.json")
    assert load_profile(path) == profile
    data = json.loads(path.read_text())
    assert data["kind"] == "specregen.provider_profile" and data["api_key_env"]
    assert "api_key" not in data


@pytest.mark.parametrize(
    ("text", "message"),
    [("not json", "not JSON"), ("[]", "not a provider profile"),
     ('{"kind": "specregen.provider_profile", "version": 99}', "version 99")],
)
def test_a_bad_profile_file_is_a_clear_error(tmp_path, text, message):
    path = tmp_path / "p.json"
    path.write_text(text)
    with pytest.raises(ProfileError, match=message):
        load_profile(path)
    with pytest.raises(ProfileError, match="cannot read"):
        load_profile(tmp_path / "missing.json")


def write_prompts(path: Path, rows: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
USER = [{"role": "user", "content": "hi"}]


def test_run_check_refuses_only_prompts_that_rely_on_lost_calls(tmp_path):
    profile_path = save_profile(stripped_profile(), tmp_path / "profile.json")
    plain = write_prompts(tmp_path / "plain.jsonl", [{"sample_id": "a", "messages": USER}])
    check_run_against_profile(profile_path, plain, cfg())
    sys_prompt = write_prompts(tmp_path / "sys.jsonl", [
        {"sample_id": "a", "messages": USER, "tools": [TOOL], "tool_mode": "system_prompt"}])
    check_run_against_profile(profile_path, sys_prompt, cfg())
    tools = write_prompts(tmp_path / "tools.jsonl", [
        {"sample_id": "a", "messages": USER},
        {"sample_id": "b", "messages": USER, "tools": [TOOL]}])
    with pytest.raises(ProbeRefusal, match=r"refusing to start\. Probe: .*profile\.json"):
        check_run_against_profile(profile_path, tools, cfg())


def test_run_check_refuses_a_profile_of_another_endpoint(tmp_path):
    profile_path = save_profile(stripped_profile(), tmp_path / "profile.json")
    plain = write_prompts(tmp_path / "plain.jsonl", [{"sample_id": "a", "messages": USER}])
    with pytest.raises(ProbeRefusal, match=r"was made for moonshotai/kimi-k2\.5"):
        check_run_against_profile(profile_path, plain, cfg(model="moonshotai/kimi-k2.6"))
    with pytest.raises(ProbeRefusal, match="routing"):
        check_run_against_profile(profile_path, plain, cfg(provider={"only": ["moonshotai"]}))
    (tmp_path / "junk.json").write_text("{}")
    with pytest.raises(ProbeRefusal, match="not a provider profile"):
        check_run_against_profile(tmp_path / "junk.json", plain, cfg())


# ---------------------------------------------------------------------------------------------
# Scenarios and requests


def test_scenarios_ask_each_way_a_run_can():
    scenarios = {s.name: s for s in build_scenarios(2, rules=RULES)}
    assert list(scenarios) == ["tools", "system_prompt", "thinking_on", "thinking_off",
                               "history", "plain", "logprobs"]
    # Only the logprobs scenario asks for them (a provider may refuse: nothing else is lost).
    plain_cfg = scenario_config(cfg(), scenarios["plain"])
    logprobs_cfg = scenario_config(cfg(), scenarios["logprobs"])
    assert not build_request(scenarios["plain"].prompts[0], plain_cfg).get("logprobs")
    assert build_request(scenarios["logprobs"].prompts[0], logprobs_cfg)["logprobs"] is True
    base = cfg(reasoning={"effort": "high"})
    tools_body = build_request(scenarios["tools"].prompts[0], scenario_config(base,
                                                                              scenarios["tools"]))
    assert tools_body["tools"][0]["function"]["name"] == "get_weather"
    assert "Use the tool." in tools_body["messages"][-1]["content"]
    assert tools_body["stream"] is True and tools_body["reasoning"] == {"effort": "high"}
    sys_body = build_request(scenarios["system_prompt"].prompts[0], base)
    assert "tools" not in sys_body
    system = sys_body["messages"][0]["content"]
    assert system.startswith(FUNCTIONS_LEAD_IN + "\n{\n    \"name\": \"get_weather\"")
    # Different questions per request: identical ones could be answered from a cache.
    assert len({p.messages[-1]["content"] for p in scenarios["tools"].prompts}) == 2


@pytest.mark.parametrize(
    ("dialect", "field", "off"),
    [("openrouter", "reasoning", {"enabled": False}),
     ("vllm", "chat_template_kwargs", {"thinking": False}),
     ("sglang", "chat_template_kwargs", {"thinking": False}),
     ("moonshot", "thinking", {"type": "disabled"})],
)
def test_thinking_scenarios_use_the_dialects_switch(dialect, field, off):
    base = cfg(dialect=dialect) if dialect != "openrouter" else cfg(reasoning={"effort": "high"})
    off_scenario = next(s for s in build_scenarios(1, rules=RULES) if s.name == "thinking_off")
    request = build_request(off_scenario.prompts[0], scenario_config(base, off_scenario))
    assert request[field] == off


def test_glaive_prompt_is_the_first_with_a_tool_call_answer(tmp_path):
    prompt = glaive_probe_prompt(str(BUNDLED_SAMPLES["B1_glaive"][1]))
    assert prompt.tool_mode == "system_prompt" and prompt.tools
    assert prompt.meta["reference_first_turn"]["kind"] == "tool_call"
    assert prompt.messages[0]["content"].startswith(FUNCTIONS_LEAD_IN)
    with pytest.raises(ProbeSetupError, match="cannot read"):
        glaive_probe_prompt(str(tmp_path / "missing.json"))
    none = tmp_path / "none.jsonl"
    none.write_text(json.dumps({"system": "SYSTEM: You are a helpful assistant, with no access"
                                " to external functions.\n\n", "chat": "USER: hi\n\n\nASSISTANT:"
                                " hello <|endoftext|>\n\n\n"}) + "\n")
    with pytest.raises(ProbeSetupError, match="no usable prompt"):
        glaive_probe_prompt(str(none))


def test_build_scenarios_bounds_the_request_count():
    with pytest.raises(ProbeSetupError):
        build_scenarios(0, rules=RULES)


# ---------------------------------------------------------------------------------------------
# Errors while probing


SECRET = "sk-or-v1-" + "0123456789ab" * 4


def run_with(status: int, payload: dict[str, Any], key: Any = None) -> list[ScenarioResult]:
    import asyncio

    from specregen.client.secrets import ApiKey

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json=payload)

    endpoint = cfg(retry={"max_attempts": 2, "base_delay": 0.001, "max_delay": 0.001},
                   api_key_env="PROBE_TEST_KEY")
    return asyncio.run(run_scenarios(endpoint, ApiKey(key) if key else None,
                                     build_scenarios(2, rules=RULES),
                                     transport=httpx.MockTransport(handler)))


def test_an_http_error_is_recorded_in_its_scenario_not_fatal():
    results = run_with(400, {"error": {"code": 400, "message": "tools not supported"}})
    assert all(s.calls_where is None and s.recoverable is None for s in results)
    assert all(o.http_status == 400 and "tools not supported" in (o.error or "")
               for s in results for o in s.observations)
    profile = build_profile(cfg(), results, tool_mode="tools", requests=2)
    assert profile.tool_calls_recoverable is False
    assert any("requests failed" in n for n in profile.notes)


@pytest.mark.parametrize(("status", "words"), [(401, "rejected the key in $PROBE_TEST_KEY"),
                                               (402, "cannot pay")])
def test_401_and_402_stop_the_probe_naming_the_variable(status, words):
    with pytest.raises(ProbeFatalError) as info:
        run_with(status, {"error": {"code": status, "message": f"no ({SECRET})"}}, key=SECRET)
    assert words in str(info.value) and info.value.key_error
    assert SECRET not in str(info.value)


# ---------------------------------------------------------------------------------------------
# Parser findings (traits). Each case starts from the text the model wrote (its true token ids,
# from the tokenizer alone) and applies by hand what the upstream parser does to it
# (docs/upstream-parsers.md); the probe must read the behaviour back from the response alone.

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}
THINKING_OFF = {"chat_template_kwargs": {"thinking": False}}


def section(*calls: tuple[str, str]) -> str:
    inner = "".join(f"{CALL_BEGIN}{i}{ARG_BEGIN}{a}{CALL_END}" for i, a in calls)
    return f"{SECTION_BEGIN}{inner}{SECTION_END}"


def answer(fmt, request: dict[str, Any], written: str, message: dict[str, Any], *,
           counts_stop: bool = True, finish: str = "stop",
           token_ids: bool = False) -> Observation:
    """`written`: the model's text after the prompt (`<|im_end|>` included); `message`: what the
    server's parsers made of it."""
    ids = fmt.tok.encode_with_specials(written)
    thinking = request.get("chat_template_kwargs", {}).get("thinking", True)
    prompt = fmt.encode_prompt(request["messages"], request.get("tools"), thinking=thinking)
    choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", **message},
                              "finish_reason": finish}
    if token_ids:
        choice["token_ids"] = ids
    response = {"choices": [choice], "usage": {
        "prompt_tokens": len(prompt), "completion_tokens": len(ids) - (0 if counts_stop else 1)}}
    return observe(0, request, response, fmt=fmt)


def findings_of(*groups: tuple[str, list[Observation]]) -> ParserFindings:
    results = []
    for name, observations in groups:
        result = ScenarioResult(name=name, description=name, tool_mode="tools",
                                tools_sent=True, thinking=None)
        results.append(summarize(result, observations))
    return infer_findings(results)


def weather_request(**extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "Weather in Paris? Use the tool."}],
            "tools": [WEATHER], **extra}


def plain_request(**extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "What is a prime?"}], **extra}


def call_json(call_id: str, arguments: str = ARGS) -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": "get_weather", "arguments": arguments}}


def test_stop_token_counted_or_not_is_read_from_a_clean_answer(mini_fmt):
    text = "A prime has two divisors.</think>A prime is divisible only by 1 and itself."
    message = {"reasoning": "A prime has two divisors.",
               "content": "A prime is divisible only by 1 and itself."}
    for counts in (True, False):
        obs = answer(mini_fmt, plain_request(), text + "<|im_end|>", message,
                     counts_stop=counts)
        assert obs.countable and obs.raw_completion_offset == (0 if counts else -1)
        found = findings_of(("plain", [obs]))
        assert found.counts_stop_token is counts, found.evidence


def test_vllm_deleting_the_placeholder_is_proven_by_the_count(mini_fmt):
    # vLLM's kimi_k2 parser: `(no content)` deleted, the blank content becomes null.
    written = "Call it.</think>(no content)" + section(("functions.get_weather:0", ARGS))
    message = {"reasoning": "Call it.", "content": None,
               "tool_calls": [call_json("functions.get_weather:0")]}
    deleted = answer(mini_fmt, weather_request(), written + "<|im_end|>", message,
                     finish="tool_calls")
    clean = answer(mini_fmt, plain_request(), "Hm.</think>Yes.<|im_end|>",
                   {"reasoning": "Hm.", "content": "Yes."})
    n = len(mini_fmt.tok.encode_ordinary("(no content)"))
    assert deleted.raw_completion_offset == n and deleted.content_kind == "none"
    found = findings_of(("tools", [deleted]), ("plain", [clean]))
    assert (found.deletes_no_content, found.counts_stop_token) == (True, True)
    # Without a clean answer the stop-token rule is unknown, and so is the deletion.
    assert findings_of(("tools", [deleted])).deletes_no_content is None
    # With the model's own ids the deletion is seen directly.
    by_ids = answer(mini_fmt, weather_request(), written + "<|im_end|>", message,
                    finish="tool_calls", token_ids=True)
    assert by_ids.wrote_placeholder is True
    assert findings_of(("tools", [by_ids])).deletes_no_content is True


def test_a_server_that_keeps_the_placeholder(mini_fmt):
    written = "Call it.</think>(no content)" + section(("functions.get_weather:0", ARGS))
    message = {"reasoning_content": "Call it.", "content": "(no content)",
               "tool_calls": [call_json("functions.get_weather:0")]}
    kept = answer(mini_fmt, weather_request(), written + "<|im_end|>", message,
                  finish="tool_calls")
    assert kept.content_kind == "placeholder"
    assert findings_of(("tools", [kept])).deletes_no_content is False


def history_request() -> dict[str, Any]:
    return {"messages": history_messages("Paris", RULES), "tools": [WEATHER]}


def test_sglang_renumbering_shows_in_the_history_scenario(mini_fmt):
    # Two earlier calls: K2.5 writes `functions.get_weather:2`; SGLang (non-streamed) returns
    # functions.{name}:{history + index written} = :4.
    written = "Once more.</think>" + section(("functions.get_weather:2", ARGS))
    renumbered = answer(mini_fmt, history_request(), written + "<|im_end|>", {
        "reasoning_content": "Once more.", "content": "",
        "tool_calls": [call_json("functions.get_weather:4")]}, finish="tool_calls")
    verbatim = answer(mini_fmt, history_request(), written + "<|im_end|>", {
        "reasoning": "Once more.", "content": None,
        "tool_calls": [call_json("functions.get_weather:2")]}, finish="tool_calls")
    assert renumbered.history_tool_calls == 2 and renumbered.returned_indices == [4]
    assert findings_of(("history", [renumbered])).renumbers_tool_ids is True
    assert findings_of(("history", [verbatim])).renumbers_tool_ids is False
    # One answer that only renumbering explains settles it.
    assert findings_of(("history", [verbatim, renumbered])).renumbers_tool_ids is True
    # The same ids outside the history scenario say nothing.
    assert findings_of(("tools", [renumbered])).renumbers_tool_ids is None
    # The model's own ids decide even when it wrote an unexpected index.
    odd = "Once more.</think>" + section(("functions.get_weather:0", ARGS))
    by_ids = answer(mini_fmt, history_request(), odd + "<|im_end|>", {
        "reasoning_content": "Once more.", "content": "",
        "tool_calls": [call_json("functions.get_weather:2")]}, finish="tool_calls",
        token_ids=True)
    assert by_ids.written_indices == [0]
    assert findings_of(("history", [by_ids])).renumbers_tool_ids is True


def test_sglang_without_forced_reasoning_returns_the_output_unsplit(mini_fmt):
    written = "Let me see.</think>A prime has exactly two divisors."
    unsplit = answer(mini_fmt, plain_request(), written + "<|im_end|>",
                     {"content": written, "reasoning_content": None})
    assert unsplit.think_end_in_content and not unsplit.countable
    found = findings_of(("plain", [unsplit]))
    assert found.splits_reasoning is False and found.counts_stop_token is None
    split = answer(mini_fmt, plain_request(), written + "<|im_end|>", {
        "reasoning_content": "Let me see.", "content": "A prime has exactly two divisors."})
    assert findings_of(("plain", [split])).splits_reasoning is True
    assert findings_of(("plain", [split, unsplit])).splits_reasoning is None


def test_vllm_k25_calls_instant_output_reasoning(mini_fmt):
    # Thinking off: the prompt ends `<think></think>`, the model writes only the answer, and
    # the kimi_k25 parser (thinking forced on) returns all of it as reasoning.
    forced = answer(mini_fmt, plain_request(**THINKING_OFF), "A prime.<|im_end|>",
                    {"reasoning": "A prime.", "content": None})
    honest = answer(mini_fmt, plain_request(**THINKING_OFF), "A prime.<|im_end|>",
                    {"content": "A prime."})
    assert not forced.countable and honest.countable
    assert findings_of(("thinking_off", [forced])).forces_reasoning is True
    assert findings_of(("thinking_off", [honest])).forces_reasoning is False
    assert findings_of(("thinking_off", [honest])).counts_stop_token is True


def test_a_section_opened_inside_the_thinking(mini_fmt):
    # K2.5 opens the tool section without writing `</think>` first.
    written = "I will call it." + section(("functions.get_weather:0", ARGS)) + "<|im_end|>"
    clean = answer(mini_fmt, plain_request(), "Hm.</think>Yes.<|im_end|>",
                   {"reasoning": "Hm.", "content": "Yes."})
    # SGLang with forced reasoning ends the reasoning at the section and parses the calls: the
    # API looks as if the model had closed its thinking, but usage is one short of our count
    # (we insert a `</think>` the model never wrote).
    ended = answer(mini_fmt, weather_request(), written, {
        "reasoning_content": "I will call it.", "content": "",
        "tool_calls": [call_json("functions.get_weather:0")]}, finish="tool_calls")
    assert ended.raw_completion_offset == -1
    found = findings_of(("tools", [ended]), ("plain", [clean]))
    assert (found.ends_reasoning_at_tools, found.counts_stop_token) == (True, True)
    by_ids = answer(mini_fmt, weather_request(), written, {
        "reasoning_content": "I will call it.", "content": "",
        "tool_calls": [call_json("functions.get_weather:0")]}, finish="tool_calls",
        token_ids=True)
    assert by_ids.section_in_think is True
    assert findings_of(("tools", [by_ids])).ends_reasoning_at_tools is True
    # vLLM's kimi_k2 reasoning parser finds no `</think>`: everything is reasoning, markers too.
    kept = answer(mini_fmt, weather_request(), written,
                  {"reasoning": written.removesuffix("<|im_end|>"), "content": None})
    assert kept.calls_where == "raw_reasoning"
    assert findings_of(("tools", [kept])).ends_reasoning_at_tools is False
    # Without tools no parser ran: the same answer tells nothing about one.
    plain = answer(mini_fmt, {"messages": weather_request()["messages"]}, written,
                   {"reasoning": written.removesuffix("<|im_end|>"), "content": None})
    assert findings_of(("system_prompt", [plain])).ends_reasoning_at_tools is None


def test_the_pipeline_config_takes_a_probe_mode():
    from specregen.config import ConfigError, parse_config

    base = {"storage": "out",
            "endpoint": {"base_url": "http://127.0.0.1:1/v1", "model": "moonshotai/kimi-k2.5"},
            "datasets": [{"name": "d", "adapter": "glaive", "source": "bundled:B1_glaive"}]}
    assert parse_config(base).probe == "auto"
    assert parse_config({**base, "probe": "required"}).probe == "required"
    with pytest.raises(ConfigError, match="probe"):
        parse_config({**base, "probe": "sometimes"})


def test_nothing_to_tell_leaves_every_finding_unknown():
    found = infer_findings([scenario("tools", [STRUCTURED])])
    assert (found.renumbers_tool_ids, found.deletes_no_content, found.splits_reasoning,
            found.counts_stop_token) == (None, None, None, None)
    assert found.ends_reasoning_at_tools is None
    assert set(found.evidence) == {"renumbers_tool_ids", "deletes_no_content",
                                   "splits_reasoning", "counts_stop_token",
                                   "ends_reasoning_at_tools", "forces_reasoning",
                                   "returns_logprobs"}
    assert found.returns_logprobs is None


def test_profile_traits_round_trip_and_old_versions_are_refused(tmp_path):
    profile = stripped_profile()
    profile.findings = ParserFindings(renumbers_tool_ids=True, deletes_no_content=False,
                                      splits_reasoning=None, counts_stop_token=True,
                                      evidence={"renumbers_tool_ids": "seen"})
    path = save_profile(profile, tmp_path / "p.json")
    loaded = load_profile(path)
    assert loaded.traits() == ProviderTraits(renumbers_tool_ids=True, deletes_no_content=False,
                                             splits_reasoning=None, counts_stop_token=True)
    assert loaded.findings.evidence == {"renumbers_tool_ids": "seen"}
    old = json.loads(path.read_text())
    old["version"] = PROFILE_VERSION - 1
    del old["findings"]
    path.write_text(json.dumps(old))
    with pytest.raises(ProfileError, match=f"version {PROFILE_VERSION - 1}.*probe the endpoint"):
        load_profile(path)
    bad = json.loads(profile.to_json())
    bad["findings"]["counts_stop_token"] = "yes"
    path.write_text(json.dumps(bad))
    with pytest.raises(ProfileError, match=r"findings\.counts_stop_token"):
        load_profile(path)
