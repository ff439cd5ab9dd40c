"""What vLLM 0.32 returns for the ids K2.5 wrote (`--reasoning-parser kimi_k2
--tool-call-parser kimi_k2`; docs/vllm-0.32.md, section (A)): our restatement, the emulator's
profile `vllm`. The legacy restatement (vLLM's kimi_k2 parsers before the parser engine) is
`servers.py`'s `vllm-legacy`.

Both parsers are the same `kimi_k2` engine (`vllm032_engine.py`), run twice:

* a reasoning engine with tool parsing off: the reasoning ends at `</think>` or at a section
  begin; the section text stays in what it hands on;
* a tool engine that starts in content on what the reasoning engine left.

Plain answers run both over the whole text in text mode. Streams run the reasoning engine step
by step (ids) until it reports the end, then the tool engine. On top of the events sit the
rules of vLLM's `ParserEngine` (`_Fields`): how calls are named and numbered, what happens to
whitespace-only content and to trailing reasoning whitespace, the plain path's argument
coercion to the tool schema.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from specregen.models.kimi_k25.common import (
    ARG_BEGIN,
    CALL_BEGIN,
    CALL_END,
    IM_END,
    SECTION_BEGIN,
    SECTION_END,
    THINK,
    THINK_END,
)
from specregen.models.kimi_k25.servers import Output, Parsed, ServerCall
from specregen.models.kimi_k25.vllm032_engine import DROP_NAMES, Engine, Event, State
from specregen.models.tokenizer import Tokenizer

# How a call the model gave no usable id gets one: `functions.{name}:{n}` for a Kimi model type
# (`kimi_k2`, `kimi_k25`, `kimi_k3` in the model's config), else `chatcmpl-tool-` and 16 hex
# digits (`renderers/chat_utils.py:make_tool_call_id`).
IdType = Literal["kimi", "random"]

# The header's id: its longest leading run on one line ending in `:digits`.
_HEADER_ID = re.compile(r"(?P<id>.+:\d+)")
_NAME_IN_ARGS = re.compile(r'"name"\s*:\s*"([^"]*)"')


def parser_thinking(request: dict[str, Any]) -> bool:
    """The parser's thinking switch: on unless `thinking` or `enable_thinking` say otherwise
    (either truthy turns it on); `reasoning_effort` stands in for an absent `enable_thinking`
    (`"none"` is off). The K2.5 template reads only `thinking`, so the two can disagree."""
    kwargs = request.get("chat_template_kwargs")
    kwargs = kwargs if isinstance(kwargs, dict) else {}
    thinking = kwargs.get("thinking")
    enable = kwargs.get("enable_thinking")
    effort = request.get("reasoning_effort")
    if "enable_thinking" not in kwargs and effort is not None:
        enable = effort != "none"
    if thinking is None and enable is None:
        return True
    return bool(thinking) or bool(enable)


def marker_ids(tok: Tokenizer) -> dict[int, str]:
    """Every id the engine may treat as a terminal: the markers and the drop tokens."""
    names = (*DROP_NAMES, THINK, THINK_END, SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARG_BEGIN,
             CALL_END)
    return {tok.added_tokens[n]: n for n in names if n in tok.added_tokens}


def _tool_choice(request: dict[str, Any]) -> str:
    """auto | none | required | named (a tool_choice object), as vLLM defaults it."""
    choice = request.get("tool_choice")
    if isinstance(choice, dict):
        return "named"
    if choice in ("none", "required", "auto"):
        return str(choice)
    return "auto" if request.get("tools") else "none"


# ---------------------------------------------------------------------------------------------
# The ParserEngine's fields: calls, content and reasoning out of events


@dataclass
class _Slot:
    header: str = ""  # the header text until the name is sent, then the name
    args: str = ""
    id: str = ""
    sent: bool = False


@dataclass
class CallPiece:
    index: int
    id: str | None = None
    name: str | None = None
    arguments: str | None = None


@dataclass
class Piece:
    """What one step sends: the delta of a stream chunk."""

    reasoning: str | None = None
    content: str | None = None
    calls: list[CallPiece] = field(default_factory=list)


class _Fields:
    """One engine with the fields vLLM's ParserEngine keeps beside it (one per parser)."""

    def __init__(self, engine: Engine, tools: Sequence[Any] | None, *, suppress: bool,
                 ids: _IdMaker) -> None:
        self.engine = engine
        self.tools = list(tools or ())
        # tool_choice "none" with tools: call events are ignored, no call is ever started.
        self.suppress = suppress
        self.ids = ids
        self.slots: list[_Slot] = []
        self.deferred_content = ""
        self.content_seen = False  # non-whitespace content was sent
        self.deferred_reasoning = ""
        self.reasoning_ended = False

    # -- events to a step's piece (`_events_to_delta`)

    def piece(self, events: Sequence[Event], finished: bool = False) -> Piece | None:
        if not events and not self.deferred_content:
            return None
        calls: list[CallPiece] = []
        content: list[str] = []
        reasoning: list[str] = []
        carried = self.deferred_content
        tool_event = False
        for event in events:
            if event.kind == "text":
                if tool_event:
                    self.deferred_content += event.value
                else:
                    content.append(event.value)
            elif event.kind == "reasoning":
                reasoning.append(event.value)
            elif event.kind == "reasoning_end":
                self.reasoning_ended = True
            elif not self.suppress:
                tool_event = True
                self._call_event(event, calls)
        if self.deferred_content and (not tool_event or not calls):
            now = self.deferred_content[len(carried):]
            content = ([carried] if carried else []) + content + ([now] if now else [])
            self.deferred_content = ""
        text = "".join(content)
        if not self.content_seen and text:
            if text.strip():
                self.content_seen = True
            elif self.slots:
                text = ""  # whitespace-only content before a call is dropped
            elif not finished:
                self.deferred_content, text = text, ""  # held until more content comes
        joined = "".join(reasoning)
        if text or calls or joined:
            return Piece(joined or None, text or None, calls)
        return None

    def strip_reasoning(self, piece: Piece | None) -> Piece | None:
        """Trailing reasoning whitespace waits for more reasoning; once the reasoning has ended
        it is dropped (`_strip_trailing_reasoning`)."""
        if piece is not None and piece.reasoning is not None:
            combined = self.deferred_reasoning + piece.reasoning
            trimmed = combined.rstrip()
            self.deferred_reasoning = combined[len(trimmed):]
            piece.reasoning = trimmed or None
            if piece.reasoning is None and piece.content is None and not piece.calls:
                return None
        elif self.deferred_reasoning and self.reasoning_ended:
            self.deferred_reasoning = ""
        return piece

    def flush(self) -> Piece | None:
        """The engine's end (`finish_streaming`): no reasoning trimming here."""
        events = self.engine.finish()
        if events or self.deferred_content:
            return self.piece(events, finished=True)
        return None

    def _call_event(self, event: Event, out: list[CallPiece]) -> None:
        if event.kind == "call_start":
            while len(self.slots) <= event.index:
                self.slots.append(_Slot())
        elif event.kind == "name":
            self.slots[event.index].header += event.value
        elif event.kind == "args":
            self._arguments(event, out)
        elif event.kind == "call_end" and 0 <= event.index < len(self.slots):
            self._call_end(event.index, out)

    def _arguments(self, event: Event, out: list[CallPiece]) -> None:
        slot = self.slots[event.index]
        was_sent = slot.sent
        if event.value:
            slot.args += event.value
        if not slot.sent:
            if slot.header:
                self._send_name(event.index, slot.header, out)
            elif event.value:
                self._send_name(event.index, _name_in_args(slot.args), out)
        elif event.value:
            out.append(CallPiece(event.index, arguments=event.value))
        if event.value and not was_sent and slot.sent:
            # The piece that made the name go out goes with it.
            out.append(CallPiece(event.index, arguments=event.value))

    def _send_name(self, index: int, header: str | None, out: list[CallPiece]) -> None:
        slot = self.slots[index]
        call_id, name = header_id_and_name(header)
        if not name:
            slot.header = ""  # a header without `:N`: the name is lost
            return
        slot.id, slot.header, slot.sent = call_id or "", name, True
        self.ids.assign(slot, name)
        out.append(CallPiece(index, slot.id, name))

    def _call_end(self, index: int, out: list[CallPiece]) -> None:
        slot = self.slots[index]
        if slot.sent:
            return
        call_id, name = header_id_and_name(slot.header)
        if name:
            slot.id, slot.header = call_id or "", name
        # A header without `:N` and no arguments (a cut inside the header) still makes a
        # call, named by the raw header; so does a `"name"` key in the arguments.
        name = slot.header or _name_in_args(slot.args) or ""
        if name:
            slot.header, slot.sent = name, True
            self.ids.assign(slot, name)
            out.append(CallPiece(index, slot.id, name, ""))

    # -- the plain answer's calls (`_build_extracted_result`)

    def calls(self) -> list[ServerCall]:
        calls: list[ServerCall] = []
        for index, slot in enumerate(self.slots):
            if not slot.header and not slot.args:
                continue
            name = slot.header.strip()
            raw = slot.args
            if not name and raw.strip():
                name, arguments = _name_and_args(raw)
            elif raw.strip():
                arguments = raw.strip()
            else:
                arguments = "{}"
            if isinstance(name, str) and name:
                self.ids.assign(slot, name)
                arguments = coerce_arguments(arguments, name, self.tools)
                calls.append(ServerCall(slot.id, name, arguments, index))
        return calls


class _IdMaker:
    """Ids for calls whose header gave none, numbered per parser from 0 (the request's
    history is never counted on this path)."""

    def __init__(self, kind: IdType, seed: int) -> None:
        self.kind = kind
        self.count = 0
        self.rng = random.Random(seed)

    def assign(self, slot: _Slot, name: str) -> None:
        if slot.id:
            return
        if self.kind == "kimi":
            slot.id = f"functions.{name}:{self.count}"
        else:
            slot.id = f"chatcmpl-tool-{self.rng.getrandbits(64):016x}"
        self.count += 1


def header_id_and_name(header: str | None) -> tuple[str | None, str | None]:
    """The call's id and name from its header: the id is the stripped header's longest leading
    run (on its first line) ending in `:digits`, kept as written; the name is the id up to the
    first `:`, minus a leading `functions.` (`functions.a.b:1` gives `a.b`)."""
    if header is None:
        return None, None
    match = _HEADER_ID.match(header.strip())
    if match is None:
        return None, None
    call_id = match.group("id").strip()
    return call_id, call_id.split(":")[0].removeprefix("functions.")


def _name_in_args(args: str) -> str | None:
    match = _NAME_IN_ARGS.search(args)
    return match.group(1) or None if match else None


def _name_and_args(raw: str) -> tuple[Any, str]:
    # A call with no name from its header: arguments that are a JSON object may carry one.
    raw = raw.strip()
    try:
        parsed = json.loads(raw)
    except ValueError:
        return "", raw
    if not isinstance(parsed, dict):
        return "", raw
    name = parsed.get("name", "")
    for key in ("arguments", "parameters"):
        if key in parsed:
            value = parsed[key]
            return name, value if isinstance(value, str) else json.dumps(value,
                                                                         ensure_ascii=False)
    return name, json.dumps({k: v for k, v in parsed.items() if k != "name"}, ensure_ascii=False)


# ---------------------------------------------------------------------------------------------
# Argument coercion (plain answers only): values are coerced to the tool schema's types, and
# when anything changed the arguments are dumped again.


def coerce_arguments(arguments: str, name: str, tools: Sequence[Any]) -> str:
    if not tools or not name:
        return arguments
    try:
        args = json.loads(arguments)
    except ValueError:
        return arguments
    if not isinstance(args, dict):
        return arguments
    properties = _tool_properties(tools, name)
    if not properties:
        return arguments
    if _coerce_dict(args, properties):
        return json.dumps(args, ensure_ascii=False)
    return arguments


def _tool_properties(tools: Sequence[Any], name: str) -> Any:
    for tool in tools:
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            continue
        fn = tool.get("function") or {}
        if fn.get("name") == name:
            return (fn.get("parameters") or {}).get("properties", {})
    return {}


def _coerce_dict(args: dict[str, Any], properties: Any) -> bool:
    changed = False
    for key, value in args.items():
        schema = properties.get(key)
        if not isinstance(schema, dict):
            continue
        new, moved = _coerce_value(value, schema)
        if moved:
            args[key] = new
            changed = True
    return changed


def _coerce_value(value: Any, schema: dict[str, Any]) -> tuple[Any, bool]:
    if isinstance(value, str):
        new = _coerce_text(value, _schema_types(schema))
        return (new, True) if new is not value else (value, False)
    if isinstance(value, dict):
        nested = schema.get("properties")
        return value, isinstance(nested, dict) and _coerce_dict(value, nested)
    if isinstance(value, list):
        items = schema.get("items")
        changed = False
        if isinstance(items, dict):
            for i, item in enumerate(value):
                new, moved = _coerce_value(item, items)
                if moved:
                    value[i], changed = new, True
        return value, changed
    # A number, boolean or null goes through its JSON text (so 1.0 becomes 1 for a number,
    # and any of them becomes a string where the schema names no type).
    new = _coerce_text(json.dumps(value, ensure_ascii=False), _schema_types(schema))
    if type(new) is not type(value) or new != value:
        return new, True
    return value, False


_TYPE_ALIASES = {"str": "string", "text": "string", "varchar": "string", "char": "string",
                 "enum": "string", "int": "integer", "int32": "integer", "int64": "integer",
                 "uint": "integer", "uint32": "integer", "uint64": "integer", "long": "integer",
                 "short": "integer", "unsigned": "integer", "float": "number",
                 "float32": "number", "float64": "number", "double": "number",
                 "bool": "boolean", "dict": "object", "arr": "array", "list": "array",
                 "sequence": "array"}


def _schema_types(schema: Any) -> list[str]:
    """The types a schema allows: `type`, the kinds of its `enum` values, and those of its
    `anyOf`/`oneOf`/`allOf` branches; "string" when it names none."""
    if not isinstance(schema, dict):
        return ["string"]
    types: set[str] = set()
    declared = schema.get("type")
    if isinstance(declared, str):
        types.add(declared)
    elif isinstance(declared, list):
        types.update(t for t in declared if isinstance(t, str))
    enum = schema.get("enum")
    if isinstance(enum, list):
        for v in enum:
            types.add("null" if v is None else "boolean" if isinstance(v, bool)
                      else "integer" if isinstance(v, int) else "number" if isinstance(v, float)
                      else "string" if isinstance(v, str) else "array" if isinstance(v, list)
                      else "object" if isinstance(v, dict) else "string")
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list):
            for branch in schema[key]:
                types.update(_schema_types(branch))
    return list(types) if types else ["string"]


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


def _coerce_text(value: str, types: Sequence[str]) -> Any:
    """A value's text as the first of null, integer, number, boolean, object, array, string
    that the schema allows and the text can be; else its JSON reading; else the text."""
    allowed = {_TYPE_ALIASES.get(t.strip().lower(), t.strip().lower()) for t in types}
    for kind in ("null", "integer", "number", "boolean", "object", "array", "string"):
        if kind not in allowed:
            continue
        if kind == "null" and value.lower() == "null":
            return None
        if kind == "string":
            return value
        if kind == "integer":
            try:
                return int(value)
            except ValueError:
                continue
        if kind == "number":
            try:
                number = float(value)
            except ValueError:
                continue
            if math.isfinite(number):
                return number if number != int(number) else int(number)
        if kind == "boolean":
            lowered = value.lower().strip()
            if lowered in ("true", "1"):
                return True
            if lowered in ("false", "0"):
                return False
        if kind in ("object", "array"):
            try:
                parsed = json.loads(value)
            except ValueError:
                continue
            if _finite(parsed):
                return parsed
    try:
        parsed = json.loads(value)
    except ValueError:
        return value
    return parsed if _finite(parsed) else value


# ---------------------------------------------------------------------------------------------
# Plain answers


def _plain_reasoning(text: str, thinking: bool) -> tuple[str | None, str | None]:
    """The reasoning pass over the whole text: reasoning (right-stripped) and what is left."""
    if not thinking:
        return None, text
    engine = Engine(thinking, initial="reasoning", skip_tools=True)
    reasoning: list[str] = []
    content: list[str] = []
    for event in engine.parse_text(text):
        if event.kind == "reasoning":
            reasoning.append(event.value)
        elif event.kind == "text":
            content.append(event.value)
    return "".join(reasoning).rstrip() or None, "".join(content) or None


def _plain_tools(content: str, request: dict[str, Any], thinking: bool, ids: _IdMaker
                 ) -> tuple[str | None, list[ServerCall]]:
    """The tool pass over the reasoning pass's content, from the content state."""
    tools = request.get("tools") or None
    fields = _Fields(Engine(thinking, initial="content"), tools,
                     suppress=bool(tools) and _tool_choice(request) == "none", ids=ids)
    piece = fields.piece(fields.engine.parse_text(content), finished=True)
    calls = fields.calls()
    text = piece.content if piece else None
    if text and calls and not text.strip():
        text = None
    return text or None, calls


def plain(out: Output, request: dict[str, Any], *, id_type: IdType = "kimi",
          seed: int = 0) -> Parsed:
    """The non-streamed answer."""
    thinking = parser_thinking(request)
    reasoning, handed = _plain_reasoning(out.text, thinking)
    content, calls = _plain_tools(handed or "", request, thinking, _IdMaker(id_type, seed))
    engine_finish = "length" if out.truncated else "stop"
    choice = _tool_choice(request)
    if choice == "none":
        return Parsed(reasoning, content, (), engine_finish)
    if choice in ("required", "named"):
        # Parsed as auto; the message then says `content or ""`, and only `required` says
        # tool_calls (after a stop, even without a call). Without calls, a reasoning pass
        # that left only whitespace gives "".
        if not calls and not (handed or "").strip():
            content = None
        finish = "tool_calls" if choice == "required" and engine_finish == "stop" \
            else engine_finish
        return Parsed(reasoning, content or "", tuple(calls), finish)
    return Parsed(reasoning, content, tuple(calls), "tool_calls" if calls else engine_finish)


# ---------------------------------------------------------------------------------------------
# Streams


def _content_ids(ids: Sequence[int], think_end: int, section_begin: int) -> list[int]:
    """The ids of the step that ended the reasoning handed to the tool engine: those after the
    last `</think>`, or from the last section begin on."""
    ids = list(ids)
    if think_end in ids:
        return ids[len(ids) - ids[::-1].index(think_end):]
    if section_begin in ids:
        return ids[len(ids) - 1 - ids[::-1].index(section_begin):]
    return []


def _without_calls(piece: Piece | None, choice: str) -> Piece | None:
    # tool_choice "none": the tool engine still runs (sections are cut out), its calls are
    # thrown away (without tools, the chunk that held them goes out as `delta: {}`).
    if piece is not None and choice == "none":
        piece.calls = []
    return piece


@dataclass
class _Assembled:
    reasoning: list[str] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    # index -> [id, name, args]; id and name stay None when no piece named the call (the
    # end flush of a request without tools can send arguments of a call whose name went out
    # in a step whose calls were thrown away).
    calls: dict[int, list[Any]] = field(default_factory=dict)
    order: list[int] = field(default_factory=list)

    def add(self, piece: Piece | None) -> None:
        if piece is None:
            return
        if piece.reasoning:
            self.reasoning.append(piece.reasoning)
        if piece.content:
            self.content.append(piece.content)
        for call in piece.calls:
            entry = self.calls.get(call.index)
            if entry is None:
                entry = self.calls[call.index] = [call.id, call.name, ""]
                self.order.append(call.index)
            entry[2] += call.arguments or ""


def stream(out: Output, request: dict[str, Any], tok: Tokenizer, *, prompt_ended: bool,
           id_type: IdType = "kimi", seed: int = 0) -> tuple[Parsed, bool]:
    """The streamed answer as the client assembles it, and whether the reasoning engine ran
    (its count is then the stream's reasoning_tokens).

    `prompt_ended`: the reasoning check on the prompt ids said ended (scanning back, `</think>`
    or a section begin before `<think>`; with neither, ended only when thinking is off)."""
    thinking = parser_thinking(request)
    choice = _tool_choice(request)
    tools = request.get("tools") or None
    ids = marker_ids(tok)
    maker = _IdMaker(id_type, seed)
    first: State = "reasoning" if thinking else "content"
    reasoning = _Fields(Engine(thinking, initial=first, skip_tools=True, marker_ids=ids), tools,
                        suppress=False, ids=maker)
    calls = _Fields(Engine(thinking, initial="content", marker_ids=ids), tools,
                    suppress=bool(tools) and choice == "none", ids=maker)
    think_end, section_begin = tok.token_id(THINK_END), tok.token_id(SECTION_BEGIN)
    ended = prompt_ended
    ran_reasoning = False
    got = _Assembled()
    steps = [(d.text, [d.token_id]) for d in out.deltas]
    if not out.truncated:
        steps.append(("", [tok.token_id(IM_END)]))  # the stop token's step: no text
    for text, step_ids in steps:
        if not ended:
            ran_reasoning = True
            piece = reasoning.strip_reasoning(
                reasoning.piece(reasoning.engine.feed(text, step_ids)))
            if piece is not None:
                got.add(Piece(reasoning=piece.reasoning))
            if not reasoning.reasoning_ended:
                continue
            # The switch: the reasoning engine is flushed, and what it left of this step (the
            # section begin when that ended it) goes to the tool engine with the step's ids
            # after the end.
            ended = True
            flushed = reasoning.flush()
            text = ((piece.content if piece else None) or "") + \
                ((flushed.content if flushed else None) or "")
            step_ids = _content_ids(step_ids, think_end, section_begin)
        got.add(_without_calls(calls.strip_reasoning(calls.piece(calls.engine.feed(text,
                                                                                 step_ids))),
                               choice))
    # The end: the parsers are flushed; the reasoning engine only when it never ended (its
    # held trailing whitespace is then lost). What the tool engine's flush makes is sent as
    # it is: a call closed only now (cut in its header) goes out even for tool_choice "none"
    # (and then makes the finish `tool_calls`); with "none" and tools no call was started.
    got.add(reasoning.flush() if not ended else calls.flush())
    streamed = [ServerCall(got.calls[i][0], got.calls[i][1], got.calls[i][2], i)
                for i in got.order]
    engine_finish = "length" if out.truncated else "stop"
    finish = "tool_calls" if streamed and choice != "named" and engine_finish == "stop" \
        else engine_finish
    parsed = Parsed("".join(got.reasoning) if got.reasoning else None,
                    "".join(got.content) if got.content else None, tuple(streamed), finish)
    return parsed, ran_reasoning


# ---------------------------------------------------------------------------------------------
# reasoning_tokens


def prompt_ended(prompt_ids: Sequence[int], tok: Tokenizer, thinking: bool) -> bool:
    """The stream's reasoning check on the prompt: scanning back, a reasoning end (`</think>`
    with thinking on, a section begin either way) means ended, `<think>` (thinking on) means
    not; with neither, ended only when thinking is off. K2.5's prompt ends in `<think>` or
    `</think>`, so this follows the template's switch."""
    ends = {tok.token_id(SECTION_BEGIN)}
    if thinking:
        ends.add(tok.token_id(THINK_END))
    start = tok.token_id(THINK) if thinking else None
    for token_id in reversed(prompt_ids):
        if token_id in ends:
            return True
        if token_id == start:
            return False
    return not thinking


def reasoning_tokens(ids: Sequence[int], tok: Tokenizer, request: dict[str, Any],
                     out: Output | None = None) -> int:
    """The usage's reasoning share: the ordinary tokens the engine saw in the reasoning state,
    which ends at the first `</think>` or section-begin id; marker and special ids are not
    counted.

    A stream whose reasoning engine ran (`out`: its steps): a step whose text the detokenizer
    held back (incomplete UTF-8) counts nothing. Plain: the whole output is parsed again in
    token-id mode (`_plain_reasoning_tokens`)."""
    if not parser_thinking(request):
        return 0
    if out is None:
        return _plain_reasoning_tokens(ids, tok)
    terminals = marker_ids(tok)
    ends = (tok.token_id(THINK_END), tok.token_id(SECTION_BEGIN))
    count = 0
    for delta in out.deltas:
        if delta.token_id in ends:
            break
        if delta.token_id not in terminals and delta.text:
            count += 1
    return count


def _plain_reasoning_tokens(ids: Sequence[int], tok: Tokenizer) -> int:
    """The plain count: the output's ids (stop token included) and their decoded text, parsed
    once. The text is split at the terminal ids, the ordinary ids between two of them being
    one group. When every id decodes on its own to what it is in context, the groups are
    exact. Otherwise (a character split over ids) each terminal is found in the text instead,
    from the right, at its last occurrence before the next one's -- a marker or special string
    the model wrote as text can take that place -- and a group left with no text between two
    terminals is not counted."""
    terminals = marker_ids(tok)
    ends = (tok.token_id(THINK_END), tok.token_id(SECTION_BEGIN))
    groups: list[int] = [0]  # ordinary ids before each terminal, then after the last
    names: list[str] = []  # the terminals' texts
    pieces: list[str] = []
    for token_id in ids:
        name = terminals.get(token_id)
        if name is None:
            groups[-1] += 1
            pieces.append(tok.decode([token_id]))
        else:
            names.append(name)
            groups.append(0)
            pieces.append(name)
    text = tok.decode(list(ids))
    first_end = next((i for i, token_id in enumerate(t for t in ids if t in terminals)
                      if token_id in ends), len(names))
    if "".join(pieces) == text:
        return sum(groups[:first_end + 1])
    ends_at: list[int] = [0] * len(names)
    bound = len(text)
    for i in range(len(names) - 1, -1, -1):
        ends_at[i] = text.rfind(names[i], 0, bound)
        bound = max(ends_at[i], 0)
    count = 0
    consumed = 0
    for i in range(first_end + 1):
        if i == len(names):  # the text after the last terminal
            count += groups[i] if consumed < len(text) else 0
            break
        if ends_at[i] > consumed:
            count += groups[i]
        consumed = ends_at[i] + len(names[i])
    return count
