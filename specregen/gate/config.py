"""The gate's settings. There is deliberately no switch that turns the gate off."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from specregen.records import EVIDENCE_LEVELS, UsageTolerance

if TYPE_CHECKING:
    from specregen.reconstruct import ReconstructConfig

_TOLERANCE = UsageTolerance()
# Keys a pipeline config might use to try to skip the gate; refused with a clear message rather
# than "unknown key", so nobody goes looking for the right spelling.
_DISABLING_KEYS = frozenset({"enabled", "enable", "disabled", "skip", "bypass", "off"})


@dataclass(frozen=True)
class GateConfig:
    """Thresholds and tolerances; overridable per dataset with `override`."""

    # Fail the dataset when more than this share of its samples is quarantined. 1.0 lets every
    # dataset without a hard invariant break pass, but the report still lists everything.
    max_quarantine_share: float = 0.02
    # A `length` sample is what the model wrote, cut short: fine as draft-model training data.
    accept_truncated: bool = True
    # Providers that leave the markers in `content` report `stop` although the model called a
    # tool; a dataset from such a provider can opt in to tolerating that.
    allow_stop_with_calls: bool = False
    # Usage tolerances: the one place both reconstruction (`reconstruct_config()`) and the gate
    # take them from; defaults from `records.UsageTolerance`.
    prompt_tolerance: int = _TOLERANCE.prompt
    completion_tolerance_abs: int = _TOLERANCE.completion_abs
    completion_tolerance_rel: float = _TOLERANCE.completion_rel
    # The weakest evidence an accepted sample may have (docs/evidence.md): `reference`,
    # `usage_exact`, `usage_tolerated` or `none`.
    min_evidence: str = "usage_tolerated"
    # Report size: failing examples kept per check, tool names listed.
    examples_per_check: int = 3
    tools_in_report: int = 25

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            kinds: dict[str, type | tuple[type, ...]] = {
                "bool": bool, "int": int, "float": (int, float), "str": str}
            expected = kinds[str(f.type)]
            if isinstance(value, bool) != (expected is bool) or not isinstance(value, expected):
                raise ValueError(f"gate setting {f.name} must be a {f.type}, got {value!r}")
        if not 0.0 <= self.max_quarantine_share <= 1.0:
            raise ValueError(
                f"max_quarantine_share must be within [0, 1], got {self.max_quarantine_share}"
            )
        for name in ("prompt_tolerance", "completion_tolerance_abs", "examples_per_check",
                     "tools_in_report"):
            if getattr(self, name) < 0:
                raise ValueError(f"gate setting {name} must be >= 0, got {getattr(self, name)}")
        if self.completion_tolerance_rel < 0:
            raise ValueError(
                f"completion_tolerance_rel must be >= 0, got {self.completion_tolerance_rel}"
            )
        if self.min_evidence not in EVIDENCE_LEVELS:
            raise ValueError(f"min_evidence must be one of {', '.join(EVIDENCE_LEVELS)}, got "
                             f"{self.min_evidence!r}")

    @property
    def tolerance(self) -> UsageTolerance:
        return UsageTolerance(self.prompt_tolerance, self.completion_tolerance_abs,
                              self.completion_tolerance_rel)

    def reconstruct_config(self) -> ReconstructConfig:
        """Reconstruction's settings from the same numbers, so raising a tolerance here raises
        it for the flags reconstruction sets too."""
        from specregen.reconstruct import ReconstructConfig

        return ReconstructConfig(tolerance=self.tolerance)

    def override(self, values: Mapping[str, Any] | None) -> GateConfig:
        """This config with a dataset's overrides applied; unknown keys are an error."""
        if not values:
            return self
        disabling = _DISABLING_KEYS.intersection(values)
        if disabling:
            raise ValueError(
                f"gate setting {sorted(disabling)[0]!r}: the tool-call gate cannot be disabled; "
                "raise max_quarantine_share (up to 1.0) to let a dataset through instead"
            )
        known = {f.name for f in fields(self)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(
                f"unknown gate setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        return replace(self, **values)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
