"""What the endpoint probe needs to know about K2.5 (`probe_rules.ProbeRules`).

The probe (`specregen.probe`) asks an endpoint how it returns tool calls and reads the
provider's parser traits off the answers; which text is a raw tool section, which id form the
model writes, which placeholder a parser deletes, and how the returned fields are assembled
without repair are K2.5's facts, kept here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from specregen.models.chat_format import AssembledLike, ChatFormat
from specregen.models.kimi_k25.common import (
    ARG_BEGIN,
    CALL_BEGIN,
    CALL_END,
    CANONICAL_ID,
    IM_END,
    SECTION_BEGIN,
    SECTION_END,
    SPACES_AROUND_ADDED_TOKENS,
    THINK_END,
    count_history_tool_calls,
)
from specregen.models.kimi_k25.format import (
    THINKING_SWITCH,
    KimiK25,
    find_tool_section,
    has_marker_text,
)
from specregen.models.kimi_k25.readings import NO_CONTENT, looks_stripped, remove_inserted_spaces
from specregen.models.probe_answer import Observation
from specregen.models.probe_rules import (
    FamilyTrait,
    RawCalls,
    TraitReport,
    TraitVotes,
    Verdict,
    vote,
)
from specregen.records import Completion

_ID_INDEX = re.compile(r":(\d+)\s*$")
_RAW_CALL = re.compile(
    re.escape(CALL_BEGIN) + "(.*?)" + re.escape(ARG_BEGIN) + "(.*?)" + re.escape(CALL_END),
    re.DOTALL,
)


def _spaces(votes: TraitVotes) -> Verdict:
    """The model's ids settle it: the returned reasoning is a space plus what it wrote (true)
    or what it wrote (false). Without them, an answer whose reasoning and content (each when
    not blank) all begin with a space votes true, one with a field that does not votes false;
    true needs two such answers (one could be the model's own spaces) and no contrary one. The
    probe sends its requests as the run does: to vLLM and SGLang the run sends
    `spaces_between_special_tokens: false`, so there it finds false unless the server ignores
    the option; `specregen probe --server-defaults` asks without it."""
    answered = votes.answered
    by_ids_true = sum(1 for o in answered if o.spaces_by_ids is True)
    by_ids_false = sum(1 for o in answered if o.spaces_by_ids is False)
    if by_ids_true or by_ids_false:
        seen = (f"by the model's ids: reasoning returned with a space put before it"
                f" {by_ids_true}, as written {by_ids_false}")
        return vote(by_ids_true, by_ids_false, seen, "")
    spaced = sum(1 for o in answered if o.leading_spaces == "all")
    plain = sum(1 for o in answered if o.leading_spaces == "not_all")
    seen = (f"answers whose reasoning and content all begin with a space {spaced}, others"
            f" {plain}")
    if spaced and plain:
        return None, seen + " (contradictory)"
    if plain:
        return False, seen
    if spaced >= 2:
        # One answer could be the model's own leading spaces; two in a row are the server's.
        return True, seen
    return None, seen + (" (one answer is not enough)" if spaced else
                         " (no reasoning or content came back)")


def _despaced(o: Observation) -> int | None:
    # The count of the fields with the spaces taken out (`without_inserted_spaces` below).
    return o.despaced_completion_offset


# Kimi's tokenizer is a slow one whose markers are added tokens: a vLLM with its default
# detokenizer settings puts spaces around them (docs/vllm-0.32.md, section 1.2).
SPACES_TRAIT = FamilyTrait(
    name=SPACES_AROUND_ADDED_TOKENS,
    when_true=("puts a space before every added token and before the text after one"
               " (reasoning and content begin with a space the model never wrote)"),
    when_false="returns the text without spaces around added tokens",
    vote=_spaces,
    recount=_despaced,
    report=TraitReport(
        label="spaces around added tokens",
        meaning=(
            "the server's detokenizer puts a space before every added token and before the text"
            " after one (vLLM's default `spaces_between_special_tokens` with a slow tokenizer):"
            " text the model never wrote, which a token count rarely shows. specregen asks vLLM"
            " and SGLang not to (`spaces_between_special_tokens: false`); where the spaces are"
            " there, reconstruction takes them out (`spaces_removed`), and where it cannot know"
            " whether they are, it keeps both readings and flags the answer unless a count or"
            " the server's ids decide (`spaces_kept`)"),
        flags=(
            ("spaces_removed", "spaces the server put around added tokens were taken out"),
            ("spaces_kept", "read with leading spaces as the model's text, beside a reading"
                            " without them (the server may have put them there)"),
            ("spaces_not_found", "the probe found spaces around added tokens, but this"
                                 " answer's fields cannot carry them: read as returned"),
        ),
    ),
)


class KimiProbeRules:
    """K2.5's answers to the probe's format questions (stateless)."""

    id_form = "functions.NAME:IDX"
    # What vLLM's kimi_k2 tool parser deletes from content when the answer has calls (issue 8).
    placeholder: str | None = NO_CONTENT
    reasoning_end = THINK_END
    stop_token = IM_END
    thinking_switch = THINKING_SWITCH
    traits: tuple[FamilyTrait, ...] = (SPACES_TRAIT,)
    # Flags of the unrepaired assembly that change what is counted, or say the fields are not
    # what the model wrote: such an answer is no base for learning how the provider counts.
    uncountable_flags = frozenset({"markers_in_text", "tool_calls_in_reasoning",
                                   "think_tag_in_text"})

    def raw_calls(self, text: str | None, *, truncated: bool) -> RawCalls | None:
        if not has_marker_text(text):
            return None
        assert text is not None
        section = find_tool_section(text, allow_partial=truncated)
        if section is None:
            start = text.find(SECTION_BEGIN)
            return RawCalls(start if start != -1 else len(text), [], False)
        return RawCalls(section.start, list(section.calls), True)

    def looks_stripped(self, content: str | None) -> bool:
        return looks_stripped(content)

    def id_is_canonical(self, call_id: str | None, name: str, index: int) -> bool:
        return bool(call_id) and CANONICAL_ID.match(call_id or "") is not None

    def id_index(self, call_id: str | None) -> int | None:
        """The IDX of an id ending in `:IDX` (`functions.f:3`, `f:3`), else None."""
        match = _ID_INDEX.search(call_id or "")
        return int(match.group(1)) if match else None

    def written_calls(self, text: str) -> list[tuple[str, str]]:
        start = text.find(SECTION_BEGIN)
        if start == -1:
            return []
        end = text.find(SECTION_END, start)
        section = text[start : end if end != -1 else len(text)]
        return [(m.group(1), m.group(2)) for m in _RAW_CALL.finditer(section)]

    def calls_start(self, text: str) -> int | None:
        start = text.find(SECTION_BEGIN)
        return None if start == -1 else start

    def history_tool_calls(self, messages: Sequence[dict[str, Any]]) -> int:
        return count_history_tool_calls(messages)

    def history_call_id(self, name: str, index: int) -> str:
        return f"functions.{name}:{index}"  # the form the model writes (`CANONICAL_ID`)

    def assemble_as_returned(self, fmt: ChatFormat, completion: Completion, *, thinking: bool,
                             truncated: bool, history: int) -> AssembledLike:
        if not isinstance(fmt, KimiK25):
            raise TypeError(f"the K2.5 probe rules need the K2.5 format, not {fmt.name}")
        return fmt.assemble(completion.reasoning if thinking else None, completion.content,
                            completion.tool_calls, thinking=thinking, truncated=truncated,
                            first_tool_index=history)

    def without_inserted_spaces(self, completion: Completion, *, thinking: bool,
                                streamed: bool) -> Completion | None:
        despaced = remove_inserted_spaces(completion, list(completion.tool_calls),
                                          thinking=thinking, streamed=streamed)
        if despaced is None:
            return None
        fields, calls = despaced
        return replace(fields, tool_calls=calls)


RULES = KimiProbeRules()


def make_probe_rules() -> KimiProbeRules:
    return RULES
