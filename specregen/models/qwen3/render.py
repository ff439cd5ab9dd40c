"""The Qwen3 chat template's behaviour, written as plain Python (our own code).

We follow the current revision of the Qwen3 hybrid template (the one Qwen/Qwen3-8B ships since
mid-2025, which tests `content is string` and `reasoning_content is string`). The April-2025
revision it replaced gives the same text wherever it renders at all, except in two places: it
prints a tool message's non-string content (`None`, a list's repr) where the current one prints
nothing, and it takes any non-null `reasoning_content` as given (so content holding `</think>`
is kept whole) where the current one ignores a non-string one. It raises on null or list content
elsewhere, so a server running it refuses those requests.

What the template does, in order:

* System block. With tools: one system turn holding the first message's text when that message
  is a system message (then a blank line), a fixed instruction, each tool as one JSON line
  (transformers' `tojson`: `json.dumps`, non-ASCII kept, default separators) inside
  `<tools></tools>`, and the call format. Without tools: the first system message alone.
* The last real query: scanning from the end, the first user message whose content is a string
  and is not wholly one `<tool_response>...</tool_response>` block. Assistant turns after it
  keep their reasoning (`<think>\\n...\\n</think>\\n\\n`); the final assistant turn after it
  always gets the block, even empty; turns before it are content only.
* An assistant message without a string `reasoning_content` but with `</think>` in its content
  has its reasoning cut out of the content.
* Calls: `<tool_call>\\n{"name": "N", "arguments": A}\\n</tool_call>`, separated by a newline
  (and from non-empty content by one), `A` verbatim when a string, else `tojson`.
* Tool results: consecutive tool messages share one user turn, each wrapped in
  `\\n<tool_response>\\n...\\n</tool_response>`.
* Roles other than system/user/assistant/tool render nothing; non-string content renders as
  empty (except the leading system message, which the template concatenates and so must be a
  string).
* Generation prompt: `<|im_start|>assistant\\n`, plus an empty think block when
  `enable_thinking` is exactly False.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specregen.models.chat_format import FormatError
from specregen.models.qwen3.tokens import (
    IM_END,
    IM_START,
    THINK,
    THINK_END,
    TOOL_CALL,
    TOOL_CALL_END,
    TOOL_RESPONSE,
    TOOL_RESPONSE_END,
)

TEMPLATE_PATH = Path(__file__).resolve().parent / "chat_template.jinja"

TOOLS_INTRO = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_OUTRO = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments"
    " within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)
EMPTY_THINK = f"{THINK}\n\n{THINK_END}\n\n"


__all__ = ["FormatError"]  # the one FormatError every format raises (models/chat_format.py)


def tojson(value: Any) -> str:
    """transformers' `tojson` filter with its defaults."""
    return json.dumps(value, ensure_ascii=False)


def tools_system_text(tools: Sequence[Any]) -> str:
    """The tools part of the system turn, from the instruction to the call format."""
    return TOOLS_INTRO + "".join("\n" + tojson(tool) for tool in tools) + TOOLS_OUTRO


def _is_tool_result_text(content: str) -> bool:
    return content.startswith(TOOL_RESPONSE) and content.endswith(TOOL_RESPONSE_END)


def last_query_index(messages: Sequence[dict[str, Any]]) -> int:
    """Index of the last user message that is a real query (see module docstring); the last
    index when there is none."""
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        content = message.get("content")
        if (message.get("role") == "user" and isinstance(content, str)
                and not _is_tool_result_text(content)):
            return i
    return len(messages) - 1


def split_reasoning(message: dict[str, Any]) -> tuple[str, str]:
    """(reasoning, content) of an assistant message as the template reads them."""
    content = message.get("content")
    text = content if isinstance(content, str) else ""
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str):
        return reasoning, text
    if THINK_END in text:
        head = text.split(THINK_END)[0].rstrip("\n")
        return head.split(THINK)[-1].lstrip("\n"), text.split(THINK_END)[-1].lstrip("\n")
    return "", text


def tool_call_text(name: Any, arguments: Any) -> str:
    """One call block as the template writes it (and as the model learned to write it)."""
    args = arguments if isinstance(arguments, str) else tojson(arguments)
    return f'{TOOL_CALL}\n{{"name": "{_jinja_str(name)}", "arguments": {args}}}\n{TOOL_CALL_END}'


def _jinja_str(value: Any) -> str:
    # `{{ x }}` prints None as "None" and booleans capitalised, like Python's str().
    return str(value)


def _system_text(messages: Sequence[dict[str, Any]]) -> str | None:
    if not messages or messages[0].get("role") != "system":
        return None
    content = messages[0].get("content")
    if not isinstance(content, str):
        raise FormatError("messages[0]: a leading system message must have string content")
    return content


def render_blocks(
    messages: Sequence[dict[str, Any]],
    tools: Sequence[Any] | None = None,
    *,
    enable_thinking: bool | None = True,
    add_generation_prompt: bool = True,
) -> list[str]:
    """The prompt as pieces that each start with `<|im_start|>` (the first may be the system
    turn, which a dataset repeats and a caller can cache)."""
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise FormatError(f"messages[{i}] has no string 'role'")
    blocks: list[str] = []
    system = _system_text(messages)
    if tools:
        head = "" if system is None else system + "\n\n"
        blocks.append(f"{IM_START}system\n{head}{tools_system_text(tools)}{IM_END}\n")
    elif system is not None:
        blocks.append(f"{IM_START}system\n{system}{IM_END}\n")
    query = last_query_index(messages)
    n = len(messages)
    for i, message in enumerate(messages):
        role = message["role"]
        content = message.get("content")
        text = content if isinstance(content, str) else ""
        if role == "user" or (role == "system" and i > 0):
            blocks.append(f"{IM_START}{role}\n{text}{IM_END}\n")
        elif role == "assistant":
            blocks.append(_assistant_block(message, keep_reasoning=i > query, last=i == n - 1))
        elif role == "tool":
            opens = i == 0 or messages[i - 1].get("role") != "tool"
            closes = i == n - 1 or messages[i + 1].get("role") != "tool"
            piece = f"\n{TOOL_RESPONSE}\n{text}\n{TOOL_RESPONSE_END}"
            blocks.append((f"{IM_START}user" if opens else "") + piece
                          + (f"{IM_END}\n" if closes else ""))
    if add_generation_prompt:
        blocks.append(f"{IM_START}assistant\n" + (EMPTY_THINK if enable_thinking is False else ""))
    return blocks


def _assistant_block(message: dict[str, Any], *, keep_reasoning: bool, last: bool) -> str:
    reasoning, content = split_reasoning(message)
    out = [f"{IM_START}assistant\n"]
    if keep_reasoning and (last or reasoning):
        out.append(f"{THINK}\n{reasoning.strip(chr(10))}\n{THINK_END}\n\n{content.lstrip(chr(10))}")
    else:
        out.append(content)
    calls = message.get("tool_calls")
    if calls:
        for k, call in enumerate(calls):
            if k > 0 or content:
                out.append("\n")
            fn = call.get("function") if isinstance(call, dict) else None
            target = fn if fn else call
            if not isinstance(target, dict):
                raise FormatError("a tool call must be an object")
            if "arguments" not in target:
                raise FormatError("a tool call has no 'arguments'")
            # An absent name is Jinja's undefined and prints nothing; None prints "None".
            name = target.get("name", "")
            out.append(tool_call_text(name, target["arguments"]))
    out.append(f"{IM_END}\n")
    return "".join(out)


def render_prompt_text(
    messages: Sequence[dict[str, Any]],
    tools: Sequence[Any] | None = None,
    *,
    enable_thinking: bool | None = True,
    add_generation_prompt: bool = True,
) -> str:
    """The prompt text the Qwen3 chat template renders."""
    return "".join(render_blocks(messages, tools, enable_thinking=enable_thinking,
                                 add_generation_prompt=add_generation_prompt))


def template_text() -> str:
    """Our own Jinja reproduction of the template (same output, our wording)."""
    return TEMPLATE_PATH.read_text(encoding="utf-8")


def render_with_template(
    template: str,
    messages: Sequence[dict[str, Any]],
    tools: Sequence[Any] | None = None,
    *,
    enable_thinking: bool | None = True,
    add_generation_prompt: bool = True,
) -> str:
    """A chat template rendered the way transformers' `apply_chat_template` does (its
    sandboxed environment and `tojson`), as vLLM and SGLang render prompts."""
    from transformers.utils.chat_template_utils import render_jinja_template

    kwargs: dict[str, Any] = {}
    if enable_thinking is not None:
        kwargs["enable_thinking"] = enable_thinking
    # transformers annotates render_jinja_template `-> str`; it returns
    # (rendered, generation indices).
    rendered, _ = render_jinja_template(  # type: ignore[str-unpack]
        conversations=[list(messages)],
        tools=list(tools) if tools else None,
        chat_template=template,
        add_generation_prompt=add_generation_prompt,
        **kwargs,
    )
    return rendered[0]
