"""How each provider returns a Kimi K2.5 completion: the message fields, the body, the stream.

* `vllm`, `vllm-k25`, `sglang`, `sglang-noforce`: the completion's decoded text goes through our
  re-statement of the upstream parsers (emulator/upstream.py; docs/upstream-parsers.md), plain
  and streamed each on its own path, and the prompt is the server's own rendering
  (emulator/serverside.py). `vllm` is vLLM with `--reasoning-parser kimi_k2
  --tool-call-parser kimi_k2` as of the K2.5 release; `vllm-k25` the same with the `kimi_k25`
  reasoning parser; `sglang` a current SGLang (reasoning forced unless the request turned
  thinking off); `sglang-noforce` an SGLang whose Kimi detector is not forced.
* `openrouter`: `reasoning` + `reasoning_details`; structured calls only when `tools` was sent,
  id and arguments trimmed; an empty content is "". Also `provider`, `native_finish_reason`,
  `usage.cost`, the `X-Generation-Id` header and `: OPENROUTER PROCESSING` comments.
* `moonshot`: `reasoning_content`; structured when `tools` was sent, verbatim; empty content "".
* `raw`: `reasoning_content`; calls never parsed: the marker text stays in `content`.
* `stripped`: `reasoning`; the marker strings are deleted from the text (unrecoverable on
  purpose) and `finish_reason` is `tool_calls`.

Without `tools` in the request no stack parses calls, so the raw section stays in `content`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from json.encoder import encode_basestring
from typing import Any

from specregen.emulator import upstream
from specregen.emulator.config import Profile
from specregen.emulator.generate import CompletionView, Generation
from specregen.emulator.upstream import MarkerIds, Server
from specregen.models.kimi_k25 import TOOL_MARKERS
from specregen.models.tokenizer import Tokenizer
from specregen.normalize import reasoning_excluded


@dataclass(frozen=True, slots=True)
class ProfileSpec:
    name: Profile
    reasoning_field: str
    parse_tools: bool  # structured `tool_calls` when the request sent `tools`
    trim_tool_calls: bool  # the parser's `\s*` around ids and arguments
    empty_content: str | None  # what an empty content is returned as
    strip_markers: bool
    openrouter: bool  # OpenRouter's extra fields, header and keep-alive comments
    server: Server | None  # the upstream parser code this profile runs (emulator/upstream.py)


def _spec(name: Profile, reasoning_field: str, **kwargs: Any) -> ProfileSpec:
    defaults: dict[str, Any] = dict(parse_tools=True, trim_tool_calls=True, empty_content=None,
                                    strip_markers=False, openrouter=False, server=None)
    return ProfileSpec(name, reasoning_field, **{**defaults, **kwargs})


PROFILE_SPECS: dict[Profile, ProfileSpec] = {
    "openrouter": _spec("openrouter", "reasoning", empty_content="", openrouter=True),
    "vllm": _spec("vllm", "reasoning", server="vllm"),
    "vllm-k25": _spec("vllm-k25", "reasoning", server="vllm-k25"),
    "sglang": _spec("sglang", "reasoning_content", server="sglang"),
    "sglang-noforce": _spec("sglang-noforce", "reasoning_content", server="sglang-noforce"),
    "moonshot": _spec("moonshot", "reasoning_content", trim_tool_calls=False, empty_content=""),
    "raw": _spec("raw", "reasoning_content", parse_tools=False, trim_tool_calls=False),
    "stripped": _spec("stripped", "reasoning", parse_tools=False, trim_tool_calls=False,
                      strip_markers=True),
    # vLLM with a format's own parsers (emulator/served.py; Qwen3: qwen3 + hermes).
    "vllm-hermes": _spec("vllm-hermes", "reasoning"),
}


@dataclass(frozen=True, slots=True)
class OutCall:
    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Message:
    """The assistant message a provider returns, before it becomes JSON."""

    reasoning: str | None
    content: str | None
    tool_calls: tuple[OutCall, ...]
    finish_reason: str


@dataclass(frozen=True, slots=True)
class ResponseMeta:
    id: str
    created: int
    model: str
    provider: str
    price_prompt: float
    price_completion: float


def render_message(
    spec: ProfileSpec, view: CompletionView, gen: Generation, request: dict[str, Any],
    *, tok: Tokenizer | None = None, stream: bool = False,
) -> Message:
    """What the provider's parsers make of the completion (`stream`: of its streamed deltas;
    only the upstream profiles treat the two differently, and they need the tokenizer)."""
    if spec.server is not None:
        if tok is None:
            raise ValueError(f"profile {spec.name} decodes the completion: pass the tokenizer")
        return _server_message(spec.server, view, request, tok, stream)
    reasoning = view.reasoning
    if spec.openrouter and reasoning_excluded(request):
        reasoning = None
    # Without `</think>` the reasoning parser puts all text into reasoning (SPEC 3.1).
    content: str | None = None if view.thinking and not view.think_closed else view.content
    calls: tuple[OutCall, ...] = ()
    if view.made_calls and content is not None:
        if spec.parse_tools and request.get("tools"):
            calls = tuple(_out_call(spec, call) for call in view.calls)
        elif spec.strip_markers:
            content += strip_markers(view.section_text)
        else:
            content += view.section_text
    if content == "":
        content = spec.empty_content
    if view.truncated:
        finish = "length"
    elif calls or (spec.strip_markers and view.made_calls):
        finish = "tool_calls"
    else:
        finish = "stop"
    return Message(reasoning, content, calls, finish)


def _server_message(server: Server, view: CompletionView, request: dict[str, Any],
                    tok: Tokenizer, stream: bool) -> Message:
    out = upstream.decode_output(view.ids, tok, view.truncated)
    parsed = upstream.parse(server, out, request, MarkerIds.of(tok), stream=stream)
    content = parsed.content
    if stream and content is None:
        # Both servers open a stream with `content: ""` in the role chunk.
        content = ""
    calls = tuple(OutCall(c.id, c.name, c.arguments) for c in parsed.calls)
    return Message(parsed.reasoning, content, calls, parsed.finish_reason)


def strip_markers(text: str) -> str:
    for marker in TOOL_MARKERS:
        text = text.replace(marker, "")
    return text


def _out_call(spec: ProfileSpec, call: Any) -> OutCall:
    call_id, arguments = call.id, call.arguments
    if spec.trim_tool_calls:
        call_id, arguments = call_id.strip(), arguments.strip()
    return OutCall(call_id, call.name, arguments)


def usage(view: CompletionView, gen: Generation, meta: ResponseMeta, spec: ProfileSpec) -> dict:
    prompt = len(gen.prompt_ids)
    completion = len(view.ids)
    prompt_cost = prompt * meta.price_prompt
    completion_cost = completion * meta.price_completion
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": view.reasoning_tokens},
        "cost": round(prompt_cost + completion_cost, 12),
    }
    if spec.openrouter:
        out["is_byok"] = False
        out["prompt_tokens_details"]["cache_write_tokens"] = 0
        out["cost_details"] = {
            "upstream_inference_cost": None,
            "upstream_inference_prompt_cost": round(prompt_cost, 12),
            "upstream_inference_completions_cost": round(completion_cost, 12),
        }
    return out


def _details(text: str) -> list[dict[str, Any]]:
    return [{"type": "reasoning.text", "text": text, "format": "unknown", "index": 0}]


def _call_json(call: OutCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


def _head(spec: ProfileSpec, meta: ResponseMeta, kind: str) -> dict[str, Any]:
    head: dict[str, Any] = {"id": meta.id, "object": kind, "created": meta.created,
                            "model": meta.model}
    if spec.openrouter:
        head["provider"] = meta.provider
    return head


def wants_token_ids(request: dict[str, Any]) -> bool:
    return request.get("return_token_ids") is True


def response_body(
    spec: ProfileSpec,
    msg: Message,
    view: CompletionView,
    gen: Generation,
    request: dict[str, Any],
    meta: ResponseMeta,
) -> dict[str, Any]:
    """The non-streaming `chat.completion` body."""
    message: dict[str, Any] = {"role": "assistant", "content": msg.content,
                               spec.reasoning_field: msg.reasoning}
    if spec.openrouter:
        message["refusal"] = None
        message["reasoning_details"] = _details(msg.reasoning) if msg.reasoning else []
    if msg.tool_calls:
        message["tool_calls"] = [_call_json(c) for c in msg.tool_calls]
    choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None,
                              "finish_reason": msg.finish_reason}
    if spec.openrouter:
        choice["native_finish_reason"] = msg.finish_reason
    body = _head(spec, meta, "chat.completion")
    body["choices"] = [choice]
    body["usage"] = usage(view, gen, meta, spec)
    if wants_token_ids(request):
        # vLLM's extension: the ids the model saw and wrote, the ground truth of the tests.
        body["prompt_token_ids"] = list(gen.prompt_ids)
        choice["token_ids"] = list(view.ids)
    return body


def stream_frames(
    spec: ProfileSpec,
    msg: Message,
    view: CompletionView,
    gen: Generation,
    request: dict[str, Any],
    meta: ResponseMeta,
    rng: random.Random,
) -> list[bytes]:
    """The SSE `data:` frames of the `chat.completion.chunk` events, in order.

    Assembled, they give exactly `response_body`'s message. They end with the finish chunk and
    a usage chunk with `choices: []` (OpenRouter style); the caller adds keep-alive comments and
    `data: [DONE]`.
    """
    head = _head(spec, meta, "chat.completion.chunk")

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None,
                                  "finish_reason": finish}
        if spec.openrouter:
            choice["native_finish_reason"] = finish
        return {**head, "choices": [choice]}

    # Text deltas are most of a stream: they are spliced into a serialised template instead of
    # going through json.dumps whole (the same bytes, a fifth of the CPU).
    before = b"data: " + compact_json({**head, "choices": [{"index": 0, "delta": None}]})
    before = before[: before.rindex(b"null")]
    after = b',"logprobs":null,"finish_reason":null'
    if spec.openrouter:
        after += b',"native_finish_reason":null'
    after += b"}]}\n\n"
    field = b'{"' + spec.reasoning_field.encode() + b'":'

    first_delta: dict[str, Any] = {"role": "assistant"}
    if msg.content is not None:
        first_delta["content"] = ""
    first = chunk(first_delta)
    if wants_token_ids(request):
        first["prompt_token_ids"] = list(gen.prompt_ids)
    frames = [sse(first)]
    for piece in text_pieces(msg.reasoning, rng):
        text = _json_str(piece)
        if spec.openrouter:
            delta = (field + text + b',"reasoning_details":[{"type":"reasoning.text","text":'
                     + text + b',"format":"unknown","index":0}]}')
        else:
            delta = field + text + b"}"
        frames.append(before + delta + after)
    for piece in text_pieces(msg.content, rng):
        frames.append(before + b'{"content":' + _json_str(piece) + b"}" + after)
    for i, call in enumerate(msg.tool_calls):
        frames.append(sse(chunk({"tool_calls": [{
            "index": i, "id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }]})))
        for piece in text_pieces(call.arguments, rng):
            frames.append(sse(chunk({"tool_calls": [{"index": i,
                                                     "function": {"arguments": piece}}]})))
    last = chunk({}, msg.finish_reason)
    if wants_token_ids(request):
        last["choices"][0]["token_ids"] = list(view.ids)
    frames.append(sse(last))
    frames.append(sse({**head, "choices": [], "usage": usage(view, gen, meta, spec)}))
    return frames


def _json_str(text: str) -> bytes:
    # What json.dumps(text, ensure_ascii=False) returns, without building an encoder per call.
    return encode_basestring(text).encode()


def error_event(spec: ProfileSpec, meta: ResponseMeta, code: int, message: str) -> dict:
    """An error mid-stream, the way OpenRouter sends it once the response has started."""
    choice: dict[str, Any] = {"index": 0, "delta": {"content": ""}, "finish_reason": "error"}
    if spec.openrouter:
        choice["native_finish_reason"] = "error"
    return {**_head(spec, meta, "chat.completion.chunk"),
            "error": {"code": code, "message": message}, "choices": [choice]}


def text_pieces(text: str | None, rng: random.Random) -> Iterator[str]:
    """`text` cut at arbitrary code-point positions (a str index never splits a surrogate pair)."""
    if not text:
        return
    i = 0
    draw = rng.random
    while i < len(text):
        n = 1 + int(draw() * 12)  # 1-12 characters; randint costs more than the rest
        yield text[i : i + n]
        i += n


def sse(event: dict[str, Any]) -> bytes:
    return b"data: " + compact_json(event) + b"\n\n"


def compact_json(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


SSE_DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": OPENROUTER PROCESSING\n\n"
