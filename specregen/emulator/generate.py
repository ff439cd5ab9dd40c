"""What every emulated model shares: request digests and seeds, the declared tools and which
of them the user mentions, the emulator's model-like text (`WRITER`), and non-canonical BPE
splits. How a format writes its answer as ids lives in its served side
(`models/<format>/served.py`, found by `registry.get_server`).

The rng of an answer is seeded by (config seed, request digest): a retry of the same request gets
the same completion. Fields that only change how the answer is delivered (`stream`,
`max_tokens`, ...) are left out of the digest, so a truncated answer is a prefix of the full
one, as with a seeded model.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specregen.models import textgen
from specregen.models.tokenizer import Tokenizer, TokenizerError, read_tiktoken_ranks

# Request fields that change how an answer is delivered, not what the model writes (the ids
# as text, and the evidence beside them, included).
DELIVERY_FIELDS = frozenset(
    {"stream", "stream_options", "return_token_ids", "max_tokens", "max_completion_tokens",
     "usage", "spaces_between_special_tokens", "logprobs", "top_logprobs",
     "return_tokens_as_token_ids"}
)
# The subset that `distinct_requests` ignores: a streamed and a plain copy are one request.
TRANSPORT_FIELDS = frozenset({"stream", "stream_options"})


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


def mentioned_tools(request: dict[str, Any], tools: Sequence[ToolSpec]) -> list[ToolSpec]:
    """The declared tools the last message names (when it is the user's), by keyword."""
    messages = request["messages"]
    if messages[-1].get("role") != "user":
        return []
    words = set(_WORD.findall(_text_of(messages[-1].get("content")).lower()))
    return [t for t in tools if _keywords(t) & words]


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
# What a format's served side asks the emulator for


class Writer:
    """The emulator's side of an answer that a format's served side writes as ids: model-like
    text (`textgen`) and the request's tools as the emulated model reads them."""

    prose = staticmethod(textgen.prose)
    answer = staticmethod(textgen.answer)
    arguments = staticmethod(textgen.arguments)
    declared_tools = staticmethod(declared_tools)
    mentioned_tools = staticmethod(mentioned_tools)


WRITER = Writer()
