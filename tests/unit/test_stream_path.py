"""The cheap stream path (issue 11): bytes split into events and parsed with orjson must give
exactly what the line-by-line str path gives, however the network cuts the bytes."""

from __future__ import annotations

import json
import random

import pytest

from specregen.wire.stream import (
    SSEByteDecoder,
    StreamAssembler,
    StreamDecodeError,
    StreamError,
    assemble_lines,
    loads,
    parse_data,
)

# Multi-byte characters (cut mid-character by the network), quotes, backslashes, newlines.
ALPHABET = "ab c\u00e9\u4e2d\U0001f600\n\"\\{"


def chunk(delta: dict, finish=None, **top) -> dict:
    return {"id": "gen-1", "model": "m", "provider": "P", **top,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def stream_text(rng: random.Random) -> str:
    events = [chunk({"role": "assistant", "content": ""})]
    for _ in range(rng.randint(5, 60)):
        kind = rng.choice(["reasoning", "content", "details", "call", "keepalive", "null"])
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 9)))
        if kind == "reasoning":
            events.append(chunk({"reasoning": text}))
        elif kind == "content":
            events.append(chunk({"content": text}))
        elif kind == "details":
            events.append(chunk({"reasoning_details": [{"type": "reasoning.text", "index": 0,
                                                        "text": text}]}))
        elif kind == "call":
            events.append(chunk({"tool_calls": [{"index": 0, "id": "functions.f:0",
                                                 "function": {"name": "f",
                                                              "arguments": text}}]}))
        elif kind == "null":
            events.append(chunk({"content": None}))
        else:
            events.append(": OPENROUTER PROCESSING")
    events.append(chunk({}, "stop", usage=None))
    events.append({"id": "gen-1", "choices": [], "usage": {"prompt_tokens": 3,
                                                           "completion_tokens": 9}})
    lines = []
    eol = rng.choice(["\n", "\r\n"])
    for event in events:
        if isinstance(event, str):
            lines.append(event + eol + eol)
        else:
            lines.append("data: " + json.dumps(event, ensure_ascii=rng.random() < 0.5)
                         + eol + eol)
    lines.append("data: [DONE]" + eol + eol)
    return "".join(lines)


def byte_path(raw: bytes, cuts: list[int]) -> tuple[dict, bool]:
    decoder = SSEByteDecoder()
    assembler = StreamAssembler()
    done = False
    pieces = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    for piece in pieces:
        for data, name in decoder.feed(piece):
            if done:
                break
            part = parse_data(data, name)
            if part is None:
                done = True
            else:
                assembler.add(part)
    for data, name in decoder.close():
        part = parse_data(data, name)
        if part is None:
            done = True
        elif not done:
            assembler.add(part)
    return assembler.result(), done


@pytest.mark.parametrize("seed", range(60))
def test_byte_path_equals_the_line_path_at_any_cut(seed):
    rng = random.Random(seed)
    text = stream_text(rng)
    raw = text.encode()
    # Cuts anywhere, including inside a multi-byte character and between \r and \n.
    cuts = sorted(rng.sample(range(1, len(raw)), min(len(raw) - 1, rng.randint(1, 40))))
    expected, expected_done = assemble_lines(text.replace("\r\n", "\n").split("\n"))
    got, done = byte_path(raw, cuts)
    assert done == expected_done
    assert got == expected


def test_an_unterminated_last_event_is_still_read():
    raw = ("data: " + json.dumps(chunk({"content": "hi"}, "stop"))).encode()
    got, done = byte_path(raw, [5])
    assert not done and got["choices"][0]["message"]["content"] == "hi"


def test_orjson_refusals_fall_back_to_what_json_took():
    big = b'{"n": 123456789012345678901234567890, "s": "\\ud800"}'
    assert loads(big) == json.loads(big)
    assert loads(b'{"s": "\xff"}') == {"s": "\ufffd"}


def test_error_events_and_non_objects_are_reported():
    with pytest.raises(StreamError, match="boom"):
        parse_data(b'{"error": {"code": 502, "message": "boom"}}')
    with pytest.raises(StreamError):
        parse_data(b"upstream died", b"error")
    with pytest.raises(StreamDecodeError):
        parse_data(b"[1, 2]")
    with pytest.raises(StreamDecodeError):
        parse_data(b"{not json")
    assert parse_data(b" [DONE] ") is None


def test_reasoning_detail_pieces_are_joined_once_and_result_is_repeatable():
    assembler = StreamAssembler()
    for piece in ("a", "b", "c"):
        assembler.add(chunk({"reasoning_details": [{"type": "reasoning.text", "index": 0,
                                                    "text": piece, "signature": None}]}))
    first = assembler.result()
    assert first["choices"][0]["message"]["reasoning_details"][0]["text"] == "abc"
    assert assembler.result() == first


@pytest.mark.parametrize("seed", range(20))
def test_one_event_per_network_chunk_takes_the_fast_path_with_the_same_result(seed):
    rng = random.Random(1000 + seed)
    text = stream_text(rng).replace("\r\n", "\n")
    raw = text.encode()
    cuts = [i + 2 for i in range(len(raw) - 1) if raw[i:i + 2] == b"\n\n" and i + 2 < len(raw)]
    expected, expected_done = assemble_lines(text.split("\n"))
    got, done = byte_path(raw, cuts)
    assert (got, done) == (expected, expected_done)
