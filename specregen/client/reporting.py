"""Live progress of a realtime run: `ProgressSnapshot`s of its counts and rates.

The caller's callback gets one at most every `interval` seconds (`every`) and one at the end; a
callback that fails is logged and the run goes on. Rates are measured over the trailing
`RATE_WINDOW` seconds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from specregen.client.feeder import ConversationFeeder
from specregen.client.scheduler import Scheduler
from specregen.client.summary import InferenceSummary, ProgressSnapshot

log = logging.getLogger(__name__)

# The progress callback is called at most this often (seconds), plus once at the end.
PROGRESS_INTERVAL = 0.25
# Rates shown in progress are measured over this trailing window (seconds).
RATE_WINDOW = 10.0

Progress = Callable[[ProgressSnapshot], Any]


class Reporter:
    """Snapshots of a run's `summary`, window (`scheduler`) and conversations (`feeder`);
    `finished_requests` counts the attempts that ended (the engine adds them)."""

    def __init__(self, summary: InferenceSummary, scheduler: Scheduler,
                 feeder: ConversationFeeder) -> None:
        self.summary = summary
        self.scheduler = scheduler
        self.feeder = feeder
        self.finished_requests = 0
        self._rates: deque[tuple[float, int, int]] = deque()

    def snapshot(self) -> ProgressSnapshot:
        summary = self.summary
        now = time.monotonic()
        self._rates.append((now, self.finished_requests, summary.completion_tokens))
        while len(self._rates) > 2 and now - self._rates[1][0] >= RATE_WINDOW:
            self._rates.popleft()
        then, requests, tokens = self._rates[0]
        if now - then < 1e-6:
            then, requests, tokens = self.scheduler.started, 0, 0
        span = max(now - then, 1e-6)
        return ProgressSnapshot(
            done=summary.done,
            failed=summary.failed,
            in_flight=self.scheduler.in_flight,
            requests_per_s=(self.finished_requests - requests) / span,
            tokens_per_s=(summary.completion_tokens - tokens) / span,
            cost_usd=summary.cost_usd,
            # Prompts skipped; a conversation's requests answered from the log are not items
            # of the progress (its conversation is, once it stops).
            skipped=summary.skipped - self.feeder.replayed,
            requests_sent=summary.requests_sent,
            retries=summary.retries,
            elapsed_s=now - self.scheduler.started,
            completion_tokens=summary.completion_tokens,
            conversations=summary.conversations,
            conversations_done=sum(self.feeder.stops.values()),
            conversation_requests_done=self.feeder.answers,
        )

    def call(self, progress: Progress) -> None:
        try:
            progress(self.snapshot())
        except Exception:
            log.exception("progress callback failed; the run goes on")

    async def every(self, progress: Progress, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            self.call(progress)
