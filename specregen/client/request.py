"""A prompt and the endpoint's config -> the request to send (`build_request`), and whether to
send it at all (`admit`).

The body itself is the wire layer's (`wire.request.build_body`): this module resolves what it
needs from the run's own objects -- the conversation's first request (`turns == "all"`), the
tools the prompt declares on the request, the endpoint's settings (`wire_options`) and the
chat format's thinking switch (from the family registry) -- into its plain inputs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specregen.client.config import EndpointConfig
from specregen.models.registry import thinking_switch
from specregen.records import Prompt
from specregen.store.rawlog import FINAL_ANSWER, LogHistory
from specregen.wire.request import TEMPLATE_DIALECTS, WireOptions, build_body, request_fingerprint


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
    # Tools declared any other way (in the system prompt) are already in the messages.
    tools = prompt.tools if prompt.tool_mode == "tools" else None
    # Only a server that renders the template reads the format's switch; asking the registry
    # for it otherwise would refuse a model no format claims, which such a body never needs.
    switch = (thinking_switch(cfg.format_name)
              if cfg.thinking is not None and cfg.dialect in TEMPLATE_DIALECTS else None)
    return build_body(messages, tools, wire_options(cfg), thinking_switch=switch)


def wire_options(cfg: EndpointConfig) -> WireOptions:
    """What a request body carries of the endpoint's settings."""
    return WireOptions(
        model=cfg.model,
        dialect=cfg.dialect,
        sampling=cfg.sampling.model_dump(exclude_none=True),
        thinking=cfg.thinking,
        reasoning=cfg.reasoning.as_body() if cfg.reasoning is not None else None,
        provider=cfg.provider.as_body() if cfg.provider is not None else None,
        text_as_written=cfg.text_as_written,
        return_token_ids=cfg.return_token_ids,
        logprobs=bool(cfg.logprobs),
        stream=cfg.stream,
    )


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
