"""The stream path over aiohttp (transport.HTTPClient) against real sockets: every outcome must be
classified exactly as on the httpx path, which each case also runs (`path` parameter)."""

from __future__ import annotations

import asyncio
import datetime
import gzip
import ipaddress
import json
import socket
import ssl
import warnings

import httpx
import pytest

from specregen.client.transport import HTTPClient, send
from tests.unit.test_client_support import SECRET_KEY, chunk, make_cfg, sse

STREAM_BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
PATHS = ["httpx", "aiohttp"]


class Server:
    """A raw HTTP/1.1 server on loopback whose answer per request is a script of writes, so
    cuts, resets, stalls and bad framing are exactly what the test says."""

    def __init__(self, script, tls: ssl.SSLContext | None = None) -> None:
        self.script = script
        self.tls = tls
        self.connections = 0
        self.requests: list[tuple[bytes, dict[str, str], bytes]] = []

    async def __aenter__(self):
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=self.tls)
        port = self.server.sockets[0].getsockname()[1]
        scheme = "https" if self.tls else "http"
        self.url = f"{scheme}://{'localhost' if self.tls else '127.0.0.1'}:{port}/v1"
        return self

    async def __aexit__(self, *exc):
        self.server.close()

    async def _handle(self, reader, writer):
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        name, value = line.split(":", 1)
                        headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", 0)))
                self.requests.append((lines[0].encode(), headers, body))
                keep = await self.script(writer, json.loads(body), headers)
                await writer.drain()
                if not keep:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def chunked(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def stream_head(extra: str = "") -> bytes:
    return (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n" + extra.encode() + b"\r\n")


async def good_stream(writer, body, headers):
    writer.write(stream_head())
    writer.write(chunked(b": OPENROUTER PROCESSING\n\n"))
    for i in range(5):
        writer.write(chunked(sse([chunk({"content": str(i)})], done=False)))
        await writer.drain()
        await asyncio.sleep(0.01)
    writer.write(chunked(sse([chunk({}, finish="stop")])) + b"0\r\n\r\n")
    return True


def client_of(path: str, **kwargs):
    return HTTPClient(**kwargs) if path == "aiohttp" else httpx.AsyncClient(**kwargs)


def attempt(script, path, *, key=SECRET_KEY, tls=None, verify=True, attempts=1, **cfg):
    async def main():
        async with Server(script, tls) as server:
            config = make_cfg(base_url=server.url, **cfg)
            async with client_of(path, verify=verify) as client:
                if path == "aiohttp":
                    assert client.stream_session() is not None  # really the aiohttp path
                results = [await send(client, config, STREAM_BODY, key) for _ in range(attempts)]
            return results, server

    return asyncio.run(main())


@pytest.mark.parametrize("path", PATHS)
def test_stream_assembles_and_the_connection_is_reused(path):
    (first, second), server = attempt(good_stream, path, attempts=2)
    for result in (first, second):
        assert result.status == "ok", result.error_message
        assert result.response["choices"][0]["message"]["content"] == "01234"
        assert result.http_status == 200
    # Drained after [DONE]: the second request went over the same connection.
    assert server.connections == 1
    line, headers, body = server.requests[0]
    assert line == b"POST /v1/chat/completions HTTP/1.1"
    assert headers["authorization"] == f"Bearer {SECRET_KEY}"
    assert headers["accept"] == "text/event-stream"
    assert headers["content-type"] == "application/json"
    assert headers["user-agent"].startswith("specregen/")
    assert json.loads(body) == STREAM_BODY


@pytest.mark.parametrize("path", PATHS)
def test_attribution_headers_and_no_key(path):
    (result,), server = attempt(good_stream, path, key=None, http_referer="https://example.org",
                                app_title="specregen")
    assert result.status == "ok"
    headers = server.requests[0][1]
    assert "authorization" not in headers
    assert headers["http-referer"] == "https://example.org"
    assert headers["x-openrouter-title"] == "specregen"


@pytest.mark.parametrize("path", PATHS)
def test_429_with_retry_after_and_the_key_echoed_back_is_scrubbed(path):
    async def script(writer, body, headers):
        text = json.dumps({"error": {"code": 429, "message": "slow down " + SECRET_KEY}})
        writer.write(f"HTTP/1.1 429 Too Many Requests\r\nretry-after: 7\r\ncontent-type: "
                     f"application/json\r\ncontent-length: {len(text)}\r\n\r\n{text}".encode())
        return True

    (result,), _ = attempt(script, path)
    assert (result.error_class, result.kind, result.retry_after_s) == ("rate_limited",
                                                                       "retryable", 7.0)
    assert SECRET_KEY not in result.error_message
    assert SECRET_KEY not in json.dumps(result.response)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("status", "error_class", "kind"), [
    (502, "server_error", "retryable"), (401, "unauthorized", "fatal"),
    (400, "bad_request", "permanent")])
def test_error_status_on_a_stream_request(path, status, error_class, kind):
    async def script(writer, body, headers):
        writer.write(f"HTTP/1.1 {status} X\r\ncontent-length: 4\r\n\r\noops".encode())
        return True

    (result,), _ = attempt(script, path)
    assert (result.error_class, result.kind, result.http_status) == (error_class, kind, status)
    assert "oops" in result.error_message


@pytest.mark.parametrize("path", PATHS)
def test_stall_is_an_idle_timeout_and_steady_keepalives_are_not(path):
    async def script(writer, body, headers):
        writer.write(stream_head())
        writer.write(chunked(sse([chunk({"content": "a"})], done=False)))
        # 1.2 s of keep-alives 0.1 s apart against an idle timeout of 1 s: a loaded machine
        # may stretch a gap, not tenfold; the stall is three times the timeout.
        for _ in range(12):
            await writer.drain()
            await asyncio.sleep(0.1)
            writer.write(chunked(b": ping\n\n"))
        if body["model"] == "stall":
            await asyncio.sleep(3.0)
        writer.write(chunked(sse([chunk({}, finish="stop")])) + b"0\r\n\r\n")
        return True

    (steady,), _ = attempt(script, path, timeouts={"idle": 1.0})
    assert steady.status == "ok" and steady.latency_s > 1.1

    async def stall(writer, body, headers):
        return await script(writer, {"model": "stall"}, headers)

    (stalled,), _ = attempt(stall, path, timeouts={"idle": 1.0})
    assert (stalled.error_class, stalled.kind) == ("idle_timeout", "retryable")


@pytest.mark.parametrize("path", PATHS)
def test_headers_that_never_come_and_the_attempt_cap(path):
    async def silent(writer, body, headers):
        await asyncio.sleep(2)
        return False

    (result,), _ = attempt(silent, path, timeouts={"idle": 0.2, "connect": 0.2})
    assert (result.error_class, result.kind) == ("timeout", "retryable")

    async def slow(writer, body, headers):
        writer.write(stream_head())
        for _ in range(20):
            writer.write(chunked(b": ping\n\n"))
            await writer.drain()
            await asyncio.sleep(0.05)
        return False

    (capped,), _ = attempt(slow, path, timeouts={"idle": 1, "attempt": 0.3})
    assert capped.error_class == "attempt_timeout"


@pytest.mark.parametrize("path", PATHS)
def test_reset_mid_stream(path):
    async def script(writer, body, headers):
        writer.write(stream_head())
        writer.write(chunked(sse([chunk({"content": "half"})], done=False)))
        await writer.drain()
        await asyncio.sleep(0.05)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        writer.transport.abort()
        return False

    (result,), _ = attempt(script, path)
    assert result.status == "failed"
    assert result.error_class in ("connection_error", "truncated_body")
    assert result.kind == "retryable"


@pytest.mark.parametrize("path", PATHS)
def test_body_cut_mid_chunk_and_stream_ended_without_done(path):
    async def cut(writer, body, headers):
        writer.write(stream_head())
        data = sse([chunk({"content": "abc"})], done=False)
        writer.write(f"{len(data) + 50:x}\r\n".encode() + data)  # promises 50 more bytes
        await writer.drain()
        return False  # closes

    (result,), _ = attempt(cut, path)
    assert (result.error_class, result.kind) == ("truncated_body", "retryable")

    async def unfinished(writer, body, headers):
        writer.write(stream_head())
        writer.write(chunked(sse([chunk({"content": "abc"})], done=False)) + b"0\r\n\r\n")
        return True

    (result,), _ = attempt(unfinished, path)
    assert (result.error_class, result.kind) == ("truncated_body", "retryable")
    assert "without [DONE]" in result.error_message


@pytest.mark.parametrize("path", PATHS)
def test_server_closes_before_answering(path):
    async def script(writer, body, headers):
        return False

    (result,), _ = attempt(script, path)
    assert (result.error_class, result.kind) == ("connection_error", "retryable")


@pytest.mark.parametrize("path", PATHS)
def test_error_event_and_garbled_chunk(path):
    async def error_event(writer, body, headers):
        writer.write(stream_head())
        writer.write(chunked(b'event: error\ndata: {"error": {"code": 502, "message": "gone"}}'
                             b"\n\n") + b"0\r\n\r\n")
        return True

    (result,), _ = attempt(error_event, path)
    assert (result.error_class, result.kind) == ("stream_error", "retryable")
    assert "gone" in result.error_message

    async def garbled(writer, body, headers):
        writer.write(stream_head())
        writer.write(chunked(b"data: {not json\n\n") + b"0\r\n\r\n")
        return True

    (result,), _ = attempt(garbled, path)
    assert (result.error_class, result.kind) == ("invalid_json", "retryable")


@pytest.mark.parametrize("path", PATHS)
def test_gzip_stream_and_unlabelled_stream(path):
    async def zipped(writer, body, headers):
        data = gzip.compress(sse([chunk({"content": "zip"}, finish="stop")]))
        writer.write(stream_head("content-encoding: gzip\r\n") + chunked(data) + b"0\r\n\r\n")
        return True

    (result,), _ = attempt(zipped, path)
    assert result.status == "ok", result.error_message
    assert result.response["choices"][0]["message"]["content"] == "zip"

    async def plain(writer, body, headers):
        data = sse([chunk({"content": "x"}, finish="stop")])
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n"
                     + f"content-length: {len(data)}\r\n\r\n".encode() + data)
        return True

    (result,), _ = attempt(plain, path)
    assert result.status == "ok"
    assert result.response["choices"][0]["message"]["content"] == "x"


@pytest.mark.parametrize("path", PATHS)
def test_a_key_with_a_newline_is_fatal_and_never_quoted(path):
    key = SECRET_KEY + "\n"
    (result,), server = attempt(good_stream, path, key=key)
    assert (result.error_class, result.kind) == ("bad_request_headers", "fatal")
    assert SECRET_KEY not in result.error_message
    assert not server.requests


@pytest.mark.parametrize("path", PATHS)
def test_connection_refused(path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cfg = make_cfg(base_url=f"http://127.0.0.1:{port}/v1", timeouts={"idle": 0.3})

    async def main():
        async with client_of(path) as client:
            return await send(client, cfg, STREAM_BODY, SECRET_KEY)

    result = asyncio.run(main())
    assert (result.error_class, result.kind) == ("connect_error", "retryable")


def _self_signed() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server context for localhost and a client context that trusts exactly that cert."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    pem = cert.public_bytes(serialization.Encoding.PEM)
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        cert_file, key_file = Path(tmp, "c.pem"), Path(tmp, "k.pem")
        cert_file.write_bytes(pem)
        key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                               serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server.load_cert_chain(cert_file, key_file)
    client = ssl.create_default_context(cadata=pem.decode())
    return server, client


@pytest.mark.parametrize("path", PATHS)
def test_tls_verified_with_the_given_context_and_refused_without(path):
    server_tls, client_tls = _self_signed()
    (result,), _ = attempt(good_stream, path, tls=server_tls, verify=client_tls)
    assert result.status == "ok", result.error_message
    (result,), _ = attempt(good_stream, path, tls=server_tls, verify=True)
    assert (result.error_class, result.kind) == ("connect_error", "retryable")
    assert "CERTIFICATE_VERIFY_FAILED" in result.error_message


def test_only_plain_clients_stream_over_aiohttp(monkeypatch):
    async def main():
        async with HTTPClient() as plain:
            assert plain.stream_session() is not None
        assert plain.stream_session() is None  # closed
        mock = httpx.MockTransport(lambda request: httpx.Response(200))
        async with HTTPClient(transport=mock) as custom:
            assert custom.stream_session() is None
        async with HTTPClient(proxy="http://127.0.0.1:9") as proxied:
            assert proxied.stream_session() is None
        monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
        async with HTTPClient() as from_env:
            assert from_env.stream_session() is None
        async with HTTPClient(trust_env=False) as ignoring_env:
            assert ignoring_env.stream_session() is not None

    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        asyncio.run(main())


def test_closing_the_client_closes_the_stream_session():
    async def main():
        client = HTTPClient()
        session = client.stream_session()
        assert session is not None and not session.closed
        await client.aclose()
        assert session.closed

    asyncio.run(main())
