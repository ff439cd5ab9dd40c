"""Qwen3 behind a vLLM server (qwen3 reasoning parser + hermes tool parser) or an SGLang server
(qwen3 reasoning parser + qwen25 tool parser: profile `sglang`), for the emulator.

The emulator decides WHAT the model writes (reasoning, content, calls as argument objects);
this module says how Qwen3 writes it as ids (`servers.model_ids`, segment by segment, written
independently of `format.Qwen3.assemble`) and what the server returns for those ids
(`servers.decode_output` + `servers.parse`). The prompt is the server's rendering of the request
(`servers.encode_prompt`: vLLM's message preprocessing, then the Jinja template).

Dialects: a vLLM request switches thinking with `chat_template_kwargs.enable_thinking`; an
OpenRouter request with `reasoning` (enabled / effort), which the router turns into the
upstream's switch -- `upstream_request` does that translation.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specregen.models.chat_format import ScriptedAnswer, ServedCall, ServedMessage
from specregen.models.qwen3.servers import (
    MarkerIds,
    decode_output,
    encode_prompt,
    model_ids,
    parse,
    sglang_decode_output,
    sglang_encode_prompt,
    sglang_parse,
    sglang_stream,
    template_kwargs,
)
from specregen.models.tokenizer import Tokenizer
from specregen.normalize import dialect_thinking


@dataclass(frozen=True)
class ServedAnswer:
    """One answer as the server saw, generated and returned it."""

    prompt_ids: list[int]
    ids: list[int]  # what the model generated (its stop id included unless cut by max_tokens)
    reasoning: str | None
    content: str | None
    calls: tuple[tuple[str, str], ...]  # (name, arguments text) as the server returns them
    finish_reason: str


class Qwen3Server:
    """The served side of the qwen3 format over a tokenizer (`family`: "vllm", the default, or
    "sglang")."""

    format_name = "qwen3"
    # Where vLLM (>= 0.10) and OpenRouter put the reasoning text.
    reasoning_field = "reasoning"

    def __init__(self, tokenizer: Tokenizer, family: str = "vllm") -> None:
        self.tok = tokenizer
        self.markers = MarkerIds.of(tokenizer)
        self.family = family
        if family == "sglang":
            self.reasoning_field = "reasoning_content"

    def for_profile(self, profile: str) -> Qwen3Server:
        """The server an emulator profile runs: `sglang` is SGLang, every other one vLLM."""
        family = "sglang" if profile == "sglang" else "vllm"
        return self if family == self.family else Qwen3Server(self.tok, family)

    def call_id(self, bits: int) -> str:
        """A tool-call id as the server makes it from 128 random bits: vLLM
        `chatcmpl-tool-<uuid4 hex>`, SGLang `call_<uuid4 hex[:24]>`."""
        if self.family == "sglang":
            return f"call_{bits:032x}"[:29]
        return f"chatcmpl-tool-{bits:032x}"

    def upstream_request(self, request: dict[str, Any]) -> dict[str, Any]:
        """The request as the vLLM server behind the API sees it: a dialect's thinking switch
        becomes the template's `enable_thinking`."""
        kwargs = template_kwargs(request)
        if "enable_thinking" in kwargs:
            return request
        thinking = dialect_thinking(request)
        if thinking is None:
            return request
        return {**request, "chat_template_kwargs": {**kwargs, "enable_thinking": thinking}}

    def thinking(self, request: dict[str, Any]) -> bool:
        """Whether the model thinks for this request (the template's default: on)."""
        return template_kwargs(self.upstream_request(request)).get("enable_thinking") \
            is not False

    def arguments_text(self, arguments: Any) -> str:
        """Arguments as Qwen3 writes them: the template shows `tojson` output, so the model
        writes `json.dumps` form."""
        return json.dumps(arguments, ensure_ascii=False)

    def answer(self, request: dict[str, Any], *, reasoning: str, content: str,
               calls: Sequence[tuple[str, Any]], max_tokens: int | None = None
               ) -> ServedAnswer:
        """The model writes `reasoning` (when it thinks), `content` and `calls` (name,
        argument object); the server renders the prompt and parses the ids back."""
        upstream = self.upstream_request(request)
        stream = request.get("stream") is True
        prompt = (sglang_encode_prompt(upstream, self.tok) if self.family == "sglang"
                  else encode_prompt(upstream, self.tok))
        written = [(name, self.arguments_text(args)) for name, args in calls]
        ids = model_ids(self.tok, reasoning=reasoning if self.thinking(request) else None,
                        content=content, calls=written)
        truncated = max_tokens is not None and len(ids) > max_tokens
        if truncated:
            ids = ids[:max_tokens]
        if self.family == "sglang":
            out = sglang_decode_output(ids, self.tok, truncated)
            # In the template's layout the restated stream sends content only before the first
            # call (`StreamParsed.content_at_calls`): the order the emulator's frames use.
            parsed = sglang_stream(out, upstream).parsed if stream else sglang_parse(out, upstream)
        else:
            out = decode_output(ids, self.tok, truncated)
            parsed = parse(out, upstream, self.markers, stream=stream, prompt_ids=prompt)
        return ServedAnswer(
            prompt_ids=prompt, ids=list(ids), reasoning=parsed.reasoning,
            content=parsed.content,
            calls=tuple((c.name, c.arguments) for c in parsed.calls),
            finish_reason=parsed.finish_reason)


    def answer_ids(self, spec: Any, request: dict[str, Any], ids: Sequence[int],
                   max_tokens: int | None, stream: bool, seed: int = 0) -> ScriptedAnswer:
        """What profile `spec` returns when the model wrote `ids` for `request`, cut at
        `max_tokens` (the real-server conformance's side); call ids from `seed`."""
        server = self.for_profile(spec.name)
        upstream = server.upstream_request(request)
        cut = list(ids[:max_tokens]) if max_tokens is not None else list(ids)
        truncated = len(cut) < len(ids)
        at_calls = None
        if server.family == "sglang":
            prompt = sglang_encode_prompt(upstream, server.tok)
            out = sglang_decode_output(cut, server.tok, truncated)
            if stream:
                streamed = sglang_stream(out, upstream)
                parsed, at_calls = streamed.parsed, streamed.content_at_calls
            else:
                parsed = sglang_parse(out, upstream)
        else:
            prompt = encode_prompt(upstream, server.tok)
            out = decode_output(cut, server.tok, truncated)
            parsed = parse(out, upstream, server.markers, stream=stream, prompt_ids=prompt)
        rng = random.Random(seed)
        calls = tuple(ServedCall(server.call_id(rng.getrandbits(128)), c.name, c.arguments)
                      for c in parsed.calls)
        message = ServedMessage(parsed.reasoning, parsed.content, calls, parsed.finish_reason,
                                content_at_calls=at_calls or None)
        think_end = server.markers.think_end
        reasoning_tokens = cut.index(think_end) + 1 if think_end in cut else (
            len(cut) if parsed.reasoning is not None and parsed.content is None else 0)
        return ScriptedAnswer(message, tuple(cut), reasoning_tokens, tuple(prompt))


def make_server(tokenizer: Tokenizer) -> Qwen3Server:
    """The registry's constructor for the emulator (`registry.get_server`)."""
    return Qwen3Server(tokenizer)
