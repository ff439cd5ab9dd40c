"""One attempt: every outcome and its classification, timeouts, and real-socket behaviour."""

from __future__ import annotations

import asyncio
import socket
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import StreamingResponse
from starlette.routing import Route

from specregen.client.transport import classify_status, parse_retry_after, send
from tests.unit.test_client_support import (
    SECRET_KEY,
    ThreadedApp,
    chunk,
    completion,
    json_response,
    make_cfg,
    paced,
    sse,
)

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
STREAM_BODY = {**BODY, "stream": True}
SSE_HEADERS = {"content-type": "text/event-stream"}


def attempt(handler, body=BODY, key=SECRET_KEY, **cfg_overrides):
    cfg = make_cfg(**cfg_overrides)

    async def main():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await send(client, cfg, body, key)

    return asyncio.run(main())


def streamed(parts, **cfg_overrides):
    """Attempt a stream whose bytes arrive as (delay, bytes) parts."""

    async def handler(request):
        return httpx.Response(200, headers=SSE_HEADERS, content=paced(parts))

    return attempt(handler, STREAM_BODY, **cfg_overrides)


@pytest.mark.parametrize(
    ("status", "error_class", "kind"),
    [
        (400, "bad_request", "permanent"),
        (401, "unauthorized", "fatal"),
        (402, "payment_required", "fatal"),
        (403, "forbidden", "permanent"),
        (404, "not_found", "permanent"),
        (408, "request_timeout", "retryable"),
        (413, "payload_too_large", "permanent"),
        (422, "unprocessable", "permanent"),
        (429, "rate_limited", "retryable"),
        (500, "server_error", "retryable"),
        (502, "server_error", "retryable"),
        (503, "server_error", "retryable"),
        (418, "http_418", "permanent"),
    ],
)
def test_http_status_classification(status, error_class, kind):
    def handler(request):
        return json_response({"error": {"code": status, "message": "nope"}}, status)

    result = attempt(handler)
    assert (result.status, result.error_class, result.kind) == ("failed", error_class, kind)
    assert result.http_status == status
    assert result.error_message == f"HTTP {status}: {status} nope"
    assert result.response == {"error": {"code": status, "message": "nope"}}


def test_402_from_openrouters_in_flight_budget_is_a_rate_limit():
    body = {
        "error": {
            "code": 402,
            "message": "wait",
            "metadata": {"limit_source": "openrouter_in_flight_budget"},
        }
    }
    assert classify_status(402, body) == ("in_flight_budget", "retryable")
    assert classify_status(402, {"error": {"code": 402}}) == ("payment_required", "fatal")


def test_retry_after_seconds_and_http_date():
    result = attempt(lambda r: httpx.Response(429, text="slow down", headers={"Retry-After": "7"}))
    assert result.retry_after_s == 7.0
    assert result.error_message == "HTTP 429: slow down"
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert (
        parse_retry_after(format_datetime(now + timedelta(seconds=30), usegmt=True), now=now)
        == 30.0
    )
    assert parse_retry_after("0.25") == 0.25
    assert parse_retry_after("garbage") is None
    assert parse_retry_after("-3") == 0.0


def test_ok_truncated_and_200_errors():
    assert attempt(lambda r: json_response(completion())).status == "ok"
    truncated = attempt(lambda r: json_response(completion(finish="length")))
    assert (truncated.status, truncated.kind) == ("truncated", None)

    error_200 = attempt(lambda r: json_response({"error": {"code": 502, "message": "died"}}))
    assert (error_200.error_class, error_200.kind, error_200.http_status) == (
        "provider_error",
        "retryable",
        200,
    )

    finish_error = attempt(lambda r: json_response(completion(finish="error")))
    assert (finish_error.error_class, finish_error.kind) == ("finish_error", "retryable")

    no_choices = attempt(lambda r: json_response({"id": "x", "choices": []}))
    assert no_choices.error_class == "invalid_response"

    bad_json = attempt(
        lambda r: httpx.Response(
            200, text='{"choices": [', headers={"content-type": "application/json"}
        )
    )
    assert (bad_json.error_class, bad_json.kind) == ("invalid_json", "retryable")


@pytest.mark.parametrize(
    ("exc", "error_class"),
    [
        (httpx.ConnectError("connection refused"), "connect_error"),
        (httpx.ReadError("[Errno 104] Connection reset by peer"), "connection_error"),
        (
            httpx.RemoteProtocolError("Server disconnected without sending a response."),
            "connection_error",
        ),
        (httpx.ConnectTimeout("slow"), "connect_timeout"),
        (httpx.ReadTimeout("slow"), "read_timeout"),
    ],
)
def test_transport_errors_are_retryable(exc, error_class):
    def handler(request):
        raise exc

    result = attempt(handler)
    assert (result.status, result.error_class, result.kind) == ("failed", error_class, "retryable")


def test_local_protocol_error_is_fatal_and_does_not_quote_the_header():
    def handler(request):
        raise httpx.LocalProtocolError(f"Illegal header value b'Bearer {SECRET_KEY}'")

    result = attempt(handler)
    assert (result.error_class, result.kind) == ("bad_request_headers", "fatal")
    assert SECRET_KEY not in result.error_message
    assert "$OPENROUTER_API_KEY" in result.error_message


def test_stream_assembles_and_skips_keep_alives():
    body = sse(
        [
            ": OPENROUTER PROCESSING",
            "",
            chunk({"reasoning": "R"}),
            chunk({"content": "C"}, finish="stop"),
            {"choices": [], "usage": {"completion_tokens": 2, "cost": 0.5}},
        ]
    )
    result = streamed([(0, body)])
    assert result.status == "ok"
    message = result.response["choices"][0]["message"]
    assert (message["reasoning"], message["content"]) == ("R", "C")
    assert result.response["usage"]["cost"] == 0.5


def test_stream_error_event_and_finish_error_are_retryable():
    error = streamed(
        [(0, sse([chunk({"content": "x"}), {"error": {"code": 502, "message": "upstream"}}]))]
    )
    assert (error.error_class, error.kind, error.http_status) == ("stream_error", "retryable", 200)
    assert "upstream" in error.error_message

    finish = streamed([(0, sse([chunk({"content": "x"}, finish="error")]))])
    assert (finish.error_class, finish.kind) == ("finish_error", "retryable")


def test_stream_cut_before_the_end_is_a_truncated_body():
    result = streamed([(0, sse([chunk({"content": "x"})], done=False))])
    assert (result.error_class, result.kind) == ("truncated_body", "retryable")
    # Closed without [DONE] but after a finish_reason: the answer is complete.
    complete = streamed([(0, sse([chunk({"content": "x"}, finish="stop")], done=False))])
    assert complete.status == "ok"


def test_stream_with_a_garbled_chunk_is_invalid_json():
    result = streamed([(0, b'data: {"choices": [\n\n')])
    assert (result.error_class, result.kind) == ("invalid_json", "retryable")


def test_server_that_ignores_stream_true_is_read_as_plain_json():
    result = attempt(lambda r: json_response(completion()), STREAM_BODY)
    assert result.status == "ok"
    assert result.response["choices"][0]["message"]["content"] == "Hello!"


def test_error_status_on_a_stream_request():
    result = attempt(
        lambda r: json_response(
            {"error": {"code": 429, "message": "rl"}}, 429, {"retry-after": "2"}
        ),
        STREAM_BODY,
    )
    assert (result.error_class, result.retry_after_s) == ("rate_limited", 2.0)


def test_slow_but_steady_stream_survives_the_idle_timeout():
    parts = [(0.05, sse([chunk({"content": "."})], done=False)) for _ in range(16)]
    parts.append((0.05, sse([chunk({}, finish="stop")])))
    result = streamed(parts, timeouts={"idle": 0.3})
    assert result.status == "ok"
    assert result.response["choices"][0]["message"]["content"] == "." * 16
    assert result.latency_s > 0.3 * 2  # longer than the idle timeout, several times over


def test_keep_alive_comments_count_as_activity():
    parts = [(0.1, b": OPENROUTER PROCESSING\n\n") for _ in range(6)]
    parts.append((0.05, sse([chunk({"content": "late"}, finish="stop")])))
    assert streamed(parts, timeouts={"idle": 0.3}).status == "ok"


def test_stalled_stream_fails_after_the_idle_timeout():
    parts = [(0, sse([chunk({"content": "a"})], done=False)), (3.0, sse([]))]
    started = time.monotonic()
    result = streamed(parts, timeouts={"idle": 0.3})
    elapsed = time.monotonic() - started
    assert (result.status, result.error_class, result.kind) == (
        "failed",
        "idle_timeout",
        "retryable",
    )
    assert 0.25 < elapsed < 1.5


def test_stall_after_done_still_counts_as_complete():
    parts = [(0, sse([chunk({"content": "a"}, finish="stop")])), (3.0, b"")]
    started = time.monotonic()
    result = streamed(parts, timeouts={"idle": 0.3})
    assert result.status == "ok"
    assert time.monotonic() - started < 1.5


def test_non_stream_read_timeout():
    async def handler(request):
        await asyncio.sleep(3)
        return json_response(completion())

    started = time.monotonic()
    result = attempt(handler, timeouts={"read": 0.3, "connect": 0.1})
    assert (result.error_class, result.kind) == ("read_timeout", "retryable")
    assert time.monotonic() - started < 1.5


def test_stream_whose_headers_never_come():
    async def handler(request):
        await asyncio.sleep(3)
        return httpx.Response(200, headers=SSE_HEADERS, content=sse([]))

    started = time.monotonic()
    result = attempt(handler, STREAM_BODY, timeouts={"idle": 0.3, "connect": 0.1})
    assert (result.error_class, result.kind) == ("timeout", "retryable")
    assert time.monotonic() - started < 1.5


def test_attempt_cap():
    parts = [(0.1, b": ping\n\n") for _ in range(30)]
    result = streamed(parts, timeouts={"idle": 1, "attempt": 0.4})
    assert result.error_class == "attempt_timeout"


def test_authorization_and_attribution_headers():
    seen = {}

    def handler(request):
        seen.update(request.headers)
        return json_response(completion())

    attempt(handler, http_referer="https://example.org", app_title="specregen")
    assert seen["authorization"] == f"Bearer {SECRET_KEY}"
    assert seen["http-referer"] == "https://example.org"
    assert seen["x-openrouter-title"] == "specregen"
    seen.clear()
    attempt(handler, key=None)
    assert "authorization" not in seen


# -- real sockets ---------------------------------------------------------------------------


async def _stream_endpoint(request):
    body = await request.json()
    mode = body["model"]

    async def events():
        yield b": OPENROUTER PROCESSING\n\n"
        for i in range(8):
            await asyncio.sleep(0.06)
            yield sse([chunk({"content": str(i)})], done=False)
        if mode == "stall":
            await asyncio.sleep(3)
        yield sse([chunk({}, finish="stop")])

    return StreamingResponse(events(), media_type="text/event-stream")


@pytest.fixture(scope="module")
def stream_server():
    app = Starlette(routes=[Route("/v1/chat/completions", _stream_endpoint, methods=["POST"])])
    with ThreadedApp(app) as server:
        yield server


def _socket_attempt(url, model, idle):
    cfg = make_cfg(base_url=url, timeouts={"idle": idle})

    async def main():
        async with httpx.AsyncClient() as client:
            return await send(client, cfg, {**STREAM_BODY, "model": model}, SECRET_KEY)

    return asyncio.run(main())


def test_real_socket_steady_stream_survives_and_stall_fails(stream_server):
    steady = _socket_attempt(stream_server.url, "steady", idle=0.3)
    assert steady.status == "ok"
    assert steady.response["choices"][0]["message"]["content"] == "01234567"
    assert steady.latency_s > 0.45
    stalled = _socket_attempt(stream_server.url, "stall", idle=0.3)
    assert (stalled.error_class, stalled.kind) == ("idle_timeout", "retryable")


def test_real_socket_connection_reset_mid_stream():
    """A server that sends headers and half a stream, then resets the TCP connection."""

    async def main():
        async def handle(reader, writer):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n"
            )
            payload = sse([chunk({"content": "half"})], done=False)
            writer.write(f"{len(payload):x}\r\n".encode() + payload + b"\r\n")
            await writer.drain()
            await asyncio.sleep(0.05)
            sock = writer.get_extra_info("socket")
            # SO_LINGER 0: close() sends RST instead of FIN.
            sock.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
            )
            writer.transport.abort()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        cfg = make_cfg(base_url=f"http://127.0.0.1:{port}/v1")
        async with server, httpx.AsyncClient() as client:
            return await send(client, cfg, STREAM_BODY, SECRET_KEY)

    result = asyncio.run(main())
    assert result.status == "failed"
    assert result.error_class in ("connection_error", "truncated_body")
    assert result.kind == "retryable"


def test_real_socket_connection_refused():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = _socket_attempt(f"http://127.0.0.1:{port}/v1", "x", idle=0.3)
    assert (result.error_class, result.kind) == ("connect_error", "retryable")


def test_stream_with_a_wrong_content_type_is_still_assembled():
    def handler(request):
        data = sse([chunk({"content": "x"}, finish="stop")])
        return httpx.Response(200, headers={"content-type": "text/plain"}, content=data)

    result = attempt(handler, STREAM_BODY)
    assert result.status == "ok"
    assert result.response["choices"][0]["message"]["content"] == "x"
