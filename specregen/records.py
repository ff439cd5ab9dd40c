"""The data contracts that cross module boundaries.

Everything here is plain data: a dataset adapter yields `Prompt`s, the client turns a provider
response into a `Completion`, and reconstruction turns a request plus a `Completion` into a
`TokenSample`. Texts are kept byte-exact; tool-call `arguments` stay the strings the API sent.
"""

from __future__ import annotations

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


@dataclass(frozen=True, slots=True)
class ProviderTraits:
    """What a provider's parsers do to an answer, as learned by the probe (None: unknown)."""

    renumbers_tool_ids: bool | None = None  # ids rebuilt as functions.{name}:{history+i}
    deletes_no_content: bool | None = None  # "(no content)" deleted when calls exist
    splits_reasoning: bool | None = None  # reasoning returned separately from content
    counts_stop_token: bool | None = None  # usage.completion_tokens includes <|im_end|>
    # Without streaming, a tool section opened before `</think>` ends the reasoning and the
    # calls come back parsed (SGLang with forced reasoning). False: such a section stays in the
    # reasoning text (vLLM's parsers, docs/upstream-parsers.md), so parsed calls after a
    # reasoning mean the model did close it. (Streamed, one vLLM parser ends it too.)
    ends_reasoning_at_tools: bool | None = None
    # The text before the tool calls comes back stripped of its whitespace (SGLang's qwen25
    # detector, non-streamed); False: returned as written (vLLM's hermes). Qwen3 reads it.
    strips_content_beside_calls: bool | None = None
    # The server's detokenizer puts a space before every added token and before the first
    # ordinary token after one (vLLM's default `spaces_between_special_tokens` with a slow
    # tokenizer such as Kimi's, vllm-project/vllm#33457): reasoning and content begin with a
    # space the model never wrote. A request that sent `spaces_between_special_tokens: false`
    # to a server that honours it has none, whatever this says. K2.5 reads it.
    spaces_around_added_tokens: bool | None = None


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
