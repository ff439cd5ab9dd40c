"""Sending the probe: every request of every scenario at once, a few retries each.

Requests are streamed or not as the run's config says (streams use the client's idle timeout,
so a slow reasoning answer is not a failure while it keeps sending). An HTTP error is recorded
in its scenario; 401/402 (and a key httpx cannot send) stop the probe with `ProbeFatalError`,
whose message names the key's variable, never the key. An endpoint that cannot be reached
before it answered anything stops it with `EndpointUnreachableError` (client/reach.py).
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx

from specregen.client.accounting import response_cost
from specregen.client.config import EndpointConfig
from specregen.client.reach import is_unreachable, unreachable_error
from specregen.client.request import build_request
from specregen.client.scheduler import backoff_delay
from specregen.client.secrets import ApiKey, scrub_text
from specregen.client.transport import AttemptResult, send
from specregen.errors import EXIT_AUTH, EXIT_USAGE, SpecregenError
from specregen.models.chat_format import ChatFormat
from specregen.models.probe_answer import Observation
from specregen.models.registry import probe_rules
from specregen.probe.classify import (
    failed_observation,
    observe,
    overall_reasoning_field,
    recoverable_by_mode,
    summarize,
)
from specregen.probe.model import ProviderProfile, ScenarioResult, ToolMode
from specregen.probe.notes import profile_notes
from specregen.probe.scenarios import Scenario, rules_of
from specregen.probe.traits import infer_findings

# A probe is a quick look: a few retries on 429/5xx, not a paid run's patience.
MAX_ATTEMPTS = 3
# Error classes that end the probe: every further request would fail the same way.
KEY_ERRORS = frozenset({"unauthorized", "payment_required", "bad_request_headers"})


class ProbeFatalError(SpecregenError, RuntimeError):
    """The endpoint refused the key or the account (or cannot be reached at all by its URL)."""

    def __init__(self, message: str, *, error_class: str, http_status: int | None) -> None:
        super().__init__(message)
        self.error_class = error_class
        self.http_status = http_status
        # A key or account error is the user's to fix (exit 3); anything else is usage (2).
        self.exit_code = EXIT_AUTH if self.key_error else EXIT_USAGE

    @property
    def key_error(self) -> bool:
        return self.error_class in KEY_ERRORS


@dataclass(slots=True)
class _Shared:
    stop: asyncio.Event
    fatal: AttemptResult | None = None
    # Whether the endpoint answered at all, and the first failed connection before it did
    # (client/reach.py: the probe stops and names the URL).
    answered: bool = False
    unreachable: AttemptResult | None = None


@dataclass(slots=True)
class _Asked:
    result: AttemptResult
    attempts: int = 0  # requests sent, retries included: each may be paid
    cost_usd: float = 0.0


def scenario_config(cfg: EndpointConfig, scenario: Scenario) -> EndpointConfig:
    """The run's config with the scenario's thinking switch if it sets one.

    Streamed or not as the run is: SGLang returns other ids streamed (the local position) than
    not (the index the model wrote), so the probe must ask the way the run will.
    """
    update: dict[str, Any] = {"logprobs": True} if scenario.logprobs else {}
    if scenario.thinking_override is not None:
        # The switch alone: a configured reasoning effort could contradict it in the body.
        update.update(thinking=scenario.thinking_override, reasoning=None)
    return cfg.model_copy(update=update)


async def run_scenarios(
    cfg: EndpointConfig,
    key: ApiKey | None,
    scenarios: list[Scenario],
    *,
    fmt: ChatFormat | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> list[ScenarioResult]:
    """Every request of every scenario concurrently; raises ProbeFatalError on 401/402.

    The endpoint's format (`cfg.format_name`) must have probe rules (ProbeSetupError if not):
    they say how its answers are read; `fmt` (the format over a tokenizer) adds token counts.
    """
    rules = rules_of(cfg.format_name)
    shared = _Shared(stop=asyncio.Event())
    jobs: list[tuple[int, int, EndpointConfig, dict[str, Any]]] = []
    for s_index, scenario in enumerate(scenarios):
        s_cfg = scenario_config(cfg, scenario)
        for p_index, prompt in enumerate(scenario.prompts):
            jobs.append((s_index, p_index, s_cfg, build_request(prompt, s_cfg)))
    async with httpx.AsyncClient(transport=transport) as client:
        results = await asyncio.gather(
            *(_ask(client, job_cfg, body, key, shared) for _, _, job_cfg, body in jobs)
        )
    if shared.unreachable is not None and not shared.answered:
        raise unreachable_error(cfg.base_url, shared.unreachable.error_message)
    if shared.fatal is not None:
        raise _fatal_error(shared.fatal, cfg, key)

    observations: list[list[Observation]] = [[] for _ in scenarios]
    for (s_index, p_index, _, body), asked in zip(jobs, results, strict=True):
        result = asked.result
        if result.final_answer and result.response is not None:
            obs = observe(p_index, body, result.response, rules=rules, fmt=fmt,
                          latency_s=result.latency_s,
                          http_status=result.http_status)
        else:
            obs = failed_observation(p_index, result.error_class, result.error_message,
                                     result.http_status, result.latency_s)
        obs.attempts, obs.cost_usd = asked.attempts, asked.cost_usd
        observations[s_index].append(obs)
    out = []
    for scenario, found in zip(scenarios, observations, strict=True):
        thinking = (cfg.thinking if scenario.thinking_override is None
                    else scenario.thinking_override)
        scenario_result = ScenarioResult(
            name=scenario.name, description=scenario.description,
            tool_mode=scenario.tool_mode, tools_sent=scenario.tools_sent, thinking=thinking)
        out.append(summarize(scenario_result, found))
    return out


async def _ask(
    client: httpx.AsyncClient,
    cfg: EndpointConfig,
    body: dict[str, Any],
    key: ApiKey | None,
    shared: _Shared,
) -> _Asked:
    attempts = min(MAX_ATTEMPTS, cfg.retry.max_attempts)
    rng = random.Random()
    result: AttemptResult | None = None
    asked = _Asked(result=None)  # type: ignore[arg-type]
    for attempt in range(1, attempts + 1):
        if shared.stop.is_set():
            break
        result = await send(client, cfg, body, key)
        asked.result = result
        if result.http_status is not None:
            shared.answered = True
        elif is_unreachable(result) and not shared.answered:
            if shared.unreachable is None:
                shared.unreachable = result
            shared.stop.set()
            return asked
        asked.attempts += 1
        asked.cost_usd += response_cost(result.response, cfg.prices) or 0.0
        if result.kind == "fatal":
            if shared.fatal is None:
                shared.fatal = result
            shared.stop.set()
            return asked
        if result.final_answer or result.kind == "permanent" or attempt == attempts:
            return asked
        delay = backoff_delay(attempt, cfg.retry, result.retry_after_s, rng)
        try:
            async with asyncio.timeout(delay):
                await shared.stop.wait()
        except TimeoutError:
            pass
    if result is None:
        asked.result = AttemptResult(status="failed", response=None, latency_s=0.0,
                                     http_status=None, error_class="abandoned",
                                     error_message="the probe stopped first")
    return asked


def _fatal_error(
    result: AttemptResult, cfg: EndpointConfig, key: ApiKey | None
) -> ProbeFatalError:
    var = cfg.api_key_env
    detail = scrub_text(result.error_message or "", key)
    error_class = result.error_class or "fatal"
    if error_class == "unauthorized" and key is None:
        message = f"the endpoint requires an API key and ${var} is not set ({detail})"
    elif error_class == "unauthorized":
        message = f"the endpoint rejected the key in ${var} ({detail}); set {var} to a valid key"
    elif error_class == "payment_required":
        message = (f"the account of the key in ${var} cannot pay for requests ({detail});"
                   " add credits or use another key")
    else:
        message = detail
    return ProbeFatalError(message, error_class=error_class, http_status=result.http_status)


def build_profile(
    cfg: EndpointConfig,
    results: list[ScenarioResult],
    *,
    tool_mode: ToolMode,
    requests: int,
    tokenizer: str | None = None,
    glaive_source: str | None = None,
) -> ProviderProfile:
    by_mode = recoverable_by_mode(results, cfg.thinking)
    rules = probe_rules(cfg.format_name)
    findings = infer_findings(results, rules)
    observations = [o for s in results for o in s.observations]
    return ProviderProfile(
        base_url=cfg.base_url,
        model=cfg.model,
        dialect=cfg.dialect,
        routing=cfg.provider.as_body() if cfg.provider is not None else None,
        thinking=cfg.thinking,
        tool_mode=tool_mode,
        api_key_env=cfg.api_key_env,
        tokenizer=tokenizer,
        glaive_source=glaive_source,
        requests_per_scenario=requests,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        scenarios=results,
        tool_calls_recoverable=by_mode[tool_mode],
        tool_calls_recoverable_by_mode=by_mode,
        reasoning_field=overall_reasoning_field(results),
        providers=sorted({p for s in results for p in s.providers}),
        notes=profile_notes(results, by_mode, thinking=cfg.thinking, tokenizer=tokenizer,
                            findings=findings, rules=rules),
        findings=findings,
        probe_requests=sum(o.attempts for o in observations),
        probe_cost_usd=round(sum(o.cost_usd for o in observations), 9),
    )


def probe_endpoint(
    cfg: EndpointConfig,
    key: ApiKey | None,
    scenarios: list[Scenario],
    *,
    tool_mode: ToolMode = "tools",
    fmt: ChatFormat | None = None,
    tokenizer: str | None = None,
    glaive_source: str | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> ProviderProfile:
    """Run the scenarios and judge them; raises ProbeFatalError on a key or account error."""
    results = asyncio.run(run_scenarios(cfg, key, scenarios, fmt=fmt, transport=transport))
    requests = max((len(s.prompts) for s in scenarios), default=0)
    return build_profile(cfg, results, tool_mode=tool_mode, requests=requests,
                         tokenizer=tokenizer, glaive_source=glaive_source)
