"""Qwen3 completion pieces with literal expected values: the raw tool-call parser a client
uses, the argument and id policies, and assembly of cut-off or unparsed answers."""

from __future__ import annotations

import pytest

from specregen.models.qwen3 import (
    MINI_QWEN3_TOKENIZER_DIR,
    Qwen3,
    canonical_arguments,
    find_tool_calls,
    is_server_tool_id,
)
from specregen.models.tokenizer import load_tokenizer
from specregen.records import ToolCall

BLOCK = '<tool_call>\n{"name": "f", "arguments": {"a":1, "é": "ü"}}\n</tool_call>'


@pytest.fixture(scope="module")
def fmt():
    return Qwen3(load_tokenizer(MINI_QWEN3_TOKENIZER_DIR))


def test_raw_parser_reads_blocks_like_hermes():
    found = find_tool_calls(f"Sure.\n{BLOCK}\n{BLOCK}")
    assert found is not None
    assert found.start == len("Sure.\n") and found.complete
    assert found.calls == [ToolCall("", "f", '{"a": 1, "é": "ü"}')] * 2


def test_raw_parser_all_or_nothing_and_partial():
    assert find_tool_calls("no calls here") is None
    bad = '<tool_call>\n{"name": "f"}\n</tool_call>'  # no arguments: hermes refuses all
    assert find_tool_calls(f"{BLOCK}{bad}") is None
    cut = f'{BLOCK}\n<tool_call>\n{{"name": "f", "argu'
    assert find_tool_calls(cut) is None
    partial = find_tool_calls(cut, allow_partial=True)
    assert partial is not None and not partial.complete and len(partial.calls) == 1


def test_argument_and_id_policies():
    assert canonical_arguments('{"a": 1}') == ('{"a": 1}', True)
    assert canonical_arguments('{"a":1}') == ('{"a": 1}', False)
    assert canonical_arguments('{"e": "\\u00e9"}') == ('{"e": "é"}', False)
    assert canonical_arguments("not json") == ("not json", False)
    assert is_server_tool_id("chatcmpl-tool-" + "0123456789abcdef" * 2)
    assert is_server_tool_id("call_Ab12")
    assert not is_server_tool_id("functions.f:0")


def test_cut_off_in_reasoning_has_no_end_tag_and_no_stop(fmt):
    got = fmt.assemble("\nthinking so", None, [], thinking=True, truncated=True)
    assert got.text == "<think>\nthinking so"
    assert got.ids == [fmt.ids["<think>"], *fmt.tok.encode_ordinary("\nthinking so")]


def test_unparsed_call_text_in_content_is_kept_and_flagged(fmt):
    content = '\n\n<tool_call>\n{"name": "f", "arguments": {"a": }\n</tool_call>'
    got = fmt.assemble("\nr\n", content, [], thinking=True, truncated=False)
    assert got.text == "<think>\nr\n</think>" + content
    assert got.ids[-1] == fmt.im_end
    assert got.ids.count(fmt.ids["<tool_call>"]) == 1
    assert "tool_calls_in_content" not in got.flags  # it does not parse
    ok = '\n\n<tool_call>\n{"name": "f", "arguments": {}}'
    assert "tool_calls_in_content" in fmt.assemble(
        "\nr\n", ok, [], thinking=True, truncated=True).flags


def test_thinking_off_answer_and_literal_im_end_in_text(fmt):
    got = fmt.assemble(None, "say <|im_end|> now", [], thinking=False, truncated=False)
    assert got.ids == [*fmt.tok.encode_ordinary("say <|im_end|> now"), fmt.im_end]
    assert got.ids.count(fmt.im_end) == 1  # the literal one stayed text


def test_structure_problems_name_what_is_out_of_place(fmt):
    think, end, call, call_end, im_end = (fmt.ids[m] for m in (
        "<think>", "</think>", "<tool_call>", "</tool_call>", "<|im_end|>"))
    x = fmt.tok.encode_ordinary("x")
    good = [think, *x, end, *x, call, *x, call_end, im_end]
    assert fmt.structure_problems(good, n_calls=1, thinking=True, truncated=False) == []
    assert fmt.structure_problems(good, n_calls=2, thinking=True, truncated=False) == [
        "<tool_call>/</tool_call> ids (1/1) do not fit 2 call(s)"]
    assert fmt.structure_problems(good, n_calls=1, thinking=False, truncated=False) == [
        "think marker ids with thinking off (1/1)"]
    assert fmt.structure_problems(good[:-1], n_calls=1, thinking=True, truncated=False) == [
        "<|im_end|> is not the one last id (0 found)"]
    cut = [think, *x, end, *x, call, *x]  # cut inside a call the API did not return
    assert fmt.structure_problems(cut, n_calls=0, thinking=True, truncated=True) == []
    turn = [*x, fmt.ids["<|im_start|>"], im_end]
    assert fmt.structure_problems(turn, n_calls=0, thinking=False, truncated=False) == [
        "1 <|im_start|> id(s) inside the completion"]
