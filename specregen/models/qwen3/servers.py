"""The request side of Qwen3's restated servers that the format's readings share
(docs/qwen3.md): the refusal (`RequestError`, the server's 400), the template kwargs, whether
the tool parser runs, and the message dicts vLLM hands to the chat template
(`server_messages`). Reconstruction imports this module, so it is in the reconstruct
fingerprint; the servers themselves are served-side modules outside it: `vllm.py` (vLLM
0.32), `vllm_legacy.py` (the earlier vLLM, behind OpenRouter), `hermes.py` (the hermes tool
parser's stream, both vLLMs'), `sglang.py` (SGLang), on `models/serverkit`.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from typing import Any


class RequestError(ValueError):
    """A request the server refuses (vLLM answers 400)."""


def template_kwargs(request: dict[str, Any]) -> dict[str, Any]:
    kwargs = request.get("chat_template_kwargs")
    return kwargs if isinstance(kwargs, dict) else {}


def parses_tools(request: dict[str, Any]) -> bool:
    """The tool parser (vLLM's hermes, SGLang's qwen25) runs when the request sent tools and
    did not say "none" (`required` and named choices take vLLM's JSON path; treated as auto
    here, as for Kimi)."""
    return bool(request.get("tools")) and request.get("tool_choice") != "none"


def server_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The message dicts vLLM hands to the template: history arguments parsed to objects (so
    `tojson` dumps them again; empty means `{}`), text-part lists joined with newlines (the
    template is string-content), null content as "", an earlier answer's reasoning read from
    `reasoning` only and passed also as `reasoning_content` (the name the Qwen3 template reads).
    A client's `reasoning_content` is dropped: vLLM main reads only `reasoning`
    (`chat_utils._parse_chat_message_content`, vllm-project/vllm#38488, open)."""
    out = []
    for i, message in enumerate(messages):
        role = message.get("role")
        content = message.get("content")
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if not (isinstance(part, dict) and part.get("type") == "text"):
                    raise RequestError(f"messages[{i}].content[{j}]: only text parts are "
                                       "supported for Qwen3")
                texts.append(part.get("text") or "")
            content = "\n".join(texts)
        new: dict[str, Any] = {"role": role, "content": "" if content is None else content}
        if role == "assistant":
            calls = message.get("tool_calls")
            if isinstance(calls, list) and calls:
                new["tool_calls"] = [_server_call(i, j, c) for j, c in enumerate(calls)]
            reasoning = message.get("reasoning")
            if reasoning is not None:
                new["reasoning"] = new["reasoning_content"] = reasoning
        elif role == "tool" and "tool_call_id" in message:
            new["tool_call_id"] = message["tool_call_id"]
        if isinstance(message.get("name"), str):
            new["name"] = message["name"]
        out.append(new)
    return out


def _server_call(i: int, j: int, call: dict[str, Any]) -> dict[str, Any]:
    call = copy.deepcopy(call)
    fn = call.get("function") or {}
    args = fn.get("arguments")
    where = f"messages[{i}].tool_calls[{j}].function.arguments"
    if not args:
        fn["arguments"] = {}
    elif isinstance(args, str):
        try:
            fn["arguments"] = json.loads(args)
        except json.JSONDecodeError as exc:
            raise RequestError(f"{where} is not valid JSON: {exc}") from None
    call["function"] = fn
    return call
