"""What a run reports: its summary, its progress snapshots, and the error of a refused key.

Shared by the realtime engine (client/engine.py) and batch mode (client/batch.py, whose
summary and progress extend these).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from specregen.errors import AuthError


class FatalAPIError(AuthError, RuntimeError):
    """The endpoint refuses every request (bad key, no credits, unusable URL); the run stopped.

    The message names the environment variable of the key, never the key. `summary` holds the
    counts of what was done before the stop.
    """

    def __init__(
        self,
        message: str,
        *,
        error_class: str,
        http_status: int | None,
        summary: InferenceSummary | None = None,
    ) -> None:
        super().__init__(message)
        self.error_class = error_class
        self.http_status = http_status
        self.summary = summary


@dataclass(slots=True)
class ProgressSnapshot:
    done: int
    failed: int
    in_flight: int
    requests_per_s: float
    tokens_per_s: float
    cost_usd: float
    skipped: int = 0
    requests_sent: int = 0
    retries: int = 0
    elapsed_s: float = 0.0
    completion_tokens: int = 0  # so far: what live progress counts tokens from
    conversations: int = 0  # whole conversations taken from the input so far
    conversations_done: int = 0  # of those, stopped (any reason)
    conversation_requests_done: int = 0  # of `done`, the answers to conversations' requests


@dataclass
class InferenceSummary:
    ok: int = 0
    truncated: int = 0
    failed: int = 0  # permanently failed samples (final failed records)
    skipped: int = 0  # already final in the log
    duplicates: int = 0  # repeated sample ids in the input, processed once
    fatal: int = 0  # attempts that ended in a fatal error
    # Taken from the input but left without a final result because the run stopped (budget,
    # fatal); a rerun requests them.
    abandoned: int = 0
    requests_sent: int = 0
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cost_usd: float = 0.0
    rejected: int = 0  # prompts never sent (see `rejects`)
    wall_s: float = 0.0
    mean_in_flight: float = 0.0
    # Mean in flight while the input still had prompts (the tail, when fewer samples than the
    # window are left, is excluded): what the window scheduling achieves.
    mean_in_flight_input: float = 0.0
    peak_in_flight: int = 0
    stopped_reason: str | None = None  # None: ran to the end; "budget"; "fatal"
    errors: dict[str, int] = field(default_factory=dict)  # error class -> attempts
    rejects: list[dict[str, Any]] = field(default_factory=list)  # line?, sample_id, reason
    # Whole conversations (`Prompt.turns == "all"`; every count above is per request then):
    # taken from the input, their outcomes by stop reason (those already over in the log
    # included), and those left open because the run stopped.
    conversations: int = 0
    conversation_stops: dict[str, int] = field(default_factory=dict)
    conversations_open: int = 0

    @property
    def done(self) -> int:
        return self.ok + self.truncated

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
