"""The rows of the trainer exports, one per published sample.

`train_row` is what speculators and SpecForge read without tokenizing again: flat `input_ids`
and an unshifted `loss_mask` of the same length (every trainer shifts it itself), the decoded
text for review, and a `metadata` object whose keys and value types are the same in every row,
so readers that infer one Arrow schema (`datasets.load_dataset("json")`) accept the file.

`messages_row` is the lossy export: the conversation as text, which a trainer renders and
tokenizes again with its own chat template, so the ids it trains on may differ from ours.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from specregen.records import TokenSample


@dataclass(frozen=True, slots=True)
class ExportContext:
    """What every row of one dataset's export shares."""

    dataset: str
    format: str | None
    tokenizer: str | None
    tokenizer_fingerprint: str | None
    model: str | None = None  # the configured model, when the raw log does not say


@dataclass(frozen=True, slots=True)
class RunMeta:
    """What the raw log knows about a sample's final answer."""

    usage: dict[str, Any] | None = None
    provider: str | None = None
    model: str | None = None


def train_row(
    sample: TokenSample, ctx: ExportContext, text: str, run: RunMeta | None = None
) -> dict[str, Any]:
    if len(sample.input_ids) != len(sample.loss_mask):
        raise ValueError(
            f"sample {sample.sample_id!r}: input_ids has {len(sample.input_ids)} ids but "
            f"loss_mask has {len(sample.loss_mask)}"
        )
    run = run or RunMeta()
    metadata = {
        "dataset": ctx.dataset,
        "sample_id": sample.sample_id,
        # A sample of a whole conversation (one per user turn; its loss mask covers every
        # answer of the turn's tool loop); null on single-turn samples.
        "conversation_id": sample.conversation_id,
        "user_turn": sample.user_turn,
        "stop_reason": sample.stop_reason,
        "evidence": getattr(sample, "evidence", None),
        "status": sample.status,
        "flags": [str(f) for f in sample.flags],
        "reference_match": sample.reference_match,
        "finish_reason": sample.finish_reason,
        "prompt_len": int(sample.prompt_len),
        "completion_len": int(sample.completion_len),
        "usage": normalize_usage(run.usage),
        "provider": run.provider,
        "model": run.model or ctx.model,
        "format": ctx.format,
        "tokenizer": ctx.tokenizer,
        "tokenizer_fingerprint": ctx.tokenizer_fingerprint,
    }
    return {
        "id": sample.sample_id,
        "input_ids": [int(i) for i in sample.input_ids],
        "loss_mask": [int(m) for m in sample.loss_mask],
        "text": text,
        "metadata": metadata,
    }


def normalize_usage(usage: dict[str, Any] | None) -> dict[str, int | None]:
    """The fixed usage shape: OpenAI's counters, with the nested detail counters lifted.

    Every key is always present (int or null): providers return different shapes, and a
    varying nested object breaks schema inference downstream."""
    usage = usage if isinstance(usage, dict) else {}
    completion_details = usage.get("completion_tokens_details") or {}
    prompt_details = usage.get("prompt_tokens_details") or {}
    values = {
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
        "total_tokens": usage.get("total_tokens"),
        "reasoning_tokens": (completion_details.get("reasoning_tokens")
                             if isinstance(completion_details, dict) else None),
        "cached_tokens": (prompt_details.get("cached_tokens")
                          if isinstance(prompt_details, dict) else usage.get("cached_tokens")),
    }
    return {k: v if isinstance(v, int) and not isinstance(v, bool) else None
            for k, v in values.items()}


def messages_row(sample: TokenSample) -> dict[str, Any]:
    """The prompt messages plus the regenerated assistant turn, as text (lossy).

    `trained_messages`: the indices in `conversations` of the assistant messages the sample's
    loss mask covers -- the last one, and for a conversation sample every answer of its user
    turn's tool loop (earlier turns are history the sample does not train on; their own
    samples do). A trainer that masks every assistant message would train those twice.
    """
    turn: dict[str, Any] = {"role": "assistant", "content": sample.content or ""}
    if sample.reasoning:
        turn["reasoning_content"] = sample.reasoning
    if sample.tool_calls:
        turn["tool_calls"] = [
            {"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}}
            for c in sample.tool_calls
        ]
    conversation = [*(sample.messages or []), turn]
    record: dict[str, Any] = {"id": sample.sample_id, "conversations": conversation,
                              "trained_messages": _trained_messages(sample, conversation)}
    if sample.tools:
        record["tools"] = sample.tools
    record["thinking"] = sample.thinking
    return record


def _trained_messages(sample: TokenSample, conversation: list[dict[str, Any]]) -> list[int]:
    last = len(conversation) - 1
    if sample.conversation_id is None:
        return [last]
    # The turn's answers follow its user message(s) (specregen/conversation/samples.py).
    start = 1 + max((i for i, m in enumerate(conversation[:last]) if isinstance(m, dict)
                     and m.get("role") in ("user", "system")), default=-1)
    return [i for i in range(start, last) if isinstance(conversation[i], dict)
            and conversation[i].get("role") == "assistant"] + [last]


def dumps(row: dict[str, Any]) -> str:
    return json.dumps(row, ensure_ascii=False, separators=(",", ":"))
