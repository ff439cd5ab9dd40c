"""Helpers for the client tests (fake servers, bodies, configs), plus checks of the helpers.

Two kinds of fake server: `FakeServer` behind `httpx.MockTransport` (no sockets, instrumented:
in-flight count over time, request times and bodies), and `ThreadedApp`, a starlette app under
uvicorn in a thread on 127.0.0.1 port 0, for behaviour that needs a real socket.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import uvicorn

from specregen.client.config import EndpointConfig
from specregen.records import Prompt

SECRET_KEY = "sk-or-v1-" + "5ec7e75ec7e7" * 5


def make_cfg(**overrides: Any) -> EndpointConfig:
    data: dict[str, Any] = {
        "base_url": "http://api.test/v1",
        "model": "moonshotai/kimi-k2.5",
        "stream": False,
        "concurrency": 4,
        "timeouts": {"connect": 2, "idle": 2, "read": 5},
        "retry": {"max_attempts": 3, "base_delay": 0.001, "max_delay": 0.01},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return EndpointConfig.load(data)


def make_prompts(n: int, prefix: str = "s") -> list[Prompt]:
    return [
        Prompt(sample_id=f"{prefix}{i}", messages=[{"role": "user", "content": f"q{i}"}])
        for i in range(n)
    ]


def completion(
    content: str | None = "Hello!",
    reasoning: str | None = "Think.",
    finish: str = "stop",
    *,
    tool_calls: list[dict[str, Any]] | None = None,
    usage: dict[str, Any] | None = None,
    provider: str = "FakeProvider",
    extra_choice: dict[str, Any] | None = None,
    **top: Any,
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning"] = reasoning
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": "gen-1",
        "object": "chat.completion",
        "created": 1,
        "model": "moonshotai/kimi-k2.5",
        "provider": provider,
        "choices": [
            {"index": 0, "message": message, "finish_reason": finish, **(extra_choice or {})}
        ],
        "usage": usage
        if usage is not None
        else {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        **top,
    }


def sse(events: list[Any], *, done: bool = True) -> bytes:
    """SSE text: dicts become `data:` events, strings are written as raw lines."""
    out = []
    for event in events:
        if isinstance(event, str):
            out.append(event + "\n")
        else:
            out.append(f"data: {json.dumps(event)}\n\n")
    if done:
        out.append("data: [DONE]\n\n")
    return "".join(out).encode()


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **top: Any) -> dict:
    choice: dict[str, Any] = {"index": 0, "delta": delta or {}, "finish_reason": finish}
    return {
        "id": "gen-1",
        "object": "chat.completion.chunk",
        "model": "m",
        "choices": [choice],
        **top,
    }


def stream_of(body: dict[str, Any], pieces: int = 3) -> list[dict[str, Any]]:
    """The chunks a server would stream for a non-streaming `body` (texts cut in pieces)."""
    message = body["choices"][0]["message"]
    chunks: list[dict[str, Any]] = [chunk({"role": "assistant"}, provider=body.get("provider"))]
    for name in ("reasoning", "content"):
        text = message.get(name)
        if isinstance(text, str):
            step = max(1, len(text) // pieces)
            # An empty field still arrives once, as servers send `"content": ""`.
            for i in range(0, max(1, len(text)), step):
                chunks.append(chunk({name: text[i : i + step]}))
    for index, call in enumerate(message.get("tool_calls") or []):
        args = call["function"]["arguments"]
        half = len(args) // 2
        chunks.append(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": index,
                            "id": call["id"],
                            "type": "function",
                            "function": {
                                "name": call["function"]["name"],
                                "arguments": args[:half],
                            },
                        }
                    ]
                }
            )
        )
        chunks.append(
            chunk({"tool_calls": [{"index": index, "function": {"arguments": args[half:]}}]})
        )
    chunks.append(chunk({}, finish=body["choices"][0]["finish_reason"]))
    chunks.append(
        {
            "id": "gen-1",
            "object": "chat.completion.chunk",
            "model": "m",
            "choices": [],
            "usage": body.get("usage"),
        }
    )
    return chunks


Handler = Callable[[httpx.Request, dict[str, Any]], Awaitable[httpx.Response]]


class FakeServer:
    """An async MockTransport handler with instrumentation; `respond(request, body)` decides."""

    def __init__(self, respond: Handler) -> None:
        self.respond = respond
        self.in_flight = 0
        self.timeline: list[tuple[float, int]] = []  # (time, in-flight after the change)
        self.starts: list[float] = []
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[httpx.Headers] = []
        self.transport = httpx.MockTransport(self._handle)

    async def _handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        self.headers.append(request.headers)
        self.starts.append(time.monotonic())
        self._change(+1)
        try:
            return await self.respond(request, body)
        finally:
            self._change(-1)

    def _change(self, delta: int) -> None:
        self.in_flight += delta
        self.timeline.append((time.monotonic(), self.in_flight))

    def mean_in_flight(self, start: float, end: float) -> float:
        """Time-weighted in-flight count over [start, end]."""
        area, level, mark = 0.0, 0, start
        for t, count in self.timeline:
            if t > end:
                break
            if t > mark:
                area += level * (t - mark)
                mark = t
            level = count
        area += level * max(0.0, end - mark)
        return area / (end - start)

    def sample_ids(self) -> list[str]:
        return [b["messages"][0]["content"] for b in self.bodies]


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None):
    return httpx.Response(status, json=body, headers=headers)


def ok_handler(delay: float = 0.0, body: dict[str, Any] | None = None) -> Handler:
    async def respond(request: httpx.Request, _: dict[str, Any]) -> httpx.Response:
        if delay:
            await asyncio.sleep(delay)
        return json_response(body or completion())

    return respond


async def paced(parts: list[tuple[float, bytes]]) -> AsyncIterator[bytes]:
    """An async byte stream: sleep, then send, for each (delay, bytes)."""
    for delay, data in parts:
        if delay:
            await asyncio.sleep(delay)
        yield data


class ThreadedApp:
    """Serve an ASGI app with uvicorn on 127.0.0.1 (a free port) in a daemon thread."""

    def __init__(self, app: Any) -> None:
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.port = 0

    def __enter__(self) -> ThreadedApp:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("test server did not start")
            time.sleep(0.01)
        sock: socket.socket = self.server.servers[0].sockets[0]
        self.port = sock.getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def test_fake_server_counts_in_flight():
    server = FakeServer(ok_handler(delay=0.05))

    async def main() -> None:
        async with httpx.AsyncClient(transport=server.transport) as client:
            await asyncio.gather(
                *(client.post("http://x/v1/chat/completions", json={"i": i}) for i in range(4))
            )

    asyncio.run(main())
    assert max(count for _, count in server.timeline) == 4
    start, end = server.timeline[0][0], server.timeline[-1][0]
    assert server.mean_in_flight(start, end) > 3.5
