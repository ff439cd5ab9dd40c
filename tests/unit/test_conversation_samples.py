"""Samples of whole conversations (issue 10, item 4): one per user turn, the loss mask 1 exactly
on what the model wrote in that turn, `history_rerendered` when a server re-rendered an earlier
answer, and the columns that say which conversation and turn a sample is.

The conversations here are walked with the plan (`advance`) the way the driver walks them; the
responses are literal (K2.5, OpenRouter shape) or the Qwen3 served side's (the emulator's vLLM
side, written independently of the format's assembly). Expectations are literal texts.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from specregen.conversation.plan import Request, advance, plan_conversation, request_id
from specregen.conversation.replay import answer_from_completion, failed_answer
from specregen.conversation.samples import conversation_samples, locate_answers
from specregen.models.kimi_k25 import KimiK25, serverside
from specregen.models.registry import get_format
from specregen.models.tokenizer import load_tokenizer
from specregen.records import Prompt, ProviderTraits
from specregen.store.token_samples import SCHEMA, read_token_samples, write_token_samples
from specregen.wire.response import normalize_response
from tests.support import get_tokenizer

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


@pytest.fixture(scope="module")
def k25() -> KimiK25:
    return KimiK25(get_tokenizer("mini"))


@pytest.fixture(scope="module")
def qwen3():
    return get_format("qwen3", load_tokenizer("mini-qwen3"))


def tool_call(call_id: str, arguments: str, name: str = "get_weather") -> dict:
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": arguments}}


def weather_conversation(paris: str = '{"city": "Paris"}', rome: str = '{"city": "Rome"}',
                         cid: str = "c1") -> Prompt:
    """Two user turns, each a call, its result and a text answer (the dataset's)."""
    return Prompt(cid, [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [tool_call("x1", paris)]},
        {"role": "tool", "tool_call_id": "x1", "content": "18C"},
        {"role": "assistant", "content": "It is 18C in Paris."},
        {"role": "user", "content": "And in Rome?"},
        {"role": "assistant", "content": "", "tool_calls": [tool_call("x2", rome)]},
        {"role": "tool", "tool_call_id": "x2", "content": "25C"},
        {"role": "assistant", "content": "25C in Rome."},
    ], [WEATHER], turns="all")


def kimi_answer(reasoning: str, content: str | None = None, calls=(), finish=None,
                usage: dict | None = None) -> dict:
    message = {"role": "assistant", "reasoning": reasoning, "content": content}
    if calls:
        message["tool_calls"] = list(calls)
    body = {"choices": [{"message": message,
                         "finish_reason": finish or ("tool_calls" if calls else "stop")}]}
    if usage:
        body["usage"] = usage
    return body


def walk(plan, fmt, respond):
    """Walk the conversation like the driver: `respond(body, k, j)` gives the response body
    (None: the request failed for good). Returns the final records by request id."""
    answers, finals = [], {}
    while isinstance(nxt := advance(plan, answers), Request):
        rid = request_id(plan.conversation_id, nxt.user_turn, nxt.step)
        body = {"model": "m", "messages": nxt.messages, "tools": plan.tools}
        response = respond(body, nxt.user_turn, nxt.step)
        record = {"sample_id": rid, "request": body, "response": response, "final": True,
                  "status": "ok" if response is not None else "failed",
                  "conversation": {"id": plan.conversation_id, "user_turn": nxt.user_turn,
                                   "step": nxt.step}}
        finals[rid] = record
        if response is None:
            answers.append(failed_answer(record))
        else:
            answers.append(answer_from_completion(normalize_response(response), fmt,
                                                  thinking=True, record=record))
    return finals


def masked_runs(sample, tok) -> list[str]:
    """The texts under each run of 1s in the loss mask."""
    runs, start = [], None
    for i, bit in enumerate([*sample.loss_mask, 0]):
        if bit and start is None:
            start = i
        elif not bit and start is not None:
            runs.append(tok.decode(sample.input_ids[start:i]))
            start = None
    return runs


def before_runs(sample, tok) -> list[str]:
    """The token just before each run of 1s."""
    return [tok.decode([sample.input_ids[i - 1]]) for i in range(1, len(sample.loss_mask))
            if sample.loss_mask[i] and not sample.loss_mask[i - 1]]


K25_ANSWERS = {
    (0, 0): kimi_answer("User wants Paris weather.", None,
                        [tool_call("functions.get_weather:0", '{"city": "Paris"}')]),
    (0, 1): kimi_answer("Got it.", "It is 18C in Paris."),
    (1, 0): kimi_answer("Now Rome.", None,
                        [tool_call("functions.get_weather:1", '{"city": "Rome"}')]),
    (1, 1): kimi_answer("Done.", "25C in Rome."),
}
CALL_PARIS = ("<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
              '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|>'
              "<|tool_calls_section_end|><|im_end|>")
CALL_ROME = CALL_PARIS.replace(":0", ":1").replace("Paris", "Rome")


def test_k25_one_sample_per_user_turn_masked_on_every_answer_of_the_turn(k25):
    plan = plan_conversation(weather_conversation())
    finals = walk(plan, k25, lambda body, k, j: K25_ANSWERS[(k, j)])
    samples = conversation_samples(plan, finals, k25)

    assert [s.sample_id for s in samples] == ["c1/t0", "c1/t1"]
    assert [(s.conversation_id, s.user_turn, s.stop_reason) for s in samples] == [
        ("c1", 0, "end"), ("c1", 1, "end")]
    t0, t1 = samples
    assert "history_rerendered" not in t0.flags + t1.flags
    assert masked_runs(t0, k25.tok) == [
        "User wants Paris weather.</think>" + CALL_PARIS,
        "Got it.</think>It is 18C in Paris.<|im_end|>"]
    assert masked_runs(t1, k25.tok) == [
        "Now Rome.</think>" + CALL_ROME,
        "Done.</think>25C in Rome.<|im_end|>"]
    # The prefilled `<think>` opens each answer and stays 0.
    assert before_runs(t0, k25.tok) == before_runs(t1, k25.tok) == ["<think>", "<think>"]
    # Turn 0 is history in turn 1's sample, its reasoning dropped (K2.5's rule), and unmasked.
    unmasked = k25.tok.decode([t for t, m in zip(t1.input_ids, t1.loss_mask, strict=True)
                               if not m])
    assert "<think></think>It is 18C in Paris.<|im_end|>" in unmasked
    assert "## Return of functions.get_weather:1\n25C<|im_end|>" in unmasked
    assert "Got it." not in k25.tok.decode(t1.input_ids)
    # The ids are the last request's prompt plus its completion.
    assert t1.completion_len == len(k25.tok.encode_ordinary("Done.")) + 1 + len(
        k25.tok.encode_ordinary("25C in Rome.")) + 1
    assert t1.messages == finals["c1/t1/s1"]["request"]["messages"]
    # Records without their `conversation` field (another writer) are placed by the walk.
    bare = {rid: {k: v for k, v in r.items() if k != "conversation"} for rid, r in finals.items()}
    assert conversation_samples(plan, bare, k25) == samples


def test_qwen3_masks_follow_its_history_rule(qwen3):
    from specregen.models.qwen3.served import make_server

    server = make_server(qwen3.tok)
    script = {(0, 0): ("User wants Paris weather.", "", [("get_weather", {"city": "Paris"})]),
              (0, 1): ("Got it.", "It is 18C in Paris.", []),
              (1, 0): ("Now Rome.", "", [("get_weather", {"city": "Rome"})]),
              (1, 1): ("Done.", "25C in Rome.", [])}

    def respond(body, k, j):
        reasoning, content, calls = script[(k, j)]
        served = server.answer(body, reasoning=reasoning, content=content, calls=calls)
        message = {"role": "assistant", "reasoning": served.reasoning,
                   "content": served.content}
        if served.calls:
            message["tool_calls"] = [tool_call(f"chatcmpl-tool-{k}{j}{'0' * 30}", args, name)
                                     for name, args in served.calls]
        return {"choices": [{"message": message, "finish_reason": served.finish_reason}],
                "usage": {"prompt_tokens": len(served.prompt_ids),
                          "completion_tokens": len(served.ids)}}

    plan = plan_conversation(weather_conversation())
    samples = conversation_samples(plan, walk(plan, qwen3, respond), qwen3)
    t0, t1 = samples
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "%s"}}\n</tool_call>'
    assert masked_runs(t0, qwen3.tok) == [
        "<think>\nUser wants Paris weather.\n</think>\n\n" + call % "Paris" + "<|im_end|>",
        "<think>\nGot it.\n</think>\n\nIt is 18C in Paris.<|im_end|>"]
    assert masked_runs(t1, qwen3.tok) == [
        "<think>\nNow Rome.\n</think>\n\n" + call % "Rome" + "<|im_end|>",
        "<think>\nDone.\n</think>\n\n25C in Rome.<|im_end|>"]
    assert before_runs(t1, qwen3.tok) == ["\n", "\n"]  # `<|im_start|>assistant\n` stays 0
    # Qwen3 keeps reasoning only after the last user query: turn 0 lost it in turn 1's prompt.
    text = qwen3.tok.decode(t1.input_ids)
    assert "User wants Paris weather." not in text and "Got it." not in text
    # (vLLM returned the content with the "\n\n" after `</think>`; the history sends it back.)
    assert "<|im_start|>assistant\n\n\nIt is 18C in Paris.<|im_end|>" in text
    # Every request's prompt count is the server's: nothing flagged, the counts prove the ids.
    assert [(s.status, s.usage_prompt_delta) for s in samples] == [("ok", 0), ("ok", 0)]
    assert all("history_rerendered" not in s.flags for s in samples)


def test_vllm_reserialized_history_arguments_are_flagged_and_left_unmasked(k25):
    # The model wrote compact arguments; vLLM parses history arguments and dumps them again
    # (`{"city": "Paris"}`), so the model never saw its own call in the last request's prompt.
    compact = '{"city":"Paris"}'

    def respond(body, k, j):
        if (k, j) == (0, 0):
            return kimi_answer("User wants Paris weather.", None,
                               [tool_call("functions.get_weather:0", compact)])
        prompt = serverside.encode_prompt("vllm", body, k25.tok, thinking=True)
        return kimi_answer("Got it.", "It is 18C in Paris.",
                           usage={"prompt_tokens": len(prompt), "completion_tokens": 10})

    prompt = weather_conversation(paris=compact)
    plan = replace(plan_conversation(prompt), turns=plan_conversation(prompt).turns[:1])
    (t0,) = conversation_samples(plan, walk(plan, k25, respond), k25)
    assert t0.usage_prompt_delta == 0  # the vLLM rendering was picked by the count
    assert t0.status == "flagged" and "history_rerendered" in t0.flags
    assert masked_runs(t0, k25.tok) == ["Got it.</think>It is 18C in Paris.<|im_end|>"]
    assert '{"city": "Paris"}' in k25.tok.decode(t0.input_ids[: t0.prompt_len])


def test_sglang_renumbered_history_ids_are_flagged(k25):
    # SGLang rebuilds ids as functions.NAME:{history + index}: the model's `:1` after one
    # earlier call comes back `:2`, and the next request's history carries `:2`.
    def respond(body, k, j):
        if (k, j) == (1, 0):
            return kimi_answer("Now Rome.", None,
                               [tool_call("functions.get_weather:2", '{"city": "Rome"}')])
        return K25_ANSWERS[(k, j)]

    plan = plan_conversation(weather_conversation())
    traits = ProviderTraits(renumbers_tool_ids=True)
    t0, t1 = conversation_samples(plan, walk(plan, k25, respond), k25, traits=traits)
    assert "history_rerendered" not in t0.flags
    assert t1.status == "flagged" and "history_rerendered" in t1.flags
    assert masked_runs(t1, k25.tok) == ["Done.</think>25C in Rome.<|im_end|>"]
    assert "functions.get_weather:2" in k25.tok.decode(t1.input_ids[: t1.prompt_len])


def test_a_diverging_or_failing_conversation_keeps_the_turns_it_reached(k25):
    # Turn 1: the model asks about another city than the dataset did -> calls_differ.
    def differ(body, k, j):
        if (k, j) == (1, 0):
            return kimi_answer("Now Oslo.", None,
                               [tool_call("functions.get_weather:1", '{"city": "Oslo"}')])
        return K25_ANSWERS[(k, j)]

    plan = plan_conversation(weather_conversation())
    t0, t1 = conversation_samples(plan, walk(plan, k25, differ), k25)
    assert (t0.stop_reason, t1.stop_reason) == ("calls_differ", "calls_differ")
    assert masked_runs(t1, k25.tok) == [
        "Now Oslo.</think>" + CALL_ROME.replace("Rome", "Oslo")]

    # Turn 0, step 1 failed for good: the turn's sample ends at the answer before it.
    def fail(body, k, j):
        return None if (k, j) == (0, 1) else K25_ANSWERS[(k, j)]

    (t0,) = conversation_samples(plan, walk(plan, k25, fail), k25)
    assert (t0.sample_id, t0.stop_reason) == ("c1/t0", "error")
    assert masked_runs(t0, k25.tok) == ["User wants Paris weather.</think>" + CALL_PARIS]

    # Nothing answered yet: no sample, and a missing record leaves the conversation open.
    assert conversation_samples(plan, {}, k25) == []
    finals = walk(plan, k25, lambda body, k, j: K25_ANSWERS[(k, j)])
    del finals["c1/t1/s1"]
    t0, t1 = conversation_samples(plan, finals, k25)
    assert (t0.stop_reason, t1.stop_reason) == (None, None)
    assert masked_runs(t1, k25.tok) == ["Now Rome.</think>" + CALL_ROME]


def test_answers_are_looked_for_where_the_rendering_puts_them():
    # (own prompt, completion): found where the own prompt stops agreeing with the last one.
    last = [1, 2, 3, 10, 11, 12, 4, 5, 20, 21, 6]
    assert locate_answers(last, [([1, 2, 3], [10, 11, 12]), ([1, 2, 3, 10, 11, 12, 4, 5],
                                                             [20, 21])]) == [3, 8]
    # A generation prompt that the history rendering drops (an empty think block) is allowed.
    assert locate_answers(last, [([1, 2, 3, 99, 98], [10, 11, 12])]) == [3]
    # Not where it belongs: not found, even though the ids occur elsewhere.
    assert locate_answers([1, 2, 3, 7, 10, 11], [([1, 2, 3], [10, 11])]) == [None]
    assert locate_answers(last, [([1, 2, 3], [10, 11, 13])]) == [None]


def test_conversation_columns_round_trip_and_older_files_read(k25, tmp_path):
    plan = plan_conversation(weather_conversation())
    samples = conversation_samples(
        plan, walk(plan, k25, lambda body, k, j: K25_ANSWERS[(k, j)]), k25)
    path = tmp_path / "tokens.parquet"
    write_token_samples(samples, path)
    back = list(read_token_samples(path))
    assert back == samples
    table = pq.read_table(path, columns=["sample_id", "conversation_id", "user_turn",
                                         "stop_reason"])
    assert table.to_pylist() == [
        {"sample_id": "c1/t0", "conversation_id": "c1", "user_turn": 0, "stop_reason": "end"},
        {"sample_id": "c1/t1", "conversation_id": "c1", "user_turn": 1, "stop_reason": "end"}]
    # A file written before the columns existed still reads, as single-turn samples.
    old = pa.schema([f for f in SCHEMA if f.name not in ("conversation_id", "user_turn",
                                                         "stop_reason")])
    rows = [{k: v for k, v in r.items() if k in old.names}
            for r in pq.read_table(path).to_pylist()]
    pq.write_table(pa.Table.from_pylist(rows, schema=old), tmp_path / "old.parquet")
    first = next(read_token_samples(tmp_path / "old.parquet"))
    assert (first.conversation_id, first.user_turn, first.stop_reason) == (None, None, None)
    assert first.loss_mask == samples[0].loss_mask


def test_gate_checks_the_calls_of_the_turns_earlier_answers(k25):
    from specregen.gate import GateConfig, check_sample

    # The dataset and the model both call with an argument the schema does not know.
    bad = '{"town": "Paris"}'

    def respond(body, k, j):
        if (k, j) == (0, 0):
            return kimi_answer("User wants Paris weather.", None,
                               [tool_call("functions.get_weather:0", bad)])
        return K25_ANSWERS[(k, j)]

    prompt = weather_conversation(paris=bad)
    plan = plan_conversation(prompt)
    t0, t1 = conversation_samples(plan, walk(plan, k25, respond), k25)
    decision = check_sample(t0, k25, GateConfig())
    schema = [r for r in decision.reasons if r.check == "arguments_schema"]
    assert len(schema) == 1 and schema[0].detail.startswith(
        "history answer messages[2]: call 0 (get_weather): ")
    assert "'city' is a required property" in schema[0].detail
    # Turn 1's sample holds that call as an earlier TURN's history: not its own to check.
    assert not [r for r in check_sample(t1, k25, GateConfig()).reasons
                if r.check == "arguments_schema"]
    # The same messages in a single-turn sample are the dataset's, never checked.
    single = replace(t0, conversation_id=None, user_turn=None, stop_reason=None)
    assert not [r for r in check_sample(single, k25, GateConfig()).reasons
                if r.check == "arguments_schema"]


def test_gate_checks_history_ids_with_the_running_count(k25):
    from specregen.gate import GateConfig, check_sample

    # Turn 1's call numbered as if turn 0 had none: `:0` where `:1` is due.
    def respond(body, k, j):
        if (k, j) == (1, 0):
            return kimi_answer("Now Rome.", None,
                               [tool_call("functions.get_weather:0", '{"city": "Rome"}')])
        return K25_ANSWERS[(k, j)]

    plan = plan_conversation(weather_conversation())
    _, t1 = conversation_samples(plan, walk(plan, k25, respond), k25)
    ids = [r for r in check_sample(t1, k25, GateConfig()).reasons if r.check == "tool_id_form"]
    assert [r.detail for r in ids] == [
        "history answer messages[6]: call 0: id 'functions.get_weather:0' has index 0, "
        "expected 1 (1 earlier call(s) in the conversation)"]


def test_gate_report_counts_conversations_by_how_they_ended(k25):
    from specregen.gate import GateConfig, run_gate
    from specregen.report import collect, render_report

    plan = plan_conversation(weather_conversation())
    t0, t1 = conversation_samples(
        plan, walk(plan, k25, lambda body, k, j: K25_ANSWERS[(k, j)]), k25)
    samples = [t0, t1,
               replace(t0, sample_id="c2/t0", conversation_id="c2", stop_reason="calls_differ"),
               replace(t0, sample_id="c3/t0", conversation_id="c3", stop_reason="calls_differ"),
               replace(t0, sample_id="c3/t1", conversation_id="c3", user_turn=1,
                       stop_reason="calls_differ"),
               replace(t0, sample_id="c4/t0", conversation_id="c4", stop_reason=None),
               replace(t0, sample_id="single", conversation_id=None, user_turn=None,
                       stop_reason=None)]
    report = run_gate(samples, k25, GateConfig(max_quarantine_share=1.0), dataset="D")
    conv = report.conversations
    assert {k: conv[k] for k in ("conversations", "ended", "stopped", "unfinished",
                                 "by_stop_reason", "user_turns", "samples")} == {
        "conversations": 4, "ended": 1, "stopped": 2, "unfinished": 1,
        "by_stop_reason": {"end": 1, "calls_differ": 2, "unfinished": 1},
        "user_turns": {"1": 2, "2": 2}, "samples": 6}
    # Calls of the turns' earlier answers count in the tool table: one per conversation sample.
    # (These literal answers carry no `usage`: their readings are ambiguous, all quarantined.)
    assert report.totals["history_tool_calls"] == 6
    assert report.by_tool == [{"name": "get_weather", "calls": 6, "quarantined": 6}]
    md = report.to_markdown()
    assert "## Conversations" in md
    assert "| regenerated to the end | 1 | 25.00% |" in md
    assert "| `calls_differ` | 2 | 50.00% |" in md
    assert "| 2 | 2 | 50.00% |" in md
    page = render_report(collect("D", json.loads(report.to_json()), [], k25.tok))
    assert "Conversations by how they ended" in page and "User turns reached" in page
    assert "conversations regenerated to the end" in page
    # A dataset without conversations says nothing about them.
    plain = run_gate(samples[-1:], k25, GateConfig(max_quarantine_share=1.0), dataset="D")
    assert plain.conversations is None and "## Conversations" not in plain.to_markdown()


def test_exports_keep_the_turns_masks_and_name_the_trained_messages(k25):
    from specregen.export.rows import ExportContext, messages_row, train_row

    plan = plan_conversation(weather_conversation())
    t0, t1 = conversation_samples(
        plan, walk(plan, k25, lambda body, k, j: K25_ANSWERS[(k, j)]), k25)
    ctx = ExportContext(dataset="D", format="kimi-k2.5", tokenizer="mini",
                        tokenizer_fingerprint="f")
    row = train_row(t1, ctx, k25.tok.decode(t1.input_ids))
    assert row["loss_mask"] == t1.loss_mask and sum(row["loss_mask"]) > t1.completion_len
    assert {k: row["metadata"][k] for k in ("conversation_id", "user_turn", "stop_reason")} == {
        "conversation_id": "c1", "user_turn": 1, "stop_reason": "end"}
    messages = messages_row(t1)
    roles = [m["role"] for m in messages["conversations"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user", "assistant",
                     "tool", "assistant"]
    # Turn 1's answers: the call at 6 and the final text at 8 (turn 0's are history).
    assert messages["trained_messages"] == [6, 8]
    assert messages["conversations"][6]["reasoning_content"] == "Now Rome."
    assert messages["conversations"][8]["content"] == "25C in Rome."
    assert messages_row(t0)["trained_messages"] == [2, 4]
    single = replace(t1, conversation_id=None)
    assert messages_row(single)["trained_messages"] == [8]


def test_an_earlier_answer_that_cannot_be_rebuilt_leaves_its_span_unmasked(k25):
    # A provider said `finish_reason: error` on an answer that still carried its call, and the
    # conversation went on with it: reconstruction refuses that answer on its own.
    def respond(body, k, j):
        if (k, j) == (0, 0):
            return kimi_answer("User wants Paris weather.", None,
                               [tool_call("functions.get_weather:0", '{"city": "Paris"}')],
                               finish="error")
        return K25_ANSWERS[(k, j)]

    plan = plan_conversation(weather_conversation())
    t0, _ = conversation_samples(plan, walk(plan, k25, respond), k25)
    assert t0.status == "flagged" and "history_unreconstructed" in t0.flags
    assert masked_runs(t0, k25.tok) == ["Got it.</think>It is 18C in Paris.<|im_end|>"]
