"""Qwen3 behind a vLLM server (qwen3 reasoning parser + hermes tool parser) or an SGLang server
(qwen3 reasoning parser + qwen25 tool parser: profile `sglang`), for the emulator.

The emulator decides WHAT the model writes (reasoning, content, calls as argument objects);
this module says how Qwen3 writes it as ids (`model_ids`, segment by segment, written
independently of `format.Qwen3.assemble`) and what the server returns for those ids.

Families (the parsers a profile runs, `Qwen3Server.for_profile`):

* `vllm` (profile `vllm-hermes`): vLLM 0.32 (`vllm.py`, docs/vllm-0.32.md (B)), held against
  the real server (bench/real_vllm.py): its prompt rendering, parsers, ids and usage count.
* `vllm-legacy` (profile `openrouter`, vLLM behind the router): the earlier restatement of
  vLLM's parsers (`vllm_legacy.py`, docs/qwen3.md), kept as it was for OpenRouter.
* `sglang` (profile `sglang`): `sglang.py`.

The parts the families share: `servers.py` (the request side, also the readings'), `hermes.py`
(both vLLMs' hermes stream), and the family-neutral `models/serverkit` (parser types,
stream-delta helpers, partial JSON, call ids).

Dialects: a vLLM request switches thinking with `chat_template_kwargs.enable_thinking` (0.32
also with `reasoning_effort`); an OpenRouter request with `reasoning` (enabled / effort), which
the router turns into the upstream's switch -- `upstream_request` does that translation.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specregen.models.chat_format import ScriptedAnswer, ServedCall, ServedMessage
from specregen.models.qwen3 import sglang, vllm, vllm_legacy
from specregen.models.qwen3.servers import template_kwargs
from specregen.models.qwen3.tokens import IM_END, THINK, THINK_END, TOOL_CALL, TOOL_CALL_END
from specregen.models.qwen3.vllm_legacy import MarkerIds
from specregen.models.serverkit.ids import sglang_call_id, vllm_call_id, vllm_legacy_call_id
from specregen.models.serverkit.stream import Parsed
from specregen.models.tokenizer import Tokenizer
from specregen.wire.response import dialect_thinking

FAMILIES = ("vllm", "vllm-legacy", "sglang")


@dataclass(frozen=True)
class ServedAnswer:
    """One answer as the server saw, generated and returned it."""

    prompt_ids: list[int]
    ids: list[int]  # what the model generated (its stop id included unless cut by max_tokens)
    reasoning: str | None
    content: str | None
    calls: tuple[tuple[str, str], ...]  # (name, arguments text) as the server returns them
    finish_reason: str
    reasoning_tokens: int  # the usage's `completion_tokens_details.reasoning_tokens`


@dataclass(frozen=True, slots=True)
class _Served:
    prompt: list[int]
    parsed: Parsed
    reasoning_tokens: int
    content_at_calls: tuple[int, ...] | None


class Qwen3Server:
    """The served side of the qwen3 format over a tokenizer (`family`: one of `FAMILIES`;
    "vllm", vLLM 0.32, by default)."""

    format_name = "qwen3"
    # Where vLLM (>= 0.10) and OpenRouter put the reasoning text.
    reasoning_field = "reasoning"

    def __init__(self, tokenizer: Tokenizer, family: str = "vllm") -> None:
        if family not in FAMILIES:
            raise ValueError(f"unknown Qwen3 server family {family!r}")
        self.tok = tokenizer
        self.markers = MarkerIds.of(tokenizer)
        self.vocab = vllm.Vocabulary.of(tokenizer)
        self.family = family
        if family == "sglang":
            self.reasoning_field = "reasoning_content"

    def for_profile(self, profile: str) -> Qwen3Server:
        """The server an emulator profile runs: `sglang` is SGLang, `openrouter` the earlier
        vLLM restatement behind the router, every other one (`vllm-hermes`) vLLM 0.32."""
        family = {"sglang": "sglang", "openrouter": "vllm-legacy"}.get(profile, "vllm")
        return self if family == self.family else Qwen3Server(self.tok, family)

    def call_id(self, bits: int) -> str:
        """A tool-call id as the server makes it from 128 random bits: vLLM 0.32
        `chatcmpl-tool-` + 16 hex digits, the earlier vLLM `chatcmpl-tool-<uuid4 hex>`, SGLang
        `call_<uuid4 hex[:24]>`."""
        if self.family == "sglang":
            return sglang_call_id(bits)
        if self.family == "vllm":
            return vllm_call_id(bits)
        return vllm_legacy_call_id(bits)

    def upstream_request(self, request: dict[str, Any]) -> dict[str, Any]:
        """The request as the vLLM server behind the API sees it: a dialect's thinking switch
        becomes the template's `enable_thinking`. A vLLM server asked directly (`vllm`) reads
        only its own fields (`chat_template_kwargs`, `reasoning_effort`): the request as is."""
        if self.family == "vllm":
            return request
        kwargs = template_kwargs(request)
        if "enable_thinking" in kwargs:
            return request
        thinking = dialect_thinking(request)
        if thinking is None:
            return request
        return {**request, "chat_template_kwargs": {**kwargs, "enable_thinking": thinking}}

    def thinking(self, request: dict[str, Any]) -> bool:
        """Whether the model thinks for this request: the template's switch (on unless
        `enable_thinking` is exactly false)."""
        upstream = self.upstream_request(request)
        kwargs = (vllm.template_kwargs(upstream) if self.family == "vllm"
                  else template_kwargs(upstream))
        return kwargs.get("enable_thinking") is not False

    def arguments_text(self, arguments: Any) -> str:
        """Arguments as Qwen3 writes them: the template shows `tojson` output, so the model
        writes `json.dumps` form."""
        return json.dumps(arguments, ensure_ascii=False)

    def encode_prompt(self, request: dict[str, Any]) -> list[int]:
        """The prompt ids the server renders for `request` (after `upstream_request`)."""
        if self.family == "sglang":
            return sglang.encode_prompt(request, self.tok)
        if self.family == "vllm":
            return vllm.encode_prompt(request, self.tok)
        return vllm_legacy.encode_prompt(request, self.tok)

    def serve_ids(self, request: dict[str, Any], ids: Sequence[int], truncated: bool,
                  stream: bool) -> _Served:
        """What this family returns when the model wrote `ids` (cut by `max_tokens` when
        `truncated`) for the upstream `request`."""
        prompt = self.encode_prompt(request)
        at_calls = None
        if self.family == "sglang":
            out = sglang.decode_output(ids, self.tok, truncated)
            if stream:
                streamed = sglang.stream(out, request)
                parsed, at_calls = streamed.parsed, streamed.content_at_calls
            else:
                parsed = sglang.parse(out, request)
            return _Served(prompt, parsed, _legacy_reasoning_tokens(ids, parsed, self.markers),
                           at_calls)
        out = vllm_legacy.decode_output(ids, self.tok, truncated)
        if self.family == "vllm":
            answer = vllm.parse(out, ids, request, self.vocab, stream=stream, prompt_ids=prompt)
            return _Served(prompt, answer.parsed, answer.reasoning_tokens, None)
        parsed = vllm_legacy.parse(out, request, self.markers, stream=stream, prompt_ids=prompt)
        return _Served(prompt, parsed, _legacy_reasoning_tokens(ids, parsed, self.markers), None)

    def answer(self, request: dict[str, Any], *, reasoning: str, content: str,
               calls: Sequence[tuple[str, Any]], max_tokens: int | None = None
               ) -> ServedAnswer:
        """The model writes `reasoning` (when it thinks), `content` and `calls` (name,
        argument object); the server renders the prompt and parses the ids back."""
        upstream = self.upstream_request(request)
        stream = request.get("stream") is True
        written = [(name, self.arguments_text(args)) for name, args in calls]
        ids = model_ids(self.tok, reasoning=reasoning if self.thinking(request) else None,
                        content=content, calls=written)
        truncated = max_tokens is not None and len(ids) > max_tokens
        if truncated:
            ids = ids[:max_tokens]
        # In the template's layout the restated SGLang stream sends content only before the
        # first call (`StreamParsed.content_at_calls`): the order the emulator's frames use.
        served = self.serve_ids(upstream, ids, truncated, stream)
        parsed = served.parsed
        return ServedAnswer(
            prompt_ids=served.prompt, ids=list(ids), reasoning=parsed.reasoning,
            content=parsed.content,
            calls=tuple((c.name, c.arguments) for c in parsed.calls),
            finish_reason=parsed.finish_reason, reasoning_tokens=served.reasoning_tokens)

    def answer_ids(self, spec: Any, request: dict[str, Any], ids: Sequence[int],
                   max_tokens: int | None, stream: bool, seed: int = 0) -> ScriptedAnswer:
        """What profile `spec` returns when the model wrote `ids` for `request`, cut at
        `max_tokens` (the real-server conformance's side); call ids from `seed`."""
        server = self.for_profile(spec.name)
        upstream = server.upstream_request(request)
        cut = list(ids[:max_tokens]) if max_tokens is not None else list(ids)
        served = server.serve_ids(upstream, cut, len(cut) < len(ids), stream)
        parsed = served.parsed
        rng = random.Random(seed)
        calls = tuple(ServedCall(server.call_id(rng.getrandbits(128)), c.name, c.arguments)
                      for c in parsed.calls)
        message = ServedMessage(parsed.reasoning, parsed.content, calls, parsed.finish_reason,
                                content_at_calls=served.content_at_calls or None)
        return ScriptedAnswer(message, tuple(cut), served.reasoning_tokens,
                              tuple(served.prompt))


def _legacy_reasoning_tokens(ids: Sequence[int], parsed: Parsed, markers: MarkerIds) -> int:
    """The reasoning share the earlier restatement reports (OpenRouter, SGLang): the ids up to
    and including `</think>`, else all of them when everything is reasoning."""
    if markers.think_end in ids:
        return list(ids).index(markers.think_end) + 1
    return len(ids) if parsed.reasoning is not None and parsed.content is None else 0


def model_ids(tok: Tokenizer, *, reasoning: str | None, content: str,
              calls: Sequence[tuple[str, str]], stop: bool = True) -> list[int]:
    """Ids of an answer written the way Qwen3 writes one (the chat template's layout), built
    from segments: marker ids, and the BPE ids of the text between them. `reasoning` is the
    think-block body without its surrounding newlines (None: thinking off, the prompt already
    closed the block); `calls` are (name, arguments text as the model writes it).

    Written independently of `format.Qwen3.assemble` (segment by segment, not one text), so an
    emulator built on it checks reconstruction rather than agreeing with it by construction.
    """
    ids: list[int] = []
    text = ""
    if reasoning is not None:
        ids.append(tok.token_id(THINK))
        ids.extend(tok.encode_ordinary("\n" + reasoning + "\n"))
        ids.append(tok.token_id(THINK_END))
        text = "\n\n"
    text += content
    for k, (name, arguments) in enumerate(calls):
        if k or content:
            text += "\n"
        if text:
            ids.extend(tok.encode_ordinary(text))
        ids.append(tok.token_id(TOOL_CALL))
        ids.extend(tok.encode_ordinary(f'\n{{"name": "{name}", "arguments": {arguments}}}\n'))
        ids.append(tok.token_id(TOOL_CALL_END))
        text = ""
    if text:
        ids.extend(tok.encode_ordinary(text))
    if stop:
        ids.append(tok.token_id(IM_END))
    return ids


def make_server(tokenizer: Tokenizer) -> Qwen3Server:
    """The registry's constructor for the emulator (`registry.get_server`)."""
    return Qwen3Server(tokenizer)
