"""What the endpoint probe needs to know about Qwen3 (`chat_format.ProbeRules`).

Qwen3's facts, from the servers docs/qwen3.md restates (vLLM: qwen3 reasoning parser + hermes
tool parser; SGLang: qwen3 + qwen25 detector):

* Raw calls are `<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>` blocks, read with
  the format's own parser (`format.find_tool_calls`, hermes' reading).
* The model writes no call id: servers make them (vLLM `chatcmpl-tool-<hex>`, SGLang
  `call_<hex>`), so an id carries no running index and a server's id is never wrong. The
  `history` scenario therefore finds no renumbering to learn (`id_index` is always None).
* No parser deletes a placeholder; reasoning ends at `</think>`; thinking is switched with
  `enable_thinking`.
* Content beside calls: vLLM's hermes parser returns the text before the first call verbatim
  (null when only whitespace), SGLang's qwen25 detector strips it (non-streamed). Which one an
  endpoint does is the extra finding `strips_content_beside_calls` (probe/traits.py), which
  `Qwen3.assemble` needs to know whether to restore the template's separators.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from specregen.models.chat_format import AssembledLike, ChatFormat, RawCalls
from specregen.models.qwen3.format import (
    THINKING_SWITCH,
    Qwen3,
    find_tool_calls,
    is_server_tool_id,
)
from specregen.models.qwen3.tokens import THINK_END, TOOL_CALL, TOOL_CALL_END
from specregen.records import Completion

# Where a call body's `arguments` value starts: vLLM's streaming hermes parser finds it the same
# way (brace matching from `"arguments":`), docs/qwen3.md "Tool calls".
_ARGUMENTS_KEY = re.compile(r'"arguments"\s*:\s*')
_DECODER = json.JSONDecoder()


class Qwen3ProbeRules:
    """Qwen3's answers to the probe's format questions (stateless)."""

    # The model writes no id: every id is the server's (stored in profiles as the form).
    id_form = "server"
    placeholder: str | None = None  # no Qwen3 parser deletes content it recognises
    reasoning_end = THINK_END
    thinking_switch = THINKING_SWITCH
    # Flags of `Qwen3.assemble` that say the assembled text is a guess, not the returned text:
    # restored separators, arguments re-dumped by the server whose spacing as written is
    # assumed, markers where the layout has none. Such an answer is no base for counting.
    uncountable_flags = frozenset({"content_whitespace_guessed", "arguments_canonical_assumed",
                                   "arguments_not_canonical", "tool_call_in_reasoning",
                                   "think_tag_in_text"})
    # Findings beyond the common ones that Qwen3's reconstruction reads (probe/traits.py).
    extra_findings = frozenset({"strips_content_beside_calls"})
    # The `Qwen3.assemble` flag that says it restored the template's separators around a
    # text without whitespace beside calls (a non-streamed answer, stripping not ruled out).
    restored_separators_flag = "content_whitespace_guessed"
    # How a call id that is not a known server form is treated (the profile's notes).
    other_id_meaning = ("the model writes no id, so reconstruction ignores them (they are not"
                        " in the tokens) and flags tool_id_unexpected")

    def raw_calls(self, text: str | None, *, truncated: bool) -> RawCalls | None:
        if not text or TOOL_CALL not in text:
            return None
        found = find_tool_calls(text, allow_partial=truncated)
        if found is None:
            # hermes reads no call when any block fails: the text stays as it is.
            return RawCalls(text.find(TOOL_CALL), [], False)
        return RawCalls(found.start, list(found.calls), True)

    def looks_stripped(self, content: str | None) -> bool:
        """A call body (`{"name": ..., "arguments": ...}`) standing in content without its
        `<tool_call>` tags: what is left when a provider deletes the markers."""
        if not content or "{" not in content:
            return False
        at = content.find("{")
        while at != -1:
            try:
                value, end = _DECODER.raw_decode(content, at)
            except ValueError:
                at = content.find("{", at + 1)
                continue
            if isinstance(value, dict) and isinstance(value.get("name"), str) \
                    and "arguments" in value:
                return True
            at = content.find("{", end)
        return False

    def id_is_canonical(self, call_id: str | None, name: str, index: int) -> bool:
        # No id (a raw call: the model wrote none) or one of the servers' forms. Reconstruction
        # flags any other id (`tool_id_unexpected`); none of them is in the tokens.
        return not call_id or is_server_tool_id(call_id)

    def id_index(self, call_id: str | None) -> int | None:
        return None  # server ids carry no running count

    def written_calls(self, text: str) -> list[tuple[str, str]]:
        """("", the arguments value exactly as written) per `<tool_call>` block of the model's
        own text; a block whose arguments cannot be located gives "" (nothing compares)."""
        out: list[tuple[str, str]] = []
        at = text.find(TOOL_CALL)
        while at != -1:
            start = at + len(TOOL_CALL)
            end = text.find(TOOL_CALL_END, start)
            body = text[start : end if end != -1 else len(text)]
            out.append(("", _arguments_text(body)))
            if end == -1:
                break
            at = text.find(TOOL_CALL, end)
        return out

    def calls_start(self, text: str) -> int | None:
        start = text.find(TOOL_CALL)
        return None if start == -1 else start

    def history_tool_calls(self, messages: Sequence[dict[str, Any]]) -> int:
        # Counted for the profile only: Qwen3 numbers nothing.
        return sum(len(m.get("tool_calls") or []) for m in messages
                   if isinstance(m, dict) and m.get("role") == "assistant")

    def assemble_as_returned(self, fmt: ChatFormat, completion: Completion, *, thinking: bool,
                             truncated: bool, history: int) -> AssembledLike:
        if not isinstance(fmt, Qwen3):
            raise TypeError(f"the Qwen3 probe rules need the Qwen3 format, not {fmt.name}")
        # A streamed answer with calls carries the client's record of the stream's order; its
        # arguments are the model's text (vLLM), not a server's dump.
        streamed = completion.content_at_calls is not None
        # `content_stripped` unknown: whether the provider strips is what the probe learns;
        # the assembly's flags say whether it restored the separators (`_count_raw`).
        return fmt.assemble(completion.reasoning if thinking else None, completion.content,
                            completion.tool_calls, thinking=thinking, truncated=truncated,
                            arguments_verbatim=streamed, content_stripped=None)


def _arguments_text(body: str) -> str:
    match = _ARGUMENTS_KEY.search(body)
    if match is None:
        return ""
    try:
        _, end = _DECODER.raw_decode(body, match.end())
    except ValueError:
        return ""
    return body[match.end() : end]


RULES = Qwen3ProbeRules()


def make_probe_rules() -> Qwen3ProbeRules:
    return RULES
