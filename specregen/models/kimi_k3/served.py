"""Kimi K3 behind a vLLM 0.32 server (kimi_k3 reasoning and tool parsers: profile `vllm-k3`)
or behind OpenRouter in front of one (`openrouter`), for the emulator.

The emulator decides WHAT the model says (reasoning, content, calls as argument objects); this
module says how K3 writes it as ids and what the server returns for them. The ids are the
answer as the encoder renders it as a history turn (`encoding.assistant_body`), minus the
generation prompt the server already put in the prompt -- written from the encoder, not from
`format.KimiK3.assemble`, so the two sides stay independent. The server's side is servers.py:
its prompt rendering, detokenization and parsers, plain and streamed.

Dialects: a vLLM request switches thinking with `chat_template_kwargs.thinking`; an OpenRouter
request with `reasoning` (enabled / effort), which the router turns into the upstream's switch
(`upstream_request`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specregen.models.chat_format import ScriptedAnswer, ServedCall, ServedMessage
from specregen.models.kimi_k3 import encoding as enc
from specregen.models.kimi_k3.servers import (
    MarkerIds,
    count_reasoning_tokens,
    decode_output,
    encode_prompt,
    parse,
    parser_thinking,
    template_kwargs,
)
from specregen.models.kimi_k3.tokens import encode_segments
from specregen.models.serverkit.ids import vllm_call_id
from specregen.models.serverkit.stream import Output
from specregen.models.tokenizer import Tokenizer
from specregen.wire.response import dialect_thinking

PROFILES = ("vllm-k3", "openrouter")


@dataclass(frozen=True)
class ServedAnswer:
    """One answer as the server saw, generated and returned it."""

    prompt_ids: list[int]
    ids: list[int]  # what the model generated (its stop id included unless cut)
    reasoning: str | None
    content: str | None
    calls: tuple[tuple[str, str], ...]  # (name, arguments text) as the server returns them
    finish_reason: str
    reasoning_tokens: int  # `usage.completion_tokens_details.reasoning_tokens`


def model_ids(tok: Tokenizer, *, reasoning: str | None, content: str,
              calls: Sequence[tuple[str, dict[str, Any]]], thinking: bool) -> list[int]:
    """What K3 generates after the generation prompt: its history turn for this answer, from
    the think channel's body (or the response channel's, thinking off) to
    `<|close|>message<|sep|>`, then `<|end_of_msg|>`."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning"] = reasoning
    if calls:
        message["tool_calls"] = [{"type": "function",
                                  "function": {"name": name, "arguments": dict(arguments)}}
                                 for name, arguments in calls]
    body = enc.assistant_body(message, thinking=thinking)
    prefill = enc.open_tag("think" if thinking else "response")
    if body[:len(prefill)] != prefill:
        raise ValueError("the history turn does not start with the generation prompt's opener")
    segments = body[len(prefill):] + enc.close_tag("message") + enc.marker(enc.END_OF_MSG)
    return encode_segments(tok, segments)


class KimiK3Server:
    """The served side of the kimi-k3 format over a tokenizer."""

    format_name = "kimi-k3"
    profiles = PROFILES
    # Where vLLM (>= 0.10) and OpenRouter put the reasoning text.
    reasoning_field = "reasoning"

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tok = tokenizer
        self.marker_ids = MarkerIds.of(tokenizer)

    def for_profile(self, profile: str) -> KimiK3Server:
        return self  # both profiles run vLLM's parsers

    def call_id(self, bits: int) -> str:
        """vLLM's id: `chatcmpl-tool-` + 16 hex digits (64 of the random bits)."""
        return vllm_call_id(bits)

    def upstream_request(self, request: dict[str, Any]) -> dict[str, Any]:
        """The request as the vLLM server behind the API sees it: a dialect's thinking switch
        becomes `chat_template_kwargs.thinking`."""
        kwargs = template_kwargs(request)
        if "thinking" in kwargs or "enable_thinking" in kwargs:
            return request
        thinking = dialect_thinking(request)
        if thinking is None:
            return request
        return {**request, "chat_template_kwargs": {**kwargs, "thinking": thinking}}

    def thinking(self, request: dict[str, Any]) -> bool:
        return parser_thinking(self.upstream_request(request))

    def answer(self, request: dict[str, Any], *, reasoning: str, content: str,
               calls: Sequence[tuple[str, Any]], max_tokens: int | None = None
               ) -> ServedAnswer:
        """The model writes `reasoning` (when it thinks), `content` and `calls` (name,
        argument object); the server renders the prompt and parses the ids back."""
        upstream = self.upstream_request(request)
        thinking = parser_thinking(upstream)
        prompt = encode_prompt(upstream, self.tok)
        objects = [(name, args if isinstance(args, dict) else {}) for name, args in calls]
        ids = model_ids(self.tok, reasoning=reasoning if thinking else None, content=content,
                        calls=objects, thinking=thinking)
        truncated = max_tokens is not None and len(ids) > max_tokens
        if truncated:
            ids = ids[:max_tokens]
        parsed, _ = self._parse(upstream, ids, truncated, request.get("stream") is True, prompt)
        return ServedAnswer(prompt, list(ids), parsed.reasoning, parsed.content,
                            tuple((c.name, c.arguments) for c in parsed.calls),
                            parsed.finish_reason,
                            count_reasoning_tokens(ids, self.marker_ids, thinking))

    def _parse(self, upstream: dict[str, Any], ids: Sequence[int], truncated: bool,
               stream: bool, prompt: Sequence[int]) -> tuple[Any, Output]:
        out = decode_output(ids, self.tok, truncated)
        return parse(out, upstream, stream=stream, marker_ids=self.marker_ids,
                     prompt_ids=prompt), out

    def answer_ids(self, spec: Any, request: dict[str, Any], ids: Sequence[int],
                   max_tokens: int | None, stream: bool, seed: int = 0) -> ScriptedAnswer:
        """What profile `spec` returns when the model wrote `ids` for `request`, cut at
        `max_tokens` (the real-server conformance's side); call ids from `seed`."""
        upstream = self.upstream_request(request)
        cut = list(ids[:max_tokens]) if max_tokens is not None else list(ids)
        truncated = len(cut) < len(ids)
        prompt = encode_prompt(upstream, self.tok)
        parsed, _ = self._parse(upstream, cut, truncated, stream, prompt)
        rng = random.Random(seed)
        calls = tuple(ServedCall(self.call_id(rng.getrandbits(128)), c.name, c.arguments)
                      for c in parsed.calls)
        at_calls = parsed.content_at_calls if stream and parsed.calls else None
        message = ServedMessage(parsed.reasoning, parsed.content, calls, parsed.finish_reason,
                                content_at_calls=at_calls or None)
        reasoning_tokens = count_reasoning_tokens(cut, self.marker_ids,
                                                  parser_thinking(upstream))
        return ScriptedAnswer(message, tuple(cut), reasoning_tokens, tuple(prompt))


def make_server(tokenizer: Tokenizer) -> KimiK3Server:
    """The registry's constructor for the emulator (`registry.get_server`)."""
    return KimiK3Server(tokenizer)
