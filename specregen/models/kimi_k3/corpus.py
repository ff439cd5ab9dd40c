"""Kimi K3's fidelity corpus: answers written the way K3 can write them, as the model's true ids,
with their requests. The harness (`emulator/fidelity.py`, bench/fidelity_corpus.py --format
kimi-k3) serves each through the restated vLLM 0.32 kimi_k3 parsers (the served side's
`answer_ids`) and the emulator's response framing, as a client receives them, and rebuilds it;
the real-vLLM harness scripts the ids into a real server (`real_case`). Not in the reconstruct
fingerprint: reconstruction never imports it.

Why not `served.model_ids`: it writes the encoder's layout only. The shapes here are what a
sampled model also does (`SHAPES`): empty channels, whitespace-only content, literal marker
strings in its text, text outside the channels the parsers drop, a think channel never
closed, a complete tag spelled in ordinary tokens, other argument spellings and indices, and
any of them cut by `max_tokens` at any token. The ids are built segment by segment, as the
encoder segments a history turn: markers as their ids, every other piece ordinary BPE (a
marker string typed in text is ordinary tokens, as the model samples it).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from specregen.models import textgen
from specregen.models.corpus import Drawn, FidelityCorpus, RealCase
from specregen.models.kimi_k3.encoding import (
    CLOSE,
    END_OF_MSG,
    OPEN,
    SEP,
    Segment,
    argument_text,
    argument_type,
    close_tag,
    marker,
    open_tag,
    text,
)
from specregen.models.kimi_k3.servers import RequestError
from specregen.models.kimi_k3.tokens import encode_segments
from specregen.models.tokenizer_base import Tokenizer
from specregen.records import ProviderTraits

MODEL = "moonshotai/kimi-k3"
PROFILES = ("vllm-k3", "openrouter")

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather of a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"},
            "metric": {"type": "boolean"}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search_web", "description": "Search the web.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"}, "_limit": {"type": "number"}},
            "required": ["query"]}}},
    {"type": "function", "function": {
        "name": "create_event", "description": "Create a calendar event.",
        "parameters": {"type": "object", "properties": {
            "title": {"type": "string"}, "when": {"type": "object"},
            "attendees": {"type": "array", "items": {"type": "string"}},
            "note": {"type": ["string", "null"]}}}}},
    {"type": "function", "function": {
        "name": "run_code", "description": "Run a snippet.",
        "parameters": {"type": "object", "properties": {
            "code": {"type": "string"}, "$timeout": {"type": "number"}}}}},
    {"type": "function", "function": {
        "name": "list_files", "description": "List the files of the project.",
        "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "ping"}},  # no description, no parameters
]
CITIES = ["Paris", "Oslo", "北京", "São Paulo", "Zürich", "東京", "Kraków"]
STRINGS = ['a "quoted" term', "fish & chips", "a < b > c", "天气 预报", "path\\to\\file",
           "emoji 🎉 party", "line one\nline two", "", " padded ", "<tag>", "_private",
           ".hidden", "Alice!"]
CODE = ["print(1)", "def f(x):\n    return x < 3\n", "for i in range(3): print(i)",
        "if a && b { return }", "x = {\"k\": [1, 2]}"]

# Answer shapes. HEADLINE: the encoder's layout (`clean`) with one of the deviations a model
# writes at a noticeable rate; ADVERSARIAL: deviations the counts cannot see, tags spelled in
# plain tokens, several at once; ERASED: what the server's answer does not carry at all (the
# model's own spelling of non-string argument values, its call indices), which no reader can
# see without the server's ids. Any shape may also be cut by `max_tokens`.
SHAPES: dict[str, float] = {
    "clean": 0.22,  # the layout; 0-3 calls, typed arguments, empty content beside calls
    "empty_think": 0.06,  # an empty think channel
    "ws_content": 0.05,  # whitespace-only content before the calls
    "literal": 0.08,  # marker strings (`<|open|>`, `<|sep|>`, ...) typed in the text
    "after": 0.06,  # text outside the channels (after the response, between calls, ...)
    "gap": 0.03,  # text between the think channel's close and the response's opener
    "unclosed": 0.05,  # a think channel never closed (the response opened inside it)
    "typed_string": 0.04,  # a string where the schema wants a number ("3")
    "cut": 0.14,  # the layout cut by `max_tokens` anywhere (inside a tag too)
    "chars": 0.04,  # a complete tag spelled in plain tokens (`<|close|>think<|sep|>` typed)
    "combined": 0.04,  # several deviations at once
    "compact": 0.06,  # non-string values spelled compactly (`{"a":1}`)
    "index": 0.03,  # call indices other than 1..n
    "bad_type": 0.03,  # a typed argument whose value is not JSON (the type comes back lost)
}
ADVERSARIAL = frozenset({"chars", "combined"})
ERASED = frozenset({"compact", "index", "bad_type"})


# The groups in which an `ok` with wrong ids fails the bench (the others hold what the
# server's answer does not carry: reported, not gated).
GATED_GROUPS = ("headline", "adversarial")


def probed_traits(profile: str, stream: bool) -> ProviderTraits:
    """What the endpoint probe learns of each profile: both count `<|end_of_msg|>` in usage."""
    return ProviderTraits(counts_stop_token=True)


def group(shape: str, profile: str | None = None, stream: bool | None = None) -> str:
    """`headline`, `adversarial`, or `erased`: a deviation the server's answer does not carry
    at all -- non-string argument spellings, call indices and the type of a typed argument the
    parser could not load (unless the schema disagrees: then it is flagged) on every path, and
    text after the
    response channel of an instant answer (`after-instant`), which the plain parsers, finding
    no response opener in the text, delete the markers around and join to the content (the
    stream drops it: visible in the count), and, streamed, text between the think channel's
    close and the response's opener (`gap`), which the stream sends as content (plain drops
    it). Reconstruction flags a streamed content that starts with whitespace for that."""
    base = shape.removesuffix("+cut")
    if base in ADVERSARIAL:
        return "adversarial"
    if base in ERASED or (base == "after-instant" and not stream) or (base == "gap" and stream):
        return "erased"
    return "headline"


# ---------------------------------------------------------------------------------------------
# What the model writes


def _value(rng: random.Random, spec: Any) -> Any:
    kind = spec.get("type") if isinstance(spec, dict) else None
    if isinstance(kind, list):
        kind = rng.choice(kind)
    if kind == "integer":
        return rng.randint(0, 30)
    if kind == "number":
        return rng.choice([1, 2.5, 0.1, 1e-07, 100, -3])
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "object":
        return {"date": "2026-12-01", "time": {"h": 12, "m": 30}, "tags": ["a", "b"]}
    if kind == "array":
        return rng.sample(["ann", "bo", "李", 'x"y'], rng.randint(0, 3))
    return rng.choice(STRINGS + [rng.choice(CITIES)] * 4)


def arguments_for(rng: random.Random, tool: dict[str, Any]) -> dict[str, Any]:
    params = tool["function"].get("parameters") or {}
    props = params.get("properties") or {}
    out: dict[str, Any] = {}
    for key, spec in props.items():
        if key in (params.get("required") or ()) or rng.random() < 0.6:
            out[key] = CODE[rng.randrange(len(CODE))] if key == "code" else _value(rng, spec)
    return out


def _prose(rng: random.Random, n: int) -> str:
    text_value = textgen.prose(rng, n)
    if rng.random() < 0.3:
        text_value += " 我们需要先检查输入数据的格式。"
    return text_value


LITERALS = [f"The {OPEN} token opens a tag.", f"Write {SEP} after the name.",
            f"`{END_OF_MSG}` ends a message.", f"Use {CLOSE} to close.",
            f"Markers: {OPEN}{CLOSE}{SEP}.", "<|open", "a <| b |> c"]


def _literal(rng: random.Random, value: str) -> str:
    words = value.split(" ")
    words.insert(rng.randint(0, len(words)), rng.choice(LITERALS))
    return " ".join(words)


@dataclass
class Written:
    """An answer as the model writes it: its segments (no stop id), and whether it fits the
    encoder's layout (the real server's yield base)."""

    segments: list[Segment]
    template_shaped: bool


def write_answer(rng: random.Random, shape: str, thinking: bool,
                 tools: Sequence[dict[str, Any]]) -> Written:
    deviations = {shape}
    if shape == "combined":
        # (Not the erased deviations: no answer carries them, combined or not.)
        # (Nor text after the response of an instant answer: erased on the plain path.)
        pool = ["empty_think", "ws_content", "literal", "unclosed", "typed_string", "chars"]
        deviations = set(rng.sample(pool + ["after"] * thinking, 3))
    wants_calls = bool(tools) and (rng.random() < 0.6 or deviations & {
        "ws_content", "typed_string", "bad_type", "compact", "index"})
    n_calls = rng.choice([1, 1, 1, 2, 2, 3]) if wants_calls else 0
    picked = [rng.choice(list(tools)) for _ in range(n_calls)]
    literal = "literal" in deviations

    reasoning = "" if "empty_think" in deviations else _prose(rng, rng.randint(5, 60))
    if literal and rng.random() < 0.5:
        reasoning = _literal(rng, reasoning)
    empty = n_calls and rng.random() < 0.45  # calls straight after the reasoning
    content = "" if empty else textgen.answer(rng, rng.randint(3, 40))
    if literal and (rng.random() < 0.6 or not reasoning):
        content = _literal(rng, content)
    if "ws_content" in deviations and n_calls:
        content = rng.choice(["\n", "\n\n", " ", "  \n"])

    calls = []
    for tool in picked:
        args = arguments_for(rng, tool)
        if literal and rng.random() < 0.3:
            strings = [k for k, v in args.items() if isinstance(v, str)]
            if strings:
                args[strings[0]] = _literal(rng, args[strings[0]])
        calls.append((tool["function"]["name"], args))

    segs: list[Segment] = []
    if thinking:
        segs += text(reasoning)
        if "chars" in deviations and rng.random() < 0.5:
            # The think channel's close typed as plain text, then the real one.
            segs += text(" I close it with " + CLOSE + "think" + SEP + " now.")
        if "unclosed" in deviations:
            pass  # the response opens inside the think channel
        else:
            segs += close_tag("think")
        if "gap" in deviations:
            segs += text(rng.choice(["\n", " ", "Answer:", "\n\n"]))
        segs += open_tag("response")
    segs += text(content)
    if "chars" in deviations and not thinking:
        segs += text(" (" + CLOSE + "response" + SEP + ")")
    segs += close_tag("response")
    if "after" in deviations and (not calls or rng.random() < 0.5):
        segs += text(rng.choice(["\n", "\nDone.", " ", "\n\n"]))
    if calls:
        segs += open_tag("tools")
        for k, (name, args) in enumerate(calls, start=1):
            if k > 1 and "after" in deviations and rng.random() < 0.5:
                segs += text("\n")
            index = k - 1 if "index" in deviations else k
            segs += open_tag("call", (("tool", name), ("index", index)))
            for key, value in args.items():
                kind, body = argument_type(value), argument_text(value)
                if "compact" in deviations and not isinstance(value, str) and isinstance(
                        value, dict | list):
                    body = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
                if "typed_string" in deviations and isinstance(value, int | float) and \
                        not isinstance(value, bool):
                    kind = "string"  # the number written as a string value
                if "bad_type" in deviations and isinstance(value, str):
                    kind = "number"  # not JSON: the parser falls back to the raw text
                segs += open_tag("argument", (("key", key), ("type", kind)))
                segs += text(body) + close_tag("argument")
            segs += close_tag("call")
        segs += close_tag("tools")
        if "after" in deviations and rng.random() < 0.5:
            segs += text("\n")
    segs += close_tag("message")
    shaped = deviations <= {"clean", "cut"}
    return Written(segs, shaped)


def answer_ids(tok: Tokenizer, written: Written, stop: bool = True) -> list[int]:
    ids = encode_segments(tok, written.segments)
    return ids + encode_segments(tok, marker(END_OF_MSG)) if stop else ids


# ---------------------------------------------------------------------------------------------
# The request


def _history(rng: random.Random, tools: list[dict[str, Any]], thinking: bool
             ) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "First, look this up."}]
    calls = []
    for _ in range(rng.choice([1, 1, 2])):
        tool = rng.choice(tools)
        args = arguments_for(rng, tool)
        calls.append({"id": f"chatcmpl-tool-{rng.getrandbits(64):016x}", "type": "function",
                      "function": {"name": tool["function"]["name"],
                                   "arguments": json.dumps(args, ensure_ascii=False,
                                                           separators=rng.choice(
                                                               [(",", ":"), (", ", ": ")]))}})
    turn: dict[str, Any] = {"role": "assistant", "content": rng.choice(["", None, "Ok."]),
                            "tool_calls": calls}
    if thinking and rng.random() < 0.8:
        turn["reasoning"] = rng.choice(["I will call the tool.", "Checking.", ""])
    messages.append(turn)
    results = [{"role": "tool", "tool_call_id": c["id"], "content": rng.choice(
        ["sunny", '{"ok": true}', [{"type": "text", "text": "part 1"},
                                   {"type": "text", "text": "part 2"}]])} for c in calls]
    if len(results) > 1 and rng.random() < 0.3:
        results.reverse()  # out of order: the renderer sorts them back
    messages += results
    return messages


def random_request(rng: random.Random, index: int, thinking: bool) -> dict[str, Any]:
    request: dict[str, Any] = {"model": MODEL, "return_token_ids": True}
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.4:
        messages.append({"role": "system", "content": "You are a helpful assistant."})
    if rng.random() < 0.8:
        request["tools"] = rng.sample(TOOLS, rng.randint(1, 4))
    if request.get("tools") and rng.random() < 0.25:
        messages += _history(rng, request["tools"], thinking)
    question = rng.choice(["What is the weather in Oslo?", "Plan lunch with Ann.",
                           "你好，请介绍一下你自己。", "Print <|open|> literally.",
                           "Run the snippet for me."])
    content: Any = f"{question} (#{index})"
    if rng.random() < 0.1:
        content = [{"type": "text", "text": question}, {"type": "text", "text": f"#{index}"}]
    messages.append({"role": "user", "content": content})
    request["messages"] = messages
    if request.get("tools") and rng.random() < 0.05:
        request["tool_choice"] = "none"
    return request


def with_thinking(request: dict[str, Any], profile: str, thinking: bool | None,
                  effort: str | None = None) -> dict[str, Any]:
    """The request with the thinking switch in the profile's dialect (None: left default)."""
    if thinking is None and effort is None:
        return request
    if profile == "openrouter":
        reasoning: dict[str, Any] = {}
        if thinking is not None:
            reasoning["enabled"] = thinking
        if effort is not None:
            reasoning["effort"] = effort
        return {**request, "reasoning": reasoning}
    out = dict(request)
    if thinking is not None:
        out["chat_template_kwargs"] = {"thinking": thinking}
    if effort is not None:
        out["reasoning_effort"] = effort
    return out


def draw(tok: Tokenizer, n: int, seed: int = 0, shapes: Sequence[str] | None = None
         ) -> Iterator[Drawn]:
    """`n` random answers and their requests (the thinking switch not yet in a dialect)."""
    rng = random.Random(seed)
    names = list(shapes or SHAPES)
    weights = [SHAPES[s] for s in names]
    for i in range(n):
        thinking = rng.choice([True, True, False, None])
        effort = rng.choice([None, None, None, "low", "high"]) if thinking is not False else None
        think = thinking is not False
        request = random_request(rng, i, think)
        shape = rng.choices(names, weights)[0]
        written = write_answer(rng, "clean" if shape == "cut" else shape, think,
                               request.get("tools") or ())
        ids = answer_ids(tok, written)
        label, max_tokens = shape, None
        if shape == "after" and not think:
            label = "after-instant"
        elif shape == "gap" and not think:
            label = "clean"  # no gap without a think channel
        if shape == "cut" or rng.random() < 0.08:
            max_tokens = rng.randint(1, len(ids) - 1)
            label = label if shape == "cut" else label + "+cut"
        yield Drawn(i, label, request, tuple(ids), max_tokens, written.template_shaped,
                    thinking=thinking, effort=effort)


def request_for(drawn: Drawn, profile: str) -> dict[str, Any]:
    """The request a client sends `profile` for `drawn`."""
    request = with_thinking(drawn.request, profile, drawn.thinking, drawn.effort)
    if drawn.max_tokens is not None:
        request = {**request, "max_tokens": drawn.max_tokens}
    return request


def real_case(tok: Tokenizer, drawn: Drawn, ids: Sequence[int], seed: int, profile: str
              ) -> RealCase:
    """With the thinking switch in vLLM's dialect (`chat_template_kwargs.thinking`,
    `reasoning_effort`)."""
    sent = with_thinking(drawn.request, profile, drawn.thinking, drawn.effort)
    sent = {k: v for k, v in sent.items() if k != "return_token_ids"}
    if drawn.max_tokens is not None:
        sent["max_tokens"] = drawn.max_tokens
    groups = (group(drawn.shape, profile, False), group(drawn.shape, profile, True))
    return RealCase(f"k3-{seed}-{drawn.index}", drawn.shape, groups, drawn.template_shaped,
                    sent, tuple(ids), drawn.max_tokens)


def make_corpus() -> FidelityCorpus:
    """The descriptor's `make_corpus` (`registry.fidelity_corpus`)."""
    return FidelityCorpus(
        profiles=PROFILES, shapes=tuple(SHAPES), gated_groups=GATED_GROUPS,
        refusals=(RequestError,), group=group, probed_traits=probed_traits, draw=draw,
        request_for=request_for, real_case=real_case)
