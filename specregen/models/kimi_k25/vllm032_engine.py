"""vLLM 0.32's parser engine as the `kimi_k2` config drives it: the lexer and the state machine
that turn K2.5's text into events (docs/vllm-0.32.md, sections 2.1 and 2.2). Written in our own
words from that reading; `vllm032.py` turns the events into the answer's fields.

The engine sees text, and in a stream also the token ids of each step:

* Terminals: the five tool markers always, `<think>` and `</think>` only with thinking on (off,
  they are plain text), and every special token of K2.5's table that is not a terminal
  (`DROP_NAMES`), which is deleted wherever it is met.
* Text mode (every plain parse): the terminals are found as strings, leftmost and longest
  first, so marker text the model wrote as ordinary characters acts like the real token.
* Token-id mode (streams): the terminals are the ids; marker text written as characters is
  plain text. Text that could still become a marker string (`<`, `<|tool_`, `[EO`) is held
  until it cannot, or until the stream ends; that changes where a stream cuts its pieces, and
  so what its reasoning-whitespace rule sees (`vllm032.py`).
* States: reasoning, content, preamble (inside a section, before a call), name (the call's
  header), args, between (after a call). Text in preamble and between is discarded. A terminal
  with no move from the current state is text of that state (a drop terminal vanishes).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from specregen.models.kimi_k25.common import (
    ARG_BEGIN,
    CALL_BEGIN,
    CALL_END,
    SECTION_BEGIN,
    SECTION_END,
    THINK,
    THINK_END,
)

State = Literal["reasoning", "content", "preamble", "name", "args", "between"]
EventKind = Literal["reasoning", "text", "name", "args", "reasoning_end", "call_start",
                    "call_end"]

# The special tokens of K2.5's tokenizer_config.json (`special: true`): the engine's drop
# terminals, matched by id and, in text mode, by their text.
DROP_NAMES: tuple[str, ...] = (
    "[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|start_header_id|>",
    "<|end_header_id|>", "[EOT]", "<|im_system|>", "<|im_middle|>", "<|media_begin|>",
    "<|media_content|>", "<|media_end|>", "<|media_pad|>", "[UNK]", "[PAD]",
)
DROP = "drop"
TOOL_TERMINALS = frozenset({SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARG_BEGIN, CALL_END})
TOOL_STATES: frozenset[State] = frozenset({"preamble", "name", "args", "between"})

# (state, terminal) -> (next state, events). The three `<think>` rows exist only with
# thinking on. Rows missing here: the terminal is text of the state (`Engine.terminal`).
_THINKING_MOVES: dict[tuple[State, str], tuple[State, tuple[EventKind, ...]]] = {
    ("reasoning", THINK): ("reasoning", ()),  # a `<think>` inside the reasoning vanishes
    ("reasoning", THINK_END): ("content", ("reasoning_end",)),
    ("content", THINK_END): ("content", ()),  # a later `</think>` vanishes
}
_TOOL_MOVES: dict[tuple[State, str], tuple[State, tuple[EventKind, ...]]] = {
    ("reasoning", SECTION_BEGIN): ("preamble", ("reasoning_end",)),
    ("content", SECTION_BEGIN): ("preamble", ()),
    ("preamble", CALL_BEGIN): ("name", ("call_start",)),
    ("name", ARG_BEGIN): ("args", ()),
    ("args", CALL_END): ("between", ("call_end",)),
    ("args", SECTION_END): ("preamble", ("call_end",)),
    ("between", CALL_BEGIN): ("name", ("call_start",)),
    # After a section the engine stays in a tool state: text after it is never content.
    ("preamble", SECTION_END): ("preamble", ()),
    ("between", SECTION_END): ("preamble", ()),
}
_TEXT_EVENT: dict[State, EventKind] = {"reasoning": "reasoning", "content": "text",
                                       "name": "name", "args": "args"}


@dataclass(frozen=True, slots=True)
class Event:
    kind: EventKind
    value: str = ""
    index: int = -1  # the call a call event or a header/argument piece belongs to


def terminal_strings(thinking: bool) -> tuple[str, ...]:
    """Every string the lexer knows: the config's terminals and the drop names."""
    think = (THINK, THINK_END) if thinking else ()
    return (*think, *TOOL_TERMINALS, *DROP_NAMES)


class Engine:
    """One kimi_k2 engine. `skip_tools` is the reasoning pass: tool parsing off, where a
    section begin met in the reasoning still ends it and stays in the text handed on."""

    def __init__(self, thinking: bool, *, initial: State, skip_tools: bool = False,
                 marker_ids: dict[int, str] | None = None) -> None:
        self.thinking = thinking
        self.skip_tools = skip_tools
        self.moves = {**(_THINKING_MOVES if thinking else {}), **_TOOL_MOVES}
        self.strings = terminal_strings(thinking)
        # Longest first: at one position the longest terminal string wins.
        self._pattern = re.compile("|".join(re.escape(s) for s in
                                            sorted(self.strings, key=len, reverse=True)))
        self._prefixes = frozenset(s[:i] for s in self.strings for i in range(1, len(s)))
        self._first_chars = frozenset(s[0] for s in self.strings)
        # Streams: id -> its terminal string (a drop id's is its name).
        self.marker_ids = {i: t for i, t in (marker_ids or {}).items() if t in self.strings}
        self.state: State = initial
        self.index = -1
        self._held = ""  # token-id mode: text that may still become a terminal string
        # Arguments go out a character at a time; a closing `}`/`]` at depth 0 waits for the
        # next character (or the call's end): JSON-aware, strings and escapes tracked.
        self._args = ""
        self._depth = 0
        self._in_string = False
        self._escape = False

    # -- text mode

    def parse_text(self, text: str) -> list[Event]:
        """A whole text in text mode (the plain path), with the end of input."""
        events: list[Event] = []
        pos = 0
        for match in self._pattern.finditer(text):
            events += self._text(text[pos:match.start()])
            found = match.group()
            events += self.terminal(DROP if found in DROP_NAMES else found)
            pos = match.end()
        events += self._text(text[pos:])
        return events + self.finish()

    # -- token-id mode

    def feed(self, text: str, ids: Sequence[int]) -> list[Event]:
        """One stream step: its detokenized text and its ids. A terminal id splits the text at
        its string: what comes before belongs to the state before it (the detokenizer's
        inserted space, or text it had held back)."""
        events: list[Event] = []
        for token_id in ids:
            shown = self.marker_ids.get(token_id)
            cut = text.find(shown) if shown else -1
            if shown is None or cut < 0:
                # Not a terminal; or the stop token, which has no text and vanishes.
                continue
            events += self._held_text(text[:cut])
            events += self._flush_held()
            events += self.terminal(DROP if shown in DROP_NAMES else shown)
            text = text[cut + len(shown):]
        return events + self._held_text(text)

    def _held_text(self, text: str) -> list[Event]:
        if not text:
            return []
        buffer = self._held + text
        keep = len(buffer)
        for i, ch in enumerate(buffer):
            if ch in self._first_chars and buffer[i:] in self._prefixes:
                keep = i
                break
        self._held = buffer[keep:]
        return self._text(buffer[:keep])

    def _flush_held(self) -> list[Event]:
        held, self._held = self._held, ""
        return self._text(held)

    # -- both

    def finish(self) -> list[Event]:
        """The end of the output: held text goes out, an open call is closed (the last call
        gets a second close when the answer ended after it; harmless), reasoning ends."""
        events = self._flush_held() + self._flush_args()
        if self.state in TOOL_STATES:
            if self.index >= 0:
                events.append(Event("call_end", index=self.index))
            self.state = "content"
        elif self.state == "reasoning":
            events.append(Event("reasoning_end"))
            self.state = "content"
        return events

    def terminal(self, name: str) -> list[Event]:
        move = self.moves.get((self.state, name))
        if move is None:
            return [] if name == DROP else self._text(name)
        if self.skip_tools and name in TOOL_TERMINALS:
            if "reasoning_end" in move[1]:
                self.state = "content"
                return [Event("reasoning_end"), Event("text", name)]
            kind = _TEXT_EVENT.get(self.state)
            return [Event(kind, name, self.index)] if kind else []
        events = self._flush_args() if move[0] != "args" else []
        self.state = move[0]
        if self.state == "args":
            self._depth, self._in_string, self._escape = 0, False, False
        for kind in move[1]:
            if kind == "call_start":
                self.index += 1
            events.append(Event(kind, index=self.index))
        return events

    def _text(self, text: str) -> list[Event]:
        kind = _TEXT_EVENT.get(self.state)
        if not text or kind is None:
            return []
        if kind == "args":
            return [e for ch in text if (e := self._args_char(ch)) is not None]
        return [Event(kind, text, self.index)]

    def _args_char(self, ch: str) -> Event | None:
        self._args += ch
        if self._escape:
            self._escape = False
        elif self._in_string:
            self._escape = ch == "\\"
            self._in_string = ch != '"'
        elif ch == '"':
            self._in_string = True
        elif ch in "{[":
            self._depth += 1
        elif ch in "}]":
            self._depth = max(0, self._depth - 1)
            if self._depth == 0:
                return None  # the object may be complete: wait for what follows
        out, self._args = self._args, ""
        return Event("args", out, self.index)

    def _flush_args(self) -> list[Event]:
        out, self._args = self._args, ""
        return [Event("args", out, self.index)] if out else []

