"""Generated Qwen3 conversations for the Qwen3 tests (seeded, so every run sees the same ones).

They cover what the template branches on: a leading system message or none, tools or none,
multi-turn history, assistant turns with `reasoning_content`, with `<think>` inside the content,
with and without tool calls (arguments as strings and as objects), consecutive tool results,
a user turn that is itself a `<tool_response>` block, non-string content, non-ASCII text, and the
thinking switch on, off and unset. `EDGE_CASES` adds, by hand, the branches the generator does not
reach (each line says which); `all_cases()` is both.
"""

from __future__ import annotations

import json
import random
from typing import Any

WORDS = ("alpha", "beta", "Paris", "weather", "file", "résumé", "数据", "x = 1", "{}", "a\nb",
         "  spaced  ", "\n\nlead", "trail\n\n", "<think>", "quote\"s", "tab\there", "ok")

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                        "unit": {"enum": ["c", "f"]}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the web (résumé, 数据).",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"},
                                                        "n": {"type": "integer"}}}}},
]


def _text(rng: random.Random, n: int = 4) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, n)))


def _args(rng: random.Random) -> Any:
    value = {"city": _text(rng, 2), "n": rng.randint(0, 99), "deep": {"k": [1, 2.5, None, True]}}
    kind = rng.random()
    if kind < 0.4:
        return json.dumps(value, ensure_ascii=False)  # as clients send them
    if kind < 0.5:
        return json.dumps(value, separators=(",", ":"))  # a compact string, kept verbatim
    return value  # an object, dumped by tojson


def _assistant(rng: random.Random, with_calls: bool) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": _text(rng)}
    kind = rng.random()
    if kind < 0.3:
        message["reasoning_content"] = _text(rng, 6)
    elif kind < 0.5:
        message["content"] = f"<think>\n{_text(rng)}\n</think>\n\n{_text(rng)}"
    elif kind < 0.55:
        message["content"] = None
    if with_calls:
        message["tool_calls"] = [
            {"id": f"call_{rng.randint(0, 10**6)}", "type": "function",
             "function": {"name": rng.choice(["get_weather", "search"]), "arguments": _args(rng)}}
            for _ in range(rng.randint(1, 3))
        ]
        if rng.random() < 0.3:
            message["content"] = ""
    return message


def conversation(seed: int) -> dict[str, Any]:
    """One case: messages, tools (or None), enable_thinking (True/False/None)."""
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": _text(rng, 6)})
    tools = TOOLS[: rng.randint(1, 2)] if rng.random() < 0.6 else None
    for turn in range(rng.randint(1, 4)):
        user = _text(rng)
        if turn and rng.random() < 0.1:
            user = f"<tool_response>\n{_text(rng)}\n</tool_response>"
        if rng.random() < 0.05:
            messages.append({"role": "user", "content": [{"type": "text", "text": user}]})
        else:
            messages.append({"role": "user", "content": user})
        for _step in range(rng.randint(0, 2)):
            calls = bool(tools) and rng.random() < 0.6
            messages.append(_assistant(rng, calls))
            if calls:
                for call in messages[-1]["tool_calls"]:
                    messages.append({"role": "tool", "tool_call_id": call["id"],
                                     "content": _text(rng)})
            elif rng.random() < 0.5:
                break
        if rng.random() < 0.1:
            messages.append({"role": "system", "content": _text(rng)})
    if rng.random() < 0.15 and messages[-1]["role"] != "assistant":
        messages.append(_assistant(rng, False))  # ends with an assistant turn
    thinking = rng.choice([True, False, None])
    return {"messages": messages, "tools": tools, "enable_thinking": thinking}


def _call(arguments: Any, name: Any = "get_weather") -> dict[str, Any]:
    return {"id": "call_e", "type": "function", "function": {"name": name, "arguments": arguments}}


_Q = {"role": "user", "content": "q"}
_DONE = {"role": "user", "content": "next"}
_TOOL_SPEC_MARKUP = [{"type": "function", "function": {
    "name": "html", "description": "<b>bold</b> & 'quoted' é",  # tojson must not escape HTML
    "parameters": {"type": "object", "properties": {}}}}]

# Hand-written conversations for template branches the generator never takes. A chat request can
# carry each of them; the comment says which branch.
EDGE_CASES: list[dict[str, Any]] = [
    # reasoning_content null: not a string, so the reasoning comes out of the content instead.
    {"messages": [_Q, {"role": "assistant", "content": "<think>\nr\n</think>\n\nx",
                       "reasoning_content": None}], "tools": None, "enable_thinking": None},
    # reasoning_content neither string nor null: ignored, so the reasoning again comes out of
    # the content (the April-2025 revision kept such content whole), after and before the last
    # query.
    {"messages": [_Q, {"role": "assistant", "content": "a</think>x", "reasoning_content": 5}],
     "tools": None, "enable_thinking": True},
    {"messages": [_Q, {"role": "assistant", "content": "<think>\na\n</think>\n\nx",
                       "reasoning_content": ["r"]}, _DONE],
     "tools": None, "enable_thinking": False},
    # reasoning_content "": the final turn still gets an (empty) block, an earlier one does not.
    {"messages": [_Q, {"role": "assistant", "content": "x", "reasoning_content": ""}],
     "tools": None, "enable_thinking": None},
    {"messages": [_Q, {"role": "assistant", "content": "", "reasoning_content": "",
                       "tool_calls": [_call("{}")]},
                  {"role": "tool", "tool_call_id": "call_e", "content": "t"}],
     "tools": TOOLS, "enable_thinking": True},
    # A string reasoning_content wins: `<think>` tags inside the content are kept as written.
    {"messages": [_Q, {"role": "assistant", "content": "<think>a</think>\n\nb",
                       "reasoning_content": "r"}], "tools": None, "enable_thinking": None},
    # `</think>` without `<think>`, twice: reasoning is before the first, content after the last.
    {"messages": [_Q, {"role": "assistant", "content": "a\n</think>b</think>\n\nc"}],
     "tools": None, "enable_thinking": False},
    # A call without the `function` wrapper; object arguments with HTML characters and non-ASCII.
    {"messages": [_Q, {"role": "assistant", "content": "",
                       "tool_calls": [{"name": "html", "arguments": {"a": "<&>", "b": "数据"}}]}],
     "tools": _TOOL_SPEC_MARKUP, "enable_thinking": None},
    # A call with no name (prints nothing), a null name (prints "None"), null arguments ("null").
    {"messages": [_Q, {"role": "assistant", "content": "x", "tool_calls": [
        {"type": "function", "function": {"arguments": "{}"}}, _call(None, name=None)]}],
     "tools": TOOLS, "enable_thinking": True},
    # An empty call list renders as no calls.
    {"messages": [_Q, {"role": "assistant", "content": "x", "tool_calls": []}],
     "tools": None, "enable_thinking": None},
    # Tool messages first, and first after the leading system message (each opens a user turn).
    {"messages": [{"role": "tool", "content": "t"}, _Q], "tools": None, "enable_thinking": None},
    {"messages": [{"role": "system", "content": "s"}, {"role": "tool", "content": "t"},
                  {"role": "tool", "content": "u"}, _Q], "tools": TOOLS, "enable_thinking": False},
    # Tool results whose content is null, a list of parts, a number: all render as empty text.
    {"messages": [_Q, {"role": "assistant", "content": "", "tool_calls": [_call("{}")] * 3},
                  {"role": "tool", "content": None},
                  {"role": "tool", "content": [{"type": "text", "text": "t"}]},
                  {"role": "tool", "content": 7}], "tools": TOOLS, "enable_thinking": True},
    # Assistant, later-system and user content as a list of parts (the template sees no text; a
    # list user turn is not a query).
    {"messages": [_Q, {"role": "assistant", "content": [{"type": "text", "text": "t"}],
                       "reasoning_content": "r"},
                  {"role": "system", "content": [{"type": "text", "text": "s"}]},
                  {"role": "user", "content": [{"type": "text", "text": "u"}]}],
     "tools": None, "enable_thinking": None},
    # A role the template does not know renders nothing (and is never the last query).
    {"messages": [{"role": "developer", "content": "d"}, _Q,
                  {"role": "assistant", "content": "x", "reasoning_content": "r"}],
     "tools": None, "enable_thinking": None},
    # No user message at all: the last query is the last message, so nothing keeps reasoning.
    {"messages": [{"role": "system", "content": "s"},
                  {"role": "assistant", "content": "x", "reasoning_content": "r"}],
     "tools": TOOLS, "enable_thinking": None},
    # A user turn that is exactly an empty `<tool_response></tool_response>` is not a query.
    {"messages": [_Q, {"role": "assistant", "content": "x", "reasoning_content": "r"},
                  {"role": "user", "content": "<tool_response></tool_response>"}],
     "tools": None, "enable_thinking": False},
    # Several queries, reasoning kept only after the last one, which is not the last message.
    {"messages": [_Q, {"role": "assistant", "content": "a", "reasoning_content": "r1"}, _DONE,
                  {"role": "assistant", "content": "b", "reasoning_content": "r2",
                   "tool_calls": [_call({"city": "Paris"})]},
                  {"role": "tool", "content": "18C"},
                  {"role": "assistant", "content": "c", "reasoning_content": "r3"}],
     "tools": TOOLS, "enable_thinking": True},
]


def all_cases(n: int) -> list[dict[str, Any]]:
    """The first `n` generated conversations, then the hand-written ones."""
    return [conversation(seed) for seed in range(n)] + EDGE_CASES
