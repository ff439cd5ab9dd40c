"""A conversation's path rebuilt from the raw log's final records.

The raw log holds one final record per request of a conversation (sample_id =
`request_id(cid, k, j)`). Walking the plan with `advance` over those records gives back the
answers the conversation's path is made of, in order, up to the first request without a final
record: the driver resumes there after a crash, and the samples builder reads the same path.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from specregen.conversation.plan import Answer, ConversationPlan, Request, advance, request_id
from specregen.models.chat_format import ChatFormat
from specregen.records import Completion
from specregen.wire.response import ResponseError, normalize_response

FINAL_ANSWER = ("ok", "truncated")
# The `error_class` of the final record written for a request of a conversation that was never
# sent because it no longer fits the model's context (prompt + max_tokens): the conversation
# stops there with `length`. Recorded, not recomputed, so every rerun and the samples reach the
# same stop without the context check (or its tokenizer) at hand.
CONTEXT_REFUSED = "context_length"


def answer_from_completion(completion: Completion, fmt: ChatFormat, *, thinking: bool,
                           record: dict[str, Any] | None = None) -> Answer:
    """The model's answer as the conversation goes on with it (its history message)."""
    return Answer(
        message=fmt.history_message(completion, thinking=thinking),
        finish_reason=completion.finish_reason,
        completion=completion,
        record=record,
    )


def failed_answer(record: dict[str, Any] | None = None) -> Answer:
    return Answer(message=None, finish_reason=None, failed=True, record=record)


def refused_answer(record: dict[str, Any] | None = None) -> Answer:
    """A request never sent because the conversation outgrew the context: no answer, and the
    conversation stops with `length`."""
    return Answer(message=None, finish_reason="length", failed=True, record=record)


def is_context_refusal(record: dict[str, Any]) -> bool:
    return record.get("status") == "failed" and record.get("error_class") == CONTEXT_REFUSED


def answer_from_record(record: dict[str, Any], fmt: ChatFormat, *,
                       thinking: bool | None = None) -> Answer:
    """A final raw-log record as an Answer: a failed request, a request refused by the
    context check (`length`), or the response's answer.

    `thinking` None reads the mode from the record's request (the format's default, on, when
    the request is silent).
    """
    if is_context_refusal(record):
        return refused_answer(record)
    response = record.get("response")
    if record.get("status") not in FINAL_ANSWER or not isinstance(response, dict):
        return failed_answer(record)
    try:
        completion = normalize_response(response)
    except ResponseError:
        return failed_answer(record)
    if thinking is None:
        request = record.get("request")
        asked = fmt.thinking_requested(request) if isinstance(request, dict) else None
        thinking = True if asked is None else asked
    return answer_from_completion(completion, fmt, thinking=thinking, record=record)


def conversation_answers(
    plan: ConversationPlan,
    finals: Mapping[str, dict[str, Any]],
    fmt: ChatFormat,
    *,
    thinking: bool | None = None,
    accept: Callable[[Request, dict[str, Any]], bool] | None = None,
) -> list[Answer]:
    """The answers of the conversation's path, in order, from final records keyed by request id.

    A record belongs to the path only when its request's messages are the ones the path asks
    for (an answer to another history is not this conversation's); `accept(request, record)`
    may narrow further (e.g. to today's request fingerprint). Stops at the first request
    without such a record, or where the conversation stops.
    """
    answers: list[Answer] = []
    while True:
        nxt = advance(plan, answers)
        if not isinstance(nxt, Request):
            return answers
        record = finals.get(request_id(plan.conversation_id, nxt.user_turn, nxt.step))
        if record is None or not _same_messages(record, nxt.messages):
            return answers
        if accept is not None and not accept(nxt, record):
            return answers
        answers.append(answer_from_record(record, fmt, thinking=thinking))


def _same_messages(record: dict[str, Any], messages: list[dict[str, Any]]) -> bool:
    request = record.get("request")
    return isinstance(request, dict) and request.get("messages") == messages
