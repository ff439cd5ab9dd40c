"""The emulator's batch APIs, in the two shapes specregen's batch client speaks.

* OpenRouter inline batches: `POST {base}/batches` with `{endpoint, model, requests: [{custom_id,
  body}], metadata?}` -> `202` and a batch object (`status: validating`); `GET
  {base}/batches/{id}` (status, `request_counts`, `usage`); `GET {base}/batches/{id}/results`
  pages results (`data`, `has_more`, `next_cursor`; pass `cursor`), each `{id, custom_id,
  response: {status_code, body} | null, error: {code, message} | null}`. No cancel endpoint.
* OpenAI file batches (Moonshot, vLLM, ...): `POST {base}/files` (multipart, `purpose=batch`,
  a JSONL of `{custom_id, method, url, body}`), `POST {base}/batches` with `input_file_id`,
  `GET {base}/batches/{id}` (`output_file_id`, `error_file_id`), `GET {base}/files/{id}/content`.

`GET {base}/batches` lists batches newest first with their `metadata` (`limit`, `after`), which
is how a client finds a batch it submitted but could not record (crash between submit and
record).

Processing is simulated on the clock: a batch is `validating` -> `in_progress` until
`batch_delay` seconds after its creation, then `completed`; with `batch_expire_rate` a share of
its requests is never processed and the batch ends `expired` (those requests come back as
`batch_expired` errors). `batch_failure_rate` fails single requests (500 in the results). The
answers are the emulator's ordinary non-streamed answers, priced at `batch_price_share` x the
realtime price (`usage.cost`; the client's `prices.batch_discount` is the cut, 1 - share).
Results are computed once per batch, so reading them again is free and identical.
"""

from __future__ import annotations

import asyncio
import email.parser
import email.policy
import hashlib
import hmac
import json
import secrets
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, cast

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from specregen.emulator.generate import RequestError, request_keys
from specregen.emulator.profiles import ResponseMeta, response_body
from specregen.models.chat_format import FormatError

# Limits of the APIs we imitate (OpenRouter's inline batches; we hold the files shape to them).
MAX_REQUESTS = 5_000
MAX_BYTES = 200 * 1024 * 1024
TERMINAL = ("completed", "failed", "expired", "cancelled")


@dataclass
class EmulatedBatch:
    id: str
    shape: str  # "openrouter" | "openai-files"
    endpoint: str
    model: str | None
    requests: list[dict[str, Any]]  # {custom_id, body}
    metadata: dict[str, Any]
    created_at: float
    input_file_id: str | None = None
    results: list[dict[str, Any]] | None = None
    status: str = "validating"
    output_file_id: str | None = None
    error_file_id: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)


class BatchState:
    """Batches and files of one emulator; counters the tests read (`snapshot`)."""

    def __init__(self) -> None:
        self.batches: dict[str, EmulatedBatch] = {}
        self.files: dict[str, bytes] = {}
        self.reset()

    def reset(self) -> None:
        self.created = 0
        self.results_reads: Counter[str] = Counter()  # batch id -> result reads (pages/files)
        self.submitted: Counter[str] = Counter()  # custom_id -> times submitted in a batch

    def snapshot(self) -> dict[str, Any]:
        return {
            "batches_created": self.created,
            "batches": {b.id: {"status": b.status, "requests": len(b.requests),
                               "metadata": b.metadata} for b in self.batches.values()},
            "results_reads": dict(self.results_reads),
            "max_submissions_per_request": max(self.submitted.values(), default=0),
            "requests_submitted": sum(self.submitted.values()),
        }


def batch_routes(app_state: Any) -> list[Route]:
    """The routes, bound to the app's `EmulatorState` (model, profile, prices, batch knobs)."""
    state: BatchState = app_state.batches

    def denied(request: Request) -> Response | None:
        """The chat route's key and credit checks (never echoing what was sent)."""
        config = app_state.config
        if config.require_key is not None:
            auth = request.headers.get("authorization")
            if auth is None:
                return _error(401, "No auth credentials found")
            if not hmac.compare_digest(auth.strip().encode(),
                                       b"Bearer " + config.require_key.encode()):
                return _error(401, "Invalid API key")
        if config.credits_exhausted:
            return _error(402, "Insufficient credits")
        return None

    def guarded(route):
        async def handler(request: Request) -> Response:
            return denied(request) or await route(request)

        return handler

    async def create(request: Request) -> Response:
        raw = await request.body()
        try:
            payload = json.loads(raw)
        except ValueError:
            return _error(400, "batch body is not JSON")
        if not isinstance(payload, dict):
            return _error(400, "batch body is not an object")
        metadata = payload.get("metadata") or {}
        if not isinstance(metadata, dict):
            return _error(400, "metadata must be an object")
        if "requests" in payload:
            # OpenRouter stream-parses the body: `endpoint` and `model` must come first.
            keys = list(payload)
            if any(k not in payload or keys.index(k) > keys.index("requests")
                   for k in ("endpoint", "model")):
                return _error(400, "endpoint and model must come before requests")
            requests = payload["requests"]
            shape, input_file = "openrouter", None
            if len(raw) > MAX_BYTES:
                return _error(413, f"batch is larger than {MAX_BYTES} bytes")
        else:
            input_file = payload.get("input_file_id")
            if input_file not in state.files:
                return _error(404, f"no file {input_file!r}")
            try:
                requests = [json.loads(line) for line in state.files[input_file].splitlines()
                            if line.strip()]
            except ValueError:
                return _error(400, "input file is not JSONL")
            shape = "openai-files"
        problem = _check_requests(requests, payload.get("model"), shape)
        if problem:
            return _error(400, problem)
        batch = EmulatedBatch(
            id="batch_" + secrets.token_hex(12), shape=shape,
            endpoint=str(payload.get("endpoint") or "/v1/chat/completions"),
            model=payload.get("model"), requests=requests, metadata=metadata,
            created_at=time.time(), input_file_id=input_file,
        )
        state.batches[batch.id] = batch
        state.created += 1
        for item in requests:
            state.submitted[item["custom_id"]] += 1
        if app_state.config.batch_submit_delay:
            await asyncio.sleep(app_state.config.batch_submit_delay)
        return JSONResponse(_batch_object(batch), status_code=202 if shape == "openrouter"
                            else 200)

    async def get(request: Request) -> Response:
        batch = state.batches.get(request.path_params["id"])
        if batch is None:
            return _error(404, "no such batch")
        _advance(app_state, batch)
        return JSONResponse(_batch_object(batch))

    async def listing(request: Request) -> Response:
        limit = int(request.query_params.get("limit") or 20)
        after = request.query_params.get("after")
        ordered = sorted(state.batches.values(), key=lambda b: (b.created_at, b.id),
                         reverse=True)
        if after:
            ids = [b.id for b in ordered]
            ordered = ordered[ids.index(after) + 1:] if after in ids else []
        page = ordered[:limit]
        for batch in page:
            _advance(app_state, batch)
        return JSONResponse({"object": "list", "data": [_batch_object(b) for b in page],
                             "has_more": len(ordered) > limit,
                             "last_id": page[-1].id if page else None})

    async def results(request: Request) -> Response:
        batch = state.batches.get(request.path_params["id"])
        if batch is None:
            return _error(404, "no such batch")
        _advance(app_state, batch)
        if batch.status not in TERMINAL or batch.results is None:
            return _error(409, f"batch is {batch.status}; results come once it is finished")
        state.results_reads[batch.id] += 1
        start = int(request.query_params.get("cursor") or 0)
        limit = min(1000, int(request.query_params.get("limit") or 500))
        page = batch.results[start:start + limit]
        more = start + limit < len(batch.results)
        return JSONResponse({"object": "list", "data": page, "has_more": more,
                             "next_cursor": str(start + limit) if more else None})

    async def upload(request: Request) -> Response:
        raw = await request.body()
        ctype = request.headers.get("content-type", "")
        if not ctype.startswith("multipart/form-data"):
            return _error(400, "upload a file as multipart/form-data")
        fields = _multipart(ctype, raw)
        if fields.get("purpose", (b"", None))[0] != b"batch":
            return _error(400, "purpose must be 'batch'")
        if "file" not in fields:
            return _error(400, "no file part")
        data, filename = fields["file"]
        if len(data) > MAX_BYTES:
            return _error(413, f"file is larger than {MAX_BYTES} bytes")
        file_id = "file-" + secrets.token_hex(12)
        state.files[file_id] = data
        return JSONResponse({"id": file_id, "object": "file", "bytes": len(data),
                             "created_at": int(time.time()), "filename": filename or "input",
                             "purpose": "batch"})

    async def content(request: Request) -> Response:
        file_id = request.path_params["id"]
        data = state.files.get(file_id)
        if data is None:
            return _error(404, "no such file")
        for batch in state.batches.values():
            if file_id in (batch.output_file_id, batch.error_file_id):
                state.results_reads[batch.id] += 1
        return Response(data, media_type="application/jsonl")

    routes = []
    for prefix in ("/v1", "/api/v1"):
        routes += [
            Route(f"{prefix}/batches", guarded(create), methods=["POST"]),
            Route(f"{prefix}/batches", guarded(listing), methods=["GET"]),
            Route(f"{prefix}/batches/{{id}}", guarded(get), methods=["GET"]),
            Route(f"{prefix}/batches/{{id}}/results", guarded(results), methods=["GET"]),
            Route(f"{prefix}/files", guarded(upload), methods=["POST"]),
            Route(f"{prefix}/files/{{id}}/content", guarded(content), methods=["GET"]),
        ]
    return routes


def _check_requests(requests: Any, model: Any, shape: str) -> str | None:
    if not isinstance(requests, list) or not requests:
        return "requests must be a non-empty list"
    if len(requests) > MAX_REQUESTS:
        return f"at most {MAX_REQUESTS} requests per batch ({len(requests)} given)"
    seen: set[str] = set()
    providers: set[str] = set()
    for i, item in enumerate(requests):
        if not isinstance(item, dict) or not isinstance(item.get("custom_id"), str):
            return f"requests[{i}] has no string custom_id"
        if not isinstance(item.get("body"), dict):
            return f"requests[{i}] has no body object"
        if item["custom_id"] in seen:
            return f"requests[{i}]: duplicate custom_id {item['custom_id']!r}"
        seen.add(item["custom_id"])
        body = item["body"]
        if body.get("stream"):
            return f"requests[{i}]: a batch request cannot stream"
        if shape == "openrouter":
            if model is not None and body.get("model") not in (None, model):
                return f"requests[{i}]: one model per batch ({body.get('model')} != {model})"
            only = (body.get("provider") or {}).get("only")
            providers.add(json.dumps(only, sort_keys=True))
    if len(providers) > 1:
        return "one provider per batch: the requests pin different providers"
    return None


def _advance(app_state: Any, batch: EmulatedBatch) -> None:
    """Move the batch along the clock; compute its results once when it finishes."""
    if batch.status in TERMINAL:
        return
    config = app_state.config
    if time.time() - batch.created_at < config.batch_delay:
        batch.status = "in_progress" if time.time() - batch.created_at > 0 else "validating"
        return
    results: list[dict[str, Any]] = []
    prompt = completion = 0
    cost = 0.0
    expired = 0
    for item in batch.requests:
        draw = _draw(batch.id, item["custom_id"])
        if draw < config.batch_expire_rate:
            expired += 1
            results.append(_result(item, None, {"code": "batch_expired", "message":
                                                "This request could not be executed before"
                                                " the completion window expired."}))
            continue
        if _draw(batch.id + "/fail", item["custom_id"]) < config.batch_failure_rate:
            results.append(_result(item, {"status_code": 500, "body": {"error": {
                "code": 500, "message": "Provider returned error"}}}, None))
            continue
        status, body = answer(app_state, item["body"])
        if status == 200:
            usage = body.get("usage") or {}
            prompt += int(usage.get("prompt_tokens") or 0)
            completion += int(usage.get("completion_tokens") or 0)
            cost += float(usage.get("cost") or 0.0)
            results.append(_result(item, {"status_code": 200, "body": body}, None))
        else:
            results.append(_result(item, {"status_code": status, "body": body}, None))
    batch.results = results
    batch.usage = {"prompt_tokens": prompt, "completion_tokens": completion,
                   "total_tokens": prompt + completion, "cost": round(cost, 12)}
    batch.status = "expired" if expired else "completed"
    if batch.shape == "openai-files":
        files = app_state.batches.files
        ok = [r for r in results if r["error"] is None and r["response"]["status_code"] == 200]
        bad = [r for r in results if r not in ok]
        if ok:
            batch.output_file_id = "file-" + secrets.token_hex(12)
            files[batch.output_file_id] = _jsonl(ok)
        if bad:
            batch.error_file_id = "file-" + secrets.token_hex(12)
            files[batch.error_file_id] = _jsonl(bad)


def answer(app_state: Any, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """The emulator's non-streamed answer to one request body, at the batch price."""
    config = app_state.config
    try:
        if not isinstance(request.get("messages"), list) or not request["messages"]:
            raise RequestError("'messages' must be a non-empty list")
        keys = request_keys(request)
        gen = app_state.generation(request, keys)
    except (RequestError, FormatError, TypeError, AttributeError, KeyError) as exc:
        return 400, {"error": {"code": 400, "message": f"cannot answer the request: {exc}"}}
    limits = [request.get(k) for k in ("max_tokens", "max_completion_tokens")]
    given = [v for v in limits if isinstance(v, int)]
    completion = app_state.server.view(gen, min(given) if given else None)
    message = app_state.server.message(app_state.spec, completion, gen, request)
    factor = config.batch_price_share
    meta = ResponseMeta(
        id=("gen-" if app_state.spec.openrouter else "chatcmpl-") + keys.distinct.hex()[:24],
        created=app_state.created,
        model=request.get("model") or config.model,
        provider=config.provider_name,
        price_prompt=config.price_prompt * factor,
        price_completion=config.price_completion * factor,
    )
    return 200, response_body(app_state.spec, message, completion, gen, request, meta)


def _result(item: dict[str, Any], response: dict[str, Any] | None,
            error: dict[str, Any] | None) -> dict[str, Any]:
    return {"id": "batch_req_" + hashlib.sha256(item["custom_id"].encode()).hexdigest()[:20],
            "custom_id": item["custom_id"], "response": response, "error": error}


def _draw(salt: str, custom_id: str) -> float:
    digest = hashlib.sha256(f"{salt}\0{custom_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def _jsonl(rows: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r, separators=(",", ":")).encode() + b"\n" for r in rows)


def _batch_object(batch: EmulatedBatch) -> dict[str, Any]:
    results = batch.results or []
    failed = sum(1 for r in results if r["error"] is not None
                 or r["response"]["status_code"] != 200)
    out: dict[str, Any] = {
        "id": batch.id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "model": batch.model,
        "status": batch.status,
        "created_at": int(batch.created_at),
        "completion_window": "24h",
        "metadata": batch.metadata,
        "request_counts": {"total": len(batch.requests), "completed": len(results) - failed,
                           "failed": failed},
    }
    if batch.shape == "openrouter":
        out["usage"] = batch.usage or None
    else:
        out.update(input_file_id=batch.input_file_id, output_file_id=batch.output_file_id,
                   error_file_id=batch.error_file_id)
    return out


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": status, "message": message}}, status_code=status)


def _multipart(content_type: str, raw: bytes) -> dict[str, tuple[bytes, str | None]]:
    """Fields of a multipart/form-data body: name -> (bytes, filename). The stdlib's MIME
    parser does it; python-multipart is not a dependency."""
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode()
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + raw)
    out: dict[str, tuple[bytes, str | None]] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if name:
            # A non-multipart part decodes to bytes (typeshed's union covers the others).
            payload = cast(bytes, part.get_payload(decode=True)) or b""
            out[str(name)] = (payload, part.get_filename())
    return out
