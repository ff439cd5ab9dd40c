"""Qwen3 answer shapes that reconstruction once got wrong (`bench/fidelity_corpus.py` found them):
each answer is written as the model's true ids (`models/qwen3/corpus.py` `answer_ids`), served
through the restated parsers and the emulator's framing (`emulator/fidelity.py` `serve_ids`),
rebuilt blind, and checked
against those true ids -- never against the reader's own output.
"""

from __future__ import annotations

import json

import pytest

from specregen.emulator.fidelity import blind_body, serve_ids
from specregen.models.qwen3.corpus import Piece, answer_ids
from specregen.models.qwen3.served import Qwen3Server
from specregen.models.qwen3.tokens import THINK, THINK_END, TOOL_CALL, TOOL_CALL_END
from specregen.models.registry import get_format
from specregen.models.tokenizer import load_tokenizer
from specregen.reconstruct import reconstruct

STRIPS = "strips_content_beside_calls"  # the family's trait

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
    {"type": "function", "function": {
        "name": "list_files", "description": "List files.",
        "parameters": {"type": "object", "properties": {}}}}]


@pytest.fixture(scope="module")
def qwen():
    return get_format("qwen3", load_tokenizer("mini-qwen3"))


def _call(name: str, args: dict) -> str:
    return (f'{TOOL_CALL}\n{{"name": "{name}", "arguments": '
            f'{json.dumps(args, ensure_ascii=False)}}}\n{TOOL_CALL_END}')


def _request(thinking: bool, *, tools: bool = True, loop: bool = False) -> dict:
    messages: list[dict] = [{"role": "user", "content": "What is the weather in Oslo?"}]
    if loop:
        call = {"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
        messages += [{"role": "assistant", "content": "", "tool_calls": [call],
                      "reasoning": "I should call it.", "reasoning_content": "I should call it."},
                     {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    request: dict = {"model": "Qwen/Qwen3-8B", "return_token_ids": True, "messages": messages,
                     "chat_template_kwargs": {"enable_thinking": thinking}}
    if tools:
        request["tools"] = TOOLS
    return request


def _rebuild(qwen, pieces: list[Piece], request: dict, profile: str, stream: bool):
    """(sample rebuilt blind, the model's true prompt + completion ids)."""
    ids = answer_ids(qwen.tok, pieces)
    sent = {**request, "stream": True} if stream else request
    body = serve_ids(Qwen3Server(qwen.tok), profile, sent, ids, None, stream, 0)
    truth = body["prompt_token_ids"] + body["choices"][0]["token_ids"]
    assert body["choices"][0]["token_ids"] == ids
    return reconstruct("s", sent, blind_body(body), qwen), truth


def _never_wrong_ok(sample, truth) -> None:
    assert sample.status != "ok" or sample.input_ids == truth, sample.flags


def test_a_tool_call_tag_in_the_reasoning_of_an_sglang_stream_adds_no_think_end(qwen):
    """SGLang's streamed reasoning parser ends the reasoning at a `<tool_call>` inside it: the
    content starts with the tag and holds the model's `</think>`. Reading it as reasoning +
    `</think>` + content wrote a second `</think>` (a wrong `ok` when the `</tool_call>` the
    detector deletes from content made up the count)."""
    request = _request(True)
    plain = [Piece(f"{THINK}\nI could wrap it in {TOOL_CALL} tags.\n{THINK_END}\n\nIt is sunny.")]
    sample, truth = _rebuild(qwen, plain, request, "sglang", True)
    assert sample.status == "ok" and sample.input_ids == truth, sample.flags
    both = [Piece(f"{THINK}\nUse `{TOOL_CALL}` and `{TOOL_CALL_END}` here.\n{THINK_END}"
                  "\n\nIt is sunny.")]
    sample, truth = _rebuild(qwen, both, request, "sglang", True)
    # The deleted `</tool_call>` is gone from every field: flagged by the count, never ok.
    assert sample.status == "flagged" and sample.input_ids != truth, sample.flags


def test_text_before_a_think_tag_dropped_by_vllm_with_thinking_off_is_not_ok(qwen):
    """vLLM's earlier qwen3 reasoning parser (behind the `openrouter` profile) drops everything
    up to a `<think>` even with thinking off; the few tokens lost used to pass within the count
    tolerance. vLLM 0.32 (`vllm-hermes`) runs no reasoning parser with thinking off: the text
    comes back whole, the tag read as text."""
    pieces = [Piece(f"Not Write {THINK} first. The answer follows here.")]
    request = {**_request(False, tools=False), "reasoning": {"enabled": False}}
    request.pop("chat_template_kwargs")
    sample, truth = _rebuild(qwen, pieces, request, "openrouter", False)
    assert sample.status == "flagged" and sample.input_ids != truth, sample.flags
    sample, truth = _rebuild(qwen, pieces, _request(False, tools=False), "vllm-hermes", False)
    assert sample.status == "ok" and sample.input_ids == truth, sample.flags
    assert "think_tag_in_text" in sample.flags
    # Without a tag nothing is lost and nothing is flagged.
    sample, truth = _rebuild(qwen, [Piece("A plain answer.")], _request(False, tools=False),
                             "vllm-hermes", False)
    assert sample.status == "ok" and sample.input_ids == truth, sample.flags


@pytest.mark.parametrize("stream", [False, True])
def test_text_glued_to_a_call_comes_back_as_written_from_vllm(qwen, stream):
    """vLLM's hermes returns the text before the calls as written (its `chatcmpl-tool-` ids say
    so), and so do both restated streams: no "\\n" is restored after a bare text."""
    for profile in ("vllm-hermes", "openrouter"):
        for text in ("Let me check.", "```python\nprint(1)\n```"):
            for thinking in (True, False):
                # Thinking off, the text has no "\n\n" in front: it looks stripped.
                head = f"{THINK}\nR.\n{THINK_END}\n\n" if thinking else ""
                pieces = [Piece(head + text), Piece(_call("get_weather", {"city": "Oslo"}))]
                request = _request(thinking)
                if profile == "openrouter":
                    request = {**request, "reasoning": {"enabled": thinking}}
                    request.pop("chat_template_kwargs")
                sample, truth = _rebuild(qwen, pieces, request, profile, stream)
                assert sample.status == "ok" and sample.input_ids == truth, (
                    profile, thinking, text, sample.flags)
    if stream:
        pieces = [Piece("Let me check."), Piece(_call("get_weather", {"city": "Oslo"}))]
        sample, truth = _rebuild(qwen, pieces, _request(False), "sglang", True)
        assert sample.status == "ok" and sample.input_ids == truth, sample.flags


def test_a_blank_line_before_the_call_in_a_vllm_stream_is_kept(qwen):
    """Newlines the client's note shows arrived before the first call are the model's, not an
    older SGLang detector's leak after a call."""
    pieces = [Piece(f"{THINK}\nR.\n{THINK_END}\n\nI will look.\n\n"),
              Piece(_call("get_weather", {"city": "Oslo"}))]
    for profile in ("vllm-hermes", "sglang"):
        sample, truth = _rebuild(qwen, pieces, _request(True), profile, True)
        assert sample.status == "ok" and sample.input_ids == truth, (profile, sample.flags)


def test_a_glued_text_after_a_tool_loop_prompt_in_a_vllm_stream(qwen):
    """After a tool loop vLLM's stream sends the whole answer, think block included, as
    content: text glued to the call is still as written."""
    pieces = [Piece(f"{THINK}\nR.\n{THINK_END}\n\n```js\nx\n```"),
              Piece(_call("get_weather", {"city": "Oslo"}))]
    sample, truth = _rebuild(qwen, pieces, _request(True, loop=True), "vllm-hermes", True)
    assert sample.status == "ok" and sample.input_ids == truth, sample.flags


@pytest.mark.parametrize("stream", [False, True])
def test_calls_in_a_think_block_never_closed_through_sglang(qwen, stream):
    """SGLang ends an unclosed think block at its first `<tool_call>` and returns the calls
    with content "". A reading without the `</think>` would fit the count -- and so would the
    template's layout with two separators fewer elsewhere (calls glued to each other, below):
    the answer stays flagged by the count instead."""
    pieces = [Piece(f"{THINK}\nI need the weather.\n"),
              Piece(_call("get_weather", {"city": "Oslo"}))]
    sample, truth = _rebuild(qwen, pieces, _request(True), "sglang", stream)
    assert sample.status == "flagged" and sample.input_ids != truth, sample.flags
    # The template's layout with an empty text still reads as written.
    pieces = [Piece(f"{THINK}\nI need the weather.\n{THINK_END}\n\n"),
              Piece(_call("get_weather", {"city": "Oslo"}))]
    sample, truth = _rebuild(qwen, pieces, _request(True), "sglang", stream)
    assert sample.status == "ok" and sample.input_ids == truth, sample.flags


def test_calls_glued_to_each_other_are_never_read_as_calls_in_the_reasoning(qwen):
    """Three calls glued together (two "\\n" fewer) after the template's empty text: no reading
    puts the calls inside the reasoning (it has as many tokens: it would be a wrong `ok`)."""
    call = _call("list_files", {})
    pieces = [Piece(f"{THINK}\nI will list them:\n{THINK_END}\n\n"), Piece(call + call + call)]
    for profile in ("vllm-hermes", "openrouter", "sglang"):
        for stream in (False, True):
            sample, truth = _rebuild(qwen, pieces, _request(True), profile, stream)
            _never_wrong_ok(sample, truth)


def test_the_probes_strip_finding_decides_a_bare_text_when_ids_do_not(qwen):
    """Call ids a router rewrote say nothing of the server: the probe's
    `strips_content_beside_calls` false (vLLM's hermes) keeps a bare text as written."""
    from specregen.records import ProviderTraits, TraitMap

    pieces = [Piece("Let me check the weather"), Piece(_call("get_weather", {"city": "Oslo"}))]
    ids = answer_ids(qwen.tok, pieces)
    body = serve_ids(Qwen3Server(qwen.tok), "vllm-hermes", _request(False), ids, None, False,
                     0)
    truth = body["prompt_token_ids"] + body["choices"][0]["token_ids"]
    blind = blind_body(body)
    for call in blind["choices"][0]["message"]["tool_calls"]:
        call["id"] = "call_0"
    as_written = reconstruct("s", _request(False), blind, qwen,
                             traits=ProviderTraits(family=TraitMap({STRIPS: False})))
    assert as_written.status == "ok" and as_written.input_ids == truth, as_written.flags
    # Unknown: the template's "\n" is restored (SGLang's plain answers strip it), and the
    # count shows the token the model never wrote.
    guessed = reconstruct("s", _request(False), blind, qwen)
    assert guessed.status == "flagged" and guessed.input_ids != truth, guessed.flags


def test_a_cut_sglang_stream_opening_its_text_with_a_call_tag_is_never_ok(qwen):
    """The model wrote `<tool_call>` ... `</tool_call>` inside its reasoning and was cut before
    `</think>`: SGLang's stream ends the reasoning at the tag and deletes the `</tool_call>`, so
    the fields read like `</think>` written right before the tag -- same count, other ids."""
    request = _request(True)
    ids = answer_ids(qwen.tok, [Piece(f"{THINK}\nUse `{TOOL_CALL}` and `{TOOL_CALL_END}` to "
                                      "mark calls, then keep thinking about the weather")])
    cut = ids[:-3]
    sent = {**request, "stream": True, "max_tokens": len(cut)}
    body = serve_ids(Qwen3Server(qwen.tok), "sglang", sent, ids, len(cut), True, 0)
    assert body["choices"][0]["finish_reason"] == "length"
    truth = body["prompt_token_ids"] + body["choices"][0]["token_ids"]
    sample = reconstruct("s", sent, blind_body(body), qwen)
    _never_wrong_ok(sample, truth)
    assert sample.status == "flagged" and "reading_ambiguous" in sample.flags, sample.flags


def test_an_sglang_stream_call_without_arguments_keeps_the_streams_note(qwen):
    """SGLang's stream never sends falsy arguments: a `{}` call arrives as its name delta
    alone. It is still a call streamed as parsed (a server sending whole calls sends `{}`), so
    the client's note places the content and the answer is `ok`, not ambiguous."""
    request = _request(True)
    pieces = [Piece(f"{THINK}\nList them.\n{THINK_END}\n\nLet me look.\n"
                    + _call("list_files", {}))]
    sample, truth = _rebuild(qwen, pieces, request, "sglang", True)
    assert sample.status == "ok" and sample.input_ids == truth, sample.flags
