"""vLLM's qwen3 reasoning parser and hermes tool parser as restated in
specregen/models/qwen3/servers.py, checked by hand against literal expected fields (each case
names the upstream rule it pins down; docs/qwen3.md has the sources)."""

from __future__ import annotations

import pytest

from specregen.models.qwen3 import MINI_QWEN3_TOKENIZER_DIR
from specregen.models.qwen3 import servers as sv
from specregen.models.qwen3 import vllm_legacy as vl
from specregen.models.serverkit import stream as kit
from specregen.models.tokenizer import load_tokenizer

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris"}}\n</tool_call>'


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(MINI_QWEN3_TOKENIZER_DIR)


def _parse(tok, text, request, *, stream, truncated=False, prompt_ids=()):
    ids = tok.encode_ordinary(text) + ([] if truncated else [tok.token_id("<|im_end|>")])
    out = vl.decode_output(ids, tok, truncated)
    return vl.parse(out, request, vl.MarkerIds.of(tok), stream=stream, prompt_ids=prompt_ids)


def _req(tools=True, **kwargs):
    request = {"messages": [{"role": "user", "content": "q"}]}
    if tools:
        request["tools"] = TOOLS
    if kwargs:
        request["chat_template_kwargs"] = kwargs
    return request


def test_plain_split_keeps_newlines_and_redumps_arguments(tok):
    text = f"<think>\nplan\n</think>\n\nSure.\n{CALL}"
    got = _parse(tok, text, _req(), stream=False)
    assert got == kit.Parsed("\nplan\n", "\n\nSure.\n",
                            (kit.ServerCall("get_weather", '{"city": "Paris"}', 0),),
                            "tool_calls")


def test_stream_keeps_the_models_argument_text(tok):
    text = f"<think>\nplan\n</think>\n\nSure.\n{CALL}"
    got = _parse(tok, text, _req(), stream=True)
    assert got == kit.Parsed("\nplan\n", "\n\nSure.\n",
                            (kit.ServerCall("get_weather", '{"city":"Paris"}', 0),),
                            "tool_calls")


def test_whitespace_only_content_next_to_calls_is_null(tok):
    got = _parse(tok, f"<think>\nr\n</think>\n\n{CALL}", _req(), stream=False)
    assert (got.content, len(got.calls)) == (None, 1)


def test_thinking_off_everything_is_content(tok):
    got = _parse(tok, "Hello there", _req(tools=False, enable_thinking=False), stream=False)
    assert got == kit.Parsed(None, "Hello there", (), "stop")


def test_thinking_on_without_end_tag_is_all_reasoning(tok):
    got = _parse(tok, "<think>\nstill going", _req(tools=False), stream=False, truncated=True)
    assert got == kit.Parsed("\nstill going", None, (), "length")


def test_a_call_inside_unfinished_reasoning_stays_reasoning(tok):
    # No implicit end for Qwen3's JSON calls: only `<function=` after `<tool_call>` counts.
    text = f"<think>\nhmm {CALL}"
    got = _parse(tok, text, _req(), stream=False, truncated=True)
    assert got == kit.Parsed(f"\nhmm {CALL}", None, (), "length")


def test_one_bad_block_makes_everything_content(tok):
    text = '</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"a": }\n</tool_call>'
    got = _parse(tok, text, _req(), stream=False)
    assert got == kit.Parsed("", '\n\n<tool_call>\n{"name": "get_weather", "arguments": {"a": }'
                            '\n</tool_call>', (), "stop")


def test_unclosed_block_with_complete_json_still_parses(tok):
    text = '</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {}}\n'
    got = _parse(tok, text, _req(), stream=False, truncated=True)
    assert got == kit.Parsed("", None, (kit.ServerCall("get_weather", "{}", 0),), "tool_calls")
    streamed = _parse(tok, text, _req(), stream=True, truncated=True)
    assert streamed == kit.Parsed(None, "\n\n", (kit.ServerCall("get_weather", "{}", 0),),
                                 "length")


def test_text_after_and_between_calls_is_dropped(tok):
    text = f"</think>\n\nA{CALL} mid {CALL} tail"
    plain = _parse(tok, text, _req(), stream=False)
    assert plain.content == "\n\nA" and [c.index for c in plain.calls] == [0, 1]
    stream = _parse(tok, text, _req(), stream=True)
    assert stream.content == "\n\nA" and len(stream.calls) == 2


def test_stream_treats_a_closed_think_in_the_prompt_as_reasoning_over(tok):
    prompt = tok.encode_with_specials("<|im_start|>assistant\n<think>\nold\n</think>\n\n"
                                      "<|im_end|>\n<|im_start|>assistant\n")
    text = "<think>\nnew\n</think>\n\nanswer"
    stream = _parse(tok, text, _req(tools=False), stream=True, prompt_ids=prompt)
    assert stream == kit.Parsed(None, text, (), "stop")
    plain = _parse(tok, text, _req(tools=False), stream=False, prompt_ids=prompt)
    assert plain == kit.Parsed("\nnew\n", "\n\nanswer", (), "stop")


def test_stream_holds_back_a_partial_tag_at_the_end(tok):
    got = _parse(tok, "</think>\n\nx <tool", _req(), stream=True)
    assert got.content == "\n\nx "


def test_stream_flushes_a_held_back_tool_call_tag_as_reasoning(tok):
    text = "<think>\nsay <tool_call> here\n</think>\n\nok"
    got = _parse(tok, text, _req(tools=False), stream=True)
    assert got == kit.Parsed("\nsay <tool_call> here\n", "\n\nok", (), "stop")


def test_prompt_side_reparses_history_arguments():
    request = {"messages": [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None, "reasoning": "r", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "f", "arguments": '{"x":1}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
    ], "tools": TOOLS}
    text = vl.render_prompt_text(request)
    assert "<|im_start|>user\na\nb<|im_end|>\n" in text
    assert ('<think>\nr\n</think>\n\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n'
            "</tool_call><|im_end|>\n") in text
    with pytest.raises(sv.RequestError, match=r"messages\[0\]\.tool_calls\[0\]"):
        sv.server_messages([{"role": "assistant", "tool_calls": [
            {"function": {"name": "f", "arguments": "{bad"}}]}])
