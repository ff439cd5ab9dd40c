"""The upstream profiles answer the way vLLM's and SGLang's Kimi code does.

Every expected value below is written out by hand from reading the upstream code
(docs/upstream-parsers.md names the file and function of each rule), for completions written by
hand: whitespace around ids and arguments, `(no content)`, text after the section end, a section
opened before `</think>`, output with no `<think>`, histories holding earlier calls. The HTTP
tests check the same behaviour end to end, with the ground-truth ids the emulator returns.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest

from specregen.emulator.config import EmulatorConfig
from specregen.emulator.server import serve_in_thread
from specregen.models.chat_format import FormatError
from specregen.models.kimi_k25 import (
    ARG_BEGIN,
    CALL_BEGIN,
    CALL_END,
    SECTION_BEGIN,
    SECTION_END,
    THINK_END,
    KimiK25,
    serverside,
)
from specregen.models.kimi_k25 import servers as upstream
from specregen.models.kimi_k25.servers import MarkerIds, Parsed, ServerCall
from specregen.models.tokenizer import load_tokenizer
from specregen.reconstruct import reconstruct

TOK = load_tokenizer("mini")
FMT = KimiK25(TOK)
IDS = MarkerIds.of(TOK)
MARKERS = re.compile("(" + "|".join(re.escape(m) for m in (
    THINK_END, SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARG_BEGIN, CALL_END)) + ")")
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search_web", "description": "Search the web.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}},
    {"type": "function", "function": {
        "name": "get-time", "description": "Time of day.",
        "parameters": {"type": "object", "properties": {}}}},
]
USER = {"role": "user", "content": "What is the weather in Paris?"}
REQUEST: dict[str, Any] = {"messages": [USER], "tools": TOOLS}
INSTANT: dict[str, Any] = {**REQUEST, "chat_template_kwargs": {"thinking": False}}
NO_TOOLS: dict[str, Any] = {"messages": [USER]}


def completion(text: str, truncated: bool = False) -> upstream.Output:
    """The server-side view of a hand-written completion: marker strings are marker ids, the
    rest is model text; then the stop token, which the detokenizer never shows."""
    ids: list[int] = []
    for piece in MARKERS.split(text):
        if MARKERS.fullmatch(piece):
            ids.append(TOK.token_id(piece))
        elif piece:
            ids.extend(TOK.encode_ordinary(piece))
    if not truncated:
        ids.append(IDS.stop)
    out = upstream.decode_output(ids, TOK, truncated)
    assert out.text == text
    return out


def run(server: str, text: str, request: dict[str, Any], stream: bool = False) -> Parsed:
    return upstream.parse(server, completion(text), request, IDS, stream=stream)  # type: ignore[arg-type]


def call(call_id: str, name: str, arguments: str, index: int) -> ServerCall:
    return ServerCall(call_id, name, arguments, index)


# A call with whitespace around its id and arguments, whitespace between the markers and text
# after the section end.
SPACED = ("Let me check.</think>\n" + SECTION_BEGIN + "\n" + CALL_BEGIN
          + " functions.get_weather:0 " + ARG_BEGIN + ' {"city": "Paris"}\n' + CALL_END
          + "\n" + SECTION_END + "Done.")


def test_spaced_call_and_text_after_the_section():
    weather = call("functions.get_weather:0", "get_weather", '{"city": "Paris"}', 0)
    # vLLM: trimmed id and arguments; whitespace-only content nulled; text after the end lost.
    assert run("vllm-legacy", SPACED, REQUEST) == Parsed("Let me check.", None, (weather,),
                                                  "tool_calls")
    assert run("vllm-k25", SPACED, REQUEST) == Parsed("Let me check.", None, (weather,),
                                                      "tool_calls")
    # Its stream sends the text between and after the calls as content.
    assert run("vllm-legacy", SPACED, REQUEST, stream=True) == Parsed(
        "Let me check.", "\n\nDone.", (weather,), "tool_calls")
    # SGLang: content kept untrimmed, text after the end lost.
    assert run("sglang", SPACED, REQUEST) == Parsed("Let me check.", "\n", (weather,),
                                                    "tool_calls")
    # Its stream closes the call at the step where the arguments parse as JSON; the newline
    # after them, the one after the call and the text after the section arrive as content.
    assert run("sglang", SPACED, REQUEST, stream=True) == Parsed(
        "Let me check.", "\n\n\nDone.", (weather,), "tool_calls")
    # Not forced and no `<think>` in the text: nothing is split off as reasoning.
    assert run("sglang-noforce", SPACED, REQUEST) == Parsed(
        None, "Let me check.</think>\n", (weather,), "tool_calls")


# `(no content)` before the calls, and inside the arguments.
PLACEHOLDER = ("Thinking.</think>(no content)" + SECTION_BEGIN + CALL_BEGIN
               + "functions.search_web:0" + ARG_BEGIN + '{"query": "(no content)"}' + CALL_END
               + SECTION_END)


def test_no_content_placeholder():
    # vLLM's kimi_k2 reasoning parser deletes it from the whole content, arguments included.
    assert run("vllm-legacy", PLACEHOLDER, REQUEST) == Parsed(
        "Thinking.", None,
        (call("functions.search_web:0", "search_web", '{"query": ""}', 0),), "tool_calls")
    kept = call("functions.search_web:0", "search_web", '{"query": "(no content)"}', 0)
    # With tools the stream reaches the tool parser unfiltered; kimi_k25 has no filter.
    assert run("vllm-legacy", PLACEHOLDER, REQUEST, stream=True) == Parsed(
        "Thinking.", "(no content)", (kept,), "tool_calls")
    assert run("vllm-k25", PLACEHOLDER, REQUEST) == Parsed("Thinking.", "(no content)", (kept,),
                                                           "tool_calls")
    assert run("sglang", PLACEHOLDER, REQUEST) == Parsed("Thinking.", "(no content)", (kept,),
                                                         "tool_calls")
    # Without calls the filter still applies (and the placeholder was the whole answer).
    assert run("vllm-legacy", "Thinking.</think>(no content)", NO_TOOLS) == Parsed(
        "Thinking.", None, (), "stop")


# A tool section opened before the reasoning was closed.
IN_THINK = ("I should call the tool." + SECTION_BEGIN + CALL_BEGIN + "functions.get_weather:0"
            + ARG_BEGIN + '{"city": "Oslo"}' + CALL_END + SECTION_END)


def test_section_opened_before_think_end():
    oslo = call("functions.get_weather:0", "get_weather", '{"city": "Oslo"}', 0)
    # DeepSeek-R1 split: no `</think>`, all of it is reasoning, no call.
    assert run("vllm-legacy", IN_THINK, REQUEST) == Parsed(IN_THINK, None, (), "stop")
    assert run("vllm-legacy", IN_THINK, REQUEST, stream=True) == Parsed(IN_THINK, None, (), "stop")
    assert run("vllm-k25", IN_THINK, REQUEST) == Parsed(IN_THINK, None, (), "stop")
    # kimi_k25's stream turns the section into content, where the call is found.
    assert run("vllm-k25", IN_THINK, REQUEST, stream=True) == Parsed(
        "I should call the tool.", None, (oslo,), "tool_calls")
    # Forced SGLang closes the reasoning at the section marker.
    assert run("sglang", IN_THINK, REQUEST) == Parsed("I should call the tool.", "", (oslo,),
                                                      "tool_calls")
    assert run("sglang-noforce", IN_THINK, REQUEST) == Parsed(
        None, "I should call the tool.", (oslo,), "tool_calls")


def test_reasoning_split_without_tools():
    text = "Reason.</think>\n\nAnswer."
    assert run("sglang", text, NO_TOOLS) == Parsed("Reason.", "\n\nAnswer.", (), "stop")
    assert run("sglang-noforce", text, NO_TOOLS) == Parsed(None, text, (), "stop")
    assert run("vllm-legacy", text, NO_TOOLS) == Parsed("Reason.", "\n\nAnswer.", (), "stop")
    # vLLM's stream filter drops a content step that is only whitespace (`\n\n` is one token).
    assert run("vllm-legacy", text, NO_TOOLS, stream=True) == Parsed("Reason.", "Answer.", (),
                                                                     "stop")
    assert run("vllm-k25", text, NO_TOOLS, stream=True) == Parsed("Reason.", "\n\nAnswer.", (),
                                                                  "stop")
    # A literal `<think>` in the answer: vLLM's string split drops all before it.
    literal = "Reason.</think>Use the <think> tag."
    assert run("vllm-legacy", literal, NO_TOOLS) == Parsed(" tag.", None, (), "stop")
    assert run("vllm-legacy", literal, NO_TOOLS, stream=True) == Parsed(
        "Reason.", "Use the <think> tag.", (), "stop")
    # ... and makes an unforced SGLang split after all.
    assert run("sglang-noforce", literal, NO_TOOLS) == Parsed("Reason.", "Use the <think> tag.",
                                                              (), "stop")


def test_literal_think_tag_at_a_step_boundary():
    # `<think>` written as text, tokenised `<` `think` `>`: string rules see the tag.
    text = "Reason.</think><think> is a tag."
    assert run("vllm-legacy", text, NO_TOOLS) == Parsed(" is a tag.", None, (), "stop")
    assert run("vllm-legacy", text, NO_TOOLS, stream=True) == Parsed(
        "Reason.", "<think> is a tag.", (), "stop")  # the stream rules look at token ids
    assert run("sglang", text, NO_TOOLS) == Parsed("Reason.", "<think> is a tag.", (), "stop")
    assert run("sglang-noforce", text, NO_TOOLS) == Parsed("Reason.", "<think> is a tag.", (),
                                                           "stop")
    # SGLang's stream holds `<` and `<think` back as marker prefixes, then strips the first
    # `<think>` it meets and reasons again.
    assert run("sglang", text, NO_TOOLS, stream=True) == Parsed("Reason. is a tag.", "", (),
                                                                "stop")
    assert run("sglang-noforce", text, NO_TOOLS, stream=True) == Parsed(
        " is a tag.", "Reason.</think>", (), "stop")


def test_instant_mode():
    assert run("vllm-legacy", "Answer only.", INSTANT) == Parsed(None, "Answer only.", (), "stop")
    # kimi_k25 forces thinking on: the whole instant answer is reasoning.
    assert run("vllm-k25", "Answer only.", INSTANT) == Parsed("Answer only.", None, (), "stop")
    assert run("sglang", "Answer only.", INSTANT) == Parsed(None, "Answer only.", (), "stop")


HISTORY = [
    USER,
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "functions.get_weather:0", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
        {"id": "functions.search_web:1", "type": "function",
         "function": {"name": "search_web", "arguments": '{"query":"Paris"}'}}]},
    {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "18 C"},
    {"role": "tool", "tool_call_id": "functions.search_web:1", "content": "news"},
    {"role": "user", "content": "And Rome and Bern?"},
]
# The model writes the running count of the conversation; the second id has no prefix.
RUNNING = ("</think>" + SECTION_BEGIN + CALL_BEGIN + "functions.get_weather:2" + ARG_BEGIN
           + '{"city": "Rome"}' + CALL_END + CALL_BEGIN + "get_weather:3" + ARG_BEGIN
           + '{"city": "Bern"}' + CALL_END + SECTION_END)


def test_tool_ids_with_earlier_calls():
    request = {"messages": HISTORY, "tools": TOOLS}
    rome, bern = '{"city": "Rome"}', '{"city": "Bern"}'
    assert run("vllm-legacy", RUNNING, request).calls == (
        call("functions.get_weather:2", "get_weather", rome, 0),
        call("get_weather:3", "get_weather", bern, 1))
    # SGLang adds the two earlier calls to the index the model wrote...
    assert run("sglang", RUNNING, request) == Parsed(None, "", (
        call("functions.get_weather:4", "get_weather", rome, 2),
        call("functions.get_weather:5", "get_weather", bern, 3)), "tool_calls")
    # ... while its stream adds them to the call's position in the answer.
    assert run("sglang", RUNNING, request, stream=True).calls == (
        call("functions.get_weather:2", "get_weather", rome, 0),
        call("functions.get_weather:3", "get_weather", bern, 1))


def test_sglang_drops_calls_its_regex_rejects():
    hyphen = ("</think>" + SECTION_BEGIN + CALL_BEGIN + "functions.get-time:0" + ARG_BEGIN
              + "{}" + CALL_END + SECTION_END)
    assert run("sglang", hyphen, REQUEST) == Parsed(None, "", (), "tool_calls")
    assert run("vllm-legacy", hyphen, REQUEST).calls == (
        call("functions.get-time:0", "get-time", "{}", 0),)
    multiline = ("</think>" + SECTION_BEGIN + CALL_BEGIN + "functions.get_weather:0" + ARG_BEGIN
                 + '{\n  "city": "Lima"\n}' + CALL_END + SECTION_END)
    assert run("sglang", multiline, REQUEST) == Parsed(None, "", (), "tool_calls")
    # The stream never sees those arguments complete; at the end the server tops up the `{`
    # it sent with what `json.dumps({})` has more: the call arrives as `{}`.
    assert run("sglang", multiline, REQUEST, stream=True) == Parsed(
        None, "", (call("functions.get_weather:0", "get_weather", "{}", 0),), "tool_calls")
    assert run("vllm-legacy", multiline, REQUEST).calls == (
        call("functions.get_weather:0", "get_weather", '{\n  "city": "Lima"\n}', 0),)


def test_truncated_answers():
    cut = upstream.parse("vllm-legacy", completion("Half a thou", truncated=True), REQUEST, IDS,
                         stream=False)
    assert cut == Parsed("Half a thou", None, (), "length")
    open_section = "Ok.</think>" + SECTION_BEGIN + CALL_BEGIN + "functions.get_weather:0"
    # Both cut the content at the marker; vLLM says tool_calls only when a call came back,
    # SGLang says it whenever the marker is there -- but not after a `length` stop.
    assert upstream.parse("vllm-legacy", completion(open_section, truncated=True), REQUEST, IDS,
                          stream=False) == Parsed("Ok.", None, (), "length")
    closed = open_section + "{}" + SECTION_END
    assert run("vllm-legacy", closed, REQUEST) == Parsed("Ok.", None, (), "stop")
    assert run("sglang", closed, REQUEST) == Parsed("Ok.", "", (), "tool_calls")
    assert upstream.parse("sglang", completion(open_section, truncated=True), REQUEST, IDS,
                          stream=False) == Parsed("Ok.", "", (), "length")


# ---------------------------------------------------------------------------------------------
# The prompt each server renders


def rendered(family: str, messages: list[dict[str, Any]], **extra: Any) -> str:
    return serverside.render_prompt_text(family, {"messages": messages, **extra},  # type: ignore[arg-type]
                                         thinking=True)


def test_vllm_and_sglang_re_serialise_history_arguments():
    for family in ("vllm", "sglang"):
        text = rendered(family, HISTORY)
        assert (CALL_BEGIN + "functions.get_weather:0" + ARG_BEGIN + '{"city": "Paris"}'
                + CALL_END) in text
        assert '{"city":"Paris"}' not in text


def test_null_and_missing_fields_in_the_prompt():
    messages = [
        USER,
        {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "get_weather",
                                              "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "content": "18 C"},
    ]
    vllm, sglang = rendered("vllm", messages), rendered("sglang", messages)
    # The assistant turn is in the suffix (no plain assistant turn after it).
    head = "<|im_assistant|>assistant<|im_middle|>"
    assert head + "<think></think>" + SECTION_BEGIN + CALL_BEGIN + ARG_BEGIN in vllm
    assert head + "<think>None</think>" + SECTION_BEGIN + CALL_BEGIN + "None" + ARG_BEGIN in sglang
    assert "<|im_system|>tool<|im_middle|>## Return of \n18 C<|im_end|>" in vllm
    assert "<|im_system|>tool<|im_middle|>## Return of None\n18 C<|im_end|>" in sglang


def test_sglang_turns_a_final_assistant_message_into_a_user_turn():
    text = rendered("sglang", [USER, {"role": "assistant", "content": "Sure"}])
    assert text.endswith("<|im_user|>user<|im_middle|>Sure<|im_end|>"
                         "<|im_assistant|>assistant<|im_middle|><think>")


def test_history_arguments_that_are_not_json_are_refused():
    bad = [USER, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "functions.get_weather:0", "type": "function",
         "function": {"name": "get_weather", "arguments": "{city: Paris}"}}]}]
    for family in ("vllm-legacy", "sglang"):
        with pytest.raises(FormatError, match=r"messages\[1\]\.tool_calls\[0\]"):
            rendered(family, bad)


# ---------------------------------------------------------------------------------------------
# End to end, through the HTTP app


def post(emu, request: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(emu.url + "/chat/completions", json=request, timeout=20)
    assert response.status_code == 200, response.text
    return response.json()


def stream(emu, request: dict[str, Any]) -> dict[str, Any]:
    text = httpx.post(emu.url + "/chat/completions", json={**request, "stream": True},
                      timeout=20).text
    message: dict[str, Any] = {}
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    for line in text.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        for choice in json.loads(line[6:]).get("choices", []):
            delta = choice.get("delta") or {}
            for key in ("content", "reasoning", "reasoning_content"):
                if isinstance(delta.get(key), str):
                    message[key] = message.get(key, "") + delta[key]
            for piece in delta.get("tool_calls") or []:
                slot = calls.setdefault(piece["index"], {"id": None, "arguments": ""})
                slot["id"] = piece.get("id") or slot["id"]
                slot["arguments"] += (piece.get("function") or {}).get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    return {"message": message, "calls": [calls[i] for i in sorted(calls)], "finish": finish}


def emulator(profile: str, **knobs: Any):
    return serve_in_thread(EmulatorConfig(profile=profile, literal_marker_rate=0.0,  # type: ignore[arg-type]
                                          **knobs), TOK)


def tool_request(messages: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    return {"messages": messages or [USER], "tools": TOOLS[:2], "return_token_ids": True,
            **extra}


def test_http_vllm_placeholder_deleted_plain_kept_in_the_stream():
    with emulator("vllm-legacy", no_content_before_calls_rate=1.0) as emu:
        # Without the detokenizer's spaces around the markers (docs/vllm-0.32.md, 1.2).
        request = tool_request(spaces_between_special_tokens=False)
        plain = post(emu, request)
        truth = plain["choices"][0]["token_ids"]
        assert "(no content)" in TOK.decode_bytes(truth).decode()
        assert plain["choices"][0]["message"]["content"] is None
        assert plain["usage"]["completion_tokens"] == len(truth)  # the stop token counts
        assert stream(emu, request)["message"]["content"] == "(no content)"


def test_http_sglang_ids_with_a_history():
    history = [*HISTORY[:-1], {"role": "user", "content": "What is the weather in Rome?"}]
    with emulator("sglang") as emu:
        request = tool_request(history)
        plain = post(emu, request)
        truth = TOK.decode_bytes(plain["choices"][0]["token_ids"]).decode()
        # The model wrote the running count (2, 3, ...); the answer adds the history again.
        written = re.findall(r"functions\.[\w.]+:(\d+)", truth)
        returned = [c["id"] for c in plain["choices"][0]["message"]["tool_calls"]]
        assert written[0] == "2"
        assert [int(r.rsplit(":", 1)[1]) for r in returned] == [2 + int(w) for w in written]
        streamed = [c["id"] for c in stream(emu, request)["calls"]]
        assert [int(s.rsplit(":", 1)[1]) for s in streamed] == list(
            range(2, 2 + len(written)))
        # The flat id that matches the model's own text, flagged or not, is never `ok` wrong.
        sample = reconstruct("x", request, plain, FMT)
        if sample.status == "ok":
            assert sample.input_ids[sample.prompt_len:] == plain["choices"][0]["token_ids"]


def test_http_sglang_noforce_returns_the_reasoning_unsplit():
    with emulator("sglang-noforce") as emu:
        plain = post(emu, {"messages": [USER], "return_token_ids": True})
        message = plain["choices"][0]["message"]
        assert message["reasoning_content"] is None
        assert THINK_END in message["content"]
    with emulator("sglang") as emu:
        message = post(emu, {"messages": [USER]})["choices"][0]["message"]
        assert message["reasoning_content"] and THINK_END not in message["content"]


def test_http_section_in_think_and_text_after_the_section():
    knobs = {"section_in_think_rate": 1.0, "text_after_section_rate": 1.0}
    with emulator("vllm-legacy", **knobs) as emu:
        body = post(emu, tool_request())
        choice = body["choices"][0]
        assert THINK_END not in TOK.decode_bytes(choice["token_ids"]).decode()
        assert "tool_calls" not in choice["message"] and choice["finish_reason"] == "stop"
        assert SECTION_BEGIN in choice["message"]["reasoning"]
    with emulator("sglang", **knobs) as emu:
        body = post(emu, tool_request())
        choice = body["choices"][0]
        truth = TOK.decode_bytes(choice["token_ids"][:-1]).decode()
        after = truth[truth.index(SECTION_END) + len(SECTION_END):]
        assert after  # the model wrote text after the section ...
        assert choice["message"]["content"] == ""  # ... which the answer does not carry
        assert choice["finish_reason"] == "tool_calls" and choice["message"]["tool_calls"]
        assert SECTION_BEGIN not in (choice["message"]["reasoning_content"] or "")


TWO_CALLS = ("ok</think>Sure. " + SECTION_BEGIN + CALL_BEGIN + "functions.get_weather:0"
             + ARG_BEGIN + '{"city": "Paris"}' + CALL_END + "mid" + CALL_BEGIN
             + "functions.search_web:1" + ARG_BEGIN + '{"query": "x"}' + CALL_END + SECTION_END
             + " end")


def test_streams_send_text_between_and_after_calls_after_them():
    # Per call, the characters of content the stream sent before the call's first delta.
    for server in ("vllm-legacy", "vllm-k25", "sglang"):
        parsed = run(server, TWO_CALLS, REQUEST, stream=True)
        assert (parsed.content, parsed.content_at_calls) == ("Sure. mid end", (6, 9)), server
        assert run(server, SPACED, REQUEST, stream=True).content_at_calls == (1,), server
        # The plain answer has no order to keep.
        assert run(server, TWO_CALLS, REQUEST).content_at_calls is None
    assert run("vllm-legacy", "ok</think>no calls", REQUEST, stream=True).content_at_calls is None


def test_http_stream_frames_keep_the_parsers_order():
    with emulator("vllm-legacy", text_after_section_rate=1.0, tool_call_rate=1.0, seed=4) as emu:
        request = tool_request()
        text = httpx.post(emu.url + "/chat/completions", json={**request, "stream": True},
                          timeout=20).text
        order = []
        for line in text.splitlines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:]).get("choices", []):
                    delta = choice.get("delta") or {}
                    if delta.get("tool_calls"):
                        order.append("call")
                    elif delta.get("content"):
                        order.append("content")
        assert "call" in order and order[-1] == "content"  # the text after the section
        truth = TOK.decode_bytes(post(emu, request)["choices"][0]["token_ids"][:-1]).decode()
        after = truth[truth.index(SECTION_END) + len(SECTION_END):]
        assert after and stream(emu, request)["message"]["content"].endswith(after)


def test_http_vllm_k25_instant_answer_comes_back_as_reasoning():
    with emulator("vllm-k25") as emu:
        request = {"messages": [USER], "chat_template_kwargs": {"thinking": False},
                   "return_token_ids": True, "spaces_between_special_tokens": False}
        body = post(emu, request)
        message = body["choices"][0]["message"]
        assert message["content"] is None
        assert message["reasoning"] == TOK.decode_bytes(
            body["choices"][0]["token_ids"][:-1]).decode()
        # The prompt is the instant one, ending in an empty think block.
        assert body["prompt_token_ids"][-2:] == [TOK.token_id("<think>"), IDS.think_end]


def test_http_prompt_ids_are_the_servers_rendering():
    messages = [*HISTORY, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "functions.get_weather:2", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}}]},
        {"role": "tool", "tool_call_id": "functions.get_weather:2", "content": "21 C"}]
    request = tool_request(messages)
    for profile, family in (("vllm", "vllm"), ("sglang", "sglang")):
        with emulator(profile) as emu:
            body = post(emu, request)
        expected = TOK.encode_with_specials(serverside.render_prompt_text(
            family, request, thinking=True))  # type: ignore[arg-type]
        assert body["prompt_token_ids"] == expected
        assert body["usage"]["prompt_tokens"] == len(expected)
        text = TOK.decode_bytes(body["prompt_token_ids"]).decode()
        assert '{"city": "Rome"}' in text and '{"city":"Rome"}' not in text
        # The last assistant turn (with calls, after the last plain one) has no reasoning.
        assert ("<think>None</think>" in text) == (profile == "sglang")


def test_http_bad_history_arguments_are_a_400():
    bad = [USER, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "functions.get_weather:0", "type": "function",
         "function": {"name": "get_weather", "arguments": "{city: Paris}"}}]},
        {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "x"}]
    with emulator("vllm-legacy") as emu:
        response = httpx.post(emu.url + "/chat/completions", json=tool_request(bad), timeout=20)
    assert response.status_code == 400
    assert "messages[1].tool_calls[0].function.arguments" in response.json()["error"]["message"]
