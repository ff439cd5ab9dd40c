"""The data contracts that cross module boundaries.

Everything here is plain data: a dataset adapter yields `Prompt`s, the client turns a provider
response into a `Completion`, and reconstruction turns a request plus a `Completion` into a
`TokenSample`. Texts are kept byte-exact; tool-call `arguments` stay the strings the API sent.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

ToolMode = Literal["tools", "system_prompt"]
# How a prompt's tools are sent: as the API's `tools`, or declared in the system prompt.
TOOL_MODES: tuple[ToolMode, ...] = ("tools", "system_prompt")
Status = Literal["ok", "flagged", "error"]
ReferenceMatch = Literal["exact", "benign_bpe", "text_diff", "special_diff"]
# What proves a sample's ids, strongest first (docs/evidence.md): the server's own ids matched;
# our counts equal `usage` after the provider's counting rules; within the tolerance only; nothing.
Evidence = Literal["reference", "logprobs", "usage_exact", "usage_tolerated", "none"]
EVIDENCE_LEVELS: tuple[Evidence, ...] = ("reference", "logprobs", "usage_exact",
                                         "usage_tolerated", "none")


@dataclass(frozen=True, slots=True)
class Prompt:
    """One sample to regenerate: an OpenAI-style conversation prefix ending on a user turn, or
    (`turns == "all"`) a whole conversation whose every assistant turn is regenerated."""

    sample_id: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    tool_mode: ToolMode = "tools"
    # Fields of the source row worth keeping next to the result (e.g. glaive's own answer).
    meta: dict[str, Any] = field(default_factory=dict)
    # "all": `messages` is the dataset's whole conversation, regenerated turn by turn
    # (specregen/conversation); "first": a prefix ending on the user turn to answer.
    turns: Literal["first", "all"] = "first"
    # The functions the prompt declares to the model, as its dataset adapter read them (OpenAI
    # tools): the `tools` sent, or those its system prompt declares; None: none. The adapter
    # knows its dataset's system prompt form, so the gate, which holds calls to these, needs
    # none (specregen/sources/declared.py).
    declared_tools: list[dict[str, Any]] | None = None
    # Why the declared functions could not be read (the gate quarantines calls, saying so).
    declaration_problem: str | None = None

    @property
    def declaration(self) -> Declaration:
        return Declaration(self.declared_tools, self.declaration_problem)


@dataclass(frozen=True, slots=True)
class Declaration:
    """What a prompt declares, as its adapter stated it; the gate gets it with the sample. (Where
    the model read it, the request's `tools` or the system prompt, the sample's `tools` say.)"""

    tools: list[dict[str, Any]] | None = None  # OpenAI tools; None: none
    problem: str | None = None  # why the declared functions could not be read


@dataclass(frozen=True, slots=True)
class SourceReject:
    """A source row that could not become a Prompt; kept so the run can report it."""

    sample_id: str
    row: str  # where it came from, e.g. "glaive.json#17"
    reason: str


class TraitMap(Mapping[str, bool]):
    """An immutable, hashable map of trait name -> what the probe found. Unknown findings are
    left out: for a reader, absent and None mean the same (`get` gives None for both)."""

    __slots__ = ("_items",)

    def __init__(self, found: Mapping[str, bool | None] | None = None) -> None:
        self._items: tuple[tuple[str, bool], ...] = tuple(sorted(
            (name, value) for name, value in (found or {}).items() if value is not None))

    def __getitem__(self, name: str) -> bool:
        for key, value in self._items:
            if key == name:
                return value
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return (key for key, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(self._items)

    def __repr__(self) -> str:
        return f"TraitMap({dict(self._items)!r})"


@dataclass(frozen=True, slots=True)
class ProviderTraits:
    """What a provider's parsers do to an answer, as learned by the probe (None: unknown).

    The named fields are what generic code reads for every format (reconstruct.py, the probe's
    own findings); `family` holds the traits the format's family declares with its probe rules
    (`models/probe_rules.py FamilyTrait`), read only by that family's format (`get`)."""

    renumbers_tool_ids: bool | None = None  # ids rebuilt with the running count of history
    deletes_no_content: bool | None = None  # the format's placeholder deleted beside calls
    splits_reasoning: bool | None = None  # reasoning returned separately from content
    counts_stop_token: bool | None = None  # usage.completion_tokens includes the stop token
    # Without streaming, a tool section opened before the reasoning's end ends the reasoning
    # and the calls come back parsed (SGLang with forced reasoning). False: such a section
    # stays in the reasoning text (vLLM's parsers, docs/upstream-parsers.md), so parsed calls
    # after a reasoning mean the model did close it. (Streamed, one vLLM parser ends it too.)
    ends_reasoning_at_tools: bool | None = None
    family: TraitMap = field(default_factory=TraitMap)

    def get(self, name: str) -> bool | None:
        """The family trait `name` (None: unknown, or not a trait of this family)."""
        return self.family.get(name)

    def to_dict(self) -> dict[str, bool | None]:
        """The stored form (fingerprints, run summaries): the named fields, then the family
        traits the probe found (an unknown one is left out, as the map leaves it)."""
        out: dict[str, bool | None] = {
            "renumbers_tool_ids": self.renumbers_tool_ids,
            "deletes_no_content": self.deletes_no_content,
            "splits_reasoning": self.splits_reasoning,
            "counts_stop_token": self.counts_stop_token,
            "ends_reasoning_at_tools": self.ends_reasoning_at_tools,
        }
        out.update(self.family)
        return out


@dataclass(frozen=True, slots=True)
class UsageTolerance:
    """How far our token counts may be from the provider's `usage` and still pass.

    The one place these numbers live: reconstruction flags against them and the gate checks
    against them, both built from a dataset's `gate:` settings (`GateConfig.tolerance`).
    """

    # The prompt is deterministic: any difference means the server rendered another template.
    prompt: int = 0
    # Sampled ids may split text non-canonically, so the model's count can exceed ours. On a
    # path where a parser can drop text this slack is not granted (reconstruct.py).
    completion_abs: int = 4
    completion_rel: float = 0.02

    def completion_allowed(self, reported: int) -> float:
        return max(self.completion_abs, self.completion_rel * reported)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call as the model wrote it: `id` and `arguments` are verbatim strings."""

    id: str
    name: str
    arguments: str


@dataclass(slots=True)
class Completion:
    """A provider response normalised across API dialects.

    `reasoning` is None when the response carried no reasoning field at all, "" when it carried
    an empty one. `content` is None for `content: null`.
    """

    reasoning: str | None
    content: str | None
    tool_calls: list[ToolCall]
    finish_reason: str | None
    usage: dict[str, Any] = field(default_factory=dict)
    provider: str | None = None
    reasoning_field: str | None = None
    native_finish_reason: str | None = None
    # Streamed answers with tool calls: chars of `content` received before each call's first
    # delta (wire/stream.py records it). Delivery, not content: equal answers compare equal.
    content_at_calls: tuple[int, ...] | None = field(default=None, compare=False)
    # `logprobs.content` as returned: one entry per generated token (specregen/logprobs.py).
    logprobs: list[Any] | None = field(default=None, compare=False)


@dataclass(slots=True)
class TokenSample:
    """The reconstructed token stream of one sample, with the checks made on the way."""

    sample_id: str
    input_ids: list[int]
    loss_mask: list[int]
    prompt_len: int
    completion_len: int
    status: Status
    flags: list[str]
    usage_prompt_delta: int | None = None
    usage_completion_delta: int | None = None
    reference_match: ReferenceMatch | None = None
    error: str | None = None
    # What proves the ids (docs/evidence.md); None only in files written before it existed.
    evidence: Evidence | None = None
    # What the ids were built from, for the gate and for audits.
    thinking: bool = True
    reasoning: str | None = None
    content: str | None = None
    # The calls in the ids (after the id policy), and the calls as the API returned them
    # (structured, or parsed from raw markers), for the gate's round trip.
    tool_calls: list[ToolCall] = field(default_factory=list)
    api_tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_mode: ToolMode = "tools"
    # A sample of a whole conversation (`Prompt.turns == "all"`; specregen/conversation): the
    # conversation's id, the user turn it ends at (k, counted from 0), and why the
    # conversation's regeneration ended (`end`, or the stop reason). None for single turns.
    conversation_id: str | None = None
    user_turn: int | None = None
    stop_reason: str | None = None

    @classmethod
    def failed(cls, sample_id: str, error: str) -> TokenSample:
        return cls(
            sample_id=sample_id,
            input_ids=[],
            loss_mask=[],
            prompt_len=0,
            completion_len=0,
            status="error",
            flags=[],
            error=error,
            evidence="none",
        )
