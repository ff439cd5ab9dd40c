"""The two batch API shapes over HTTP: submit, get, find by metadata, read results.

* `openrouter`: `POST {base}/batches` with `{endpoint, model, metadata, requests}` -- `endpoint`
  and `model` BEFORE the inline `requests` array (OpenRouter stream-parses the body and answers
  400 otherwise); `GET {base}/batches/{id}`; results paged from `GET {base}/batches/{id}/results`
  (`cursor` / `next_cursor`), each `{custom_id, response: {status_code, body} | error}`.
* `openai-files` (Moonshot, vLLM, OpenAI-compatible): upload a JSONL of `{custom_id, method,
  url, body}` to `POST {base}/files` (`purpose=batch`), `POST {base}/batches` with
  `input_file_id`, `endpoint`, `completion_window`, `metadata`; `GET {base}/batches/{id}` gives
  `output_file_id` / `error_file_id`, read from `GET {base}/files/{id}/content`.

Both list batches at `GET {base}/batches` (`limit`, `after`, newest first) with their
`metadata`: `find(marker)` looks there for a batch a crashed run submitted but never recorded.
Calls retry transient failures (429, 5xx, resets) a few times; anything else raises
`BatchAPIError` (`fatal` for 401/402: the key or the account).
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from specregen.client.config import EndpointConfig
from specregen.client.secrets import ApiKey, BearerAuth, scrub_text
from specregen.client.transport import USER_AGENT, classify_status, parse_retry_after
from specregen.errors import EXIT_PARTIAL, EXIT_USAGE, SpecregenError

TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
# The metadata key that carries a batch's idempotency marker (the run's own id for it).
MARKER_KEY = "specregen_batch"
CALL_ATTEMPTS = 5
LIST_PAGES = 50  # 50 x 100 newest batches are searched for a lost one
_sleep = asyncio.sleep  # the backoff between call attempts (tests replace it)


class BatchAPIError(SpecregenError):
    """The batch API refused (`permanent`: exit 2) or stayed unreachable (`retryable`: exit 6;
    run again, the ledger keeps every submitted batch). `fatal` (401/402) becomes the run's
    FatalAPIError (exit 3)."""

    def __init__(self, message: str, *, status: int | None = None, kind: str = "permanent"):
        retry = "run again: every submitted batch is in the raw log's batches/ ledger"
        super().__init__(message, hint=retry if kind == "retryable" else None)
        self.status = status
        self.kind = kind
        self.exit_code = EXIT_PARTIAL if kind == "retryable" else EXIT_USAGE


@dataclass(slots=True)
class BatchInfo:
    id: str
    status: str
    total: int = 0
    completed: int = 0
    failed: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)
    output_file_id: str | None = None
    error_file_id: str | None = None
    usage: dict[str, Any] | None = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @classmethod
    def of(cls, body: Any) -> BatchInfo:
        if not isinstance(body, dict) or not isinstance(body.get("id"), str):
            raise BatchAPIError("batch object without an id", kind="retryable")
        counts = body.get("request_counts") or {}
        meta = body.get("metadata")
        return cls(
            id=body["id"], status=str(body.get("status") or "validating"),
            total=int(counts.get("total") or 0), completed=int(counts.get("completed") or 0),
            failed=int(counts.get("failed") or 0),
            metadata=meta if isinstance(meta, dict) else {},
            output_file_id=body.get("output_file_id"), error_file_id=body.get("error_file_id"),
            usage=body.get("usage") if isinstance(body.get("usage"), dict) else None,
        )


class BatchAPI:
    """One endpoint's batch API; `client` is an httpx.AsyncClient the caller owns."""

    def __init__(
        self, client: httpx.AsyncClient, cfg: EndpointConfig, key: ApiKey | None,
        *, rng: random.Random | None = None,
    ) -> None:
        self.client = client
        self.cfg = cfg
        self.key = key
        self.shape = cfg.batch.api
        self.rng = rng or random.Random()

    # -- submit ----------------------------------------------------------------------------

    def payload(self, items: list[tuple[str, dict[str, Any]]], marker: str) -> bytes:
        """The request bytes of one batch (openrouter) or of its input file (openai-files)."""
        if self.shape == "openrouter":
            head = json.dumps({"endpoint": self.cfg.batch.endpoint, "model": self.cfg.model,
                               "completion_window": self.cfg.batch.completion_window,
                               "metadata": {MARKER_KEY: marker}}, ensure_ascii=False)
            rows = ",".join(
                json.dumps({"custom_id": cid, "body": body}, ensure_ascii=False)
                for cid, body in items
            )
            # Key order matters: endpoint and model come before requests.
            return (head[:-1] + ',"requests":[' + rows + "]}").encode()
        url = self.cfg.batch.endpoint
        return b"".join(
            json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": body},
                       ensure_ascii=False).encode() + b"\n"
            for cid, body in items
        )

    async def submit(self, payload: bytes, marker: str) -> BatchInfo:
        # POST /batches is never retried blindly: a lost answer may hide a created batch, so
        # after a failure the batch is looked for by its marker before it is sent again.
        for attempt in range(1, CALL_ATTEMPTS + 1):
            try:
                return await self._create(payload, marker)
            except BatchAPIError as exc:
                if exc.kind != "retryable" or attempt == CALL_ATTEMPTS:
                    raise
            found = await self.find(marker)
            if found is not None:
                return found
            await _sleep(self.rng.uniform(0, min(30, 2**attempt)))
        raise AssertionError("unreachable")

    async def _create(self, payload: bytes, marker: str) -> BatchInfo:
        if self.shape == "openrouter":
            body = await self._call("POST", "/batches", content=payload, once=True,
                                    headers={"Content-Type": "application/json"})
            return BatchInfo.of(body)
        uploaded = await self._call(
            "POST", "/files", data={"purpose": "batch"},
            files={"file": (f"{marker}.jsonl", payload, "application/jsonl")},
        )
        file_id = uploaded.get("id") if isinstance(uploaded, dict) else None
        if not isinstance(file_id, str):
            raise BatchAPIError("file upload answered without an id", kind="retryable")
        body = await self._call("POST", "/batches", once=True, json={
            "input_file_id": file_id, "endpoint": self.cfg.batch.endpoint,
            "completion_window": self.cfg.batch.completion_window,
            "metadata": {MARKER_KEY: marker},
        })
        return BatchInfo.of(body)

    # -- follow ----------------------------------------------------------------------------

    async def get(self, batch_id: str) -> BatchInfo:
        return BatchInfo.of(await self._call("GET", f"/batches/{batch_id}"))

    async def find(self, marker: str) -> BatchInfo | None:
        """The batch whose metadata carries `marker`, among the newest listed; else None."""
        after: str | None = None
        for _ in range(LIST_PAGES):
            params: dict[str, Any] = {"limit": 100}
            if after:
                params["after"] = after
            page = await self._call("GET", "/batches", params=params)
            data = page.get("data") if isinstance(page, dict) else None
            if not isinstance(data, list) or not data:
                return None
            for item in data:
                info = BatchInfo.of(item)
                if info.metadata.get(MARKER_KEY) == marker:
                    return info
            if not page.get("has_more"):
                return None
            after = page.get("last_id") or data[-1].get("id")
        return None

    async def results(self, info: BatchInfo) -> AsyncIterator[dict[str, Any]]:
        """Every result line of a finished batch: `{custom_id, response?, error?}`."""
        if self.shape == "openrouter":
            cursor: str | None = None
            while True:
                params: dict[str, Any] = {"limit": 500}
                if cursor:
                    params["cursor"] = cursor
                page = await self._call("GET", f"/batches/{info.id}/results", params=params)
                for item in page.get("data") or ():
                    if isinstance(item, dict):
                        yield item
                cursor = page.get("next_cursor")
                if not cursor:
                    return
        for file_id in (info.output_file_id, info.error_file_id):
            if not file_id:
                continue
            raw = await self._call("GET", f"/files/{file_id}/content", raw=True)
            for line in raw.splitlines():
                if not line.strip():
                    continue
                try:
                    item = json.loads(line)
                except ValueError:
                    continue  # a garbled line: that request is treated as unanswered
                if isinstance(item, dict):
                    yield item

    # -- HTTP ------------------------------------------------------------------------------

    async def _call(
        self, method: str, path: str, *, raw: bool = False, once: bool = False, **kwargs: Any
    ) -> Any:
        url = self.cfg.base_url + path
        headers = {"User-Agent": USER_AGENT, **kwargs.pop("headers", {})}
        auth = BearerAuth(self.key) if self.key is not None else None
        timeout = httpx.Timeout(connect=self.cfg.timeouts.connect, read=self.cfg.timeouts.read,
                                write=self.cfg.timeouts.read, pool=None)
        last = "no attempt"
        attempts = 1 if once else CALL_ATTEMPTS
        for attempt in range(1, attempts + 1):
            wait: float | None = None
            try:
                response = await self.client.request(method, url, headers=headers, auth=auth,
                                                     timeout=timeout, **kwargs)
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code < 300:
                    if raw:
                        return response.content
                    try:
                        return response.json()
                    except ValueError:
                        last = f"{method} {path}: answer is not JSON"
                else:
                    text = scrub_text(response.text[:500], self.key)
                    kind = classify_status(response.status_code)[1]
                    message = f"{method} {path}: HTTP {response.status_code} {text}"
                    if kind != "retryable":
                        raise BatchAPIError(message, status=response.status_code, kind=kind)
                    last = message
                    wait = parse_retry_after(response.headers.get("retry-after"))
            if attempt < attempts:
                delay = wait if wait is not None else self.rng.uniform(0, min(30, 2**attempt))
                await _sleep(delay)
        raise BatchAPIError(f"{last} (after {attempts} attempt(s))", kind="retryable")
