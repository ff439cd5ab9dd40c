"""The emulator's `vllm` profile answers K2.5 ids the way vLLM 0.32 does
(`--reasoning-parser kimi_k2 --tool-call-parser kimi_k2`, slow tokenizer; docs/vllm-0.32.md).

The ids are written by hand; every expected value was produced by vLLM 0.32's own code on those
ids (its slow incremental detokenizer, the `kimi_k2` parsers composed by `ParserManager`, and
the chat serving layer's content and finish rules), and the first cases were also checked
against the real server (tests/realvllm/test_k25_conformance.py sends them). "defaults" is a
request without `spaces_between_special_tokens`, "client" one with it false (what specregen's
client sends).
"""

from __future__ import annotations

from typing import Any

import pytest

from specregen.emulator.profiles import PROFILE_SPECS
from specregen.models.kimi_k25 import (
    ARG_BEGIN,
    CALL_BEGIN,
    CALL_END,
    IM_END,
    SECTION_BEGIN,
    SECTION_END,
    THINK,
    THINK_END,
    servers,
    serverside,
    vllm032,
)
from specregen.models.kimi_k25.served import KimiK25Server
from specregen.models.tokenizer import Tokenizer, load_tokenizer
from tests.support import get_tokenizer

MINI = load_tokenizer("mini")
MARKERS = {SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARG_BEGIN, CALL_END, THINK, THINK_END,
           IM_END, "[BOS]"}
USER = {"role": "user", "content": "What is the weather in Paris?"}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "amount": {"type": "number"},
        "note": {}}}}}]
WITH_TOOLS = {"tools": TOOLS}
CALL = [SECTION_BEGIN, CALL_BEGIN, "functions.get_weather:0", ARG_BEGIN, '{"city": "Paris"}',
        CALL_END, SECTION_END]
PARIS = '{"city": "Paris"}'


def ids(tok: Tokenizer, *parts: str) -> list[int]:
    """Marker names become their ids, the rest is model text."""
    out: list[int] = []
    for part in parts:
        out += [tok.token_id(part)] if part in MARKERS else tok.encode_ordinary(part)
    return out


def answer(parts: list[str], extra: dict[str, Any] | None = None, *, stream: bool,
           client: bool = False, cut: int | None = None, tok: Tokenizer = MINI) -> dict:
    """What the profile returns (as the client assembles it) for the ids of `parts` plus the
    stop token (none when `cut` drops the last `cut` ids)."""
    request: dict[str, Any] = {"messages": [USER], **(extra or {})}
    if client:
        request["spaces_between_special_tokens"] = False
    written = ids(tok, *parts)
    if cut is None:
        written.append(tok.token_id(IM_END))
    max_tokens = None if cut is None else len(written) - cut
    got = KimiK25Server(tok).answer_ids(PROFILE_SPECS["vllm"], request, written, max_tokens,
                                        stream)
    message = got.message
    return {"reasoning": message.reasoning, "content": message.content,
            "calls": [(c.id, c.name, c.arguments) for c in message.tool_calls],
            "finish": message.finish_reason, "reasoning_tokens": got.reasoning_tokens}


def fields(reasoning: str | None, content: str | None, calls: list[tuple[str, str, str]],
           finish: str) -> dict[str, Any]:
    return {"reasoning": reasoning, "content": content, "calls": calls, "finish": finish}


def without_count(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k != "reasoning_tokens"}


def check(parts: list[str], extra: dict[str, Any] | None, expected: dict[str, dict], *,
          cut: int | None = None) -> None:
    """`expected`: per "plain/defaults", "stream/defaults", "plain/client", "stream/client"."""
    for key, want in expected.items():
        mode, variant = key.split("/")
        got = answer(parts, extra, stream=mode == "stream", client=variant == "client", cut=cut)
        assert without_count(got) == want, key


# -- the detokenizer's spaces (docs/vllm-0.32.md, 1.2) -----------------------------------------


def test_spaces_around_added_tokens_and_the_answers_first_token():
    # Checked on the real server. A space goes before every added token and before the first
    # ordinary token after one; the prompt ends in `<think>`, so the answer's first token too.
    # Plain strips the arguments; the stream sends them raw, spaces included.
    parts = ["Let me think.", THINK_END, "Hello", *CALL]
    call = ("functions.get_weather:0", "get_weather", PARIS)
    check(parts, WITH_TOOLS, {
        "plain/defaults": fields(" Let me think.", " Hello ", [call], "tool_calls"),
        "stream/defaults": fields(" Let me think.", " Hello ",
                                  [(*call[:2], f" {PARIS} ")], "tool_calls"),
        "plain/client": fields("Let me think.", "Hello", [call], "tool_calls"),
        "stream/client": fields("Let me think.", "Hello", [call], "tool_calls"),
    })


def test_detokenizer_steps_with_spaces_and_held_characters():
    tok = MINI
    written = ids(tok, "Hi", THINK_END, "a", CALL_BEGIN, "b")
    out = servers.decode_output(written, tok, False, spaces=True)
    assert out.text == " Hi </think> a <|tool_call_begin|> b"
    by_id = {d.token_id: d.text for d in out.deltas}
    assert by_id[tok.token_id(THINK_END)] == " </think>"
    assert by_id[tok.token_id(CALL_BEGIN)] == " <|tool_call_begin|>"
    assert servers.decode_output(written, tok, False).text == "Hi</think>a<|tool_call_begin|>b"
    # A character split over ids: its steps send "" until it is complete, and the space that
    # goes before it comes with the step that completes it.
    emoji = tok.encode_ordinary("😀")
    held = servers.decode_output([tok.token_id(THINK_END), *emoji], tok, False, spaces=True)
    assert [d.text for d in held.deltas] == [" </think>", *[""] * (len(emoji) - 1), " 😀"]


# -- reasoning (docs/vllm-0.32.md, 2.2) --------------------------------------------------------


def test_section_begin_ends_an_unclosed_reasoning_and_the_calls_are_parsed():
    call = ("functions.get_weather:0", "get_weather", PARIS)
    check(["I should call.", *CALL], WITH_TOOLS, {
        "plain/defaults": fields(" I should call.", None, [call], "tool_calls"),
        "stream/defaults": fields(" I should call.", "", [(*call[:2], f" {PARIS} ")],
                                  "tool_calls"),
        "plain/client": fields("I should call.", None, [call], "tool_calls"),
        "stream/client": fields("I should call.", "", [call], "tool_calls"),
    })


def test_think_inside_the_reasoning_is_removed_text_before_it_stays():
    check(["A", THINK, "B", THINK_END, "C"], None, {
        "plain/defaults": fields(" A  B", " C", [], "stop"),
        "stream/defaults": fields(" A  B", " C", [], "stop"),
        "plain/client": fields("AB", "C", [], "stop"),
        "stream/client": fields("AB", "C", [], "stop"),
    })
    # Written as text: plain matches the string, the stream only the id.
    check(["A<think>B", THINK_END, "C"], None, {
        "plain/client": fields("AB", "C", [], "stop"),
        "stream/client": fields("A<think>B", "C", [], "stop"),
    })


def test_reasoning_trailing_whitespace():
    check(["R \n", THINK_END, "C"], None, {
        "plain/defaults": fields(" R", " C", [], "stop"),
        "stream/defaults": fields(" R", " C", [], "stop"),
        "plain/client": fields("R", "C", [], "stop"),
        "stream/client": fields("R", "C", [], "stop"),
    })
    # Cut while the stream held both the trailing space and text that could start a marker:
    # the final flush sends the held text, the space is lost.
    check(["R <|tool_", "more"], None, {
        "plain/client": fields("R <|tool_", None, [], "length"),
        "stream/client": fields("R<|tool_", "", [], "length"),
    }, cut=len(MINI.encode_ordinary("more")))


def test_no_content_placeholder_is_kept():
    call = ("functions.get_weather:0", "get_weather", PARIS)
    check(["R", THINK_END, "(no content)", *CALL], WITH_TOOLS, {
        "plain/defaults": fields(" R", " (no content) ", [call], "tool_calls"),
        "plain/client": fields("R", "(no content)", [call], "tool_calls"),
        "stream/client": fields("R", "(no content)", [call], "tool_calls"),
    })


def test_later_think_end_and_special_tokens():
    # A later `</think>` vanishes; plain also removes the string, the stream only the id.
    check(["R", THINK_END, "A", THINK_END, "B</think>C"], None, {
        "plain/defaults": fields(" R", " A  BC", [], "stop"),
        "stream/defaults": fields(" R", " A  B</think>C", [], "stop"),
        "plain/client": fields("R", "ABC", [], "stop"),
        "stream/client": fields("R", "AB</think>C", [], "stop"),
    })
    # Special-token strings: plain deletes every literal one, the stream keeps them...
    check(["R", THINK_END, 'Print "<|im_end|>" and [BOS]'], None, {
        "plain/client": fields("R", 'Print "" and ', [], "stop"),
        "stream/client": fields("R", 'Print "<|im_end|>" and [BOS]', [], "stop"),
    })
    # ... and both delete a special id.
    check(["R", THINK_END, "A", "[BOS]", "B"], None, {
        "plain/defaults": fields(" R", " A  B", [], "stop"),
        "stream/client": fields("R", "AB", [], "stop"),
    })


# -- content and calls -------------------------------------------------------------------------


def test_whitespace_only_content():
    call = ("functions.get_weather:0", "get_weather", PARIS)
    # Before a call: null (plain), nothing sent (stream).
    check(["R", THINK_END, "\n\n", *CALL], WITH_TOOLS, {
        "plain/client": fields("R", None, [call], "tool_calls"),
        "stream/client": fields("R", "", [call], "tool_calls"),
    })
    # A section without a call: kept.
    check(["R", THINK_END, "\n\n", SECTION_BEGIN, SECTION_END], WITH_TOOLS, {
        "plain/defaults": fields(" R", " \n\n ", [], "stop"),
        "stream/defaults": fields(" R", " \n\n ", [], "stop"),
        "plain/client": fields("R", "\n\n", [], "stop"),
        "stream/client": fields("R", "\n\n", [], "stop"),
    })


@pytest.mark.parametrize("extra", [None, {"tools": TOOLS, "tool_choice": "none"}])
def test_without_tools_or_with_choice_none_the_section_is_cut_out(extra):
    parts = ["R", THINK_END, "Text.", *CALL, "after"]
    check(parts, extra, {
        "plain/defaults": fields(" R", " Text. ", [], "stop"),
        "stream/defaults": fields(" R", " Text. ", [], "stop"),
        "plain/client": fields("R", "Text.", [], "stop"),
        "stream/client": fields("R", "Text.", [], "stop"),
    })


def test_text_between_and_after_calls_is_never_sent():
    parts = ["R", THINK_END, "C", SECTION_BEGIN, "\n", CALL_BEGIN, "functions.get_weather:0",
             ARG_BEGIN, '{"city": "A"}', CALL_END, "mid", CALL_BEGIN, "functions.a.b:1",
             ARG_BEGIN, "{}", CALL_END, SECTION_END, "after"]
    first, second = ("functions.get_weather:0", "get_weather"), ("functions.a.b:1", "a.b")
    check(parts, WITH_TOOLS, {
        "plain/defaults": fields(" R", " C ", [(*first, '{"city": "A"}'), (*second, "{}")],
                                 "tool_calls"),
        "stream/defaults": fields(" R", " C ", [(*first, ' {"city": "A"} '),
                                                (*second, " {} ")], "tool_calls"),
        "stream/client": fields("R", "C", [(*first, '{"city": "A"}'), (*second, "{}")],
                                "tool_calls"),
    })


def test_header_id_and_name():
    # The id is the header's leading run ending in `:digits` (junk after it allowed), as
    # written; the name is before the first `:` minus `functions.` (`a.b` kept whole).
    assert vllm032.header_id_and_name(" get_weather:3 x") == ("get_weather:3", "get_weather")
    assert vllm032.header_id_and_name("functions.a.b:1") == ("functions.a.b:1", "a.b")
    assert vllm032.header_id_and_name("functions.x:0\nmore") == ("functions.x:0", "x")
    assert vllm032.header_id_and_name("functions.get_wea") == (None, None)
    call = ("get_weather:3", "get_weather", '{"city": "B"}')
    check(["R", THINK_END, SECTION_BEGIN, CALL_BEGIN, " get_weather:3 x", ARG_BEGIN,
           '{"city": "B"}', CALL_END, SECTION_END], WITH_TOOLS, {
        "plain/client": fields("R", None, [call], "tool_calls"),
        "stream/client": fields("R", "", [call], "tool_calls"),
    })


def test_cut_calls_come_back():
    # Cut inside the header: named by the raw header, the id made from it (a K2.5 model type:
    # `functions.{header}:{n}`); plain says tool_calls, the stream length.
    check(["R", THINK_END, SECTION_BEGIN, CALL_BEGIN, "functions.get_wea", "ther:0"],
          WITH_TOOLS, {
              "plain/defaults": fields(" R", None, [("functions. functions.get_wea:0",
                                                     "functions.get_wea", "{}")], "tool_calls"),
              "stream/defaults": fields(" R", "", [("functions. functions.get_wea:0",
                                                    " functions.get_wea", "")], "length"),
              "plain/client": fields("R", None, [("functions.functions.get_wea:0",
                                                  "functions.get_wea", "{}")], "tool_calls"),
              "stream/client": fields("R", "", [("functions.functions.get_wea:0",
                                                 "functions.get_wea", "")], "length"),
          }, cut=len(MINI.encode_ordinary("ther:0")))
    # Cut inside the arguments: the partial text.
    check(["R", THINK_END, SECTION_BEGIN, CALL_BEGIN, "functions.get_weather:0", ARG_BEGIN,
           '{"city": "Pa', 'ris"}'], WITH_TOOLS, {
        "plain/client": fields("R", None, [("functions.get_weather:0", "get_weather",
                                            '{"city": "Pa')], "tool_calls"),
        "stream/client": fields("R", "", [("functions.get_weather:0", "get_weather",
                                           '{"city": "Pa')], "length"),
    }, cut=len(MINI.encode_ordinary('ris"}')))


def test_empty_arguments():
    parts = ["R", THINK_END, SECTION_BEGIN, CALL_BEGIN, "functions.get_weather:0", ARG_BEGIN,
             CALL_END, SECTION_END]
    head = ("functions.get_weather:0", "get_weather")
    check(parts, WITH_TOOLS, {
        "plain/defaults": fields(" R", None, [(*head, "{}")], "tool_calls"),
        "stream/defaults": fields(" R", "", [(*head, " ")], "tool_calls"),
        "plain/client": fields("R", None, [(*head, "{}")], "tool_calls"),
        "stream/client": fields("R", "", [(*head, "")], "tool_calls"),
    })


def test_plain_arguments_are_coerced_to_the_schema_stream_arguments_are_raw():
    head = ("functions.get_weather:0", "get_weather")
    raw = '{"days": "5", "amount": 1.0, "note": 7}'
    check(["R", THINK_END, SECTION_BEGIN, CALL_BEGIN, "functions.get_weather:0", ARG_BEGIN, raw,
           CALL_END, SECTION_END], WITH_TOOLS, {
        # integer "5" -> 5, number 1.0 -> 1, a number where the schema names no type -> "7";
        # then dumped again.
        "plain/client": fields("R", None, [(*head, '{"days": 5, "amount": 1, "note": "7"}')],
                               "tool_calls"),
        "stream/client": fields("R", "", [(*head, raw)], "tool_calls"),
    })
    # Nothing to change: the model's text as written.
    compact = '{"city":"Paris","days":2}'
    check(["R", THINK_END, SECTION_BEGIN, CALL_BEGIN, "functions.get_weather:0", ARG_BEGIN,
           compact, CALL_END, SECTION_END], WITH_TOOLS, {
        "plain/client": fields("R", None, [(*head, compact)], "tool_calls"),
    })


def test_a_call_without_an_id_is_dropped_and_its_index_skipped():
    parts = ["R", THINK_END, SECTION_BEGIN, CALL_BEGIN, "functions.get_weather:0", ARG_BEGIN,
             '{"city": "A"}', CALL_END, CALL_BEGIN, "get_weather", ARG_BEGIN, '{"city": "B"}',
             CALL_END, CALL_BEGIN, "functions.get_weather:2", ARG_BEGIN, '{"city": "C"}',
             CALL_END, SECTION_END]
    calls = [("functions.get_weather:0", "get_weather", '{"city": "A"}'),
             ("functions.get_weather:2", "get_weather", '{"city": "C"}')]
    check(parts, WITH_TOOLS, {"plain/client": fields("R", None, calls, "tool_calls"),
                              "stream/client": fields("R", "", calls, "tool_calls")})
    out = servers.decode_output(ids(MINI, *parts, IM_END), MINI, False)
    parsed, _ = vllm032.stream(out, {"messages": [USER], **WITH_TOOLS}, MINI,
                               prompt_ended=False)
    assert [c.index for c in parsed.calls] == [0, 2]
    # ... unless its arguments name it: plain keeps them whole, the stream sends the name
    # only when the call ends, with no arguments.
    check(["R", THINK_END, SECTION_BEGIN, CALL_BEGIN, "oops", ARG_BEGIN,
           '{"name": "get_weather", "arguments": {"city": "D"}}', CALL_END, SECTION_END],
          WITH_TOOLS, {
              "plain/client": fields("R", None, [(
                  "functions.get_weather:0", "get_weather",
                  '{"name": "get_weather", "arguments": {"city": "D"}}')], "tool_calls"),
              "stream/client": fields("R", "", [("functions.get_weather:0", "get_weather",
                                                 "")], "tool_calls"),
          })


def test_tool_choice_required_and_named():
    check(["R", THINK_END, "Sure."], {"tools": TOOLS, "tool_choice": "required"}, {
        "plain/client": fields("R", "Sure.", [], "tool_calls"),
        "stream/client": fields("R", "Sure.", [], "stop"),
    })
    named = {"tools": TOOLS, "tool_choice": {"type": "function",
                                             "function": {"name": "get_weather"}}}
    call = ("functions.get_weather:0", "get_weather", PARIS)
    check(["R", THINK_END, *CALL], named, {
        "plain/client": fields("R", "", [call], "stop"),
        "stream/client": fields("R", "", [call], "stop"),
    })


# -- the thinking switch -----------------------------------------------------------------------


@pytest.mark.parametrize("extra", [{"chat_template_kwargs": {"enable_thinking": False}},
                                   {"reasoning_effort": "none"}])
def test_parser_thinking_off_keeps_think_end_as_text(extra):
    check(["R", THINK_END, "C"], extra, {
        "plain/defaults": fields(None, " R </think> C", [], "stop"),
        "stream/defaults": fields(None, " R </think> C", [], "stop"),
        "plain/client": fields(None, "R</think>C", [], "stop"),
        "stream/client": fields(None, "R</think>C", [], "stop"),
    })


def test_template_off_parser_on():
    # `thinking: false` renders an instant prompt (ending `</think>`) but `reasoning_effort`
    # turns the parser on: plain splits, the stream sees an ended prompt.
    extra = {"chat_template_kwargs": {"thinking": False}, "reasoning_effort": "high"}
    check(["C", THINK_END, "D"], extra, {
        "plain/client": fields("C", "D", [], "stop"),
        "stream/client": fields(None, "CD", [], "stop"),
    })
    assert vllm032.parser_thinking(extra)
    assert not vllm032.parser_thinking({"chat_template_kwargs": {"thinking": False}})
    assert vllm032.parser_thinking({"chat_template_kwargs": {"thinking": False,
                                                             "enable_thinking": True}})


# -- reasoning_tokens --------------------------------------------------------------------------


def test_reasoning_tokens_plain_and_stream():
    kimi = get_tokenizer("kimi")
    # The markers are not counted; the reasoning ends at the section begin too.
    got = answer(["I should call.", *CALL], WITH_TOOLS, stream=False, tok=kimi)
    assert got["reasoning_tokens"] == len(kimi.encode_ordinary("I should call."))
    assert answer(["A", THINK, "B", THINK_END, "C"], None, stream=True,
                  tok=kimi)["reasoning_tokens"] == 2
    # Each emoji is three ids; the stream counts only the step that completes a character.
    plain = answer(["Fun 😀😀 done", THINK_END, "C"], None, stream=False, tok=kimi)
    streamed = answer(["Fun 😀😀 done", THINK_END, "C"], None, stream=True, tok=kimi)
    assert (plain["reasoning_tokens"], streamed["reasoning_tokens"]) == (6, 4)
    assert answer(["R", THINK_END, "C"], {"reasoning_effort": "none"}, stream=False,
                  tok=kimi)["reasoning_tokens"] == 0


# -- the prompt (docs/vllm-0.32.md, 5) ---------------------------------------------------------


def test_history_as_vllm_032_renders_it():
    history = [USER, {"role": "assistant", "content": "", "reasoning_content": "Plan.",
                      "tool_calls": [{"id": "functions.get_weather:0", "type": "function",
                                      "function": {"name": "get_weather",
                                                   "arguments": "{city: Paris}"}}]},
               {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "18 C"}]
    request = {"messages": history,
               "tools": [{"type": "function", "function": {"name": "get_weather"}}]}
    text = serverside.render_prompt_text("vllm", request, thinking=True)
    # `reasoning_content` is read as the reasoning; arguments that are not JSON become {}.
    assert "<think>Plan.</think>" in text
    assert CALL_BEGIN + "functions.get_weather:0" + ARG_BEGIN + "{}" + CALL_END in text
    # Before 0.32: the reasoning dropped, bad arguments a 400.
    assert "<think>Plan.</think>" not in serverside.render_prompt_text(
        "vllm-legacy", {**request, "messages": [*history[:1], {**history[1], "tool_calls": []},
                                                history[2]]}, thinking=True)
    # The tool as the request model dumps it: no description becomes null.
    dumped = serverside._vllm_tool({"type": "function", "function": {"name": "f", "x": 1}})
    assert dumped == {"type": "function",
                      "function": {"name": "f", "description": None, "parameters": None}}
