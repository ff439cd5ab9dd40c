"""Stage `probe`: how the configured endpoint returns tool calls, learned before paying.

The profile is stored beside the datasets, one per endpoint: `{storage}/_probe/{key}.json`,
where the key covers what shapes the requests (the endpoint fingerprint), the base URL (another
server is another parser), streaming (parsers differ streamed and not) and the tokenizer (the
count-based findings are measured with it).
A changed endpoint therefore finds no profile and is probed again.

`config.probe` says when the probe runs, before the first paid request of a dataset:

* `auto` (default): when a dataset of the config needs tool calls and no profile is stored
  for this endpoint; whichever dataset starts first probes, so every dataset's fingerprint sees
  the same traits. A config without tool datasets uses a stored profile's traits when there is
  one. Only the datasets that need tool calls can be refused by the profile.
* `required`: every dataset needs a profile; one is probed when none is stored.
* `off`: never probe, never refuse, and ignore any stored profile: reconstruction runs without
  provider traits (unknown), and a warning says what that costs.

A dataset that needs tool calls refuses to start when the profile says they come back in a form
that cannot be rebuilt; the probe's requests and cost are part of the dataset's summary. A
profile written by an older specregen (another `PROFILE_VERSION`) counts as absent.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from specregen.client.secrets import ApiKey
from specregen.config import DatasetConfig
from specregen.models.registry import probe_rules, reads_provider_traits
from specregen.pipeline.layout import DatasetRun
from specregen.probe.model import TOOL_MODES, ProfileError, ProviderProfile, profile_from_dict
from specregen.probe.notes import finding_notes
from specregen.probe.refusal import ProbeRefusal, require_recoverable_tool_calls
from specregen.probe.run import probe_endpoint
from specregen.probe.scenarios import build_scenarios, glaive_probe_prompt, rules_of
from specregen.records import ProviderTraits
from specregen.store.manifest import fingerprint

STAGE = "_probe"
# Requests per scenario when the pipeline probes (six or seven scenarios): a few cents.
PIPELINE_PROBE_REQUESTS = 2
OFF_WARNING = (
    "probe: off -- the endpoint is not probed: a provider that strips or rewrites tool calls is"
    " found only at the gate, after paying, and reconstruction runs without the provider's"
    " traits (id renumbering, (no content) deletion, reasoning split, stop-token counting"
    " unknown), so more samples are flagged"
)

Status = Literal["off", "not_needed", "stored", "probed", "failed"]
logger = logging.getLogger(__name__)
_LOCKS: dict[tuple[str, str], threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def probe_key(run: DatasetRun) -> str:
    e = run.config.endpoint
    # Streamed or not changes what some parsers return (SGLang's ids), and the probe asks the
    # way the run asks; the endpoint fingerprint leaves `stream` out (it does not shape bodies).
    return fingerprint("probe", run.endpoint_fp, e.base_url.rstrip("/"), e.stream,
                       run.config.tokenizer)


def profile_parts(run: DatasetRun) -> tuple[str, ...]:
    return (STAGE, f"{probe_key(run)}.json")


def needs_tool_calls(dataset: DatasetConfig) -> bool:
    if dataset.requires_tool_calls is not None:
        return dataset.requires_tool_calls
    return dataset.adapter in ("glaive", "messages", "sharegpt")


def probe_wanted(run: DatasetRun) -> bool:
    """Whether this dataset must have a profile before paying (see the module docstring)."""
    mode = run.config.probe
    if not reads_provider_traits(run.config.format_name):
        return False  # the format's reconstruction depends on nothing a probe finds
    # `auto`: wanted when ANY dataset of the config needs tool calls, not only this one. The
    # traits enter every dataset's reconstruct fingerprint; if only the tool datasets probed,
    # a dataset that started before their probe finished would see none, and the same config
    # run again would see them and redo it. Whichever dataset comes first probes (one probe
    # per endpoint: `_lock`), the others read its profile.
    return mode == "required" or (mode == "auto" and any(needs_tool_calls(d)
                                                         for d in run.config.datasets))


def read_profile(run: DatasetRun) -> tuple[ProviderProfile | None, str | None]:
    """The stored profile of the run's endpoint, or None and why (absent, old, unreadable)."""
    parts = profile_parts(run)
    where = run.store.url_of(*parts)
    if not run.store.exists(*parts):
        return None, f"no profile stored for this endpoint at {where}"
    try:
        return profile_from_dict(json.loads(run.store.read_bytes(*parts)), where=where), None
    except (ProfileError, ValueError) as exc:
        return None, str(exc)


def stored_traits(run: DatasetRun) -> ProviderTraits | None:
    """The endpoint's stored traits; None with `probe: off` or no (current) profile."""
    if run.config.probe == "off" or not reads_provider_traits(run.config.format_name):
        return None
    profile, _ = read_profile(run)
    return profile.traits() if profile is not None else None


def logprobs_wanted(run: DatasetRun) -> bool:
    """Whether the run asks for logprobs: `endpoint.logprobs` when set, else when the stored
    profile found that they come back naming every token."""
    if run.config.endpoint.logprobs is not None:
        return run.config.endpoint.logprobs
    if run.config.probe == "off":
        return False
    profile, _ = read_profile(run)
    return profile is not None and profile.findings.returns_logprobs is True


def with_stored_traits(run: DatasetRun) -> DatasetRun:
    traits = stored_traits(run)
    return run if traits == run.traits else replace(run, traits=traits)


@dataclass
class ProbeOutcome:
    """What the probe stage did for one dataset: the run to continue with (traits attached),
    and, when it must not continue, why (`refusal`)."""

    run: DatasetRun
    status: Status
    where: str | None = None
    profile: ProviderProfile | None = None
    requests: int = 0  # sent by this stage (0 when the profile was stored already)
    cost_usd: float = 0.0
    refusal: str | None = None
    notes: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """Small and JSON-able: for the run summary and the flow's result."""
        p = self.profile
        return {
            "status": self.status,
            "profile": self.where,
            "requests": self.requests,
            "cost_usd": round(self.cost_usd, 6),
            "refusal": self.refusal,
            "recoverable_by_mode": p.tool_calls_recoverable_by_mode if p else None,
            "traits": _traits_dict(self.run),
            "notes": self.notes,
        }


def _traits_dict(run: DatasetRun) -> dict[str, bool | None] | None:
    return run.traits.to_dict() if run.traits is not None else None


def _lock(run: DatasetRun) -> threading.Lock:
    # Datasets of one pipeline run at once in one process: one probe per endpoint, the others
    # wait for its profile. (Separate processes may each probe once; the last write wins.)
    key = (run.store.url_of(STAGE), probe_key(run))
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(key, threading.Lock())


def probe_stage(run: DatasetRun, api_key: ApiKey | None) -> ProbeOutcome:
    """Before a dataset's first paid request: read or make its endpoint's profile, attach the
    traits, and say whether the dataset must refuse. Raises ProbeFatalError on a key error."""
    if run.config.probe == "off":
        logger.warning("%s: %s", run.name, OFF_WARNING)
        return ProbeOutcome(replace(run, traits=None), "off", notes=[OFF_WARNING])
    if not reads_provider_traits(run.config.format_name):
        return ProbeOutcome(replace(run, traits=None), "not_needed", notes=[
            f"the {run.config.format_name} format reads no provider traits: nothing to probe"])
    notes: list[str] = []
    with _lock(run):
        profile, problem = read_profile(run)
        status: Status = "stored"
        requests, cost = 0, 0.0
        if profile is None and probe_wanted(run):
            assert problem is not None
            logger.info("%s: probing the endpoint before paying (%s)", run.name, problem)
            notes.append(problem)
            profile = probe_endpoint_of(run, api_key)
            status, requests, cost = "probed", profile.probe_requests, profile.probe_cost_usd
            if _answered_nothing(profile):
                first = next((e for s in profile.scenarios for e in s.errors), "no answer")
                return ProbeOutcome(
                    replace(run, traits=None), "failed", requests=requests, cost_usd=cost,
                    profile=profile, notes=notes,
                    refusal=(f"{run.name}: the endpoint answered none of the probe's"
                             f" {requests} requests ({first}); nothing was stored: run again"
                             " when the endpoint answers"),
                )
            run.store.write_bytes(profile.to_json().encode(), *profile_parts(run))
    where = run.store.url_of(*profile_parts(run))
    if profile is None:
        return ProbeOutcome(replace(run, traits=None), "not_needed", notes=[problem or ""])
    outcome = ProbeOutcome(replace(run, traits=profile.traits()), status, where=where,
                           profile=profile, requests=requests, cost_usd=cost, notes=notes)
    if needs_tool_calls(run.dataset):
        try:
            require_recoverable_tool_calls(profile, run.dataset.tool_mode, probe_file=where)
        except ProbeRefusal as exc:
            outcome.refusal = f"{run.name}: {exc}"
    return outcome


def probe_endpoint_of(
    run: DatasetRun, api_key: ApiKey | None, *, requests: int = PIPELINE_PROBE_REQUESTS
) -> ProviderProfile:
    """Probe the run's endpoint (blocking; a few requests); the caller stores the profile."""
    from specregen.pipeline.reconstruction import run_format

    config = run.config
    glaive = next((d for d in config.datasets if d.adapter == "glaive"), None)
    prompt = glaive_probe_prompt(glaive.source) if glaive else None
    return probe_endpoint(
        config.endpoint, api_key,
        build_scenarios(requests, prompt, rules=rules_of(config.endpoint.format_name)),
        tool_mode=run.dataset.tool_mode, fmt=run_format(run),
        tokenizer=config.tokenizer, glaive_source=glaive.source if glaive else None,
    )


def probe_and_store(
    run: DatasetRun, api_key: ApiKey | None, *, requests: int = PIPELINE_PROBE_REQUESTS
) -> ProviderProfile:
    """Probe now whatever is stored (the `probe` flow), and store the profile."""
    with _lock(run):
        profile = probe_endpoint_of(run, api_key, requests=requests)
        if not _answered_nothing(profile):
            run.store.write_bytes(profile.to_json().encode(), *profile_parts(run))
    return profile


def _answered_nothing(profile: ProviderProfile) -> bool:
    return not any(o.ok for s in profile.scenarios for o in s.observations)


def probe_markdown(outcome: ProbeOutcome) -> str:
    """The stage's outcome for people (the Prefect artifact)."""
    run, p = outcome.run, outcome.profile
    e = run.config.endpoint
    head = {"probed": "probed now", "stored": "stored profile used", "off": "probe off",
            "not_needed": "no profile needed", "failed": "probe failed"}[outcome.status]
    lines = [f"# Endpoint probe for {run.name}: {head}", "",
             f"{e.model} at {e.base_url} ({e.dialect}), `probe: {run.config.probe}`", ""]
    if outcome.refusal:
        lines += [f"**Refused before paying:** {outcome.refusal}", ""]
    lines += ["| | |", "|---|---|",
              f"| requests sent by this probe | {outcome.requests} |",
              f"| cost (USD) | {outcome.cost_usd:.6f} |",
              f"| profile | {outcome.where or '-'} |"]
    if p is not None:
        for mode in TOOL_MODES:
            ok = p.tool_calls_recoverable_by_mode.get(mode)
            lines.append(f"| tool calls recoverable as {mode} | {'yes' if ok else 'NO'} |")
        lines += ["", "## Parser findings", ""]
        rules = probe_rules(run.config.format_name)
        lines += [f"- {note}" for note in finding_notes(p.findings, rules)]
        lines += ["", "## Notes", ""] + [f"- {note}" for note in p.notes]
    lines += [f"- {note}" for note in outcome.notes if note]
    return "\n".join(lines) + "\n"
