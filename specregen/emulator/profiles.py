"""How each provider returns a completion: the message fields, the body, the stream.

The K2.5 profiles (the format's served side, `models/<format>/served.py`, turns a completion
into a `Message` the way each profile's stack does):

* `vllm`, `vllm-legacy`, `vllm-k25`, `sglang`, `sglang-noforce`: the completion's decoded
  text goes through our re-statement of the upstream parsers (the format's `vllm032.py` and
  `servers.py`; docs/vllm-0.32.md, docs/upstream-parsers.md), plain and streamed each on its
  own path, and the prompt is the server's own rendering (its `serverside.py`). `vllm` is vLLM
  0.32 (the `kimi_k2` parsers on vLLM's parser engine); `vllm-legacy` vLLM's kimi_k2 parsers
  as of the model's release; `vllm-k25` those with the kimi_k25 reasoning parser (gone from
  0.32); `sglang` a current SGLang (reasoning forced unless the request turned thinking off);
  `sglang-noforce` an SGLang whose detector is not forced.
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

import itertools
import json
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from json.encoder import encode_basestring
from typing import Any

from specregen.emulator.config import Profile, all_profiles
from specregen.models.chat_format import ServedCall as OutCall
from specregen.models.chat_format import ServedMessage as Message
from specregen.models.family import CompletionLike, GenerationLike, ProfileSpec
from specregen.models.family import profile_spec as _spec
from specregen.models.registry import profile_specs

# The built-in profiles (the default family's, K2.5's). A family's own profiles are declared by
# its descriptor (`Family.profile_specs`, e.g. Qwen3's `vllm-hermes`, K3's `vllm-k3`: vLLM with
# the format's parsers, emulator/served.py) and found through the registry.
BUILTIN_PROFILE_SPECS: dict[Profile, ProfileSpec] = {
    "openrouter": _spec("openrouter", "reasoning", empty_content="", openrouter=True),
    "vllm": _spec("vllm", "reasoning", server="vllm", role_content=True),
    "vllm-legacy": _spec("vllm-legacy", "reasoning", server="vllm-legacy"),
    "vllm-k25": _spec("vllm-k25", "reasoning", server="vllm-k25"),
    "sglang": _spec("sglang", "reasoning_content", server="sglang"),
    "sglang-noforce": _spec("sglang-noforce", "reasoning_content", server="sglang-noforce"),
    "moonshot": _spec("moonshot", "reasoning_content", trim_tool_calls=False, empty_content=""),
    "raw": _spec("raw", "reasoning_content", parse_tools=False, trim_tool_calls=False),
    "stripped": _spec("stripped", "reasoning", parse_tools=False, trim_tool_calls=False,
                      strip_markers=True),
}


class _ProfileSpecs(Mapping[Profile, ProfileSpec]):
    """The built-in profiles, then those the registered families declare (read at lookup, so a
    family registered later is found)."""

    def _all(self) -> dict[Profile, ProfileSpec]:
        declared = {spec.name: spec for spec in profile_specs()}
        return {**declared, **BUILTIN_PROFILE_SPECS}

    def __getitem__(self, name: Profile) -> ProfileSpec:
        spec = BUILTIN_PROFILE_SPECS.get(name)
        return spec if spec is not None else self._all()[name]

    def __iter__(self) -> Iterator[Profile]:
        return iter(all_profiles())

    def __len__(self) -> int:
        return len(all_profiles())


PROFILE_SPECS: Mapping[Profile, ProfileSpec] = _ProfileSpecs()


@dataclass(frozen=True, slots=True)
class ResponseMeta:
    id: str
    created: int
    model: str
    provider: str
    price_prompt: float
    price_completion: float


def usage(view: CompletionLike, gen: GenerationLike, meta: ResponseMeta, spec: ProfileSpec,
          msg: Message | None = None) -> dict:
    prompt = len(gen.prompt_ids)
    reasoning = view.reasoning_tokens
    if msg is not None and msg.reasoning_tokens is not None:
        reasoning = msg.reasoning_tokens
    completion = len(view.ids)
    prompt_cost = prompt * meta.price_prompt
    completion_cost = completion * meta.price_completion
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": reasoning},
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
    view: CompletionLike,
    gen: GenerationLike,
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
    body["usage"] = usage(view, gen, meta, spec, msg)
    if wants_token_ids(request):
        # vLLM's extension: the ids the model saw and wrote, the ground truth of the tests.
        body["prompt_token_ids"] = list(gen.prompt_ids)
        choice["token_ids"] = list(view.ids)
    return body


def stream_frames(
    spec: ProfileSpec,
    msg: Message,
    view: CompletionLike,
    gen: GenerationLike,
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
    if msg.content is not None or spec.role_content:
        first_delta["content"] = ""
    first = chunk(first_delta)
    if wants_token_ids(request):
        first["prompt_token_ids"] = list(gen.prompt_ids)
    frames = [sse(first)]
    for piece in text_pieces(msg.reasoning, rng):
        encoded = _json_str(piece)
        if spec.openrouter:
            delta = (field + encoded + b',"reasoning_details":[{"type":"reasoning.text","text":'
                     + encoded + b',"format":"unknown","index":0}]}')
        else:
            delta = field + encoded + b"}"
        frames.append(before + delta + after)
    # Content is sent in the stretches the stream parser left between the calls.
    text = msg.content or ""
    at = msg.content_at_calls
    if at is None or all(a >= len(text) for a in at):
        stretches = [text] + [""] * len(msg.tool_calls)
    else:
        cuts = [0, *at, len(text)]
        stretches = [text[a:b] for a, b in itertools.pairwise(cuts)]
    for i, stretch in enumerate(stretches):
        for piece in text_pieces(stretch, rng):
            frames.append(before + b'{"content":' + _json_str(piece) + b"}" + after)
        if i >= len(msg.tool_calls):
            break
        call = msg.tool_calls[i]
        index = i if call.index is None else call.index
        frames.append(sse(chunk({"tool_calls": [{
            "index": index, "id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }]})))
        for piece in text_pieces(call.arguments, rng):
            frames.append(sse(chunk({"tool_calls": [{"index": index,
                                                     "function": {"arguments": piece}}]})))
    last = chunk({}, msg.finish_reason)
    if wants_token_ids(request):
        last["choices"][0]["token_ids"] = list(view.ids)
    frames.append(sse(last))
    frames.append(sse({**head, "choices": [], "usage": usage(view, gen, meta, spec, msg)}))
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
