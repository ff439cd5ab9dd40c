"""What cannot be recovered is flagged, never `ok`; what cannot be read is an `error`."""

from __future__ import annotations

import copy

import pytest

from specregen.reconstruct import ReconstructConfig, reconstruct
from specregen.records import ProviderTraits, UsageTolerance
from specregen.wire.response import thinking_from_request

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
REQUEST = {
    "model": "moonshotai/kimi-k2.5",
    "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Weather in Paris?"},
    ],
    "tools": TOOLS,
}
ARGS = '{"city": "Paris"}'


def response(message: dict, finish: str = "stop", usage: dict | None = None) -> dict:
    return {
        "choices": [{"index": 0, "message": {"role": "assistant", **message},
                     "finish_reason": finish}],
        "usage": usage or {},
    }


def call(call_id: str = "functions.get_weather:0", args: str = ARGS) -> dict:
    return {"id": call_id, "type": "function",
            "function": {"name": "get_weather", "arguments": args}}


def exact_usage(fmt, request, message, finish="stop"):
    """The usage a faithful provider reports: our own counts for a clean sample."""
    sample = reconstruct("x", request, response(message, finish), fmt)
    return {"prompt_tokens": sample.prompt_len, "completion_tokens": sample.completion_len,
            "completion_tokens_details": {"reasoning_tokens": 5}}


def test_clean_tool_call_is_ok(fmt):
    message = {"reasoning": "Need weather.", "content": None, "tool_calls": [call()]}
    usage = exact_usage(fmt, REQUEST, message, "tool_calls")
    # A provider whose parsers are known (its probe): no other reading has this count.
    known = ProviderTraits(renumbers_tool_ids=False, deletes_no_content=False,
                           counts_stop_token=True, ends_reasoning_at_tools=False)
    sample = reconstruct("s", REQUEST, response(message, "tool_calls", usage), fmt, traits=known)
    assert sample.status == "ok", sample.flags
    # Unknown, a `</think>` the model may not have written is a reading too, but one that
    # needs a dropped token as well to reach this count: two coincidences, no doubt.
    unknown = reconstruct("s", REQUEST, response(message, "tool_calls", usage), fmt)
    assert unknown.status == "ok" and unknown.input_ids == sample.input_ids
    assert sample.usage_prompt_delta == 0 and sample.usage_completion_delta == 0
    completion = sample.input_ids[sample.prompt_len :]
    assert completion[-1] == fmt.ids["<|im_end|>"]
    assert fmt.ids["</think>"] in completion


@pytest.mark.parametrize(
    "message, request_patch",
    [
        ({"content": "It is sunny."}, {}),  # the reasoning field is absent
        ({"reasoning": None, "content": "It is sunny."}, {}),
        ({"content": "It is sunny."}, {"reasoning": {"exclude": True}}),
        # Empty reasoning although the provider counted reasoning tokens.
        ({"reasoning": "", "content": "It is sunny."}, {}),
    ],
)
def test_dropped_reasoning_is_flagged(fmt, message, request_patch):
    request = {**REQUEST, **request_patch}
    usage = {"completion_tokens_details": {"reasoning_tokens": 40}}
    sample = reconstruct("s", request, response(message, usage=usage), fmt)
    assert sample.status == "flagged"
    assert "reasoning_missing" in sample.flags


def test_genuinely_empty_reasoning_is_ok(fmt):
    message = {"reasoning": "", "content": "Hi."}
    usage = {"completion_tokens_details": {"reasoning_tokens": 0}}
    sample = reconstruct("s", REQUEST, response(message, usage=usage), fmt)
    assert "reasoning_missing" not in sample.flags


def test_stripped_markers_are_flagged(fmt):
    message = {"reasoning": "Need weather.", "content": "functions.get_weather:0" + ARGS}
    sample = reconstruct("s", REQUEST, response(message, "tool_calls"), fmt)
    assert sample.status == "flagged"
    assert {"markers_stripped", "finish_reason_mismatch"} <= set(sample.flags)


def test_counts_far_from_usage_are_flagged(fmt):
    message = {"reasoning": "Think.", "content": "Sunny."}
    usage = exact_usage(fmt, REQUEST, message)
    far = {**usage, "completion_tokens": usage["completion_tokens"] + 50}
    sample = reconstruct("s", REQUEST, response(message, usage=far), fmt)
    assert sample.status == "flagged" and "completion_count_mismatch" in sample.flags
    assert sample.usage_completion_delta == -50
    # One token more than ours: a non-canonical split, or whitespace the reasoning split
    # trimmed. On that path only an equal count is evidence.
    near = {**usage, "completion_tokens": usage["completion_tokens"] + 1}
    sample = reconstruct("s", REQUEST, response(message, usage=near), fmt)
    assert sample.status == "flagged" and "completion_count_inexact" in sample.flags
    # In instant mode without calls no parser touches the text: the tolerance applies.
    instant = {**REQUEST, "chat_template_kwargs": {"thinking": False}}
    plain = {"content": "Sunny."}
    usage = exact_usage(fmt, instant, plain)
    near = {**usage, "completion_tokens": usage["completion_tokens"] + 1}
    sample = reconstruct("s", instant, response(plain, usage=near), fmt)
    assert sample.status == "ok" and sample.evidence == "usage_tolerated"
    strict = ReconstructConfig(UsageTolerance(completion_abs=0, completion_rel=0))
    assert reconstruct("s", instant, response(plain, usage=near), fmt,
                       config=strict).status == "flagged"


def test_prompt_rendered_differently_by_the_server_is_flagged(fmt):
    """A server that declared the tools as JSON instead of TypeScript counts other tokens."""
    message = {"reasoning": "Think.", "content": "Sunny."}
    usage = exact_usage(fmt, REQUEST, message)
    json_prompt = fmt.tok.encode_with_specials(
        __import__("specregen.models.kimi_k25", fromlist=["x"]).render_prompt_text(
            REQUEST["messages"], TOOLS, tools_format="json")
    )
    usage["prompt_tokens"] = len(json_prompt)
    sample = reconstruct("s", REQUEST, response(message, usage=usage), fmt)
    assert sample.status == "flagged" and "prompt_count_mismatch" in sample.flags


def test_foreign_tool_ids_are_rebuilt_with_the_conversation_count(fmt):
    request = copy.deepcopy(REQUEST)
    request["messages"] += [
        {"role": "assistant", "content": "", "tool_calls": [call("functions.get_weather:0")]},
        {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "rain"},
        {"role": "user", "content": "And tomorrow?"},
    ]
    message = {"reasoning": "Again.", "content": None, "tool_calls": [call("call_9f8e7d")]}
    sample = reconstruct("s", request, response(message, "tool_calls"), fmt)
    assert sample.status == "flagged" and "tool_id_rewritten" in sample.flags
    assert sample.tool_calls[0].id == "functions.get_weather:1"
    completion_text = fmt.tok.decode(sample.input_ids[sample.prompt_len :])
    assert "functions.get_weather:1" in completion_text and "call_9f8e7d" not in completion_text


def test_tool_section_inside_reasoning_has_no_think_end(fmt):
    raw = ("<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
           f"<|tool_call_argument_begin|>{ARGS}<|tool_call_end|><|tool_calls_section_end|>")
    message = {"reasoning": "I will call it." + raw, "content": None}
    sample = reconstruct("s", REQUEST, response(message, "tool_calls"), fmt)
    completion = sample.input_ids[sample.prompt_len :]
    assert fmt.ids["</think>"] not in completion
    assert completion.count(fmt.ids["<|tool_call_begin|>"]) == 1
    assert "tool_calls_in_reasoning" in sample.flags and sample.status == "flagged"
    assert sample.tool_calls[0].arguments == ARGS


def test_truncated_sample_is_ok_without_im_end(fmt):
    message = {"reasoning": "Let me think about this for a very long", "content": None}
    sample = reconstruct("s", REQUEST, response(message, "length"), fmt)
    assert sample.status == "ok" and "truncated" in sample.flags
    completion = sample.input_ids[sample.prompt_len :]
    assert fmt.ids["<|im_end|>"] not in completion and fmt.ids["</think>"] not in completion


def test_markers_left_in_content_next_to_structured_calls_are_flagged(fmt):
    message = {"reasoning": "x", "content": "<|tool_call_begin|>", "tool_calls": [call()]}
    sample = reconstruct("s", REQUEST, response(message, "tool_calls"), fmt)
    assert sample.status == "flagged" and "markers_in_text" in sample.flags


def test_reasoning_in_instant_mode_follows_the_server(fmt):
    request = {**REQUEST, "reasoning": {"enabled": False}}
    sample = reconstruct("s", request, response({"reasoning": "hmm", "content": "Hi"}), fmt)
    assert sample.status == "flagged" and "thinking_mode_mismatch" in sample.flags
    assert sample.thinking is True


def test_content_filter_is_flagged(fmt):
    sample = reconstruct("s", REQUEST, response({"reasoning": "a", "content": "b"},
                                                "content_filter"), fmt)
    assert sample.status == "flagged" and "content_filter" in sample.flags


@pytest.mark.parametrize(
    "body, reason",
    [
        ({"error": {"code": 502, "message": "upstream"}}, "502 upstream"),
        ({"choices": []}, "no 'choices'"),
        ({"choices": [{"finish_reason": "stop"}]}, "no 'message'"),
        (response({"content": "x"}, "error"), "finish_reason is 'error'"),
        (response({"content": 5}), "message.content is a int"),
        (response({"content": None, "tool_calls": [{"function": {}}]}), "tool_calls[0]"),
    ],
)
def test_unreadable_responses_are_errors(fmt, body, reason):
    sample = reconstruct("s", REQUEST, body, fmt)
    assert sample.status == "error" and reason in sample.error
    assert sample.input_ids == []


def test_bad_request_is_an_error(fmt):
    sample = reconstruct("s", {"model": "m"}, response({"content": "x"}), fmt)
    assert sample.status == "error" and "messages" in sample.error
    bad_role = {"messages": [{"content": "no role"}]}
    assert "role" in reconstruct("s", bad_role, response({"content": "x"}), fmt).error


def test_reference_classification(fmt):
    message = {"reasoning": "Think hard.", "content": "Sunny today."}
    ours = reconstruct("s", REQUEST, response(message), fmt)
    completion = ours.input_ids[ours.prompt_len :]
    enc = fmt.tok.encode_ordinary
    assert reconstruct("s", REQUEST, response(message), fmt,
                       reference_completion_ids=completion[:-1]).reference_match == "exact"
    # The same text split another way: one token of "Sunny today." spelled by its pieces.
    content_ids = enc("Sunny today.")
    pieces = [t for ch in "Sunny today." for t in enc(ch)]
    assert pieces != content_ids
    other_split = completion[: -len(content_ids) - 1] + pieces + completion[-1:]
    benign = reconstruct("s", REQUEST, response(message), fmt,
                         reference_completion_ids=other_split)
    assert benign.reference_match == "benign_bpe" and benign.status == "ok"
    changed = completion[: -len(content_ids) - 1] + enc("Rainy today.") + completion[-1:]
    text_diff = reconstruct("s", REQUEST, response(message), fmt,
                            reference_completion_ids=changed)
    assert text_diff.reference_match == "text_diff" and text_diff.status == "flagged"
    no_think_end = [t for t in completion if t != fmt.ids["</think>"]]
    special = reconstruct("s", REQUEST, response(message), fmt,
                          reference_completion_ids=no_think_end)
    assert special.reference_match == "special_diff" and special.status == "flagged"


@pytest.mark.parametrize(
    "request_fields, expected",
    [
        ({}, None),
        ({"reasoning": {"enabled": False}}, False),
        ({"reasoning": {"effort": "none"}}, False),
        ({"reasoning": {"effort": "high"}}, True),
        ({"reasoning": {"exclude": True}}, None),
        ({"chat_template_kwargs": {"thinking": False}}, False),
        ({"thinking": {"type": "disabled"}}, False),
        ({"thinking": {"type": "enabled"}}, True),
    ],
)
def test_thinking_mode_from_request(request_fields, expected):
    assert thinking_from_request(request_fields) is expected


def test_marker_strings_in_prose_are_settled_only_by_an_exact_count_with_known_counting(fmt):
    # Spelled in pieces, `<|tool_call_begin|>` and `<think>` are longer than their ids: a count
    # equal to the pieces' reading proves them text, once the stop token's counting is known.
    message = {"reasoning": "Think.", "content": 'Write "<|tool_call_begin|>" or <think> here.'}
    usage = exact_usage(fmt, REQUEST, message)
    known = ProviderTraits(counts_stop_token=True)
    sample = reconstruct("s", REQUEST, response(message, usage=usage), fmt, traits=known)
    assert sample.status == "ok" and "markers_in_text" in sample.flags
    assert fmt.ids["<think>"] not in sample.input_ids[sample.prompt_len:]
    # The stop token's counting unknown: one token of slack could be the marker's id.
    sample = reconstruct("s", REQUEST, response(message, usage=usage), fmt)
    assert sample.status == "flagged" and "markers_in_text" in sample.flags
    # A count the pieces do not fit: the marker may have been its id.
    short = {**usage, "completion_tokens": usage["completion_tokens"] - 3}
    sample = reconstruct("s", REQUEST, response(message, usage=short), fmt, traits=known)
    assert sample.status == "flagged" and "markers_in_text" in sample.flags


def test_marker_text_inside_structured_arguments_is_flagged(fmt):
    message = {"reasoning": "x", "content": None,
               "tool_calls": [call(args='{"city": "<|tool_call_end|>"}')]}
    sample = reconstruct("s", REQUEST, response(message, "tool_calls"), fmt)
    assert sample.status == "flagged" and "markers_in_text" in sample.flags


def test_id_naming_another_function_is_flagged(fmt):
    message = {"reasoning": "x", "content": None,
               "tool_calls": [call("functions.search_web:0")]}
    sample = reconstruct("s", REQUEST, response(message, "tool_calls"), fmt)
    assert sample.status == "flagged" and "tool_id_name_mismatch" in sample.flags
