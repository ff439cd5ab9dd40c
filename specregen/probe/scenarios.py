"""The probe's questions: prompts that clearly call for a tool, asked each way a run can ask.

* `tools`: the tool in the `tools` parameter, thinking as the run's config says;
* `system_prompt`: no `tools`, the same tool declared in the system prompt the way glaive does
  (the functions lead-in, then the pretty-printed JSON function);
* `glaive`: a real B1_glaive prompt whose reference answer is a tool call (with
  `--glaive-source`), sent in system-prompt mode;
* `thinking_on` / `thinking_off`: the `tools` question with the dialect's thinking switch set;
* `history`: the `tools` question after an earlier turn with two calls and their results (their
  ids in the family's form, `ProbeRules.history_call_id`), so a server that renumbers ids
  carrying a running count (`{history_count + i}`) shows it;
* `plain`: a question without tools, whose answer is a clean base for counting tokens;
* `logprobs`: plain questions asking for logprobs: whether they come back, covering what.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from specregen.errors import UsageError
from specregen.models.probe_rules import ProbeRules
from specregen.probe.model import ToolMode
from specregen.records import Prompt
from specregen.sources.glaive import FUNCTIONS_LEAD_IN, TOOLS_SYSTEM

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
# One city per request: repeated identical requests could be answered from a cache.
CITIES = ("Paris", "Tokyo", "Lima", "Oslo", "Nairobi", "Hanoi", "Quito", "Perth", "Riga", "Accra")
MAX_REQUESTS = len(CITIES)
# Rows read from a glaive source before giving up on finding a tool-call prompt.
GLAIVE_SCAN_LIMIT = 20_000


class ProbeSetupError(UsageError, ValueError):
    """The probe cannot be prepared (a source that cannot be read, a bad option value)."""


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    tool_mode: ToolMode
    # Thinking set for this scenario through the dialect's switch; None keeps the run's config.
    thinking_override: bool | None
    prompts: tuple[Prompt, ...]
    # Ask for logprobs (a provider may refuse them: only this scenario's answers are lost).
    logprobs: bool = False

    @property
    def tools_sent(self) -> bool:
        return self.tool_mode == "tools" and any(p.tools for p in self.prompts)


def rules_of(format_name: str) -> ProbeRules:
    """The probe rules of format `format_name`: how its answers are read, the ids its history
    carries. A format without them reads no provider traits (ProbeSetupError)."""
    from specregen.models.registry import probe_rules

    rules = probe_rules(format_name)
    if rules is None:
        raise ProbeSetupError(
            f"the {format_name} format has no endpoint probe: its reconstruction reads no"
            " provider traits, so there is nothing to probe (leave `probe` off for it)")
    return rules


def weather_question(city: str) -> str:
    return f"What's the weather in {city} right now? Use the tool."


def glaive_system_prompt(function: dict[str, Any]) -> str:
    """A one-function glaive `system` field, without its `SYSTEM: ` tag (datasets README 2.1)."""
    return f"{FUNCTIONS_LEAD_IN}\n{json.dumps(function, indent=4)}\n"


def _weather_prompts(name: str, tool_mode: ToolMode, requests: int) -> tuple[Prompt, ...]:
    if tool_mode == "tools":
        system = TOOLS_SYSTEM
    else:
        system = glaive_system_prompt(WEATHER_TOOL["function"])
    return tuple(
        Prompt(
            sample_id=f"probe-{name}-{i}",
            messages=[{"role": "system", "content": system},
                      {"role": "user", "content": weather_question(CITIES[i])}],
            tools=[WEATHER_TOOL],
            tool_mode=tool_mode,
        )
        for i in range(requests)
    )


# The earlier turn of the `history` scenario. Arguments are spelled as `json.dumps` spells them,
# so a server that parses and dumps history arguments again (vLLM) renders the same text.
HISTORY_CITIES = ("Rome", "Cairo")
PLAIN_QUESTIONS = ("In one sentence, what is a prime number?",
                   "In one sentence, why is the sky blue?",
                   "In one sentence, what does a compiler do?",
                   "In one sentence, what is photosynthesis?",
                   "In one sentence, what is an atom?",
                   "In one sentence, what is inflation?",
                   "In one sentence, what is a glacier?",
                   "In one sentence, what is a neuron?",
                   "In one sentence, what is a tide?",
                   "In one sentence, what is a vaccine?")


def history_messages(city: str, rules: ProbeRules) -> list[dict[str, Any]]:
    """A finished turn with two calls and their results, then the weather question for `city`;
    the calls carry ids of the form the format's servers give them (`rules`)."""
    name = WEATHER_TOOL["function"]["name"]
    calls = [{"id": rules.history_call_id(name, i), "type": "function",
              "function": {"name": name, "arguments": json.dumps({"city": c})}}
             for i, c in enumerate(HISTORY_CITIES)]
    results = [{"role": "tool", "tool_call_id": call["id"],
                "content": json.dumps({"city": c, "temperature_c": 20 + i, "sky": "clear"})}
               for i, (call, c) in enumerate(zip(calls, HISTORY_CITIES, strict=True))]
    first = f"What's the weather in {HISTORY_CITIES[0]} and in {HISTORY_CITIES[1]}? Use the tool."
    return [
        {"role": "system", "content": TOOLS_SYSTEM},
        {"role": "user", "content": first},
        {"role": "assistant", "content": "", "tool_calls": calls},
        *results,
        {"role": "assistant", "content": "Rome: 20 °C and clear. Cairo: 21 °C and clear."},
        {"role": "user", "content": weather_question(city)},
    ]


def _history_prompts(requests: int, rules: ProbeRules) -> tuple[Prompt, ...]:
    return tuple(Prompt(sample_id=f"probe-history-{i}",
                        messages=history_messages(CITIES[i], rules),
                        tools=[WEATHER_TOOL], tool_mode="tools")
                 for i in range(requests))


def _plain_prompts(requests: int, name: str = "plain") -> tuple[Prompt, ...]:
    # The logprobs scenario asks other questions than `plain` (a cache could answer repeats).
    offset = MAX_REQUESTS - requests if name != "plain" else 0
    return tuple(Prompt(sample_id=f"probe-{name}-{i}",
                        messages=[{"role": "user", "content": PLAIN_QUESTIONS[offset + i]}],
                        tools=None, tool_mode="tools")
                 for i in range(requests))


def build_scenarios(requests: int, glaive_prompt: Prompt | None = None, *,
                    rules: ProbeRules) -> list[Scenario]:
    """The probe's questions, `requests` of each; `rules`: the format's probe rules (the
    history's call ids)."""
    if not 1 <= requests <= MAX_REQUESTS:
        raise ProbeSetupError(f"requests per scenario must be between 1 and {MAX_REQUESTS}")
    scenarios = [
        Scenario("tools", "get_weather in `tools`", "tools", None,
                 _weather_prompts("tools", "tools", requests)),
        Scenario("system_prompt", "get_weather declared in a glaive-style system prompt",
                 "system_prompt", None,
                 _weather_prompts("system_prompt", "system_prompt", requests)),
    ]
    if glaive_prompt is not None:
        copies = tuple(
            Prompt(sample_id=f"probe-glaive-{i}", messages=glaive_prompt.messages,
                   tools=glaive_prompt.tools, tool_mode="system_prompt", meta=glaive_prompt.meta)
            for i in range(requests)
        )
        scenarios.append(Scenario("glaive", f"B1_glaive {glaive_prompt.meta.get('source_row')}",
                                  "system_prompt", None, copies))
    for name, value in (("thinking_on", True), ("thinking_off", False)):
        scenarios.append(Scenario(name, f"get_weather in `tools`, thinking {name[9:]}",
                                  "tools", value, _weather_prompts(name, "tools", requests)))
    scenarios.append(Scenario("history", "get_weather in `tools` after a turn with two calls",
                              "tools", None, _history_prompts(requests, rules)))
    scenarios.append(Scenario("plain", "a short question without tools", "tools", None,
                              _plain_prompts(requests)))
    scenarios.append(Scenario("logprobs", "a short question without tools, with logprobs",
                              "tools", None, _plain_prompts(requests, "logprobs"),
                              logprobs=True))
    return scenarios


def glaive_probe_prompt(source: str) -> Prompt:
    """The first prompt of a glaive source whose reference first turn is a tool call."""
    from specregen.sources import read_source

    try:
        records = read_source("glaive", source, dataset="B1_glaive", tool_mode="system_prompt")
        for n, record in enumerate(records):
            if n >= GLAIVE_SCAN_LIMIT:
                break
            if not isinstance(record, Prompt) or not record.tools:
                continue
            reference = record.meta.get("reference_first_turn") or {}
            if reference.get("kind") in ("tool_call", "tool_calls"):
                return record
    except (OSError, ValueError, ImportError) as exc:
        raise ProbeSetupError(f"cannot read the glaive source {source}: {exc}") from None
    raise ProbeSetupError(
        f"the glaive source {source} has no usable prompt whose first answer is a tool call"
        f" in its first {GLAIVE_SCAN_LIMIT} rows"
    )
