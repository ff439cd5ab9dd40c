"""Kimi K3 against the real vLLM 0.32 (`--tokenizer-mode kimi_k3`, kimi_k3 tool and reasoning
parsers; the folder holds our own tokenizer class and encoder: models/kimi_k3/realvllm.py).

* The prompt: the ids the server renders for a battery of requests (docs/kimi-k3.md §5, E1)
  equal our offline rendering of vLLM's handling (servers.encode_prompt).
* The output (E2): the fidelity corpus scripted into the server, plain and streamed, both ways
  of asking; the emulator's `vllm-k3` profile answers the same ids the same way, as the client
  reads both (conformance); reconstruction of the real answers is never `ok` with wrong ids
  outside the erased group; the stop token comes back as `stop_reason` 163586.

Named test_x_* so that it runs after the K2.5 and Qwen3 files: one server at a time.
"""

from __future__ import annotations

from collections import Counter

import httpx
import pytest

from specregen.models.kimi_k3 import servers as sv
from specregen.models.kimi_k3.format import completion_segments
from specregen.realserver import conformance

REQUESTS = 12
# A real server on a shared CPU: the corpus' answers (4 per request) and the endpoint probe
# take longer than the suite's default 600 s here.
pytestmark = pytest.mark.timeout(2400)
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "ping"}}]
CALLS = [{"id": "chatcmpl-tool-00000000000000a1", "type": "function",
          "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}},
         {"id": "chatcmpl-tool-00000000000000b2", "type": "function",
          "function": {"name": "ping", "arguments": "not json"}}]

def _stopped(fmt, segments) -> list[int]:
    """The ids of a completion's segments, with the stop id."""
    return [*fmt.encode_segments(segments), fmt.stop_id]



def _battery(model: str) -> list[dict]:
    user = {"role": "user", "content": "What is the weather in Oslo?"}
    history = [user, {"role": "assistant", "content": None, "tool_calls": CALLS,
                      "reasoning_content": "Two calls."},
               {"role": "tool", "tool_call_id": "ping:1", "content": "pong"},
               {"role": "tool", "tool_call_id": CALLS[0]["id"],
                "content": [{"type": "text", "text": "sunny"}, {"type": "text", "text": "9C"}]}]
    base = {"model": model, "messages": [user]}
    return [
        base,
        {**base, "chat_template_kwargs": {"thinking": False}},
        {**base, "reasoning_effort": "low"},
        {**base, "reasoning_effort": "none"},
        {**base, "tools": TOOLS},
        {**base, "tools": TOOLS, "tool_choice": "none"},
        {**base, "tools": TOOLS, "tool_choice": "required"},
        {**base, "response_format": {"type": "json_object"}},
        {**base, "response_format": {"type": "json_schema", "json_schema": {
            "name": "w", "schema": {"type": "object", "properties": {"t": {"type": "number"}}}}}},
        {"model": model, "messages": [{"role": "system", "content": "Be brief.", "name": "ops"},
                                      {"role": "user", "content": [
                                          {"type": "text", "text": "a"},
                                          {"type": "text", "text": "b <|open|>"}]}]},
        {"model": model, "messages": [*history, {"role": "user", "content": "And now?"}],
         "tools": TOOLS},
        {"model": model, "messages": [
            user, {"role": "assistant", "content": "Hi", "reasoning": "  "},
            {"role": "user", "content": "Again"}]},
        {**base, "continue_final_message": False, "chat_template_kwargs": {
            "thinking_effort": "high"}},
    ]


def test_the_servers_prompt_is_ours(k3) -> None:
    mismatched = []
    for k, request in enumerate(_battery(k3.spec.served_model_name)):
        real = k3.server.prompt_ids(request)
        ours = sv.encode_prompt(request, k3.tok)
        if real != ours:
            mismatched.append((k, k3.tok.decode(real)[-300:], k3.tok.decode(ours)[-300:]))
        assert ours in k3.fmt.prompt_variants(request["messages"], request.get("tools"),
                                              sv.parser_thinking(request), None,
                                              request=request)
    assert not mismatched, mismatched


def test_an_unsupported_effort_is_refused(k3) -> None:
    body = {"model": k3.spec.served_model_name, "max_tokens": 1,
            "messages": [{"role": "user", "content": "x"}], "reasoning_effort": "medium"}
    response = httpx.post(k3.server.base_url + "/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 400


def test_a_scripted_answer_and_its_stop_reason(k3) -> None:
    request = {"model": k3.spec.served_model_name,
               "messages": [{"role": "user", "content": "Say hello. (k3 harness)"}]}
    ids = _stopped(k3.fmt, completion_segments("The user greets.", "Hello!", [], thinking=True))
    prompt = k3.server.script_request(request, ids)
    body = httpx.post(k3.server.base_url + "/v1/chat/completions",
                      json={**request, "return_token_ids": True}, timeout=120).json()
    choice = body["choices"][0]
    assert choice["token_ids"] == ids and body["prompt_token_ids"] == prompt
    assert (choice["message"]["reasoning"], choice["message"]["content"]) == (
        "The user greets.", "Hello!")
    assert choice["stop_reason"] == k3.fmt.stop_id  # the generation config's EOS, by id
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == len(
        k3.tok.encode_ordinary("The user greets."))


@pytest.fixture(scope="module")
def results(real_servers):
    k3 = real_servers.get("kimi-k3")
    traits = {v: real_servers.profile("kimi-k3", v).traits() for v in conformance.VARIANTS}
    cases = conformance.real_cases(k3.spec, k3.tok, REQUESTS, seed=5)
    return conformance.run(k3.server, k3.fmt, cases, traits=traits)


def test_the_emulator_answers_like_the_real_server(results) -> None:
    differing = [(r.case.sample_id, r.case.shape, r.variant, r.stream, r.diffs)
                 for r in results if r.diffs]
    assert not differing, differing


def test_no_real_answer_is_ok_with_wrong_ids(results) -> None:
    wrong = [(r.case.sample_id, r.case.shape, r.variant, r.stream, name, m.sample.flags)
             for r in results for name, m in r.measures.items()
             if m.outcome == "wrong_ok" and r.case.group(r.stream) != "erased"]
    assert not wrong, wrong
    outcomes = Counter((name, m.outcome) for r in results for name, m in r.measures.items())
    assert {"blind", "probed"} <= {name for name, _ in outcomes}, outcomes
    shaped = [r for r in results if r.case.template_shaped]
    ok = sum(r.measures["probed"].outcome == "ok" for r in shaped)
    assert ok >= 0.6 * len(shaped), outcomes


def test_the_prompt_we_render_is_the_servers_on_every_answer(results) -> None:
    assert all(r.prompt_equal for r in results), [
        r.case.sample_id for r in results if not r.prompt_equal]
