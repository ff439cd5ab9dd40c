"""What one probe answer showed: the `Observation`, plain typed data that round-trips through
JSON (probe profiles store it).

`specregen.probe.classify.observe` fills it from an answer; the vote rules read it: the
probe's own (probe/traits.py) and those of the traits a family declares with its probe rules
(`models/probe_rules.py FamilyTrait`), which is why it lives below both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

CallsWhere = Literal["structured", "raw_content", "raw_reasoning", "stripped", "none"]
ReasoningField = Literal["reasoning", "reasoning_content", "reasoning_details", "none"]
# The form of the call ids: the format's own (`ProbeRules.id_form`, e.g. K2.5's
# "functions.NAME:IDX", as stored in profiles), "other" or "none".
IdForm = str
# How the `arguments` strings relate to what the model wrote.
ArgumentsCheck = Literal["verbatim", "trimmed", "reserialized", "changed", "unknown", "none"]
ArgumentsJson = Literal["valid", "invalid", "none"]
Whitespace = Literal["kept", "lost", "unknown", "none"]
# The returned content: absent/null, "" or blank, exactly the `(no content)` placeholder, text.
ContentKind = Literal["none", "empty", "placeholder", "text"]


@dataclass(slots=True)
class Observation:
    """One probe request and what came back."""

    index: int
    ok: bool
    http_status: int | None = None
    error: str | None = None
    calls_where: CallsWhere | None = None  # None: the request failed
    tool_calls: int = 0
    # The raw marker section parses (None when there is no raw section).
    raw_section_parsed: bool | None = None
    reasoning_field: ReasoningField = "none"
    reasoning_chars: int = 0
    id_form: IdForm = "none"
    id_example: str | None = None
    arguments_json: ArgumentsJson = "none"
    arguments: ArgumentsCheck = "none"
    whitespace: Whitespace = "none"
    finish_reason: str | None = None
    native_finish_reason: str | None = None
    provider: str | None = None
    latency_s: float = 0.0
    usage_prompt_tokens: int | None = None
    usage_completion_tokens: int | None = None
    our_prompt_tokens: int | None = None
    our_completion_tokens: int | None = None
    # usage minus ours: positive when the provider counted more tokens than we rebuild.
    prompt_offset: int | None = None
    completion_offset: int | None = None
    reference_match: str | None = None  # when the server returned the completion's token ids
    reconstruct_flags: list[str] = field(default_factory=list)
    # What the parser findings are read from (probe/traits.py, the families' own votes).
    thinking: bool | None = None  # what the request asked; None: the server default
    content_kind: ContentKind = "none"
    history_tool_calls: int = 0  # earlier calls in the request's conversation
    returned_indices: list[int | None] = field(default_factory=list)  # IDX of each returned id
    written_indices: list[int | None] | None = None  # IDX the model wrote (from its token ids)
    wrote_placeholder: bool | None = None  # the model wrote `(no content)` (from its token ids)
    placeholder_tokens: int | None = None  # what the format's placeholder costs in tokens
    think_end_in_content: bool = False  # a literal `</think>` in content: reasoning unsplit
    tools_sent: bool = False  # the request had `tools`: the server's tool parser ran
    # The model opened its tool section before writing `</think>` (from its token ids).
    section_in_think: bool | None = None
    # usage minus the returned fields assembled as they are (no correction of any kind).
    raw_completion_offset: int | None = None
    # Content returned beside structured calls, when not blank: "padded" (whitespace at an
    # end, which a stripping parser would have removed) or "bare" (none).
    content_beside_calls: Literal["padded", "bare"] | None = None
    # From the model's token ids, where its content before the calls has whitespace at an
    # end: True when the returned content is that text, False when it is that text stripped.
    content_as_written: bool | None = None
    # A bare content beside calls: usage minus the fields as the format assembles them, and
    # whether that assembly restored separators around the content (a format's probe rules
    # name the flag that says so: `restored_separators_flag`). The count then tells whether
    # the model wrote them.
    bare_content_offset: int | None = None
    bare_content_restored: bool | None = None
    # The returned reasoning and content (each when not blank) all begin with a space: "all",
    # or "not_all"; None when neither came back. A server that puts spaces around added tokens
    # starts both with one (they follow `<think>` / `</think>`); a model rarely starts both so.
    leading_spaces: Literal["all", "not_all"] | None = None
    # From the model's token ids: the returned reasoning is what it wrote with a space put
    # before it (True), or as written (False).
    spaces_by_ids: bool | None = None
    # `raw_completion_offset` of the fields with the inserted spaces taken out (the format's
    # probe rules say how), where they could have been inserted: the count to read when the
    # probe finds that the server inserts them.
    despaced_completion_offset: int | None = None
    # The answer's logprobs: "all" (they name every generated token), "partial" (some entries
    # cannot be read as tokens, or fewer entries than tokens), "none" (not returned); None
    # without a tokenizer to read them with. `logprobs_why` says what was missing.
    logprobs_coverage: Literal["all", "partial", "none"] | None = None
    logprobs_why: str | None = None
    # The answer as returned is a clean base for counting: no flag that changes what is counted.
    countable: bool = False
    attempts: int = 0  # requests sent for it, retries included
    cost_usd: float = 0.0
