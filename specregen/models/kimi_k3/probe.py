"""What the endpoint probe needs to know about Kimi K3 (`probe_rules.ProbeRules`).

K3's facts, from vLLM 0.32's kimi_k3 parsers (docs/kimi-k3.md §4):

* Raw calls are a tools channel (`<|open|>tools<|sep|>` ... `<|close|>tools<|sep|>`) of call
  blocks with typed argument tags, read with the format's own parser (`format.parse_calls`,
  vLLM's reading).
* The model writes no call id: vLLM makes them (`chatcmpl-tool-` + 16 hex digits), so an id
  carries no running index and a server's id is never wrong; the `history` scenario finds no
  renumbering to learn.
* No parser deletes a placeholder; the reasoning ends at `<|close|>think<|sep|>`; thinking is
  switched with `thinking` (chat_template_kwargs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specregen.models.chat_format import AssembledLike, ChatFormat
from specregen.models.kimi_k3.completion import parse_calls
from specregen.models.kimi_k3.encoding import END_OF_MSG
from specregen.models.kimi_k3.format import (
    THINK_CLOSE,
    THINKING_SWITCH,
    KimiK3,
    is_server_tool_id,
)
from specregen.models.kimi_k3.servers import (
    ARGUMENT_RE,
    CALL_RE,
    TOOLS_OPEN_RE,
    attributes,
    decode_call,
)
from specregen.models.probe_rules import FamilyTrait, RawCalls
from specregen.models.serverkit.ids import fixed_vllm_call_id
from specregen.records import Completion


class KimiK3ProbeRules:
    """K3's answers to the probe's format questions (stateless)."""

    id_form = "server"  # the model writes no id: every id is the server's
    placeholder: str | None = None
    reasoning_end = THINK_CLOSE
    stop_token = END_OF_MSG
    thinking_switch = THINKING_SWITCH
    # `KimiK3.assemble` flags that say the assembled text is a guess: non-string arguments
    # re-dumped by the server (their spelling as written is assumed), arguments that are no
    # object. Such an answer is no base for counting.
    uncountable_flags = frozenset({"arguments_canonical_assumed", "arguments_not_object"})
    traits: tuple[FamilyTrait, ...] = ()  # K3 brings no trait beyond the probe's own
    other_id_meaning = ("the model writes no id, so reconstruction ignores them (they are not"
                        " in the tokens) and flags tool_id_unexpected")

    def raw_calls(self, text: str | None, *, truncated: bool) -> RawCalls | None:
        if not text or not TOOLS_OPEN_RE.search(text):
            return None
        found = parse_calls(text, truncated=truncated)
        assert found is not None
        return RawCalls(found.start, list(found.calls), bool(found.calls))

    def looks_stripped(self, content: str | None) -> bool:
        """Argument tags' leftovers (`key="..." type="..."`) in content without their markers:
        what is left when a provider deletes the marker tokens."""
        if not content:
            return False
        return 'key="' in content and 'type="' in content and "<|" not in content

    def id_is_canonical(self, call_id: str | None, name: str, index: int) -> bool:
        return not call_id or is_server_tool_id(call_id)

    def id_index(self, call_id: str | None) -> int | None:
        return None  # server ids carry no running count

    def written_calls(self, text: str) -> list[tuple[str, str]]:
        """("", arguments as vLLM reads them) per complete call block of the model's own text;
        an unfinished block gives the arguments of its complete argument tags."""
        m_open = TOOLS_OPEN_RE.search(text)
        if m_open is None:
            return []
        section = text[m_open.end():]
        out = [("", decoded[1]) for m in CALL_RE.finditer(section)
               if (decoded := decode_call(m["attrs"], m["body"])) is not None]
        return out or [("", _partial_arguments(section))]

    def calls_start(self, text: str) -> int | None:
        found = TOOLS_OPEN_RE.search(text)
        return None if found is None else found.start()

    def history_tool_calls(self, messages: Sequence[dict[str, Any]]) -> int:
        return sum(len(m.get("tool_calls") or []) for m in messages
                   if isinstance(m, dict) and m.get("role") == "assistant")

    def history_call_id(self, name: str, index: int) -> str:
        # The model writes no id: the conversation carries the one vLLM gave the call.
        return fixed_vllm_call_id(f"{name}:{index}")

    def assemble_as_returned(self, fmt: ChatFormat, completion: Completion, *, thinking: bool,
                             truncated: bool, history: int) -> AssembledLike:
        if not isinstance(fmt, KimiK3):
            raise TypeError(f"the Kimi K3 probe rules need the Kimi K3 format, not {fmt.name}")
        return fmt.assemble(completion.reasoning if thinking else None, completion.content,
                            completion.tool_calls, thinking=thinking, truncated=truncated)


def _partial_arguments(section: str) -> str:
    import json

    args = {attributes(m["attrs"]).get("key", ""): m["val"] for m in ARGUMENT_RE.finditer(section)}
    return json.dumps(args, ensure_ascii=False) if args else ""


RULES = KimiK3ProbeRules()


def make_probe_rules() -> KimiK3ProbeRules:
    return RULES
