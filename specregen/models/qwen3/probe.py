"""What the endpoint probe needs to know about Qwen3 (`probe_rules.ProbeRules`).

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
  endpoint does is Qwen3's own trait `strips_content_beside_calls` (its vote rule is here),
  which `Qwen3.assemble` needs to know whether to restore the template's separators.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from specregen.models.chat_format import AssembledLike, ChatFormat
from specregen.models.probe_rules import FamilyTrait, RawCalls, TraitVotes, Verdict, vote
from specregen.models.qwen3.format import (
    STRIPS_CONTENT_BESIDE_CALLS,
    THINKING_SWITCH,
    Qwen3,
    find_tool_calls,
    is_server_tool_id,
)
from specregen.models.qwen3.tokens import IM_END, THINK_END, TOOL_CALL, TOOL_CALL_END
from specregen.models.serverkit.ids import fixed_vllm_call_id
from specregen.records import Completion

# Where a call body's `arguments` value starts: vLLM's streaming hermes parser finds it the same
# way (brace matching from `"arguments":`), docs/qwen3.md "Tool calls".
_ARGUMENTS_KEY = re.compile(r'"arguments"\s*:\s*')
_DECODER = json.JSONDecoder()


def _stripping(votes: TraitVotes) -> Verdict:
    """Content beside structured calls with whitespace at an end votes false (a stripping
    parser leaves none); the model's ids settle it where they show whitespace at an end of what
    it wrote there (returned as written: false, stripped: true); without them, a bare content
    (no whitespace at either end) counts: where the format's assembly restored its separators
    around it (`restored_separators_flag` among its flags), usage equal to our count (after the
    stop token rule) votes true and usage below it votes false (we would add separators the
    model never wrote); where the assembly used it as returned (a stream), an equal count
    votes false. Whitespace-only content dropped or emptied says nothing: both kinds of
    parser do it."""
    answered = votes.answered
    padded = sum(1 for o in answered
                 if o.content_beside_calls == "padded" and o.content_as_written is None)
    kept_by_ids = sum(1 for o in answered if o.content_as_written is True)
    stripped_by_ids = sum(1 for o in answered if o.content_as_written is False)
    count_true = count_false = 0
    if votes.counts_stop_token is not None:
        base = 0 if votes.counts_stop_token else -1
        for o in answered:
            if o.bare_content_offset is None or o.content_as_written is not None:
                continue
            d = o.bare_content_offset - base
            if o.bare_content_restored:
                # Separators restored: counted by the provider -> written and stripped; our
                # count above the provider's -> we added what the model never wrote.
                count_true += d == 0
                count_false += d < 0
            else:
                # Used as returned (e.g. a stream, which no parser strips) and counted
                # exactly: the model wrote it so. A surplus may be any loss: no vote.
                count_false += d == 0
    stripped = stripped_by_ids + count_true
    kept = padded + kept_by_ids + count_false
    seen = (f"content beside calls with whitespace at an end {padded}; by the model's ids"
            f" returned as written {kept_by_ids}, stripped {stripped_by_ids}; bare content"
            f" whose usage counts the restored separators {count_true}, shows it was written"
            f" bare {count_false}")
    return vote(stripped, kept, seen, "no text came back beside a call")


STRIPS_TRAIT = FamilyTrait(
    name=STRIPS_CONTENT_BESIDE_CALLS,
    when_true="strips the whitespace around the text before tool calls",
    when_false="returns the text before tool calls as written",
    vote=_stripping,
)


class Qwen3ProbeRules:
    """Qwen3's answers to the probe's format questions (stateless)."""

    # The model writes no id: every id is the server's (stored in profiles as the form).
    id_form = "server"
    placeholder: str | None = None  # no Qwen3 parser deletes content it recognises
    reasoning_end = THINK_END
    stop_token = IM_END
    thinking_switch = THINKING_SWITCH
    # Flags of `Qwen3.assemble` that say the assembled text is a guess, not the returned text:
    # restored separators, arguments re-dumped by the server whose spacing as written is
    # assumed, markers where the layout has none. Such an answer is no base for counting.
    uncountable_flags = frozenset({"content_whitespace_guessed", "arguments_canonical_assumed",
                                   "arguments_not_canonical", "tool_call_in_reasoning",
                                   "think_tag_in_text"})
    # The trait Qwen3 brings beyond the probe's own, which its reconstruction reads.
    traits: tuple[FamilyTrait, ...] = (STRIPS_TRAIT,)
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

    def history_call_id(self, name: str, index: int) -> str:
        # The model writes no id: the conversation carries the one its server gave the call.
        return fixed_vllm_call_id(f"{name}:{index}")

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
