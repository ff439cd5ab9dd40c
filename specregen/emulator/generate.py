"""The emulated model: one deterministic Kimi K2.5 completion per request, as token ids.

A completion is built segment by segment, the way the model writes it (SPEC 7.2):
`R </think> C [<|tool_calls_section_begin|> (<|tool_call_begin|> ID <|tool_call_argument_begin|>
ARGS <|tool_call_end|>)+ <|tool_calls_section_end|>] <|im_end|>`. Text segments are encoded with
special tokens disallowed and markers are inserted by name, so the ids are exactly what a faithful
reconstruction rebuilds -- unless non-canonical splits are injected, which is what sampling does.

The rng is seeded by (config seed, request digest): a retry of the same request gets the same
completion. Fields that only change how the answer is delivered (`stream`, `max_tokens`, ...)
are left out of the digest, so a truncated answer is a prefix of the full one, as with a seeded
model.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from specregen.emulator import textgen
from specregen.emulator.config import EmulatorConfig
from specregen.models.kimi_k25 import (
    ARG_BEGIN,
    CALL_BEGIN,
    CALL_END,
    IM_END,
    SECTION_BEGIN,
    SECTION_END,
    THINK_END,
    KimiK25,
    count_history_tool_calls,
)
from specregen.models.tokenizer import Tokenizer, TokenizerError, read_tiktoken_ranks
from specregen.normalize import thinking_from_request

SegmentKind = Literal[
    "reasoning",
    "section_text",  # whitespace the model wrote between a tool section's markers
    "after_section",  # text after `<|tool_calls_section_end|>`
    "think_end",
    "content",
    "section_begin",
    "call_begin",
    "call_id",
    "arg_begin",
    "arguments",
    "call_end",
    "section_end",
    "im_end",
]
TEXT_KINDS = frozenset({"reasoning", "content", "call_id", "arguments", "section_text",
                        "after_section"})

# Request fields that change how an answer is delivered, not what the model writes.
DELIVERY_FIELDS = frozenset(
    {"stream", "stream_options", "return_token_ids", "max_tokens", "max_completion_tokens", "usage"}
)
# The subset that `distinct_requests` ignores: a streamed and a plain copy are one request.
TRANSPORT_FIELDS = frozenset({"stream", "stream_options"})

NO_CONTENT = "(no content)"


class RequestError(ValueError):
    """The request cannot be answered; the message is safe to return to the client."""


@dataclass(frozen=True, slots=True)
class RequestKeys:
    generation: bytes  # sha256 of the canonical body without the delivery fields
    distinct: bytes  # sha256 of the canonical body without stream / stream_options


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class PlannedCall:
    """A tool call as the model writes it: `id` and `arguments` verbatim, whitespace included."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Segment:
    kind: SegmentKind
    text: str  # a marker segment holds the marker's name, which is also how it decodes
    ids: tuple[int, ...]
    call: int = -1  # the tool call a section segment belongs to


@dataclass(frozen=True, slots=True)
class Generation:
    """One completion: the true ids and the segments they are made of."""

    prompt_ids: tuple[int, ...]
    thinking: bool
    segments: tuple[Segment, ...]
    ids: tuple[int, ...]
    calls: tuple[PlannedCall, ...]
    history_tool_calls: int


@dataclass(frozen=True, slots=True)
class CompletionView:
    """What the model had written when it stopped (at `<|im_end|>` or at `max_tokens`)."""

    ids: tuple[int, ...]
    thinking: bool
    reasoning: str | None  # None in instant mode
    think_closed: bool
    content: str
    calls: tuple[PlannedCall, ...]  # the calls completed before the stop
    section_text: str  # the raw tool section from its begin marker on, "" when none
    made_calls: bool  # the model opened a tool section
    truncated: bool
    reasoning_tokens: int


# ---------------------------------------------------------------------------------------------
# Request digests


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def request_keys(body: dict[str, Any]) -> RequestKeys:
    model_part = {k: v for k, v in body.items() if k not in DELIVERY_FIELDS}
    generation = hashlib.sha256(canonical_json(model_part).encode()).digest()
    delivery = {k: body[k] for k in DELIVERY_FIELDS - TRANSPORT_FIELDS if k in body}
    if not delivery:
        return RequestKeys(generation, generation)
    distinct = hashlib.sha256(generation + canonical_json(delivery).encode()).digest()
    return RequestKeys(generation, distinct)


def request_seed(seed: int, key: bytes) -> int:
    return (seed << 128) ^ int.from_bytes(key[:16], "big")


# ---------------------------------------------------------------------------------------------
# Declared tools


_TOOL_NAME = re.compile(r"[A-Za-z_][\w.\-]*")
_WORD = re.compile(r"[a-z0-9]+")
_CAMEL = re.compile(r"([a-z0-9])([A-Z])")
# Words too common to say a user asked for a tool ("... the current ... of a given ...");
# words shorter than 4 letters never count.
_STOPWORDS = frozenset(
    {
        "with", "from", "that", "this", "into", "your", "have", "will", "what", "when", "which",
        "about", "there", "their", "them", "they", "then", "than", "some", "such", "given",
        "based", "specified", "specific", "provided", "using", "used", "user", "information",
        "details", "data", "item", "items", "value", "values", "list", "type", "name", "names",
        "number", "amount", "current", "make", "find", "check",
    }
)


def declared_tools(request: dict[str, Any]) -> list[ToolSpec]:
    """Tools from `tools`, else JSON function objects in a system prompt (glaive style)."""
    tools = request.get("tools")
    if tools:
        specs = []
        for i, tool in enumerate(tools):
            fn = tool.get("function") if isinstance(tool, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise RequestError(f"tools[{i}] has no function.name")
            specs.append(_spec(fn))
        return specs
    specs = []
    for message in request["messages"]:
        if message.get("role") == "system" and isinstance(message.get("content"), str):
            specs.extend(tools_in_text(message["content"]))
    return specs


def tools_in_text(text: str) -> list[ToolSpec]:
    """The JSON objects with a function `name` in a text, e.g. glaive's `SYSTEM: ... {...}`."""
    decoder = json.JSONDecoder()
    specs: list[ToolSpec] = []
    pos = text.find("{")
    while pos != -1:
        try:
            obj, end = decoder.raw_decode(text, pos)
        except ValueError:
            pos = text.find("{", pos + 1)
            continue
        if isinstance(obj, dict) and isinstance(obj.get("function"), dict):
            obj = obj["function"]
        if isinstance(obj, dict) and isinstance(obj.get("name"), str):
            if _TOOL_NAME.fullmatch(obj["name"]):
                specs.append(_spec(obj))
            pos = text.find("{", end)
        else:
            pos = text.find("{", pos + 1)
    return specs


def _spec(fn: dict[str, Any]) -> ToolSpec:
    params = fn.get("parameters")
    description = fn.get("description")
    return ToolSpec(
        name=fn["name"],
        description=description if isinstance(description, str) else "",
        parameters=params if isinstance(params, dict) else None,
    )


def _keywords(tool: ToolSpec) -> set[str]:
    text = _CAMEL.sub(r"\1 \2", tool.name) + " " + tool.description
    return {w for w in _WORD.findall(text.lower().replace("_", " ")) if len(w) >= 4
            and w not in _STOPWORDS}


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text") or "" for p in content
                        if isinstance(p, dict) and p.get("type") == "text")
    return ""


# ---------------------------------------------------------------------------------------------
# Non-canonical BPE splits


class BpeSplitter:
    """Splits a token into two ranks whose bytes concatenate to it (same text, other ids)."""

    def __init__(self, ranks: dict[bytes, int]) -> None:
        self._ranks = ranks
        self._bytes: dict[int, bytes] = {rank: token for token, rank in ranks.items()}
        self._pairs: dict[int, tuple[int, int] | None] = {}

    @classmethod
    def for_tokenizer(cls, tok: Tokenizer) -> BpeSplitter:
        path = Path(tok.source) / "tiktoken.model"
        if not path.is_file():
            raise TokenizerError(
                f"non-canonical splits need the tokenizer's tiktoken ranks, and tokenizer "
                f"{tok.name!r} has no tiktoken.model in {tok.source!r}"
            )
        return cls(read_tiktoken_ranks(path))

    def split(self, token_id: int) -> tuple[int, int] | None:
        if token_id in self._pairs:
            return self._pairs[token_id]
        pair = None
        token = self._bytes.get(token_id, b"")
        # From the middle outwards: sampled splits are rarely a lone first or last byte.
        middle = len(token) // 2
        for offset in range(len(token)):
            i = middle + (offset + 1) // 2 * (1 if offset % 2 else -1)
            if not 0 < i < len(token):
                continue
            left, right = self._ranks.get(token[:i]), self._ranks.get(token[i:])
            if left is not None and right is not None:
                pair = (left, right)
                break
        self._pairs[token_id] = pair
        return pair

    def inject(self, ids: Sequence[int], rng: random.Random, rate: float) -> list[int]:
        """`ids` with each splittable token split at `rate`."""
        out: list[int] = []
        for token_id in ids:
            pair = self.split(token_id) if rng.random() < rate else None
            if pair is None:
                out.append(token_id)
            else:
                out.extend(pair)
        return out


# ---------------------------------------------------------------------------------------------
# The model


def generate(
    request: dict[str, Any],
    fmt: KimiK25,
    config: EmulatorConfig,
    key: bytes,
    splitter: BpeSplitter | None = None,
    server_prompt: tuple[Sequence[int], bool] | None = None,
) -> Generation:
    """The completion the emulated model writes for `request` (validated by the caller).

    `server_prompt` is the prompt ids and thinking mode a server-side renderer produced
    (emulator/serverside.py); without it the prompt is our own K2.5 renderer's.
    """
    rng = random.Random(request_seed(config.seed, key))
    # The shape knobs draw from their own stream, so with them at 0 a request gets exactly the
    # completion it got before they existed.
    shapes = random.Random(request_seed(config.seed, key) ^ 0x5EC7)
    messages = request["messages"]
    if server_prompt is not None:
        prompt_ids, thinking = list(server_prompt[0]), server_prompt[1]
    else:
        requested = thinking_from_request(request)
        thinking = True if requested is None else requested
        prompt_ids = fmt.encode_prompt(messages, request.get("tools") or None, thinking=thinking)
    tools = declared_tools(request)
    history = count_history_tool_calls(messages)

    calls = _plan_calls(rng, request, tools, history, config, shapes)
    reasoning = None
    if thinking:
        reasoning = textgen.prose(rng, _length(rng, config.reasoning_tokens_mean, config))
        reasoning = _lead(rng, config) + reasoning
    content = _content(rng, config, bool(calls))
    # Drawn unconditionally so that turning one shape on leaves the other draws as they were.
    in_think = shapes.random() < config.section_in_think_rate and thinking and bool(calls)
    after = _after_section(shapes, config) if calls else ""

    enc = fmt.tok.encode_ordinary
    marker = fmt.ids
    segments: list[Segment] = []
    if reasoning is not None:
        segments.append(Segment("reasoning", reasoning, tuple(enc(reasoning))))
        if not in_think:
            segments.append(Segment("think_end", THINK_END, (marker[THINK_END],)))
    if content and not in_think:
        segments.append(Segment("content", content, tuple(enc(content))))
    if calls:
        segments.append(Segment("section_begin", SECTION_BEGIN, (marker[SECTION_BEGIN],)))
        for i, call in enumerate(calls):
            gap = "\n" if shapes.random() < config.section_whitespace_rate else ""
            if gap:
                segments.append(Segment("section_text", gap, tuple(enc(gap)), i))
            segments += [
                Segment("call_begin", CALL_BEGIN, (marker[CALL_BEGIN],), i),
                Segment("call_id", call.id, tuple(enc(call.id)), i),
                Segment("arg_begin", ARG_BEGIN, (marker[ARG_BEGIN],), i),
                Segment("arguments", call.arguments, tuple(enc(call.arguments)), i),
                Segment("call_end", CALL_END, (marker[CALL_END],), i),
            ]
        segments.append(Segment("section_end", SECTION_END, (marker[SECTION_END],)))
        if after:
            segments.append(Segment("after_section", after, tuple(enc(after))))
    segments.append(Segment("im_end", IM_END, (marker[IM_END],)))

    if config.noncanonical_rate > 0:
        if splitter is None:
            raise ValueError("noncanonical_rate > 0 needs a BpeSplitter")
        segments = _inject_splits(segments, splitter, rng, config.noncanonical_rate)
    return Generation(
        prompt_ids=tuple(prompt_ids),
        thinking=thinking,
        segments=tuple(segments),
        ids=tuple(itertools.chain.from_iterable(s.ids for s in segments)),
        calls=tuple(calls),
        history_tool_calls=history,
    )


def _length(rng: random.Random, mean: int, config: EmulatorConfig) -> int:
    sigma = config.length_sigma
    value = rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma) if sigma else mean
    return max(8, min(8 * mean, round(value)))


def _lead(rng: random.Random, config: EmulatorConfig) -> str:
    # Kimi sometimes starts a field with a space or a newline; APIs must keep it byte-exact.
    if rng.random() < config.leading_whitespace_rate:
        return rng.choice([" ", "\n", "\n\n"])
    return ""


def _after_section(rng: random.Random, config: EmulatorConfig) -> str:
    if rng.random() >= config.text_after_section_rate:
        return ""
    return rng.choice(["\n", " ", "\n\n" + textgen.prose(rng, rng.randint(4, 12))])


def _content(rng: random.Random, config: EmulatorConfig, has_calls: bool) -> str:
    if has_calls:
        if rng.random() < config.no_content_before_calls_rate:
            return NO_CONTENT
        if rng.random() < 0.8:  # usually straight to the calls
            return ""
        return _lead(rng, config) + textgen.prose(rng, rng.randint(8, 24))
    n = _length(rng, config.content_tokens_mean, config)
    return _lead(rng, config) + textgen.answer(rng, n, literal_rate=config.literal_marker_rate)


def _plan_calls(
    rng: random.Random,
    request: dict[str, Any],
    tools: list[ToolSpec],
    history: int,
    config: EmulatorConfig,
    shapes: random.Random,
) -> list[PlannedCall]:
    # Drawn first and always: without a call, the text is the same whatever the tool knobs.
    roll = rng.random()
    if not tools:
        return []
    choice = request.get("tool_choice")
    if choice == "none":
        return []
    forced: ToolSpec | None = None
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        forced = next((t for t in tools if t.name == name), None)
        if forced is None:
            raise RequestError(f"tool_choice names {name!r}, which is not among the tools")
    messages = request["messages"]
    mentioned: list[ToolSpec] = []
    if messages[-1].get("role") == "user":
        words = set(_WORD.findall(_text_of(messages[-1].get("content")).lower()))
        mentioned = [t for t in tools if _keywords(t) & words]
    if not (forced or choice == "required" or mentioned or roll < config.tool_call_rate):
        return []
    first = forced or (mentioned[0] if mentioned else rng.choice(tools))
    r = rng.random()
    count = 1 if r < 0.75 else 2 if r < 0.92 else 3
    chosen = [first] + [rng.choice(tools) for _ in range(count - 1)]
    calls = []
    for i, tool in enumerate(chosen):
        index = history + i
        if rng.random() < config.wrong_tool_index_rate:
            index += 1
        arguments = textgen.arguments(rng, tool.parameters)
        if rng.random() < config.tool_args_whitespace_rate:
            arguments = rng.choice([" ", "\n"]) + arguments + rng.choice(["", " ", "\n"])
        call_id = f"functions.{tool.name}:{index}"
        if shapes.random() < config.bare_tool_id_rate:
            call_id = f"{tool.name}:{index}"
        if shapes.random() < config.tool_id_whitespace_rate:
            call_id = shapes.choice([" ", "\n"]) + call_id + shapes.choice(["", " ", "\n"])
        calls.append(PlannedCall(call_id, tool.name, arguments))
    return calls


def _inject_splits(
    segments: list[Segment], splitter: BpeSplitter, rng: random.Random, rate: float
) -> list[Segment]:
    out = []
    for seg in segments:
        if seg.kind in TEXT_KINDS:
            seg = Segment(seg.kind, seg.text, tuple(splitter.inject(seg.ids, rng, rate)), seg.call)
        out.append(seg)
    return out


# ---------------------------------------------------------------------------------------------
# Where the model stopped


def view(gen: Generation, tok: Tokenizer, max_tokens: int | None = None) -> CompletionView:
    """The completion as delivered: whole, or cut after `max_tokens` ids (no `<|im_end|>`)."""
    budget = len(gen.ids) if max_tokens is None else max_tokens
    truncated = budget < len(gen.ids)
    texts: dict[str, str] = {}
    section: list[str] = []
    done_calls: list[PlannedCall] = []
    think_closed = False
    reasoning_tokens = 0
    for seg in gen.segments:
        if budget <= 0:
            break
        taken = min(len(seg.ids), budget)
        budget -= taken
        if taken == len(seg.ids):
            text = seg.text
        else:
            # Incremental detokenizers hold back an unfinished UTF-8 character; at a cut, the
            # held-back bytes are never sent.
            text = tok.decode_bytes(list(seg.ids[:taken])).decode("utf-8", errors="ignore")
        if seg.kind in ("reasoning", "content"):
            texts[seg.kind] = text
            if seg.kind == "reasoning":
                reasoning_tokens = taken
        elif seg.kind == "think_end":
            think_closed = True
        elif seg.kind != "im_end":
            section.append(text)
            if seg.kind == "call_end":
                done_calls.append(gen.calls[seg.call])
    return CompletionView(
        ids=gen.ids[:max_tokens] if truncated else gen.ids,
        thinking=gen.thinking,
        reasoning=texts.get("reasoning", "") if gen.thinking else None,
        think_closed=think_closed,
        content=texts.get("content", ""),
        calls=tuple(done_calls),
        section_text="".join(section),
        made_calls=bool(section),
        truncated=truncated,
        reasoning_tokens=reasoning_tokens,
    )
