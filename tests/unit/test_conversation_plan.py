"""The conversation plan and its walk (issue 10): literal expectations, no emulator."""

from __future__ import annotations

import pytest

from specregen.conversation import (
    Answer,
    ConversationError,
    Request,
    Stop,
    advance,
    answer_from_completion,
    answer_from_record,
    calls_match,
    conversation_answers,
    plan_conversation,
    request_id,
    sample_id,
)
from specregen.models.registry import get_format
from specregen.models.tokenizer import load_tokenizer
from specregen.records import Completion, Prompt, ToolCall

KIMI = get_format("kimi-k2.5", load_tokenizer("mini"))
QWEN = get_format("qwen3", load_tokenizer("mini-qwen3"))

SYSTEM = {"role": "system", "content": "You are helpful."}
U0 = {"role": "user", "content": "Weather in Paris and Rome?"}
U1 = {"role": "user", "content": "Thanks. And Oslo?"}


def call(cid: str, name: str, args: str) -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def tool(cid: str, content: str) -> dict:
    return {"role": "tool", "tool_call_id": cid, "content": content}


# The dataset: turn 0 = parallel calls, their results (given in the other order), a text
# answer; turn 1 = one call, its result, a text answer.
A00 = {"role": "assistant", "content": "",
       "tool_calls": [call("d1", "weather", '{"city": "Paris"}'),
                      call("d2", "weather", '{"city": "Rome"}')]}
A01 = {"role": "assistant", "content": "Paris 20C, Rome 25C."}
A10 = {"role": "assistant", "content": "", "tool_calls": [call("d3", "weather", '{"city":"Oslo"}')]}
A11 = {"role": "assistant", "content": "Oslo 5C."}
CONVERSATION = [SYSTEM, U0, A00, tool("d2", "rome: 25"), tool("d1", "paris: 20"), A01,
                U1, A10, tool("d3", "oslo: 5"), A11]
PROMPT = Prompt("conv-1", CONVERSATION, tools=[{"type": "function", "function": {
    "name": "weather", "parameters": {"type": "object"}}}], turns="all")
PLAN = plan_conversation(PROMPT)


def completion(content: str = "", calls: list[ToolCall] | None = None,
               reasoning: str | None = "thought", finish: str = "stop") -> Completion:
    return Completion(reasoning=reasoning, content=content, tool_calls=calls or [],
                      finish_reason="tool_calls" if calls and finish == "stop" else finish)


def kimi_answer(content: str = "", calls: list[ToolCall] | None = None, **kw) -> Answer:
    return answer_from_completion(completion(content, calls, **kw), KIMI, thinking=True)


def test_ids():
    assert request_id("c", 2, 1) == "c/t2/s1"
    assert sample_id("c", 2) == "c/t2"


def test_plan_splits_turns_steps_and_orders_results_by_call():
    assert PLAN.conversation_id == "conv-1"
    assert PLAN.prefix == [SYSTEM]
    assert [t.index for t in PLAN.turns] == [0, 1]
    assert PLAN.turns[0].user == [U0]
    steps = PLAN.turns[0].steps
    assert [s.message for s in steps] == [A00, A01]
    assert steps[0].calls == [ToolCall("d1", "weather", '{"city": "Paris"}'),
                              ToolCall("d2", "weather", '{"city": "Rome"}')]
    # results follow the calls' order, not the dataset's message order
    assert steps[0].results == [tool("d1", "paris: 20"), tool("d2", "rome: 25")]
    assert steps[1].calls == [] and steps[1].results == []
    assert PLAN.turns[1].user == [U1]
    assert PLAN.tools == PROMPT.tools and PLAN.tool_mode == "tools"


def test_plan_merges_consecutive_users_and_allows_a_trailing_unanswered_turn():
    plan = plan_conversation(Prompt("c", [U0, U1, A01, {"role": "user", "content": "more"}]))
    assert plan.prefix == []
    assert [t.user for t in plan.turns] == [[U0, U1], [{"role": "user", "content": "more"}]]
    assert [len(t.steps) for t in plan.turns] == [1, 0]


@pytest.mark.parametrize(("messages", "error"), [
    ([SYSTEM], "has no user message"),
    ([SYSTEM, A01, U0], r"messages\[1\] is an assistant message before the first user"),
    ([U0, tool("x", "1")], r"messages\[1\] is a tool message that answers no"),
    ([U0, A00, tool("d1", "1"), A01], r"messages\[1\] has 2 tool call\(s\) but 1 tool result"),
    ([U0, {"role": "critic", "content": "x"}], r"messages\[1\] has an unknown role 'critic'"),
])
def test_plan_errors_name_the_message(messages, error):
    with pytest.raises(ConversationError, match=error):
        plan_conversation(Prompt("bad", messages))


def test_calls_match_any_order_json_equal():
    d = [ToolCall("a", "f", '{"x": 1, "y": [1, 2]}'), ToolCall("b", "g", "{}"),
         ToolCall("c", "f", '{"x": 2}')]
    model = [ToolCall("m0", "f", '{"x":2}'), ToolCall("m1", "g", " {} "),
             ToolCall("m2", "f", '{"y":[1,2],"x":1}')]
    assert calls_match(model, d) == {0: 2, 1: 1, 2: 0}
    # equal calls pair in dataset order
    same = [ToolCall("a", "f", "{}"), ToolCall("b", "f", "{}")]
    assert calls_match([ToolCall("m0", "f", "{}"), ToolCall("m1", "f", "{ }")], same) == {
        0: 0, 1: 1}
    # a multiset, not a set: one call twice is not two different calls
    assert calls_match([ToolCall("m", "f", "{}"), ToolCall("n", "f", "{}")],
                       [ToolCall("a", "f", "{}"), ToolCall("b", "g", "{}")]) is None
    assert calls_match([ToolCall("m", "f", '{"x": 1}')], [ToolCall("a", "f", '{"x": 2}')]) is None
    assert calls_match([ToolCall("m", "g", "{}")], [ToolCall("a", "f", "{}")]) is None
    assert calls_match([], [ToolCall("a", "f", "{}")]) is None
    # not JSON: compared as text
    assert calls_match([ToolCall("m", "f", "{x")], [ToolCall("a", "f", "{x")]) == {0: 0}
    assert calls_match([ToolCall("m", "f", "{x")], [ToolCall("a", "f", "{x ")]) is None
    assert calls_match([], []) == {}


PARIS = ToolCall("functions.weather:0", "weather", '{"city":"Paris"}')
ROME = ToolCall("functions.weather:1", "weather", '{"city":"Rome"}')
OSLO = ToolCall("functions.weather:2", "weather", '{"city": "Oslo"}')


def test_walk_to_the_end_with_the_models_own_history_and_readdressed_results():
    first = advance(PLAN, [])
    assert first == Request(0, 0, [SYSTEM, U0])
    # the model calls in the other order than the dataset, with other spacing and its own ids
    a0 = kimi_answer("", [ROME, PARIS], reasoning="two cities")
    second = advance(PLAN, [a0])
    assert isinstance(second, Request) and (second.user_turn, second.step) == (0, 1)
    assert second.messages == [
        SYSTEM, U0,
        {"role": "assistant", "content": "", "reasoning": "two cities",
         "reasoning_content": "two cities",
         "tool_calls": [
             {"id": "functions.weather:1", "type": "function",
              "function": {"name": "weather", "arguments": '{"city":"Rome"}'}},
             {"id": "functions.weather:0", "type": "function",
              "function": {"name": "weather", "arguments": '{"city":"Paris"}'}}]},
        # the dataset's results, re-addressed to the model's ids, in the model's call order
        {"role": "tool", "tool_call_id": "functions.weather:1", "content": "rome: 25"},
        {"role": "tool", "tool_call_id": "functions.weather:0", "content": "paris: 20"},
    ]
    # the model's own text, not the dataset's "Paris 20C, Rome 25C."
    a1 = kimi_answer("It is warm in both.", reasoning="done")
    third = advance(PLAN, [a0, a1])
    assert isinstance(third, Request) and (third.user_turn, third.step) == (1, 0)
    assert third.messages[:5] == second.messages
    assert third.messages[5:] == [
        {"role": "assistant", "content": "It is warm in both.", "reasoning": "done",
         "reasoning_content": "done"},
        U1]
    a2 = kimi_answer("", [OSLO])
    a3 = kimi_answer("Cold.")
    fourth = advance(PLAN, [a0, a1, a2])
    assert isinstance(fourth, Request) and (fourth.user_turn, fourth.step) == (1, 1)
    assert fourth.messages[-1] == {"role": "tool", "tool_call_id": "functions.weather:2",
                                   "content": "oslo: 5"}
    assert advance(PLAN, [a0, a1, a2, a3]) == Stop("end", 2, 1, 1)
    with pytest.raises(ValueError, match="answers go on"):
        advance(PLAN, [a0, a1, a2, a3, a3])


@pytest.mark.parametrize(("answers", "stop"), [
    ([kimi_answer("", [PARIS])], Stop("calls_differ", 1, 0, 0)),
    ([kimi_answer("", [PARIS, ToolCall("x", "weather", '{"city":"Oslo"}')])],
     Stop("calls_differ", 1, 0, 0)),
    ([kimi_answer("no tools needed")], Stop("model_answered_dataset_called", 1, 0, 0)),
    ([kimi_answer("", [ROME, PARIS]), kimi_answer("", [OSLO])],
     Stop("model_called_dataset_answered", 1, 0, 1)),
    ([kimi_answer("", [ROME, PARIS]), kimi_answer("Warm", finish="length")],
     Stop("length", 1, 0, 1)),
    ([kimi_answer("", [PARIS, ROME]), kimi_answer("Warm."),
      Answer(message=None, finish_reason=None, failed=True)], Stop("error", 2, 1, 0)),
])
def test_each_stop_reason(answers, stop):
    assert advance(PLAN, answers) == stop


def test_model_calls_where_the_dataset_turn_has_no_more_steps():
    plan = plan_conversation(Prompt("c", [U0]))
    assert advance(plan, [kimi_answer("", [PARIS])]) == Stop(
        "model_called_dataset_answered", 1, 0, 0)
    assert advance(plan, [kimi_answer("hi")]) == Stop("end", 1, 0, 0)


def test_kimi_history_message():
    calls = [ToolCall("functions.f:0", "f", '{"a": 1}')]
    assert KIMI.history_message(completion("x", calls, reasoning="r"), thinking=True) == {
        "role": "assistant", "content": "x", "reasoning": "r", "reasoning_content": "r",
        "tool_calls": [{"id": "functions.f:0", "type": "function",
                        "function": {"name": "f", "arguments": '{"a": 1}'}}]}
    assert KIMI.history_message(completion("x", reasoning="r"), thinking=False) == {
        "role": "assistant", "content": "x"}
    # content None is sent as empty text (both render the same)
    none = Completion(reasoning="r", content=None, tool_calls=calls, finish_reason="tool_calls")
    assert KIMI.history_message(none, thinking=True)["content"] == ""
    # raw markers left in content by a provider become structured calls
    raw = ("Let me check.<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"
           '<|tool_call_argument_begin|>{"a": 1}<|tool_call_end|><|tool_calls_section_end|>')
    message = KIMI.history_message(completion(raw, reasoning="r"), thinking=True)
    assert message["content"] == "Let me check."
    assert message["tool_calls"] == [{"id": "functions.f:0", "type": "function",
                                      "function": {"name": "f", "arguments": '{"a": 1}'}}]


def test_qwen3_history_message():
    calls = [ToolCall("chatcmpl-tool-abc", "f", '{"a": 1}')]
    assert QWEN.history_message(completion("", calls, reasoning="r"), thinking=True) == {
        "role": "assistant", "content": "", "reasoning": "r", "reasoning_content": "r",
        "tool_calls": [{"id": "chatcmpl-tool-abc", "type": "function",
                        "function": {"name": "f", "arguments": '{"a": 1}'}}]}
    raw = 'Checking.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    message = QWEN.history_message(completion(raw, reasoning=None), thinking=True)
    assert message == {"role": "assistant", "content": "Checking.",
                       "tool_calls": [{"id": "call_0", "type": "function",
                                       "function": {"name": "f", "arguments": '{"a": 1}'}}]}
    # vLLM returns the separators around the text before the calls; the template writes them
    # back, so the history renders exactly what the model wrote
    served = completion("\n\nLet me check.\n", calls, reasoning="R")
    message = QWEN.history_message(served, thinking=True)
    assert message["content"] == "Let me check."
    wrote = ("<think>\nR\n</think>\n\nLet me check.\n"
             '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call><|im_end|>\n')
    rendered = QWEN.render_prompt([{"role": "user", "content": "q"}, message], None)
    assert rendered.endswith("<|im_start|>assistant\n" + wrote + "<|im_start|>assistant\n")
    assert QWEN.history_message(completion("\n\n", calls), thinking=True)["content"] == ""
    # a text answer keeps its text as it is
    assert QWEN.history_message(completion("\n\nHi\n"), thinking=True)["content"] == "\n\nHi\n"


def _record(rid: str, messages: list[dict], message: dict, status: str = "ok",
            finish: str = "stop") -> dict:
    return {"sample_id": rid, "fingerprint": "fp", "status": status, "final": True,
            "request": {"model": "m", "messages": messages},
            "response": {"choices": [{"message": message, "finish_reason": finish}],
                         "usage": {}}}


def test_replay_follows_the_logged_path_and_stops_at_the_first_gap():
    call_msg = {"role": "assistant", "content": "", "reasoning": "r", "reasoning_content": "r",
                "tool_calls": [
                    {"id": "functions.weather:0", "type": "function",
                     "function": {"name": "weather", "arguments": '{"city":"Paris"}'}},
                    {"id": "functions.weather:1", "type": "function",
                     "function": {"name": "weather", "arguments": '{"city":"Rome"}'}}]}
    finals = {"conv-1/t0/s0": _record("conv-1/t0/s0", [SYSTEM, U0], call_msg,
                                      finish="tool_calls")}
    answers = conversation_answers(PLAN, finals, KIMI)
    assert len(answers) == 1 and answers[0].calls == [PARIS, ROME]
    nxt = advance(PLAN, answers)
    assert isinstance(nxt, Request) and (nxt.user_turn, nxt.step) == (0, 1)
    # the next record only counts when it answers the messages this path asks
    text = {"role": "assistant", "content": "Warm.", "reasoning": "r2", "reasoning_content": "r2"}
    finals["conv-1/t0/s1"] = _record("conv-1/t0/s1", nxt.messages, text)
    assert len(conversation_answers(PLAN, finals, KIMI)) == 2
    finals["conv-1/t0/s1"] = _record("conv-1/t0/s1", nxt.messages[:-1], text)
    assert len(conversation_answers(PLAN, finals, KIMI)) == 1
    # a failed final record is an error answer: the walk stops there
    finals["conv-1/t0/s1"] = _record("conv-1/t0/s1", nxt.messages, text, status="failed")
    answers = conversation_answers(PLAN, finals, KIMI)
    assert advance(PLAN, answers) == Stop("error", 1, 0, 1)


def test_answer_from_record_reads_thinking_from_the_request():
    message = {"role": "assistant", "content": "hi", "reasoning_content": "r"}
    record = _record("c/t0/s0", [U0], message)
    record["request"]["chat_template_kwargs"] = {"thinking": False}
    assert answer_from_record(record, KIMI).message == {"role": "assistant", "content": "hi"}
    del record["request"]["chat_template_kwargs"]
    assert answer_from_record(record, KIMI).message == {
        "role": "assistant", "content": "hi", "reasoning": "r", "reasoning_content": "r"}
