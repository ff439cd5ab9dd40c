"""BASELINE for bench/streaming.py: specregen/client/sse.py (today specregen/wire/stream.py)
as it was before issue 11 made the stream path cheap (str lines from httpx, json.loads, a
field-by-field assembler). Frozen here so the benchmark measures before and after in the same
run; not used by the library.

Server-sent events of a chat-completions stream, assembled into one `chat.completion` body.

The assembled body has the shape of the non-streaming response for every field reconstruction
reads: `message.content` / `reasoning` / `reasoning_content` / `reasoning_details` / `tool_calls`,
`finish_reason`, `native_finish_reason`, `usage`, `provider`, `model`, `id`, and vLLM's
`prompt_token_ids` / choice `token_ids`. Text pieces are concatenated as received: no stripping,
no re-encoding, and tool-call `arguments` stay the exact string the server sent in fragments.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

DONE = "[DONE]"
TEXT_FIELDS = ("content", "reasoning", "reasoning_content")
# Top-level fields copied from the first chunk that has them.
TOP_FIELDS = ("id", "created", "model", "provider", "system_fingerprint", "service_tier")
# Text parts of a `reasoning_details` item that arrive in pieces.
DETAIL_TEXT_KEYS = ("text", "summary", "data")


class StreamError(Exception):
    """The stream carried an error (an `error` event or an object with an `error` field)."""

    def __init__(self, message: str, code: Any = None) -> None:
        super().__init__(message)
        self.code = code


class StreamDecodeError(ValueError):
    """A `data:` payload that is not a JSON object."""


@dataclass(slots=True)
class SSEEvent:
    data: str
    event: str | None = None


@dataclass(slots=True)
class SSEDecoder:
    """Line-by-line SSE parser (https://html.spec.whatwg.org/multipage/server-sent-events.html).

    Comment lines (`: OPENROUTER PROCESSING`) are keep-alives and produce nothing; `feed` returns
    an event when a blank line ends one, `close` flushes an event the server did not terminate.
    """

    _data: list[str] = field(default_factory=list)
    _event: str | None = None
    comments: int = 0

    def feed(self, line: str) -> SSEEvent | None:
        line = line.rstrip("\r\n")
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            self.comments += 1
            return None
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        # `id` and `retry` matter only to browsers reconnecting; a chat stream is not resumable.
        return None

    def close(self) -> SSEEvent | None:
        return self._dispatch()

    def _dispatch(self) -> SSEEvent | None:
        if not self._data:
            self._event = None
            return None
        event = SSEEvent(data="\n".join(self._data), event=self._event)
        self._data = []
        self._event = None
        return event


def parse_event(event: SSEEvent) -> dict[str, Any] | None:
    """The JSON chunk of an event; None for `[DONE]`. Raises StreamError on error events."""
    if event.data.strip() == DONE:
        return None
    try:
        chunk = json.loads(event.data)
    except json.JSONDecodeError as exc:
        if event.event == "error":
            raise StreamError(f"stream error event: {event.data[:500]}") from None
        raise StreamDecodeError(f"stream chunk is not JSON: {exc}") from None
    if event.event == "error" or (isinstance(chunk, dict) and chunk.get("error")):
        error = chunk.get("error") if isinstance(chunk, dict) else chunk
        raise StreamError(f"stream error: {error_text(error)}", code=error_code(error))
    if not isinstance(chunk, dict):
        raise StreamDecodeError(f"stream chunk is a {type(chunk).__name__}, not an object")
    return chunk


def error_text(error: Any) -> str:
    if isinstance(error, dict):
        code = error.get("code")
        message = error.get("message") or error.get("msg") or ""
        metadata = error.get("metadata")
        where = metadata.get("provider_name") if isinstance(metadata, dict) else None
        text = f"{code} {message}".strip() if code is not None else str(message)
        return f"{text} (provider {where})" if where else (text or json.dumps(error)[:500])
    return str(error)[:500]


def error_code(error: Any) -> Any:
    return error.get("code") if isinstance(error, dict) else None


@dataclass(slots=True)
class _Choice:
    texts: dict[str, list[str]] = field(default_factory=dict)
    role: str | None = None
    details: list[dict[str, Any]] = field(default_factory=list)
    detail_slots: dict[Any, int] = field(default_factory=dict)
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    last_call: int | None = None
    finish_reason: Any = None
    native_finish_reason: Any = None
    token_ids: list[int] | None = None
    logprobs: list[Any] | None = None
    error: Any = None
    usage: Any = None


class StreamAssembler:
    """Accumulates `chat.completion.chunk` objects; `result()` is the equivalent full body."""

    def __init__(self) -> None:
        self.top: dict[str, Any] = {}
        self.usage: dict[str, Any] | None = None
        self.prompt_token_ids: list[int] | None = None
        self.choices: dict[int, _Choice] = {}
        self.chunks = 0

    @property
    def finish_reason(self) -> Any:
        choice = self.choices.get(0)
        return choice.finish_reason if choice else None

    def add(self, chunk: dict[str, Any]) -> None:
        self.chunks += 1
        for name in TOP_FIELDS:
            if name not in self.top and chunk.get(name) is not None:
                self.top[name] = chunk[name]
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        ids = chunk.get("prompt_token_ids")
        if isinstance(ids, list):
            self.prompt_token_ids = (self.prompt_token_ids or []) + ids
        for raw in chunk.get("choices") or ():
            if isinstance(raw, dict):
                self._add_choice(raw)

    def _add_choice(self, raw: dict[str, Any]) -> None:
        index = raw.get("index", 0)
        choice = self.choices.get(index)
        if choice is None:
            choice = self.choices[index] = _Choice()
        delta = raw.get("delta")
        if isinstance(delta, dict):
            if delta.get("role"):
                choice.role = delta["role"]
            for name in TEXT_FIELDS:
                if name in delta:
                    pieces = choice.texts.setdefault(name, [])
                    if isinstance(delta[name], str):
                        pieces.append(delta[name])
            details = delta.get("reasoning_details")
            if isinstance(details, list):
                for item in details:
                    if isinstance(item, dict):
                        _merge_detail(choice, item)
            calls = delta.get("tool_calls")
            if isinstance(calls, list):
                for fragment in calls:
                    if isinstance(fragment, dict):
                        _merge_call(choice, fragment)
        if raw.get("finish_reason") is not None:
            choice.finish_reason = raw["finish_reason"]
        if raw.get("native_finish_reason") is not None:
            choice.native_finish_reason = raw["native_finish_reason"]
        ids = raw.get("token_ids")
        if isinstance(ids, list):
            choice.token_ids = (choice.token_ids or []) + ids
        logprobs = raw.get("logprobs")
        if isinstance(logprobs, dict) and isinstance(logprobs.get("content"), list):
            choice.logprobs = (choice.logprobs or []) + logprobs["content"]
        if raw.get("error"):
            choice.error = raw["error"]
        if raw.get("usage"):
            # Moonshot reports usage inside the last chunk's choice.
            choice.usage = raw["usage"]

    def result(self) -> dict[str, Any]:
        body: dict[str, Any] = {**self.top, "object": "chat.completion", "choices": []}
        for index in sorted(self.choices):
            choice = self.choices[index]
            message: dict[str, Any] = {"role": choice.role or "assistant", "content": None}
            for name in TEXT_FIELDS:
                if name in choice.texts:
                    pieces = choice.texts[name]
                    # A field that only ever came as null stays null, as it would unstreamed.
                    message[name] = "".join(pieces) if pieces else None
            if choice.details:
                message["reasoning_details"] = choice.details
            if choice.calls:
                message["tool_calls"] = [choice.calls[i] for i in sorted(choice.calls)]
            out: dict[str, Any] = {
                "index": index,
                "message": message,
                "finish_reason": choice.finish_reason,
            }
            if choice.native_finish_reason is not None:
                out["native_finish_reason"] = choice.native_finish_reason
            if choice.token_ids is not None:
                out["token_ids"] = choice.token_ids
            if choice.logprobs is not None:
                out["logprobs"] = {"content": choice.logprobs}
            if choice.error is not None:
                out["error"] = choice.error
            body["choices"].append(out)
        usage = self.usage
        if usage is None and 0 in self.choices:
            usage = self.choices[0].usage
        if usage is not None:
            body["usage"] = usage
        if self.prompt_token_ids is not None:
            body["prompt_token_ids"] = self.prompt_token_ids
        return body


def _merge_detail(choice: _Choice, item: dict[str, Any]) -> None:
    # Pieces of one reasoning block share `index`; without one, a piece continues the last
    # block of the same type (the non-streamed response has one block per index).
    kind = item.get("type")
    key = ("index", item["index"]) if item.get("index") is not None else ("type", kind)
    slot = choice.detail_slots.get(key)
    if slot is None or (key[0] == "type" and choice.details[slot].get("type") != kind):
        choice.detail_slots[key] = len(choice.details)
        choice.details.append(dict(item))
        return
    merged = choice.details[slot]
    for name, value in item.items():
        if name in DETAIL_TEXT_KEYS and isinstance(value, str):
            merged[name] = (merged.get(name) or "") + value
        elif value is not None and (name == "signature" or merged.get(name) is None):
            merged[name] = value


def _merge_call(choice: _Choice, fragment: dict[str, Any]) -> None:
    index = fragment.get("index")
    if not isinstance(index, int):
        # No index: a fragment with an id opens a new call, one without continues the last.
        if fragment.get("id") or choice.last_call is None:
            index = max(choice.calls, default=-1) + 1
        else:
            index = choice.last_call
    call = choice.calls.get(index)
    if call is None:
        call = choice.calls[index] = {
            "id": None,
            "type": "function",
            "function": {"name": None, "arguments": ""},
        }
    choice.last_call = index
    if fragment.get("id") and not call["id"]:
        call["id"] = fragment["id"]
    if fragment.get("type"):
        call["type"] = fragment["type"]
    function = fragment.get("function")
    if isinstance(function, dict):
        if function.get("name") and not call["function"]["name"]:
            call["function"]["name"] = function["name"]
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            call["function"]["arguments"] += arguments
        elif arguments is not None:
            # A stack that sends the arguments as an object sends them whole; keep it as sent
            # (normalize turns it into text and the gate sees it).
            call["function"]["arguments"] = arguments


def assemble_lines(lines: Iterable[str]) -> tuple[dict[str, Any], bool]:
    """The assembled body of a whole SSE text, and whether `[DONE]` was seen (for tests/tools)."""
    decoder = SSEDecoder()
    assembler = StreamAssembler()
    done = False

    def handle(event: SSEEvent | None) -> None:
        nonlocal done
        if event is None or done:
            return
        chunk = parse_event(event)
        if chunk is None:
            done = True
        else:
            assembler.add(chunk)

    for line in lines:
        handle(decoder.feed(line))
    handle(decoder.close())
    return assembler.result(), done
