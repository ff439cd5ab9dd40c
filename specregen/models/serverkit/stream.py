"""What a restated server's parsers see and return, and the helpers their stream loops share.

A parser sees the completion as the server's detokenizer hands it over (`Output`: the whole
text and its decode steps, `Delta`); it returns the message's fields (`Parsed`, calls as
`ServerCall`: name, arguments text, index; the ids are random and the emulator makes them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Delta:
    """One decode step: the text it added ("" while a UTF-8 character is incomplete) and the
    token id."""

    text: str
    token_id: int


@dataclass(frozen=True, slots=True)
class Output:
    """The completion as the server's detokenizer hands it to the parsers."""

    text: str
    deltas: tuple[Delta, ...]
    truncated: bool  # stopped on max_tokens, not on a stop token
    # The stop token generated (not in the text), for a parser that sends its step (K3's).
    stop_id: int | None = None


@dataclass(frozen=True, slots=True)
class ServerCall:
    name: str
    arguments: str
    index: int  # ids are random (`chatcmpl-tool-...`); the emulator makes them


@dataclass(frozen=True, slots=True)
class Parsed:
    reasoning: str | None
    content: str | None
    calls: tuple[ServerCall, ...]
    finish_reason: str
    # Streams: per call, the characters of content sent before the call's delta (a stream loop
    # that records it; empty otherwise).
    content_at_calls: tuple[int, ...] = ()


def tag_overlap(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a proper beginning of `tag` (what a stream
    holds back: it could start the tag)."""
    for k in range(min(len(text), len(tag) - 1), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


def ends_with_partial(buffer: str, token: str) -> int:
    """SGLang's `BaseFormatDetector._ends_with_partial_token`: the length of the SHORTEST end
    of `buffer` that begins `token` (0: none)."""
    for i in range(1, min(len(buffer) + 1, len(token))):
        if token.startswith(buffer[-i:]):
            return i
    return 0


def common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def is_complete_json(text: str) -> bool:
    """Whether `text` is one JSON value as it stands."""
    try:
        json.loads(text)
    except ValueError:
        return False
    return True
