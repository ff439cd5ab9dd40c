"""Run many prompts through one endpoint with a full in-flight window, retries, limits and budget.

Shape of a run:

* `cfg.concurrency` worker coroutines each make one attempt at a time. A worker takes a sample
  whose retry is due first, else the next prompt of the shared iterator. There is no batch and
  no barrier, so the window stays full until the input runs dry. A sample waiting out a backoff
  or a Retry-After does NOT hold a slot: it waits in a queue of timed retries while its worker
  sends other prompts (a window of 64 with a third of the samples in backoff would otherwise
  carry ~30 requests).
* Every prompt is built and fingerprinted before it is sent; a prompt that cannot be (NaN in a
  tool schema, refused by `prompt_check`, e.g. over the context length) becomes a reject with
  its reason, written to the raw log's `rejects-*.jsonl` and counted in the summary; the run
  goes on. An unexpected error in one worker stops new requests, lets the ones in flight finish
  and be logged (they may be paid for), then is raised.
* Workers are spread over ceil(concurrency / connections_per_shard) `httpx.AsyncClient`s with
  `Limits(max_connections=connections_per_shard)`: one client with thousands of connections
  spends its time in httpcore's quadratic pool bookkeeping (../shared/PREFECT.md rows 19-23).
* Every finished attempt becomes one raw-log record; a sample counts as done only when its final
  record is durable. A worker's slot is held until its final record is durable (a paid answer
  not yet in the log is lost in a crash like one in flight), so a SIGKILL costs at most one
  window of paid requests, on object stores too (a part is put once a window waits, or at once
  when nothing is in flight). Samples whose (sample_id, request fingerprint) already have a
  final record are skipped (permanently failed ones too, unless `retry_failed`).
* Retries: exponential backoff with full jitter, capped, never shorter than the server's
  Retry-After, up to `retry.max_attempts` attempts PER SAMPLE: the attempts of earlier (killed)
  runs in the raw log count, and attempt numbers continue from them. Then the sample fails
  permanently with the last error; `retry_failed` gives a failed sample a new round.
  Permanent errors (400/403/404/422...) fail the sample at once.
* Fatal errors (401/402): no new request starts, samples waiting in backoff or for the rate
  limiter give up, and requests already in flight are allowed to finish and are logged, because
  they may already be paid for and their answers are worth keeping (a 401 answers at once anyway).
  Then `FatalAPIError` is raised; its message names `cfg.api_key_env`, never the key.
* Unreachable endpoint: a connection that cannot be made before the endpoint ever answered in
  this run stops the run at once with `EndpointUnreachableError` (client/reach.py); those
  attempts are not recorded and use none of a sample's `max_attempts`.
* Budget: before each request, spent + (in flight + 1) x projected cost per request must stay
  within `budget_usd`; the projection is the mean cost of the finished requests, or max_tokens x
  the completion price before any finished. Once it would not, nothing new starts, in-flight
  requests finish, and the summary says `stopped_reason="budget"`.
* Requests-per-minute: a local token bucket (GCRA) in front of every attempt.
* Whole conversations (`Prompt.turns == "all"`, specregen/conversation): every request of a
  conversation is one sample (`{cid}/t{k}/s{j}`, its record carries `conversation`). The next
  request is built the moment the previous answer's record is durable and queued ahead of new
  input; no turn waits for other conversations, so the window stays full across them. New
  conversations start longest first among the next 4 x window of the input (a conversation's
  requests go one after another: a long one started last would be the run's tail). A rerun
  walks each conversation over the final records already in the log (same bodies, hence same
  fingerprints) and pays only from its first request without one. A later request that fails
  `followup_check` (it outgrew the context) is not sent: a final record (error_class
  `context_length`, nothing paid) stops its conversation with `length`, reruns included. The
  run ends when the input is done, no retry waits, nothing is in flight and no conversation
  waits for a durable write.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import math
import random
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

import httpx

from specregen.client.config import EndpointConfig, Prices, RetryPolicy
from specregen.client.driver import ConversationDriver, Step, history_format
from specregen.client.limits import RequestLimiter
from specregen.client.reach import is_unreachable, unreachable_error
from specregen.client.request import admit, storable_request
from specregen.client.secrets import ApiKey, as_api_key, scrub_obj, scrub_text
from specregen.client.transport import AttemptResult, HTTPClient, send
from specregen.conversation.plan import ConversationError
from specregen.errors import AuthError
from specregen.models.chat_format import ChatFormat
from specregen.records import Prompt
from specregen.store.rawlog import (
    FINAL_ANSWER,
    AttemptRecord,
    LogHistory,
    RawLog,
    RawLogError,
    RejectRecord,
    utc_now_iso,
)

log = logging.getLogger(__name__)

# The progress callback is called at most this often (seconds), plus once at the end.
PROGRESS_INTERVAL = 0.25
# Rates shown in progress are measured over this trailing window (seconds).
RATE_WINDOW = 10.0


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


def response_cost(response: dict[str, Any] | None, prices: Prices | None) -> float | None:
    """USD of one response: `usage.cost` when the API reports it, else usage x prices."""
    # Cached prompt tokens at their own price (client/cost.py, shared with batch mode).
    from specregen.client.cost import usage_cost

    return usage_cost(response, prices, "realtime")


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


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


async def run_inference(
    prompts: Iterable[Prompt],
    cfg: EndpointConfig,
    log: RawLog,
    *,
    api_key: ApiKey | str | None,
    progress: Callable[[ProgressSnapshot], Any] | None = None,
    retry_failed: bool = False,
    transport: httpx.AsyncBaseTransport | None = None,
    progress_interval: float = PROGRESS_INTERVAL,
    rng: random.Random | None = None,
    prompt_check: Callable[[Prompt, dict[str, Any]], str | None] | None = None,
    rejects: Iterable[RejectRecord] = (),
    should_stop: Callable[[], str | None] | None = None,
    limiter: RequestLimiter | None = None,
    chat_format: ChatFormat | None = None,
    followup_check: Callable[[Prompt, dict[str, Any]], str | None] | None = None,
) -> InferenceSummary:
    """Request every prompt that has no final result in `log` yet; see the module docstring.

    `api_key` None sends no Authorization header (a local server). `transport` replaces the
    network for every client shard (tests, an in-process emulator). `prompt_check(prompt, body)`
    returns why a prompt must not be sent (or None). `rejects`: rows the caller already refused
    (e.g. unparsable lines); they are written with the run's own. `should_stop()` returns a
    reason to stop starting requests (e.g. the output lease was lost). Raises FatalAPIError when
    the endpoint refuses every request; the log holds everything finished before that.

    A prompt with `turns == "all"` is a whole conversation (specregen/conversation): its
    requests go one after another, the next queued the moment the previous answer is durable,
    while the window stays full with other conversations' requests. `chat_format` turns the
    model's answers into history messages (default: the endpoint's format);
    `followup_check` checks each later request of a conversation (default: `prompt_check`).
    """
    run = _Run(cfg, log, as_api_key(api_key), retry_failed, transport, rng or random.Random())
    run.chat_format = chat_format
    run.followup_check = followup_check or prompt_check
    run.prompt_check = prompt_check
    run.should_stop = should_stop
    # Limits shared with other processes (specregen/client/limits.py): asked before each
    # request, after the local requests_per_minute, and told when it ends.
    run.limiter = limiter
    run.rejects.extend(rejects)
    return await run.execute(prompts, progress, progress_interval)


@dataclass(slots=True)
class _Job:
    """One sample between attempts."""

    prompt: Prompt
    body: dict[str, Any]
    fingerprint: str
    attempt: int  # number of the next attempt (continues the raw log's history)
    tries: int  # attempts already made in this round (earlier runs included)
    stored_request: dict[str, Any] | None = None
    step: Step | None = None  # a request of a whole conversation


class _Run:
    def __init__(
        self,
        cfg: EndpointConfig,
        log: RawLog,
        key: ApiKey | None,
        retry_failed: bool,
        transport: httpx.AsyncBaseTransport | None,
        rng: random.Random,
    ) -> None:
        self.cfg = cfg
        self.log = log
        self.key = key
        self.retry_failed = retry_failed
        self.transport = transport
        self.rng = rng
        self.prompt_check: Callable[[Prompt, dict[str, Any]], str | None] | None = None
        self.should_stop: Callable[[], str | None] | None = None
        self.limiter: RequestLimiter | None = None
        self.summary = InferenceSummary()
        self.errors: Counter[str] = Counter()
        self.rejects: list[RejectRecord] = []
        self.stop_event = asyncio.Event()
        self.fatal_result: AttemptResult | None = None
        # Whether any HTTP answer came back in this run, and the first failed connection
        # before one did (client/reach.py).
        self.answered = False
        self.unreachable: AttemptResult | None = None
        self.write_error: BaseException | None = None
        self.internal_error: BaseException | None = None
        self.rpm = RateLimiter(cfg.requests_per_minute) if cfg.requests_per_minute else None
        self.in_flight = 0
        self._flight_area = 0.0
        self._flight_mark = 0.0
        self._input_area: float | None = None
        self._input_span = 0.0
        self.started = 0.0
        self.finished_requests = 0
        self._cost_sum = 0.0
        self._cost_n = 0
        self._seen: set[str] = set()
        self._history = LogHistory()
        self._source: Iterator[Prompt] = iter(())
        self._source_done = False
        # Samples waiting out a backoff: (ready at, sequence, job), earliest first.
        self._retries: list[tuple[float, int, _Job]] = []
        self._sequence = itertools.count()
        self._active = 0  # samples inside an attempt right now
        # Whole conversations: requests whose previous answer is durable, sent before new
        # input (a conversation finishes before many others open), and the conversations
        # whose last answer is still on its way to the log.
        self.chat_format: ChatFormat | None = None
        self.followup_check: Callable[[Prompt, dict[str, Any]], str | None] | None = None
        self._driver: ConversationDriver | None = None
        self._ready: deque[_Job] = deque()
        self._awaiting_write = 0
        self._conversation_answers = 0
        # New conversations are started longest first among the next few of the input: the
        # run ends when its last conversation does, so the long ones must not start last (a
        # conversation's requests go one after another: its length is a floor on the tail).
        self._lookahead: list[tuple[int, int, _Job]] = []
        self._lookahead_size = max(16, 4 * cfg.concurrency)
        self._changed = asyncio.Event()
        self._rates: deque[tuple[float, int, int]] = deque()

    # -- the run ---------------------------------------------------------------------------

    async def execute(
        self,
        prompts: Iterable[Prompt],
        progress: Callable[[ProgressSnapshot], Any] | None,
        interval: float,
    ) -> InferenceSummary:
        cfg = self.cfg
        # The history is read before the first request: a rerun never pays twice for a sample,
        # and attempts of earlier runs count against max_attempts.
        self._history = await asyncio.to_thread(self.log.history)
        self._source = iter(prompts)
        self.started = self._flight_mark = time.monotonic()
        per_shard = cfg.connections_per_shard
        limits = httpx.Limits(max_connections=per_shard, max_keepalive_connections=per_shard)
        # One TLS context for all shards: each client would otherwise load the CA bundle again
        # (about 30 ms of CPU each, 6 s for 200 shards).
        tls = httpx.create_ssl_context()
        clients = [
            HTTPClient(limits=limits, transport=self.transport, verify=tls)
            for _ in range(cfg.shards)
        ]
        reporter = asyncio.create_task(self._report(progress, interval)) if progress else None
        try:
            async with asyncio.TaskGroup() as group:
                for worker in range(cfg.concurrency):
                    group.create_task(self._worker(clients[worker // per_shard]))
        finally:
            if reporter is not None:
                reporter.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reporter
            for client in clients:
                await client.aclose()
            self.summary.abandoned += len(self._retries)
            self._abandon_conversations(job for _, _, job in self._retries)
            self._retries.clear()
            # Everything queued must be durable before the counts are final.
            await self.log.flush()
            self.summary.abandoned += len(self._ready) + len(self._lookahead)
            self._abandon_conversations(self._ready)
            self._abandon_conversations(job for _, _, job in self._lookahead)
            self._ready.clear()
            self._lookahead.clear()
            await self._write_rejects()
        self._finish_summary()
        if progress is not None:
            self._call_progress(progress)
        if self.write_error is not None:
            raise self.write_error
        if self.internal_error is not None:
            raise self.internal_error
        if self.unreachable is not None:
            raise unreachable_error(cfg.base_url, self.unreachable.error_message)
        if self.fatal_result is not None:
            raise self._fatal_error(self.fatal_result)
        return self.summary

    async def _worker(self, client: httpx.AsyncClient) -> None:
        while not self.stop_event.is_set():
            changed = self._changed
            try:
                job = self._take_job()
            except Exception as exc:  # the prompt source itself failed
                self._internal_failure(exc)
                return
            if job is None:
                if self._run_over():
                    self._notify()  # wake the other idle workers: the run is over
                    return
                await self._wait_for_change(changed)
                continue
            self._active += 1
            try:
                written = await self._attempt_job(client, job)
                if written is not None:
                    await self._until_durable(written)
            except Exception as exc:
                # Never let one sample's bug cancel the others' requests in flight: their
                # answers may be paid for. Stop starting new ones and report at the end.
                self._internal_failure(exc)
            finally:
                self._active -= 1
                # Idle workers (input exhausted) only care about a new earliest retry (pushed
                # below) and about the end of the run: waking them on every answer would cost
                # window x answers wake-ups in the tail.
                if self._run_over():
                    self._notify()

    async def _until_durable(self, written: asyncio.Future[None]) -> None:
        # The worker's slot stays taken until its record is durable: an answer not yet in the
        # log is lost (and paid again) in a crash just like one in flight, so holding the slot
        # keeps paid-but-not-durable answers within the window at every moment (issue 10's
        # SIGKILL bound). Write errors are handled by `_written`, like before.
        if self.in_flight == 0:
            # No answer can join this commit soon: waiting for a full part or the timer would
            # only idle the window (an object store whose roll_records exceed the workers).
            self.log.commit_soon()
        with contextlib.suppress(Exception):
            await asyncio.shield(written)  # a cancelled worker must not cancel the write

    def _run_over(self) -> bool:
        return (self._source_done and not self._retries and self._active == 0
                and not self._ready and not self._lookahead and self._awaiting_write == 0)

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

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

    def _take_job(self) -> _Job | None:
        """A sample whose retry is due, else a conversation's next request, else the next new
        prompt, else None."""
        if self._retries and self._retries[0][0] <= time.monotonic():
            return heapq.heappop(self._retries)[2]
        if self._ready:
            return self._ready.popleft()
        # Two new prompts per job taken at most: the lookahead fills over the first requests
        # instead of planning thousands of conversations before the first one is sent.
        pulled = 0
        while (not self._source_done and len(self._lookahead) < self._lookahead_size
               and (pulled < 2 or not self._lookahead)):
            pulled += 1
            job = self._next_sample()
            if job is None:
                self._input_exhausted()
            elif job.step is None:
                return job
            else:
                heapq.heappush(self._lookahead, (-_planned_requests(job), next(self._sequence),
                                                 job))
        if self._lookahead:
            return heapq.heappop(self._lookahead)[2]
        return None

    def _input_exhausted(self) -> None:
        if not self._source_done:
            self._source_done = True
            self._flight(0)
            self._input_area = self._flight_area
            self._input_span = time.monotonic() - self.started
            self._notify()

    def _reject(self, sample_id: str | None, reason: str) -> None:
        self.rejects.append(RejectRecord(reason=reason, sample_id=sample_id))
        log.warning("sample %s not sent: %s", sample_id, reason)

    def _next_sample(self) -> _Job | None:
        for prompt in self._source:
            sample_id = getattr(prompt, "sample_id", None)
            if not isinstance(sample_id, str):
                self._reject(None, f"not a prompt ({type(prompt).__name__})")
                continue
            if sample_id in self._seen:
                self.summary.duplicates += 1
                continue
            self._seen.add(sample_id)
            if getattr(prompt, "turns", "first") == "all":
                job = self._start_conversation(prompt)
                if job is None:
                    continue
                return job
            admitted = admit(prompt, self.cfg, self._history, retry_failed=self.retry_failed,
                             prompt_check=self.prompt_check)
            if admitted is None:
                self.summary.skipped += 1
            elif isinstance(admitted, str):
                self._reject(sample_id, admitted)
            else:
                return _Job(prompt, admitted.body, admitted.fingerprint,
                            attempt=admitted.attempt, tries=admitted.tries)
        return None

    async def _attempt_job(
        self, client: httpx.AsyncClient, job: _Job
    ) -> asyncio.Future[None] | None:
        """One attempt of `job`; returns the future of its final raw-log record, which holds
        the worker's slot until durable (None: nothing sent, or no final record)."""
        cfg = self.cfg
        if job.stored_request is None:
            job.stored_request = scrub_obj(storable_request(job.body), self.key)
        if self.rpm is not None and not self.stop_event.is_set():
            await self.rpm.acquire()
        limiter = self.limiter if not self.stop_event.is_set() else None
        if limiter is not None:
            await limiter.acquire()
        if self.should_stop is not None and not self.stop_event.is_set():
            reason = self.should_stop()
            if reason:
                self._stop(reason)
        if not self.stop_event.is_set() and not self._budget_allows():
            self._stop("budget")
        if self.stop_event.is_set():
            if limiter is not None:
                limiter.release(sent=False)
            self.summary.abandoned += 1
            self._abandon_conversations([job])
            return None
        try:
            result = await self._attempt(client, job.body)
        finally:
            if limiter is not None:
                limiter.release()
        if result.http_status is not None:
            self.answered = True
        elif is_unreachable(result) and not self.answered:
            # No connection before the endpoint ever answered (client/reach.py): nothing was
            # sent, so no record and no attempt used; the run stops naming the URL.
            if self.unreachable is None:
                self.unreachable = result
            self.summary.abandoned += 1
            self._abandon_conversations([job])
            self._stop("unreachable")
            return None
        # The answer is logged before anything else can fail: accounting comes after.
        attempt = job.attempt
        job.attempt += 1
        job.tries += 1
        final = (
            result.final_answer
            or result.kind == "permanent"
            or (result.kind == "retryable" and job.tries >= cfg.retry.max_attempts)
        )
        cost = response_cost(result.response, cfg.prices)
        record = self._record(
            job.prompt.sample_id, job.fingerprint, attempt, result, cost, final,
            job.stored_request,
        )
        if job.step is not None:
            record.conversation = job.step.conversation
        try:
            future = self.log.submit(record)
        except RawLogError as exc:
            self._write_failed(exc)
            self.summary.abandoned += 1
            self._abandon_conversations([job])
            return None
        follow = job.step is not None and final
        if follow:
            self._awaiting_write += 1
        future.add_done_callback(partial(self._written, result.status if final else None,
                                         job if follow else None, record.response))
        self._account(result, cost)
        if final:
            if result.status == "failed":
                log.info(
                    "sample %s failed permanently after %d attempt(s): %s %s",
                    job.prompt.sample_id,
                    job.tries,
                    result.error_class,
                    result.error_message,
                )
            return future
        if result.kind == "fatal":
            self.summary.fatal += 1
            self.summary.abandoned += 1
            self._abandon_conversations([job])
            if self.fatal_result is None:
                self.fatal_result = result
            self._stop("fatal")
            return None  # nothing paid: the slot need not wait for the record
        self.summary.retries += 1
        delay = backoff_delay(job.tries, cfg.retry, result.retry_after_s, self.rng)
        log.debug(
            "sample %s attempt %d: %s; retrying in %.2f s",
            job.prompt.sample_id,
            attempt,
            result.error_class,
            delay,
        )
        # The sample waits in the queue, not in this worker: the slot goes to another prompt.
        ready = time.monotonic() + delay
        earliest = not self._retries or ready < self._retries[0][0]
        heapq.heappush(self._retries, (ready, next(self._sequence), job))
        if earliest:
            self._notify()  # idle workers wait for the earliest retry: it moved
        # Not a final record: no answer was paid for, so the slot need not wait for it.
        return None

    async def _attempt(self, client: httpx.AsyncClient, body: dict[str, Any]) -> AttemptResult:
        self._flight(+1)
        self.summary.requests_sent += 1
        try:
            return await send(client, self.cfg, body, self.key)
        finally:
            self._flight(-1)
            self.finished_requests += 1

    def _stop(self, reason: str) -> None:
        if not self.stop_event.is_set():
            self.summary.stopped_reason = reason
            self.stop_event.set()
            log.info("inference stopping: %s", reason)
            self._notify()

    def _internal_failure(self, error: BaseException) -> None:
        log.error("inference: unexpected error (%s: %s); stopping", type(error).__name__, error)
        if self.internal_error is None:
            self.internal_error = error
        self._stop("error")

    async def _write_rejects(self) -> None:
        self.summary.rejected = len(self.rejects)
        self.summary.rejects = [r.as_dict() for r in self.rejects]
        if not self.rejects:
            return
        try:
            await asyncio.to_thread(self.log.write_rejects, self.rejects)
        except Exception as exc:
            log.error("raw log %s: could not write the rejects: %s", self.log.root_url, exc)

    # -- accounting ------------------------------------------------------------------------

    def _flight(self, delta: int) -> None:
        now = time.monotonic()
        self._flight_area += self.in_flight * (now - self._flight_mark)
        self._flight_mark = now
        self.in_flight += delta
        self.summary.peak_in_flight = max(self.summary.peak_in_flight, self.in_flight)

    def _account(self, result: AttemptResult, cost: float | None) -> None:
        if result.error_class:
            self.errors[result.error_class] += 1
        if cost is not None:
            self.summary.cost_usd += cost
            self._cost_sum += cost
            self._cost_n += 1
        usage = result.response.get("usage") if result.response else None
        if result.final_answer and isinstance(usage, dict):
            self.summary.prompt_tokens += _int(usage.get("prompt_tokens"))
            self.summary.completion_tokens += _int(usage.get("completion_tokens"))
            details = usage.get("completion_tokens_details")
            if isinstance(details, dict):
                self.summary.reasoning_tokens += _int(details.get("reasoning_tokens"))

    def _projected_cost(self) -> float:
        if self._cost_n:
            return self._cost_sum / self._cost_n
        prices, max_tokens = self.cfg.prices, self.cfg.sampling.max_tokens
        if prices is not None and max_tokens is not None:
            return max_tokens * prices.completion_per_million / 1e6
        return 0.0

    def _budget_allows(self) -> bool:
        budget = self.cfg.budget_usd
        if budget is None:
            return True
        projected = self.summary.cost_usd + (self.in_flight + 1) * self._projected_cost()
        return projected <= budget

    def _write_failed(self, error: BaseException) -> None:
        if self.write_error is None:
            self.write_error = error
            self._stop("raw_log_error")

    def _written(self, final_status: str | None, job: _Job | None,
                 response: dict[str, Any] | None, future: asyncio.Future[None]) -> None:
        if job is not None:
            self._awaiting_write -= 1
        if future.cancelled():
            self._write_failed(RawLogError(f"raw log {self.log.root_url}: write cancelled"))
            self._abandon_conversations([job] if job is not None else [])
            return
        error = future.exception()
        if error is not None:
            self._write_failed(error)
            self._abandon_conversations([job] if job is not None else [])
            return
        if final_status == "ok":
            self.summary.ok += 1
        elif final_status == "truncated":
            self.summary.truncated += 1
        elif final_status == "failed":
            self.summary.failed += 1
        if job is not None and final_status is not None:
            if final_status in FINAL_ANSWER:
                self._conversation_answers += 1
            self._follow_up(job, final_status, response)

    # -- whole conversations ---------------------------------------------------------------

    def _conversations(self) -> ConversationDriver:
        if self._driver is None:
            fmt = self.chat_format or history_format(self.cfg.format_name)
            self._driver = ConversationDriver(self.cfg, fmt, self._history.conversation_finals,
                                              retry_failed=self.retry_failed)
        return self._driver

    def _start_conversation(self, prompt: Prompt) -> _Job | None:
        driver = self._conversations()
        try:
            state = driver.start(prompt)
        except ConversationError as exc:
            self._reject(prompt.sample_id, exc.detail)
            return None
        self.summary.conversations += 1
        return self._conversation_job(driver, state)

    def _conversation_job(self, driver: ConversationDriver, state: Any) -> _Job | None:
        """The conversation's next request as a job (answers already in the log are taken
        from it, not paid for again), or None when it is over."""
        replayed = driver.replayed
        try:
            step = driver.next_step(state)
        except (ValueError, TypeError, RecursionError) as exc:
            self._reject(state.conversation_id, f"cannot be sent as JSON: {exc}")
            driver.abandoned()
            return None
        finally:
            # Answers taken from the log count as skipped as they are taken.
            self.summary.skipped += driver.replayed - replayed
        if not isinstance(step, Step):
            return None
        # The first request is the prompt's own (checked like any prompt); later ones grew.
        check = self.prompt_check if not state.answers else self.followup_check
        if check is not None:
            reason = check(step.prompt, step.body)
            if reason is not None and state.answers:
                return self._outgrown(driver, step, reason)
            if reason is not None:
                self._reject(step.prompt.sample_id, reason)
                driver.abandoned()
                return None
        key = (step.prompt.sample_id, step.fingerprint)
        return _Job(step.prompt, step.body, step.fingerprint,
                    attempt=self._history.last_attempt.get(key, 0) + 1,
                    tries=self._history.open_attempts.get(key, 0), step=step)

    def _outgrown(self, driver: ConversationDriver, step: Step, reason: str) -> _Job | None:
        """A later request of a conversation no longer fits the context: not sent; its final
        record (nothing paid) stops the conversation with `length` in this run, every rerun
        and the samples alike (`--retry-failed` checks it again)."""
        fields = driver.outgrown(step, reason)
        key = (step.prompt.sample_id, step.fingerprint)
        record = AttemptRecord(
            sample_id=step.prompt.sample_id, fingerprint=step.fingerprint,
            attempt=self._history.last_attempt.get(key, 0) + 1, status="failed", final=True,
            error_class=fields["error_class"], error_message=scrub_text(reason, self.key),
            latency_s=0.0, created_at=utc_now_iso(),
            request=scrub_obj(storable_request(step.body), self.key),
            conversation=step.conversation,
        )
        log.info("conversation %s stops (length) at %s: %s", step.state.conversation_id,
                 step.prompt.sample_id, reason)
        try:
            future = self.log.submit(record)
        except RawLogError as exc:
            self._write_failed(exc)
            driver.abandoned()  # not recorded: a rerun checks it again
            return None
        # Not counted as a failed sample; only a write failure matters here.
        future.add_done_callback(partial(self._written, None, None, None))
        return self._conversation_job(driver, step.state)  # the stop: None

    def _follow_up(self, job: _Job, status: str, response: dict[str, Any] | None) -> None:
        # Called when the request's final record is durable: only now may the next request,
        # built on this answer, be paid for.
        assert job.step is not None
        driver = self._conversations()
        try:
            driver.answered(job.step, status, response)
            nxt = self._conversation_job(driver, job.step.state)
        except Exception as exc:
            self._internal_failure(exc)
            return
        if nxt is not None:
            self._ready.append(nxt)
            self._notify()
        elif self._run_over():
            self._notify()

    def _abandon_conversations(self, jobs: Iterable[_Job]) -> None:
        count = sum(1 for job in jobs if job.step is not None)
        if count:
            self._conversations().abandoned(count)

    def _record(
        self,
        sample_id: str,
        fingerprint: str,
        attempt: int,
        result: AttemptResult,
        cost: float | None,
        final: bool,
        stored_request: dict[str, Any],
    ) -> AttemptRecord:
        response = result.response
        usage = response.get("usage") if isinstance(response, dict) else None
        record = AttemptRecord(
            sample_id=sample_id,
            fingerprint=fingerprint,
            attempt=attempt,
            status=result.status,
            final=final,
            error_class=result.error_class,
            error_message=scrub_text(result.error_message, self.key)
            if result.error_message
            else None,
            latency_s=result.latency_s,
            http_status=result.http_status,
            provider=_str(response, "provider"),
            model=_str(response, "model"),
            generation_id=result.generation_id,
            usage=usage if isinstance(usage, dict) else None,
            cost_usd=cost,
            created_at=utc_now_iso(),
        )
        if final:
            record.request = stored_request
            if response is not None:
                stored, reference, prompt_ids = _lift_token_ids(response)
                record.response = scrub_obj(stored, self.key)
                record.reference_completion_ids = reference
                record.prompt_token_ids = prompt_ids
        return record

    # -- reporting -------------------------------------------------------------------------

    def snapshot(self) -> ProgressSnapshot:
        now = time.monotonic()
        self._rates.append((now, self.finished_requests, self.summary.completion_tokens))
        while len(self._rates) > 2 and now - self._rates[1][0] >= RATE_WINDOW:
            self._rates.popleft()
        then, requests, tokens = self._rates[0]
        if now - then < 1e-6:
            then, requests, tokens = self.started, 0, 0
        span = max(now - then, 1e-6)
        return ProgressSnapshot(
            done=self.summary.done,
            failed=self.summary.failed,
            in_flight=self.in_flight,
            requests_per_s=(self.finished_requests - requests) / span,
            tokens_per_s=(self.summary.completion_tokens - tokens) / span,
            cost_usd=self.summary.cost_usd,
            # Prompts skipped; a conversation's requests answered from the log are not items
            # of the progress (its conversation is, once it stops).
            skipped=self.summary.skipped - (self._driver.replayed if self._driver else 0),
            requests_sent=self.summary.requests_sent,
            retries=self.summary.retries,
            elapsed_s=now - self.started,
            completion_tokens=self.summary.completion_tokens,
            conversations=self.summary.conversations,
            conversations_done=sum(self._driver.stops.values()) if self._driver else 0,
            conversation_requests_done=self._conversation_answers,
        )

    def _call_progress(self, progress: Callable[[ProgressSnapshot], Any]) -> None:
        try:
            progress(self.snapshot())
        except Exception:
            log.exception("progress callback failed; the run goes on")

    async def _report(self, progress: Callable[[ProgressSnapshot], Any], interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            self._call_progress(progress)

    def _finish_summary(self) -> None:
        self._flight(0)
        wall = time.monotonic() - self.started
        self.summary.wall_s = wall
        self.summary.mean_in_flight = self._flight_area / wall if wall > 0 else 0.0
        if self._input_area is not None and self._input_span > 0:
            self.summary.mean_in_flight_input = self._input_area / self._input_span
        else:
            self.summary.mean_in_flight_input = self.summary.mean_in_flight
        self.summary.errors = dict(self.errors)
        if self._driver is not None:
            self.summary.conversation_stops = dict(self._driver.stops)
            self.summary.conversations_open = self._driver.open

    def _fatal_error(self, result: AttemptResult) -> FatalAPIError:
        var = self.cfg.api_key_env
        detail = scrub_text(result.error_message or "", self.key)
        if result.error_class == "unauthorized" and self.key is None:
            message = f"the server requires an API key and ${var} is not set ({detail})"
        elif result.error_class == "unauthorized":
            message = f"the API rejected the key in ${var} ({detail}); set {var} to a valid key"
        elif result.error_class == "payment_required":
            message = (
                f"the account of the key in ${var} cannot pay for requests ({detail});"
                " add credits or use another key"
            )
        else:
            message = detail
        return FatalAPIError(
            message,
            error_class=result.error_class or "fatal",
            http_status=result.http_status,
            summary=self.summary,
        )


def _planned_requests(job: _Job) -> int:
    """Requests the conversation's dataset path still holds (the model may stop sooner)."""
    assert job.step is not None
    plan, request = job.step.state.plan, job.step.request
    turns = plan.turns[request.user_turn:]
    return sum(max(1, len(t.steps)) for t in turns) - request.step


def _str(body: Any, name: str) -> str | None:
    value = body.get(name) if isinstance(body, dict) else None
    return value if isinstance(value, str) else None


def _int_list(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(type(v) is int for v in value):
        return value
    return None


def _lift_token_ids(
    response: dict[str, Any],
) -> tuple[dict[str, Any], list[int] | None, list[int] | None]:
    """The response without vLLM's token-id arrays, and those arrays (stored once, top level)."""
    prompt_ids = _int_list(response.get("prompt_token_ids"))
    choices = response.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    reference = _int_list(first.get("token_ids")) if isinstance(first, dict) else None
    if prompt_ids is None and reference is None:
        return response, None, None
    stored = dict(response)
    if prompt_ids is not None:
        stored.pop("prompt_token_ids")
    if reference is not None:
        assert isinstance(choices, list) and isinstance(first, dict)
        stored["choices"] = [{k: v for k, v in first.items() if k != "token_ids"}, *choices[1:]]
    return stored, reference, prompt_ids
