"""StreamParser (the stream path's per-chunk loop): for any stream, however the network cuts it
(one event per chunk, several, or anywhere), the assembled answer, the assembler's state and the
keep-alive count equal the decoder + parse_data + StreamAssembler path's."""

from __future__ import annotations

import json
import random

import pytest

from specregen.wire.stream import (
    SSEByteDecoder,
    StreamAssembler,
    StreamDecodeError,
    StreamError,
    StreamParser,
    parse_data,
)

# Text that looks like JSON/SSE syntax, escapes, multi-byte and control characters.
NASTY = ['","reasoning_details":[{"type":"reasoning.text","text":"', '"', "\\", '\\"', "}]}",
         "\n", "\u00e9", "\U0001f600", "\u2028", "data: ", "\x00", "a", " ", ",", ":"]


def text(rng: random.Random) -> str:
    return "".join(rng.choice(NASTY) for _ in range(rng.randint(0, 4)))


def event(rng: random.Random, kind: str, top: dict) -> dict:
    delta: dict
    if kind == "reasoning_or":
        piece = text(rng)
        delta = {"reasoning": piece, "reasoning_details": [
            {"type": "reasoning.text", "text": piece, "format": "unknown", "index": 0}]}
    elif kind == "role":
        delta = {"role": "assistant", "content": text(rng)}
    elif kind == "nulls":
        delta = {"content": text(rng), "reasoning": None, "tool_calls": []}
    elif kind == "call":
        delta = {"tool_calls": [{"index": 0, "id": "functions.f:0",
                                 "function": {"name": "f", "arguments": text(rng)}}]}
    elif kind == "number":
        delta = {"content": 7}
    else:
        delta = {kind: text(rng)}
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
    if rng.random() < 0.3:
        choice["native_finish_reason"] = None
    return {**top, "choices": [choice]}


def stream(rng: random.Random) -> list[bytes]:
    """One event per item, as a paced server writes them."""
    top = {"id": "gen-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
           "provider": "P"}
    kinds = ["reasoning_or", "content", "reasoning_content", "role", "nulls", "call", "number",
             "reasoning"]
    out = [b": OPENROUTER PROCESSING\n\n"]
    kind = rng.choice(kinds)
    for _ in range(rng.randint(5, 80)):
        if rng.random() < 0.15:
            kind = rng.choice(kinds)
        obj = event(rng, kind, top)
        style = rng.random()
        if style < 0.4:
            data = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()
        elif style < 0.7:
            data = json.dumps(obj).encode()  # spaces, \\u escapes
        else:
            data = json.dumps(obj, ensure_ascii=False).encode()
        if rng.random() < 0.02:
            data = data.replace(b'"gen-1"', b'"gen-\xff"')  # invalid UTF-8: json fallback
        out.append(b"data: " + data + b"\n\n")
        if rng.random() < 0.05:
            out.append(b": keep-alive\n\n")
    out.append(b"data: " + json.dumps({**top, "choices": [
        {"index": 0, "delta": {}, "finish_reason": "stop"}]}).encode() + b"\n\n")
    out.append(b'data: {"id":"gen-1","choices":[],"usage":{"prompt_tokens":3}}\n\n')
    out.append(b"data: [DONE]\n\n")
    return out


def full_path(pieces: list[bytes]) -> tuple[StreamAssembler, bool]:
    decoder, assembler = SSEByteDecoder(), StreamAssembler()
    for piece in pieces:
        for data, name in decoder.feed(piece):
            part = parse_data(data, name)
            if part is None:
                return assembler, True
            assembler.add(part)
    for data, name in decoder.close():
        part = parse_data(data, name)
        if part is None:
            return assembler, True
        assembler.add(part)
    return assembler, False


def parser_path(pieces: list[bytes]) -> tuple[StreamParser, bool]:
    parser = StreamParser()
    for piece in pieces:
        if parser.feed(piece):
            return parser, True
    return parser, parser.close()


def state(assembler: StreamAssembler) -> dict:
    return {"result": assembler.result(), "chunks": assembler.chunks, "top": assembler.top,
            "choices": {i: (c.texts, c.details, c.detail_text, c.role)
                        for i, c in assembler.choices.items()}}


@pytest.mark.parametrize("seed", range(150))
def test_parser_equals_the_full_parse_event_by_event_and_cut_anywhere(seed):
    rng = random.Random(seed)
    events = stream(rng)
    expected, done = full_path(events)
    parser, parser_done = parser_path(events)
    assert parser_done == done
    assert state(parser.assembler) == state(expected)
    assert parser.decoder.comments == sum(e.startswith(b":") for e in events)
    # Whole events several to a chunk (a reader slower than the server).
    grouped, i = [], 0
    while i < len(events):
        n = rng.randint(1, 6)
        grouped.append(b"".join(events[i:i + n]))
        i += n
    parser, parser_done = parser_path(grouped)
    assert parser_done == done
    assert state(parser.assembler) == state(expected)
    raw = b"".join(events)
    cuts = sorted(rng.sample(range(1, len(raw)), min(len(raw) - 1, rng.randint(1, 40))))
    pieces = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    parser, parser_done = parser_path(pieces)
    assert parser_done == done
    assert state(parser.assembler) == state(expected)


def test_errors_still_raise_through_the_parser():
    parser = StreamParser()
    ok = b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
    assert parser.feed(ok) is False and parser.feed(ok) is False
    with pytest.raises(StreamError):
        parser.feed(b'data: {"id":"x","error":{"code":502,"message":"down"}}\n\n')
    with pytest.raises(StreamDecodeError):
        StreamParser().feed(b"data: {nope\n\n")
    assert parser.assembler.result()["choices"][0]["message"]["content"] == "aa"
