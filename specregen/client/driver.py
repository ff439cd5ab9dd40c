"""What the inference engine needs to run whole conversations: state, next request, resume.

The engine (client/engine.py) sends requests; this module decides which. A conversation is a
`ConversationState` (its plan and the model's final answers so far). `next_step` walks the plan
from there: each request's body is built and fingerprinted exactly as a single-turn prompt's,
and when the raw log of an earlier run already holds a final record for that (request id,
fingerprint) the record's answer is taken instead of paying again -- which is the whole resume:
a rerun rebuilds every conversation's path from the final records and goes on at its first
request without one. Since the body holds the model's earlier answers, the fingerprint covers
them, and a record answering another history never matches. A request that no longer fits the
context is not sent: its final record (`replay.CONTEXT_REFUSED`) stops the conversation with
`length`, in this run and every rerun (`--retry-failed` checks it again, e.g. after raising
the context limit).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from specregen.client.config import EndpointConfig
from specregen.client.request import build_request
from specregen.conversation.plan import (
    Answer,
    ConversationPlan,
    Request,
    Stop,
    advance,
    plan_conversation,
    request_id,
)
from specregen.conversation.replay import (
    CONTEXT_REFUSED,
    FINAL_ANSWER,
    answer_from_record,
    refused_answer,
)
from specregen.models.chat_format import ChatFormat
from specregen.records import Prompt
from specregen.wire.request import request_fingerprint


def history_format(format_name: str, tokenizer: str | None = None) -> ChatFormat:
    """The chat format that turns the model's answers into history messages. That needs the
    format's parsing, not its ids: without a tokenizer at hand, the format's bundled one (its
    real added tokens over a small vocabulary) does."""
    from specregen.models.registry import bundled_tokenizer, canonical_name, get_format
    from specregen.models.tokenizer import load_tokenizer

    name = canonical_name(format_name)
    return get_format(name, load_tokenizer(tokenizer or bundled_tokenizer(name) or "mini"))


@dataclass
class ConversationState:
    plan: ConversationPlan
    answers: list[Answer] = field(default_factory=list)

    @property
    def conversation_id(self) -> str:
        return self.plan.conversation_id


@dataclass
class Step:
    """The next request of a conversation, ready to send."""

    state: ConversationState
    request: Request
    prompt: Prompt  # sample_id = request_id(cid, k, j), messages = the request's messages
    body: dict[str, Any]
    fingerprint: str

    @property
    def conversation(self) -> dict[str, Any]:
        """The raw-log record's `conversation` field."""
        return {"id": self.state.conversation_id, "user_turn": self.request.user_turn,
                "step": self.request.step}


class ConversationDriver:
    """Conversation bookkeeping for one run: starts, steps, answers and the outcome counts.

    `finals`: the raw log's final records of conversation requests by (sample_id,
    fingerprint) (`LogHistory.conversation_finals`); a failed one is an answer (the
    conversation stopped with `error`) unless `retry_failed`, which requests it again.
    """

    def __init__(
        self,
        cfg: EndpointConfig,
        fmt: ChatFormat,
        finals: dict[tuple[str, str], dict[str, Any]],
        *,
        retry_failed: bool = False,
        build: Callable[[Prompt, EndpointConfig], dict[str, Any]] = build_request,
    ) -> None:
        self.cfg = cfg
        self.fmt = fmt
        self.finals = finals
        self.retry_failed = retry_failed
        self.build = build
        # The mode the history messages are written for: the request's switch, else the
        # formats' default (on).
        self.thinking = cfg.thinking is not False
        self.started = 0
        self.replayed = 0  # requests answered by an earlier run's final record
        self.stops: Counter[str] = Counter()
        self.open = 0  # left without a stop because the run stopped (budget, fatal, a reject)

    def start(self, prompt: Prompt) -> ConversationState:
        """A conversation's state; raises ConversationError for one that cannot be walked."""
        state = ConversationState(plan_conversation(prompt))
        self.started += 1
        return state

    def next_step(self, state: ConversationState) -> Step | Stop:
        """The next request to send, after the answers the log already holds; or the stop.

        Raises ValueError/TypeError when a request body cannot be built (not JSON)."""
        while True:
            nxt = advance(state.plan, state.answers)
            if isinstance(nxt, Stop):
                self.stops[nxt.stop_reason] += 1
                return nxt
            plan = state.plan
            prompt = Prompt(
                sample_id=request_id(plan.conversation_id, nxt.user_turn, nxt.step),
                messages=nxt.messages,
                tools=plan.tools,
                tool_mode=plan.tool_mode,  # type: ignore[arg-type]
            )
            body = self.build(prompt, self.cfg)
            fingerprint = request_fingerprint(body)
            record = self.finals.pop((prompt.sample_id, fingerprint), None)
            if record is not None and (record.get("status") in FINAL_ANSWER
                                       or not self.retry_failed):
                state.answers.append(answer_from_record(record, self.fmt,
                                                        thinking=self.thinking))
                self.replayed += 1
                continue
            return Step(state, nxt, prompt, body, fingerprint)

    def answered(self, step: Step, status: str, response: dict[str, Any] | None) -> None:
        """Record the final answer (status ok/truncated/failed) of the step's request."""
        record = {"status": status, "response": response, "request": step.body}
        step.state.answers.append(answer_from_record(record, self.fmt, thinking=self.thinking))

    def outgrown(self, step: Step, reason: str) -> dict[str, Any]:
        """The step's request does not fit the context (`reason`): it is not sent, the
        conversation stops with `length`. Returns the fields of the final raw-log record the
        caller writes for it, so a rerun and the samples find the same stop."""
        record = {"status": "failed", "error_class": CONTEXT_REFUSED, "error_message": reason,
                  "request": step.body}
        step.state.answers.append(refused_answer(record))
        return record

    def abandoned(self, count: int = 1) -> None:
        """Conversations left open because the run stopped (budget, fatal, a reject)."""
        self.open += count
