"""One attempt at one chat completion: send, read (stream or not), classify what came back.

`send` never raises for anything the network or the server can do; it returns an
`AttemptResult` whose `kind` tells the engine what to do next:

* retryable: 429 (with Retry-After), 408, 5xx, connection errors and resets, timeouts, a
  truncated body or invalid JSON, HTTP 200 carrying an `error` object, an SSE error event, or
  `finish_reason: "error"` (OpenRouter reports failures after the model started that way);
* permanent: 400, 403, 404, 413, 422 and other 4xx: this request will not work, try the next
  sample;
* fatal: 401 and 402 (every further request would fail the same way), and an endpoint URL or
  header httpx cannot send at all. A 402 that OpenRouter attributes to its in-flight budget
  (`metadata.limit_source`) is a rate limit, hence retryable.

`status` is "ok", "truncated" (a complete answer cut by max_tokens, `finish_reason: "length"`,
which is final, not an error) or "failed". Every stored text is scrubbed of the API key.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import math
import ssl
import time
import urllib.request
from collections.abc import AsyncIterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, cast

import aiohttp
import h11
import httpx
import yarl

from specregen.client.config import EndpointConfig
from specregen.client.secrets import ApiKey, BearerAuth, as_api_key, scrub_obj, scrub_text
from specregen.wire.stream import (
    StreamAssembler,
    StreamDecodeError,
    StreamError,
    StreamParser,
    assemble_lines,
    error_text,
)

AttemptStatus = Literal["ok", "truncated", "failed"]
ErrorKind = Literal["retryable", "permanent", "fatal"]

USER_AGENT = "specregen/0.1"
# After `[DONE]`, keep reading briefly so the connection goes back to the pool clean (a
# connection dropped mid-body cannot be reused, and a new TLS handshake per request is costly).
DRAIN_SECONDS = 2.0
# How much of an error body we keep in a message.
ERROR_TEXT_LIMIT = 1_000

FATAL_STATUS = {401: "unauthorized", 402: "payment_required"}
PERMANENT_STATUS = {
    400: "bad_request",
    403: "forbidden",
    404: "not_found",
    413: "payload_too_large",
    422: "unprocessable",
}
RETRYABLE_STATUS = {408: "request_timeout", 429: "rate_limited"}


@dataclass(slots=True)
class AttemptResult:
    status: AttemptStatus
    response: dict[str, Any] | None
    latency_s: float
    http_status: int | None
    error_class: str | None = None
    error_message: str | None = None
    kind: ErrorKind | None = None
    retry_after_s: float | None = None
    generation_id: str | None = None

    @property
    def final_answer(self) -> bool:
        return self.status in ("ok", "truncated")


def failure(
    error_class: str,
    message: str,
    kind: ErrorKind = "retryable",
    *,
    http_status: int | None = None,
    response: dict[str, Any] | None = None,
    retry_after_s: float | None = None,
) -> AttemptResult:
    return AttemptResult(
        status="failed",
        response=response,
        latency_s=0.0,
        http_status=http_status,
        error_class=error_class,
        error_message=message,
        kind=kind,
        retry_after_s=retry_after_s,
    )


def classify_status(status: int, error_body: Any = None) -> tuple[str, ErrorKind]:
    """Error class and kind of a non-200 HTTP status."""
    if status == 402 and _limit_source(error_body) == "openrouter_in_flight_budget":
        return "in_flight_budget", "retryable"
    if status in FATAL_STATUS:
        return FATAL_STATUS[status], "fatal"
    if status in RETRYABLE_STATUS:
        return RETRYABLE_STATUS[status], "retryable"
    if status >= 500:
        return "server_error", "retryable"
    if status in PERMANENT_STATUS:
        return PERMANENT_STATUS[status], "permanent"
    if 400 <= status < 500:
        return f"http_{status}", "permanent"
    # 1xx/3xx: redirects are not followed, so the URL is wrong for every request.
    return f"http_{status}", "permanent"


def _limit_source(body: Any) -> Any:
    error = body.get("error") if isinstance(body, dict) else None
    metadata = error.get("metadata") if isinstance(error, dict) else None
    return metadata.get("limit_source") if isinstance(metadata, dict) else None


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - (now or datetime.now(UTC))).total_seconds()
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


def judge_body(body: Any, http_status: int | None = 200) -> AttemptResult:
    """ok / truncated / failed for a complete response body (plain, or an assembled stream)."""
    if not isinstance(body, dict):
        return failure("invalid_response", "response is not a JSON object", http_status=http_status)
    if body.get("error"):
        return failure(
            "provider_error",
            f"HTTP {http_status} with an error object: {error_text(body['error'])}",
            http_status=http_status,
            response=body,
        )
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return failure(
            "invalid_response", "response has no choices", http_status=http_status, response=body
        )
    choice = choices[0]
    finish = choice.get("finish_reason")
    if choice.get("error") or finish == "error":
        detail = error_text(choice.get("error")) if choice.get("error") else "no detail"
        return failure(
            "finish_error",
            f"finish_reason {finish!r}: {detail}",
            http_status=http_status,
            response=body,
        )
    status: AttemptStatus = "truncated" if finish == "length" else "ok"
    return AttemptResult(status=status, response=body, latency_s=0.0, http_status=http_status)


def request_headers(cfg: EndpointConfig, stream: bool) -> dict[str, str]:
    headers = {
        "Content-Type": "application/json",
        "Accept": "text/event-stream" if stream else "application/json",
        "User-Agent": USER_AGENT,
    }
    if cfg.http_referer:
        headers["HTTP-Referer"] = cfg.http_referer
    if cfg.app_title:
        headers["X-OpenRouter-Title"] = cfg.app_title
    return headers


# What the aiohttp stream path accepts as content codings: both decoders are in the standard
# library for aiohttp as for httpx (brotli/zstd depend on optional packages each resolves alone).
STREAM_ACCEPT_ENCODING = "gzip, deflate"
# httpx's default keep-alive expiry, so an idle connection lives as long on either path.
KEEPALIVE_SECONDS = 5.0
# httpx's default pool limits.
DEFAULT_LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=20)


class HTTPClient(httpx.AsyncClient):
    """An httpx client whose SSE streams are read through aiohttp.

    A K2.5 answer streams as ~1,300 events, each usually its own network read. Through httpx
    every read passes httpcore's generator layers, h11's pure-Python chunked parser and anyio's
    pause/resume of the socket, ~55% of the client's CPU at 1,000 streams (bench/streaming.py).
    aiohttp parses HTTP/1.1 in C (llhttp) and keeps the socket readable: 15-30% less client
    CPU per event than the same byte path over httpx at 500-2,000 streams. The request is
    still built by httpx (same URL normalization, headers, cookies, auth flow) and validated
    by h11 as httpcore would, and aiohttp's exceptions are mapped to httpx's, so `send`
    classifies both paths alike.

    Only streams go through aiohttp, and only where httpx would open a plain connection itself:
    a custom `transport` (tests' MockTransport), an explicit proxy/mounts or a proxy from the
    environment keeps every request on httpx. The aiohttp session is made on the first stream
    (inside the running loop) with the same TLS context and connection limit, and closed with
    the client.
    """

    def __init__(
        self,
        *,
        limits: httpx.Limits = DEFAULT_LIMITS,
        verify: ssl.SSLContext | bool = True,
        transport: httpx.AsyncBaseTransport | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(limits=limits, verify=verify, transport=transport, **kwargs)
        self._stream_limit = limits.max_connections or 0
        self._verify = verify
        self._session: aiohttp.ClientSession | None = None
        self._aiohttp = (
            transport is None
            and not kwargs.get("proxy")
            and not kwargs.get("mounts")
            and not (kwargs.get("trust_env", True) and _environment_proxies())
        )

    def stream_session(self) -> aiohttp.ClientSession | None:
        """The aiohttp session for streams, None when streams go through httpx."""
        if not self._aiohttp or self.is_closed:
            return None
        if self._session is None:
            tls = (self._verify if isinstance(self._verify, ssl.SSLContext)
                   else httpx.create_ssl_context(verify=self._verify))
            connector = aiohttp.TCPConnector(
                limit=self._stream_limit, limit_per_host=0, ssl=tls,
                keepalive_timeout=KEEPALIVE_SECONDS,
            )
            # trust_env off: the environment's proxies were checked above, and aiohttp would
            # also read ~/.netrc, which httpx does not.
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=None), trust_env=False,
            )
        return self._session

    async def _close_session(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def aclose(self) -> None:
        await self._close_session()
        await super().aclose()

    async def __aexit__(self, *exc: Any) -> None:
        await self._close_session()
        await super().__aexit__(*exc)


def _environment_proxies() -> bool:
    """Whether httpx would route some request through a proxy from the environment."""
    return any(key in ("http", "https", "all") for key in urllib.request.getproxies())


@dataclass(slots=True)
class _Phase:
    """How far an attempt got, to name a timeout or a dropped connection correctly."""

    stage: Literal["request", "body"] = "request"
    http_status: int | None = None
    done: bool = False
    assembler: StreamAssembler | None = None
    generation_id: str | None = None
    capped: bool = False


async def send(
    client: httpx.AsyncClient,
    cfg: EndpointConfig,
    body: dict[str, Any],
    api_key: ApiKey | str | None,
) -> AttemptResult:
    """POST `body` to the endpoint once and classify the outcome (see the module docstring)."""
    key = as_api_key(api_key)
    stream = bool(body.get("stream"))
    content = json.dumps(body, ensure_ascii=False).encode("utf-8")
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    cap = loop.time() + cfg.timeouts.attempt if cfg.timeouts.attempt else None
    phase = _Phase()

    def deadline(seconds: float) -> float:
        when = loop.time() + seconds
        if cap is not None and cap <= when:
            phase.capped = True
            return cap
        phase.capped = False
        return when

    t = cfg.timeouts
    timeout = httpx.Timeout(
        connect=t.connect, read=t.idle if stream else t.read, write=t.idle, pool=None
    )
    kwargs: dict[str, Any] = {
        "content": content,
        "headers": request_headers(cfg, stream),
        "auth": BearerAuth(key) if key is not None else None,
        "timeout": timeout,
    }
    try:
        async with asyncio.timeout_at(deadline(t.connect + (t.idle if stream else t.read))) as tm:
            if stream:
                result = await _stream(client, cfg, kwargs, phase, tm, deadline)
            else:
                result = await _plain(client, cfg, kwargs, phase)
    except TimeoutError:
        result = _after_cut(phase) or _timeout(cfg, phase, stream)
    except StreamError as exc:
        result = failure("stream_error", str(exc), http_status=phase.http_status)
    except (StreamDecodeError, UnicodeDecodeError) as exc:
        result = failure("invalid_json", str(exc), http_status=phase.http_status)
    except httpx.HTTPError as exc:
        result = _after_cut(phase) or _http_exception(exc, cfg, phase, stream)
    result.latency_s = time.monotonic() - started
    if result.http_status is None:
        result.http_status = phase.http_status
    result.generation_id = phase.generation_id
    if result.error_message is not None:
        result.error_message = scrub_text(result.error_message, key)
    if result.response is not None:
        result.response = scrub_obj(result.response, key)
    return result


async def _plain(
    client: httpx.AsyncClient, cfg: EndpointConfig, kwargs: dict[str, Any], phase: _Phase
) -> AttemptResult:
    response = await client.post(cfg.chat_url, **kwargs)
    phase.stage = "body"
    phase.http_status = response.status_code
    phase.generation_id = response.headers.get("x-generation-id")
    if response.status_code != 200:
        return _http_error(response.status_code, response.content, response.headers)
    return _json_body(response.content, response.status_code)


async def _stream(
    client: httpx.AsyncClient,
    cfg: EndpointConfig,
    kwargs: dict[str, Any],
    phase: _Phase,
    tm: asyncio.Timeout,
    deadline: Any,
) -> AttemptResult:
    session = client.stream_session() if isinstance(client, HTTPClient) else None
    if session is not None:
        return await _stream_aiohttp(session, client, cfg, kwargs, phase, tm, deadline)
    async with client.stream("POST", cfg.chat_url, **kwargs) as response:
        phase.stage = "body"
        phase.http_status = response.status_code
        phase.generation_id = response.headers.get("x-generation-id")
        if response.status_code != 200:
            return _http_error(response.status_code, await response.aread(), response.headers)
        if "text/event-stream" not in response.headers.get("content-type", ""):
            # The server ignored `stream: true` and answered in one piece, or a proxy relabelled
            # the stream; the body itself tells which.
            return _unlabelled_body(await response.aread(), response.status_code)
        # Raw bytes, split into events here: no text decoding and no line-by-line iteration in
        # httpx (bench/streaming.py). Content-encoded streams (rare) still go through httpx's
        # decoders; otherwise the response's own byte stream: one async-generator hop and no
        # per-chunk bookkeeping less than aiter_raw (the stream is closed by the
        # `client.stream` context as before).
        # (an AsyncClient's response: its stream is the async one of httpx's union)
        chunks = (response.aiter_bytes() if response.headers.get("content-encoding")
                  else cast(httpx.AsyncByteStream, response.stream))
        await _read_events(chunks, cfg.timeouts.idle, phase, tm, deadline)
    return _assembled(phase)


async def _stream_aiohttp(
    session: aiohttp.ClientSession,
    client: httpx.AsyncClient,
    cfg: EndpointConfig,
    kwargs: dict[str, Any],
    phase: _Phase,
    tm: asyncio.Timeout,
    deadline: Any,
) -> AttemptResult:
    """`_stream` over aiohttp (see HTTPClient): the same request, outcomes and exceptions."""
    request = client.build_request(
        "POST", cfg.chat_url, content=kwargs["content"], headers=kwargs["headers"]
    )
    if request.url.scheme not in ("http", "https"):
        raise httpx.UnsupportedProtocol(f"Request URL has an unsupported protocol {request.url}")
    auth = kwargs["auth"]
    if auth is not None:
        request = next(auth.auth_flow(request))
    request.headers["Accept-Encoding"] = STREAM_ACCEPT_ENCODING
    raw_headers = request.headers.raw
    try:
        # What httpcore does before sending: h11 refuses header names/values it cannot send.
        h11.Request(method=b"POST", target=request.url.raw_path, headers=raw_headers)
    except h11.LocalProtocolError:
        # Its message may quote the Authorization header: never passed on.
        raise httpx.LocalProtocolError("invalid request header") from None
    headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in raw_headers]
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=cfg.timeouts.connect)
    try:
        async with session.post(
            yarl.URL(str(request.url), encoded=True), data=request.content, headers=headers,
            allow_redirects=False, timeout=timeout, skip_auto_headers=("Content-Type",),
        ) as response:
            phase.stage = "body"
            phase.http_status = response.status
            phase.generation_id = response.headers.get("x-generation-id")
            if response.status != 200:
                return _http_error(response.status, await response.read(), response.headers)
            if "text/event-stream" not in response.headers.get("content-type", ""):
                return _unlabelled_body(await response.read(), response.status)
            await _read_events(response.content.iter_any(), cfg.timeouts.idle, phase, tm,
                               deadline)
    except aiohttp.ClientError as exc:
        raise _httpx_error(exc) from None
    return _assembled(phase)


def _httpx_error(exc: aiohttp.ClientError) -> httpx.HTTPError | httpx.InvalidURL:
    """The httpx exception httpx raises for what aiohttp reported (`_http_exception` reads it)."""
    detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return httpx.ConnectTimeout(detail)
    if isinstance(exc, aiohttp.ClientConnectorError):
        # Refused, DNS, TLS handshake and certificate errors: httpcore's ConnectError.
        return httpx.ConnectError(detail)
    if isinstance(exc, aiohttp.ServerTimeoutError):
        return httpx.ReadTimeout(detail)
    if isinstance(exc, aiohttp.ClientPayloadError | aiohttp.ServerDisconnectedError
                  | aiohttp.ClientResponseError):
        # A body cut short (chunked or Content-Length), the server closing mid-answer, or
        # bytes that are not HTTP: h11's RemoteProtocolError.
        return httpx.RemoteProtocolError(detail)
    if isinstance(exc, aiohttp.InvalidURL):
        return httpx.InvalidURL(detail)
    if isinstance(exc, aiohttp.ClientOSError):
        return httpx.ReadError(detail)
    return httpx.TransportError(detail)


async def _read_events(
    chunks: AsyncIterable[bytes],
    idle: float,
    phase: _Phase,
    tm: asyncio.Timeout,
    deadline: Any,
) -> None:
    """Split the body's bytes into events and assemble them (both HTTP paths)."""
    parser = StreamParser()
    phase.assembler = parser.assembler
    feed = parser.feed
    loop = asyncio.get_running_loop()
    # Moving the deadline costs a timer cancel + create; a stream sends hundreds of events
    # a second, so move it only once it is 5% of `idle` off (the first chunk also pulls in
    # the connect allowance of the initial deadline). Any bytes received count, comments
    # included, so a keep-alive holds the stream open as before.
    slack = idle * 0.05
    # The deadline moves at most every `slack` seconds, so a silence of idle - slack is
    # always allowed (the first chunk moves it at once: it ends the connect allowance).
    check_at = -math.inf
    async for chunk in chunks:
        if phase.done:
            # After `[DONE]`: drained so the connection goes back to the pool clean.
            continue
        now = loop.time()
        if now >= check_at:
            tm.reschedule(deadline(idle))
            check_at = now + slack
        if feed(chunk):
            phase.done = True
            tm.reschedule(deadline(min(idle, DRAIN_SECONDS)))
    if not phase.done and parser.close():
        phase.done = True


def _assembled(phase: _Phase) -> AttemptResult:
    assembler = phase.assembler
    assert assembler is not None
    # A stream without `[DONE]` is complete only if the answer itself said it ended.
    if not phase.done and assembler.finish_reason is None:
        return failure(
            "truncated_body",
            f"stream ended after {assembler.chunks} chunks without [DONE] or a finish_reason",
            http_status=phase.http_status,
        )
    return judge_body(assembler.result(), phase.http_status)


def _after_cut(phase: _Phase) -> AttemptResult | None:
    """A stream cut after `[DONE]` (while draining) is still a complete answer."""
    if phase.done and phase.assembler is not None:
        return _assembled(phase)
    return None


def _json_body(raw: bytes, status: int) -> AttemptResult:
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return failure("invalid_json", f"response body is not JSON: {exc}", http_status=status)
    return judge_body(body, status)


def _unlabelled_body(raw: bytes, status: int) -> AttemptResult:
    if not raw.lstrip().startswith((b"data:", b":")):
        return _json_body(raw, status)
    body, done = assemble_lines(raw.decode("utf-8", errors="replace").splitlines())
    finished = any(c.get("finish_reason") is not None for c in body["choices"])
    if not done and not finished:
        return failure(
            "truncated_body", "stream ended without [DONE] or a finish_reason", http_status=status
        )
    return judge_body(body, status)


def _http_error(status: int, raw: bytes, headers: Mapping[str, str]) -> AttemptResult:
    text = raw.decode("utf-8", errors="replace")
    try:
        body: Any = json.loads(text)
    except json.JSONDecodeError:
        body = None
    error_class, kind = classify_status(status, body)
    if isinstance(body, dict) and body.get("error"):
        detail = error_text(body["error"])
    else:
        detail = " ".join(text.split())[:ERROR_TEXT_LIMIT] or "(empty body)"
    return failure(
        error_class,
        f"HTTP {status}: {detail}",
        kind,
        http_status=status,
        response=body if isinstance(body, dict) else None,
        retry_after_s=parse_retry_after(headers.get("retry-after")),
    )


def _timeout(cfg: EndpointConfig, phase: _Phase, stream: bool) -> AttemptResult:
    t = cfg.timeouts
    if phase.capped:
        return failure("attempt_timeout", f"attempt exceeded {t.attempt:g} s")
    if not stream:
        return failure(
            "read_timeout",
            f"response not complete within {t.read:g} s",
            http_status=phase.http_status,
        )
    if phase.stage == "request":
        return failure("timeout", f"no response headers within {t.connect + t.idle:g} s")
    return failure(
        "idle_timeout",
        f"stream stalled: nothing received for {t.idle:g} s",
        http_status=phase.http_status,
    )


def _http_exception(
    exc: httpx.HTTPError, cfg: EndpointConfig, phase: _Phase, stream: bool
) -> AttemptResult:
    detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    status = phase.http_status
    if isinstance(exc, httpx.ConnectTimeout):
        return failure("connect_timeout", f"no connection within {cfg.timeouts.connect:g} s")
    if isinstance(exc, httpx.ReadTimeout):
        return _timeout(cfg, phase, stream)
    if isinstance(exc, httpx.TimeoutException):
        return failure("timeout", detail, http_status=status)
    if isinstance(exc, httpx.LocalProtocolError):
        # h11's message quotes the offending header, which may be the Authorization header:
        # say what happened without the text.
        return failure(
            "bad_request_headers",
            f"the request could not be sent ({type(exc).__name__}); check the key in"
            f" ${cfg.api_key_env} and the attribution headers for stray characters",
            "fatal",
        )
    if isinstance(exc, httpx.UnsupportedProtocol | httpx.InvalidURL):
        return failure("bad_endpoint", f"cannot send to {cfg.chat_url}: {detail}", "fatal")
    if isinstance(exc, httpx.RemoteProtocolError) and phase.stage == "body":
        return failure("truncated_body", detail, http_status=status)
    if isinstance(exc, httpx.ConnectError):
        return failure("connect_error", detail)
    if isinstance(exc, httpx.TransportError):
        return failure("connection_error", detail, http_status=status)
    if isinstance(exc, httpx.DecodingError):
        return failure("invalid_body", detail, http_status=status)
    return failure("http_error", detail, http_status=status)
