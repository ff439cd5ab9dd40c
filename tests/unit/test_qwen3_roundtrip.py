"""Completion round trip for the vLLM hermes profile: a completion the model could have written
(built here from segments: marker ids plus the BPE ids of the text between them) goes through
the server's detokenizer and parsers (plain and streamed), and the format rebuilds the exact ids
from the fields the API returns.
"""

from __future__ import annotations

import json
import random

import pytest

from specregen.models.qwen3 import MINI_QWEN3_TOKENIZER_DIR, Qwen3
from specregen.models.qwen3 import served as qserved
from specregen.models.qwen3 import vllm_legacy as vl
from specregen.models.tokenizer import load_tokenizer
from specregen.records import ToolCall

N_CASES = 200
WORDS = ("alpha", "Paris", "résumé", "数据", "x = 1;", "{ok}", "a\nb", "  two  spaces", "end.",
         "tab\tx", "emoji 🙂", "quote \"q\"", "path/to/file.py", "\n\n")
TOOLS = [{"type": "function", "function": {"name": n, "parameters": {}}}
         for n in ("get_weather", "search_files")]


def _words(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def _case(rng: random.Random):
    """(reasoning body or None, content, calls, tools): one answer Qwen3 could write."""
    thinking = rng.random() < 0.6
    tools = rng.random() < 0.7
    content = _words(rng, 0 if tools else 1, 5).strip("\n") if rng.random() < 0.8 else ""
    calls = []
    if tools and rng.random() < 0.7:
        for _ in range(rng.randint(1, 3)):
            args = {"q": _words(rng, 1, 3), "n": rng.randint(0, 500), "opt": [True, None, 1.5]}
            calls.append((rng.choice(TOOLS)["function"]["name"],
                          json.dumps(args, ensure_ascii=False)))
    if not content and not calls:
        content = "ok"
    reasoning = _words(rng, 1, 8).strip("\n") if thinking else None
    return reasoning, content, calls, tools


def _segments(reasoning, content, calls) -> list[str]:
    """Text and marker names alternating, in the chat template's layout."""
    segments: list[str] = []
    text = ""
    if reasoning is not None:
        segments += ["<think>", "\n" + reasoning + "\n", "</think>"]
        text = "\n\n"
    text += content
    for k, (name, args) in enumerate(calls):
        if k or content:
            text += "\n"
        segments += [text, "<tool_call>",
                     f'\n{{"name": "{name}", "arguments": {args}}}\n', "</tool_call>"]
        text = ""
    segments.append(text)
    return segments


@pytest.fixture(scope="module")
def fmt():
    return Qwen3(load_tokenizer(MINI_QWEN3_TOKENIZER_DIR))


def _truth(fmt: Qwen3, segments: list[str]) -> list[int]:
    ids: list[int] = []
    for seg in segments:
        if seg in fmt.ids:
            ids.append(fmt.ids[seg])
        elif seg:
            ids.extend(fmt.tok.encode_ordinary(seg))
    return [*ids, fmt.im_end]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_generated_completions_rebuild_exactly(fmt, stream):
    rng = random.Random(7)
    markers = vl.MarkerIds.of(fmt.tok)
    with_calls = 0
    for n in range(N_CASES):
        reasoning, content, answer_calls, tools = _case(rng)
        thinking = reasoning is not None
        segments = _segments(reasoning, content, answer_calls)
        truth = _truth(fmt, segments)
        request = {"messages": [{"role": "user", "content": "q"}]}
        if tools:
            request["tools"] = TOOLS
        if not thinking:
            request["chat_template_kwargs"] = {"enable_thinking": False}
        prompt = fmt.encode_prompt(request["messages"], request.get("tools"), thinking=thinking)
        out = vl.decode_output(truth, fmt.tok, truncated=False)
        parsed = vl.parse(out, request, markers, stream=stream, prompt_ids=prompt)
        calls = [ToolCall(f"chatcmpl-tool-{k:032x}", c.name, c.arguments)
                 for k, c in enumerate(parsed.calls)]
        with_calls += bool(calls)
        got = fmt.assemble(parsed.reasoning, parsed.content, calls, thinking=thinking,
                           truncated=False, arguments_verbatim=stream)
        assert got.ids == truth, (n, segments, parsed)
    assert with_calls > N_CASES // 3


def test_non_canonical_arguments_are_flagged_and_not_exact(fmt):
    # The model wrote compact JSON; vLLM's plain path re-dumps it, so the spacing is lost.
    segments = ["</think>", "\n\n", "<tool_call>",
                '\n{"name": "get_weather", "arguments": {"a":1}}\n', "</tool_call>", ""]
    truth = _truth(fmt, ["<think>", "\nr\n", *segments])
    request = {"messages": [{"role": "user", "content": "q"}], "tools": TOOLS}
    out = vl.decode_output(truth, fmt.tok, truncated=False)
    plain = vl.parse(out, request, vl.MarkerIds.of(fmt.tok), stream=False)
    calls = [ToolCall("", c.name, c.arguments) for c in plain.calls]
    got = fmt.assemble(plain.reasoning, plain.content, calls, thinking=True, truncated=False)
    assert got.ids != truth
    assert "arguments_canonical_assumed" in got.flags
    assert "content_whitespace_guessed" in got.flags
    streamed = vl.parse(out, request, vl.MarkerIds.of(fmt.tok), stream=True)
    calls = [ToolCall("", c.name, c.arguments) for c in streamed.calls]
    got = fmt.assemble(streamed.reasoning, streamed.content, calls, thinking=True,
                       truncated=False, arguments_verbatim=True)
    assert got.ids == truth


def test_emulator_side_writer_and_structure_agree_with_the_segments(fmt):
    rng = random.Random(11)
    for _ in range(N_CASES):
        reasoning, content, calls, _tools = _case(rng)
        truth = _truth(fmt, _segments(reasoning, content, calls))
        ids = qserved.model_ids(fmt.tok, reasoning=reasoning, content=content, calls=calls)
        assert ids == truth
        thinking = reasoning is not None
        assert fmt.structure_problems(truth, n_calls=len(calls), thinking=thinking,
                                      truncated=False) == []
        back = fmt.calls_from_ids(truth, truncated=False)
        assert [c.name for c in back.calls] == [n for n, _ in calls] if calls else back is None
