"""Run many prompts through one endpoint with a full in-flight window, retries, limits and budget.

The engine puts the run's parts together; each has its module:

* client/scheduler.py -- the window: `cfg.concurrency` workers, each one attempt at a time, a
  due retry first, then a conversation's next request, then new input; backoff and retries off
  the window; requests per minute.
* client/accounting.py -- error classes, outcomes, tokens, cost and the budget (shared with
  batch mode).
* client/feeder.py -- whole conversations: each next request once the previous answer is
  durable.
* client/recording.py -- raw-log records and their durability (shared with batch mode).
* client/reporting.py -- live progress snapshots.

Shape of a run:

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
import logging
import random
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import Any

import httpx

from specregen.client.accounting import Accounting, response_cost
from specregen.client.config import EndpointConfig
from specregen.client.feeder import Check, ConversationFeeder
from specregen.client.limits import RequestLimiter
from specregen.client.reach import is_unreachable, unreachable_error
from specregen.client.recording import RecordWriter, attempt_record, write_rejects
from specregen.client.reporting import PROGRESS_INTERVAL, Progress, Reporter
from specregen.client.request import admit
from specregen.client.scheduler import Job, RateLimiter, Scheduler, backoff_delay
from specregen.client.secrets import ApiKey, as_api_key, scrub_obj, scrub_text
from specregen.client.summary import FatalAPIError, InferenceSummary, ProgressSnapshot
from specregen.client.transport import AttemptResult, HTTPClient, send
from specregen.models.chat_format import ChatFormat
from specregen.records import Prompt
from specregen.store.rawlog import LogHistory, RawLog, RejectRecord
from specregen.wire.request import storable_request

__all__ = [
    "FatalAPIError",
    "InferenceSummary",
    "ProgressSnapshot",
    "RateLimiter",
    "backoff_delay",
    "response_cost",
    "run_inference",
]

log = logging.getLogger(__name__)


async def run_inference(
    prompts: Iterable[Prompt],
    cfg: EndpointConfig,
    log: RawLog,
    *,
    api_key: ApiKey | str | None,
    progress: Progress | None = None,
    retry_failed: bool = False,
    transport: httpx.AsyncBaseTransport | None = None,
    progress_interval: float = PROGRESS_INTERVAL,
    rng: random.Random | None = None,
    prompt_check: Check | None = None,
    rejects: Iterable[RejectRecord] = (),
    should_stop: Callable[[], str | None] | None = None,
    limiter: RequestLimiter | None = None,
    chat_format: ChatFormat | None = None,
    followup_check: Check | None = None,
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
    run = _Run(cfg, log, as_api_key(api_key), retry_failed, transport, rng or random.Random(),
               prompt_check=prompt_check, followup_check=followup_check or prompt_check,
               chat_format=chat_format, should_stop=should_stop, limiter=limiter)
    run.rejects.extend(rejects)
    return await run.execute(prompts, progress, progress_interval)


class _Run:
    def __init__(
        self,
        cfg: EndpointConfig,
        log: RawLog,
        key: ApiKey | None,
        retry_failed: bool,
        transport: httpx.AsyncBaseTransport | None,
        rng: random.Random,
        *,
        prompt_check: Check | None,
        followup_check: Check | None,
        chat_format: ChatFormat | None,
        should_stop: Callable[[], str | None] | None,
        limiter: RequestLimiter | None,
    ) -> None:
        self.cfg = cfg
        self.log = log
        self.key = key
        self.retry_failed = retry_failed
        self.transport = transport
        self.rng = rng
        self.prompt_check = prompt_check
        self.should_stop = should_stop
        # Limits shared with other processes (specregen/client/limits.py): asked before each
        # request, after the local requests_per_minute, and told when it ends.
        self.limiter = limiter
        self.summary = InferenceSummary()
        self.accounting = Accounting(self.summary, cfg)
        self.rejects: list[RejectRecord] = []
        self.fatal_result: AttemptResult | None = None
        # Whether any HTTP answer came back in this run, and the first failed connection
        # before one did (client/reach.py).
        self.answered = False
        self.unreachable: AttemptResult | None = None
        self.internal_error: BaseException | None = None
        self.rpm = RateLimiter(cfg.requests_per_minute) if cfg.requests_per_minute else None
        self._seen: set[str] = set()
        self._history = LogHistory()
        self._source: Iterator[Prompt] = iter(())
        self.scheduler = Scheduler(cfg.concurrency, self._next_sample,
                                   ConversationFeeder.planned_requests)
        self.writer = RecordWriter(log, partial(self._stop, "raw_log_error"))
        self.feeder = ConversationFeeder(
            cfg, self._history, self.summary, self.writer, self._reject, key=key,
            retry_failed=retry_failed, chat_format=chat_format, prompt_check=prompt_check,
            followup_check=followup_check)
        self.reporter = Reporter(self.summary, self.scheduler, self.feeder)

    # -- the run ---------------------------------------------------------------------------

    async def execute(
        self,
        prompts: Iterable[Prompt],
        progress: Progress | None,
        interval: float,
    ) -> InferenceSummary:
        cfg = self.cfg
        # The history is read before the first request: a rerun never pays twice for a sample,
        # and attempts of earlier runs count against max_attempts.
        self._history = self.feeder.history = await asyncio.to_thread(self.log.history)
        self._source = iter(prompts)
        self.scheduler.start()
        per_shard = cfg.connections_per_shard
        limits = httpx.Limits(max_connections=per_shard, max_keepalive_connections=per_shard)
        # One TLS context for all shards: each client would otherwise load the CA bundle again
        # (about 30 ms of CPU each, 6 s for 200 shards).
        tls = httpx.create_ssl_context()
        clients = [
            HTTPClient(limits=limits, transport=self.transport, verify=tls)
            for _ in range(cfg.shards)
        ]
        reporter = (asyncio.create_task(self.reporter.every(progress, interval))
                    if progress else None)
        try:
            async with asyncio.TaskGroup() as group:
                for worker in range(cfg.concurrency):
                    handle = partial(self._send_job, clients[worker // per_shard])
                    group.create_task(self.scheduler.worker(handle, self._internal_failure))
        finally:
            if reporter is not None:
                reporter.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reporter
            for client in clients:
                await client.aclose()
            retries = self.scheduler.drain_retries()
            self.summary.abandoned += len(retries)
            self.feeder.abandon(retries)
            # Everything queued must be durable before the counts are final.
            await self.log.flush()
            ready, lookahead = self.scheduler.drain_queued()
            self.summary.abandoned += len(ready) + len(lookahead)
            self.feeder.abandon(ready)
            self.feeder.abandon(lookahead)
            await write_rejects(self.log, self.rejects, self.summary)
        self._finish_summary()
        if progress is not None:
            self.reporter.call(progress)
        if self.writer.error is not None:
            raise self.writer.error
        if self.internal_error is not None:
            raise self.internal_error
        if self.unreachable is not None:
            raise unreachable_error(cfg.base_url, self.unreachable.error_message)
        if self.fatal_result is not None:
            raise self._fatal_error(self.fatal_result)
        return self.summary

    def _reject(self, sample_id: str | None, reason: str) -> None:
        self.rejects.append(RejectRecord(reason=reason, sample_id=sample_id))
        log.warning("sample %s not sent: %s", sample_id, reason)

    def _next_sample(self) -> Job | None:
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
                job = self.feeder.start(prompt)
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
                return Job(prompt, admitted.body, admitted.fingerprint,
                           attempt=admitted.attempt, tries=admitted.tries)
        return None

    async def _send_job(self, client: httpx.AsyncClient, job: Job) -> None:
        written = await self._attempt_job(client, job)
        if written is not None:
            await self.writer.until_durable(written, self.scheduler.in_flight)

    async def _attempt_job(
        self, client: httpx.AsyncClient, job: Job
    ) -> asyncio.Future[None] | None:
        """One attempt of `job`; returns the future of its final raw-log record, which holds
        the worker's slot until durable (None: nothing sent, or no final record)."""
        cfg, scheduler = self.cfg, self.scheduler
        if job.stored_request is None:
            job.stored_request = scrub_obj(storable_request(job.body), self.key)
        if self.rpm is not None and not scheduler.stopped:
            await self.rpm.acquire()
        limiter = self.limiter if not scheduler.stopped else None
        if limiter is not None:
            await limiter.acquire()
        if self.should_stop is not None and not scheduler.stopped:
            reason = self.should_stop()
            if reason:
                self._stop(reason)
        if not scheduler.stopped and not self.accounting.allows(scheduler.in_flight):
            self._stop("budget")
        if scheduler.stopped:
            if limiter is not None:
                limiter.release(sent=False)
            self.summary.abandoned += 1
            self.feeder.abandon([job])
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
            self.feeder.abandon([job])
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
        record = attempt_record(
            job.prompt.sample_id, job.fingerprint, attempt, result, cost=cost, final=final,
            request=job.stored_request, key=self.key, latency_s=result.latency_s,
            http_status=result.http_status, generation_id=result.generation_id,
        )
        if job.step is not None:
            record.conversation = job.step.conversation
        follow = job.step is not None and final
        future = self.writer.submit(record, partial(
            self._written, result.status if final else None, job if follow else None,
            record.response))
        if future is None:
            self.summary.abandoned += 1
            self.feeder.abandon([job])
            return None
        if follow:
            scheduler.awaiting += 1
        self.accounting.attempt(result, cost)
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
            self.feeder.abandon([job])
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
        scheduler.retry_later(job, delay)
        # Not a final record: no answer was paid for, so the slot need not wait for it.
        return None

    async def _attempt(self, client: httpx.AsyncClient, body: dict[str, Any]) -> AttemptResult:
        self.scheduler.flight(+1)
        self.summary.requests_sent += 1
        try:
            return await send(client, self.cfg, body, self.key)
        finally:
            self.scheduler.flight(-1)
            self.reporter.finished_requests += 1

    def _written(self, final_status: str | None, job: Job | None,
                 response: dict[str, Any] | None, future: asyncio.Future[None]) -> None:
        if job is not None:
            self.scheduler.awaiting -= 1
        if self.writer.outcome(future) is not None:
            self.feeder.abandon([job] if job is not None else [])
            return
        if final_status is None:
            return
        self.accounting.final(final_status)
        if job is not None:
            self._follow_up(job, final_status, response)

    def _follow_up(self, job: Job, status: str, response: dict[str, Any] | None) -> None:
        # Called when the request's final record is durable: only now may the next request,
        # built on this answer, be paid for.
        try:
            nxt = self.feeder.answered(job, status, response)
        except Exception as exc:
            self._internal_failure(exc)
            return
        if nxt is not None:
            self.scheduler.follow(nxt)
        elif self.scheduler.run_over():
            self.scheduler.notify()

    def _stop(self, reason: str) -> None:
        if self.scheduler.stop():
            self.summary.stopped_reason = reason
            log.info("inference stopping: %s", reason)

    def _internal_failure(self, error: BaseException) -> None:
        log.error("inference: unexpected error (%s: %s); stopping", type(error).__name__, error)
        if self.internal_error is None:
            self.internal_error = error
        self._stop("error")

    # -- the outcome -----------------------------------------------------------------------

    def _finish_summary(self) -> None:
        s = self.summary
        s.wall_s, s.mean_in_flight, s.mean_in_flight_input = self.scheduler.means()
        s.peak_in_flight = self.scheduler.peak_in_flight
        if self.feeder.started:
            s.conversation_stops = dict(self.feeder.stops)
            s.conversations_open = self.feeder.open

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
