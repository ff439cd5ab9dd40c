"""Streamed Qwen3 answers from vLLM (`--reasoning-parser qwen3 --tool-call-parser hermes`), read
without a probe (Qwen3 has none).

The answers come from the emulator in conversation mode (its served side restates vLLM's
stream: hermes sends content only before the first `<tool_call>`, then each call's name and its
arguments in pieces; after a prompt whose last think block is closed -- every later request of
a tool loop -- the qwen3 parser sends the whole answer, think block included, as content). The
truth is the emulator's generated ids; reconstruction gets only the fields and the client's
stream note.
"""

from __future__ import annotations

import copy
import json

import httpx
import pytest

from specregen.emulator.config import EmulatorConfig
from specregen.emulator.server import serve_in_thread
from specregen.gate.checks import check_sample
from specregen.gate.config import GateConfig
from specregen.models.chat_format import streams_calls_as_parsed
from specregen.models.registry import get_format
from specregen.models.tokenizer import load_tokenizer
from specregen.reconstruct import reconstruct
from specregen.records import Completion, ProviderTraits, ToolCall
from specregen.wire.response import normalize_response
from specregen.wire.stream import assemble_lines

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


def _call(call_id: str, city: str) -> dict:
    return {"id": call_id, "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}


# Two calls in a row, then the answer: request s1 is a tool loop's later request.
CONVERSATION = {"sample_id": "c0", "tools": [WEATHER], "messages": [
    {"role": "user", "content": "Weather in Paris, then in Rome?"},
    {"role": "assistant", "content": "", "tool_calls": [_call("a", "Paris")]},
    {"role": "tool", "tool_call_id": "a", "content": "18C"},
    {"role": "assistant", "content": "", "tool_calls": [_call("b", "Rome")]},
    {"role": "tool", "tool_call_id": "b", "content": "25C"},
    {"role": "assistant", "content": "18C and 25C."}]}


@pytest.fixture(scope="module")
def qwen():
    return get_format("qwen3", load_tokenizer("mini-qwen3"))


def _stream(url: str, request: dict) -> dict:
    text = httpx.post(url + "/chat/completions", json={**request, "stream": True},
                      timeout=30).text
    body, done = assemble_lines(text.splitlines())
    assert done
    return body


def _loop(qwen, folder, profile: str) -> list[tuple[dict, dict]]:
    """The streamed requests s0 (first answer: reasoning, then a call) and s1 (after the
    first call's result), each with its response."""
    book = folder / "conversations.jsonl"
    book.write_text(json.dumps(CONVERSATION) + "\n")
    config = EmulatorConfig(profile=profile, format="qwen3", model="qwen/qwen3-8b",
                            seed=3, divergence_rate=0.0, conversations=str(book))
    messages = CONVERSATION["messages"][:1]
    out = []
    with serve_in_thread(config, qwen.tok) as emu:
        url = emu.openrouter_url if profile == "openrouter" else emu.url
        for step in range(2):
            request = {"model": "qwen/qwen3-8b", "messages": list(messages),
                       "tools": [WEATHER], "return_token_ids": True,
                       "stream_options": {"include_usage": True}}
            body = _stream(url, request)
            out.append(({**request, "stream": True}, body))
            completion = normalize_response(body)
            assert completion.tool_calls, step  # divergence 0: the dataset's calls
            call = completion.tool_calls[0]
            messages += [qwen.history_message(completion, thinking=True),
                         {"role": "tool", "tool_call_id": call.id,
                          "content": "18C" if step == 0 else "25C"}]
    return out


@pytest.fixture(scope="module")
def loop(qwen, tmp_path_factory):
    """vLLM 0.32 (`vllm-hermes`)."""
    return _loop(qwen, tmp_path_factory.mktemp("q3"), "vllm-hermes")


@pytest.fixture(scope="module")
def earlier_loop(qwen, tmp_path_factory):
    """The earlier vLLM's qwen3 parser, behind OpenRouter (`openrouter`)."""
    return _loop(qwen, tmp_path_factory.mktemp("q3-earlier"), "openrouter")


def _truth(body: dict) -> list[int]:
    return body["choices"][0]["token_ids"]


def _bare(body: dict) -> dict:
    """The response as from a provider that returns no ids."""
    body = copy.deepcopy(body)
    body.pop("prompt_token_ids", None)
    body["choices"][0].pop("token_ids", None)
    return body


def test_the_format_says_its_servers_stream_calls_as_they_parse_them(qwen):
    assert streams_calls_as_parsed(qwen)
    # K2.5's providers differ (a probe tells them apart): its format leaves it to the traits.
    assert not streams_calls_as_parsed(get_format("kimi-k2.5", load_tokenizer("mini")))


def test_content_before_the_streamed_call_is_placed_without_a_probe(qwen, loop):
    request, body = loop[0]
    message = body["choices"][0]["message"]
    # hermes sent the "\n\n" after `</think>` as content, before the call's pieces.
    assert message["content"] == "\n\n" and message["reasoning"]
    note = body["choices"][0]["specregen_stream"]
    assert note["content_at_calls"] == [2] and note["call_fragments"][0] >= 2
    sample = reconstruct("s0", request, _bare(body), qwen)
    assert sample.input_ids[sample.prompt_len:] == _truth(body)
    assert sample.status == "ok" and sample.evidence == "usage_exact", sample.flags
    # The record is what places it: content after the call's first delta, or a call sent
    # whole (a server that may have parsed at the end), leaves the place unknown.
    after = _bare(body)
    after["choices"][0]["specregen_stream"]["content_at_calls"] = [0]
    sample = reconstruct("s0", request, after, qwen)
    assert sample.status == "flagged" and "reading_ambiguous" in sample.flags
    whole = _bare(body)
    whole["choices"][0]["specregen_stream"]["call_fragments"] = [1]
    assert "reading_ambiguous" in reconstruct("s0", request, whole, qwen).flags
    unnoted = _bare(body)
    del unnoted["choices"][0]["specregen_stream"]
    assert "reading_ambiguous" in reconstruct("s0", request, unnoted, qwen).flags


def test_a_tool_loops_reasoning_is_streamed_as_reasoning_by_vllm_032(qwen, loop):
    request, body = loop[1]
    message = body["choices"][0]["message"]
    # 0.32's prompt check stops at the last `<|im_start|>`: the earlier turn's `</think>` does
    # not end this one's reasoning (docs/vllm-0.32.md, item 31).
    assert message["reasoning"] and not (message["content"] or "").startswith("<think>")
    assert message["tool_calls"]
    sample = reconstruct("s1", request, _bare(body), qwen)
    assert sample.input_ids[sample.prompt_len:] == _truth(body)
    assert sample.status == "ok", sample.flags
    assert "reasoning_unsplit" not in sample.flags


def test_a_tool_loops_reasoning_sent_as_content_is_read_back(qwen, earlier_loop):
    request, body = earlier_loop[1]
    message = body["choices"][0]["message"]
    # The earlier qwen3 parser saw `</think>` last in the prompt: everything came as content.
    assert message.get("reasoning") is None and message["content"].startswith("<think>")
    assert message["tool_calls"]
    sample = reconstruct("s1", request, _bare(body), qwen)
    assert sample.input_ids[sample.prompt_len:] == _truth(body)
    assert sample.status == "ok" and sample.evidence == "usage_exact", sample.flags
    assert "reasoning_unsplit" in sample.flags
    assert not {"reasoning_missing", "no_reasoning_block", "think_tag_in_text",
                "reading_ambiguous"} & set(sample.flags)
    # The fields say what the model wrote: its reasoning, then the text before the call.
    head, _, rest = message["content"][len("<think>"):].partition("</think>")
    assert (sample.reasoning, sample.content) == (head, rest)
    # So the gate sees no marker text in the content and accepts the sample.
    decision = check_sample(sample, qwen, GateConfig())
    assert decision.accepted, decision.reason_strings()


def _completion(content: str | None, calls=(), finish="stop") -> Completion:
    return Completion(reasoning=None, content=content, tool_calls=list(calls),
                      finish_reason=finish)


def test_a_think_block_in_content_is_split_only_where_the_text_stays_the_same(qwen):
    request = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
    call = ToolCall("chatcmpl-tool-" + "0" * 32, "get_weather", '{"city": "Paris"}')

    def read(content, calls=(), truncated=False):
        completion = _completion(content, calls, "length" if truncated else "stop")
        (reading,) = qwen.readings(request, completion, list(calls), True, truncated, 0,
                                   ProviderTraits())
        raw = qwen.assemble(None, content, list(calls), thinking=True, truncated=truncated,
                            arguments_verbatim=True)
        assert reading.ids == raw.ids  # the same ids whichever way it is read
        return reading

    reading = read("<think>\nR\n</think>\n\nDone.")
    assert (reading.assembled.reasoning, reading.assembled.content) == ("\nR\n", "\n\nDone.")
    assert "reasoning_unsplit" in reading.flags and "reasoning_missing" not in reading.flags
    # Cut inside the reasoning: no `</think>` was written.
    reading = read("<think>\nR and mo", truncated=True)
    assert (reading.assembled.reasoning, reading.assembled.content) == ("\nR and mo", None)
    # Not cut, yet no `</think>`: reading it as reasoning would add one; kept as returned.
    reading = read("<think>\nR")
    assert "reasoning_unsplit" not in reading.flags and "reasoning_missing" in reading.flags
    # `</think>` right before the call: the split would restore a "\n\n" the model never
    # wrote; kept as returned.
    reading = read("<think>\nR\n</think>", [call])
    assert "reasoning_unsplit" not in reading.flags and "reasoning_missing" in reading.flags
    # No think block at the start: nothing to read back.
    assert "reasoning_unsplit" not in read("Text <think> later").flags


def test_sglang_stream_fields_read_back_to_the_models_ids(qwen):
    """SGLang's stream (qwen25 detector): content before the calls keeps its newlines;
    arguments are `json.dumps` with ASCII escapes. The truth is `served.model_ids`, the fields
    the restated stream (`sglang.stream`)."""
    from specregen.models.qwen3 import served as qserved
    from specregen.models.qwen3 import sglang as sg

    tools = [WEATHER]
    cases = [(True, "Let me check.", [{"city": "Paris"}, {"city": "北京"}]),
             (True, "", [{"city": "Rome"}]),
             (False, "Sure.", [{"city": "Oslo"}]),
             (False, "", [{"city": "Lyon"}, {"city": "Nice"}]),
             (True, "Just an answer.", []),
             (False, "", [{}])]  # `{}` is never streamed: "" comes back
    for thinking, content, args in cases:
        request = {"messages": [{"role": "user", "content": "q"}], "tools": tools,
                   "stream": True, "chat_template_kwargs": {"enable_thinking": thinking}}
        written = [("get_weather", json.dumps(a, ensure_ascii=False)) for a in args]
        ids = qserved.model_ids(qwen.tok, reasoning="Thinking." if thinking else None,
                           content=content, calls=written)
        fields = sg.stream(sg.decode_output(ids, qwen.tok, False), request)
        calls = [ToolCall(f"call_{k:024x}", c.name, c.arguments)
                 for k, c in enumerate(fields.parsed.calls)]
        assert len(calls) == len(args)
        # Older base detectors (sglang base_format_detector.py@72a0fbe) also send a "\n" that
        # ends a call's JSON on a step of its own, and the "\n" between calls, as content.
        for leak in ("", "\n\n" * len(calls)):
            completion = Completion(reasoning=fields.parsed.reasoning,
                                    content=fields.parsed.content + leak, tool_calls=calls,
                                    finish_reason=fields.parsed.finish_reason)
            (reading,) = qwen.readings(request, completion, calls, thinking, False, 0,
                                       ProviderTraits())
            assert reading.ids == ids, (thinking, content, leak, reading.flags)
            if leak:
                assert "content_whitespace_guessed" in reading.flags
            if any(not c.arguments or "\\u" in c.arguments for c in calls):
                assert "arguments_canonical_assumed" in reading.flags


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_call_tag_opening_the_content_leaves_the_think_end_unplaced(qwen, stream):
    # vLLM 0.32 ends the reasoning at a `<tool_call>` inside it and drops a later `</think>`:
    # "R `<tool_call>` x. </think> y" comes back as the fields of "R </think> `<tool_call>` x.
    # y" -- the same ids but for where `</think>` stood, which no field or count shows.
    request = {"model": "qwen/qwen3-8b", "messages": [{"role": "user", "content": "Hi"}],
               **({"stream": True} if stream else {})}
    body = {"choices": [{"index": 0, "finish_reason": "stop", "message": {
        "role": "assistant", "reasoning": "\nWrite `",
        "content": "<tool_call>` to call.\n\nUse `<tool_call>` tags."}}]}
    sample = reconstruct("q", request, body, qwen)
    assert sample.status == "flagged" and "reading_ambiguous" in sample.flags
