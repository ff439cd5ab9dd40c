"""The prompt a vLLM or SGLang server builds from a request: its own message preprocessing, then
the K2.5 chat template rendered by transformers, then the tokenizer with special tokens allowed.

This is written from the servers' code (docs/upstream-parsers.md, "Prompt side"), not from our
renderer in `format.py`: the emulator's prompt ids are what the server would have fed the model,
so reconstruction is measured against the server, not against itself. A request the server
refuses raises `FormatError` (the emulator answers it with a 400 naming the field).

* vLLM 0.32 (family `vllm`; `chat_utils._parse_chat_message_content`, `_postprocess_messages`,
  the request validator `_normalize_messages_before`): history tool-call arguments are parsed
  and handed to the template as objects (re-serialised by `tojson`); empty, invalid or
  non-object arguments become `{}` (no 400); an empty `tool_calls` list is dropped; an earlier
  answer's reasoning is `reasoning`, or `reasoning_content` when `reasoning` is absent or null;
  a tool message carries `tool_call_id` only when the client sent one; each tool is the request
  model's dump (`type`, then `function` with `name`, `description` and `parameters`, null when
  missing, unknown keys dropped). docs/vllm-0.32.md, section 5.
* vLLM before 0.32 (family `vllm-legacy`): the same, except that the reasoning is read from
  `reasoning` only (a client's `reasoning_content` is dropped, vllm-project/vllm#38488),
  arguments that are not JSON are a 400 and other JSON passes through, and tools go to the
  template as the client sent them.
* SGLang (`serving_chat._apply_jinja_template`): arguments are parsed the same way (a value that
  is not a JSON object is a 400); every message is the request model's dump, so absent optional
  fields are present as null (`reasoning_content`, `tool_call_id`, a call's `id`) and the
  K2.5-era transformers (4.x) printed them as `None`; a null content becomes ""; a final
  assistant message is turned into a user message; tools are left out when tool_choice is none.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from specregen.models.chat_format import FormatError
from specregen.models.kimi_k25.format import tools_declaration
from specregen.models.kimi_k25.tools_ts import deep_sort
from specregen.models.tokenizer import Tokenizer

Family = Literal["vllm", "vllm-legacy", "sglang"]

TEMPLATE_PATH = Path(__file__).resolve().parent / "chat_template.jinja"


def template_text() -> str:
    return TEMPLATE_PATH.read_text(encoding="utf-8")


def server_messages(family: Family, messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The message dicts the server hands to the chat template."""
    out = [_sglang_message(i, m) if family == "sglang" else _vllm_message(i, m, family)
           for i, m in enumerate(messages)]
    if family == "sglang" and out and out[-1]["role"] == "assistant" and isinstance(
            out[-1].get("content"), str):
        # Without continue_final_message SGLang turns a trailing assistant into a user turn.
        out[-1] = {"role": "user", "content": out[-1]["content"]}
    return out


def render_prompt_text(family: Family, request: dict[str, Any], thinking: bool,
                       template: str | None = None) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    messages = server_messages(family, request["messages"])
    tools = request.get("tools") or None
    if family == "sglang" and request.get("tool_choice") == "none":
        tools = None
    if family == "vllm" and tools:
        tools = [_vllm_tool(t) for t in tools]
    # The K2.5 tokenizer wrapper computes the TypeScript declaration from the tools it is given.
    tools_ts = tools_declaration(tools, "typescript") if tools else None
    # transformers annotates render_jinja_template `-> str`; it returns
    # (rendered, generation indices).
    rendered, _ = render_jinja_template(  # type: ignore[str-unpack]
        conversations=[messages],
        tools=deep_sort(list(tools)) if tools else None,
        chat_template=template if template is not None else template_text(),
        add_generation_prompt=True,
        thinking=thinking,
        tools_ts_str=tools_ts,
    )
    return rendered[0]


def encode_prompt(family: Family, request: dict[str, Any], tok: Tokenizer, thinking: bool,
                  template: str | None = None) -> list[int]:
    return tok.encode_with_specials(render_prompt_text(family, request, thinking, template))


def _arguments(i: int, j: int, value: Any, *, family: Family) -> Any:
    where = f"messages[{i}].tool_calls[{j}].function.arguments"
    if family == "vllm":
        # 0.32: anything that is not (the JSON text of) an object becomes {}, with a warning
        # in the server's log: a broken history must not fail every later turn.
        if isinstance(value, dict):
            return value
        if isinstance(value, str) and value:
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                return {}
        return value if isinstance(value, dict) else {}
    if isinstance(value, (dict, list)):
        return value
    if family == "vllm-legacy" and not value:
        return {}
    if not isinstance(value, str):
        raise FormatError(f"{where} must be a JSON string")
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise FormatError(f"{where} is not valid JSON: {exc}") from None
    if family == "sglang" and not isinstance(parsed, dict):
        raise FormatError(f"{where} must be a JSON object")
    return parsed


def _vllm_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A request tool as vLLM 0.32's request model dumps it for the template."""
    fn = tool.get("function") or {}
    dumped: dict[str, Any] = {"name": fn.get("name"), "description": fn.get("description"),
                              "parameters": fn.get("parameters")}
    for key in ("strict", "defer_loading"):
        if fn.get(key) is not None:
            dumped[key] = fn[key]
    if "defer_loading" not in dumped and tool.get("defer_loading") is not None:
        dumped["defer_loading"] = tool["defer_loading"]
    return {"type": "function", "function": dumped}


def _vllm_message(i: int, message: dict[str, Any], family: Family) -> dict[str, Any]:
    role = message["role"]
    content = message.get("content")
    out: dict[str, Any] = {"role": role, "content": "" if content is None else content}
    if role == "assistant":
        calls = message.get("tool_calls")
        if isinstance(calls, list) and calls:
            out["tool_calls"] = []
            for j, call in enumerate(calls):
                call = copy.deepcopy(call)
                fn = call.get("function") or {}
                fn["arguments"] = _arguments(i, j, fn.get("arguments"), family=family)
                call["function"] = fn
                out["tool_calls"].append(call)
        reasoning = message.get("reasoning")
        if reasoning is None and family == "vllm":
            # 0.32's request validator renames `reasoning_content` to `reasoning`.
            reasoning = message.get("reasoning_content")
        if reasoning is not None:
            out["reasoning"] = out["reasoning_content"] = reasoning
    elif role == "tool" and "tool_call_id" in message:
        out["tool_call_id"] = message["tool_call_id"]
    if isinstance(message.get("name"), str):
        out["name"] = message["name"]
    return out


def _sglang_message(i: int, message: dict[str, Any]) -> dict[str, Any]:
    role = message["role"]
    content = message.get("content")
    if role == "user":
        return {"role": role, "content": content}
    if role == "tool" and isinstance(content, list) and all(
            isinstance(p, str) or (isinstance(p, dict) and p.get("type") == "text")
            for p in content):
        content = " ".join(p if isinstance(p, str) else p.get("text", "") for p in content)
    calls = message.get("tool_calls")
    dumped_calls = None
    if isinstance(calls, list):
        dumped_calls = []
        for j, call in enumerate(calls):
            fn = call.get("function") or {}
            dumped_calls.append({
                "id": call.get("id"),
                "index": call.get("index"),
                "type": call.get("type", "function"),
                "function": {"name": fn.get("name"),
                             "arguments": _arguments(i, j, fn.get("arguments"),
                                                     family="sglang")
                             if role == "assistant" else fn.get("arguments")},
            })
    return {
        "role": role,
        "content": "" if content is None else content,
        "tool_call_id": message.get("tool_call_id"),
        "name": message.get("name"),
        "reasoning_content": message.get("reasoning_content"),
        "tool_calls": dumped_calls,
    }
