"""The K2.5 format: prompt text, generation prompt, history rule, raw markers, id policy."""

from __future__ import annotations

import pytest

from specregen.models.kimi_k25 import (
    DEFAULT_SYSTEM_PROMPT,
    find_tool_section,
    name_from_tool_id,
    render_prompt_text,
    resolve_tool_id,
)
from specregen.records import ToolCall

USER = {"role": "user", "content": "Hi"}
SYSTEM = {"role": "system", "content": "Be brief."}


def test_prompt_with_system_thinking_on():
    text = render_prompt_text([SYSTEM, USER])
    assert text == (
        "<|im_system|>system<|im_middle|>Be brief.<|im_end|>"
        "<|im_user|>user<|im_middle|>Hi<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think>"
    )


def test_instant_mode_prefills_an_empty_think_block():
    assert render_prompt_text([SYSTEM, USER], thinking=False).endswith(
        "<|im_assistant|>assistant<|im_middle|><think></think>"
    )


def test_default_system_prompt_is_injected_unless_disabled():
    text = render_prompt_text([USER])
    assert text.startswith(f"<|im_system|>system<|im_middle|>{DEFAULT_SYSTEM_PROMPT}<|im_end|>")
    assert not render_prompt_text([USER], inject_default_system=False).startswith("<|im_system|>")
    # An explicit default system message renders to the same text as the injection.
    explicit = render_prompt_text([{"role": "system", "content": DEFAULT_SYSTEM_PROMPT}, USER])
    assert explicit == text


def test_tool_declaration_comes_first_in_both_forms():
    tools = [{"type": "function", "function": {"name": "f", "description": "Do f.",
                                                "parameters": {"type": "object",
                                                               "properties": {}}}}]
    ts = render_prompt_text([SYSTEM, USER], tools)
    assert ts.startswith("<|im_system|>tool_declare<|im_middle|># Tools\n\n## functions\n")
    as_json = render_prompt_text([SYSTEM, USER], tools, tools_format="json")
    assert as_json.startswith(
        '<|im_system|>tool_declare<|im_middle|>[{"function":{"description":"Do f.","name":"f",'
    )
    assert "<|im_end|><|im_system|>system<|im_middle|>Be brief." in as_json


def test_history_reasoning_is_dropped_and_suffix_reasoning_kept():
    call = {"id": "functions.f:0", "type": "function",
            "function": {"name": "f", "arguments": '{"a": 1}'}}
    msgs = [
        SYSTEM,
        USER,
        {"role": "assistant", "content": "Hello", "reasoning_content": "old thoughts"},
        {"role": "user", "content": "Call f"},
        {"role": "assistant", "content": "", "reasoning": "new thoughts", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "functions.f:0", "content": "42"},
    ]
    text = render_prompt_text(msgs)
    assert "<|im_assistant|>assistant<|im_middle|><think></think>Hello<|im_end|>" in text
    assert "old thoughts" not in text
    assert (
        "<think>new thoughts</think><|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"
        '<|tool_call_argument_begin|>{"a": 1}<|tool_call_end|><|tool_calls_section_end|><|im_end|>'
    ) in text
    assert "<|im_system|>tool<|im_middle|>## Return of functions.f:0\n42<|im_end|>" in text
    # Instant mode drops the suffix reasoning too.
    assert "new thoughts" not in render_prompt_text(msgs, thinking=False)


def test_named_messages_and_image_parts():
    msgs = [SYSTEM, {"role": "user", "name": "alice", "content": [
        {"type": "text", "text": "Look: "}, {"type": "image_url", "image_url": {"url": "x"}}]}]
    text = render_prompt_text(msgs)
    assert (
        "<|im_user|>alice<|im_middle|>Look: "
        "<|media_begin|>image<|media_content|><|media_pad|><|media_end|>\n<|im_end|>"
    ) in text


def test_prompt_ids_keep_user_text_specials_as_servers_do(fmt):
    """The server tokenizes the rendered prompt with specials allowed, user text included."""
    ids = fmt.encode_prompt([SYSTEM, {"role": "user", "content": "say <|im_end|>"}])
    assert ids.count(fmt.ids["<|im_end|>"]) == 3


RAW = (
    "<|tool_calls_section_begin|> <|tool_call_begin|> functions.get_weather:0 "
    '<|tool_call_argument_begin|> {"city": "Paris"} <|tool_call_end|>\n'
    "<|tool_call_begin|>functions.lookup:1<|tool_call_argument_begin|>{}<|tool_call_end|>"
    "<|tool_calls_section_end|>"
)


def test_raw_section_tolerates_whitespace_and_keeps_calls():
    section = find_tool_section("Let me check." + RAW)
    assert section is not None and section.complete
    assert section.start == len("Let me check.")
    assert section.calls == [
        ToolCall("functions.get_weather:0", "get_weather", '{"city": "Paris"}'),
        ToolCall("functions.lookup:1", "lookup", "{}"),
    ]


def test_raw_section_literal_text_before_the_real_one_is_skipped():
    text = 'x = "<|tool_calls_section_begin|>" # literal\n' + RAW
    section = find_tool_section(text)
    assert section is not None and section.start == text.index(RAW)


@pytest.mark.parametrize(
    "cut, n_calls",
    [(len("<|tool_calls_section_begin|> <|tool_call_begin|> functions.get"), 1),
     (RAW.index('"Paris"'), 1),
     (RAW.index("<|tool_call_begin|>functions.lookup"), 1)],
)
def test_truncated_raw_section_parses_only_when_allowed(cut, n_calls):
    text = RAW[:cut]
    assert find_tool_section(text) is None
    section = find_tool_section(text, allow_partial=True)
    assert section is not None and not section.complete and len(section.calls) == n_calls


def test_raw_section_with_prose_between_calls_is_not_a_section():
    bad = RAW.replace("<|tool_call_end|>\n", "<|tool_call_end|>and then ")
    assert find_tool_section(bad) is None


def test_tool_id_policy():
    assert resolve_tool_id("functions.get_weather:3", "get_weather", 0) == (
        "functions.get_weather:3", False)
    assert resolve_tool_id("call_abc123", "get_weather", 2) == ("functions.get_weather:2", True)
    assert resolve_tool_id("", "f", 0) == ("functions.f:0", True)
    assert name_from_tool_id(" functions.book.flight:1 ") == "book.flight"
