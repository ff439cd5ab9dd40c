"""What a probe found, as plain typed data that round-trips through JSON.

A `ProviderProfile` holds no secret: the key never enters the probe's findings, only the NAME of
the variable that holds it (`api_key_env`), the same as an endpoint config.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from specregen.errors import UsageError
from specregen.records import TOOL_MODES, ProviderTraits, ToolMode

PROFILE_KIND = "specregen.provider_profile"
# 2: the parser findings reconstruction needs (`findings`), history and plain scenarios, cost.
PROFILE_VERSION = 2

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


class ProfileError(UsageError, ValueError):
    """A provider-profile file that cannot be read or is not a profile."""


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
    # What the parser findings are read from (see probe/traits.py).
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


@dataclass(slots=True)
class ScenarioResult:
    """One scenario: its requests' observations and their summary (the worst case wins)."""

    name: str
    description: str
    tool_mode: ToolMode
    tools_sent: bool
    thinking: bool | None  # what the request asked; None: the server default
    observations: list[Observation] = field(default_factory=list)
    calls_where: CallsWhere | None = None  # None: every request failed
    where_counts: dict[str, int] = field(default_factory=dict)
    # None: no request of the scenario made a call (or all failed), so nothing can be said.
    recoverable: bool | None = None
    reasoning_field: ReasoningField = "none"
    id_form: IdForm = "none"
    id_example: str | None = None
    arguments_json: ArgumentsJson = "none"
    arguments: ArgumentsCheck = "none"
    whitespace: Whitespace = "none"
    prompt_offsets: list[int] = field(default_factory=list)
    completion_offsets: list[int] = field(default_factory=list)
    finish_reasons: dict[str, int] = field(default_factory=dict)
    providers: list[str] = field(default_factory=list)
    latency_s_max: float = 0.0
    errors: list[str] = field(default_factory=list)


@dataclass(slots=True)
class ParserFindings:
    """What the provider's parsers do to an answer, learned from the probe's answers.

    Each finding is None when the answers could not tell; `evidence` says why, per finding.
    All but `forces_reasoning` (which is for people) are `ProviderTraits` for reconstruction.
    """

    renumbers_tool_ids: bool | None = None
    deletes_no_content: bool | None = None
    splits_reasoning: bool | None = None
    counts_stop_token: bool | None = None
    ends_reasoning_at_tools: bool | None = None  # a section opened in thinking ends it, parsed
    forces_reasoning: bool | None = None  # reasoning returned although thinking was off
    # The text before the calls comes back stripped of its whitespace (SGLang's qwen25
    # detector); examined only for formats whose probe rules list it (`extra_findings`).
    strips_content_beside_calls: bool | None = None
    # A space before every added token and before the first text after one, from the server's
    # detokenizer (vLLM's default with a slow tokenizer); examined only for formats whose probe
    # rules list it (`extra_findings`).
    spaces_around_added_tokens: bool | None = None
    # Logprobs come back (the `logprobs` scenario) naming every generated token: the run asks
    # for them, and they prove the rebuilt ids. For people and the run, not a parser trait.
    returns_logprobs: bool | None = None
    evidence: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class ProviderProfile:
    """How one endpoint (model + routing) returns tool calls and reasoning."""

    base_url: str
    model: str
    dialect: str
    routing: dict[str, Any] | None
    thinking: bool | None
    tool_mode: ToolMode  # the mode the run intends; `tool_calls_recoverable` is for it
    api_key_env: str
    tokenizer: str | None
    glaive_source: str | None
    requests_per_scenario: int
    created_at: str
    scenarios: list[ScenarioResult]
    tool_calls_recoverable: bool
    tool_calls_recoverable_by_mode: dict[str, bool]
    reasoning_field: ReasoningField
    providers: list[str]
    notes: list[str]
    findings: ParserFindings = field(default_factory=ParserFindings)
    # What the probe itself cost: every request sent (retries included) and its USD.
    probe_requests: int = 0
    probe_cost_usd: float = 0.0
    kind: str = PROFILE_KIND
    version: int = PROFILE_VERSION

    def scenario(self, name: str) -> ScenarioResult | None:
        return next((s for s in self.scenarios if s.name == name), None)

    def traits(self) -> ProviderTraits:
        """The findings reconstruction takes (None where the probe could not tell)."""
        f = self.findings
        return ProviderTraits(
            renumbers_tool_ids=f.renumbers_tool_ids,
            deletes_no_content=f.deletes_no_content,
            splits_reasoning=f.splits_reasoning,
            counts_stop_token=f.counts_stop_token,
            ends_reasoning_at_tools=f.ends_reasoning_at_tools,
            strips_content_beside_calls=f.strips_content_beside_calls,
            spaces_around_added_tokens=f.spaces_around_added_tokens,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n"


def save_profile(profile: ProviderProfile, path: str | Path) -> Path:
    """Write the profile as JSON, atomically (a half-written profile must not gate a run)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(profile.to_json())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_profile(path: str | Path) -> ProviderProfile:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ProfileError(f"cannot read the provider profile {path}: {exc.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProfileError(f"the provider profile {path} is not JSON: {exc}") from None
    return profile_from_dict(data, where=str(path))


def profile_from_dict(data: Any, *, where: str = "profile") -> ProviderProfile:
    if not isinstance(data, dict) or data.get("kind") != PROFILE_KIND:
        raise ProfileError(f"{where} is not a provider profile (written by `specregen probe`)")
    if data.get("version") != PROFILE_VERSION:
        raise ProfileError(
            f"{where} has profile version {data.get('version')!r}; this specregen reads"
            f" version {PROFILE_VERSION}: probe the endpoint again"
        )
    scenarios = []
    for i, raw in enumerate(_list(data, "scenarios", where)):
        at = f"{where}: scenarios[{i}]"
        obs = [_build(Observation, o, f"{at}.observations[{j}]")
               for j, o in enumerate(_list(raw, "observations", at))]
        scenarios.append(_build(ScenarioResult, {**raw, "observations": obs}, at))
    findings = _build(ParserFindings, data.get("findings", {}), f"{where}: findings")
    for name in ("renumbers_tool_ids", "deletes_no_content", "splits_reasoning",
                 "counts_stop_token", "ends_reasoning_at_tools", "forces_reasoning",
                 "strips_content_beside_calls", "spaces_around_added_tokens",
                 "returns_logprobs"):
        if getattr(findings, name) not in (True, False, None):
            raise ProfileError(f"{where}: findings.{name} must be true, false or null")
    profile = _build(ProviderProfile, {**data, "scenarios": scenarios, "findings": findings},
                     where)
    by_mode = profile.tool_calls_recoverable_by_mode
    if not isinstance(by_mode, dict) or any(not isinstance(by_mode.get(m), bool)
                                            for m in TOOL_MODES):
        raise ProfileError(f"{where}: tool_calls_recoverable_by_mode must give a bool per mode")
    return profile


def _list(data: Any, name: str, where: str) -> list[Any]:
    value = data.get(name) if isinstance(data, dict) else None
    if not isinstance(value, list):
        raise ProfileError(f"{where}: '{name}' is missing or not a list")
    return value


def _build(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise ProfileError(f"{where} is not an object")
    known = {f.name for f in dataclasses.fields(cls)}
    required = {
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    missing = sorted(required - data.keys())
    if missing:
        raise ProfileError(f"{where} lacks {', '.join(missing)}")
    # Unknown keys are ignored: a newer writer may add findings an older reader need not know.
    return cls(**{k: v for k, v in data.items() if k in known})
