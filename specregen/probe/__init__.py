"""The provider probe: before a long paid run, ask the endpoint how it really returns tool calls.

    scenarios = build_scenarios(requests=3)
    profile = probe_endpoint(cfg, key, scenarios, tool_mode="tools",
                             fmt=get_format(cfg.format_name, tok))
    save_profile(profile, "profile.json")
    require_recoverable_tool_calls(load_profile("profile.json"), "tools")  # or ProbeRefusal

`classify` judges responses (pure), `traits` reads the parser findings off them (what
reconstruction needs: `profile.traits()`), `scenarios` builds the questions, `run` sends them,
`refusal` gates `specregen infer --provider-profile`; `specregen probe` is specregen.cli.probe.
"""

from specregen.probe.classify import CallsFinding, classify_calls, observe, summarize
from specregen.probe.model import (
    ParserFindings,
    ProfileError,
    ProviderProfile,
    ScenarioResult,
    load_profile,
    save_profile,
)
from specregen.probe.refusal import (
    ProbeRefusal,
    check_run_against_profile,
    require_recoverable_tool_calls,
)
from specregen.probe.run import ProbeFatalError, build_profile, probe_endpoint, run_scenarios
from specregen.probe.scenarios import ProbeSetupError, Scenario, build_scenarios
from specregen.probe.traits import infer_findings

__all__ = [
    "CallsFinding",
    "ParserFindings",
    "ProbeFatalError",
    "ProbeRefusal",
    "ProbeSetupError",
    "ProfileError",
    "ProviderProfile",
    "Scenario",
    "ScenarioResult",
    "build_profile",
    "build_scenarios",
    "check_run_against_profile",
    "classify_calls",
    "infer_findings",
    "load_profile",
    "observe",
    "probe_endpoint",
    "require_recoverable_tool_calls",
    "run_scenarios",
    "save_profile",
    "summarize",
]
