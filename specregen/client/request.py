"""Prompt + endpoint config -> the chat-completions request body, and its fingerprint.

Each dialect switches the model's thinking its own way: OpenRouter through `reasoning`,
vLLM/SGLang through `chat_template_kwargs` under the chat format's key (`ChatFormat.
thinking_switch`), Moonshot through `thinking.type`. These are exactly the fields the format's
`thinking_requested` reads back during reconstruction.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specregen.client.config import EndpointConfig
from specregen.models.registry import thinking_switch
from specregen.records import Prompt
from specregen.store.fingerprint import fingerprint
from specregen.store.rawlog import FINAL_ANSWER, LogHistory

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


def build_request(prompt: Prompt, cfg: EndpointConfig) -> dict[str, Any]:
    """The body of the prompt's request; of a whole conversation (`turns == "all"`), its first
    request (the engine builds the later ones from the model's answers). A conversation that
    cannot be walked raises ConversationError (a ValueError naming the message)."""
    messages = prompt.messages
    if prompt.turns == "all":
        from specregen.conversation.plan import Request, advance, plan_conversation

        first = advance(plan_conversation(prompt), [])
        assert isinstance(first, Request)
        messages = first.messages
    body: dict[str, Any] = {"model": cfg.model, "messages": messages}
    if prompt.tool_mode == "tools" and prompt.tools:
        body["tools"] = prompt.tools
    for name, value in cfg.sampling.model_dump(exclude_none=True).items():
        body[name] = value

    if cfg.dialect == "openrouter":
        reasoning = cfg.reasoning.as_body() if cfg.reasoning else {}
        if cfg.thinking is not None and "enabled" not in reasoning:
            reasoning["enabled"] = cfg.thinking
        if reasoning:
            body["reasoning"] = reasoning
        if cfg.provider is not None and (routing := cfg.provider.as_body()):
            body["provider"] = routing
    elif cfg.dialect in ("vllm", "sglang"):
        if cfg.thinking is not None:
            body["chat_template_kwargs"] = {thinking_switch(cfg.format_name): cfg.thinking}
        if cfg.text_as_written:
            body.update(SERVER_TEXT_OPTIONS[cfg.dialect])
    elif cfg.dialect == "moonshot" and cfg.thinking is not None:
        body["thinking"] = {"type": "enabled" if cfg.thinking else "disabled"}
    if cfg.return_token_ids:
        body["return_token_ids"] = True
    if cfg.logprobs:
        body["logprobs"] = True
        if cfg.dialect == "vllm":
            # Tokens named by id: exact even where a token ends inside a character.
            body["return_tokens_as_token_ids"] = True

    if cfg.stream:
        body["stream"] = True
        # vLLM/SGLang send usage in a stream only when asked; OpenRouter always sends it and
        # documents the option as a no-op; Moonshot puts usage in the last chunk by itself.
        if cfg.dialect != "moonshot":
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


@dataclass(frozen=True, slots=True)
class Admitted:
    """A prompt to send: its body, fingerprint, this attempt's number and the attempts already
    on record without a final answer (a killed run's)."""

    body: dict[str, Any]
    fingerprint: str
    attempt: int
    tries: int


def admit(
    prompt: Prompt,
    cfg: EndpointConfig,
    history: LogHistory,
    *,
    retry_failed: bool,
    prompt_check: Callable[[Prompt, dict[str, Any]], str | None] | None,
) -> Admitted | str | None:
    """Whether a prompt is sent, for the realtime engine and the batch runner alike: None when
    the raw log already holds its final answer (or its failure, unless `retry_failed`), a
    reason (str) when it cannot be sent (not JSON, refused by `prompt_check`), else what to
    send."""
    try:
        body = build_request(prompt, cfg)
        key = (prompt.sample_id, request_fingerprint(body))
    except (ValueError, TypeError, RecursionError) as exc:
        # e.g. NaN/Infinity in a tool schema: not JSON, so no server could take it.
        return f"cannot be sent as JSON: {exc}"
    status = history.final.get(key)
    if status in FINAL_ANSWER or (status == "failed" and not retry_failed):
        return None
    if prompt_check is not None and (reason := prompt_check(prompt, body)) is not None:
        return reason
    return Admitted(body, key[1], attempt=history.last_attempt.get(key, 0) + 1,
                    tries=history.open_attempts.get(key, 0))
