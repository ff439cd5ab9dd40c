"""Batch mode: the same requests as realtime, through the provider's batch API at its price.

A run (`run_batch_inference`):

1. Reads the raw log's history (finals, attempts) and the batch ledger (`{raw log}/batches/`).
2. Builds every prompt's request exactly as realtime does, minus `stream` (fingerprints are
   equal: one raw log holds both modes, and reconstruction, resume and the gate cannot tell).
   Samples with a final record are skipped; samples inside an open batch are left to it.
3. Recovers open batches first. A batch's life in the ledger is three durable files:
   `{marker}.intent.json` (written BEFORE the submit: custom_ids -> sample, fingerprint,
   attempt), `{marker}.submitted.json` (the provider's batch id, written right after the submit
   answers, before anything else happens) and `{marker}.done.json` (written once every result
   of the batch is durable in the raw log). The marker travels in the batch's `metadata`; an
   intent without an id (killed between submit and record) is looked up in the provider's
   batch listing by that marker and only submitted when it is not there. So no batch is ever
   submitted twice, and a batch whose results are recorded is never read again.
4. Splits the remaining requests into batches of at most `batch.max_requests` requests and
   `batch.max_bytes` bytes (one model and one provider each: the endpoint config pins them),
   within the budget, and submits them.
5. Polls open batches every `batch.poll_seconds` (or once, `wait=False`: a scheduler calls again
   later), reads the results of finished ones into the raw log, and sends what failed or
   expired again: in a later batch (`batch_fallback: resubmit`), or realtime
   (`batch_fallback: realtime`), each sample within `retry.max_attempts` attempts across runs.

custom_id = `{sample_id}.{first 24 hex of the request fingerprint}`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx

from specregen.client.accounting import Accounting
from specregen.client.batch_api import BatchAPI, BatchAPIError, BatchInfo
from specregen.client.config import EndpointConfig
from specregen.client.cost import CostView, realtime_equivalent, usage_cost
from specregen.client.engine import run_inference
from specregen.client.recording import attempt_record, text_field, write_rejects
from specregen.client.request import admit
from specregen.client.secrets import ApiKey, as_api_key, scrub_obj, scrub_text
from specregen.client.summary import FatalAPIError, InferenceSummary, ProgressSnapshot
from specregen.client.transport import classify_status, judge_body
from specregen.records import Prompt
from specregen.store.rawlog import FINAL_ANSWER, LogHistory, RawLog, RejectRecord, utc_now_iso
from specregen.wire.request import TRANSPORT_FIELDS, storable_request

log = logging.getLogger(__name__)

LEDGER_DIR = "batches"


@dataclass
class BatchSummary(InferenceSummary):
    mode: str = "batch"
    batches_submitted: int = 0  # by this run
    batches_recovered: int = 0  # found again by marker after a crash, not submitted again
    batches_finished: int = 0  # results recorded by this run
    batches_open: int = 0  # still running at the end (wait=False, or stopped)
    requests_in_batches: int = 0  # requests waiting in open batches at the end
    open_batches: list[str] = field(default_factory=list)  # their provider ids
    batches_total: int = 0  # in the ledger, every run
    batches_done_total: int = 0  # of them, results recorded
    requests_submitted: int = 0
    sent_realtime: int = 0  # failed batch requests sent realtime (batch_fallback: realtime)
    # The cost view of this run ...
    realtime_equivalent_usd: float = 0.0
    projected_usd: float = 0.0
    savings_usd: float = 0.0
    # ... and of the whole raw log (every run into it; batch records known from the ledger):
    # what the output has cost so far, what it will have cost when every sample is final, and
    # the savings against asking the same realtime.
    spent_total_usd: float = 0.0
    projected_total_usd: float = 0.0
    realtime_equivalent_total_usd: float = 0.0
    savings_total_usd: float = 0.0


@dataclass(slots=True)
class BatchProgress(ProgressSnapshot):
    batches_submitted: int = 0
    batches_finished: int = 0
    batches_open: int = 0


@dataclass(slots=True)
class _Job:
    prompt: Prompt
    body: dict[str, Any]
    fingerprint: str
    custom_id: str
    attempt: int  # number of the next attempt
    tries: int  # attempts in this round so far (earlier runs included)


@dataclass
class _Batch:
    marker: str
    ids: dict[str, list[Any]]  # custom_id -> [sample_id, fingerprint, attempt]
    batch_id: str | None = None
    done: bool = False
    created_at: str = ""


def custom_id(sample_id: str, fingerprint: str) -> str:
    return f"{sample_id}.{fingerprint[:24]}"


class Ledger:
    """The durable record of this raw log's batches (see the module docstring)."""

    def __init__(self, raw_log: RawLog) -> None:
        self.fs = raw_log.fs
        self.root = f"{raw_log.root}/{LEDGER_DIR}"

    def _write(self, name: str, value: dict[str, Any]) -> None:
        from specregen.store.fs import write_atomic

        write_atomic(self.fs, f"{self.root}/{name}", json.dumps(value).encode())

    def load(self) -> dict[str, _Batch]:
        self.fs.invalidate_cache(self.root)
        try:
            names = sorted(p.rsplit("/", 1)[-1] for p in self.fs.ls(self.root, detail=False))
        except FileNotFoundError:
            return {}
        batches: dict[str, _Batch] = {}
        for name in names:
            if name.endswith(".intent.json"):
                data = self._read(name)
                if data is not None:
                    batches[data["marker"]] = _Batch(data["marker"], data["ids"],
                                                     created_at=data.get("created_at", ""))
        for name in names:
            marker, _, kind = name.partition(".")
            batch = batches.get(marker)
            if batch is None:
                continue
            if kind == "submitted.json":
                data = self._read(name)
                if data is not None:
                    batch.batch_id = data["batch_id"]
            elif kind == "done.json":
                batch.done = True
        return batches

    def _read(self, name: str) -> dict[str, Any] | None:
        try:
            with self.fs.open(f"{self.root}/{name}", "rb") as handle:
                return json.loads(handle.read())
        except (FileNotFoundError, ValueError):
            return None  # a torn write of a crashed run: as if never written

    def intent(self, batch: _Batch, info: dict[str, Any]) -> None:
        self._write(f"{batch.marker}.intent.json", {"marker": batch.marker, "ids": batch.ids,
                                                    "created_at": batch.created_at, **info})

    def submitted(self, batch: _Batch, batch_id: str) -> None:
        batch.batch_id = batch_id
        self._write(f"{batch.marker}.submitted.json",
                    {"batch_id": batch_id, "submitted_at": utc_now_iso()})

    def finished(self, batch: _Batch, status: str, counts: dict[str, int]) -> None:
        batch.done = True
        self._write(f"{batch.marker}.done.json",
                    {"status": status, "finished_at": utc_now_iso(), **counts})


async def run_batch_inference(
    prompts: Iterable[Prompt],
    cfg: EndpointConfig,
    raw_log: RawLog,
    *,
    api_key: ApiKey | str | None,
    wait: bool = True,
    progress: Callable[[ProgressSnapshot], Any] | None = None,
    retry_failed: bool = False,
    transport: httpx.AsyncBaseTransport | None = None,
    prompt_check: Callable[[Prompt, dict[str, Any]], str | None] | None = None,
    rejects: Iterable[RejectRecord] = (),
    should_stop: Callable[[], str | None] | None = None,
    sleep: Callable[[float], Any] = asyncio.sleep,
) -> BatchSummary:
    """Every prompt without a final result, through the batch API (module docstring).

    `wait=False`: submit, poll once, record what finished, and return; `batches_open` says
    whether to call again later (the Prefect flow does, without holding a worker)."""
    run = _BatchRun(cfg, raw_log, as_api_key(api_key), retry_failed, transport)
    run.prompt_check = prompt_check
    run.should_stop = should_stop
    run.rejects.extend(rejects)
    run.progress = progress
    run.sleep = sleep
    return await run.execute(prompts, wait)


class _BatchRun:
    def __init__(self, cfg: EndpointConfig, raw_log: RawLog, key: ApiKey | None,
                 retry_failed: bool, transport: httpx.AsyncBaseTransport | None) -> None:
        self.cfg = cfg
        self.log = raw_log
        self.key = key
        self.retry_failed = retry_failed
        self.transport = transport
        self.summary = BatchSummary()
        self.accounting = Accounting(self.summary, cfg, "batch")
        self.cost = self.accounting.cost
        self.rejects: list[RejectRecord] = []
        self.prompt_check: Callable[[Prompt, dict[str, Any]], str | None] | None = None
        self.should_stop: Callable[[], str | None] | None = None
        self.progress: Callable[[ProgressSnapshot], Any] | None = None
        self.sleep: Callable[[float], Any] = asyncio.sleep
        self.ledger = Ledger(raw_log)
        self.history = LogHistory()
        self.jobs: dict[str, _Job] = {}  # custom_id -> job, for every sample still needed
        self.batches: dict[str, _Batch] = {}
        self.started = time.monotonic()
        self.realtime_requests = 0

    async def execute(self, prompts: Iterable[Prompt], wait: bool) -> BatchSummary:
        self.history = await asyncio.to_thread(self.log.history)
        self.batches = await asyncio.to_thread(self.ledger.load)
        self._build_jobs(prompts)
        claimed = {cid for b in self.batches.values() if not b.done for cid in b.ids}
        async with httpx.AsyncClient(transport=self.transport) as client:
            api = BatchAPI(client, self.cfg, self.key)
            try:
                await self._recover(api)
                todo = [j for cid, j in self.jobs.items() if cid not in claimed]
                while True:
                    if todo:
                        await self._submit_all(api, todo)
                    retry = await self._poll(api, wait)
                    if self._open():
                        break  # wait=False, or stopped: the open batches stay in the ledger
                    todo = []
                    if retry and self.summary.stopped_reason is None:
                        if self.cfg.batch_fallback == "realtime":
                            await self._realtime(retry)
                        else:
                            todo = retry
                    if not todo:
                        break
            except BatchAPIError as exc:
                if exc.kind == "fatal":
                    raise self._fatal(exc) from None
                raise
            finally:
                await self.log.flush()
                await write_rejects(self.log, self.rejects, self.summary, strict=True)
        total = await asyncio.to_thread(self._log_view)
        self._finish(total)
        return self.summary

    # -- jobs ------------------------------------------------------------------------------

    def _build_jobs(self, prompts: Iterable[Prompt]) -> None:
        seen: set[str] = set()
        for prompt in prompts:
            sample_id = getattr(prompt, "sample_id", None)
            if not isinstance(sample_id, str):
                self._reject(None, f"not a prompt ({type(prompt).__name__})")
                continue
            if sample_id in seen:
                self.summary.duplicates += 1
                continue
            seen.add(sample_id)
            admitted = admit(prompt, self.cfg, self.history, retry_failed=self.retry_failed,
                             prompt_check=self.prompt_check)
            if admitted is None:
                self.summary.skipped += 1
                continue
            if isinstance(admitted, str):
                self._reject(sample_id, admitted)
                continue
            # A batch request is answered whole: no stream (the fingerprint excludes it).
            body = {k: v for k, v in admitted.body.items() if k not in TRANSPORT_FIELDS}
            cid = custom_id(sample_id, admitted.fingerprint)
            self.jobs[cid] = _Job(prompt, body, admitted.fingerprint, cid,
                                  attempt=admitted.attempt, tries=admitted.tries)

    def _reject(self, sample_id: str | None, reason: str) -> None:
        self.rejects.append(RejectRecord(reason=reason, sample_id=sample_id))
        log.warning("sample %s not sent: %s", sample_id, reason)

    # -- submitting ------------------------------------------------------------------------

    async def _recover(self, api: BatchAPI) -> None:
        for batch in list(self.batches.values()):
            if batch.done or batch.batch_id is not None:
                continue
            info = await api.find(batch.marker)
            if info is not None:
                await asyncio.to_thread(self.ledger.submitted, batch, info.id)
                self.summary.batches_recovered += 1
                log.info("batch %s (marker %s) found again; not submitted twice", info.id,
                         batch.marker)
                continue
            # Never reached the provider: send the same requests (those still needed).
            items = [(cid, self.jobs[cid].body) for cid in batch.ids if cid in self.jobs]
            if not items:
                await asyncio.to_thread(self.ledger.finished, batch, "abandoned", {})
                continue
            await self._send(api, batch, items)

    async def _submit_all(self, api: BatchAPI, jobs: list[_Job]) -> None:
        for chunk in self._split(api, jobs):
            if self._stopping():
                self.summary.abandoned += len(chunk)
                continue
            affordable = self.accounting.affordable(len(chunk), self._open_requests())
            if affordable < len(chunk):
                self._stop("budget")
                self.summary.abandoned += len(chunk) - affordable
                chunk = chunk[:affordable]
                if not chunk:
                    continue
            batch = _Batch(secrets.token_hex(12),
                           {j.custom_id: [j.prompt.sample_id, j.fingerprint, j.attempt]
                            for j in chunk}, created_at=utc_now_iso())
            self.batches[batch.marker] = batch
            # Durable BEFORE the submit: a crash after it leaves a marker to look for.
            await asyncio.to_thread(self.ledger.intent, batch, {
                "api": self.cfg.batch.api, "model": self.cfg.model,
                "provider": self.cfg.provider.only if self.cfg.provider else None})
            await self._send(api, batch, [(j.custom_id, j.body) for j in chunk])

    async def _send(self, api: BatchAPI, batch: _Batch, items: list[tuple[str, dict]]) -> None:
        payload = api.payload(items, batch.marker)
        info = await api.submit(payload, batch.marker)
        # Durable before anything else happens (the next batch, polling, a kill).
        await asyncio.to_thread(self.ledger.submitted, batch, info.id)
        self.summary.batches_submitted += 1
        self.summary.requests_submitted += len(items)
        log.info("batch %s submitted: %d requests, %d bytes", info.id, len(items), len(payload))
        self._report()

    def _split(self, api: BatchAPI, jobs: list[_Job]) -> list[list[_Job]]:
        limit_n, limit_bytes = self.cfg.batch.max_requests, self.cfg.batch.max_bytes
        chunks: list[list[_Job]] = []
        current: list[_Job] = []
        size = 1_024  # the envelope
        for job in jobs:
            item = len(api.payload([(job.custom_id, job.body)], "x" * 24))
            if current and (len(current) >= limit_n or size + item > limit_bytes):
                chunks.append(current)
                current, size = [], 1_024
            if item + 1_024 > limit_bytes:
                self._reject(job.prompt.sample_id,
                             f"request of {item} bytes exceeds the batch limit of {limit_bytes}")
                continue
            current.append(job)
            size += item + 1
        if current:
            chunks.append(current)
        return chunks

    # -- polling and results ---------------------------------------------------------------

    def _open(self) -> list[_Batch]:
        return [b for b in self.batches.values() if not b.done and b.batch_id is not None]

    def _open_requests(self) -> int:
        return sum(len(b.ids) for b in self._open())

    async def _poll(self, api: BatchAPI, wait: bool) -> list[_Job]:
        """Collect finished batches; with `wait`, until none is open. The jobs to send again."""
        retry: list[_Job] = []
        while True:
            for batch in self._open():
                assert batch.batch_id is not None
                try:
                    info = await api.get(batch.batch_id)
                except BatchAPIError as exc:
                    if exc.status != 404:
                        raise
                    # The provider no longer knows it (deleted, past retention): its requests
                    # have no results and are sent again; the batch is closed in the ledger.
                    log.warning("batch %s is unknown to the provider; its requests are sent"
                                " again", batch.batch_id)
                    info = BatchInfo(id=batch.batch_id, status="lost")
                    retry += await self._collect(api, batch, info, lost=True)
                    continue
                if info.terminal:
                    retry += await self._collect(api, batch, info)
            self._report()
            if not self._open() or not wait or self._stopping():
                return retry
            await self.sleep(self.cfg.batch.poll_seconds)

    async def _collect(
        self, api: BatchAPI, batch: _Batch, info: BatchInfo, *, lost: bool = False
    ) -> list[_Job]:
        seen: set[str] = set()
        retry: list[_Job] = []
        async for item in _nothing() if lost else api.results(info):
            cid = item.get("custom_id")
            if not isinstance(cid, str) or cid not in batch.ids or cid in seen:
                continue
            seen.add(cid)
            again = self._record(batch, cid, item)
            if again is not None:
                retry.append(again)
        for cid in batch.ids:
            if cid not in seen:  # expired or cancelled before it ran: no result line
                again = self._record(batch, cid, {"error": {
                    "code": f"batch_{info.status}", "message": f"no result: batch {info.status}"}})
                if again is not None:
                    retry.append(again)
        # The results are durable before the batch counts as read: a crash before this line
        # reads them again (free), a crash after never does.
        await self.log.flush()
        await asyncio.to_thread(self.ledger.finished, batch, info.status,
                                {"results": len(seen), "total": len(batch.ids)})
        self.summary.batches_finished += 1
        return retry

    def _record(self, batch: _Batch, cid: str, item: dict[str, Any]) -> _Job | None:
        sample_id, fingerprint, attempt = batch.ids[cid]
        key = (sample_id, fingerprint)
        if self.history.final.get(key) in FINAL_ANSWER or (
                self.history.last_attempt.get(key, 0) >= attempt):
            return None  # recorded before a crash: never twice
        job = self.jobs.get(cid)
        response = item.get("response") if isinstance(item.get("response"), dict) else None
        error = item.get("error")
        status_code = response.get("status_code") if response else None
        body = response.get("body") if response else None
        if status_code == 200 and not error:
            result = judge_body(body, 200)
            kind = result.kind
        else:
            text = _error_text(error, body, status_code)
            result = judge_body({"error": text}, status_code)
            result.error_class = _error_class(error, status_code)
            result.error_message = text
            kind = "retryable"
            if isinstance(status_code, int) and status_code >= 400:
                kind = classify_status(status_code)[1]
            result.kind = kind
            result.response = body if isinstance(body, dict) else None
        tries = (job.tries if job else 0) + 1
        # A prompt gone from this run's input (it changed since the batch was sent) has no
        # request to store: its answer cannot be final, but what was paid for is kept below.
        final = job is not None and (result.final_answer or kind in ("permanent", "fatal")
                                     or tries >= self.cfg.retry.max_attempts)
        cost = usage_cost(result.response, self.cfg.prices, "batch")
        realtime = realtime_equivalent(result.response, cost, self.cfg.prices, "batch")
        request = None
        if final and job is not None:
            request = scrub_obj(storable_request(job.body), self.key)
        # A batch result keeps its response even when not final (what was paid for).
        record = attempt_record(
            sample_id, fingerprint, attempt, result, cost=cost, final=final, request=request,
            key=self.key, latency_s=None,
            http_status=status_code if isinstance(status_code, int) else None,
            generation_id=text_field(result.response, "id"), keep_response=True,
        )
        self.log.submit(record)
        self.history.last_attempt[key] = attempt
        self.accounting.attempt(result, cost, realtime)
        if final:
            self.accounting.final(result.status)
        if final or job is None:
            self.jobs.pop(cid, None)
            return None
        job.tries = tries
        job.attempt = attempt + 1
        self.summary.retries += 1
        return job

    # -- realtime fallback -----------------------------------------------------------------

    async def _realtime(self, jobs: list[_Job]) -> None:
        await self.log.flush()
        update: dict[str, Any] = {"mode": "realtime"}
        if self.cfg.budget_usd is not None:
            update["budget_usd"] = max(0.0, self.cfg.budget_usd - self.cost.spent_usd)
        cfg = self.cfg.model_copy(update=update)
        self.summary.sent_realtime += len(jobs)
        try:
            sub = await run_inference([j.prompt for j in jobs], cfg, self.log, api_key=self.key,
                                      transport=self.transport, should_stop=self.should_stop)
        except FatalAPIError as exc:
            if exc.summary is not None:
                self._merge(exc.summary)
            raise
        self._merge(sub)
        for job in jobs:
            self.jobs.pop(job.custom_id, None)

    def _merge(self, sub: InferenceSummary) -> None:
        self.realtime_requests += sub.requests_sent
        self.accounting.merge(sub)

    # -- stopping, reporting ---------------------------------------------------------------

    def _stopping(self) -> bool:
        if self.summary.stopped_reason is None and self.should_stop is not None:
            reason = self.should_stop()
            if reason:
                self._stop(reason)
        return self.summary.stopped_reason is not None

    def _stop(self, reason: str) -> None:
        if self.summary.stopped_reason is None:
            self.summary.stopped_reason = reason
            log.info("batch inference stopping: %s", reason)

    def _fatal(self, exc: BatchAPIError) -> FatalAPIError:
        var = self.cfg.api_key_env
        message = scrub_text(str(exc), self.key)
        if exc.status == 401:
            message = f"the batch API rejected the key in ${var} ({message})"
        elif exc.status == 402:
            message = f"the account of the key in ${var} cannot pay for batches ({message})"
        self._finish()
        return FatalAPIError(message, error_class="batch_api", http_status=exc.status,
                             summary=self.summary)

    def _report(self) -> None:
        if self.progress is None:
            return
        s = self.summary
        snap = BatchProgress(
            done=s.done, failed=s.failed, in_flight=self._open_requests(),
            requests_per_s=0.0, tokens_per_s=0.0, cost_usd=self.cost.spent_usd,
            skipped=s.skipped, requests_sent=s.requests_submitted, retries=s.retries,
            elapsed_s=time.monotonic() - self.started,
            batches_submitted=s.batches_submitted + s.batches_recovered,
            batches_finished=s.batches_finished, batches_open=len(self._open()),
        )
        try:
            self.progress(snap)
        except Exception:
            log.exception("progress callback failed; the run goes on")

    def _log_view(self) -> CostView:
        """Cost of every attempt in the raw log; a batch result (its attempt is in a ledger
        intent) is compared with its realtime price, a realtime one with itself."""
        in_batches = {(ids[0], ids[1], ids[2]) for b in self.batches.values()
                      for ids in b.ids.values()}
        view = CostView()
        for record in self.log.iter_records():
            cost = record.get("cost_usd")
            if not isinstance(cost, int | float):
                continue
            key = (record.get("sample_id"), record.get("fingerprint"), record.get("attempt"))
            body = {"usage": record.get("usage")}
            mode = "batch" if key in in_batches else "realtime"
            view.add(float(cost), realtime_equivalent(body, float(cost), self.cfg.prices, mode))
        view.remaining = len(self.jobs)
        return view

    def _finish(self, total: CostView | None = None) -> None:
        s = self.summary
        if total is not None:
            totals = total.as_dict()
            s.spent_total_usd = totals["spent_usd"]
            s.projected_total_usd = totals["projected_usd"]
            s.realtime_equivalent_total_usd = totals["realtime_equivalent_usd"]
            s.savings_total_usd = totals["savings_usd"]
        s.wall_s = time.monotonic() - self.started
        s.batches_open = len(self._open())
        s.open_batches = sorted(b.batch_id for b in self._open() if b.batch_id)
        s.batches_total = sum(1 for b in self.batches.values() if b.batch_id or b.done)
        s.batches_done_total = sum(1 for b in self.batches.values() if b.done)
        s.requests_in_batches = self._open_requests()
        s.cost_usd = round(self.cost.spent_usd, 9)
        self.cost.remaining = len(self.jobs)
        view = self.cost.as_dict()
        s.projected_usd = view["projected_usd"]
        s.realtime_equivalent_usd = view["realtime_equivalent_usd"]
        s.savings_usd = view["savings_usd"]
        s.requests_sent = self.realtime_requests + s.requests_submitted


async def _nothing() -> Any:
    return
    yield


def _error_text(error: Any, body: Any, status: Any) -> str:
    for source in (error, body.get("error") if isinstance(body, dict) else None):
        if isinstance(source, dict):
            code = source.get("code")
            message = source.get("message") or ""
            return f"{code} {message}".strip() if code is not None else str(message)
        if source:
            return str(source)[:500]
    return f"HTTP {status}" if status is not None else "no result"


def _error_class(error: Any, status: Any) -> str:
    if isinstance(error, dict) and isinstance(error.get("code"), str):
        return error["code"]
    if isinstance(status, int):
        return classify_status(status)[0]
    return "batch_error"


__all__ = ["BatchProgress", "BatchSummary", "Ledger", "custom_id", "run_batch_inference"]
