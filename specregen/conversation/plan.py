"""A dataset conversation as a plan of requests, and the walk that picks the next one.

Pure functions over plain data (no I/O, no format knowledge beyond the history messages the
caller already built): the driver, the resume path and the samples builder all walk the same
plan with `advance`, so the stop reason of a conversation is recomputed, never stored.

A conversation is split into user turns. Turn k opens with its user message(s) and holds the
dataset's assistant steps: each assistant message is one step, and the tool messages after it
are the results of its calls. Request (k, j) asks the model for step j of turn k; its messages
are the prefix (system), every earlier turn with the MODEL's own answers (never the dataset's)
and the dataset's tool results re-addressed to the model's call ids, then turn k so far.

The rules after the model's answer at (k, j) (issue 10, item 2):

* `finish_reason == "length"` -> stop `length` (also when the request was never sent because
  the conversation outgrew the context: the engine records that refusal, replay reads it back as
  a `length` answer); a failed request -> stop `error`;
* model calls, dataset step j calls the same multiset (name, JSON-equal arguments; any order)
  -> the dataset's results, re-addressed and in the model's call order, then request (k, j+1);
* model calls, dataset calls others -> `calls_differ`; model calls where the dataset answered
  (its step j has no calls, or the dataset's turn has no step j) -> `model_called_dataset_answered`;
* model answers where the dataset called -> `model_answered_dataset_called`;
* model answers where the dataset answered (or has no step j) -> turn k is done: request
  (k+1, 0), or stop `end` after the last turn.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from specregen.errors import UsageError
from specregen.records import Completion, Prompt, ToolCall

StopReason = Literal[
    "calls_differ",
    "model_called_dataset_answered",
    "model_answered_dataset_called",
    "length",
    "error",
    "end",
]
STOP_REASONS: tuple[StopReason, ...] = (
    "end",
    "calls_differ",
    "model_called_dataset_answered",
    "model_answered_dataset_called",
    "length",
    "error",
)


class ConversationError(UsageError, ValueError):
    """A dataset conversation that cannot be regenerated turn by turn (names the message).

    `detail`: the problem without the conversation's id (a row reject names the row itself)."""

    def __init__(self, message: str, *, detail: str | None = None) -> None:
        super().__init__(message)
        self.detail = detail or message


@dataclass(frozen=True)
class DatasetStep:
    """One dataset assistant message of a user turn."""

    message: dict[str, Any]  # the assistant message as in the dataset
    calls: list[ToolCall]  # its tool calls ([] = a text answer)
    results: list[dict[str, Any]]  # the tool messages answering those calls, in call order


@dataclass(frozen=True)
class UserTurn:
    index: int  # k, counted from 0 over user turns
    user: list[dict[str, Any]]  # the user message(s) opening the turn
    steps: list[DatasetStep]  # the dataset's assistant steps in this turn


@dataclass(frozen=True)
class ConversationPlan:
    conversation_id: str
    prefix: list[dict[str, Any]]  # system message(s) before the first user turn
    turns: list[UserTurn]
    tools: list[dict[str, Any]] | None
    tool_mode: str


@dataclass(frozen=True)
class Answer:
    """The model's final answer to one request of a conversation.

    `message`: the answer as a history message (`ChatFormat.history_message`; None when the
    request failed); `record`: the raw-log record it came from, when it came from one.
    """

    message: dict[str, Any] | None
    finish_reason: str | None
    failed: bool = False
    completion: Completion | None = None
    record: dict[str, Any] | None = field(default=None, compare=False)

    @property
    def calls(self) -> list[ToolCall]:
        return message_calls(self.message) if self.message is not None else []


@dataclass(frozen=True)
class Request:
    """The next request of a conversation: ask for step `step` of user turn `user_turn`."""

    user_turn: int
    step: int
    messages: list[dict[str, Any]]


@dataclass(frozen=True)
class Stop:
    """The conversation is over: why, and how many user turns got at least one answer."""

    stop_reason: StopReason
    user_turns_reached: int
    user_turn: int  # where it stopped (the turn of the last answer)
    step: int


Next = Request | Stop


def request_id(conversation_id: str, user_turn: int, step: int) -> str:
    """The raw-log sample id of request (k, j) of a conversation."""
    return f"{conversation_id}/t{user_turn}/s{step}"


def sample_id(conversation_id: str, user_turn: int) -> str:
    """The TokenSample id of user turn k of a conversation."""
    return f"{conversation_id}/t{user_turn}"


# -- calls ---------------------------------------------------------------------------------------


def message_calls(message: dict[str, Any]) -> list[ToolCall]:
    """The tool calls of an assistant message in OpenAI shape (arguments kept as strings)."""
    calls = message.get("tool_calls")
    if not calls:
        return []
    out = []
    for n, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ConversationError(f"tool_calls[{n}] has no function name")
        args = fn.get("arguments")
        text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        call_id = call.get("id")
        out.append(ToolCall(id=call_id if isinstance(call_id, str) else "", name=fn["name"],
                            arguments=text))
    return out


_NOT_JSON = object()


def _arguments_key(arguments: str) -> Any:
    # JSON-equal arguments compare equal whatever their spacing or key order; text that is
    # not JSON compares as text.
    try:
        value = json.loads(arguments)
    except (json.JSONDecodeError, ValueError):
        return (_NOT_JSON, arguments)
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def calls_match(model: Sequence[ToolCall], dataset: Sequence[ToolCall]) -> dict[int, int] | None:
    """Model call i -> dataset call j when both are the same multiset of (name, JSON-equal
    arguments), in any order (equal calls pair up in order); None when they differ."""
    if len(model) != len(dataset):
        return None
    free: dict[tuple[str, Any], list[int]] = {}
    for j, call in enumerate(dataset):
        free.setdefault((call.name, _arguments_key(call.arguments)), []).append(j)
    mapping: dict[int, int] = {}
    for i, call in enumerate(model):
        slots = free.get((call.name, _arguments_key(call.arguments)))
        if not slots:
            return None
        mapping[i] = slots.pop(0)
    return mapping


def readdressed_results(step: DatasetStep, model: Sequence[ToolCall],
                        mapping: dict[int, int]) -> list[dict[str, Any]]:
    """The dataset's results of `step`, answering the model's calls (its ids, its order)."""
    out = []
    for i, call in enumerate(model):
        result = dict(step.results[mapping[i]])
        result["tool_call_id"] = call.id
        out.append(result)
    return out


# -- the plan ------------------------------------------------------------------------------------


def plan_conversation(prompt: Prompt) -> ConversationPlan:
    """Split `prompt.messages` (a whole conversation) into user turns and dataset steps."""
    messages = prompt.messages
    cid = prompt.sample_id
    prefix: list[dict[str, Any]] = []
    turns: list[UserTurn] = []
    user: list[dict[str, Any]] = []
    steps: list[DatasetStep] = []
    i = 0
    n = len(messages)

    def fail(index: int, why: str) -> ConversationError:
        detail = f"messages[{index}] {why}"
        return ConversationError(f"conversation {cid!r}: {detail}", detail=detail)

    while i < n:
        message = messages[i]
        role = message.get("role") if isinstance(message, dict) else None
        if role == "system" and not turns and not user:
            prefix.append(message)
        elif role in ("user", "system") and (user or turns):
            # A system message inside the conversation belongs to the turn it opens.
            if steps or not user:
                if user:
                    turns.append(UserTurn(len(turns), user, steps))
                user, steps = [], []
            user.append(message)
        elif role == "user":
            user.append(message)
        elif role == "assistant":
            if not user:
                raise fail(i, "is an assistant message before the first user message")
            try:
                calls = message_calls(message)
            except ConversationError as exc:
                raise fail(i, exc.detail) from None
            j = i + 1
            results: list[dict[str, Any]] = []
            while j < n and isinstance(messages[j], dict) and messages[j].get("role") == "tool":
                results.append(messages[j])
                j += 1
            if len(results) != len(calls):
                raise fail(i, f"has {len(calls)} tool call(s) but {len(results)} tool result(s)"
                              " follow it")
            steps.append(DatasetStep(message, calls, _results_in_call_order(calls, results)))
            i = j
            continue
        elif role == "tool":
            raise fail(i, "is a tool message that answers no assistant tool call")
        else:
            raise fail(i, f"has an unknown role {role!r}")
        i += 1
    if user:
        turns.append(UserTurn(len(turns), user, steps))
    if not turns:
        raise ConversationError(f"conversation {cid!r} has no user message",
                                detail="the conversation has no user message")
    return ConversationPlan(cid, prefix, turns, prompt.tools, prompt.tool_mode)


def _results_in_call_order(calls: list[ToolCall],
                           results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # Results that name their calls (tool_call_id) are put in call order; otherwise the
    # dataset's order is the calls' order.
    by_id = {r.get("tool_call_id"): r for r in results}
    ids = [c.id for c in calls]
    if all(ids) and len(set(ids)) == len(ids) and set(by_id) == set(ids):
        return [by_id[cid] for cid in ids]
    return list(results)


# -- the walk ------------------------------------------------------------------------------------


def advance(plan: ConversationPlan, answers: Sequence[Answer]) -> Next:
    """The next request after the model's final `answers` (in order), or why the walk stops."""
    turns = plan.turns
    k, j = 0, 0
    messages = [*plan.prefix, *turns[0].user]
    for n, answer in enumerate(answers):
        turn = turns[k]
        stop = _stop_reason(answer, turn, j)
        if stop is not None:
            if n != len(answers) - 1:
                raise ValueError(f"conversation {plan.conversation_id!r}: answers go on after "
                                 f"its stop at user turn {k}, step {j}")
            return Stop(stop, k + 1, k, j)
        assert answer.message is not None
        messages.append(answer.message)
        calls = answer.calls
        if calls:
            step = turn.steps[j]
            mapping = calls_match(calls, step.calls)
            assert mapping is not None
            messages.extend(readdressed_results(step, calls, mapping))
            j += 1
            continue
        if k + 1 == len(turns):
            if n != len(answers) - 1:
                raise ValueError(f"conversation {plan.conversation_id!r}: answers go on after "
                                 "its last user turn")
            return Stop("end", k + 1, k, j)
        k, j = k + 1, 0
        messages.extend(turns[k].user)
    return Request(k, j, messages)


def _stop_reason(answer: Answer, turn: UserTurn, j: int) -> StopReason | None:
    # `length` first: a request refused because the conversation outgrew the context has no
    # answer but stops with `length` (replay.CONTEXT_REFUSED), not `error`.
    if answer.finish_reason == "length":
        return "length"
    if answer.failed or answer.message is None:
        return "error"
    step = turn.steps[j] if j < len(turn.steps) else None
    dataset_calls = step.calls if step is not None else []
    calls = answer.calls
    if calls and not dataset_calls:
        return "model_called_dataset_answered"
    if not calls and dataset_calls:
        return "model_answered_dataset_called"
    if calls and calls_match(calls, dataset_calls) is None:
        return "calls_differ"
    return None
