"""Raw-log records of a run: what an attempt's record holds, and its way to durability.

Every finished attempt becomes one `AttemptRecord` (`attempt_record`), realtime and batch
alike: keys and secrets scrubbed, and on a final record the request as stored and the response
with vLLM's token-id arrays lifted to the record's top level (stored once,
`wire.token_ids`). A sample counts as done only once its final record is durable:
`RecordWriter.submit` queues a record and calls back when the raw log has it (or failed to),
and `until_durable` holds a worker's window slot until then, so at any moment at most one
window of answers is paid but not yet in the log (a SIGKILL costs at most that). The first
write error stops the run (`on_error`). Prompts that are never sent are written as the run's
rejects (`write_rejects`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from specregen.client.driver import Step
from specregen.client.secrets import ApiKey, scrub_obj, scrub_text
from specregen.client.summary import InferenceSummary
from specregen.store.rawlog import AttemptRecord, RawLog, RawLogError, RejectRecord, utc_now_iso
from specregen.wire.request import storable_request
from specregen.wire.token_ids import lift_token_ids

log = logging.getLogger(__name__)


def attempt_record(
    sample_id: str,
    fingerprint: str,
    attempt: int,
    result: Any,
    *,
    cost: float | None,
    final: bool,
    request: dict[str, Any] | None,
    key: ApiKey | None,
    latency_s: float | None,
    http_status: int | None,
    generation_id: str | None,
    keep_response: bool = False,
) -> AttemptRecord:
    """The record of one attempt (an `AttemptResult`). A final record holds `request` (as
    stored, scrubbed) and the response; `keep_response` keeps a non-final one's response too."""
    response = result.response
    usage = response.get("usage") if isinstance(response, dict) else None
    record = AttemptRecord(
        sample_id=sample_id,
        fingerprint=fingerprint,
        attempt=attempt,
        status=result.status,
        final=final,
        error_class=result.error_class,
        error_message=scrub_text(result.error_message, key) if result.error_message else None,
        latency_s=latency_s,
        http_status=http_status,
        provider=text_field(response, "provider"),
        model=text_field(response, "model"),
        generation_id=generation_id,
        usage=usage if isinstance(usage, dict) else None,
        cost_usd=cost,
        created_at=utc_now_iso(),
    )
    if final:
        record.request = request
        if response is not None:
            stored, reference, prompt_ids = lift_token_ids(response)
            record.response = scrub_obj(stored, key)
            record.reference_completion_ids = reference
            record.prompt_token_ids = prompt_ids
    elif keep_response and response is not None:
        record.response = scrub_obj(response, key)
    return record


def refusal_record(step: Step, attempt: int, error_class: str, reason: str,
                   key: ApiKey | None) -> AttemptRecord:
    """The final record of a conversation's request that is not sent (it outgrew the
    context): nothing paid, no response."""
    return AttemptRecord(
        sample_id=step.prompt.sample_id, fingerprint=step.fingerprint,
        attempt=attempt, status="failed", final=True,
        error_class=error_class, error_message=scrub_text(reason, key),
        latency_s=0.0, created_at=utc_now_iso(),
        request=scrub_obj(storable_request(step.body), key),
        conversation=step.conversation,
    )


class RecordWriter:
    """A realtime run's records on their way into `raw_log`; `on_error()` hears of the first
    write error (kept in `error`)."""

    def __init__(self, raw_log: RawLog, on_error: Callable[[], None]) -> None:
        self.log = raw_log
        self.error: BaseException | None = None
        self._on_error = on_error

    def submit(self, record: AttemptRecord,
               done: Callable[[asyncio.Future[None]], object]) -> asyncio.Future[None] | None:
        """Queue `record`; `done(future)` is called once it is durable or failed. None: the
        raw log refused it (failed earlier), and the run stops."""
        try:
            future = self.log.submit(record)
        except RawLogError as exc:
            self.failed(exc)
            return None
        future.add_done_callback(done)
        return future

    def outcome(self, future: asyncio.Future[None]) -> BaseException | None:
        """A write's error (None: durable); an error also stops the run."""
        if future.cancelled():
            error: BaseException | None = RawLogError(
                f"raw log {self.log.root_url}: write cancelled")
        else:
            error = future.exception()
        if error is not None:
            self.failed(error)
        return error

    def failed(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
            self._on_error()

    async def until_durable(self, written: asyncio.Future[None], in_flight: int) -> None:
        # The worker's slot stays taken until its record is durable: an answer not yet in the
        # log is lost (and paid again) in a crash just like one in flight, so holding the slot
        # keeps paid-but-not-durable answers within the window at every moment (issue 10's
        # SIGKILL bound). Write errors are handled by the record's callback, like before.
        if in_flight == 0:
            # No answer can join this commit soon: waiting for a full part or the timer would
            # only idle the window (an object store whose roll_records exceed the workers).
            self.log.commit_soon()
        with contextlib.suppress(Exception):
            await asyncio.shield(written)  # a cancelled worker must not cancel the write


async def write_rejects(raw_log: RawLog, rejects: list[RejectRecord],
                        summary: InferenceSummary, *, strict: bool = False) -> None:
    """The run's rejects into its summary and the raw log's `rejects-*.jsonl`; a write error
    is logged (`strict`: raised)."""
    summary.rejected = len(rejects)
    summary.rejects = [r.as_dict() for r in rejects]
    if not rejects:
        return
    try:
        await asyncio.to_thread(raw_log.write_rejects, rejects)
    except Exception as exc:
        if strict:
            raise
        log.error("raw log %s: could not write the rejects: %s", raw_log.root_url, exc)


def text_field(body: Any, name: str) -> str | None:
    """`body[name]` when `body` is a dict and that is a string, else None."""
    value = body.get(name) if isinstance(body, dict) else None
    return value if isinstance(value, str) else None
