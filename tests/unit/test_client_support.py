"""Helpers for the client tests (fake servers, bodies, configs), plus checks of the helpers.

Three kinds of fake server: `FakeServer` behind `httpx.MockTransport` (no sockets, instrumented:
in-flight count over time, request times and bodies); `GatedServer`, a FakeServer that holds
every request until the test answers it, for checks of the window by order and state rather
than by time (a loaded machine changes how long things take, never what happens in which
order); and `ThreadedApp`, a starlette app under uvicorn in a thread on 127.0.0.1 port 0, for
behaviour that needs a real socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import pytest
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

    def sample_ids(self) -> list[str]:
        return [b["messages"][0]["content"] for b in self.bodies]


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None):
    return httpx.Response(status, json=body, headers=headers)


# A wait of a gated test guards against a hang only: never a speed criterion. Long enough for
# any machine, however loaded; a test reaching it has found a defect (or a hang).
HANG_S = 60.0
# Gated tests hold requests as long as they need: the engine's own timeouts must not fire.
GATED_TIMEOUTS = {"connect": 600, "idle": 600, "read": 600}

T = TypeVar("T")


@dataclass(eq=False)
class Held:
    """A request the gated server holds: its body, and the answer the test gives it."""

    body: dict[str, Any]
    answer: asyncio.Future[httpx.Response]


class GatedServer(FakeServer):
    """A FakeServer that holds every request until the test answers it (`release`), or until
    `open()`: the test decides when each answer comes, so it checks what happens and in which
    order (which request arrives next, how many are held) and never how fast.

    `answer(body)` is the default response (a completion). `until(condition, what)` waits for
    a state of the server; its timeout (HANG_S) only turns a hang into a failure. `peak` is the
    most requests ever held at once.
    """

    def __init__(self, answer: Callable[[dict[str, Any]], httpx.Response] | None = None) -> None:
        super().__init__(self._hold)
        self.answer = answer or (lambda body: json_response(completion()))
        self.held: list[Held] = []  # in arrival order
        self.peak = 0
        self.gated = True
        self._changed: asyncio.Event | None = None

    async def _hold(self, request: httpx.Request, body: dict[str, Any]) -> httpx.Response:
        self.peak = max(self.peak, self.in_flight)
        if not self.gated:
            return self.answer(body)
        held = Held(body, asyncio.get_running_loop().create_future())
        self.held.append(held)
        self._notify()
        try:
            return await held.answer
        finally:
            if held in self.held:  # cancelled by the client
                self.held.remove(held)

    def _change(self, delta: int) -> None:
        super()._change(delta)
        self._notify()

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def release(self, which: Held | int = 0, response: httpx.Response | None = None) -> Held:
        """Answer one held request (by index in arrival order, or itself); returns it."""
        held = self.held[which] if isinstance(which, int) else which
        self.held.remove(held)
        held.answer.set_result(response if response is not None else self.answer(held.body))
        return held

    def open(self) -> None:
        """Answer every held request and, from now on, every request at once."""
        self.gated = False
        while self.held:
            self.release()

    def state(self) -> str:
        return f"{len(self.bodies)} requests received, {self.in_flight} in flight"

    async def until(self, condition: Callable[[], bool], what: str) -> None:
        """Wait until `condition()` holds (checked at every arrival and answer)."""

        async def wait() -> None:
            while not condition():
                if self._changed is None:
                    self._changed = asyncio.Event()
                await self._changed.wait()

        try:
            await asyncio.wait_for(wait(), HANG_S)
        except TimeoutError:
            raise AssertionError(
                f"{what}: not reached in {HANG_S:.0f} s ({self.state()})") from None

    async def arrival(self, after: int, what: str) -> dict[str, Any]:
        """The body of request number `after` (from 0), once it has arrived."""
        await self.until(lambda: len(self.bodies) > after, what)
        return self.bodies[after]


async def gated_run(server: GatedServer, run: Awaitable[T],
                    steps: Callable[[], Awaitable[None]]) -> T:
    """Run `run` (the engine against `server`) and the test's `steps` side by side; after the
    steps the server opens and the run must end. A failed step stops the run and is raised."""
    engine = asyncio.ensure_future(run)
    test = asyncio.ensure_future(steps())
    try:
        await asyncio.wait({engine, test}, return_when=asyncio.FIRST_COMPLETED)
        if not test.done():
            engine.result()  # the engine's own error, if any
            raise AssertionError(f"the run ended before the test's steps ({server.state()})")
        test.result()
        server.open()
        return await asyncio.wait_for(asyncio.shield(engine), HANG_S)
    finally:
        for task in (test, engine):
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task


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
    counts = [count for _, count in server.timeline]
    assert counts[-1] == 0 and sorted(b["i"] for b in server.bodies) == [0, 1, 2, 3]
    assert max(counts) <= 4 and len(counts) == 8  # one change per arrival, one per answer


def test_gated_server_holds_every_request_until_the_test_answers_it(monkeypatch):
    server = GatedServer()
    answers: list[tuple[int, int]] = []

    async def client() -> None:
        async with httpx.AsyncClient(transport=server.transport) as http:
            async def post(i: int) -> None:
                response = await http.post("http://x/v1/chat/completions", json={"i": i})
                answers.append((i, response.status_code))

            await asyncio.gather(*(post(i) for i in range(4)))
            await post(4)  # after the steps the server is open: answered at once

    async def steps() -> None:
        await server.until(lambda: server.in_flight == 4, "4 held")
        assert answers == [] and [h.body["i"] for h in server.held] == [0, 1, 2, 3]
        server.release(2, json_response({"error": {"code": 429}}, 429))
        await server.until(lambda: server.in_flight == 3, "one answered")
        assert answers == [(2, 429)] and [h.body["i"] for h in server.held] == [0, 1, 3]
        monkeypatch.setattr(sys.modules[__name__], "HANG_S", 0.01)
        with pytest.raises(AssertionError, match=r"never: not reached .*4 requests received"):
            await server.until(lambda: False, "never")
        monkeypatch.undo()

    asyncio.run(gated_run(server, client(), steps))
    assert sorted(answers) == [(0, 200), (1, 200), (2, 429), (3, 200), (4, 200)]
    assert server.peak == 4 and server.held == []
