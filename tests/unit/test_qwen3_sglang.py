"""Qwen3 behind SGLang (`--reasoning-parser qwen3 --tool-call-parser qwen25`), plain and streamed:
hand-checked cases of the restated parsers and message handling (docs/qwen3.md, "SGLang"), and
the emulator's `sglang` profile reconstructing to its true ids."""

from __future__ import annotations

import httpx
import pytest

from specregen.emulator.config import EmulatorConfig
from specregen.emulator.server import serve_in_thread
from specregen.models.qwen3 import served as qserved
from specregen.models.qwen3 import servers as sv
from specregen.models.qwen3 import sglang as sg
from specregen.models.qwen3 import vllm_legacy as vl
from specregen.models.registry import get_format
from specregen.models.serverkit import stream as kit
from specregen.models.tokenizer import load_tokenizer
from specregen.reconstruct import reconstruct
from specregen.wire.stream import assemble_lines

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
    return sg.parse(kit.Output(text, (), truncated), request)


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
    served = sg.server_messages(messages)
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
    assert "<think>\nR\n</think>" in vl.render_prompt_text(request)
    assert "<think>" not in sg.render_prompt_text(request).split("<|im_start|>")[3]
    # A final assistant message becomes a user turn.
    tail = sg.server_messages([{"role": "user", "content": "a"},
                                      {"role": "assistant", "content": "b"}])
    assert tail[-1] == {"role": "user", "content": "b"}
    for bad in ('["x"]', ""):
        with pytest.raises(sv.RequestError, match=r"messages\[1\]\.tool_calls\[0\]"):
            sg.server_messages([messages[0], {**messages[1], "tool_calls": [
                {**call, "function": {"name": "f", "arguments": bad}}]}])


@pytest.mark.parametrize("stream", [False, True])
def test_the_emulators_sglang_profile_reconstructs_exactly(stream):
    qwen = get_format("qwen3", load_tokenizer("mini-qwen3"))
    config = EmulatorConfig(profile="sglang", model="Qwen/Qwen3-8B", seed=11,
                            reasoning_tokens_mean=30, content_tokens_mean=20)
    with_calls = stripped = cut = exact = 0
    with serve_in_thread(config, qwen.tok) as emu:
        for k in range(24):
            request = {"model": "Qwen/Qwen3-8B", "return_token_ids": True,
                       "messages": [{"role": "user", "content": f"Weather, case {k}?"}]}
            if k % 3:
                request["tools"] = TOOLS
            if k % 4 == 1:
                request["chat_template_kwargs"] = {"enable_thinking": False}
            if stream and k % 5 == 4:
                request["max_tokens"] = 12 + k
            if stream:
                request = {**request, "stream": True}
                text = httpx.post(emu.url + "/chat/completions", json=request,
                                  timeout=30).text
                body, done = assemble_lines(text.splitlines())
                assert done
            else:
                body = httpx.post(emu.url + "/chat/completions", json=request,
                                  timeout=30).json()
            message = body["choices"][0]["message"]
            assert "reasoning" not in message and message["content"] is not None
            for call in message.get("tool_calls") or ():
                assert call["id"].startswith("call_") and len(call["id"]) == 29
                with_calls += 1
                stripped += message["content"] == message["content"].strip()
            truth = body["choices"][0]["token_ids"]
            cut += body["choices"][0]["finish_reason"] == "length"
            for ids in (truth, None):
                sample = reconstruct(f"s{k}", request, {**body, "prompt_token_ids": None},
                                     qwen, reference_completion_ids=ids)
                assert sample.status == "ok", (k, stream, sample.flags)
                assert sample.input_ids == body["prompt_token_ids"] + truth, (k, sample.flags)
                exact += 1
    assert exact == 48
    assert with_calls >= 4
    # Non-streamed content before calls comes back stripped; streamed it keeps its newlines.
    # (Streamed, only an empty content with thinking off looks stripped.)
    assert stripped == with_calls if not stream else stripped < with_calls
    assert cut >= (2 if stream else 0)


# -- the stream (expectations worked out by hand from serving_chat._generate_chat_stream, the
# reasoning detector's streaming increment and the qwen25/base detectors; docs/qwen3.md)


def streamed(deltas, *, thinking=None, tools=True, truncated=False):
    request = {"messages": [{"role": "user", "content": "q"}], "stream": True}
    if tools:
        request["tools"] = TOOLS
    if thinking is not None:
        request["chat_template_kwargs"] = {"enable_thinking": thinking}
    out = kit.Output("".join(deltas), tuple(kit.Delta(d, 0) for d in deltas), truncated)
    return sg.stream(out, request)


CALL_STEPS = ["<tool_call>", "\n", '{"name": "get_weather", ', '"arguments": {"city": ',
              '"Par', 'is"}}']


def test_stream_reasoning_then_content_untrimmed():
    s = streamed(["<think>", "\nR", "\n", "</think>", "\n\n", "Hi", ""], tools=False)
    assert (s.parsed.reasoning, s.parsed.content, s.parsed.finish_reason) == (
        "\nR\n", "\n\nHi", "stop")
    # Not forced: a `<` alone is held (a prefix of `<think>`), then passed on.
    s = streamed(["a", "<", "b>", ""], thinking=False, tools=False)
    assert (s.parsed.reasoning, s.parsed.content) == (None, "a<b>")


def test_stream_content_before_calls_keeps_its_newlines_and_nothing_follows_the_calls():
    s = streamed(["Sure", ".\n", *CALL_STEPS, "\n", "</tool_call>", ""], thinking=False)
    # Text before the call is not stripped (the non-streamed answer strips it). Arguments:
    # the completing step sends the whole `json.dumps` (the first value had nothing to diff).
    assert (s.parsed.content, calls_of(s.parsed), s.parsed.finish_reason) == (
        "Sure.\n", [("get_weather", '{"city": "Paris"}')], "tool_calls")
    assert s.content_at_calls == (6,)
    # Once a call is done, a buffer opening with the separator "\n" stays in the detector:
    # the newlines, `</tool_call>` and any text after the calls are never sent.
    two = [*CALL_STEPS, "\n", "</tool_call>", "\n", *CALL_STEPS, "\n", "</tool_call>",
           "\n", "Done.", ""]
    s = streamed(two, thinking=False)
    assert (s.parsed.content, s.content_at_calls) == ("", (0, 0))
    assert calls_of(s.parsed) == [("get_weather", '{"city": "Paris"}')] * 2
    # Braces in the text before a call are plain text (`has_tool_call` is the trigger).
    s = streamed(["v", "{3", "}", "\n", *CALL_STEPS, ""], thinking=False)
    assert (s.parsed.content, len(s.parsed.calls)) == ("v{3}\n", 1)


def test_stream_arguments_are_ascii_escaped_dumps_and_topped_up_at_a_cut():
    steps = [*CALL_STEPS[:-2], '"北京"}}', "\n", "</tool_call>", ""]
    s = streamed(steps, thinking=False)
    assert calls_of(s.parsed) == [("get_weather", '{"city": "\\u5317\\u4eac"}')]
    # Cut inside the string: the stable prefix was streamed, then the finishing chunk adds
    # the rest of `json.dumps(partial, ensure_ascii=False)` -- a closed object.
    s = streamed([*CALL_STEPS[:-1], "is"], thinking=False, truncated=True)
    assert (calls_of(s.parsed), s.parsed.finish_reason) == (
        [("get_weather", '{"city": "Paris"}')], "length")
    # Empty arguments are falsy: never streamed, never tracked, so not topped up either.
    s = streamed(["<tool_call>", "\n", '{"name": "get_weather", ', '"arguments": {}}', "\n",
                  "</tool_call>", ""], thinking=False)
    assert (s.parsed.content, calls_of(s.parsed), s.parsed.finish_reason) == (
        "", [("get_weather", "")], "tool_calls")


def test_sglang_detokenizer_shows_printable_text_and_keeps_a_cut_character():
    assert sg._printable("ab \ufffd") == "ab " and sg._printable("北\ufffd") == "北"
    assert sg._printable("x\n") == "x\n" and sg._printable("ab\ufffd") == ""
    tok = load_tokenizer("mini-qwen3")
    ids = tok.encode_ordinary("ok 🙂")
    pieces = [tok.decode_bytes([i]) for i in ids]
    assert b"".join(pieces) == "ok 🙂".encode() and len(pieces) > 2
    out = sg.decode_output(ids, tok, truncated=False)
    assert out.text == "ok 🙂" and all("\ufffd" not in d.text for d in out.deltas)
    cut = sg.decode_output(ids[:-1], tok, truncated=True)
    assert cut.text.endswith("\ufffd")  # the finishing step shows the unfinished character


@pytest.mark.parametrize("stream", [False, True])
def test_a_character_cut_by_max_tokens_is_never_a_wrong_ok(stream):
    # SGLang sends the cut character as U+FFFD: its bytes are unknown, so the sample is
    # flagged; a cut between characters still comes back exactly.
    qwen = get_format("qwen3", load_tokenizer("mini-qwen3"))
    request = {"model": "m", "messages": [{"role": "user", "content": "q"}],
               "chat_template_kwargs": {"enable_thinking": False}}
    prompt = sg.encode_prompt(request, qwen.tok)
    full = qserved.model_ids(qwen.tok, reasoning=None, content="Hello 🙂🙂 there", calls=[])
    seen = set()
    for cut in range(3, len(full)):
        ids = full[:cut]
        out = sg.decode_output(ids, qwen.tok, True)
        p = (sg.stream(out, request).parsed if stream else sg.parse(out, request))
        body = {"choices": [{"index": 0, "finish_reason": p.finish_reason, "message": {
            "role": "assistant", "content": p.content, "reasoning_content": p.reasoning}}],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids)}}
        sample = reconstruct("x", {**request, "stream": stream}, body, qwen)
        mid_char = p.content.endswith("\ufffd")
        seen.add(mid_char)
        if mid_char:
            assert "truncated_tail_unknown" in sample.flags and sample.status == "flagged"
        else:
            assert sample.status == "ok" and sample.input_ids[sample.prompt_len:] == ids
    assert seen == {True, False}
