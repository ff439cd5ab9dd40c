"""The emulator for a chat format that brings its own served side (`models/<format>/served.py`,
found by `registry.get_server`): the emulator decides what the model says (textgen, seeded by
the request), the format says how that becomes ids and what the server's parsers return.

Profiles: the family's descriptor names those it is served with (`Family.emulator_profiles`)
and declares its own (`Family.profile_specs`: Qwen3's `vllm-hermes`, K3's `vllm-k3`, a vLLM
0.32 server with the format's parsers, `reasoning` field); the shared ones are `openrouter`
(the same upstream behind OpenRouter: its `reasoning` request switch, response fields and usage
with cost) and `sglang`. The served side picks the parsers per profile (`for_profile`). The body
and stream framing are the emulator's own (`profiles.response_body` / `stream_frames`), shared
with the K2.5 path.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from typing import Any

from specregen.emulator.config import EmulatorConfig
from specregen.emulator.conversations import Script
from specregen.emulator.generate import declared_tools, request_seed
from specregen.emulator.profiles import Message, OutCall
from specregen.models import textgen
from specregen.models.family import ServedSide, TextServedSide


@dataclass(frozen=True, slots=True)
class ServedView:
    """The completion as `profiles` reads it: the ids generated, the reasoning share."""

    ids: tuple[int, ...]
    reasoning_tokens: int


@dataclass(frozen=True, slots=True)
class ServedGeneration:
    prompt_ids: tuple[int, ...]


def served_reply(server: ServedSide, config: EmulatorConfig, request: dict[str, Any],
                 key: bytes, max_tokens: int | None, script: Script | None = None
                 ) -> tuple[Message, ServedView, ServedGeneration]:
    """One deterministic answer to `request` (`key`: the request's generation digest);
    `script` (conversation mode) says what it holds besides the reasoning. `server`: a served
    side given the text (`TextServedSide`)."""
    if not isinstance(server, TextServedSide):
        raise TypeError(f"{type(server).__name__} writes its own ids; it is not given text")
    rng = random.Random(request_seed(config.seed, key))
    reasoning = textgen.prose(rng, _length(rng, config.reasoning_tokens_mean, config))
    content = textgen.answer(rng, _length(rng, config.content_tokens_mean, config))
    if script is None:
        calls = _calls(rng, request, config)
        if calls and rng.random() < 0.5:
            content = ""  # calls straight after the reasoning, as models often do
    else:
        # Argument values: the format writes them its own way (Qwen3: json.dumps).
        calls = [(c.name, c.arguments) for c in script.calls]
        if script.content is not None:
            content = script.content
        elif calls:
            content = ""
    served = server.for_profile(config.profile)  # e.g. Qwen3's `sglang`: SGLang's parsers
    answer = served.answer(request, reasoning=reasoning, content=content, calls=calls,
                           max_tokens=max_tokens)
    # The server's random ids (vLLM 0.32: `chatcmpl-tool-` + 16 hex digits), drawn from the
    # seeded rng here.
    out_calls = tuple(OutCall(served.call_id(rng.getrandbits(128)), name, args)
                      for name, args in answer.calls)
    message = Message(answer.reasoning, answer.content, out_calls, answer.finish_reason)
    return (message, ServedView(tuple(answer.ids), answer.reasoning_tokens),
            ServedGeneration(tuple(answer.prompt_ids)))


def _length(rng: random.Random, mean: int, config: EmulatorConfig) -> int:
    return max(1, int(mean * math.exp(rng.gauss(0.0, config.length_sigma))))


def _calls(rng: random.Random, request: dict[str, Any], config: EmulatorConfig
           ) -> list[tuple[str, Any]]:
    """Calls to declared tools: one or two, for about half the requests that declare tools
    (in `tools`, else as JSON function objects in a system prompt, glaive style: the model
    then writes its calls without a server parser to read them)."""
    tools = [t["function"] for t in request.get("tools") or ()
             if isinstance(t, dict) and isinstance(t.get("function"), dict)]
    tools = [t for t in tools if isinstance(t.get("name"), str)]
    if not request.get("tools"):
        tools = [{"name": s.name, "parameters": s.parameters} for s in declared_tools(request)]
    if not tools or rng.random() >= 0.5 + config.tool_call_rate / 2:
        return []
    picked = [rng.choice(tools) for _ in range(rng.randint(1, 2))]
    return [(t["name"], json.loads(textgen.arguments(rng, t.get("parameters"))))
            for t in picked]
