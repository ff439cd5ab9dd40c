"""Qwen3's fidelity corpus: answers written the way Qwen3 can write them, as the model's true ids,
with their requests. The harness (`emulator/fidelity.py`, bench/fidelity_corpus.py) serves each
through the restated upstream parsers (the served side's `answer_ids`) and the emulator's
response framing, as a client receives them, and rebuilds it; the real-vLLM harness scripts the
ids into a real server (`real_case`). Not in the reconstruct fingerprint: reconstruction never
imports it.

Why not `served.model_ids`: it writes the chat template's layout only. The shapes here are
what a sampled model also does (`SHAPES`): text glued to `<tool_call>`, whitespace-only
content, compact or nested or non-ASCII arguments, literal markers in its text, an unclosed
think block, calls inside the think block, text after the calls, and any of them cut by
`max_tokens` at any token. The ids are built piece by piece: text through `encode_ordinary`
(a marker written in the text is its added-token id, as the model samples it), or, for the
`chars` shape, a marker spelled in ordinary tokens (`<` + `tool_call>`), which every server's
string rules still read as the marker.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from specregen.models import textgen
from specregen.models.corpus import Drawn, FidelityCorpus, RealCase
from specregen.models.qwen3.format import STRIPS_CONTENT_BESIDE_CALLS
from specregen.models.qwen3.servers import RequestError
from specregen.models.qwen3.tokens import IM_END, THINK, THINK_END, TOOL_CALL, TOOL_CALL_END
from specregen.models.tokenizer_base import Tokenizer
from specregen.records import ProviderTraits, TraitMap

PROFILES = ("vllm-hermes", "openrouter", "sglang")

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather of a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search_web", "description": "Search the web.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                       "required": ["query"]}}},
    {"type": "function", "function": {
        "name": "create_event", "description": "Create a calendar event.",
        "parameters": {"type": "object", "properties": {
            "title": {"type": "string"}, "when": {"type": "object"},
            "attendees": {"type": "array", "items": {"type": "string"}}}}}},
    {"type": "function", "function": {
        "name": "list_files", "description": "List the files of the project.",
        "parameters": {"type": "object", "properties": {}}}},
]
CITIES = ["Paris", "Oslo", "北京", "São Paulo", "Zürich", "東京", "Kraków"]

# Answer shapes, each one way a sampled Qwen3 answer can leave (or keep) its template's layout.
# HEADLINE: the template's layout (`clean`) with one of the deviations a model really writes at
# a noticeable rate; ADVERSARIAL: deviations the counts cannot see, markers spelled in plain
# tokens, several deviations at once. Each shape may also be cut by `max_tokens` (`cut_rate`).
SHAPES: dict[str, float] = {
    "clean": 0.16,  # the template's layout; arguments in `tojson` form, non-ASCII, nested, {}
    "glued": 0.08,  # content glued to `<tool_call>` (no "\n"), or calls glued to each other
    "ws_content": 0.07,  # whitespace-only content before the calls
    "compact": 0.08,  # the model's own arguments spacing: `{"a":1}`
    "literal": 0.08,  # literal `<tool_call>` / `</think>` / `<think>` in reasoning or content
    "unclosed": 0.06,  # a think block the model never closes
    "in_think": 0.07,  # calls inside the think block
    "after": 0.07,  # text after the calls
    "no_think_nl": 0.05,  # `</think>` straight into the content (no "\n\n")
    "cut": 0.14,  # the template's layout cut by `max_tokens` anywhere (incl. inside args)
    "spaced": 0.06,  # separators other than "\n" (" ", "\n\n", "\t") around content and calls
    "chars": 0.04,  # a marker spelled in plain tokens (`<` + `tool_call>`)
    "compact_call": 0.03,  # the call object itself compact: `{"name":"f","arguments":{}}`
    "combined": 0.04,  # several deviations at once
}
ADVERSARIAL = frozenset({"spaced", "chars", "compact_call", "combined"})


# The groups in which an `ok` with wrong ids fails the bench (the others hold what the
# server's answer does not carry: reported, not gated).
GATED_GROUPS = ("headline",)


def probed_traits(profile: str, stream: bool) -> ProviderTraits:
    """What the endpoint probe learns of each profile: every one counts `<|im_end|>` in usage;
    only SGLang's plain answers strip the content beside calls."""
    return ProviderTraits(counts_stop_token=True, family=TraitMap(
        {STRIPS_CONTENT_BESIDE_CALLS: profile == "sglang" and not stream}))


def group(shape: str, profile: str | None = None, stream: bool | None = None) -> str:
    """`headline`, `adversarial`, or `erased`: a deviation the server's answer does not carry
    at all, which no reader can see without the server's ids -- the model's own arguments
    spacing, re-dumped by every path but vLLM's stream (hermes streams the model's text), and
    text glued to `<tool_call>`, which SGLang strips when not streaming. Reconstruction
    assumes the template's form there and says so (`arguments_canonical_assumed`)."""
    base = shape.removesuffix("+cut")
    if base in ADVERSARIAL:
        return "adversarial"
    if base == "compact" and (profile == "sglang" or not stream):
        return "erased"
    if base == "glued" and profile == "sglang" and not stream:
        return "erased"
    return "headline"


# ---------------------------------------------------------------------------------------------
# What the model writes


@dataclass(frozen=True, slots=True)
class Piece:
    """Model-written text; `spelled`: markers in it are plain tokens, not their ids."""

    text: str
    spelled: bool = False


def piece_ids(tok: Tokenizer, piece: Piece) -> list[int]:
    if not piece.spelled:
        return tok.encode_ordinary(piece.text)
    # Cut before every "<": no chunk then holds a whole marker, so none becomes its id.
    ids: list[int] = []
    start = 0
    for i, ch in enumerate(piece.text):
        if ch == "<" and i > start:
            ids.extend(tok.encode_ordinary(piece.text[start:i]))
            start = i
    ids.extend(tok.encode_ordinary(piece.text[start:]))
    return ids


def answer_ids(tok: Tokenizer, pieces: Sequence[Piece], stop: bool = True) -> list[int]:
    ids: list[int] = []
    for p in pieces:
        ids.extend(piece_ids(tok, p))
    if stop:
        ids.append(tok.token_id(IM_END))
    return ids


def _arguments_value(rng: random.Random, name: str) -> Any:
    city = rng.choice(CITIES)
    if name == "get_weather":
        return {"city": city} if rng.random() < 0.6 else {"city": city, "days": rng.randint(1, 9)}
    if name == "search_web":
        return {"query": rng.choice([f"news {city}", "a \"quoted\" term", "天气 预报",
                                     "path\\to\\file", "emoji 🎉 party"])}
    if name == "create_event":
        return {"title": rng.choice(["Lunch", "Réunion", "会议"]),
                "when": {"date": "2026-12-01", "time": {"h": 12, "m": 30}},
                "attendees": rng.sample(["ann", "bo", "李"], rng.randint(0, 3))}
    return {}


def _arguments_text(rng: random.Random, value: Any, compact: bool) -> str:
    if compact:
        return json.dumps(value, ensure_ascii=rng.random() < 0.2, separators=(",", ":"))
    return json.dumps(value, ensure_ascii=False)


def _call_text(rng: random.Random, name: str, compact: bool, compact_call: bool) -> str:
    """A call block's body as the model writes it ("\n" JSON "\n" in the template's form;
    `compact`: its own arguments spacing; `compact_call`: the call object compact too)."""
    args = _arguments_text(rng, _arguments_value(rng, name), compact or compact_call)
    if compact_call:
        body = f'{{"name":"{name}","arguments":{args}}}'
    else:
        body = f'{{"name": "{name}", "arguments": {args}}}'
    return "\n" + body + "\n"


LITERALS = [f"Wrap a call in {TOOL_CALL} tags.", f"The tag {THINK_END} closes a thought.",
            f"Write {THINK} first.", f"`{TOOL_CALL}` and `{TOOL_CALL_END}` delimit calls.",
            f"Use {TOOL_CALL}{{\"name\": \"x\"}} in code."]


def _prose(rng: random.Random, n: int, literal: bool) -> str:
    text = textgen.prose(rng, n)
    if rng.random() < 0.3:
        text += " 我们需要先检查输入数据的格式。"
    if literal:
        words = text.split(" ")
        at = rng.randint(0, len(words))
        words.insert(at, rng.choice(LITERALS))
        text = " ".join(words)
    return text


def write_answer(rng: random.Random, shape: str, thinking: bool, tool_names: Sequence[str]
                 ) -> list[Piece]:
    """The pieces of one answer of `shape` (the caller cuts it for `cut`)."""
    deviations = {shape}
    if shape == "combined":
        deviations = set(rng.sample(["glued", "ws_content", "compact", "literal", "in_think",
                                     "compact_call",
                                     "after", "no_think_nl", "spaced", "unclosed"], 3))
    n_calls = 0
    if tool_names and (rng.random() < 0.7 or deviations & {"glued", "ws_content", "in_think",
                                                           "after"}):
        n_calls = rng.choice([1, 1, 1, 2, 2, 3])
    names = [rng.choice(tool_names) for _ in range(n_calls)]
    literal = "literal" in deviations
    calls = [_call_text(rng, n, "compact" in deviations and rng.random() < 0.8,
                        "compact_call" in deviations and rng.random() < 0.7) for n in names]
    sep = lambda: rng.choice([" ", "\n\n", "\t", "  \n"])  # noqa: E731

    # Content before the calls, and its separators.
    if "ws_content" in deviations and calls:
        content = ""
        lead_ws = rng.choice(["\n\n\n", "\n", " \n", "\n\n  ", ""])
    else:
        content = "" if calls and rng.random() < 0.4 else textgen.answer(rng, rng.randint(3, 40))
        if literal and (not thinking or rng.random() < 0.5):
            content = _prose(rng, rng.randint(3, 20), True)
        lead_ws = ""
    if calls:
        if "glued" in deviations and content:
            to_call = ""
        elif "spaced" in deviations:
            to_call = sep()
        else:
            to_call = "\n" if content else ""
        between = [("" if "glued" in deviations and rng.random() < 0.5 else
                    sep() if "spaced" in deviations else "\n") for _ in calls[1:]]
    else:
        to_call, between = "", []

    pieces: list[Piece] = []
    call_pieces: list[Piece] = []
    for k, body in enumerate(calls):
        if k:
            call_pieces.append(Piece(between[k - 1]))
        call_pieces.append(Piece(TOOL_CALL + body + TOOL_CALL_END))
    if "chars" in deviations and call_pieces:
        k = rng.randrange(len(call_pieces))
        call_pieces[k] = Piece(call_pieces[k].text, spelled=True)

    in_think = "in_think" in deviations and calls and thinking
    if thinking:
        # The template's own empty block (`<think>\n\n</think>\n\n`, what it renders when
        # thinking is off) is a clean answer too.
        empty = shape == "clean" and rng.random() < 0.1
        reasoning = "" if empty else _prose(rng, rng.randint(5, 60),
                                            literal and rng.random() < 0.6)
        if "chars" in deviations and not calls:
            reasoning += f" I could write {THINK_END} here."
        pieces.append(Piece(THINK + "\n" + reasoning + "\n", spelled="chars" in deviations
                            and not calls and rng.random() < 0.5))
        if in_think:
            pieces.extend(call_pieces)
            pieces.append(Piece("\n"))
            call_pieces = []
        if "unclosed" in deviations:
            # Never closed: what follows (if anything) is still inside the block.
            if call_pieces and rng.random() < 0.5:
                pieces.append(Piece(content + to_call))
                pieces.extend(call_pieces)
            return pieces
        after_think = "" if "no_think_nl" in deviations else (
            sep() if "spaced" in deviations else "\n\n")
        pieces.append(Piece(THINK_END + after_think))
    if lead_ws:
        pieces.append(Piece(lead_ws))
    if content:
        pieces.append(Piece(content + to_call))
    pieces.extend(call_pieces)
    if "after" in deviations:
        pieces.append(Piece(rng.choice(["\nDone.", "\n\nI called the tool.", "\n", " ok",
                                        f"\n{TOOL_CALL_END}"])))
    return pieces


# ---------------------------------------------------------------------------------------------
# The request


def random_request(rng: random.Random, index: int) -> dict[str, Any]:
    request: dict[str, Any] = {"model": "Qwen/Qwen3-8B", "return_token_ids": True}
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.4:
        messages.append({"role": "system", "content": "You are a helpful assistant."})
    if rng.random() < 0.8:
        request["tools"] = rng.sample(TOOLS, rng.randint(1, len(TOOLS)))
    question = rng.choice(["What is the weather in Oslo?", "Plan lunch with Ann.",
                           "你好，请介绍一下你自己。", "Print <tool_call> literally."])
    messages.append({"role": "user", "content": f"{question} (#{index})"})
    if request.get("tools") and rng.random() < 0.25:
        # A tool loop: the answer comes after a call and its result (the template keeps the
        # earlier turn's think block; the earlier vLLM restatement, OpenRouter's upstream,
        # then streams everything as content; vLLM 0.32 stops its prompt check at the turn).
        name = request["tools"][0]["function"]["name"]
        call = {"id": f"call_{index}", "type": "function",
                "function": {"name": name, "arguments": json.dumps(
                    _arguments_value(rng, name), ensure_ascii=False)}}
        turn: dict[str, Any] = {"role": "assistant", "content": rng.choice(["", "Checking."]),
                                "tool_calls": [call]}
        if rng.random() < 0.7:
            turn["reasoning"] = turn["reasoning_content"] = "I should call the tool."
        messages += [turn, {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}]
    request["messages"] = messages
    return request


def with_thinking(request: dict[str, Any], profile: str, thinking: bool | None
                  ) -> dict[str, Any]:
    """The request with the thinking switch in the profile's dialect (None: left default)."""
    if thinking is None:
        return request
    if profile == "openrouter":
        return {**request, "reasoning": {"enabled": thinking}}
    return {**request, "chat_template_kwargs": {"enable_thinking": thinking}}


# What Qwen3's template expects it to write (the base of the real server's yield): its layout,
# with 0-3 calls and reasoning empty or not. Not `literal`: a marker's own id in prose is what
# the template reserves for structure (the parsers take it for one; K2.5's corpus counts it
# the same way).
TEMPLATE_SHAPES = frozenset({"clean"})


def draw(tok: Tokenizer, n: int, seed: int = 0, shapes: Sequence[str] | None = None
         ) -> Iterator[Drawn]:
    """`n` random answers as ids, and their requests (the thinking switch not yet in a
    dialect)."""
    rng = random.Random(seed)
    names = list(shapes or SHAPES)
    weights = [SHAPES[s] for s in names]
    for i in range(n):
        request = random_request(rng, i)
        shape = rng.choices(names, weights)[0]
        thinking = rng.choice([True, True, False, None])
        tool_names = [t["function"]["name"] for t in request.get("tools") or ()]
        pieces = write_answer(rng, "clean" if shape == "cut" else shape,
                              thinking is not False, tool_names)
        ids = answer_ids(tok, pieces)
        label, max_tokens = shape, None
        if shape == "cut" or rng.random() < 0.08:
            # Anywhere: inside the reasoning, a marker's neighbourhood, the arguments, a
            # multi-byte character, or just before the stop token.
            max_tokens = rng.randint(1, len(ids) - 1)
            label = shape if shape == "cut" else shape + "+cut"
        yield Drawn(i, label, request, tuple(ids), max_tokens, label in TEMPLATE_SHAPES,
                    thinking=thinking)


def request_for(drawn: Drawn, profile: str) -> dict[str, Any]:
    """The request a client sends `profile` for `drawn`."""
    request = drawn.request
    if drawn.max_tokens is not None:
        request = {**request, "max_tokens": drawn.max_tokens}
    return with_thinking(request, profile, drawn.thinking)


def real_case(tok: Tokenizer, drawn: Drawn, ids: Sequence[int], seed: int, profile: str
              ) -> RealCase:
    """With the thinking switch in vLLM's dialect (`chat_template_kwargs.enable_thinking`)."""
    sent = with_thinking(drawn.request, profile, drawn.thinking)
    sent = {k: v for k, v in sent.items() if k != "return_token_ids"}
    if drawn.max_tokens is not None:
        sent["max_tokens"] = drawn.max_tokens
    groups = (group(drawn.shape, profile, False), group(drawn.shape, profile, True))
    return RealCase(f"qwen3-{seed}-{drawn.index}", drawn.shape, groups,
                    drawn.template_shaped, sent, tuple(ids), drawn.max_tokens)


def make_corpus() -> FidelityCorpus:
    """The descriptor's `make_corpus` (`registry.fidelity_corpus`)."""
    return FidelityCorpus(
        profiles=PROFILES, shapes=tuple(SHAPES), gated_groups=GATED_GROUPS,
        refusals=(RequestError,), group=group, probed_traits=probed_traits, draw=draw,
        request_for=request_for, real_case=real_case)
