"""The emulator's conversation mode (issue 10, item 6): started with whole dataset
conversations, it answers a request that continues one with the dataset's next step (its calls,
parallel ones included, or its text) or, at the divergence rate, with something else -- the same
answer for the same request on any emulator instance. Every profile of both formats answers the
multi-turn requests with tool results, and its own parsers return the scripted calls.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from specregen.emulator.config import PROFILES, EmulatorConfig
from specregen.emulator.conversations import ConversationBook, decide, request_position
from specregen.emulator.server import serve_in_thread
from specregen.models.registry import get_format
from specregen.models.tokenizer import load_tokenizer
from specregen.reconstruct import reconstruct
from specregen.records import ProviderTraits

KIMI = get_format("kimi-k2.5", load_tokenizer("mini"))
QWEN = get_format("qwen3", load_tokenizer("mini-qwen3"))


def _tool(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties}}}


TOOLS = [
    _tool("get_weather", "Get the current weather for a city.", {"city": {"type": "string"}}),
    _tool("convert_currency", "Convert an amount between currencies.",
          {"amount": {"type": "number"}, "source": {"type": "string"},
           "target": {"type": "string"}}),
]
SGLANG_TRAITS = ProviderTraits(renumbers_tool_ids=True, deletes_no_content=False,
                               splits_reasoning=True, counts_stop_token=True,
                               ends_reasoning_at_tools=True)
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
ASK_WEATHER = "What's the weather in Paris and in Tokyo?"
ASK_MONEY = "And what are 100 USD in EUR?"
PARIS = '{"city": "Paris"}'
TOKYO = '{"city":"Tokyo"}'
MONEY = '{"amount": 100, "source": "USD", "target": "EUR"}'
WEATHER_ANSWER = "Paris is sunny at 21 C; Tokyo has rain at 17 C."
MONEY_ANSWER = "100 USD are 92.40 EUR."


def _call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": arguments}}


# A glaive-like conversation: parallel calls, results, an answer, a follow-up with a tool loop.
CONVERSATION = {
    "sample_id": "conv-weather", "turns": "all", "tools": TOOLS,
    "messages": [
        SYSTEM,
        {"role": "user", "content": ASK_WEATHER},
        {"role": "assistant", "content": "", "tool_calls": [
            _call("c1", "get_weather", PARIS), _call("c2", "get_weather", TOKYO)]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 21, "sky": "sunny"}'},
        {"role": "tool", "tool_call_id": "c2", "content": '{"temp": 17, "sky": "rain"}'},
        {"role": "assistant", "content": WEATHER_ANSWER},
        {"role": "user", "content": ASK_MONEY},
        {"role": "assistant", "content": None, "tool_calls": [
            _call("c3", "convert_currency", MONEY)]},
        {"role": "tool", "tool_call_id": "c3", "content": '{"result": 92.4}'},
        {"role": "assistant", "content": MONEY_ANSWER},
    ],
}
# Step by step: (user turn, step) -> what the dataset says there.
DATASET_STEPS = {
    (0, 0): [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Tokyo"})],
    (0, 1): WEATHER_ANSWER,
    (1, 0): [("convert_currency", {"amount": 100, "source": "USD", "target": "EUR"})],
    (1, 1): MONEY_ANSWER,
}


@pytest.fixture(scope="module")
def conversations(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("conv") / "conversations.jsonl"
    other = {"sample_id": "conv-other", "turns": "all",
             "messages": [{"role": "user", "content": "Tell me a joke."},
                          {"role": "assistant", "content": "Why did the cache miss? It was LRU."}]}
    lines = [json.dumps(CONVERSATION), "{not json", json.dumps(other),
             json.dumps({"sample_id": "bad", "messages": [{"role": "tool", "content": "x"}]})]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _emulator(path: Path, profile: str = "vllm", rate: float = 0.0, seed: int = 0,
              model: str = "moonshotai/kimi-k2.5", tok: Any = None, **knobs: Any):
    config = EmulatorConfig(profile=profile, model=model, seed=seed, conversations=str(path),
                            divergence_rate=rate, reasoning_tokens_mean=30,
                            content_tokens_mean=20, literal_marker_rate=0.0, **knobs)
    return serve_in_thread(config, tok or KIMI.tok)


def _base(emu: Any, profile: str) -> str:
    return emu.openrouter_url if profile == "openrouter" else emu.url


def _post(url: str, request: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(url + "/chat/completions", json=request, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def _calls_of(message: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in message.get("tool_calls") or []]


def _walk(url: str, model: str, reasoning_field: str, extra: dict[str, Any] | None = None
          ) -> list[tuple[tuple[int, int], dict[str, Any], dict[str, Any]]]:
    """A driver's walk through CONVERSATION: the model's own answers as history, the dataset's
    results re-addressed to the model's call ids. Returns (position, request, body) per step."""
    results = {(0, 0): [m for m in CONVERSATION["messages"][3:5]],
               (1, 0): [CONVERSATION["messages"][8]]}
    messages: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": ASK_WEATHER}]
    out = []
    for position in [(0, 0), (0, 1), (1, 0), (1, 1)]:
        if position == (1, 0):
            messages.append({"role": "user", "content": ASK_MONEY})
        request = {"model": model, "messages": list(messages), "tools": TOOLS,
                   "return_token_ids": True, **(extra or {})}
        body = _post(url, request)
        message = body["choices"][0]["message"]
        out.append((position, request, body))
        history = {"role": "assistant", "content": message.get("content") or ""}
        if message.get(reasoning_field):
            history["reasoning_content"] = message[reasoning_field]
        if message.get("tool_calls"):
            history["tool_calls"] = message["tool_calls"]
        messages.append(history)
        for call, result in zip(message.get("tool_calls") or [], results.get(position, []),
                                strict=False):
            messages.append({**result, "tool_call_id": call["id"]})
    return out


def _sorted(calls: list[tuple[str, Any]]) -> list[str]:
    return sorted(json.dumps(c, sort_keys=True) for c in calls)


# -- the dataset's own steps ---------------------------------------------------------------------


@pytest.mark.parametrize("profile", ["vllm", "sglang", "openrouter", "moonshot", "vllm-k25"])
def test_recognised_conversation_is_answered_with_the_datasets_steps(conversations, profile):
    with _emulator(conversations, profile) as emu:
        # As specregen's client asks (vLLM's default puts spaces around added tokens).
        walk = _walk(_base(emu, profile), "moonshotai/kimi-k2.5",
                     "reasoning" if profile in ("vllm", "vllm-k25", "openrouter")
                     else "reasoning_content", {"spaces_between_special_tokens": False})
    for position, request, body in walk:
        message = body["choices"][0]["message"]
        expected = DATASET_STEPS[position]
        if isinstance(expected, str):
            assert message["content"] == expected, (profile, position)
            assert not message.get("tool_calls")
            assert body["choices"][0]["finish_reason"] == "stop"
        else:
            # Parsed back by the profile's own parsers: the dataset's names and JSON-equal
            # arguments, the parallel calls kept.
            assert _sorted(_calls_of(message)) == _sorted(expected), (profile, position)
            assert body["choices"][0]["finish_reason"] == "tool_calls"
        # Reasoning is still written (thinking is on by default).
        reasoning = message.get("reasoning") or message.get("reasoning_content")
        assert reasoning, (profile, position)
        # The ids are coherent: reconstruction rebuilds exactly what the emulator generated.
        # (SGLang renumbers the ids the model wrote; the probe tells reconstruction so.)
        sample = reconstruct("s", request, body, KIMI,
                             reference_completion_ids=body["choices"][0]["token_ids"],
                             traits=SGLANG_TRAITS if profile == "sglang" else None)
        assert sample.reference_match == "exact", (profile, position, sample.flags)
    # K2.5 ids count over the conversation: the follow-up's call is the third call, which
    # SGLang numbers again from the request's history count (2 + 2).
    ids = [c["id"] for c in walk[2][2]["choices"][0]["message"]["tool_calls"]]
    assert ids == ["functions.convert_currency:4" if profile == "sglang"
                   else "functions.convert_currency:2"], profile
    first = [c["id"] for c in walk[0][2]["choices"][0]["message"]["tool_calls"]]
    assert first == ["functions.get_weather:0", "functions.get_weather:1"]


@pytest.mark.parametrize("profile", ["raw", "stripped", "sglang-noforce", "vllm-legacy"])
def test_every_other_kimi_profile_answers_the_tool_loop(conversations, profile):
    with _emulator(conversations, profile) as emu:
        walk = _walk(emu.url, "moonshotai/kimi-k2.5", "reasoning_content")
    first = walk[0][2]["choices"][0]["message"]
    if profile == "raw":
        # Calls are never parsed: the section stays in content, and it holds the dataset's.
        parsed = KIMI.parse_tool_calls(first["content"], truncated=False)
        assert parsed is not None
        assert _sorted([(c.name, json.loads(c.arguments)) for c in parsed.calls]) == _sorted(
            DATASET_STEPS[(0, 0)])
    elif profile == "stripped":
        assert "get_weather:1" in first["content"] and "Tokyo" in first["content"]
    else:
        assert _sorted(_calls_of(first)) == _sorted(DATASET_STEPS[(0, 0)])
    assert walk[3][2]["choices"][0]["message"]["content"].endswith(MONEY_ANSWER)


def test_thinking_off_follows_without_reasoning(conversations):
    with _emulator(conversations, "vllm") as emu:
        walk = _walk(emu.url, "moonshotai/kimi-k2.5", "reasoning",
                     {"chat_template_kwargs": {"thinking": False}})
    assert _sorted(_calls_of(walk[0][2]["choices"][0]["message"])) == _sorted(
        DATASET_STEPS[(0, 0)])
    last = walk[3][2]["choices"][0]["message"]
    # vLLM 0.32's detokenizer puts a space before the first token after the prompt's
    # `</think>` (an added token; docs/vllm-0.32.md, 1.2).
    assert last["content"] == " " + MONEY_ANSWER and last.get("reasoning") is None


@pytest.mark.parametrize("profile", ["vllm-hermes", "openrouter", "sglang"])
def test_a_qwen3_conversation_is_answered_too(conversations, profile):
    field = "reasoning_content" if profile == "sglang" else "reasoning"
    with _emulator(conversations, profile, model="Qwen/Qwen3-8B", tok=QWEN.tok) as emu:
        walk = _walk(_base(emu, profile), "Qwen/Qwen3-8B", field)
    for position, request, body in walk:
        message = body["choices"][0]["message"]
        expected = DATASET_STEPS[position]
        if isinstance(expected, str):
            # vLLM's qwen3 reasoning parser keeps the `\n\n` Qwen3 writes after `</think>`.
            assert message["content"] == "\n\n" + expected, (profile, position)
        else:
            assert _sorted(_calls_of(message)) == _sorted(expected), (profile, position)
            # Each server's own random ids: vLLM 0.32 `chatcmpl-tool-` + 16 hex digits
            # (`utils.random_uuid`), the earlier vLLM behind OpenRouter 32, SGLang call_<24 hex>.
            form = {"sglang": r"call_[0-9a-f]{24}", "openrouter": r"chatcmpl-tool-[0-9a-f]{32}",
                    "vllm-hermes": r"chatcmpl-tool-[0-9a-f]{16}"}[profile]
            assert all(re.fullmatch(form, c["id"]) for c in message["tool_calls"])
        assert message.get(field)
        sample = reconstruct("s", request, body, QWEN,
                             reference_completion_ids=body["choices"][0]["token_ids"])
        assert sample.reference_match == "exact", (profile, position, sample.flags)


# -- divergence ----------------------------------------------------------------------------------


def test_rate_one_always_diverges_in_every_way(conversations):
    book = ConversationBook.load(conversations)
    plan = book.by_first_user[ASK_WEATHER][0]
    tools = [t["function"] for t in TOOLS]
    called = {"0,0": request_position([SYSTEM, {"role": "user", "content": ASK_WEATHER}])}
    answered = request_position([
        SYSTEM, {"role": "user", "content": ASK_WEATHER},
        {"role": "assistant", "content": "", "tool_calls": []},
        {"role": "tool", "content": "x"}, {"role": "tool", "content": "y"}])
    kinds = set()
    for seed in range(40):
        script = decide(plan, called["0,0"], tools, seed, 1.0)
        kinds.add(script.divergence)
        got = _sorted([(c.name, c.arguments) for c in script.calls])
        assert got != _sorted(DATASET_STEPS[(0, 0)])
        if script.divergence == "other_arguments":
            assert [c.name for c in script.calls] == ["get_weather", "get_weather"]
        if script.divergence == "text":
            assert script.calls == () and script.content is None
        where_answered = decide(plan, answered, tools, seed, 1.0)
        assert where_answered.divergence == "calls" and where_answered.calls
    assert kinds == {"other_arguments", "other_tool", "text"}


def test_rate_zero_never_diverges_and_rate_one_does_over_http(conversations):
    request = {"model": "moonshotai/kimi-k2.5", "tools": TOOLS,
               "messages": [SYSTEM, {"role": "user", "content": ASK_WEATHER}]}
    seen = {}
    for rate in (0.0, 1.0):
        with _emulator(conversations, "vllm", rate=rate, seed=5) as emu:
            seen[rate] = _calls_of(_post(emu.url, request)["choices"][0]["message"])
    assert _sorted(seen[0.0]) == _sorted(DATASET_STEPS[(0, 0)])
    assert _sorted(seen[1.0]) != _sorted(DATASET_STEPS[(0, 0)])


def test_the_decision_depends_on_the_seed_and_position_only():
    plan = ConversationBook.from_lines([json.dumps(CONVERSATION)]).by_first_user[ASK_WEATHER][0]
    position = request_position([{"role": "user", "content": ASK_WEATHER}])
    tools = [t["function"] for t in TOOLS]
    decisions = [decide(plan, position, tools, seed, 0.5).divergence is None
                 for seed in range(64)]
    # About half follow the dataset, half do not; the same seed decides the same way.
    assert 16 < sum(decisions) < 48
    assert decisions == [decide(plan, position, tools, seed, 0.5).divergence is None
                         for seed in range(64)]


# -- determinism and fallback --------------------------------------------------------------------


def _normal(body: dict[str, Any]) -> str:
    return re.sub(r'"created": ?\d+', '"created":0', json.dumps(body, sort_keys=True))


def test_two_instances_give_the_same_answers_in_any_order(conversations):
    with _emulator(conversations, "sglang", rate=0.5, seed=11) as first:
        walk = _walk(first.url, "moonshotai/kimi-k2.5", "reasoning_content")
    requests = [request for _, request, _ in walk]
    with _emulator(conversations, "sglang", rate=0.5, seed=11) as second:
        again = [_post(second.url, r) for r in reversed(requests)][::-1]
    assert [_normal(b) for b in again] == [_normal(b) for _, _, b in walk]


def test_unknown_conversation_answers_as_without_conversation_mode(conversations):
    requests = [
        {"model": "moonshotai/kimi-k2.5", "tools": TOOLS,
         "messages": [SYSTEM, {"role": "user", "content": "What's the weather in Oslo?"}]},
        # The right opening question, but a follow-up the dataset never asked.
        {"model": "moonshotai/kimi-k2.5", "tools": TOOLS, "messages": [
            {"role": "user", "content": ASK_WEATHER},
            {"role": "assistant", "content": "It is sunny."},
            {"role": "user", "content": "Thanks! And in Lima?"}]},
    ]
    config = EmulatorConfig(profile="vllm", seed=3, literal_marker_rate=0.0,
                            reasoning_tokens_mean=30, content_tokens_mean=20)
    with (_emulator(conversations, "vllm", seed=3) as emu,
          serve_in_thread(config, KIMI.tok) as plain):
        for request in requests:
            assert _normal(_post(emu.url, request)) == _normal(_post(plain.url, request))


def test_positions_are_counted_as_the_plan_counts():
    messages = [SYSTEM, {"role": "user", "content": "a"}, {"role": "user", "content": "b"},
                {"role": "assistant", "content": "", "tool_calls": [_call("x", "f", "{}")]},
                {"role": "tool", "tool_call_id": "x", "content": "r"},
                {"role": "assistant", "content": "done"},
                {"role": "user", "content": [{"type": "text", "text": "c"}]},
                {"role": "assistant", "content": "", "tool_calls": [_call("y", "f", "{}")]},
                {"role": "tool", "tool_call_id": "y", "content": "r"}]
    position = request_position(messages)
    assert position.users == (("a", "b"), ("c",)) and position.user_turn == 1
    assert position.step == 1
    assert request_position([SYSTEM]) is None


def test_bad_lines_are_skipped_with_their_line_number(conversations):
    book = ConversationBook.load(conversations)
    assert book.size == 2
    assert [number for number, _ in book.rejected] == [2, 4]
    with pytest.raises(ValueError, match="does not exist"):
        ConversationBook.load(conversations.parent / "missing.jsonl")


def test_every_kimi_profile_is_exercised():
    covered = {"vllm", "sglang", "openrouter", "moonshot", "vllm-k25", "raw", "stripped",
               "sglang-noforce", "vllm-legacy"}
    assert covered == set(PROFILES)


def test_cli_passes_conversation_mode(monkeypatch, conversations):
    from typer.testing import CliRunner

    from specregen.cli import app
    from specregen.emulator import server

    seen = {}

    def fake_serve(config, tok, host, port, on_listening=None):
        seen["config"] = config

    monkeypatch.setattr(server, "serve_forever", fake_serve)
    result = CliRunner().invoke(app, ["emulator", "--conversations", str(conversations),
                                      "--divergence-rate", "0.3"])
    assert result.exit_code == 0, result.output
    assert (seen["config"].conversations, seen["config"].divergence_rate) == (
        str(conversations), 0.3)
    said = " ".join(result.output.split())  # the console wraps long lines
    assert "2 conversations" in said and "line 2 skipped" in said
