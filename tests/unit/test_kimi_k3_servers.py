"""Our restatement of vLLM 0.32's kimi_k3 reasoning and tool parsers (models/kimi_k3/servers.py)
on the shapes docs/kimi-k3.md §4 describes, plain and streamed; the real server is checked in
tests/realvllm/test_k3_conformance.py."""

from __future__ import annotations

import pytest

from specregen.models.kimi_k3 import servers as sv
from specregen.models.kimi_k3.encoding import Segment, close_tag, open_tag, text, tools_segments
from specregen.models.kimi_k3.format import completion_segments
from specregen.models.kimi_k3.tokens import encode_segments
from specregen.models.serverkit.stream import Parsed
from specregen.models.tokenizer import load_tokenizer

TOK = load_tokenizer("mini-k3")
MARKERS = sv.MarkerIds.of(TOK)
STOP = TOK.token_id("<|end_of_msg|>")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]


def _ids(segments: list[Segment], stop: bool = True) -> list[int]:
    return encode_segments(TOK, segments) + ([STOP] if stop else [])


def _both(ids: list[int], request: dict, truncated: bool = False) -> tuple[Parsed, Parsed]:
    thinking = sv.parser_thinking(request)
    prompt = list(MARKERS.think_open) if thinking else list(TOK.encode_ordinary(""))
    out = sv.decode_output(ids, TOK, truncated)
    return (sv.parse(out, request),
            sv.parse(out, request, stream=True, marker_ids=MARKERS, prompt_ids=prompt))


def test_a_layout_answer_with_calls() -> None:
    ids = _ids(completion_segments("R", "Let me check.", [("get_weather", {"city": "Oslo",
                                                                             "n": 3})],
                                   thinking=True))
    plain, stream = _both(ids, {"tools": TOOLS})
    for parsed in (plain, stream):
        assert (parsed.reasoning, parsed.content) == ("R", "Let me check.")
        assert [(c.name, c.arguments) for c in parsed.calls] == [
            ("get_weather", '{"city": "Oslo", "n": 3}')]
        assert parsed.finish_reason == "tool_calls"
    assert stream.content_at_calls == (len("Let me check."),)


def test_whitespace_content_beside_calls_null_plain_sent_streamed() -> None:
    ids = _ids(completion_segments("R", "\n\n", [("get_weather", {})], thinking=True))
    plain, stream = _both(ids, {"tools": TOOLS})
    assert plain.content is None and stream.content == "\n\n"


def test_no_think_channel_plain_content_stream_all_reasoning() -> None:
    segments = open_tag("response") + text("Hello") + close_tag("response") + close_tag("message")
    plain, stream = _both(_ids(segments), {})
    assert (plain.reasoning, plain.content) == (None, "Hello")
    assert stream.content is None
    assert stream.reasoning == "<|open|>response<|sep|>Hello<|close|>response<|sep|>" \
                               "<|close|>message<|sep|>"


def test_think_close_typed_as_text() -> None:
    segments = (text("R<|close|>think<|sep|>") + open_tag("response") + text("Hi")
                + close_tag("response") + close_tag("message"))
    plain, stream = _both(_ids(segments), {})
    assert (plain.reasoning, plain.content) == ("R", "Hi")
    # The stream ends the reasoning at the close's ids only: the rest comes raw, as content.
    assert stream.reasoning == "R"
    assert stream.content == "<|open|>response<|sep|>Hi<|close|>response<|sep|>" \
                             "<|close|>message<|sep|>"


def test_arguments_read_by_type() -> None:
    call = (open_tag("call", (("tool", 'we"ird'), ("index", 7)))
            + open_tag("argument", (("key", "s"), ("type", "string"))) + text("1e2")
            + close_tag("argument")
            + open_tag("argument", (("key", "n"), ("type", "number"))) + text("1e2")
            + close_tag("argument")
            + open_tag("argument", (("key", "bad"), ("type", "number"))) + text("oops")
            + close_tag("argument")
            + close_tag("call"))
    segments = (completion_segments("", "", [], thinking=True)[:-3]
                + open_tag("tools") + call + close_tag("tools") + close_tag("message"))
    plain, _ = _both(_ids(segments), {"tools": TOOLS})
    [parsed] = plain.calls
    assert parsed.name == 'we"ird'  # unescaped
    assert parsed.arguments == '{"s": "1e2", "n": 100.0, "bad": "oops"}'


def test_text_outside_the_channels_is_dropped() -> None:
    segments = (text("R") + close_tag("think") + open_tag("response") + text("C")
                + close_tag("response") + text("junk")
                + tools_segments([("get_weather", {})]) + text("tail") + close_tag("message"))
    plain, stream = _both(_ids(segments), {"tools": TOOLS})
    assert plain.content == stream.content == "C" and len(plain.calls) == len(stream.calls) == 1


def test_instant_answer_without_tools_unwraps_the_response() -> None:
    ids = _ids(text("Hi") + close_tag("response") + close_tag("message"))
    request = {"chat_template_kwargs": {"thinking": False}}
    plain, stream = _both(ids, request)
    assert (plain.reasoning, plain.content) == (None, "Hi") == (stream.reasoning, stream.content)


def test_tool_choice_none_throws_calls_away() -> None:
    ids = _ids(completion_segments("R", "C", [("get_weather", {})], thinking=True))
    plain, stream = _both(ids, {"tools": TOOLS, "tool_choice": "none"})
    assert plain.calls == stream.calls == ()
    assert plain.content == stream.content == "C"
    assert plain.finish_reason == stream.finish_reason == "stop"


def test_cut_inside_a_call() -> None:
    full = _ids(completion_segments("R", "C", [("get_weather", {"city": "Oslo"})],
                                    thinking=True), stop=False)
    cut = full[: len(full) - 12]
    plain, stream = _both(cut, {"tools": TOOLS}, truncated=True)
    assert plain.calls == stream.calls == () and plain.content == stream.content == "C"
    assert plain.finish_reason == stream.finish_reason == "length"


def test_stream_holds_back_a_partial_marker_at_a_cut() -> None:
    ids = _ids([*text("R"), ("<|close|>", True)], stop=False)
    plain, stream = _both(ids, {}, truncated=True)
    assert plain.reasoning == "R<|close|>" and stream.reasoning == "R"


def test_reasoning_tokens_and_the_prompt_check() -> None:
    ids = _ids(completion_segments("one two", "C", [], thinking=True))
    n = len(TOK.encode_ordinary("one two"))
    assert sv.count_reasoning_tokens(ids, MARKERS, True) == n
    assert sv.count_reasoning_tokens(ids, MARKERS, False) == 0
    assert not sv.newest_is_close(list(MARKERS.think_open), MARKERS)
    assert sv.newest_is_close([*MARKERS.think_open, *MARKERS.think_close], MARKERS)


@pytest.mark.parametrize(("request_", "thinking"), [
    ({}, True), ({"chat_template_kwargs": {"thinking": False}}, False),
    ({"chat_template_kwargs": {"enable_thinking": False}}, False),
    ({"reasoning_effort": "none"}, False), ({"reasoning_effort": "low"}, True),
    ({"reasoning_effort": "none", "chat_template_kwargs": {"thinking": True}}, True),
])
def test_parser_thinking(request_: dict, thinking: bool) -> None:
    assert sv.parser_thinking(request_) is thinking
    assert sv.template_options(request_)["thinking"] is thinking
