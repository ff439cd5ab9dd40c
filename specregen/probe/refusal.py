"""Refusing a paid run whose tool calls the probe found cannot be rebuilt token-exact."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from specregen.client.prompts import read_prompts
from specregen.errors import UsageError
from specregen.probe.classify import mode_scenarios
from specregen.probe.model import TOOL_MODES, ProfileError, ProviderProfile, load_profile
from specregen.probe.notes import describe_calls


class ProbeRefusal(UsageError):
    """A run must not start: its tool calls would come back in a form that cannot be rebuilt."""


def require_recoverable_tool_calls(
    profile: ProviderProfile, tool_mode: str, *, probe_file: str | Path | None = None
) -> None:
    """Raise ProbeRefusal unless the profile found tool calls recoverable in `tool_mode`."""
    if tool_mode not in TOOL_MODES:
        raise ValueError(f"tool_mode must be one of {', '.join(TOOL_MODES)}, not {tool_mode!r}")
    if profile.tool_calls_recoverable_by_mode.get(tool_mode) is True:
        return
    names = mode_scenarios(profile.thinking)[tool_mode]
    present = [s for s in (profile.scenario(n) for n in names) if s is not None]
    # The scenario that lost calls explains the refusal best; else the inconclusive one.
    scenario = next((s for s in present if s.recoverable is False), None) or next(
        iter(present), None
    )
    how = describe_calls(scenario) if scenario is not None else "untested (no scenario ran)"
    host = urlsplit(profile.base_url).netloc or profile.base_url
    raise ProbeRefusal(
        f"the endpoint {profile.model} at {host} returns tool calls {how} when tools are sent"
        f" as {tool_mode}: they cannot be rebuilt token-exact; refusing to start."
        f" Probe: {probe_file if probe_file is not None else 'the provider profile'}"
    )


def check_run_against_profile(profile_path: str | Path, prompts_path: str, cfg: Any) -> None:
    """Before `specregen infer` sends anything: refuse when a prompt relies on tool calls the
    profile says cannot be rebuilt, or when the profile was made for another endpoint.

    A prompt relies on tool calls when it has `tools`, in either tool mode. `cfg` is the run's
    EndpointConfig. An unreadable prompts file is left for the run itself to report.
    """
    import fsspec

    try:
        profile = load_profile(profile_path)
    except ProfileError as exc:
        raise ProbeRefusal(str(exc)) from None
    routing = cfg.provider.as_body() if cfg.provider is not None else None
    probed = (profile.model, profile.base_url, profile.routing)
    if probed != (cfg.model, cfg.base_url, routing):
        raise ProbeRefusal(
            f"the provider profile {profile_path} was made for {profile.model} at"
            f" {profile.base_url} (routing {profile.routing}), but this run sends to {cfg.model}"
            f" at {cfg.base_url} (routing {routing}); probe this endpoint and pass that profile"
        )
    unrecoverable = {m for m in TOOL_MODES if not profile.tool_calls_recoverable_by_mode[m]}
    if not unrecoverable:
        return
    try:
        with fsspec.open(prompts_path, "rt", encoding="utf-8", errors="replace") as handle:
            for prompt in read_prompts(handle, lambda number, reason: None):
                if prompt.tools and prompt.tool_mode in unrecoverable:
                    require_recoverable_tool_calls(profile, prompt.tool_mode,
                                                   probe_file=profile_path)
    except (OSError, ValueError):
        return
