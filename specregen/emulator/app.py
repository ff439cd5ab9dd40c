"""The emulator's HTTP surface: an OpenAI/OpenRouter-compatible Starlette app.

Routes (each chat/model route also under `/api/v1/...`, OpenRouter's base URL):

* `POST /v1/chat/completions` -- plain JSON or SSE (`stream: true`);
* `GET /v1/models`, `GET /api/v1/models/{author}/{slug}/endpoints`;
* `GET /_emulator/stats`, `POST /_emulator/reset`: the test's controls, answered for loopback
  clients, or for anyone sending `X-Emulator-Token: $SPECREGEN_EMULATOR_ADMIN_TOKEN` when that
  variable is set (`specregen emulator --host 0.0.0.0` binds beyond loopback).

The chat route is a raw ASGI endpoint: it needs byte-level control of the response for its faults
and it is the hot path of the load benchmarks. Request headers and keys are never logged.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import os
import random
import time
from collections import Counter, OrderedDict
from typing import TYPE_CHECKING, Any

from jinja2 import TemplateError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from specregen.emulator.config import EmulatorConfig
from specregen.emulator.conversations import ConversationBook, Script
from specregen.emulator.faults import (
    EARLY_FAULTS,
    FAULT_MESSAGES,
    TRANSPORT_KEY,
    AttemptPlan,
    close_connection,
    error_json,
    plan_attempt,
    reset_connection,
    transport_of,
)
from specregen.emulator.generate import (
    WRITER,
    BpeSplitter,
    RequestError,
    RequestKeys,
    request_keys,
    request_seed,
)
from specregen.emulator.profiles import (
    KEEPALIVE,
    PROFILE_SPECS,
    SSE_DONE,
    ResponseMeta,
    compact_json,
    error_event,
    response_body,
    sse,
    stream_frames,
)
from specregen.emulator.served import served_reply
from specregen.models.chat_format import FormatError
from specregen.models.family import (
    CompletionLike,
    Generated,
    GenerationLike,
    IdServedSide,
    ServedSide,
)
from specregen.models.registry import (
    DEFAULT_FORMAT,
    UnknownFormatError,
    emulator_profiles,
    get_format,
    get_server,
    resolve_format_name,
)
from specregen.models.tokenizer import Tokenizer

if TYPE_CHECKING:
    from specregen.emulator.batch import BatchState

JSON_HEADERS = [(b"content-type", b"application/json")]
SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


class EmulatorState:
    """Counters, the completion cache and the model, shared by the routes of one app."""

    batches: BatchState  # the batch API's state, set where its routes are added (make_app)

    def __init__(self, config: EmulatorConfig, tokenizer: Tokenizer) -> None:
        self.config = config
        try:
            self.format_name = resolve_format_name(config.format, config.model)
        except UnknownFormatError:
            if config.format is not None:
                raise
            self.format_name = DEFAULT_FORMAT
        self.fmt: Any = get_format(self.format_name, tokenizer)
        # The format's served side (models/<format>/served.py): one that writes the ids itself
        # (`IdServedSide`: K2.5, with its shape knobs) is asked for a generation per request and
        # renders each profile's message; the others get the text from emulator/served.py.
        server = get_server(self.format_name, tokenizer)
        if server is None:
            raise ValueError(f"the {self.format_name} format has no served side to emulate")
        self.server: ServedSide = server
        self.id_server: IdServedSide | None = (server if isinstance(server, IdServedSide)
                                               else None)
        self.writes_ids = self.id_server is not None
        # The profiles the family's descriptor says it is served with.
        profiles = emulator_profiles(self.format_name)
        if config.profile not in profiles:
            raise ValueError(f"the {self.format_name} model is served with the profiles "
                             f"{', '.join(profiles)}, not {config.profile!r}")
        self.model_name = (self.id_server.model_name if self.id_server is not None
                           else config.model)
        self.spec = PROFILE_SPECS[config.profile]
        self.splitter = (
            BpeSplitter.for_tokenizer(tokenizer) if config.noncanonical_rate > 0 else None
        )
        # Conversation mode: the dataset's conversations, loaded once (emulator/conversations.py).
        self.conversations = (ConversationBook.load(config.conversations)
                              if config.conversations is not None else None)
        # Fixed per instance, so the same request gets the same body within a run.
        self.created = int(time.time())
        self._cache: OrderedDict[bytes, Generated] = OrderedDict()
        self.reset()

    def reset(self) -> None:
        self.chat_requests = 0
        self.completed = 0
        self.attempts = 0  # the fault rng's counter: a reset replays the same fault sequence
        self.faults: Counter[str] = Counter()
        # 64-bit prefixes of the digests: a tenth of the memory, collisions out of reach.
        self.distinct: set[int] = set()

    def snapshot(self) -> dict[str, Any]:
        return {
            "chat_requests": self.chat_requests,
            "distinct_requests": len(self.distinct),
            "completed": self.completed,
            "faults": dict(self.faults),
        }

    def script(self, request: dict[str, Any]) -> Script | None:
        """What the model says when `request` continues a known conversation, else None."""
        if self.conversations is None:
            return None
        return self.conversations.script(request, self.config.seed, self.config.divergence_rate)

    def generation(self, request: dict[str, Any], keys: RequestKeys) -> Any:
        """The served side's generation for `request` (formats that write ids), cached: a
        `Generated`, the served side's own type (K2.5's `Generation`: the fidelity bench hands
        it back to the family's functions)."""
        cached = self._cache.get(keys.generation)
        if cached is not None:
            self._cache.move_to_end(keys.generation)
            return cached
        server = self.id_server
        if server is None:
            raise TypeError(f"the {self.format_name} served side does not write its ids")
        server_prompt = None
        if self.spec.server is not None:
            # The ids the model saw are the server's rendering of the request, not ours.
            server_prompt = server.server_prompt(self.spec.server, request)
        gen = server.generate(request, self.config,
                                   request_seed(self.config.seed, keys.generation), WRITER,
                                   self.splitter, server_prompt, self.script(request))
        self._cache[keys.generation] = gen
        if len(self._cache) > self.config.max_cached:
            self._cache.popitem(last=False)
        return gen


ADMIN_TOKEN_ENV = "SPECREGEN_EMULATOR_ADMIN_TOKEN"


def admin_refused() -> JSONResponse:
    return JSONResponse(
        {"error": {"code": 403, "message": "admin routes answer loopback clients, or a client"
                   f" sending X-Emulator-Token (the value of {ADMIN_TOKEN_ENV} on the server)"}},
        status_code=403,
    )


def admin_allowed(request: Request, token: str | None) -> bool:
    """A loopback client, or the admin token when one is set (compared in constant time)."""
    given = request.headers.get("x-emulator-token")
    if token is not None and given is not None:
        return hmac.compare_digest(given.encode(), token.encode())
    host = request.client.host if request.client else ""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def create_app(config: EmulatorConfig, tokenizer: Tokenizer) -> EmulatorApp:
    """The Starlette app; its `state.emulator` is the `EmulatorState` (stats, reset)."""
    state = EmulatorState(config, tokenizer)
    chat = ChatEndpoint(state)

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list",
                             "data": [model_card(config, state.created, state.model_name)]})

    async def endpoints(request: Request) -> JSONResponse:
        author, slug = request.path_params["author"], request.path_params["slug"]
        if f"{author}/{slug}".lower() != config.model.lower():
            return JSONResponse(
                {"error": {"code": 404, "message": f"No endpoints found for {author}/{slug}."}},
                status_code=404,
            )
        return JSONResponse({"data": endpoints_listing(config, state.created,
                                                       state.model_name)})

    admin_token = os.environ.get(ADMIN_TOKEN_ENV) or None

    async def stats(request: Request) -> JSONResponse:
        if not admin_allowed(request, admin_token):
            return admin_refused()
        return JSONResponse(state.snapshot())

    async def reset(request: Request) -> JSONResponse:
        if not admin_allowed(request, admin_token):
            return admin_refused()
        state.reset()
        return JSONResponse({"ok": True})

    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/api/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/models", models),
        Route("/api/v1/models", models),
        Route("/v1/models/{author}/{slug}/endpoints", endpoints),
        Route("/api/v1/models/{author}/{slug}/endpoints", endpoints),
        Route("/_emulator/stats", stats),
        Route("/_emulator/reset", reset, methods=["POST"]),
    ]
    from specregen.emulator.batch import BatchState, batch_routes

    state.batches = BatchState()
    routes += batch_routes(state)
    app = EmulatorApp(routes=routes)
    app.state.emulator = state
    return app


class EmulatorApp(Starlette):
    """Starlette, plus the connection's transport in the scope for the connection faults."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            scope[TRANSPORT_KEY] = transport_of(send)
        await super().__call__(scope, receive, send)


class ChatEndpoint:
    """`POST .../chat/completions` as a raw ASGI app."""

    def __init__(self, state: EmulatorState) -> None:
        self.state = state

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        state = self.state
        config = state.config
        state.chat_requests += 1
        attempt = state.attempts
        state.attempts += 1

        denied = self._deny(scope)
        if denied is not None:
            await _send_bytes(send, denied[0], denied[1])
            return
        raw = await _read_body(receive)
        try:
            request = parse_request(raw)
        except RequestError as exc:
            await _send_bytes(send, 400, error_json(400, str(exc)))
            return
        keys = request_keys(request)
        state.distinct.add(int.from_bytes(keys.distinct[:8], "big"))
        stream = request.get("stream") is True
        plan = plan_attempt(config, attempt, stream)

        if plan.fault in EARLY_FAULTS:
            await self._early_fault(scope, receive, send, plan)
            return

        completion: CompletionLike
        gen: GenerationLike
        try:
            if state.id_server is not None:
                generated: Generated = state.generation(request, keys)
                gen = generated
                completion = state.id_server.view(generated, _max_tokens(request))
                message = state.id_server.message(state.spec, completion, generated, request,
                                                  stream=stream)
            else:
                message, completion, gen = served_reply(state.server, config, request,
                                                        keys.generation, _max_tokens(request),
                                                        state.script(request))
        except (RequestError, FormatError) as exc:
            await _send_bytes(send, 400, error_json(400, str(exc)))
            return
        except (TypeError, AttributeError, KeyError, TemplateError, ValueError) as exc:
            # An odd message (the served formats raise ValueError subclasses naming it).
            await _send_bytes(send, 400, error_json(400, f"cannot render the request: {exc}"))
            return
        meta = ResponseMeta(
            id=("gen-" if state.spec.openrouter else "chatcmpl-") + keys.distinct.hex()[:24],
            created=state.created,
            model=request.get("model") or config.model,
            provider=config.provider_name,
            price_prompt=config.price_prompt,
            price_completion=config.price_completion,
        )
        if plan.stall == "start":
            state.faults["stall"] += 1
            await asyncio.sleep(config.stall_seconds)
        if stream:
            chunk_rng = _chunk_rng(config.seed, keys.generation)
            frames = stream_frames(state.spec, message, completion, gen, request, meta, chunk_rng)
            await self._stream(scope, receive, send, plan, meta, frames)
        else:
            body = compact_json(
                response_body(state.spec, message, completion, gen, request, meta)
            )
            await self._plain(scope, receive, send, plan, meta, body)

    async def _early_fault(self, scope: Any, receive: Any, send: Any, plan: AttemptPlan) -> None:
        """429, 5xx or a reset: the attempt ends before the model is asked anything."""
        config = self.state.config
        self.state.faults[plan.fault or ""] += 1
        retry_after = [(b"retry-after", str(config.retry_after_seconds).encode())]
        if plan.fault == "429":
            body = error_json(429, "Rate limit exceeded: too many requests, retry shortly",
                              {"retry_after_seconds": config.retry_after_seconds})
            await _send_bytes(send, 429, body, retry_after)
        elif plan.fault == "5xx":
            body = error_json(plan.status, FAULT_MESSAGES[plan.status],
                              {"provider_name": config.provider_name})
            await _send_bytes(send, plan.status, body, retry_after if plan.status == 503 else [])
        else:
            await reset_connection(scope.get(TRANSPORT_KEY), receive)

    def _deny(self, scope: Any) -> tuple[int, bytes] | None:
        config = self.state.config
        if config.require_key is not None:
            auth = next((v for k, v in scope["headers"] if k == b"authorization"), None)
            if auth is None:
                return 401, error_json(401, "No auth credentials found")
            expected = b"Bearer " + config.require_key.encode()
            if not hmac.compare_digest(auth.strip(), expected):
                return 401, error_json(401, "Invalid API key")  # never echo what was sent
        if config.credits_exhausted:
            return 402, error_json(
                402, "Insufficient credits. Add more using https://openrouter.ai/settings/credits"
            )
        return None

    def _headers(self, meta: ResponseMeta, base: list[tuple[bytes, bytes]]) -> list:
        if self.state.spec.openrouter:
            return [*base, (b"x-generation-id", meta.id.encode())]
        return base

    async def _plain(
        self, scope: Any, receive: Any, send: Any, plan: AttemptPlan, meta: ResponseMeta,
        body: bytes,
    ) -> None:
        state = self.state
        if plan.latency:
            await asyncio.sleep(plan.latency)
        if plan.fault == "error_200":
            # Once the model has started, OpenRouter reports an error with status 200 (SPEC 4.3).
            state.faults["error_200"] += 1
            error = error_json(502, "Provider returned error",
                               {"provider_name": state.config.provider_name})
            await _send_bytes(send, 200, error, self._headers(meta, []))
            return
        headers = self._headers(meta, [*JSON_HEADERS,
                                       (b"content-length", str(len(body)).encode())])
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        if plan.fault == "truncated":
            state.faults["truncated"] += 1
            cut = max(1, min(len(body) - 1, int(len(body) * plan.cut)))
            await send({"type": "http.response.body", "body": body[:cut], "more_body": True})
            await close_connection(scope.get(TRANSPORT_KEY), receive)
            return
        if plan.stall == "middle":
            state.faults["stall"] += 1
            half = len(body) // 2
            await send({"type": "http.response.body", "body": body[:half], "more_body": True})
            await asyncio.sleep(state.config.stall_seconds)
            body = body[half:]
        await send({"type": "http.response.body", "body": body, "more_body": False})
        state.completed += 1

    async def _stream(
        self, scope: Any, receive: Any, send: Any, plan: AttemptPlan, meta: ResponseMeta,
        frames: list[bytes],
    ) -> None:
        state = self.state
        config = state.config
        await send({"type": "http.response.start", "status": 200,
                    "headers": self._headers(meta, SSE_HEADERS)})
        pending: list[bytes] = [KEEPALIVE] if state.spec.openrouter else []

        async def flush(more: bool = True) -> None:
            await send({"type": "http.response.body", "body": b"".join(pending),
                        "more_body": more})
            pending.clear()

        # With no latency the whole stream goes out in one write; the client still parses it
        # event by event, and the server spends its CPU on requests, not on tiny writes.
        delay = plan.latency / len(frames) if plan.latency else 0.0
        cut_at = max(1, min(len(frames) - 1, int(len(frames) * plan.cut)))
        keepalive = config.keepalive_rate
        for i, frame in enumerate(frames):
            if i == cut_at:
                if plan.fault == "truncated":
                    state.faults["truncated"] += 1
                    await flush()
                    await close_connection(scope.get(TRANSPORT_KEY), receive)
                    return
                if plan.fault == "stream_error":
                    state.faults["stream_error"] += 1
                    pending.append(sse(error_event(state.spec, meta, 502,
                                                   "Provider returned error mid-stream")))
                    pending.append(SSE_DONE)
                    await flush(more=False)
                    return
                if plan.stall == "middle":
                    state.faults["stall"] += 1
                    await flush()
                    await asyncio.sleep(config.stall_seconds)
            if keepalive and plan.rng.random() < keepalive:
                pending.append(KEEPALIVE)
            if delay:
                await flush()
                await asyncio.sleep(delay)
            pending.append(frame)
        pending.append(SSE_DONE)
        await flush(more=False)
        state.completed += 1


def parse_request(raw: bytes) -> dict[str, Any]:
    """The request body as JSON, with the shape checks whose failure is the client's fault."""
    try:
        request = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestError(f"request body is not JSON: {exc}") from None
    if not isinstance(request, dict):
        raise RequestError("request body is not a JSON object")
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(f"messages[{i}] is not an object with a string 'role'")
    tools = request.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise RequestError("'tools' must be a list")
    for name in ("max_tokens", "max_completion_tokens"):
        value = request.get(name)
        if value is not None and (type(value) is not int or value < 1):
            raise RequestError(f"'{name}' must be a positive integer")
    if request.get("n") not in (None, 1):
        raise RequestError("only n=1 is supported")
    if not isinstance(request.get("stream", False), bool):
        raise RequestError("'stream' must be a boolean")
    return request


def _max_tokens(request: dict[str, Any]) -> int | None:
    values = [request.get(k) for k in ("max_tokens", "max_completion_tokens")]
    given = [v for v in values if v is not None]
    return min(given) if given else None


def _chunk_rng(seed: int, key: bytes) -> random.Random:
    # Request-seeded, so the same request streams in the same pieces; apart from the model's
    # own rng, so chunking never changes the text.
    return random.Random(request_seed(seed, key) + 1)


async def _read_body(receive: Any) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return b"".join(chunks)


async def _send_bytes(
    send: Any, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    headers = [*JSON_HEADERS, (b"content-length", str(len(body)).encode()), *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


# ---------------------------------------------------------------------------------------------
# Model listings


def model_card(config: EmulatorConfig, created: int, name: str) -> dict[str, Any]:
    return {
        "id": config.model,
        "object": "model",
        "created": created,
        "owned_by": config.model.split("/")[0],
        "name": name,
        "context_length": config.context_length,
        "pricing": _pricing(config),
        "supported_parameters": SUPPORTED_PARAMETERS,
    }


SUPPORTED_PARAMETERS = [
    "tools", "tool_choice", "reasoning", "include_reasoning", "max_tokens", "temperature",
    "top_p", "stop", "seed", "response_format", "structured_outputs", "frequency_penalty",
    "presence_penalty",
]

# Other upstreams OpenRouter lists for the model (SPEC 3.4, 4.5): names and quantizations.
_OTHER_ENDPOINTS = (("Together", "fp4", "together"), ("Fireworks", "fp8", "fireworks"),
                    ("DeepInfra", "fp4", "deepinfra/fp4"))


def _pricing(config: EmulatorConfig) -> dict[str, str]:
    return {"prompt": f"{config.price_prompt:.10f}".rstrip("0").rstrip("."),
            "completion": f"{config.price_completion:.10f}".rstrip("0").rstrip("."),
            "request": "0", "image": "0", "input_cache_read": "0"}


def endpoints_listing(config: EmulatorConfig, created: int, name: str) -> dict[str, Any]:
    """OpenRouter's `GET /api/v1/models/{author}/{slug}/endpoints` payload."""
    served = [(config.provider_name, config.quantization,
               config.provider_name.lower().replace(" ", ""))]
    served += [e for e in _OTHER_ENDPOINTS if e[0] != config.provider_name]
    endpoints = []
    for i, (provider, quantization, tag) in enumerate(served):
        endpoints.append({
            "name": f"{provider} | {config.model}",
            "model_name": name,
            "context_length": config.context_length,
            "pricing": _pricing(config),
            "provider_name": provider,
            "tag": tag,
            "quantization": quantization,
            "max_completion_tokens": config.context_length,
            "max_prompt_tokens": None,
            "supported_parameters": SUPPORTED_PARAMETERS,
            "status": 0,
            "uptime_last_30m": 99.9 - i,
            "supports_implicit_caching": i == 0,
        })
    return {
        "id": config.model,
        "name": name,
        "created": created,
        "description": f"{name.split(': ')[-1]}, emulated by specregen.",
        "architecture": {"tokenizer": "Other", "instruct_type": None,
                         "modality": "text+image->text", "input_modalities": ["text", "image"],
                         "output_modalities": ["text"]},
        "endpoints": endpoints,
    }
