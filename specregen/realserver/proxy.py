"""A loopback front for the real server that scripts each request as it comes.

Tests and benchmarks that drive specregen's own client, probe or pipeline against the real
vLLM cannot script the answers ahead: the requests are the client's (a conversation's next
request holds the model's last answer). The proxy does it per request: it asks the server for
the request's prompt ids (one token, `return_token_ids`), asks the emulator's model what it
writes for the request (the family's served side: the same ids the emulator would serve), puts
that in the server's script table, then passes the request on and returns the server's answer
as it comes, streamed or not. What the client reads is the real server's answer; only the
choice of what the model says is the emulator's.

`scripted` keeps, per request served, the prompt ids and the ids the model was scripted to
write, for tests to compare with what reconstruction rebuilt.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from specregen.emulator.app import EmulatorState
from specregen.emulator.config import EmulatorConfig
from specregen.emulator.generate import request_keys
from specregen.emulator.served import served_reply
from specregen.emulator.server import bind_socket, uvicorn_config
from specregen.models.tokenizer import Tokenizer
from specregen.realserver.server import VllmServer


@dataclass
class RunningProxy:
    url: str  # the `/v1` base URL
    _server: uvicorn.Server
    _thread: threading.Thread

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(10)


@dataclass(frozen=True)
class Scripted:
    prompt_ids: tuple[int, ...]
    ids: tuple[int, ...]  # what the model was scripted to write (its stop id at the end)


def model_ids(state: EmulatorState, request: dict[str, Any]) -> list[int]:
    """The ids the emulator's model writes for `request` (whole, before any `max_tokens`)."""
    body = {k: v for k, v in request.items() if k != "max_tokens"}
    keys = request_keys(body)
    if state.writes_ids:
        return list(state.generation(body, keys).ids)
    _, completion, _ = served_reply(state.server, state.config, body, keys.generation, None,
                                    state.script(body))
    return list(completion.ids)


@dataclass
class ScriptingProxy:
    server: VllmServer
    state: EmulatorState
    scripted: list[Scripted] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def for_server(cls, server: VllmServer, tok: Tokenizer, **knobs: Any) -> ScriptingProxy:
        """`knobs`: the emulator model's settings (`EmulatorConfig` fields: seed, shape
        rates, conversations, ...)."""
        config = EmulatorConfig(profile=server.spec.emulator_profile,
                                format=server.spec.format_name,
                                model=server.spec.served_model_name, **knobs)
        return cls(server, EmulatorState(config, tok))

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        prompt = await asyncio.to_thread(self.server.prompt_ids, body)
        ids = await asyncio.to_thread(model_ids, self.state, body)
        with self._lock:
            self.server.script([(prompt, ids)])
            self.scripted.append(Scripted(tuple(prompt), tuple(ids)))
        url = self.server.base_url + "/v1/chat/completions"
        client = httpx.AsyncClient(timeout=600)
        upstream = await client.send(client.build_request("POST", url, json=body), stream=True)
        if not body.get("stream"):
            data = await upstream.aread()
            await upstream.aclose()
            await client.aclose()
            return Response(data, status_code=upstream.status_code,
                            media_type=upstream.headers.get("content-type"))

        async def relay() -> Any:
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            finally:
                await upstream.aclose()
                await client.aclose()

        return StreamingResponse(relay(), status_code=upstream.status_code,
                                 media_type=upstream.headers.get("content-type"))

    async def _models(self, request: Request) -> Response:
        async with httpx.AsyncClient(timeout=60) as client:
            upstream = await client.get(self.server.base_url + "/v1/models")
        return JSONResponse(upstream.json(), status_code=upstream.status_code)

    def serve(self, host: str = "127.0.0.1", port: int = 0) -> RunningProxy:
        """Serve in a daemon thread until `stop()`."""
        app = Starlette(routes=[
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
        ])
        sock = bind_socket(host, port)
        uv = uvicorn.Server(uvicorn_config(app))  # type: ignore[arg-type]
        thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]},
                                  name="specregen-scripting-proxy", daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while not uv.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                uv.should_exit = True
                raise RuntimeError("the scripting proxy did not start")
            time.sleep(0.01)
        bound_host, bound_port = sock.getsockname()[:2]
        return RunningProxy(f"http://{bound_host}:{bound_port}/v1", uv, thread)

    def truth(self, prompt_ids: list[int]) -> Scripted | None:
        """What the model was scripted to write after `prompt_ids` (the last such request)."""
        for item in reversed(self.scripted):
            if list(item.prompt_ids) == list(prompt_ids):
                return item
        return None

