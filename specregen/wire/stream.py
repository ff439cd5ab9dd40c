"""Server-sent events of a chat-completions stream, assembled into one `chat.completion` body.

The assembled body has the shape of the non-streaming response for every field reconstruction
reads: `message.content` / `reasoning` / `reasoning_content` / `reasoning_details` / `tool_calls`,
`finish_reason`, `native_finish_reason`, `usage`, `provider`, `model`, `id`, and vLLM's
`prompt_token_ids` / choice `token_ids`; a choice with tool calls also gets `STREAM_KEY`, where
the content stood against the calls (which only a stream shows). Text pieces are concatenated
as received: no stripping, no re-encoding, and tool-call `arguments` stay the exact string the
server sent in fragments.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from specregen.wire.response import STREAM_KEY

DONE = "[DONE]"
TEXT_FIELDS = ("content", "reasoning", "reasoning_content")
_TEXT_SET = frozenset(TEXT_FIELDS)
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


class SSEByteDecoder:
    """The SSE parser of the stream path: network chunks (bytes) in, complete events out.

    A K2.5 answer is thousands of events and a client keeps thousands of streams open, so this
    is the per-event hot loop (bench/streaming.py): it splits whole chunks at once instead of
    decoding text and yielding lines one by one, keeps each `data:` payload as bytes (the JSON
    parser takes bytes), and allocates nothing for comment lines. `feed` returns
    `(data, event name or None)` for every event a blank line completed.
    """

    __slots__ = ("_data", "_event", "_tail", "comments")

    def __init__(self) -> None:
        self._tail = b""
        self._data: list[bytes] = []
        self._event: bytes | None = None
        self.comments = 0

    def feed(self, chunk: bytes) -> list[tuple[bytes, bytes | None]]:
        if (not self._tail and not self._data and self._event is None
                and chunk[:6] == b"data: " and chunk[-2:] == b"\n\n"
                and chunk.count(b"\n") == 2 and b"\r" not in chunk):
            # The common case: the network chunk is exactly one `data:` event.
            return [(chunk[6:-2], None)]
        buf = self._tail + chunk if self._tail else chunk
        if b"\r" in buf:
            # CRLF and lone CR end lines too (the SSE spec); rare, so handled off the fast path.
            # A CR at the very end may be the first half of a CRLF: kept for the next chunk.
            hold = buf.endswith(b"\r")
            if hold:
                buf = buf[:-1]
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            if hold:
                buf += b"\r"
        lines = buf.split(b"\n")
        self._tail = lines.pop()
        out: list[tuple[bytes, bytes | None]] = []
        data = self._data
        for line in lines:
            if not line:
                if data:
                    out.append((data[0] if len(data) == 1 else b"\n".join(data), self._event))
                    data = self._data = []
                self._event = None
            elif line[0] == 58:  # ':' a comment: OpenRouter's keep-alive
                self.comments += 1
            elif line.startswith(b"data:"):
                data.append(line[6:] if line[5:6] == b" " else line[5:])
            elif line.startswith(b"event:"):
                value = line[6:]
                self._event = value[1:] if value[:1] == b" " else value
            # `id` and `retry` matter only to browsers reconnecting.
        return out

    def close(self) -> list[tuple[bytes, bytes | None]]:
        """Events the server did not terminate with a blank line."""
        tail = self._tail.rstrip(b"\r")
        self._tail = b""
        out = self.feed(tail + b"\n\n") if tail or self._data else []
        return out


def loads(data: bytes) -> Any:
    """JSON of a payload: orjson (several times faster than json), json.loads for what orjson
    refuses but Python's json took before (integers over 64 bits, lone surrogate escapes,
    invalid UTF-8 read as U+FFFD), so the fast path changes no outcome."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data.decode("utf-8", errors="replace"))


def parse_data(data: bytes, event: bytes | None = None) -> dict[str, Any] | None:
    """`parse_event` for the byte decoder's events."""
    if data == b"[DONE]" or (len(data) < 16 and data.strip() == b"[DONE]"):
        return None
    try:
        chunk = loads(data)
    except json.JSONDecodeError as exc:
        if event == b"error":
            text = data[:500].decode("utf-8", errors="replace")
            raise StreamError(f"stream error event: {text}") from None
        raise StreamDecodeError(f"stream chunk is not JSON: {exc}") from None
    if type(chunk) is dict:
        if event is None and not chunk.get("error"):
            return chunk
    elif event != b"error":
        raise StreamDecodeError(f"stream chunk is a {type(chunk).__name__}, not an object")
    error = chunk.get("error") if isinstance(chunk, dict) else chunk
    if event == b"error" or error:
        raise StreamError(f"stream error: {error_text(error)}", code=error_code(error))
    return chunk


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


class StreamParser:
    """Network chunks of one stream in, assembled answer out: the SSE decoder, the JSON parse
    and the assembler in one call per chunk (the stream path's per-event loop). `feed` returns
    True once `[DONE]` arrived; `close` reads what the server did not terminate.

    Measured and dropped (docs/batch.md): reading events shaped like the previous one from a
    byte template with only their strings parsed was 1.3-1.4x SLOWER than orjson's full parse
    of the ~300-byte event (about 1 us), whose Python-side work is what remains per event.
    """

    __slots__ = ("assembler", "decoder")

    def __init__(self, assembler: StreamAssembler | None = None) -> None:
        self.decoder = SSEByteDecoder()
        self.assembler = assembler if assembler is not None else StreamAssembler()

    def feed(self, chunk: bytes) -> bool:
        add = self.assembler.add
        for data, name in self.decoder.feed(chunk):
            part = parse_data(data, name)
            if part is None:
                return True
            add(part)
        return False

    def close(self) -> bool:
        add = self.assembler.add
        for data, name in self.decoder.close():
            part = parse_data(data, name)
            if part is None:
                return True
            add(part)
        return False


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
    detail_text: dict[tuple[int, str], list[str]] = field(default_factory=dict)
    detail_slots: dict[Any, int] = field(default_factory=dict)
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    last_call: int | None = None
    finish_reason: Any = None
    native_finish_reason: Any = None
    token_ids: list[int] | None = None
    logprobs: list[Any] | None = None
    error: Any = None
    usage: Any = None
    # Chars of content received before each tool call's first fragment (by call index): the
    # stream tool parsers send text written after the section (or between calls) as content
    # after the calls, so this is the only record of where the content stood.
    content_at_calls: dict[int, int] = field(default_factory=dict)
    # Fragments per call: a call sent whole in one delta hints at a server that parsed the
    # calls at the end, whose order of deltas says nothing about where the content stood.
    call_fragments: dict[int, int] = field(default_factory=dict)


class StreamAssembler:
    """Accumulates `chat.completion.chunk` objects; `result()` is the equivalent full body."""

    def __init__(self) -> None:
        self.top: dict[str, Any] = {}
        self.usage: dict[str, Any] | None = None
        self.prompt_token_ids: list[int] | None = None
        self.choices: dict[int, _Choice] = {}
        self.chunks = 0
        # Top-level fields not seen yet: most chunks repeat id/model/provider, and once a field
        # is taken it is never looked at again.
        self._top_missing = list(TOP_FIELDS)

    @property
    def finish_reason(self) -> Any:
        choice = self.choices.get(0)
        return choice.finish_reason if choice else None

    def add(self, chunk: dict[str, Any]) -> None:
        # The hot path of a stream (one call per event): one pass over what the chunk holds,
        # not a lookup per field it might hold.
        self.chunks += 1
        if self._top_missing:
            found = False
            for name in self._top_missing:
                value = chunk.get(name)
                if value is not None:
                    self.top[name] = value
                    found = True
            if found:
                self._top_missing = [n for n in self._top_missing if n not in self.top]
        usage = chunk.get("usage")
        if usage:
            self.usage = usage
        if "prompt_token_ids" in chunk:
            ids = chunk["prompt_token_ids"]
            if isinstance(ids, list):
                self.prompt_token_ids = (self.prompt_token_ids or []) + ids
        choices = chunk.get("choices")
        if choices:
            for raw in choices:
                if type(raw) is dict:
                    self._add_choice(raw)

    def _add_choice(self, raw: dict[str, Any]) -> None:
        index = raw.get("index", 0)
        choice = self.choices.get(index)
        if choice is None:
            choice = self.choices[index] = _Choice()
        delta = raw.get("delta")
        if type(delta) is dict:
            texts = choice.texts
            for name, value in delta.items():
                if name in _TEXT_SET:
                    pieces = texts.get(name)
                    if pieces is None:
                        pieces = texts[name] = []
                    if type(value) is str:
                        pieces.append(value)
                elif name == "role":
                    if value:
                        choice.role = value
                elif name == "reasoning_details":
                    if isinstance(value, list):
                        for item in value:
                            if isinstance(item, dict):
                                _merge_detail(choice, item)
                elif name == "tool_calls" and isinstance(value, list):
                    for fragment in value:
                        if isinstance(fragment, dict):
                            _merge_call(choice, fragment)
        elif isinstance(delta, dict):  # a dict subclass: the general path
            self._add_choice({**raw, "delta": dict(delta)})
            return
        finish = raw.get("finish_reason")
        if finish is not None:
            choice.finish_reason = finish
            if raw.get("native_finish_reason") is not None:
                choice.native_finish_reason = raw["native_finish_reason"]
        elif raw.get("native_finish_reason") is not None:
            choice.native_finish_reason = raw["native_finish_reason"]
        if ("token_ids" in raw or "error" in raw or "usage" in raw
                or raw.get("logprobs") is not None):
            self._rare_choice_fields(choice, raw)

    @staticmethod
    def _rare_choice_fields(choice: _Choice, raw: dict[str, Any]) -> None:
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
                details = [dict(d) for d in choice.details]
                for (slot, name), pieces in choice.detail_text.items():
                    details[slot][name] = "".join(pieces)
                message["reasoning_details"] = details
            out: dict[str, Any] = {
                "index": index,
                "message": message,
                "finish_reason": choice.finish_reason,
            }
            if choice.calls:
                order = sorted(choice.calls)
                message["tool_calls"] = [choice.calls[i] for i in order]
                out[STREAM_KEY] = {
                    "content_at_calls": [choice.content_at_calls[i] for i in order],
                    "call_fragments": [choice.call_fragments[i] for i in order],
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
    index = item.get("index")
    key: tuple[str, Any] = ("index", index) if index is not None else ("type", kind)
    slot = choice.detail_slots.get(key)
    if slot is None or (key[0] == "type" and choice.details[slot].get("type") != kind):
        choice.detail_slots[key] = len(choice.details)
        choice.details.append(dict(item))
        return
    merged = choice.details[slot]
    for name, value in item.items():
        if name in DETAIL_TEXT_KEYS and isinstance(value, str):
            # Pieces are joined once in result(): adding to a growing string per event is
            # quadratic in the length of the reasoning.
            pieces = choice.detail_text.get((slot, name))
            if pieces is None:
                first = merged.get(name)
                pieces = choice.detail_text[(slot, name)] = [first] if first else []
            pieces.append(value)
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
        choice.content_at_calls[index] = sum(map(len, choice.texts.get("content") or ()))
        choice.call_fragments[index] = 0
        call = choice.calls[index] = {
            "id": None,
            "type": "function",
            "function": {"name": None, "arguments": ""},
        }
    choice.call_fragments[index] += 1
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
            # (`normalize_response` turns it into text and the gate sees it).
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
