"""K2.5's fidelity corpus: random requests (0-3 calls, thinking on or off, histories with
earlier calls and their `functions.NAME:IDX` ids, literal marker text) and the answer shapes
K2.5 writes, as the emulator's model knobs (`SHAPES`): K2.5's served side writes its ids itself
(`served.generate`), so a drawn answer carries the knobs of its shape, not ids.

The harness (`emulator/fidelity.py`, bench/fidelity.py) serves each through the upstream
profiles, plain and streamed, and rebuilds it; the real-vLLM harness scripts the ids the `vllm`
profile's model wrote into a real server (`real_case`). Not in the reconstruct fingerprint:
reconstruction never imports it.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence
from typing import Any

from specregen.models.chat_format import FormatError
from specregen.models.corpus import Drawn, FidelityCorpus, RealCase
from specregen.models.kimi_k25.common import THINK_END
from specregen.models.tokenizer_base import Tokenizer
from specregen.records import ProviderTraits

MODEL = "moonshotai/kimi-k2.5"
# The profiles that run the restated upstream parsers (`vllm` is vLLM 0.32; docs/vllm-0.32.md,
# docs/upstream-parsers.md).
PROFILES = ("vllm", "vllm-legacy", "vllm-k25", "sglang", "sglang-noforce")

# What each profile's parsers do, as a probe would learn it (the `traits` pass).
PROFILE_TRAITS: dict[str, ProviderTraits] = {
    # vLLM 0.32's kimi_k2 on the parser engine: ids as written, no `(no content)` filter, and a
    # section begin ends the reasoning on both paths (docs/vllm-0.32.md, 2.2).
    "vllm": ProviderTraits(renumbers_tool_ids=False, deletes_no_content=False,
                           splits_reasoning=True, counts_stop_token=True,
                           ends_reasoning_at_tools=True),
    "vllm-legacy": ProviderTraits(renumbers_tool_ids=False, deletes_no_content=True,
                                  splits_reasoning=True, counts_stop_token=True,
                                  ends_reasoning_at_tools=False),
    # kimi_k25 ends the reasoning at a tool marker only on its streaming path.
    "vllm-k25": ProviderTraits(renumbers_tool_ids=False, deletes_no_content=False,
                               splits_reasoning=True, counts_stop_token=True,
                               ends_reasoning_at_tools=False),
    "vllm-k25/stream": ProviderTraits(renumbers_tool_ids=False, deletes_no_content=False,
                                      splits_reasoning=True, counts_stop_token=True,
                                      ends_reasoning_at_tools=True),
    "sglang": ProviderTraits(renumbers_tool_ids=True, deletes_no_content=False,
                             splits_reasoning=True, counts_stop_token=True,
                             ends_reasoning_at_tools=True),
    "sglang-noforce": ProviderTraits(renumbers_tool_ids=True, deletes_no_content=False,
                                     splits_reasoning=False, counts_stop_token=True),
}

TOOL_POOL: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather for a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer"}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search_web", "description": "Search the web for a query.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                       "required": ["query"]}}},
    {"type": "function", "function": {
        "name": "get_stock_price", "description": "Look up the stock price of a ticker.",
        "parameters": {"type": "object", "properties": {"symbol": {"type": "string"}},
                       "required": ["symbol"]}}},
    {"type": "function", "function": {
        "name": "convert_currency", "description": "Convert an amount between currencies.",
        "parameters": {"type": "object", "properties": {
            "amount": {"type": "number"}, "source": {"type": "string"},
            "target": {"type": "string"}}, "required": ["amount", "source", "target"]}}},
    {"type": "function", "function": {
        "name": "send-email", "description": "Send an email message.",
        "parameters": {"type": "object", "properties": {
            "recipient": {"type": "string"}, "subject": {"type": "string"}},
            "required": ["recipient"]}}},
]
QUESTIONS = {
    "get_weather": ["What is the weather in {x} today?", "Check the weather for {x}."],
    "search_web": ["Search the web for news about {x}.", "Please search for {x}."],
    "get_stock_price": ["What is the stock price of {x}?", "Look up the stock ticker {x}."],
    "convert_currency": ["Convert 120 dollars to euros for {x}.",
                         "Currency conversion for {x}, please."],
    "send-email": ["Send an email to {x} about lunch.", "Email {x} the message."],
}
PLAIN = ["Explain how an LRU cache works.", "Write a function to average a list.",
         "Print the literal string <|im_end|> in Python.", "你好，请介绍一下你自己。",
         "Summarise the plot of Hamlet."]
PLACES = ["Paris", "Oslo", "Lima", "Tokyo", "Rome", "Nairobi", "Quito"]

# Answer shapes. The HEADLINE group models what K2.5 writes: its template's shape (`clean`, also
# cut by `max_tokens`, and with literal marker text in code), or that shape with ONE of the
# deviations the upstream parsers treat unevenly -- a tool section opened before `</think>`
# (`in_think`; reported of K2-Thinking), text after `<|tool_calls_section_end|>` (`after`),
# the `(no content)` placeholder before calls (`no_content`), a newline between the section's
# markers (`gap`). Each is present at a high rate in its own shape, one per answer.
# The ADVERSARIAL group holds what counts cannot see (docs/evidence.md, "known limit"):
# `spaced` -- whitespace around ids and arguments and bare ids, which K2.5's template never
# shows and whose trimming the Kimi BPE often hides from the counts (` functions`, ` {`, `}\n`
# are single tokens), and indices other than the running count, which SGLang's stream rebuilds
# from the call's position; `combined` -- several deviations in one answer at once, so that two
# independent rare events can cancel in the count (e.g. a section opened before `</think>`
# plus one dropped newline looks like a closed reasoning). Reconstruction takes the reading
# that needs the fewest such coincidences; the adversarial group measures what that costs.
#
# A shape is the emulator's model knobs it sets (`EmulatorConfig` rates; the others keep their
# defaults).
SHAPES: dict[str, dict[str, float]] = {
    "clean": {},
    "in_think": {"section_in_think_rate": 0.5},
    "after": {"text_after_section_rate": 0.5},
    "no_content": {"no_content_before_calls_rate": 0.5},
    "gap": {"section_whitespace_rate": 0.5},
    "literal": {"literal_marker_rate": 0.6},
    "cut": {},  # clean answers cut by `max_tokens` (finish_reason "length")
    "spaced": {"tool_id_whitespace_rate": 0.4, "tool_args_whitespace_rate": 0.4,
               "bare_tool_id_rate": 0.3, "wrong_tool_index_rate": 0.2},
    "combined": {"section_in_think_rate": 0.25, "text_after_section_rate": 0.3,
                 "section_whitespace_rate": 0.3, "no_content_before_calls_rate": 0.3,
                 "wrong_tool_index_rate": 0.1, "literal_marker_rate": 0.1},
}
SHAPE_WEIGHTS = {"clean": 0.3, "in_think": 0.06, "after": 0.06, "no_content": 0.06,
                 "gap": 0.06, "literal": 0.12, "cut": 0.1, "spaced": 0.12, "combined": 0.12}
ADVERSARIAL_SHAPES = frozenset({"spaced", "combined"})
# The groups in which an `ok` with wrong ids fails (the adversarial group holds count-invisible
# deviations and coincidences of two: measured, the documented limit).
GATED_GROUPS = ("headline",)


def _arguments(rng: random.Random, name: str) -> str:
    value = {"get_weather": {"city": rng.choice(PLACES)},
             "search_web": {"query": rng.choice(PLACES) + " news"},
             "get_stock_price": {"symbol": rng.choice(["ACME", "MSFT", "NVDA"])},
             "convert_currency": {"amount": rng.choice([1, 2.5, 120]), "source": "USD",
                                  "target": "EUR"},
             "send-email": {"recipient": "ann@example.com"}}[name]
    # Clients send compact JSON, spaced JSON, or whatever the model wrote.
    return json.dumps(value, separators=rng.choice([(",", ":"), (", ", ": ")]),
                      ensure_ascii=False)


def _history(rng: random.Random, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    count = 0
    for _ in range(rng.choice([1, 1, 2])):
        messages.append({"role": "user", "content": rng.choice(PLAIN)})
        calls = []
        for _ in range(rng.choice([1, 1, 2])):
            name = rng.choice(tools)["function"]["name"]
            calls.append({"id": f"functions.{name}:{count}", "type": "function",
                          "function": {"name": name, "arguments": _arguments(rng, name)}})
            count += 1
        turn: dict[str, Any] = {"role": "assistant", "content": rng.choice(["", None, "Ok."]),
                                "tool_calls": calls}
        roll = rng.random()
        if roll < 0.3:
            turn["reasoning_content"] = "I will call the tool."
        elif roll < 0.4:
            turn["reasoning_content"] = None  # rendered differently by different servers
        messages.append(turn)
        for c in calls:
            result: dict[str, Any] = {"role": "tool", "content": "done"}
            if rng.random() > 0.05:  # now and then a client omits the id
                result["tool_call_id"] = c["id"]
            messages.append(result)
        if rng.random() < 0.5:
            messages.append({"role": "assistant", "content": "Here is what I found."})
    return messages


def random_request(rng: random.Random, index: int) -> dict[str, Any]:
    request: dict[str, Any] = {"model": MODEL, "return_token_ids": True}
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": "You are a helpful assistant."})
    tools: list[dict[str, Any]] = []
    if rng.random() < 0.85:
        pool = TOOL_POOL if rng.random() < 0.15 else TOOL_POOL[:4]
        tools = rng.sample(pool, rng.randint(1, min(3, len(pool))))
        request["tools"] = tools
        if rng.random() < 0.4:
            messages += _history(rng, tools)
    if tools and rng.random() < 0.75:
        name = rng.choice(tools)["function"]["name"]
        question = rng.choice(QUESTIONS[name]).format(x=rng.choice(PLACES))
    else:
        question = rng.choice(PLAIN)
    messages.append({"role": "user", "content": f"{question} (#{index})"})
    request["messages"] = messages
    if rng.random() < 0.3:
        request["chat_template_kwargs"] = {"thinking": False}
    return request


def group(shape: str) -> str:
    """`headline` or `adversarial` (the acceptance target is on the headline group)."""
    return "adversarial" if shape in ADVERSARIAL_SHAPES else "headline"


# What K2.5's template expects it to write (the base of the real server's yield): the clean
# shape, whose answers have 0-3 calls (parallel ones included) and, now and then, an empty
# reasoning (`</think>` first: `empty_think`).
TEMPLATE_SHAPES = frozenset({"clean", "empty_think"})
EMPTY_THINK_RATE = 0.15


def served_group(shape: str, profile: str, stream: bool) -> str:
    """`group` as the harnesses ask it: a K2.5 answer's group is its shape's, whoever serves
    it."""
    return group(shape)


def probed_traits(profile: str, stream: bool) -> ProviderTraits:
    """What the endpoint probe learns of `profile` (`PROFILE_TRAITS`)."""
    return PROFILE_TRAITS.get(f"{profile}/stream" if stream else "") or \
        PROFILE_TRAITS[profile]


def draw(tok: Tokenizer, n: int, seed: int = 0, shapes: Sequence[str] | None = None
         ) -> Iterator[Drawn]:
    """`n` random answers and their requests, as the knobs of their shapes (`tok` unused: the
    served side writes the ids)."""
    rng = random.Random(seed)
    names = list(shapes or SHAPE_WEIGHTS)
    weights = [SHAPE_WEIGHTS[s] for s in names]
    for i in range(n):
        request = random_request(rng, i)
        shape = rng.choices(names, weights)[0]
        max_tokens = None
        if shape == "cut":
            # Anywhere from inside the reasoning to just before the stop token.
            max_tokens = rng.randint(4, 160)
            request = {**request, "max_tokens": max_tokens}
        yield Drawn(i, shape, request, None, max_tokens, shape in TEMPLATE_SHAPES,
                    knobs=SHAPES[shape])


def request_for(drawn: Drawn, profile: str) -> dict[str, Any]:
    """The request as drawn: every profile reads K2.5's own switch
    (`chat_template_kwargs.thinking`), drawn in."""
    return drawn.request


def real_case(tok: Tokenizer, drawn: Drawn, ids: Sequence[int], seed: int, profile: str
              ) -> RealCase:
    """`drawn` with the ids the model wrote; now and then a clean answer with thinking
    becomes `empty_think` (its reasoning dropped)."""
    request = {k: v for k, v in drawn.request.items() if k != "return_token_ids"}
    shape, written = drawn.shape, list(ids)
    think_end = tok.token_id(THINK_END)
    if (shape == "clean" and think_end in written
            and random.Random(seed * 100_003 + drawn.index).random() < EMPTY_THINK_RATE):
        shape, written = "empty_think", written[written.index(think_end):]
    return RealCase(f"k25-{seed}-{drawn.index}", shape, (group(shape),) * 2,
                    shape in TEMPLATE_SHAPES, request, tuple(written), drawn.max_tokens)


def make_corpus() -> FidelityCorpus:
    """The descriptor's `make_corpus` (`registry.fidelity_corpus`)."""
    # The emulator's model refuses what it cannot render; the harness catches its own refusals.
    return FidelityCorpus(
        profiles=PROFILES, shapes=tuple(SHAPE_WEIGHTS), gated_groups=GATED_GROUPS,
        refusals=(FormatError,), group=served_group, probed_traits=probed_traits, draw=draw,
        request_for=request_for, real_case=real_case)
