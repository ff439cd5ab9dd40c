"""The in-flight window of a realtime run: which job a free worker sends next, and retries.

* `window` worker coroutines (`Scheduler.worker`) each make one attempt at a time. A worker
  takes a sample whose retry is due first, else a conversation's next request (queued by the
  feeder the moment the previous answer is durable), else the next prompt of the input. There is
  no batch and no barrier, so the window stays full until the input runs dry.
* A sample waiting out a backoff or a Retry-After does NOT hold a slot: it waits in a queue of
  timed retries (`retry_later`) while its worker sends other prompts (a window of 64 with a
  third of the samples in backoff would otherwise carry ~30 requests). Idle workers wait for
  the earliest retry, a newly queued request, or the stop.
* New conversations start longest first among the next 4 x window of the input (`rank`): a
  conversation's requests go one after another, so a long one started last would be the run's
  tail.
* The run is over when the input is done, no retry waits, no worker is inside an attempt,
  nothing is queued and no conversation waits for a durable write (`awaiting`).
* It measures the window: requests in flight over time, overall and while the input lasted.

Backoff (`backoff_delay`): exponential with full jitter, capped, never shorter than the server's
Retry-After. Requests per minute (`RateLimiter`): a local token bucket (GCRA).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from specregen.client.config import RetryPolicy
from specregen.client.driver import Step
from specregen.records import Prompt


def backoff_delay(
    attempt: int,
    policy: RetryPolicy,
    retry_after: float | None = None,
    rng: random.Random | None = None,
) -> float:
    """Seconds to wait after failed attempt number `attempt` (1-based)."""
    ceiling = min(policy.max_delay, policy.base_delay * 2.0 ** min(attempt - 1, 60))
    delay = (rng or random).uniform(0.0, ceiling) if policy.jitter else ceiling
    if retry_after is not None:
        delay = max(delay, min(retry_after, policy.max_retry_after))
    return delay


class RateLimiter:
    """Requests-per-minute limit as a GCRA token bucket: slots spaced 60/rpm s apart, with
    `burst` slots usable at once after a quiet spell."""

    def __init__(
        self,
        per_minute: float,
        *,
        burst: int = 1,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Any] = asyncio.sleep,
    ) -> None:
        self.interval = 60.0 / per_minute
        self.burst = max(1, burst)
        self._clock = clock
        self._sleep = sleep
        self._next = -math.inf

    async def acquire(self) -> None:
        now = self._clock()
        slot = max(self._next, now - (self.burst - 1) * self.interval)
        self._next = slot + self.interval
        if slot > now:
            await self._sleep(slot - now)


@dataclass(slots=True)
class Job:
    """One sample between attempts."""

    prompt: Prompt
    body: dict[str, Any]
    fingerprint: str
    attempt: int  # number of the next attempt (continues the raw log's history)
    tries: int  # attempts already made in this round (earlier runs included)
    stored_request: dict[str, Any] | None = None
    step: Step | None = None  # a request of a whole conversation


class Scheduler:
    """Queues of a run's jobs and the window's measure (module docstring).

    `next_sample()` reads the input: the next job, or None once it is exhausted. `rank(job)`
    orders new conversations (more planned requests first)."""

    def __init__(self, window: int, next_sample: Callable[[], Job | None],
                 rank: Callable[[Job], int]) -> None:
        self._next_sample = next_sample
        self._rank = rank
        self.stop_event = asyncio.Event()
        self._changed = asyncio.Event()
        self.source_done = False
        self.active = 0  # samples inside an attempt right now
        # Conversations whose last answer is still on its way to the log: their next request
        # comes once it is durable.
        self.awaiting = 0
        # Samples waiting out a backoff: (ready at, sequence, job), earliest first.
        self._retries: list[tuple[float, int, Job]] = []
        self._sequence = itertools.count()
        # Whole conversations: requests whose previous answer is durable, sent before new
        # input (a conversation finishes before many others open).
        self._ready: deque[Job] = deque()
        # New conversations are started longest first among the next few of the input: the
        # run ends when its last conversation does, so the long ones must not start last (a
        # conversation's requests go one after another: its length is a floor on the tail).
        self._lookahead: list[tuple[int, int, Job]] = []
        self._lookahead_size = max(16, 4 * window)
        # The window's measure: requests in flight integrated over time.
        self.in_flight = 0
        self.peak_in_flight = 0
        self.started = 0.0
        self._flight_area = 0.0
        self._flight_mark = 0.0
        self._input_area: float | None = None
        self._input_span = 0.0

    def start(self) -> None:
        self.started = self._flight_mark = time.monotonic()

    # -- workers ---------------------------------------------------------------------------

    async def worker(self, handle: Callable[[Job], Awaitable[None]],
                     failure: Callable[[BaseException], None]) -> None:
        """Take jobs and `handle` them one at a time until the run is over or stopped;
        `failure(error)` hears of an unexpected error (the prompt source's or a job's)."""
        while not self.stop_event.is_set():
            changed = self._changed
            try:
                job = self.take()
            except Exception as exc:  # the prompt source itself failed
                failure(exc)
                return
            if job is None:
                if self.run_over():
                    self.notify()  # wake the other idle workers: the run is over
                    return
                await self._wait_for_change(changed)
                continue
            self.active += 1
            try:
                await handle(job)
            except Exception as exc:
                # Never let one sample's bug cancel the others' requests in flight: their
                # answers may be paid for. Stop starting new ones and report at the end.
                failure(exc)
            finally:
                self.active -= 1
                # Idle workers (input exhausted) only care about a new earliest retry (pushed
                # below) and about the end of the run: waking them on every answer would cost
                # window x answers wake-ups in the tail.
                if self.run_over():
                    self.notify()

    def run_over(self) -> bool:
        return (self.source_done and not self._retries and self.active == 0
                and not self._ready and not self._lookahead and self.awaiting == 0)

    def notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def stop(self) -> bool:
        """Start no new request (the ones in flight finish); False if already stopped."""
        if self.stop_event.is_set():
            return False
        self.stop_event.set()
        self.notify()
        return True

    @property
    def stopped(self) -> bool:
        return self.stop_event.is_set()

    async def _wait_for_change(self, changed: asyncio.Event) -> None:
        timeout = None
        if self._retries:
            timeout = max(0.0, self._retries[0][0] - time.monotonic())
        stop = asyncio.ensure_future(self.stop_event.wait())
        change = asyncio.ensure_future(changed.wait())
        try:
            await asyncio.wait({stop, change}, timeout=timeout,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            change.cancel()

    # -- queues ----------------------------------------------------------------------------

    def take(self) -> Job | None:
        """A sample whose retry is due, else a conversation's next request, else the next new
        prompt, else None."""
        if self._retries and self._retries[0][0] <= time.monotonic():
            return heapq.heappop(self._retries)[2]
        if self._ready:
            return self._ready.popleft()
        # Two new prompts per job taken at most: the lookahead fills over the first requests
        # instead of planning thousands of conversations before the first one is sent.
        pulled = 0
        while (not self.source_done and len(self._lookahead) < self._lookahead_size
               and (pulled < 2 or not self._lookahead)):
            pulled += 1
            job = self._next_sample()
            if job is None:
                self._input_exhausted()
            elif job.step is None:
                return job
            else:
                heapq.heappush(self._lookahead, (-self._rank(job), next(self._sequence), job))
        if self._lookahead:
            return heapq.heappop(self._lookahead)[2]
        return None

    def _input_exhausted(self) -> None:
        if not self.source_done:
            self.source_done = True
            self.flight(0)
            self._input_area = self._flight_area
            self._input_span = time.monotonic() - self.started
            self.notify()

    def retry_later(self, job: Job, delay: float) -> None:
        """`job` again in `delay` seconds; its worker's slot goes to another prompt meanwhile."""
        ready = time.monotonic() + delay
        earliest = not self._retries or ready < self._retries[0][0]
        heapq.heappush(self._retries, (ready, next(self._sequence), job))
        if earliest:
            self.notify()  # idle workers wait for the earliest retry: it moved

    def follow(self, job: Job) -> None:
        """A conversation's next request, sent before new input."""
        self._ready.append(job)
        self.notify()

    def drain_retries(self) -> list[Job]:
        """The samples still waiting out a backoff (the run stopped), taken off the queue."""
        jobs = [job for _, _, job in self._retries]
        self._retries.clear()
        return jobs

    def drain_queued(self) -> tuple[list[Job], list[Job]]:
        """The queued conversation requests and the new conversations not yet started."""
        ready, lookahead = list(self._ready), [job for _, _, job in self._lookahead]
        self._ready.clear()
        self._lookahead.clear()
        return ready, lookahead

    # -- the window's measure --------------------------------------------------------------

    def flight(self, delta: int) -> None:
        now = time.monotonic()
        self._flight_area += self.in_flight * (now - self._flight_mark)
        self._flight_mark = now
        self.in_flight += delta
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)

    def means(self) -> tuple[float, float, float]:
        """(wall seconds, mean in flight, mean in flight while the input lasted) so far."""
        self.flight(0)
        wall = time.monotonic() - self.started
        mean = self._flight_area / wall if wall > 0 else 0.0
        if self._input_area is not None and self._input_span > 0:
            return wall, mean, self._input_area / self._input_span
        return wall, mean, mean
