"""What the endpoint probe asks of a family: its `ProbeRules`, and the traits it declares.

A family whose reconstruction reads the provider's parser traits gives the probe its rules
(`Family.make_probe_rules`). The probe finds the traits every format reads (the named fields of
`records.ProviderTraits`) with rules of its own (probe/traits.py); a trait only the family's
format reads is declared here, as a `FamilyTrait` among its rules' `traits`: its name, the
sentence for each finding, and its vote rule over the probe's observations. The probe stores
what it found in `ProviderTraits.family`, and the family's format reads it (`traits.get(name)`);
nothing outside the family names it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from specregen.models.chat_format import AssembledLike, ChatFormat
from specregen.models.probe_answer import Observation
from specregen.records import Completion, ToolCall

# A finding (None: the answers could not tell) and what was seen, in words (the evidence).
Verdict = tuple[bool | None, str]


@dataclass(frozen=True, slots=True)
class TraitVotes:
    """What a family trait's vote reads: the probe's answered observations (every scenario),
    and whether the provider counts the stop token, as the probe found it (None: unknown, or
    not yet found: see `FamilyTrait.recount`)."""

    answered: Sequence[Observation]
    counts_stop_token: bool | None


@dataclass(frozen=True, slots=True)
class TraitReport:
    """How the gate report names a family trait that changes the server's text: its row
    under "Server text transformations" (`label`, what it means) and the reconstruction
    flags that show where it touched a sample, each with its meaning (the flags table's)."""

    label: str
    meaning: str
    flags: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class FamilyTrait:
    """One trait a family brings: `name` (its key in `ProviderTraits.family` and in profiles),
    `when_true` / `when_false` (what the provider does, for the profile's notes) and `vote`
    (the finding from the answers, with its evidence; `vote()` below decides from counts).

    A trait is voted after the probe's own findings, so its vote can read the stop-token
    count. One that changes what the answers' counts are (`recount`: an answer's count
    without what the trait adds, None where it cannot tell) is voted first, on the answers as
    returned; found true, every later count reads `recount` (and its note follows the parsers'
    findings: it describes what the server adds, not how it parses)."""

    name: str
    when_true: str
    when_false: str
    vote: Callable[[TraitVotes], Verdict]
    recount: Callable[[Observation], int | None] | None = None
    # A trait that changes the text the server returns is named in the gate report.
    report: TraitReport | None = None


def vote(yes: int, no: int, seen: str, unknown: str) -> Verdict:
    """A finding from its votes: True or False when they agree, None (saying why, after what
    was seen) when they disagree or there are none."""
    if yes and no:
        return None, seen + " (contradictory)"
    if yes or no:
        return bool(yes), seen
    return None, f"{seen} ({unknown})"


@dataclass(frozen=True)
class RawCalls:
    """Tool calls found as raw marker text in a returned text field (the probe's view).

    `start`: where the calls begin in the text; `calls`: what parsed (trimmed, as a client
    parser reads them); `parsed`: whether the marker text parses as the format's calls.
    """

    start: int
    calls: list[ToolCall]
    parsed: bool


@runtime_checkable
class ProbeRules(Protocol):
    """What the endpoint probe needs to know about a format whose reconstruction reads the
    provider's parser traits (`specregen.probe`); the probe itself names no family.

    `id_form`: the label of the call-id form the model writes (stored in profiles);
    `placeholder`: text a known parser deletes from content beside calls (None: none);
    `reasoning_end`: the marker text closing the reasoning; `thinking_switch`: the
    `chat_template_kwargs` key; `stop_token`: the name of the token the model ends its answer
    with (the probe's words about counting it); `uncountable_flags`: `assemble_as_returned`
    flags that say the returned fields are not what the model wrote (no base for counting
    tokens); `traits`: the traits the family brings beyond the probe's own (`FamilyTrait`:
    name, sentences, vote).

    Optional: `without_inserted_spaces(completion, *, thinking, streamed)`, the fields without
    the spaces a slow detokenizer puts around added tokens (None: they cannot carry them; the
    probe's `despaced_completion_offset`); `restored_separators_flag`, the assembly's flag
    that says it restored separators around a bare content beside calls (the probe's
    `bare_content_offset`); `other_id_meaning`,
    what an id not of `id_form` means, in words.
    """

    id_form: str
    placeholder: str | None
    reasoning_end: str
    thinking_switch: str
    stop_token: str
    uncountable_flags: frozenset[str]
    traits: tuple[FamilyTrait, ...]

    def raw_calls(self, text: str | None, *, truncated: bool) -> RawCalls | None:
        """Calls left as marker text in `text`; None when `text` holds no marker text."""
        ...

    def looks_stripped(self, content: str | None) -> bool:
        """Content that reads like a call whose markers a provider deleted."""
        ...

    def id_is_canonical(self, call_id: str | None, name: str, index: int) -> bool:
        """Whether `call_id` has the form the model writes (`id_form`)."""
        ...

    def id_index(self, call_id: str | None) -> int | None:
        """The running index an id carries, if the form has one."""
        ...

    def written_calls(self, text: str) -> list[tuple[str, str]]:
        """(id, arguments) of each call in the model's own text (decoded ids), untrimmed."""
        ...

    def calls_start(self, text: str) -> int | None:
        """Where the model's own text (decoded ids) opens its tool calls; None if it does not."""
        ...

    def history_tool_calls(self, messages: Sequence[dict[str, Any]]) -> int:
        """Tool calls the request's conversation already holds."""
        ...

    def history_call_id(self, name: str, index: int) -> str:
        """The id a call of an earlier turn carries when the conversation is sent back: the
        form its servers give it (the probe's `history` scenario), `index` its running count
        in the conversation."""
        ...

    def assemble_as_returned(self, fmt: ChatFormat, completion: Completion, *, thinking: bool,
                             truncated: bool, history: int) -> AssembledLike:
        """The returned fields assembled exactly as returned (no reading, no repair)."""
        ...
