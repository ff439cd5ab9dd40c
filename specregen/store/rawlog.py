"""The raw log: one JSON line per finished inference attempt, append-only, durable before it counts.

Layout: `{root}/part-{utc timestamp}-{pid}-{random}.jsonl`, where root is a local path or any
fsspec URL (`s3://bucket/prefix`, `memory://x`). A process never rewrites or appends to a part it
did not create, so concurrent and successive runs cannot damage each other's records.

Durability. A single writer task takes every queued record at once (group commit) and resolves
each record's future only once the records are durable:

* local files: one part per writer session, opened in append mode; each commit is write + flush
  + `os.fsync` (and the directory is fsynced when the part is created). A record is on disk when
  its future resolves; a crash can leave at most one torn last line, which readers skip.
* object stores: objects cannot be appended to, so records are buffered and each commit puts a
  NEW part object (one PUT, atomic: readers see all of it or nothing). A part is put when
  `roll_records` records are waiting or the oldest has waited `roll_seconds` (and on `flush()` /
  `aclose()`). Durability window: the finished results not yet put, on top of the requests in
  flight, can be lost in a crash; those samples are requested (and paid) again. `commit_rolls`
  gives the settings that keep that loss within one in-flight window (the inference paths use
  it; the endpoint's `log_commit_seconds` overrides the time).

Record schema (`AttemptRecord.as_dict`, `"v": 1`): sample_id, fingerprint, attempt (1-based),
status (ok | truncated | failed), final, error_class, error_message, latency_s, http_status,
provider, model, generation_id, usage, cost_usd, created_at (ISO 8601 UTC); final records add
`request` and `response` (both scrubbed of secrets by the caller), and, when the server returned
token ids, `reference_completion_ids` and `prompt_token_ids` (lifted out of the response so the
ids are stored once). A request of a whole conversation (issue 10) adds `conversation`:
`{"id", "user_turn", "step"}`, and its sample_id is `{id}/t{user_turn}/s{step}`.

Rejects: input rows a run refused to send (not JSON, NaN in a schema, over the context length)
go to `{root}/rejects-{utc timestamp}-{pid}-{random}.jsonl`, one object per run, each line
`{v, line, sample_id, reason, created_at}` (`RejectRecord`). `history()` gives, per
(sample_id, fingerprint), the final status and the attempts made so far, so `max_attempts` holds
per sample across reruns and attempt numbers continue.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, TypedDict

import fsspec
from fsspec.implementations.local import LocalFileSystem

from specregen.errors import StorageError

log = logging.getLogger(__name__)

RECORD_VERSION = 1
PART_GLOB = "part-*.jsonl"
REJECTS_GLOB = "rejects-*.jsonl"
FINAL_ANSWER = ("ok", "truncated")
RecordStatus = Literal["ok", "truncated", "failed"]
# Attempts to put one part object before the log gives up (and the run stops).
PUT_ATTEMPTS = 5


class RawLogError(StorageError, RuntimeError):
    """The raw log cannot take records any more (the write that failed is named)."""


@dataclass(slots=True)
class AttemptRecord:
    sample_id: str
    fingerprint: str
    attempt: int
    status: RecordStatus
    final: bool
    error_class: str | None = None
    error_message: str | None = None
    latency_s: float | None = None
    http_status: int | None = None
    provider: str | None = None
    model: str | None = None
    generation_id: str | None = None
    usage: dict[str, Any] | None = None
    cost_usd: float | None = None
    created_at: str = ""
    request: dict[str, Any] | None = None
    response: dict[str, Any] | None = None
    reference_completion_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None
    # A request of a whole conversation: {"id": conversation id, "user_turn": k, "step": j}.
    conversation: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "v": RECORD_VERSION,
            "sample_id": self.sample_id,
            "fingerprint": self.fingerprint,
            "attempt": self.attempt,
            "status": self.status,
            "final": self.final,
            "error_class": self.error_class,
            "error_message": self.error_message,
            "latency_s": None if self.latency_s is None else round(self.latency_s, 4),
            "http_status": self.http_status,
            "provider": self.provider,
            "model": self.model,
            "generation_id": self.generation_id,
            "usage": self.usage,
            "cost_usd": self.cost_usd,
            "created_at": self.created_at or utc_now_iso(),
        }
        for name in ("request", "response", "reference_completion_ids", "prompt_token_ids",
                     "conversation"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out


@dataclass(slots=True)
class RejectRecord:
    """An input row that was never sent: where it was (`line`), which sample, and why."""

    reason: str
    line: int | None = None
    sample_id: str | None = None
    created_at: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "v": RECORD_VERSION,
            "line": self.line,
            "sample_id": self.sample_id,
            "reason": self.reason,
            "created_at": self.created_at or utc_now_iso(),
        }


@dataclass
class LogHistory:
    """What the log says about each (sample_id, fingerprint) before a run starts."""

    final: dict[tuple[str, str], RecordStatus] = field(default_factory=dict)
    # Attempts since the sample's last final record (non-final ones: a killed run's retries).
    open_attempts: dict[tuple[str, str], int] = field(default_factory=dict)
    # The highest attempt number ever recorded; a rerun numbers on from it.
    last_attempt: dict[tuple[str, str], int] = field(default_factory=dict)
    # The final record of each request of a whole conversation (ok/truncated beat failed):
    # a rerun rebuilds each conversation's path from them (specregen/conversation).
    conversation_finals: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)


def utc_now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def new_part_name() -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    return f"part-{stamp}-{os.getpid()}-{secrets.token_hex(4)}.jsonl"


# Most records in one object-store part, and the longest an answer waits uncommitted when no
# rate is known (the RawLog defaults).
ROLL_RECORDS = 2_000
ROLL_SECONDS = 10.0


class RollSettings(TypedDict):
    """RawLog's roll keywords, as commit_rolls gives them."""

    roll_records: int
    roll_seconds: float


def commit_rolls(
    window: int, requests_per_minute: float | None = None, seconds: float | None = None
) -> RollSettings:
    """RawLog roll settings for a writer with `window` requests in flight. The engine holds a
    request's window slot until its final record is put, so a crash loses at most one window of
    paid answers in all (in flight or waiting for the put); these settings bound how long the
    slots wait.

    A part is put once `window` answers wait (whatever the rate), or when the oldest has waited
    `seconds`; unset, the time the window takes to be answered at `requests_per_minute` (a
    rate the config knows), else ROLL_SECONDS. At 600 requests/min and 64 in flight that is a
    part every 6.4 s; a fixed 10 s at 3,000/min would have lost 500 paid answers."""
    records = max(1, min(int(window), ROLL_RECORDS))
    if seconds is None:
        seconds = ROLL_SECONDS
        if requests_per_minute:
            seconds = min(ROLL_SECONDS, 60.0 * records / requests_per_minute)
    return {"roll_records": records, "roll_seconds": max(0.05, float(seconds))}


@dataclass(slots=True)
class _Pending:
    line: bytes
    future: asyncio.Future[None]


class RawLog:
    """Append-only attempt log under `root` (see the module docstring for layout and durability)."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        storage_options: dict[str, Any] | None = None,
        roll_records: int = ROLL_RECORDS,
        roll_seconds: float = ROLL_SECONDS,
    ) -> None:
        self.root_url = os.fspath(root)
        self.fs, root_path = fsspec.core.url_to_fs(self.root_url, **(storage_options or {}))
        self.root = root_path.rstrip("/")
        self.local = isinstance(self.fs, LocalFileSystem)
        self.roll_records = max(1, roll_records)
        self.roll_seconds = roll_seconds
        self.parts_written: list[str] = []
        self._queue: list[_Pending] = []
        self._unresolved: set[asyncio.Future[None]] = set()
        self._queued_at = 0.0
        self._force = False
        self._closing = False
        self._event: asyncio.Event | None = None
        self._writer: asyncio.Task[None] | None = None
        self._error: BaseException | None = None
        self._file: Any = None
        self._made_root = False

    def __repr__(self) -> str:
        return f"RawLog({self.root_url!r})"

    # -- writing ---------------------------------------------------------------------------

    def submit(self, record: AttemptRecord | dict[str, Any]) -> asyncio.Future[None]:
        """Queue one record; the future resolves once it is durable (see the module docstring)."""
        if self._error is not None:
            raise RawLogError(f"raw log {self.root_url} failed earlier: {self._error}")
        data = record.as_dict() if isinstance(record, AttemptRecord) else record
        line = (json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
        loop = asyncio.get_running_loop()
        if self._writer is None or self._writer.done():
            self._event = asyncio.Event()
            self._closing = False
            self._writer = loop.create_task(self._run(), name="rawlog-writer")
        if not self._queue:
            self._queued_at = loop.time()
        future: asyncio.Future[None] = loop.create_future()
        self._unresolved.add(future)
        future.add_done_callback(self._unresolved.discard)
        self._queue.append(_Pending(line, future))
        assert self._event is not None
        self._event.set()
        return future

    async def append(self, record: AttemptRecord | dict[str, Any]) -> None:
        """Queue one record and wait until it is durable."""
        await self.submit(record)

    def commit_soon(self) -> None:
        """Put what is queued without waiting for a full part or the timer (the caller has
        nothing more to add soon); does not wait. No-op when nothing is queued."""
        if self._queue and self._event is not None:
            self._force = True
            self._event.set()

    async def flush(self) -> None:
        """Wait until everything queued so far is durable (puts a part now on object stores)."""
        # Includes the batch the writer is committing right now, no longer in the queue.
        pending = list(self._unresolved)
        if not pending:
            return
        self._force = True
        assert self._event is not None
        self._event.set()
        await asyncio.gather(*pending)

    async def aclose(self) -> None:
        """Flush, stop the writer and close the part file; a later submit starts a new part."""
        writer = self._writer
        if writer is not None and not writer.done():
            self._closing = True
            assert self._event is not None
            self._event.set()
            with contextlib.suppress(Exception):
                await writer
        self._writer = None
        if self._file is not None:
            await asyncio.to_thread(self._file.close)
            self._file = None
        if self._error is not None:
            raise RawLogError(f"raw log {self.root_url}: {self._error}")

    async def __aenter__(self) -> RawLog:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _due(self, now: float) -> bool:
        return (
            self.local
            or self._force
            or self._closing
            or len(self._queue) >= self.roll_records
            or now - self._queued_at >= self.roll_seconds
        )

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        event = self._event
        assert event is not None
        batch: list[_Pending] = []
        try:
            while True:
                if not self._queue:
                    if self._closing:
                        return
                    await event.wait()
                    event.clear()
                    continue
                if not self._due(loop.time()):
                    wait = self._queued_at + self.roll_seconds - loop.time()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(max(0.0, wait)):
                            await event.wait()
                    event.clear()
                    continue
                if self.local:
                    batch, self._queue = self._queue, []
                else:
                    # One part holds at most roll_records records; the rest rolls next.
                    batch = self._queue[: self.roll_records]
                    self._queue = self._queue[self.roll_records :]
                if not self._queue:
                    self._force = False
                lines = [p.line for p in batch]
                if self.local:
                    await asyncio.to_thread(self._commit_local, lines)
                else:
                    await asyncio.to_thread(self._commit_object, lines)
                for pending in batch:
                    if not pending.future.done():
                        pending.future.set_result(None)
                batch = []
        except asyncio.CancelledError:
            # The loop is going away (no aclose): these records are not confirmed durable, but
            # the log itself is fine, and a later submit starts a new writer.
            self._fail_pending(batch, RawLogError(f"raw log {self.root_url}: writer cancelled"))
            raise
        except Exception as exc:
            self._error = exc
            self._fail_pending(batch, RawLogError(f"raw log {self.root_url}: write failed: {exc}"))

    def _fail_pending(self, batch: list[_Pending], error: RawLogError) -> None:
        for pending in batch + self._queue:
            if not pending.future.done():
                pending.future.set_exception(error)
        self._queue = []

    def _ensure_root(self) -> None:
        if not self._made_root:
            self.fs.makedirs(self.root, exist_ok=True)
            self._made_root = True

    def _commit_local(self, lines: list[bytes]) -> None:
        if self._file is None:
            self._ensure_root()
            path = f"{self.root}/{new_part_name()}"
            self._file = open(path, "ab")  # noqa: SIM115 - held open across commits
            self.parts_written.append(path)
            _fsync_dir(self.root)
        self._file.write(b"".join(lines))
        self._file.flush()
        os.fsync(self._file.fileno())

    def _commit_object(self, lines: list[bytes]) -> None:
        self._ensure_root()
        path = f"{self.root}/{new_part_name()}"
        data = b"".join(lines)
        for attempt in range(1, PUT_ATTEMPTS + 1):
            try:
                self.fs.pipe_file(path, data)
                break
            except Exception as exc:
                if attempt == PUT_ATTEMPTS:
                    raise
                log.warning("raw log: put %s failed (%s), retrying", path, exc)
                time.sleep(min(8.0, 0.5 * 2**attempt))
        self.parts_written.append(path)

    # -- reading ---------------------------------------------------------------------------

    def part_paths(self) -> list[str]:
        """Every part under root, oldest first (names start with their UTC creation time)."""
        # Object-store listings are cached per filesystem instance; parts put by other
        # processes since must show up.
        self.fs.invalidate_cache(self.root)
        try:
            found = self.fs.glob(f"{self.root}/{PART_GLOB}")
        except FileNotFoundError:
            return []
        return sorted(found, key=lambda p: p.rsplit("/", 1)[-1])

    def iter_records(self) -> Iterator[dict[str, Any]]:
        """All records of all parts in write order; a torn or garbled line is skipped."""
        for _, _, record in self._iter_located():
            yield record

    def _iter_located(self) -> Iterator[tuple[int, int, dict[str, Any]]]:
        for part_no, path in enumerate(self.part_paths()):
            try:
                handle = self.fs.open(path, "rb")
            except FileNotFoundError:
                continue
            with handle:
                for line_no, raw in enumerate(handle, start=1):
                    record = _parse_line(raw, path, line_no)
                    if record is not None:
                        yield part_no, line_no, record

    def final_index(self) -> dict[tuple[str, str], RecordStatus]:
        """(sample_id, fingerprint) -> status of its final result; ok/truncated beat failed."""
        index: dict[tuple[str, str], RecordStatus] = {}
        for record in self.iter_records():
            if not record.get("final"):
                continue
            key = (record["sample_id"], record["fingerprint"])
            status = record.get("status")
            if status in FINAL_ANSWER:
                index[key] = status
            elif status == "failed" and index.get(key) not in FINAL_ANSWER:
                index[key] = "failed"
        return index

    def history(self) -> LogHistory:
        """One pass over the log: final statuses, plus attempts per sample across all runs."""
        out = LogHistory()
        for record in self.iter_records():
            key = (record["sample_id"], record["fingerprint"])
            attempt = record.get("attempt")
            if isinstance(attempt, int) and not isinstance(attempt, bool):
                out.last_attempt[key] = max(out.last_attempt.get(key, 0), attempt)
            if not record.get("final"):
                out.open_attempts[key] = out.open_attempts.get(key, 0) + 1
                continue
            # A final record closes the sample's attempts; `--retry-failed` starts a new round.
            out.open_attempts.pop(key, None)
            status = record.get("status")
            if status in FINAL_ANSWER:
                out.final[key] = status
            elif status == "failed" and out.final.get(key) not in FINAL_ANSWER:
                out.final[key] = "failed"
            else:
                continue
            if record.get("conversation") is not None:
                out.conversation_finals[key] = record
        return out

    # -- rejected inputs -------------------------------------------------------------------

    def write_rejects(self, rejects: list[RejectRecord]) -> str | None:
        """Put one run's rejected input rows as a new `rejects-*.jsonl` object (atomic)."""
        if not rejects:
            return None
        from specregen.store.fs import write_atomic

        self._ensure_root()
        path = f"{self.root}/rejects-{new_part_name().removeprefix('part-')}"
        data = b"".join(
            (json.dumps(r.as_dict(), ensure_ascii=False, separators=(",", ":")) + "\n").encode()
            for r in rejects
        )
        write_atomic(self.fs, path, data)
        return path

    def iter_rejects(self) -> Iterator[dict[str, Any]]:
        """Every rejected input row of every run, oldest run first."""
        self.fs.invalidate_cache(self.root)
        try:
            paths = sorted(self.fs.glob(f"{self.root}/{REJECTS_GLOB}"))
        except FileNotFoundError:
            return
        for path in paths:
            with self.fs.open(path, "rb") as handle:
                for raw in handle:
                    with contextlib.suppress(ValueError):
                        yield json.loads(raw)

    def iter_final_samples(self) -> Iterator[dict[str, Any]]:
        """Per (sample_id, fingerprint), its last final ok/truncated record, as reconstruct input:
        `{sample_id, request, response, reference_completion_ids}`.

        Two passes, so memory holds one position per sample, never the bodies.
        """
        last: dict[tuple[str, str], tuple[int, int]] = {}
        for part_no, line_no, record in self._iter_located():
            if record.get("final") and record.get("status") in FINAL_ANSWER:
                last[(record["sample_id"], record["fingerprint"])] = (part_no, line_no)
        wanted = set(last.values())
        for part_no, line_no, record in self._iter_located():
            if (part_no, line_no) in wanted:
                yield {
                    "sample_id": record["sample_id"],
                    "request": record.get("request"),
                    "response": record.get("response"),
                    "reference_completion_ids": record.get("reference_completion_ids"),
                }


def _parse_line(raw: bytes, path: str, line_no: int) -> dict[str, Any] | None:
    if not raw.strip():
        return None
    try:
        record = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        log.warning(
            "raw log %s line %d is not a complete JSON record (a torn write of a crashed run?);"
            " skipped",
            path,
            line_no,
        )
        return None
    if not isinstance(record, dict) or not isinstance(record.get("sample_id"), str):
        log.warning("raw log %s line %d is not an attempt record; skipped", path, line_no)
        return None
    if not isinstance(record.get("fingerprint"), str):
        log.warning("raw log %s line %d has no fingerprint; skipped", path, line_no)
        return None
    return record


def _fsync_dir(path: str) -> None:
    # The part's directory entry must be durable too, or a crash could lose the whole file.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
