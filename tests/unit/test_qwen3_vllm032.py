"""vLLM 0.32's Qwen3 rules (`models/qwen3/vllm.py`, profile `vllm-hermes`), pinned on
hand-written id sequences.

Every expected value below was taken from vLLM 0.32 itself: its own parser classes
(`ParserManager.get_parser("hermes", "qwen3")`, `parse` / `parse_delta` /
`count_reasoning_tokens`, fed by a `tokenizers` `DecodeStream`, as the serving layer feeds
them) on these ids with the mini Qwen3 tokenizer, or its code where a comment says so; the
real server agrees on the corpus (tests/realvllm/test_qwen3_conformance.py). The serving
layer's own rules (null/"" content, finish reasons) are from
`entrypoints/openai/chat_completion/serving.py` (docs/vllm-0.32.md section 4).
"""

from __future__ import annotations

import re

import pytest

from specregen.models.qwen3 import vllm
from specregen.models.qwen3.served import Qwen3Server
from specregen.models.qwen3.tokens import (
    IM_END,
    IM_START,
    THINK,
    THINK_END,
    TOOL_CALL,
    TOOL_CALL_END,
)
from specregen.models.qwen3.vllm_legacy import decode_output
from specregen.models.tokenizer import load_tokenizer

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "W",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("mini-qwen3")


def _ids(tok, *parts):
    """Marker names become their ids, other strings their ordinary tokens (a marker inside a
    string is its id too: `encode_ordinary`), lists are taken as they are."""
    ids: list[int] = []
    for part in parts:
        if isinstance(part, list):
            ids.extend(part)
        elif part in tok.added_tokens:
            ids.append(tok.token_id(part))
        else:
            ids.extend(tok.encode_ordinary(part))
    return ids


def _spelled(tok, text):
    """`text` in ordinary tokens only: every `<` its own piece, so no piece holds a marker."""
    ids: list[int] = []
    for k, part in enumerate(text.split("<")):
        if k:
            ids.extend(tok.encode_ordinary("<"))
        if part:
            ids.extend(tok.encode_ordinary(part))
    return ids


def _answer(tok, request, ids, *, stream, max_tokens=None):
    cut = ids[:max_tokens] if max_tokens is not None else ids
    out = decode_output(cut, tok, len(cut) < len(ids))
    prompt = vllm.encode_prompt(request, tok)
    return vllm.parse(out, cut, request, vllm.Vocabulary.of(tok), stream=stream,
                      prompt_ids=prompt)


def _fields(answer):
    p = answer.parsed
    return (p.reasoning, p.content, [(c.name, c.arguments) for c in p.calls],
            answer.reasoning_tokens)


# -- the reasoning pass ------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_text_before_think_stays_reasoning(tok, stream):
    ids = _ids(tok, "pre", THINK, "\nR\n", THINK_END, "\n\nA", IM_END)
    assert _fields(_answer(tok, {"messages": USER}, ids, stream=stream)) == (
        "pre\nR\n", "\n\nA", [], 5)


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_ends_an_unclosed_reasoning_and_is_parsed(tok, stream):
    ids = _ids(tok, THINK, "\nR\n", TOOL_CALL,
               '\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n', TOOL_CALL_END,
               IM_END)
    answer = _answer(tok, {"messages": USER, "tools": TOOLS}, ids, stream=stream)
    # Plain content null; a stream's content is "" (its role chunk always sends "").
    assert _fields(answer) == ("\nR\n", "" if stream else None,
                               [("get_weather", '{"city": "Paris"}')], 3)
    assert answer.parsed.finish_reason == "tool_calls"


def test_a_later_think_end_is_removed_in_plain_content_only(tok):
    ids = _ids(tok, THINK, "\nR\n", THINK_END, "\n\nA", THINK_END, "B", IM_END)
    request = {"messages": USER}
    assert _fields(_answer(tok, request, ids, stream=False)) == ("\nR\n", "\n\nAB", [], 3)
    assert _fields(_answer(tok, request, ids, stream=True)) == (
        "\nR\n", "\n\nA</think>B", [], 3)


def test_special_tokens_go_from_plain_text_and_from_streamed_reasoning_ids(tok):
    # `<|im_start|>` as an id in the reasoning, `<|box_start|>` spelled in it, `<|box_end|>`
    # as an id and `<|im_start|>` spelled in the content.
    ids = _ids(tok, THINK, "\nR", IM_START, "<|box_start|>x\n", THINK_END, "\n\nA",
               "<|box_end|>") + _spelled(tok, "B<|im_start|>C") + _ids(tok, IM_END)
    request = {"messages": USER}
    assert _fields(_answer(tok, request, ids, stream=False)) == ("\nRx\n", "\n\nABC", [], 11)
    assert _fields(_answer(tok, request, ids, stream=True)) == (
        "\nR<|box_start|>x\n", "\n\nA<|box_end|>B<|im_start|>C", [], 11)


def test_a_spelled_think_end_ends_plain_reasoning_but_not_the_stream(tok):
    ids = (_ids(tok, THINK, "\nR ") + _spelled(tok, "</think> S")
           + _ids(tok, "\n", THINK_END, "\n\nA", IM_END))
    request = {"messages": USER}
    assert _fields(_answer(tok, request, ids, stream=False)) == ("\nR ", " S\n\n\nA", [], 10)
    assert _fields(_answer(tok, request, ids, stream=True)) == ("\nR </think> S\n", "\n\nA",
                                                                [], 10)


# -- the stream's prompt check ------------------------------------------------------------------


def test_a_tool_loop_streams_its_reasoning_as_reasoning(tok):
    request = {"messages": [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "", "reasoning_content": "I should call.",
         "tool_calls": [{"id": "c0", "type": "function", "function": {
             "name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "c0", "content": "sunny"}], "tools": TOOLS}
    vocab = vllm.Vocabulary.of(tok)
    prompt = vllm.encode_prompt(request, tok)
    # The prompt holds the earlier turn's `</think>`; the scan stops at `<|im_start|>`.
    assert vocab.think_end in prompt
    assert not vllm.prompt_ends_reasoning(prompt, vocab, thinking=True)
    ids = _ids(tok, THINK, "\nR\n", THINK_END, "\n\nSunny.", IM_END)
    assert _fields(_answer(tok, request, ids, stream=True)) == ("\nR\n", "\n\nSunny.", [], 3)
    # Thinking off: the prompt ends `</think>\n\n` and everything is content.
    off = {**request, "chat_template_kwargs": {"enable_thinking": False}}
    assert vllm.prompt_ends_reasoning(vllm.encode_prompt(off, tok), vocab, thinking=False)


# -- hermes --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("body", "streamed"), [
    ('{"name": "get_weather", "arguments": {"city": "P"}, "x": 2}', '{"city": "P"}, "x": 2'),
    ('{"arguments": {"city": "P"}, "name": "get_weather"}',
     '{"city": "P"}, "name": "get_weather"'),
])
def test_streamed_arguments_are_everything_after_the_key(tok, body, streamed):
    ids = _ids(tok, THINK, "\nR\n", THINK_END, "\n\n", TOOL_CALL, f"\n{body}\n", TOOL_CALL_END,
               IM_END)
    request = {"messages": USER, "tools": TOOLS}
    assert _fields(_answer(tok, request, ids, stream=False)) == (
        "\nR\n", None, [("get_weather", '{"city": "P"}')], 3)
    assert _fields(_answer(tok, request, ids, stream=True)) == (
        "\nR\n", "\n\n", [("get_weather", streamed)], 3)


def test_a_broken_call_is_content_in_plain_and_a_call_in_the_stream(tok):
    ids = _ids(tok, THINK, "\nR\n", THINK_END, "\n\nOK\n", TOOL_CALL,
               '\n{"name": "get_weather", "arguments": {"city": "P"}\n', TOOL_CALL_END, IM_END)
    request = {"messages": USER, "tools": TOOLS}
    plain = _answer(tok, request, ids, stream=False)
    assert _fields(plain) == ("\nR\n", '\n\nOK\n<tool_call>\n{"name": "get_weather", '
                              '"arguments": {"city": "P"}\n</tool_call>', [], 3)
    assert plain.parsed.finish_reason == "stop"
    streamed = _answer(tok, request, ids, stream=True)
    assert _fields(streamed) == ("\nR\n", "\n\nOK\n", [("get_weather", '{"city": "P"}')], 3)
    assert streamed.parsed.finish_reason == "tool_calls"


def test_a_non_string_name_fails_the_plain_parse():
    # `FunctionCall.name` is a `str` field: pydantic refuses 5, hermes catches it.
    assert vllm.hermes_extract('<tool_call>{"name": 5, "arguments": {}}</tool_call>') == (
        False, (), '<tool_call>{"name": 5, "arguments": {}}</tool_call>')


def test_call_ids_have_16_hex_digits(tok):
    # `make_tool_call_id()` = `chatcmpl-tool-{random_uuid()}`, `random_uuid()` the low 64 bits
    # of a uuid4 as 16 hex digits (`vllm/utils/__init__.py`).
    server = Qwen3Server(tok).for_profile("vllm-hermes")
    assert re.fullmatch(r"chatcmpl-tool-[0-9a-f]{16}", server.call_id((1 << 128) - 1))
    assert server.call_id(0xABC) == "chatcmpl-tool-0000000000000abc"


# -- reasoning_tokens ----------------------------------------------------------------------------


def test_the_stream_undercounts_steps_held_for_an_unfinished_character(tok):
    ids = _ids(tok, THINK, "\n🎉 and 🎉\n", THINK_END, "\n\nA", IM_END)
    request = {"messages": USER}
    assert _fields(_answer(tok, request, ids, stream=False))[3] == 12
    assert _fields(_answer(tok, request, ids, stream=True))[3] == 6


def test_a_marker_spelled_after_its_id_can_take_its_place_in_the_plain_count(tok):
    # "北" is split over byte tokens, so the engine places the markers by their text: the
    # `<|im_start|>` id binds to the spelled `<|im_start|>` after it, and the tokens between
    # them are not counted.
    ids = (_ids(tok, THINK, "\n北", IM_START, "x") + _spelled(tok, "<|im_start|>")
           + _ids(tok, THINK_END, IM_END))
    request = {"messages": USER}
    assert _fields(_answer(tok, request, ids, stream=False)) == ("\n北x", None, [], 4)
    assert _fields(_answer(tok, request, ids, stream=True)) == ("\n北x<|im_start|>", "", [], 9)


# -- the thinking switch ------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_effort_none_turns_the_parser_and_the_template_off(tok, stream):
    request = {"messages": USER, "reasoning_effort": "none"}
    ids = _ids(tok, "A", THINK, "B", IM_END)
    assert _fields(_answer(tok, request, ids, stream=stream)) == (None, "A<think>B", [], 0)
    # `build_chat_params`: `enable_thinking = effort != "none"`, unless the kwargs set it.
    assert vllm.render_prompt_text(request).endswith(
        f"{IM_START}assistant\n{THINK}\n\n{THINK_END}\n\n")
    kept = {**request, "chat_template_kwargs": {"enable_thinking": True}}
    assert vllm.parser_thinking(kept) and vllm.parser_thinking(
        {"messages": USER, "reasoning_effort": "low"})


def test_thinking_off_keeps_an_empty_plain_text_as_empty_content(tok):
    # `Qwen3Parser.extract_reasoning` returns the text untouched with thinking off: "", not
    # null (the engine, with thinking on, would give null).
    request = {"messages": USER, "chat_template_kwargs": {"enable_thinking": False}}
    answer = _answer(tok, request, _ids(tok, "🎉"), stream=False, max_tokens=1)
    assert (answer.parsed.content, answer.parsed.finish_reason) == ("", "length")


# -- tool_choice ------------------------------------------------------------------------------


def test_required_reads_the_native_format_and_never_returns_null_content(tok):
    request = {"messages": USER, "tools": TOOLS, "tool_choice": "required"}
    text_only = _ids(tok, THINK, "\nR\n", THINK_END, "\n\n", IM_END)
    plain = _answer(tok, request, text_only, stream=False).parsed
    # The full generator's required branch: content `content or ""`, `tool_calls` on any
    # stop-token finish, even with no call.
    assert (plain.content, plain.calls, plain.finish_reason) == ("", (), "tool_calls")
    streamed = _answer(tok, request, text_only, stream=True).parsed
    assert streamed.finish_reason == "stop"


# -- the request side ---------------------------------------------------------------------------


def test_tools_are_dumped_with_null_description_and_parameters():
    # `ChatCompletionToolsParam.model_dump()` in 0.32: fixed key order, missing fields null,
    # unknown keys dropped.
    tools = [{"type": "function", "function": {"parameters": {"type": "object"},
                                               "name": "f", "extra": 1}, "x": 2},
             {"type": "function", "function": {"name": "g", "strict": True}}]
    assert vllm.server_tools(tools) == [
        {"type": "function", "function": {"name": "f", "description": None,
                                          "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "g", "description": None,
                                          "parameters": None, "strict": True}}]
    text = vllm.render_prompt_text({"messages": USER, "tools": tools})
    assert ('{"type": "function", "function": {"name": "f", "description": null, '
            '"parameters": {"type": "object"}}}') in text


def test_history_reasoning_content_is_read_and_bad_arguments_become_empty_objects():
    request = {"messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "reasoning_content": "Call it.",
         "tool_calls": [
             {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{bad"}},
             {"id": "b", "type": "function", "function": {"name": "g", "arguments": "[1]"}},
             {"id": "c", "type": "function", "function": {"name": "h", "arguments": [1]}}]},
        {"role": "tool", "tool_call_id": "a", "content": "ok"}]}
    text = vllm.render_prompt_text(request)
    assert "<think>\nCall it.\n</think>" in text
    for name in "fgh":
        assert f'{{"name": "{name}", "arguments": {{}}}}' in text
    # `reasoning` wins over `reasoning_content` when both are set.
    both = vllm.server_messages([{"role": "assistant", "content": "x", "reasoning": "A",
                                  "reasoning_content": "B"}])
    assert both[0]["reasoning"] == both[0]["reasoning_content"] == "A"


def test_spaces_between_special_tokens_changes_nothing(tok):
    # The fast detokenizer only replaces an added token that follows another by its bare
    # content, which a byte-level decoder never changes (`FastIncrementalDetokenizer`).
    ids = _ids(tok, THINK, "\nR\n", THINK_END, TOOL_CALL,
               '\n{"name": "get_weather", "arguments": {}}\n', TOOL_CALL_END, IM_END)
    base = {"messages": USER, "tools": TOOLS}
    for stream in (False, True):
        assert _fields(_answer(tok, base, ids, stream=stream)) == _fields(_answer(
            tok, {**base, "spaces_between_special_tokens": False}, ids, stream=stream))


def test_a_stream_cut_right_after_a_calls_name_gets_its_arguments_topped_up():
    # vLLM 0.32's `finalize_generation`: the finishing step sent the second call's name, whose
    # arguments never started; the parser holds none for it, so "{}" (`json.dumps({})`) is
    # appended. Seen on the real server (bench/real_vllm.py, a `cut` answer).
    from specregen.models.qwen3.hermes import HermesStream
    from specregen.models.qwen3.vllm import _stream_args

    first = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\n'
    steps = [first, '<tool_call>\n{"name": "g",']
    _, calls = HermesStream(_stream_args, top_up=True).run(steps)
    assert [(c.name, c.arguments) for c in calls] == [("f", '{"a": 1}'), ("g", "{}")]
    # Arguments that started are the parser's own text: nothing is added.
    _, calls = HermesStream(_stream_args, top_up=True).run([first, '<tool_call>\n{"name": "g", '
                                                            '"arguments": {"b": 2'])
    assert calls[1].arguments == '{"b": 2'
    # A step that sent no call delta (the stop token's) adds nothing either.
    _, calls = HermesStream(_stream_args, top_up=True).run([*steps, ""])
    assert calls[1].arguments == ""
