"""Reconstruction against what the real server parsers do (docs/upstream-parsers.md).

Each case starts from what the model wrote, builds its true ids here by hand (segment texts
encoded one by one, special ids read from the tokenizer's table by name), renders the response
the way the upstream parser returns it, and checks that reconstruction either gives the true ids
back with the evidence that proves them, or does not call the sample `ok`.
"""

from __future__ import annotations

import copy

import pytest

from specregen.reconstruct import reconstruct
from specregen.records import ProviderTraits

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
USER = {"role": "user", "content": "Weather in Paris?"}
REQUEST = {"model": "kimi-k2.5", "messages": [SYSTEM, USER], "tools": TOOLS}
ARGS = '{"city": "Paris"}'
# What a probe finds for vLLM's kimi_k2 parsers: ids as written, `(no content)` deleted, the stop
# token counted, a section opened inside the reasoning left in the reasoning text.
VLLM = ProviderTraits(renumbers_tool_ids=False, deletes_no_content=True, counts_stop_token=True,
                      ends_reasoning_at_tools=False)
# SGLang with forced reasoning: ids rebuilt, nothing deleted, the section ends the reasoning.
SGLANG = ProviderTraits(renumbers_tool_ids=True, deletes_no_content=False, counts_stop_token=True,
                        ends_reasoning_at_tools=True)


def true_ids(fmt, *, reasoning=None, think_end=True, content="", calls=(), stop=True):
    """The completion as the model wrote it: `R </think> C [section] <|im_end|>`."""
    sp = fmt.tok.added_tokens
    enc = fmt.tok.encode_ordinary
    ids = []
    if reasoning is not None:
        ids += enc(reasoning)
        if think_end:
            ids.append(sp["</think>"])
    ids += enc(content)
    if calls:
        ids.append(sp["<|tool_calls_section_begin|>"])
        for call_id, args in calls:
            ids.append(sp["<|tool_call_begin|>"])
            ids += enc(call_id)
            ids.append(sp["<|tool_call_argument_begin|>"])
            ids += enc(args)
            ids.append(sp["<|tool_call_end|>"])
        ids.append(sp["<|tool_calls_section_end|>"])
    if stop:
        ids.append(sp["<|im_end|>"])
    return ids


def prompt_ids(fmt, text):
    return fmt.tok.encode_with_specials(text)


def tool_declaration(fmt):
    # The declaration block is the same in every case here; the renderer's own parity tests
    # cover it, these cases are about what follows it.
    return fmt.render_prompt([USER], TOOLS).split("<|im_system|>system")[0]


def base_prompt(fmt, *, thinking=True, tools=True):
    text = tool_declaration(fmt) if tools else ""
    text += "<|im_system|>system<|im_middle|>You are a helpful assistant.<|im_end|>"
    text += "<|im_user|>user<|im_middle|>Weather in Paris?<|im_end|>"
    text += "<|im_assistant|>assistant<|im_middle|>" + ("<think>" if thinking else
                                                         "<think></think>")
    return prompt_ids(fmt, text)


def body(message, finish="stop", usage=None):
    return {"choices": [{"index": 0, "message": {"role": "assistant", **message},
                         "finish_reason": finish}], "usage": usage or {}}


def call(call_id="functions.get_weather:0", args=ARGS):
    return {"id": call_id, "type": "function",
            "function": {"name": "get_weather", "arguments": args}}


def usage_of(prompt, completion):
    return {"prompt_tokens": len(prompt), "completion_tokens": len(completion)}


def completion_of(sample):
    return sample.input_ids[sample.prompt_len :]


# -- 1. vLLM deletes the `(no content)` placeholder -------------------------------------------


def test_deleted_no_content_placeholder_is_restored(fmt):
    truth = true_ids(fmt, reasoning="Need weather.", content="(no content)",
                     calls=[("functions.get_weather:0", ARGS)])
    prompt = base_prompt(fmt)
    message = {"reasoning": "Need weather.", "content": None, "tool_calls": [call()]}
    response = body(message, "tool_calls", usage_of(prompt, truth))
    sample = reconstruct("s", REQUEST, response, fmt, traits=VLLM)
    assert completion_of(sample) == truth
    assert sample.input_ids[: sample.prompt_len] == prompt
    assert "no_content_restored" in sample.flags and sample.content == "(no content)"
    assert sample.evidence == "usage_exact"
    # The count equals the restored reading, but the reading without it plus a few tokens a
    # parser dropped unseen (or split non-canonically) counts the same: not proof.
    assert sample.status == "flagged" and "reading_ambiguous" in sample.flags
    # The server's own ids are.
    proven = reconstruct("s", REQUEST, response, fmt, traits=VLLM,
                         reference_completion_ids=truth)
    assert completion_of(proven) == truth and proven.status == "ok"
    assert "no_content_restored" in proven.flags and proven.evidence == "reference"


def test_deleted_whitespace_content_is_not_ok(fmt):
    # The model wrote a newline before its calls; vLLM returned null content.
    truth = true_ids(fmt, reasoning="Need weather.", content="\n",
                     calls=[("functions.get_weather:0", ARGS)])
    message = {"reasoning": "Need weather.", "content": None, "tool_calls": [call()]}
    sample = reconstruct("s", REQUEST,
                         body(message, "tool_calls", usage_of(base_prompt(fmt), truth)), fmt)
    assert completion_of(sample) != truth
    assert sample.status == "flagged" and "completion_count_inexact" in sample.flags


def test_provider_that_keeps_content_gets_no_restoration(fmt):
    truth = true_ids(fmt, reasoning="Need weather.", calls=[("functions.get_weather:0", ARGS)])
    message = {"reasoning": "Need weather.", "content": None, "tool_calls": [call()]}
    traits = ProviderTraits(renumbers_tool_ids=False, deletes_no_content=False,
                            counts_stop_token=True, ends_reasoning_at_tools=False)
    sample = reconstruct("s", REQUEST,
                         body(message, "tool_calls", usage_of(base_prompt(fmt), truth)), fmt,
                         traits=traits)
    assert completion_of(sample) == truth and sample.evidence == "usage_exact"
    assert sample.status == "ok" and "no_content_restored" not in sample.flags


# -- 2. SGLang rebuilds ids as functions.{name}:{history + index} -----------------------------


HISTORY = [
    SYSTEM,
    USER,
    {"role": "assistant", "content": "", "tool_calls": [call("functions.get_weather:0"),
                                                        call("functions.get_weather:1")]},
    {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "rain"},
    {"role": "tool", "tool_call_id": "functions.get_weather:1", "content": "sun"},
    {"role": "user", "content": "And in Rome?"},
]


def history_request(**extra):
    return {"model": "kimi-k2.5", "messages": copy.deepcopy(HISTORY), "tools": TOOLS, **extra}


def test_sglang_double_counted_ids_are_undone_when_the_probe_says_so(fmt):
    # The model wrote the running count (2); SGLang returned history + 2 = 4.
    truth = true_ids(fmt, reasoning="Rome now.", content="Checking.",
                     calls=[("functions.get_weather:2", ARGS)])
    request = history_request()
    prompt = fmt.encode_prompt(request["messages"], TOOLS)
    message = {"reasoning_content": "Rome now.", "content": "Checking.",
               "tool_calls": [call("functions.get_weather:4")]}
    response = body(message, "tool_calls", usage_of(prompt, truth))
    sample = reconstruct("s", request, response, fmt, traits=SGLANG)
    assert completion_of(sample) == truth
    assert "tool_id_renumbered" in sample.flags
    assert sample.tool_calls[0].id == "functions.get_weather:2"
    assert sample.status == "ok" and sample.evidence == "usage_exact"


def test_unexpected_index_without_a_probe_is_flagged(fmt):
    request = history_request()
    message = {"reasoning_content": "Rome now.", "content": "",
               "tool_calls": [call("functions.get_weather:4")]}
    sample = reconstruct("s", request, body(message, "tool_calls"), fmt)
    assert sample.status == "flagged" and "tool_id_index_unexpected" in sample.flags


def test_streamed_sglang_ids_are_the_running_count_and_kept(fmt):
    truth = true_ids(fmt, reasoning="Rome now.", calls=[("functions.get_weather:2", ARGS)])
    request = history_request(stream=True)
    prompt = fmt.encode_prompt(request["messages"], TOOLS)
    message = {"reasoning_content": "Rome now.", "content": "",
               "tool_calls": [call("functions.get_weather:2")]}
    sample = reconstruct("s", request, body(message, "tool_calls", usage_of(prompt, truth)),
                         fmt, traits=SGLANG, reference_completion_ids=truth)
    assert completion_of(sample) == truth and sample.status == "ok"
    assert "tool_id_renumbered" not in sample.flags


def test_bare_name_id_turned_canonical_is_not_ok(fmt):
    # The history shows bare ids, so the model may write one: `get_weather:1`, which SGLang
    # returns as `functions.get_weather:{1 + 1}`.
    history = [SYSTEM, USER,
               {"role": "assistant", "content": "", "tool_calls": [call("get_weather:0")]},
               {"role": "tool", "tool_call_id": "get_weather:0", "content": "rain"},
               {"role": "user", "content": "And in Rome?"}]
    request = {"model": "kimi-k2.5", "messages": history, "tools": TOOLS}
    prompt = fmt.encode_prompt(history, TOOLS)
    truth = true_ids(fmt, reasoning="Go.", calls=[("get_weather:1", ARGS)])
    message = {"reasoning_content": "Go.", "content": "",
               "tool_calls": [call("functions.get_weather:2")]}
    response = body(message, "tool_calls", usage_of(prompt, truth))
    sample = reconstruct("s", request, response, fmt, traits=SGLANG)
    # `functions.` may cost one token, as does a `</think>`: the count cannot tell the bare id
    # from a section opened inside the reasoning plus a dropped token -- or it picks the bare id.
    assert sample.status == "flagged" or completion_of(sample) == truth
    assert completion_of(sample) == truth or "reading_ambiguous" in sample.flags
    proven = reconstruct("s", request, response, fmt, traits=SGLANG,
                         reference_completion_ids=truth)
    assert proven.status == "ok" and "tool_id_prefix_restored" in proven.flags


# -- 3. SGLang reasoning: unsplit without forcing; a section closes forced reasoning ----------


def test_unsplit_reasoning_is_split_at_the_first_think_end(fmt):
    truth = true_ids(fmt, reasoning="Think it over.", content="It is sunny.")
    request = {**REQUEST, "tools": None}
    prompt = base_prompt(fmt, tools=False)
    message = {"content": "Think it over.</think>It is sunny."}
    sample = reconstruct("s", request, body(message, "stop", usage_of(prompt, truth)), fmt)
    assert completion_of(sample) == truth
    assert sample.status == "ok" and "reasoning_unsplit" in sample.flags
    assert sample.reasoning == "Think it over." and sample.content == "It is sunny."


def test_unsplit_answer_with_a_literal_think_end_in_code_is_proven_by_the_count(fmt):
    # The model's reasoning closed with the real token; its answer quotes "</think>" as text.
    content = 'Use tag = "</think>" here.'
    truth = true_ids(fmt, reasoning="Plan.", content=content)
    request = {**REQUEST, "tools": None}
    message = {"content": "Plan.</think>" + content}
    response = body(message, "stop", usage_of(base_prompt(fmt, tools=False), truth))
    counted = ProviderTraits(counts_stop_token=True)
    sample = reconstruct("s", request, response, fmt, traits=counted)
    assert completion_of(sample) == truth and sample.status == "ok"
    # "</think>" as text may cost only one token more than the marker (the real vocabulary
    # merges ".</"); a provider whose counting of the stop token is unknown leaves that in doubt.
    enc = fmt.tok.encode_ordinary
    if len(enc("Plan.</think>")) == len(enc("Plan.")) + 1:
        assert reconstruct("s", request, response, fmt).status == "flagged"


def test_section_before_think_end_in_forced_reasoning_gets_no_think_end(fmt):
    # The model opened its tool section while still reasoning; the parser ended the reasoning
    # there (SGLang forced; vLLM's later kimi_k2 rewrite too).
    truth = true_ids(fmt, reasoning="I will call it.", think_end=False,
                     calls=[("functions.get_weather:0", ARGS)])
    message = {"reasoning_content": "I will call it.", "content": "", "tool_calls": [call()]}
    response = body(message, "tool_calls", usage_of(base_prompt(fmt), truth))
    # The count singles the reading without `</think>` out.
    sample = reconstruct("s", REQUEST, response, fmt, traits=SGLANG)
    assert completion_of(sample) == truth
    assert sample.status == "ok" and sample.evidence == "usage_exact"
    assert "tool_calls_in_reasoning" in sample.flags
    # Had the model closed its reasoning first (what its template shows), the count picks that
    # reading. Its rival, the reading without `</think>` plus one token a parser dropped or a
    # sampler split, needs two independent rare events: not a doubt (docs/evidence.md).
    closed = true_ids(fmt, reasoning="I will call it.", calls=[("functions.get_weather:0", ARGS)])
    response = body(message, "tool_calls", usage_of(base_prompt(fmt), closed))
    sample = reconstruct("s", REQUEST, response, fmt, traits=SGLANG)
    assert completion_of(sample) == closed
    assert sample.status == "ok" and sample.evidence == "usage_exact"
    assert "tool_calls_in_reasoning" not in sample.flags
    # A provider whose parser leaves such a section in the reasoning has no such doubt.
    sample = reconstruct("s", REQUEST, response, fmt, traits=VLLM)
    assert completion_of(sample) == closed and sample.status == "ok"


def test_raw_section_that_ended_forced_reasoning_is_proven_by_the_count(fmt):
    # Tools declared in the system prompt: no tool parser runs, SGLang's forced reasoning ends
    # at the section and returns it raw in `content`. Nothing is trimmed: the count proves it.
    raw = ("<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
           f"<|tool_call_argument_begin|>{ARGS}<|tool_call_end|><|tool_calls_section_end|>")
    truth = true_ids(fmt, reasoning="I will call it.", think_end=False,
                     calls=[("functions.get_weather:0", ARGS)])
    request = {**REQUEST, "tools": None}
    message = {"reasoning_content": "I will call it.", "content": raw}
    response = body(message, "stop", usage_of(base_prompt(fmt, tools=False), truth))
    sample = reconstruct("s", request, response, fmt, traits=SGLANG)
    assert completion_of(sample) == truth
    assert sample.status == "ok" and sample.evidence == "usage_exact"
    assert {"tool_calls_in_reasoning", "tool_calls_in_content"} <= set(sample.flags)
    # Had the model closed its reasoning first, the count picks that reading; the reading
    # without `</think>` needs a dropped token as well (two coincidences), so it is no doubt.
    closed = true_ids(fmt, reasoning="I will call it.", calls=[("functions.get_weather:0", ARGS)])
    response = body(message, "stop", usage_of(base_prompt(fmt, tools=False), closed))
    sample = reconstruct("s", request, response, fmt, traits=SGLANG)
    assert completion_of(sample) == closed
    assert sample.status == "ok" and sample.evidence == "usage_exact"
    # One token more than the closed reading fits no reading: a loss, flagged.
    response = body(message, "stop", {**usage_of(base_prompt(fmt, tools=False), closed),
                                       "completion_tokens": len(closed) + 1})
    assert reconstruct("s", request, response, fmt, traits=SGLANG).status == "flagged"


def test_section_before_think_end_without_counts_is_not_ok(fmt):
    message = {"reasoning_content": "I will call it.", "content": "", "tool_calls": [call()]}
    sample = reconstruct("s", REQUEST, body(message, "tool_calls"), fmt)
    assert sample.status == "flagged" and "reading_ambiguous" in sample.flags
    assert sample.evidence == "none"


# -- 4. Trimming and text after the section end: only counts show it -------------------------


@pytest.mark.parametrize(
    "written_id, written_args, after",
    [
        (" functions.get_weather:0 ", ARGS, ""),
        ("functions.get_weather:0", "\n" + ARGS + "\n", ""),
        ("functions.get_weather:0", ARGS, " ok"),
    ],
)
def test_text_the_tool_parser_dropped_is_not_ok(fmt, written_id, written_args, after):
    truth = true_ids(fmt, reasoning="Go.", calls=[(written_id, written_args)], stop=False)
    truth += [*fmt.tok.encode_ordinary(after), fmt.tok.added_tokens["<|im_end|>"]]
    message = {"reasoning": "Go.", "content": None,
               "tool_calls": [call(written_id.strip(), written_args.strip())]}
    sample = reconstruct("s", REQUEST,
                         body(message, "tool_calls", usage_of(base_prompt(fmt), truth)), fmt)
    assert completion_of(sample) != truth
    assert sample.status == "flagged"


# -- 5. vLLM's kimi_k25 reasoning parser calls an instant answer reasoning ------------------


def test_instant_answer_returned_as_reasoning_is_rebuilt_as_content(fmt):
    request = {**REQUEST, "tools": None, "chat_template_kwargs": {"thinking": False}}
    truth = true_ids(fmt, content="It is sunny.")
    prompt = base_prompt(fmt, thinking=False, tools=False)
    message = {"reasoning": "It is sunny.", "content": None}
    sample = reconstruct("s", request, body(message, "stop", usage_of(prompt, truth)), fmt)
    assert sample.input_ids[: sample.prompt_len] == prompt
    assert completion_of(sample) == truth
    assert sample.status == "ok" and "reasoning_relabeled" in sample.flags
    assert sample.thinking is False and sample.content == "It is sunny."


def test_instant_answer_with_calls_returned_as_reasoning(fmt):
    request = {**REQUEST, "chat_template_kwargs": {"thinking": False}}
    truth = true_ids(fmt, content="Checking.", calls=[("functions.get_weather:0", ARGS)])
    raw = ("Checking.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
           f"<|tool_call_argument_begin|>{ARGS}<|tool_call_end|><|tool_calls_section_end|>")
    prompt = base_prompt(fmt, thinking=False)
    sample = reconstruct("s", request,
                         body({"reasoning": raw, "content": None}, "stop",
                              usage_of(prompt, truth)), fmt)
    assert completion_of(sample) == truth and sample.input_ids[: sample.prompt_len] == prompt
    assert sample.status == "ok"


def test_server_that_really_reasoned_in_instant_mode_is_still_flagged(fmt):
    request = {**REQUEST, "tools": None, "chat_template_kwargs": {"thinking": False}}
    truth = true_ids(fmt, reasoning="Hmm.", content="Sunny.")
    prompt = base_prompt(fmt, thinking=True, tools=False)
    message = {"reasoning": "Hmm.", "content": "Sunny."}
    sample = reconstruct("s", request, body(message, "stop", usage_of(prompt, truth)), fmt)
    assert completion_of(sample) == truth
    assert sample.status == "flagged" and "thinking_mode_mismatch" in sample.flags


# -- 6. Prompt rendering of null fields and re-serialised history arguments ------------------


def test_tool_result_without_id_and_call_without_id_render_empty(fmt):
    messages = [
        USER,
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": ARGS}}]},
        {"role": "tool", "content": "rain"},
    ]
    text = fmt.render_prompt(messages, None)
    assert "<|tool_call_begin|><|tool_call_argument_begin|>" in text
    assert "## Return of \nrain<|im_end|>" in text
    assert "None" not in text


def test_null_suffix_reasoning_rendered_as_none_is_picked_by_the_prompt_count(fmt):
    messages = [
        USER,
        {"role": "assistant", "reasoning_content": None, "content": "",
         "tool_calls": [call()]},
        {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "rain"},
    ]
    request = {"model": "kimi-k2.5", "messages": messages}
    head = ("<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot "
            "AI.<|im_end|><|im_user|>user<|im_middle|>Weather in Paris?<|im_end|>"
            "<|im_assistant|>assistant<|im_middle|><think>REASONING</think>"
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
            f"<|tool_call_argument_begin|>{ARGS}<|tool_call_end|><|tool_calls_section_end|>"
            "<|im_end|><|im_system|>tool<|im_middle|>## Return of functions.get_weather:0\n"
            "rain<|im_end|><|im_assistant|>assistant<|im_middle|><think>")
    empty = prompt_ids(fmt, head.replace("REASONING", ""))
    none = prompt_ids(fmt, head.replace("REASONING", "None"))
    truth = true_ids(fmt, reasoning="Rain.", content="It rains.")
    message = {"reasoning": "Rain.", "content": "It rains."}
    for server_prompt in (empty, none):
        sample = reconstruct("s", request, body(message, "stop", usage_of(server_prompt, truth)),
                             fmt)
        assert sample.input_ids[: sample.prompt_len] == server_prompt
        assert sample.status == "ok", sample.flags
    unknown = reconstruct("s", request, body(message, "stop"), fmt)
    assert unknown.status == "flagged" and "prompt_uncertain" in unknown.flags


def test_reserialised_history_arguments_are_picked_by_the_prompt_count(fmt):
    sent = '{"city":"Paris","days":2}'
    messages = [USER, {"role": "assistant", "content": "", "tool_calls": [call(args=sent)]},
                {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "rain"}]
    request = {"model": "kimi-k2.5", "messages": messages}
    head = ("<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot "
            "AI.<|im_end|><|im_user|>user<|im_middle|>Weather in Paris?<|im_end|>"
            "<|im_assistant|>assistant<|im_middle|><think></think>"
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
            "<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>"
            "<|im_end|><|im_system|>tool<|im_middle|>## Return of functions.get_weather:0\n"
            "rain<|im_end|><|im_assistant|>assistant<|im_middle|><think>")
    dumped = prompt_ids(fmt, head.replace("{}", '{"city": "Paris", "days": 2}'))
    verbatim = prompt_ids(fmt, head.replace("{}", sent))
    assert len(dumped) != len(verbatim)
    truth = true_ids(fmt, reasoning="Rain.", content="It rains.")
    message = {"reasoning": "Rain.", "content": "It rains."}
    for server_prompt in (dumped, verbatim):
        sample = reconstruct("s", request, body(message, "stop", usage_of(server_prompt, truth)),
                             fmt)
        assert sample.input_ids[: sample.prompt_len] == server_prompt
        assert sample.status == "ok", sample.flags
    unknown = reconstruct("s", request, body(message, "stop"), fmt)
    assert unknown.status == "flagged" and "prompt_uncertain" in unknown.flags


# -- Reference ids settle ambiguity; counts settle readings ---------------------------------


def test_exact_reference_ids_settle_literal_marker_text(fmt):
    content = 'if s.startswith("<|tool_call_begin|>"):'
    truth = true_ids(fmt, reasoning="Code.", content=content)
    request = {**REQUEST, "tools": None}
    message = {"reasoning": "Code.", "content": content}
    sample = reconstruct("s", request, body(message), fmt, reference_completion_ids=truth)
    assert "markers_in_text" in sample.flags
    assert sample.status == "ok" and sample.evidence == "reference"
    without = reconstruct("s", request, body(message), fmt)
    assert without.status == "flagged" and without.evidence == "none"


def test_count_confirms_a_missing_reasoning_was_empty(fmt):
    truth = true_ids(fmt, reasoning="", content="Sunny.")
    request = {**REQUEST, "tools": None}
    prompt = base_prompt(fmt, tools=False)
    sample = reconstruct("s", request, body({"content": "Sunny."}, "stop",
                                            usage_of(prompt, truth)), fmt)
    assert completion_of(sample) == truth
    assert "reasoning_missing" in sample.flags and sample.status == "ok"
    dropped = {**usage_of(prompt, truth), "completion_tokens": len(truth) + 30}
    assert reconstruct("s", request, body({"content": "Sunny."}, "stop", dropped),
                       fmt).status == "flagged"


def test_evidence_levels(fmt):
    request = {**REQUEST, "tools": None, "chat_template_kwargs": {"thinking": False}}
    truth = true_ids(fmt, content="Sunny.")
    prompt = base_prompt(fmt, thinking=False, tools=False)
    message = {"content": "Sunny."}
    exact = reconstruct("s", request, body(message, "stop", usage_of(prompt, truth)), fmt)
    assert exact.evidence == "usage_exact" and exact.status == "ok"
    near = {**usage_of(prompt, truth), "completion_tokens": len(truth) + 1}
    tolerated = reconstruct("s", request, body(message, "stop", near), fmt)
    assert tolerated.evidence == "usage_tolerated" and tolerated.status == "ok"
    assert reconstruct("s", request, body(message), fmt).evidence == "none"
    ref = reconstruct("s", request, body(message), fmt, reference_completion_ids=truth)
    assert ref.evidence == "reference"
    far = {**usage_of(prompt, truth), "completion_tokens": len(truth) + 40}
    assert reconstruct("s", request, body(message, "stop", far), fmt).status == "flagged"
    # A provider that does not count the stop token reports one less.
    uncounted = {**usage_of(prompt, truth), "completion_tokens": len(truth) - 1}
    sample = reconstruct("s", request, body(message, "stop", uncounted), fmt,
                         traits=ProviderTraits(counts_stop_token=False))
    assert sample.evidence == "usage_exact"


# -- Streams and the server's own prompt ids -------------------------------------------------


def test_streamed_content_next_to_calls_is_ambiguous(fmt):
    # Streamed, the tool parsers send text after the section as content too: "Done." may have
    # stood before the section or after it, and both count the same.
    before = true_ids(fmt, reasoning="Go.", content="Done.",
                      calls=[("functions.get_weather:0", ARGS)])
    message = {"reasoning": "Go.", "content": "Done.", "tool_calls": [call()]}
    request = {**REQUEST, "stream": True}
    response = body(message, "tool_calls", usage_of(base_prompt(fmt), before))
    sample = reconstruct("s", request, response, fmt, traits=VLLM)
    assert completion_of(sample) == before
    assert sample.status == "flagged" and "reading_ambiguous" in sample.flags
    assert reconstruct("s", request, response, fmt, traits=VLLM,
                       reference_completion_ids=before).status == "ok"


def test_streamed_instant_answer_gets_no_tolerance(fmt):
    # vLLM's content filter drops whitespace-only deltas of a stream: one token short is a loss.
    request = {**REQUEST, "tools": None, "chat_template_kwargs": {"thinking": False}}
    truth = true_ids(fmt, content="Sunny.\n\n  ")
    prompt = base_prompt(fmt, thinking=False, tools=False)
    message = {"content": "Sunny.\n\n"}  # the last delta, "  ", dropped
    usage = usage_of(prompt, truth)
    assert reconstruct("s", request, body(message, "stop", usage), fmt).status == "ok"
    streamed = reconstruct("s", {**request, "stream": True}, body(message, "stop", usage), fmt)
    assert streamed.status == "flagged" and "completion_count_inexact" in streamed.flags


def test_server_prompt_ids_settle_the_rendering(fmt):
    messages = [USER, {"role": "assistant", "content": "", "tool_calls": [call()]},
                {"role": "tool", "content": "rain"}]  # no tool_call_id: two renderings
    request = {"model": "kimi-k2.5", "messages": messages}
    head = ("<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot "
            "AI.<|im_end|><|im_user|>user<|im_middle|>Weather in Paris?<|im_end|>"
            "<|im_assistant|>assistant<|im_middle|><think></think>"
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
            f"<|tool_call_argument_begin|>{ARGS}<|tool_call_end|><|tool_calls_section_end|>"
            "<|im_end|><|im_system|>tool<|im_middle|>## Return of ID\nrain<|im_end|>"
            "<|im_assistant|>assistant<|im_middle|><think>")
    truth = true_ids(fmt, reasoning="Rain.", content="It rains.")
    message = {"reasoning": "Rain.", "content": "It rains."}
    for rendered in ("", "None"):
        server = prompt_ids(fmt, head.replace("ID", rendered))
        response = body(message, "stop", usage_of(server, truth))
        response["prompt_token_ids"] = server
        sample = reconstruct("s", request, response, fmt)
        assert sample.input_ids[: sample.prompt_len] == server
        assert "prompt_uncertain" not in sample.flags and sample.status == "ok"
    # A rendering we do not know: the server's ids are kept, and said so.
    other = prompt_ids(fmt, head.replace("ID", "call_1"))
    sample = reconstruct("s", request, body(message, "stop", usage_of(other, truth)), fmt,
                         reference_prompt_ids=other)
    assert sample.input_ids[: sample.prompt_len] == other
    assert "prompt_from_reference" in sample.flags and sample.status == "ok"


# -- Where a stream put the content; answers cut by `max_tokens` -----------------------------


def sse_body(deltas, finish, usage):
    """The body the client's stream assembler builds from these deltas, in this order."""
    import json

    from specregen.wire.stream import assemble_lines

    chunks = [{"choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    chunks.append({"choices": [], "usage": usage})
    lines = [line for c in chunks for line in (f"data: {json.dumps(c)}", "")]
    assembled, done = assemble_lines([*lines, "data: [DONE]", ""])
    assert done
    return assembled


def call_delta(index=0, call_id="functions.get_weather:0", args=ARGS):
    return {"tool_calls": [{"index": index, "id": call_id, "type": "function",
                            "function": {"name": "get_weather", "arguments": args}}]}


def streamed_call(index=0, call_id="functions.get_weather:0", args=ARGS):
    """A call as vLLM's and SGLang's stream parsers send it: opened, then its arguments."""
    half = len(args) // 2
    return [call_delta(index, call_id, ""),
            {"tool_calls": [{"index": index, "function": {"arguments": args[:half]}}]},
            {"tool_calls": [{"index": index, "function": {"arguments": args[half:]}}]}]


def test_streamed_content_before_the_first_call_is_placed_by_the_stream(fmt):
    # The client's assembler notes where the content deltas fell against the calls' deltas:
    # content that all came before the first call was written before the section.
    truth = true_ids(fmt, reasoning="Go.", content="Done.",
                     calls=[("functions.get_weather:0", ARGS)])
    request = {**REQUEST, "stream": True}
    usage = usage_of(base_prompt(fmt), truth)
    before = sse_body([{"reasoning": "Go."}, {"content": "Do"}, {"content": "ne."},
                       *streamed_call()], "tool_calls", usage)
    assert before["choices"][0]["specregen_stream"] == {"content_at_calls": [5],
                                                        "call_fragments": [3]}
    sample = reconstruct("s", request, before, fmt, traits=VLLM)
    assert completion_of(sample) == truth
    assert sample.status == "ok" and sample.evidence == "usage_exact"
    # Only for a server whose stream parser sends calls as it parses them (vLLM, SGLang): a
    # provider nobody probed may parse at the end and send all content first; a call sent
    # whole in one delta suggests just that.
    assert reconstruct("s", request, before, fmt).status == "flagged"
    whole = sse_body([{"reasoning": "Go."}, {"content": "Done."}, call_delta()],
                     "tool_calls", usage)
    assert whole["choices"][0]["specregen_stream"]["call_fragments"] == [1]
    assert reconstruct("s", request, whole, fmt, traits=VLLM).status == "flagged"
    # Content that came after a call's delta was written after the section (or between its
    # calls): where exactly, no count tells.
    after = sse_body([{"reasoning": "Go."}, *streamed_call(), {"content": "Done."}],
                     "tool_calls", usage)
    assert after["choices"][0]["specregen_stream"]["content_at_calls"] == [0]
    sample = reconstruct("s", request, after, fmt, traits=VLLM)
    assert sample.status == "flagged" and "reading_ambiguous" in sample.flags
    # Two calls, text between them: one offset per call, in call order.
    between = sse_body([{"content": "A"}, *streamed_call(0), {"content": "\n"},
                        *streamed_call(1, "functions.get_weather:1")], "tool_calls", usage)
    assert between["choices"][0]["specregen_stream"] == {"content_at_calls": [1, 2],
                                                         "call_fragments": [3, 3]}
    # A record that does not fit the answer is no record.
    broken = copy.deepcopy(before)
    broken["choices"][0]["specregen_stream"]["content_at_calls"] = [99]
    assert reconstruct("s", request, broken, fmt, traits=VLLM).status == "flagged"


def test_cut_answer_with_parsed_calls_is_not_ok(fmt):
    # Cut two tokens after its first call: the parser returns the whole call and drops the cut
    # one; the rebuilt section end and stop count the same as the cut call's first two ids.
    sp = fmt.tok.added_tokens
    whole = true_ids(fmt, reasoning="Go.", calls=[("functions.get_weather:0", ARGS)])
    truth = whole[:-2] + [sp["<|tool_call_begin|>"], *fmt.tok.encode_ordinary("functions")][:2]
    message = {"reasoning": "Go.", "content": None, "tool_calls": [call()]}
    # vLLM says `tool_calls` after a `length` stop when a call came back: only the count
    # reaching `max_tokens` shows the cut.
    request = {**REQUEST, "max_tokens": len(truth)}
    response = body(message, "tool_calls", usage_of(base_prompt(fmt), truth))
    sample = reconstruct("s", request, response, fmt, traits=VLLM)
    assert sample.status == "flagged" and "max_tokens_reached" in sample.flags
    # Said `length`: cut one token after the call, the next call's begin marker counts the same
    # as the section end a rebuild would put there.
    cut = [*whole[:-2], sp["<|tool_call_begin|>"]]
    sample = reconstruct("s", {**REQUEST, "max_tokens": len(cut)},
                         body(message, "length", usage_of(base_prompt(fmt), cut)), fmt, traits=VLLM)
    assert len(completion_of(sample)) == len(cut) and completion_of(sample) != cut
    assert sample.status == "flagged" and "reading_ambiguous" in sample.flags
    # A natural stop below the limit is not in doubt.
    roomy = {**REQUEST, "max_tokens": len(whole) + 1}
    sample = reconstruct("s", roomy, body(message, "tool_calls", usage_of(base_prompt(fmt), whole)),
                         fmt, traits=VLLM)
    assert sample.status == "ok" and completion_of(sample) == whole


def _token_with_a_cut_character(fmt):
    """(text, token): `text` encodes to ids ending in one token of bytes B, and `token` is a
    token of B plus the first bytes of a character (what a server's detokenizer holds back)."""
    tok = fmt.tok
    by_bytes = {}
    for token_id in range(tok.base_vocab_size):
        by_bytes.setdefault(tok.decode_bytes([token_id]), token_id)
    for data, token_id in by_bytes.items():
        for cut in (1, 2, 3):
            head, tail = data[:-cut], data[-cut:]
            if not head or tail[0] < 0xC0 or (tail[0] < 0xE0 and cut >= 2) or (
                    tail[0] < 0xF0 and cut >= 3):
                continue
            try:
                visible = head.decode("utf-8")
            except UnicodeDecodeError:
                continue
            text = "Answer:\n" + visible
            ids = tok.encode_ordinary(text)
            if tok.decode_bytes(ids[-1:]) == head:
                return text, [*ids[:-1], token_id]
    raise AssertionError(f"no token with a cut character in {tok.name}")


def test_cut_inside_a_character_is_not_ok(fmt):
    # The last token of a cut answer holds the first bytes of a character, which the server
    # never sent: the text shows one token less of it, with the same count.
    text, truth = _token_with_a_cut_character(fmt)
    request = {**REQUEST, "tools": None, "chat_template_kwargs": {"thinking": False}}
    prompt = base_prompt(fmt, thinking=False, tools=False)
    response = body({"content": text}, "length", usage_of(prompt, truth))
    sample = reconstruct("s", request, response, fmt)
    assert completion_of(sample) != truth and len(completion_of(sample)) == len(truth)
    assert sample.status == "flagged" and "truncated_tail_unknown" in sample.flags
    # A token of only such bytes adds one to the count: a cut answer gets no tolerance.
    shown = fmt.tok.encode_ordinary("Answer: yes.")
    extra = {"prompt_tokens": len(prompt), "completion_tokens": len(shown) + 1}
    plain = reconstruct("s", request, body({"content": "Answer: yes."}, "length", extra), fmt)
    assert completion_of(plain) == shown
    assert plain.status == "flagged" and "completion_count_inexact" in plain.flags
    # With the server's own ids the difference shows.
    with_ids = reconstruct("s", request, response, fmt, reference_completion_ids=truth)
    assert with_ids.status == "flagged" and "reference_text_diff" in with_ids.flags
