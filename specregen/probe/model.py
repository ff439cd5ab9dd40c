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
from typing import Any

from specregen.errors import UsageError
from specregen.models.probe_answer import (
    ArgumentsCheck,
    ArgumentsJson,
    CallsWhere,
    IdForm,
    Observation,
    ReasoningField,
    Whitespace,
)
from specregen.records import TOOL_MODES, ProviderTraits, ToolMode, TraitMap

PROFILE_KIND = "specregen.provider_profile"
# 2: the parser findings reconstruction needs (`findings`), history and plain scenarios, cost.
PROFILE_VERSION = 2


class ProfileError(UsageError, ValueError):
    """A provider-profile file that cannot be read or is not a profile."""


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
    # The traits the format's family declares with its probe rules (`FamilyTrait`), by name:
    # examined only for that family, read only by its format.
    family: dict[str, bool | None] = field(default_factory=dict)
    # Logprobs come back (the `logprobs` scenario) naming every generated token: the run asks
    # for them, and they prove the rebuilt ids. For people and the run, not a parser trait.
    returns_logprobs: bool | None = None
    evidence: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The stored form: the family's traits (each one it declares, null when unknown)
        stand among the others, where the parsers' findings end."""
        out: dict[str, Any] = {}
        for name, value in asdict(self).items():
            if name == "family":
                out.update(self.family)
            else:
                out[name] = value
        return out

    @classmethod
    def from_dict(cls, data: Any, where: str) -> ParserFindings:
        """Read back `to_dict`'s form: a key that is no field is a family trait."""
        if not isinstance(data, dict):
            raise ProfileError(f"{where} is not an object")
        known = {f.name for f in dataclasses.fields(cls)} - {"family"}
        # (A profile written before families declared their traits has both families' old
        # traits, the other's null: a null trait is an unknown one, which no format reads.)
        family = {k: v for k, v in data.items() if k not in known}
        findings = cls(**{k: v for k, v in data.items() if k in known}, family=family)
        for name, value in [*((n, getattr(findings, n)) for n in sorted(known - {"evidence"})),
                            *findings.family.items()]:
            if value not in (True, False, None):
                raise ProfileError(f"{where}.{name} must be true, false or null")
        return findings


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
            family=TraitMap(f.family),
        )

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["findings"] = self.findings.to_dict()
        return out

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
    findings = ParserFindings.from_dict(data.get("findings", {}), f"{where}: findings")
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
