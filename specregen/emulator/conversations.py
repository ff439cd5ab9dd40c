"""The emulator's conversation mode (issue 10): answers that follow a dataset conversation, or
diverge from it, so a turn-by-turn run meets both matching and differing calls.

Started with a JSONL of whole conversations (the prompt lines `specregen infer` reads), the
emulator recognises a request by its first user message and finds where the request stands in
the conversation the way `specregen.conversation.plan` counts: user turn k (a turn opens at a
user message that follows an assistant or tool message, or the start) and step j (the assistant
messages since the last turn opened). With probability `1 - divergence_rate` it says what the
dataset's step j says (its calls, parallel ones included, or its text answer), else something
else, chosen by the same seed: other arguments, another tool, text where the dataset called, or
calls where it answered.

This module decides WHAT the model says (a `Script`: content and calls as JSON values); the
format's own generation writes it as ids (reasoning included when thinking is on), numbers the
calls by its id policy, and the profile's parsers return it. The decision is seeded by
(conversation id, k, j, emulator seed) only -- never by request count, time or the earlier
answers' text -- so a rerun after a crash gets the same answers. Nothing in the request but
the conversation itself is read: nothing test-only travels in a request.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from specregen.conversation.plan import ConversationError, ConversationPlan, plan_conversation
from specregen.models import textgen
from specregen.records import Prompt

Divergence = Literal["other_arguments", "other_tool", "text", "calls"]


@dataclass(frozen=True, slots=True)
class ScriptCall:
    """One call the model makes: `arguments` is the JSON value it writes (each format writes it
    its own way); `text` is the dataset's arguments verbatim when they are not JSON (a format
    that writes arguments as text writes them so; Qwen3 writes `arguments`, then a string)."""

    name: str
    arguments: Any
    text: str | None = None


@dataclass(frozen=True, slots=True)
class Script:
    """What the model says to one recognised request.

    `content`: the answer text (with calls: the text before them); None lets the format's
    generation write its own text. `calls` empty: a text answer. Reasoning is never scripted:
    the format writes it when thinking is on.
    """

    conversation_id: str
    user_turn: int
    step: int
    content: str | None
    calls: tuple[ScriptCall, ...]
    divergence: Divergence | None  # None: the dataset's own step


@dataclass(frozen=True, slots=True)
class Position:
    """Where a request stands: the user texts of its turns, and step j of its last turn."""

    users: tuple[tuple[str, ...], ...]  # per user turn, the texts of its opening messages
    step: int

    @property
    def user_turn(self) -> int:
        return len(self.users) - 1


@dataclass
class ConversationBook:
    """The dataset's conversations by their first user message, in file order."""

    by_first_user: dict[str, list[ConversationPlan]] = field(default_factory=dict)
    # (line number, reason) of every line that could not become a conversation.
    rejected: list[tuple[int, str]] = field(default_factory=list)

    @property
    def size(self) -> int:
        return sum(len(plans) for plans in self.by_first_user.values())

    @classmethod
    def load(cls, path: str | Path) -> ConversationBook:
        """Read a JSONL of prompt lines; a bad line is skipped and kept in `rejected`."""
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"conversations file {str(path)!r} does not exist")
        with path.open("rb") as handle:
            return cls.from_lines(handle)

    @classmethod
    def from_lines(cls, lines: Iterable[bytes | str]) -> ConversationBook:
        book = cls()
        for number, line in enumerate(lines, start=1):
            text = line.decode("utf-8", errors="replace") if isinstance(line, bytes) else line
            if not text.strip():
                continue
            try:
                plan = plan_conversation(_prompt(text))
            except (ConversationError, ValueError) as exc:
                book.rejected.append((number, str(exc)))
                continue
            first = _user_texts(plan.turns[0].user)[0]
            book.by_first_user.setdefault(first, []).append(plan)
        return book

    def find(self, messages: Sequence[dict[str, Any]]) -> tuple[ConversationPlan, Position] | None:
        """The conversation a request continues and its position there, or None."""
        position = request_position(messages)
        if position is None:
            return None
        for plan in self.by_first_user.get(position.users[0][0], ()):
            # Every user turn so far must be the dataset's (two conversations may share an
            # opening question); the first such conversation in the file wins.
            k = position.user_turn
            if k < len(plan.turns) and all(
                    _user_texts(plan.turns[i].user) == position.users[i] for i in range(k + 1)):
                return plan, position
        return None

    def script(self, request: dict[str, Any], seed: int, divergence_rate: float
               ) -> Script | None:
        """What the model says to `request`, or None when it continues no known conversation
        (the emulator then answers as it always does)."""
        messages = request.get("messages")
        if not isinstance(messages, list):
            return None
        found = self.find(messages)
        if found is None:
            return None
        plan, position = found
        return decide(plan, position, _declared(request, plan), seed, divergence_rate)


def request_position(messages: Sequence[dict[str, Any]]) -> Position | None:
    """User turns and the step of a request, counted as `conversation.plan` counts them: system
    messages before the first user message are the prefix; a user (or system) message after an
    assistant message opens a new turn; consecutive ones belong to one turn."""
    users: list[list[str]] = []
    step = 0
    for message in messages:
        role = message.get("role")
        if role == "system" and not users:
            continue
        if role in ("user", "system"):
            if not users or step:
                users.append([])
                step = 0
            users[-1].append(_text(message.get("content")))
        elif role == "assistant" and users:
            step += 1
    if not users:
        return None
    return Position(tuple(tuple(u) for u in users), step)


def decide(plan: ConversationPlan, position: Position, tools: Sequence[dict[str, Any]],
           seed: int, divergence_rate: float) -> Script:
    """The dataset's step at `position`, or a divergence from it, by the seeded draw."""
    k, j = position.user_turn, position.step
    rng = random.Random(conversation_seed(plan.conversation_id, k, j, seed))
    steps = plan.turns[k].steps
    dataset = steps[j] if j < len(steps) else None
    dataset_calls = tuple(_script_call(c.name, c.arguments) for c in dataset.calls) \
        if dataset is not None else ()
    # Drawn first and always, so the rate alone decides whether the dataset is followed.
    diverge = rng.random() < divergence_rate
    options: list[Divergence] = []
    if diverge:
        if dataset_calls:
            if any(_other_tools(tools, c.name) for c in dataset_calls):
                options.append("other_tool")
            options += ["other_arguments", "text"]
        elif tools:
            options.append("calls")
    if not options:
        if dataset is None:
            # The dataset's turn ends before step j (its calls were the last word): a text
            # answer is what ends a turn.
            return Script(plan.conversation_id, k, j, None, (), None)
        content = dataset.message.get("content")
        text = _text(content) if content is not None else ""
        return Script(plan.conversation_id, k, j, text, dataset_calls, None)
    kind = rng.choice(options)
    if kind == "text":
        return Script(plan.conversation_id, k, j, None, (), kind)
    if kind == "calls":
        count = 1 if rng.random() < 0.75 else 2
        calls = tuple(_generated_call(rng, rng.choice(tools)) for _ in range(count))
        return Script(plan.conversation_id, k, j, "", calls, kind)
    calls_list = list(dataset_calls)
    if kind == "other_tool":
        candidates = [i for i, c in enumerate(calls_list) if _other_tools(tools, c.name)]
        i = rng.choice(candidates)
        calls_list[i] = _generated_call(rng, rng.choice(_other_tools(tools, calls_list[i].name)))
    else:
        i = rng.randrange(len(calls_list))
        calls_list[i] = ScriptCall(calls_list[i].name, _other_arguments(rng, calls_list[i]))
    content = dataset.message.get("content") if dataset is not None else None
    return Script(plan.conversation_id, k, j, _text(content) if content is not None else "",
                  tuple(calls_list), kind)


def conversation_seed(conversation_id: str, user_turn: int, step: int, seed: int) -> int:
    """The seed of one position's decision (sha256: stable across processes, unlike hash())."""
    key = json.dumps(["conversation", conversation_id, user_turn, step, seed])
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:16], "big")


# -- helpers -------------------------------------------------------------------------------------


def _prompt(line: str) -> Prompt:
    """A prompt line's conversation (the fields the emulator reads; `plan_conversation` checks
    the messages' structure), with the emulator's own reasons for a line it skips (its
    warnings print them); `client.prompts.parse_prompt_line` is the client's stricter reading."""
    row = json.loads(line)
    if not isinstance(row, dict):
        raise ValueError(f"a JSON {type(row).__name__}, not an object")
    sample_id = row.get("sample_id")
    if not isinstance(sample_id, str) or not sample_id.strip():
        raise ValueError("'sample_id' is missing or not a non-empty string")
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        raise ValueError(f"sample {sample_id}: 'messages' is not a list of objects with a role")
    tools = row.get("tools")
    if tools is not None and not (isinstance(tools, list)
                                  and all(isinstance(t, dict) for t in tools)):
        raise ValueError(f"sample {sample_id}: 'tools' is not a list of objects")
    return Prompt(sample_id=sample_id, messages=messages, tools=tools or None, turns="all")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text") or "" for p in content
                       if isinstance(p, dict) and p.get("type") == "text")
    return ""


def _user_texts(messages: Sequence[dict[str, Any]]) -> tuple[str, ...]:
    return tuple(_text(m.get("content")) for m in messages)


def _script_call(name: str, arguments: str) -> ScriptCall:
    try:
        return ScriptCall(name, json.loads(arguments))
    except (json.JSONDecodeError, ValueError):
        # Not JSON: only written verbatim can it still match the dataset (compared as text).
        return ScriptCall(name, arguments, arguments)


def _declared(request: dict[str, Any], plan: ConversationPlan) -> list[dict[str, Any]]:
    """Function objects of the request's tools, else the conversation's own."""
    out = []
    for tool in request.get("tools") or plan.tools or ():
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            out.append(fn)
    return out


def _other_tools(tools: Sequence[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [t for t in tools if t["name"] != name]


def _generated_call(rng: random.Random, tool: dict[str, Any]) -> ScriptCall:
    params = tool.get("parameters")
    return ScriptCall(tool["name"], json.loads(
        textgen.arguments(rng, params if isinstance(params, dict) else None)))


def _other_arguments(rng: random.Random, call: ScriptCall) -> Any:
    """The call's arguments with one value changed (a key added to an empty object)."""
    value = call.arguments
    if call.text is not None or not isinstance(value, dict):
        return {"query": " ".join(rng.choices(textgen.WORDS, k=3))}
    if not value:
        return {"query": " ".join(rng.choices(textgen.WORDS, k=3))}
    key = rng.choice(sorted(value))
    return {**value, key: _changed(rng, value[key])}


def _changed(rng: random.Random, old: Any) -> Any:
    """A JSON value of the same kind that is not `old`."""
    if isinstance(old, bool):
        return not old
    if isinstance(old, int):
        return old + rng.randint(1, 9)
    if isinstance(old, float):
        return round(old + rng.uniform(1, 9), 2)
    if isinstance(old, str):
        return (old + " " + rng.choice(textgen.WORDS)).strip()
    if isinstance(old, list):
        return [*old, _changed(rng, old[-1]) if old else rng.choice(textgen.WORDS)]
    if isinstance(old, dict):
        return {**old, "more": rng.choice(textgen.WORDS)}
    return rng.choice(textgen.WORDS)  # null
