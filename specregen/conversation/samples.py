"""Token samples of whole conversations: one per user turn, masked on what the model wrote.

A conversation's path is rebuilt from its final raw-log records (`replay.conversation_answers`).
User turn k becomes one `TokenSample` (`sample_id` = `{cid}/t{k}`): the ids of the LAST request
of the turn (its prompt, reconstructed like any single request, plus its completion). The
earlier answers of the turn's tool loop sit inside that prompt as history; the loss mask is 1 on
them too, so the sample trains on every token the model generated in the turn and on nothing
else (system, users, tool results, role headers, the prefilled `<think>`: 0).

Where an earlier answer sits is found without format knowledge: each answer is reconstructed
from its own record (its prompt P_j and completion C_j); the format renders history the way
servers do, so in the last prompt the answer starts where P_j stops agreeing with it (all of
P_j when the history block opens like the generation prompt, as thinking turns usually do;
earlier when a format renders a history answer without the generation prompt's prefill). If
C_j is not there -- a server re-serialised the history call's arguments, renumbered its ids,
or rendered it otherwise -- the model never saw what it wrote: the sample is flagged
`history_rerendered` and those positions stay 0.

Earlier user turns are history under the format's own rules (which may drop their reasoning),
which is why a sample ends at its user turn.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypedDict

from specregen.conversation.plan import (
    Answer,
    ConversationPlan,
    Request,
    Stop,
    advance,
    request_id,
    sample_id,
)
from specregen.conversation.replay import conversation_answers
from specregen.models.chat_format import ChatFormat
from specregen.reconstruct import TRUST_BREAKING_FLAGS, ReconstructConfig, reconstruct_records
from specregen.records import EVIDENCE_LEVELS, ProviderTraits, TokenSample

# An earlier answer of the turn is not in the last prompt as reconstructed from its own response.
HISTORY_RERENDERED = "history_rerendered"
# An earlier answer of the turn could not be reconstructed from its own record at all.
HISTORY_UNRECONSTRUCTED = "history_unreconstructed"


@dataclass(frozen=True)
class TurnPath:
    """The answers of one user turn on the conversation's path, in step order."""

    user_turn: int
    steps: list[int]
    answers: list[Answer]


def turn_paths(plan: ConversationPlan, answers: Sequence[Answer]) -> list[TurnPath]:
    """The path's answers grouped by user turn: the record's `conversation` field says which
    request each answered (the replay matched its messages to the path's), else the walk."""
    turns: list[TurnPath] = []
    for n, answer in enumerate(answers):
        k, j = _position(answer)
        if k is None or j is None:
            asked = advance(plan, answers[:n])
            if not isinstance(asked, Request):  # answers never go on past a stop
                raise ValueError(f"conversation {plan.conversation_id!r}: answer {n} follows "
                                 "its stop")
            k, j = asked.user_turn, asked.step
        if not turns or turns[-1].user_turn != k:
            turns.append(TurnPath(k, [], []))
        turns[-1].steps.append(j)
        turns[-1].answers.append(answer)
    return turns


def _position(answer: Answer) -> tuple[int | None, int | None]:
    where = (answer.record or {}).get("conversation")
    if not isinstance(where, dict):
        return None, None
    k, j = where.get("user_turn"), where.get("step")
    valid = all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (k, j))
    return (k, j) if valid else (None, None)


def stop_reason_of(plan: ConversationPlan, answers: Sequence[Answer]) -> str | None:
    """Why the conversation ended; None while it has a request without a final answer."""
    nxt = advance(plan, answers)
    return nxt.stop_reason if isinstance(nxt, Stop) else None


# -- the mask ------------------------------------------------------------------------------------


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix (slice comparisons run in C: prompts are long)."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while lo < hi:  # invariant: a[:lo] == b[:lo], a[:hi + 1] != b[:hi + 1]
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def locate_answers(
    prompt: Sequence[int], answers: Sequence[tuple[Sequence[int], Sequence[int]]]
) -> list[int | None]:
    """Where each earlier answer's completion ids start inside `prompt`, or None.

    `answers`: (its own prompt ids, its completion ids), in order. The answer is expected where
    its own prompt stops agreeing with `prompt`, never before the previous answer's end.
    """
    found: list[int | None] = []
    cursor = 0
    for own_prompt, completion in answers:
        at = max(common_prefix(own_prompt, prompt), cursor)
        end = at + len(completion)
        if completion and end <= len(prompt) and list(prompt[at:end]) == list(completion):
            found.append(at)
            cursor = end
        else:
            found.append(None)
    return found


# -- one user turn -------------------------------------------------------------------------------


class _TurnFields(TypedDict):
    """What a turn's sample takes from its conversation and turn (turn_sample)."""

    sample_id: str
    conversation_id: str
    user_turn: int
    stop_reason: str | None


def turn_sample(
    cid: str,
    user_turn: int,
    last: TokenSample,
    earlier: Sequence[TokenSample],
    stop_reason: str | None,
) -> TokenSample:
    """The turn's sample from the reconstruction of its last request and of its earlier
    answers (in step order)."""
    fields: _TurnFields = {"sample_id": sample_id(cid, user_turn), "conversation_id": cid,
                           "user_turn": user_turn, "stop_reason": stop_reason}
    if last.status == "error":
        return replace(last, **fields)
    prompt = last.input_ids[: last.prompt_len]
    rebuilt = [e for e in earlier if e.status != "error"]
    places = locate_answers(prompt, [(e.input_ids[: e.prompt_len], e.input_ids[e.prompt_len:])
                                     for e in rebuilt])
    mask = list(last.loss_mask)
    flags = list(last.flags)
    flagged = last.status == "flagged"
    levels = [last.evidence or "none"]
    if len(rebuilt) < len(earlier):
        flags.append(HISTORY_UNRECONSTRUCTED)
        flagged = True
    for answer, at in zip(rebuilt, places, strict=True):
        if at is None:
            flags.append(HISTORY_RERENDERED)
            flagged = True
            continue
        mask[at : at + answer.completion_len] = [1] * answer.completion_len
        levels.append(answer.evidence or "none")
        if answer.status == "flagged":
            # What makes the earlier answer's ids doubtful makes these masked ids doubtful.
            flags.extend(f for f in answer.flags if f in TRUST_BREAKING_FLAGS)
            flagged = True
    evidence = max(levels, key=EVIDENCE_LEVELS.index)
    return replace(last, **fields, loss_mask=mask, flags=list(dict.fromkeys(flags)),
                   status="flagged" if flagged else last.status, evidence=evidence)


# -- a conversation --------------------------------------------------------------------------------


def conversation_samples(
    plan: ConversationPlan,
    finals: Mapping[str, dict[str, Any]],
    fmt: ChatFormat,
    *,
    thinking: bool | None = None,
    default_thinking: bool = True,
    config: ReconstructConfig | None = None,
    traits: ProviderTraits | None = None,
    accept: Callable[[Request, dict[str, Any]], bool] | None = None,
) -> list[TokenSample]:
    """One sample per user turn the conversation reached with a final answer, in turn order.

    `finals`: the final raw-log records keyed by request id (`replay.conversation_answers`);
    `thinking` as there; `default_thinking`, `config`, `traits` as for `reconstruct`.
    """
    answers = conversation_answers(plan, finals, fmt, thinking=thinking, accept=accept)
    stop = stop_reason_of(plan, answers)
    cid = plan.conversation_id
    out = []
    for path in turn_paths(plan, answers):
        # Only the stopping answer can have failed; the turn then ends at the answer before.
        usable = [(j, a) for j, a in zip(path.steps, path.answers, strict=True)
                  if not a.failed and a.record is not None]
        if not usable:
            continue
        rebuilt = [_reconstruct(request_id(cid, path.user_turn, j), answer.record, fmt,
                                default_thinking, config, traits) for j, answer in usable]
        out.append(turn_sample(cid, path.user_turn, rebuilt[-1], rebuilt[:-1], stop))
    return out


def _reconstruct(rid: str, record: dict[str, Any] | None, fmt: ChatFormat,
                 default_thinking: bool, config: ReconstructConfig | None,
                 traits: ProviderTraits | None) -> TokenSample:
    record = {**(record or {}), "sample_id": rid}
    return next(reconstruct_records([(f"raw log record {rid}", record)], fmt,
                                    default_thinking=default_thinking, config=config,
                                    traits=traits))


def final_records_by_id(records: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per request id, its final record: the last ok/truncated one, else the last failed one
    (a request answered after a failure -- `--retry-failed` -- counts as answered)."""
    out: dict[str, dict[str, Any]] = {}
    for record in records:
        if not record.get("final") or not isinstance(record.get("sample_id"), str):
            continue
        held = out.get(record["sample_id"])
        answered = record.get("status") in ("ok", "truncated")
        if held is None or answered or held.get("status") not in ("ok", "truncated"):
            out[record["sample_id"]] = record
    return out


def iter_conversation_samples(
    plans: Iterable[ConversationPlan],
    finals: Mapping[str, dict[str, Any]],
    fmt: ChatFormat,
    **options: Any,
) -> Iterator[TokenSample]:
    """The samples of each conversation in `plans` order (deterministic bytes downstream)."""
    for plan in plans:
        yield from conversation_samples(plan, finals, fmt, **options)


# -- a raw log read without the pipeline (`specregen reconstruct RAWLOG --prompts FILE`) -----------


def conversation_finals(records: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The final records of conversation requests (those with a `conversation` field), by
    request id."""
    return final_records_by_id(r for r in records
                               if r.get("final") and isinstance(r.get("conversation"), dict))


def conversation_ids(finals: Mapping[str, dict[str, Any]]) -> list[str]:
    """The conversations the records belong to, in first-seen order."""
    seen: dict[str, None] = {}
    for record in finals.values():
        cid = record["conversation"].get("id")
        if isinstance(cid, str):
            seen.setdefault(cid, None)
    return list(seen)
