"""SSE parsing and stream assembly: the assembled body reads like the non-streaming one."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specregen.wire.response import normalize_response
from specregen.wire.stream import (
    SSEDecoder,
    StreamAssembler,
    StreamDecodeError,
    StreamError,
    assemble_lines,
    parse_event,
)
from tests.unit.test_client_support import chunk, completion, sse, stream_of


def lines(data: bytes) -> list[str]:
    return data.decode().split("\n")


def test_comments_done_and_text_concatenation_are_byte_exact():
    text = sse(
        [
            ": OPENROUTER PROCESSING",
            "",
            chunk({"role": "assistant", "reasoning": " lead"}),
            ": OPENROUTER PROCESSING",
            chunk({"reasoning": "ing space\n"}),
            chunk({"content": " Hé"}),
            chunk({"content": "llo  "}),
            chunk({}, finish="stop"),
        ]
    )
    body, done = assemble_lines(lines(text))
    assert done
    message = body["choices"][0]["message"]
    assert message["reasoning"] == " leading space\n"
    assert message["content"] == " Héllo  "
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["object"] == "chat.completion"


def test_decoder_handles_no_space_multiline_data_and_unterminated_last_event():
    decoder = SSEDecoder()
    assert decoder.feed(": keep-alive") is None
    assert decoder.feed('data:{"a":') is None
    assert decoder.feed("data: 1}") is None
    event = decoder.feed("")
    assert event is not None and json.loads(event.data) == {"a": 1}
    assert decoder.feed("data: [DONE]") is None
    last = decoder.close()
    assert last is not None and parse_event(last) is None
    assert decoder.comments == 1


def test_tool_call_fragments_are_joined_by_index_even_interleaved():
    text = sse(
        [
            chunk({"content": "Calling."}),
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "functions.a:0",
                            "type": "function",
                            "function": {"name": "a", "arguments": ""},
                        }
                    ]
                }
            ),
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 1,
                            "id": "functions.b:1",
                            "type": "function",
                            "function": {"name": "b", "arguments": '{"y"'},
                        }
                    ]
                }
            ),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"x": '}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": " 1 }"}}]}),
            chunk({"tool_calls": [{"index": 1, "function": {"arguments": ":2}"}}]}),
            chunk({}, finish="tool_calls"),
        ]
    )
    body, _ = assemble_lines(lines(text))
    calls = body["choices"][0]["message"]["tool_calls"]
    assert [c["id"] for c in calls] == ["functions.a:0", "functions.b:1"]
    assert [c["function"]["name"] for c in calls] == ["a", "b"]
    # Verbatim: the spaces inside the arguments survive.
    assert [c["function"]["arguments"] for c in calls] == ['{"x":  1 }', '{"y":2}']
    assert body["choices"][0]["finish_reason"] == "tool_calls"


def test_fragments_without_index_open_a_call_on_each_new_id():
    assembler = StreamAssembler()
    assembler.add(
        chunk({"tool_calls": [{"id": "c1", "function": {"name": "a", "arguments": "{"}}]})
    )
    assembler.add(chunk({"tool_calls": [{"function": {"arguments": "}"}}]}))
    assembler.add(
        chunk({"tool_calls": [{"id": "c2", "function": {"name": "b", "arguments": "[]"}}]})
    )
    calls = assembler.result()["choices"][0]["message"]["tool_calls"]
    assert [(c["id"], c["function"]["arguments"]) for c in calls] == [("c1", "{}"), ("c2", "[]")]


def test_usage_chunk_with_empty_choices_and_top_level_fields():
    text = sse(
        [
            chunk({"role": "assistant", "content": "x"}, provider="Moonshot AI"),
            {
                "id": "gen-1",
                "choices": [
                    {
                        "index": 0,
                        "delta": {},
                        "finish_reason": "stop",
                        "native_finish_reason": "end_turn",
                    }
                ],
            },
            {
                "id": "gen-1",
                "choices": [],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2, "cost": 0.001},
            },
        ]
    )
    body, _ = assemble_lines(lines(text))
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "cost": 0.001}
    assert body["provider"] == "Moonshot AI"
    assert body["id"] == "gen-1" and body["model"] == "m"
    assert body["choices"][0]["native_finish_reason"] == "end_turn"


def test_moonshot_reasoning_content_and_usage_inside_the_choice():
    assembler = StreamAssembler()
    assembler.add(chunk({"role": "assistant", "reasoning_content": " Let"}))
    assembler.add(chunk({"reasoning_content": " me."}))
    assembler.add(chunk({"content": " Hi"}))
    last = chunk({}, finish="stop")
    last["choices"][0]["usage"] = {"prompt_tokens": 1, "completion_tokens": 3}
    assembler.add(last)
    body = assembler.result()
    normalized = normalize_response(body)
    assert normalized.reasoning == " Let me."
    assert normalized.reasoning_field == "reasoning_content"
    assert normalized.content == " Hi"
    assert body["usage"] == {"prompt_tokens": 1, "completion_tokens": 3}


def test_vllm_token_ids_are_concatenated():
    assembler = StreamAssembler()
    first = chunk({"role": "assistant", "content": ""})
    first["prompt_token_ids"] = [1, 2, 3]
    assembler.add(first)
    for ids, text in (([10, 11], "ab"), ([12], "c")):
        piece = chunk({"content": text})
        piece["choices"][0]["token_ids"] = ids
        assembler.add(piece)
    end = chunk({}, finish="stop")
    end["choices"][0]["token_ids"] = [13]
    assembler.add(end)
    body = assembler.result()
    assert body["prompt_token_ids"] == [1, 2, 3]
    assert body["choices"][0]["token_ids"] == [10, 11, 12, 13]
    assert body["choices"][0]["message"]["content"] == "abc"


def test_reasoning_details_pieces_merge_by_index():
    assembler = StreamAssembler()
    for piece in ("Thin", "king", "."):
        assembler.add(
            chunk(
                {
                    "reasoning": piece,
                    "reasoning_details": [
                        {"type": "reasoning.text", "text": piece, "index": 0, "format": "unknown"}
                    ],
                }
            )
        )
    assembler.add(
        chunk(
            {
                "reasoning_details": [
                    {"type": "reasoning.text", "text": "", "index": 0, "signature": "sig"}
                ]
            }
        )
    )
    details = assembler.result()["choices"][0]["message"]["reasoning_details"]
    assert details == [
        {
            "type": "reasoning.text",
            "text": "Thinking.",
            "index": 0,
            "format": "unknown",
            "signature": "sig",
        }
    ]


@pytest.mark.parametrize(
    "event",
    [
        'data: {"error": {"code": 502, "message": "upstream died"}}',
        'event: error\ndata: {"code": 500, "message": "boom"}',
        "event: error\ndata: not json",
    ],
)
def test_error_events_raise_stream_error(event):
    with pytest.raises(StreamError):
        assemble_lines([*event.split("\n"), ""])


def test_a_chunk_that_is_not_json_is_a_decode_error():
    with pytest.raises(StreamDecodeError):
        assemble_lines(["data: {not json", ""])
    with pytest.raises(StreamDecodeError):
        assemble_lines(["data: [1, 2]", ""])


def test_finish_reason_error_is_kept_for_the_transport_to_judge():
    failing = chunk({"content": "par"}, finish="error")
    failing["choices"][0]["error"] = {"code": 502, "message": "provider disconnected"}
    body, _ = assemble_lines(lines(sse([failing])))
    assert body["choices"][0]["finish_reason"] == "error"
    assert body["choices"][0]["error"]["code"] == 502


def test_null_only_fields_stay_null_and_content_defaults_to_null():
    body, _ = assemble_lines(
        lines(sse([chunk({"role": "assistant", "reasoning": None}), chunk({}, finish="stop")]))
    )
    message = body["choices"][0]["message"]
    assert message == {"role": "assistant", "content": None, "reasoning": None}


TOOL_CALL = {
    "id": "functions.get_weather:0",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit":"c"}'},
}


@settings(max_examples=60, deadline=None)
@given(
    reasoning=st.text(max_size=40),
    content=st.one_of(st.none(), st.text(max_size=40)),
    pieces=st.integers(min_value=1, max_value=7),
    with_tool=st.booleans(),
)
def test_assembled_stream_normalizes_like_the_plain_response(reasoning, content, pieces, with_tool):
    plain = completion(
        content=content,
        reasoning=reasoning,
        finish="tool_calls" if with_tool else "stop",
        tool_calls=[TOOL_CALL] if with_tool else None,
    )
    body, done = assemble_lines(lines(sse(stream_of(plain, pieces))))
    assert done
    assert normalize_response(body) == normalize_response(plain)
    assert body["usage"] == plain["usage"]
    assert body["provider"] == plain["provider"]
