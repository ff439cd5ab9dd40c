"""Qwen3 behind SGLang (`--reasoning-parser qwen3 --tool-call-parser qwen25`, non-streamed):
hand-checked cases of the restated parsers and message handling (docs/qwen3.md, "SGLang"), and
the emulator's `sglang` profile reconstructing to its true ids."""

from __future__ import annotations

import httpx
import pytest

from specregen.emulator.config import EmulatorConfig
from specregen.emulator.server import serve_in_thread
from specregen.models.qwen3 import servers as sv
from specregen.models.registry import get_format
from specregen.models.tokenizer import load_tokenizer
from specregen.reconstruct import reconstruct

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris"}}\n</tool_call>'


def parsed(text, *, thinking=None, tools=True, truncated=False, **extra):
    kwargs = extra.pop("kwargs", {})
    request = {"messages": [{"role": "user", "content": "q"}], **extra}
    if tools:
        request["tools"] = TOOLS
    if thinking is not None:
        request["chat_template_kwargs"] = {"enable_thinking": thinking, **kwargs}
    return sv.sglang_parse(sv.Output(text, (), truncated), request)


def calls_of(p):
    return [(c.name, c.arguments) for c in p.calls]


def test_reasoning_split_and_stripped_content_before_calls():
    p = parsed("<think>\nR\n</think>\n\nChecking.\n" + CALL)
    assert (p.reasoning, p.content, p.finish_reason) == ("\nR\n", "Checking.", "tool_calls")
    # Arguments re-dumped with json.dumps' default separators.
    assert calls_of(p) == [("get_weather", '{"city": "Paris"}')]
    # Without calls nothing is stripped.
    p = parsed("<think>\nR\n</think>\n\nHello.\n")
    assert (p.reasoning, p.content, p.calls, p.finish_reason) == (
        "\nR\n", "\n\nHello.\n", (), "stop")


def test_forced_reasoning_ends_at_a_call_and_at_the_cut():
    # No </think>: the reasoning ends at `<tool_call>`, which stays for the tool parser.
    p = parsed("<think>\nR" + CALL)
    assert (p.reasoning, p.content, calls_of(p)) == (
        "\nR", "", [("get_weather", '{"city": "Paris"}')])
    p = parsed("<think>\nstill thinking", truncated=True)
    assert (p.reasoning, p.content, p.calls, p.finish_reason) == (
        "\nstill thinking", "", (), "length")


def test_thinking_off_leaves_everything_content():
    p = parsed("Sure.\n" + CALL, thinking=False)
    assert (p.reasoning, p.content, p.finish_reason) == (None, "Sure.", "tool_calls")
    # Not forced and no `<think>`: a literal `</think>` is content.
    p = parsed("a</think>b", thinking=False, tools=False)
    assert (p.reasoning, p.content) == (None, "a</think>b")
    # `force_nonempty_content`: a reasoning-only answer comes back as content.
    p = parsed("<think>\nonly thoughts", thinking=True,
               kwargs={"force_nonempty_content": True})
    assert (p.reasoning, p.content) == (None, "\nonly thoughts")


def test_blocks_parse_one_by_one_and_unknown_functions_drop():
    bad = '<tool_call>\n{"name": "get_weather", "arguments": {\n</tool_call>'
    p = parsed(CALL + "\n" + bad, thinking=False)
    assert (p.content, calls_of(p), p.finish_reason) == (
        "", [("get_weather", '{"city": "Paris"}')], "tool_calls")
    # A function not in `tools` is dropped; the marker alone still makes it `tool_calls`.
    p = parsed('Let me see.\n<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>',
               thinking=False)
    assert (p.content, p.calls, p.finish_reason) == ("Let me see.", (), "tool_calls")
    # Text after the calls is dropped.
    p = parsed(CALL + "\nDone.", thinking=False)
    assert (p.content, len(p.calls)) == ("", 1)
    # Non-ASCII argument values stay as characters.
    p = parsed('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n'
               "</tool_call>", thinking=False)
    assert calls_of(p) == [("get_weather", '{"city": "Zürich"}')]


def test_untriggered_and_failing_parses_keep_the_text():
    # `<tool_call>` without its newline is not the detector's trigger.
    text = '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>'
    p = parsed(text, thinking=False)
    assert (p.content, p.calls, p.finish_reason) == (text, (), "stop")
    # A block that is JSON but not an object makes upstream raise: all text, finish restored.
    text = '<tool_call>\n"get_weather"\n</tool_call>'
    p = parsed(text, thinking=False)
    assert (p.content, p.calls, p.finish_reason) == (text, (), "stop")
    # tool_choice none: no tool parsing at all; a length stop stays `length`.
    p = parsed("Sure.\n" + CALL, thinking=False, tool_choice="none")
    assert (p.content, p.calls) == ("Sure.\n" + CALL, ())
    p = parsed("Sure.\n" + CALL, thinking=False, truncated=True)
    assert (p.content, p.finish_reason) == ("Sure.", "length")


def test_sglang_messages_and_prompt():
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "reasoning": "R", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1",
         "content": [{"type": "text", "text": "20C"}, {"type": "text", "text": "sunny"}]},
    ]
    served = sv.sglang_server_messages(messages)
    assert served[0] == {"role": "user", "content": "Weather?"}
    # `reasoning` is no field of SGLang's message model: dropped; absent fields are None.
    assert served[1] == {"role": "assistant", "content": "", "tool_call_id": None,
                         "name": None, "reasoning_content": None, "tool_calls": [
                             {"id": "call_1", "index": None, "type": "function",
                              "function": {"name": "get_weather",
                                           "arguments": {"city": "Paris"}}}]}
    assert served[2]["content"] == "20C sunny"
    request = {"messages": messages, "tools": TOOLS}
    # The assistant turn after the last user query keeps its reasoning on vLLM only.
    assert "<think>\nR\n</think>" in sv.render_prompt_text(request)
    assert "<think>" not in sv.sglang_render_prompt_text(request).split("<|im_start|>")[3]
    # A final assistant message becomes a user turn.
    tail = sv.sglang_server_messages([{"role": "user", "content": "a"},
                                      {"role": "assistant", "content": "b"}])
    assert tail[-1] == {"role": "user", "content": "b"}
    for bad in ('["x"]', ""):
        with pytest.raises(sv.RequestError, match=r"messages\[1\]\.tool_calls\[0\]"):
            sv.sglang_server_messages([messages[0], {**messages[1], "tool_calls": [
                {**call, "function": {"name": "f", "arguments": bad}}]}])


def test_the_emulators_sglang_profile_reconstructs_exactly():
    qwen = get_format("qwen3", load_tokenizer("mini-qwen3"))
    config = EmulatorConfig(profile="sglang", model="Qwen/Qwen3-8B", seed=11,
                            reasoning_tokens_mean=30, content_tokens_mean=20)
    with_calls = stripped = 0
    with serve_in_thread(config, qwen.tok) as emu:
        for k in range(24):
            request = {"model": "Qwen/Qwen3-8B", "return_token_ids": True,
                       "messages": [{"role": "user", "content": f"Weather, case {k}?"}]}
            if k % 3:
                request["tools"] = TOOLS
            if k % 4 == 1:
                request["chat_template_kwargs"] = {"enable_thinking": False}
            body = httpx.post(emu.url + "/chat/completions", json=request, timeout=30).json()
            message = body["choices"][0]["message"]
            assert "reasoning" not in message and message["content"] is not None
            for call in message.get("tool_calls") or ():
                assert call["id"].startswith("call_") and len(call["id"]) == 29
                with_calls += 1
                stripped += message["content"] == message["content"].strip()
            truth = body["choices"][0]["token_ids"]
            for ids in (truth, None):
                sample = reconstruct(f"s{k}", request, {**body, "prompt_token_ids": None},
                                     qwen, reference_completion_ids=ids)
                assert sample.input_ids == body["prompt_token_ids"] + truth, (k, sample.flags)
                assert sample.status == "ok", (k, sample.flags)
        streamed = httpx.post(emu.url + "/chat/completions", timeout=30,
                              json={**request, "stream": True})
        assert streamed.status_code == 400 and "non-streamed" in streamed.text
    assert with_calls >= 4 and stripped == with_calls
