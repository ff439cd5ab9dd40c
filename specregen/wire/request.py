"""The chat-completions request body of one dialect, its fingerprint, and its stored form.

`build_body` takes plain inputs: the messages, the tools to declare, `WireOptions` (what the
body carries of the endpoint's settings) and the chat format's thinking switch. Each dialect
switches the model's thinking its own way: OpenRouter through `reasoning`, vLLM/SGLang through
`chat_template_kwargs` under the chat format's key (`ChatFormat.thinking_switch`), Moonshot
through `thinking.type`. These are exactly the fields `wire.response.thinking_from_request`
reads back during reconstruction.

The fingerprint keys the raw log: a body that changes by one byte of what the model is asked
re-pays for every answer, so every field and its order here is part of the output.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from specregen.fingerprint import fingerprint

Dialect = Literal["openrouter", "vllm", "sglang", "moonshot"]
# The dialects whose servers render the chat template themselves, so the thinking switch is a
# `chat_template_kwargs` key of the model's template.
TEMPLATE_DIALECTS: frozenset[str] = frozenset({"vllm", "sglang"})

# Transport options: they change how the answer travels, not what the model is asked, so a
# streamed and a non-streamed run of the same prompt share one fingerprint.
TRANSPORT_FIELDS = frozenset({"stream", "stream_options"})
# Options that only change how the answer comes back -- how the server writes the model's ids
# as text (its detokenizer), or which evidence comes with it (logprobs): outside the
# fingerprint too, so an answer logged before we sent them (the same generation, read with
# more care) is not paid for again.
TEXT_OPTION_FIELDS = frozenset({"spaces_between_special_tokens", "logprobs",
                                "return_tokens_as_token_ids"})
# What a self-hosted vLLM or SGLang is asked for besides the model's own request: the model's
# text as it wrote it. By default their detokenizer joins an added token and the text beside it
# with a space (`spaces_between_special_tokens`, vllm-project/vllm#33457): text the model never
# wrote, which a token count cannot see.
SERVER_TEXT_OPTIONS: dict[str, dict[str, Any]] = {
    "vllm": {"spaces_between_special_tokens": False},
    "sglang": {"spaces_between_special_tokens": False},
}
# Never part of a body we build; dropped anyway in case a caller's body carries one.
SECRET_FIELDS = frozenset({"api_key", "authorization", "Authorization"})


@dataclass(frozen=True, slots=True)
class WireOptions:
    """What a body carries of an endpoint's settings (`client.request.wire_options` reads them
    from its `EndpointConfig`); mappings are sent as given, in their order."""

    model: str
    dialect: Dialect = "openrouter"
    # Sampling parameters that are set (max_tokens, temperature, ...).
    sampling: Mapping[str, Any] = field(default_factory=dict)
    # The model's thinking switch; None sends nothing (the server's default).
    thinking: bool | None = None
    # OpenRouter's `reasoning` and `provider` objects as configured (None: not configured).
    reasoning: Mapping[str, Any] | None = None
    provider: Mapping[str, Any] | None = None
    # Ask vLLM/SGLang for the text as the model wrote it (SERVER_TEXT_OPTIONS).
    text_as_written: bool = True
    return_token_ids: bool = False
    logprobs: bool = False
    stream: bool = True


def build_body(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    options: WireOptions,
    *,
    thinking_switch: str | None = None,
) -> dict[str, Any]:
    """The request body: `tools` declared when there are any; `thinking_switch` is the
    `chat_template_kwargs` key a TEMPLATE_DIALECTS body switches thinking with (needed only
    there, and only when `options.thinking` is set)."""
    body: dict[str, Any] = {"model": options.model, "messages": messages}
    if tools:
        body["tools"] = tools
    body.update(options.sampling)

    dialect = options.dialect
    if dialect == "openrouter":
        reasoning = dict(options.reasoning or {})
        if options.thinking is not None and "enabled" not in reasoning:
            reasoning["enabled"] = options.thinking
        if reasoning:
            body["reasoning"] = reasoning
        if options.provider:
            body["provider"] = dict(options.provider)
    elif dialect in TEMPLATE_DIALECTS:
        if options.thinking is not None:
            if thinking_switch is None:
                raise ValueError(f"a {dialect} body that switches thinking needs the chat "
                                 "format's thinking switch")
            body["chat_template_kwargs"] = {thinking_switch: options.thinking}
        if options.text_as_written:
            body.update(SERVER_TEXT_OPTIONS[dialect])
    elif dialect == "moonshot" and options.thinking is not None:
        body["thinking"] = {"type": "enabled" if options.thinking else "disabled"}
    if options.return_token_ids:
        body["return_token_ids"] = True
    if options.logprobs:
        body["logprobs"] = True
        if dialect == "vllm":
            # Tokens named by id: exact even where a token ends inside a character.
            body["return_tokens_as_token_ids"] = True

    if options.stream:
        body["stream"] = True
        # vLLM/SGLang send usage in a stream only when asked; OpenRouter always sends it and
        # documents the option as a no-op; Moonshot puts usage in the last chunk by itself.
        if dialect != "moonshot":
            body["stream_options"] = {"include_usage": True}
    return body


def request_fingerprint(body: dict[str, Any]) -> str:
    """sha256 of the canonical body, without transport options and without anything secret."""
    kept = {k: v for k, v in body.items()
            if k not in TRANSPORT_FIELDS and k not in TEXT_OPTION_FIELDS
            and k not in SECRET_FIELDS}
    return fingerprint(kept)


def storable_request(body: dict[str, Any]) -> dict[str, Any]:
    """The body as it goes into the raw log: everything but secret fields."""
    return {k: v for k, v in body.items() if k not in SECRET_FIELDS}
