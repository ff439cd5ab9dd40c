"""Chat-completion responses of every API dialect, normalised into one `Completion`.

OpenRouter returns `reasoning` (+ `reasoning_details`), vLLM and SGLang `reasoning_content` or
`reasoning`, Moonshot `reasoning_content`; tool calls come structured, or as raw markers left in
a text field, or not at all. Nothing here trims, parses or re-serialises text: `arguments` stay
the strings the API sent, whitespace included.

The request readers at the end (`thinking_from_request`, `dialect_thinking`,
`reasoning_excluded`) say what a request body asked in each dialect's words; the chat formats
read a request with them during reconstruction, as the servers would have.
"""

from __future__ import annotations

import json
from typing import Any

from specregen.records import Completion, ToolCall

REASONING_FIELDS = ("reasoning", "reasoning_content")
# The key of a choice where the stream assembler (wire/stream.py) notes what only the
# stream showed: `{"content_at_calls": [chars of content before call k's first delta, ...],
# "call_fragments": [deltas of call k, ...]}`.
STREAM_KEY = "specregen_stream"


class ResponseError(ValueError):
    """The response body is not a usable chat completion; the message says which field."""


def normalize_response(body: dict[str, Any]) -> Completion:
    """One `Completion` from a response body (non-streaming, or a stream already assembled)."""
    if not isinstance(body, dict):
        raise ResponseError(f"response is a {type(body).__name__}, not a JSON object")
    if body.get("error"):
        raise ResponseError(f"response carries an error: {_error_text(body['error'])}")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices:
        raise ResponseError("response has no 'choices'")
    choice = choices[0]
    if not isinstance(choice, dict):
        raise ResponseError("choices[0] is not an object")
    if choice.get("error"):
        raise ResponseError(f"choices[0] carries an error: {_error_text(choice['error'])}")
    message = choice.get("message")
    if message is None:
        message = choice.get("delta")  # some stream assemblers keep the delta's name
    if not isinstance(message, dict):
        raise ResponseError("choices[0] has no 'message' object")

    reasoning, reasoning_field = _reasoning(message)
    content = _content(message.get("content"))
    tool_calls = _tool_calls(message.get("tool_calls"))
    return Completion(
        reasoning=reasoning,
        content=content,
        tool_calls=tool_calls,
        content_at_calls=_content_at_calls(choice.get(STREAM_KEY), content, tool_calls),
        finish_reason=choice.get("finish_reason"),
        native_finish_reason=choice.get("native_finish_reason"),
        usage=body.get("usage") or {},
        provider=body.get("provider"),
        reasoning_field=reasoning_field,
        logprobs=_logprobs(choice.get("logprobs")),
    )


def _logprobs(value: Any) -> list[Any] | None:
    content = value.get("content") if isinstance(value, dict) else None
    return content if isinstance(content, list) else None


def _content_at_calls(note: Any, content: str | None,
                      calls: list[ToolCall]) -> tuple[int, ...] | None:
    """The stream's record of where the content stood, when it fits this answer (one
    non-decreasing offset into the content per call) and the calls were streamed as they were
    parsed (each in more than one delta: a call sent whole suggests a server that parsed the
    calls at the end and sent them after all the content); anything else is no record.

    A call in one delta with empty arguments counts as streamed: SGLang's stream parser never
    sends falsy arguments (`{}`), so its name delta is all it sends, while a server sending
    whole calls sends at least `{}`."""
    at = note.get("content_at_calls") if isinstance(note, dict) else None
    if not isinstance(at, list) or len(at) != len(calls) or not calls:
        return None
    fragments = note.get("call_fragments")
    if not isinstance(fragments, list) or len(fragments) != len(calls) or not all(
            type(n) is int and (n >= 2 or (n == 1 and call.arguments == ""))
            for n, call in zip(fragments, calls, strict=True)):
        return None
    size = len(content or "")
    if not all(type(n) is int and 0 <= n <= size for n in at) or at != sorted(at):
        return None
    return tuple(at)


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        return f"{error.get('code', '?')} {error.get('message', '')}".strip()
    return str(error)


def _reasoning(message: dict[str, Any]) -> tuple[str | None, str | None]:
    for name in REASONING_FIELDS:
        value = message.get(name)
        if isinstance(value, str):
            return value, name
    details = message.get("reasoning_details")
    if isinstance(details, list):
        texts = [
            d.get("text")
            for d in details
            if isinstance(d, dict) and d.get("type") == "reasoning.text"
        ]
        strings = [t for t in texts if isinstance(t, str)]
        if texts and len(strings) == len(texts):
            return "".join(strings), "reasoning_details"
    return None, None


def _content(content: Any) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p.get("text") or "" for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    raise ResponseError(f"message.content is a {type(content).__name__}, not a string")


def _tool_calls(raw: Any) -> list[ToolCall]:
    if not raw:
        return []
    if not isinstance(raw, list):
        raise ResponseError("message.tool_calls is not a list")
    calls = []
    for i, call in enumerate(raw):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ResponseError(f"message.tool_calls[{i}] has no function name")
        args = fn.get("arguments")
        if args is None:
            args = ""
        elif not isinstance(args, str):
            # Some stacks send an object; it has to become text, and the gate will see it.
            args = json.dumps(args, ensure_ascii=False)
        calls.append(ToolCall(id=call.get("id") or "", name=fn["name"], arguments=args))
    return calls


def thinking_from_request(request: dict[str, Any], switch: str = "thinking") -> bool | None:
    """Whether the request turned thinking on or off, where it says so; else None.

    `switch` is the model format's `chat_template_kwargs` key (`ChatFormat.thinking_switch`),
    read by servers that render the template (vLLM, SGLang); the API dialects' own fields
    follow (`dialect_thinking`).
    """
    kwargs = request.get("chat_template_kwargs")
    if isinstance(kwargs, dict) and isinstance(kwargs.get(switch), bool):
        return kwargs[switch]
    return dialect_thinking(request)


def dialect_thinking(request: dict[str, Any]) -> bool | None:
    """Thinking on/off as the API dialects say it: OpenRouter `reasoning.enabled` /
    `reasoning.effort: "none"`, Moonshot `thinking.type`; None when neither does."""
    thinking = request.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") in ("enabled", "disabled"):
        return thinking["type"] == "enabled"
    reasoning = request.get("reasoning")
    if isinstance(reasoning, dict):
        if reasoning.get("effort") == "none":
            return False
        if isinstance(reasoning.get("enabled"), bool):
            return reasoning["enabled"]
        if reasoning.get("effort") or reasoning.get("max_tokens"):
            return True
    return None


def reasoning_excluded(request: dict[str, Any]) -> bool:
    """OpenRouter's `reasoning.exclude`: the model reasons, the response leaves it out."""
    reasoning = request.get("reasoning")
    return isinstance(reasoning, dict) and reasoning.get("exclude") is True
