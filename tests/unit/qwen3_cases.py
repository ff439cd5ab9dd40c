"""Generated Qwen3 conversations for the Qwen3 tests (seeded, so every run sees the same ones).

They cover what the template branches on: a leading system message or none, tools or none,
multi-turn history, assistant turns with `reasoning_content`, with `<think>` inside the content,
with and without tool calls (arguments as strings and as objects), consecutive tool results,
a user turn that is itself a `<tool_response>` block, non-string content, non-ASCII text, and the
thinking switch on, off and unset.
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
