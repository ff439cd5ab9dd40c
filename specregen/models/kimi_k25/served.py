"""Kimi K2.5's served side for the emulator (`registry.get_server`): the model writes one
deterministic completion per request as token ids, and each emulated provider returns it its
own way.

A completion is built segment by segment, the way the model writes it (SPEC 7.2):
`R </think> C [<|tool_calls_section_begin|> (<|tool_call_begin|> ID <|tool_call_argument_begin|>
ARGS <|tool_call_end|>)+ <|tool_calls_section_end|>] <|im_end|>`. Text segments are encoded with
special tokens disallowed and markers are inserted by name, so the ids are exactly what a faithful
reconstruction rebuilds -- unless non-canonical splits are injected, which is what sampling does.

The emulator hands in what only it knows: its config (the model's knobs, duck-typed), the seed
of the request (the request digest with the config seed: a retry gets the same completion), and
a `writer` (the emulator's model-like text and its reading of the declared tools). Conversation
mode's `script` says what the answer holds instead of the writer's draws.

How providers return it (`render_message`): `vllm` (vLLM 0.32, `vllm032.py`), `vllm-legacy`,
`vllm-k25`, `sglang`, `sglang-noforce` (`servers.py`) decode the ids and run our re-statement of
those servers' Kimi parsers on a prompt rendered the way the server does (`serverside.py`);
`openrouter`, `moonshot`, `raw` and `stripped` shape the completion as those APIs do (see the
emulator's `profiles.py`).
"""

from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from specregen.models.chat_format import (
    FormatError,
    ScriptedAnswer,
    ServedCall,
    ServedMessage,
)
from specregen.models.kimi_k25 import servers, serverside, vllm032
from specregen.models.kimi_k25.common import (
    ARG_BEGIN,
    CALL_BEGIN,
    CALL_END,
    IM_END,
    SECTION_BEGIN,
    SECTION_END,
    THINK,
    THINK_END,
    TOOL_MARKERS,
    count_history_tool_calls,
)
from specregen.models.kimi_k25.format import KimiK25
from specregen.models.tokenizer import Tokenizer
from specregen.wire.response import reasoning_excluded, thinking_from_request

# The emulator's K2.5 profiles (names as in `EmulatorConfig.profile`).
PROFILES = ("openrouter", "vllm", "vllm-legacy", "vllm-k25", "sglang", "sglang-noforce",
            "moonshot", "raw", "stripped")
# The ids vLLM 0.32 makes for a call whose header gave none: a K2.5 deployment's config says
# `model_type: kimi_k25`, which gives `functions.{name}:{n}` (docs/vllm-0.32.md, 2.1).
VLLM_ID_TYPE: vllm032.IdType = "kimi"
MODEL_NAME = "MoonshotAI: Kimi K2.5"
# Strings the model writes as text now and then, e.g. when it talks about its own format.
LITERALS = (f'"{IM_END}"', THINK, THINK_END, f'"{CALL_BEGIN}"')

SegmentKind = Literal[
    "reasoning",
    "section_text",  # whitespace the model wrote between a tool section's markers
    "after_section",  # text after `<|tool_calls_section_end|>`
    "think_end",
    "content",
    "section_begin",
    "call_begin",
    "call_id",
    "arg_begin",
    "arguments",
    "call_end",
    "section_end",
    "im_end",
]
TEXT_KINDS = frozenset({"reasoning", "content", "call_id", "arguments", "section_text",
                        "after_section"})


NO_CONTENT = "(no content)"


@dataclass(frozen=True, slots=True)
class PlannedCall:
    """A tool call as the model writes it: `id` and `arguments` verbatim, whitespace included."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Segment:
    kind: SegmentKind
    text: str  # a marker segment holds the marker's name, which is also how it decodes
    ids: tuple[int, ...]
    call: int = -1  # the tool call a section segment belongs to


@dataclass(frozen=True, slots=True)
class Generation:
    """One completion: the true ids and the segments they are made of."""

    prompt_ids: tuple[int, ...]
    thinking: bool
    segments: tuple[Segment, ...]
    ids: tuple[int, ...]
    calls: tuple[PlannedCall, ...]
    history_tool_calls: int


@dataclass(frozen=True, slots=True)
class CompletionView:
    """What the model had written when it stopped (at `<|im_end|>` or at `max_tokens`)."""

    ids: tuple[int, ...]
    thinking: bool
    reasoning: str | None  # None in instant mode
    think_closed: bool
    content: str
    calls: tuple[PlannedCall, ...]  # the calls completed before the stop
    section_text: str  # the raw tool section from its begin marker on, "" when none
    made_calls: bool  # the model opened a tool section
    truncated: bool
    reasoning_tokens: int


# ---------------------------------------------------------------------------------------------
# The model


def generate(
    request: dict[str, Any],
    fmt: KimiK25,
    config: Any,
    seed: int,
    writer: Any,
    splitter: Any | None = None,
    server_prompt: tuple[Sequence[int], bool] | None = None,
    script: Any | None = None,
) -> Generation:
    """The completion the emulated model writes for `request` (validated by the caller).

    `config`: the emulator's knobs; `seed`: the request's seed; `writer`: the emulator's text
    (`prose`, `answer`, `arguments`) and tools (`declared_tools`, `mentioned_tools`);
    `splitter`: non-canonical BPE splits (`inject`). `server_prompt` is the prompt ids and
    thinking mode a server-side renderer produced (`serverside.py`); without it the prompt is
    our own K2.5 renderer's. `script` (conversation mode) says what the answer holds: its calls
    (numbered from the request's running count) and its text; the reasoning is written as
    always.
    """
    rng = random.Random(seed)
    # The shape knobs draw from their own stream, so with them at 0 a request gets exactly the
    # completion it got before they existed.
    shapes = random.Random(seed ^ 0x5EC7)
    messages = request["messages"]
    if server_prompt is not None:
        prompt_ids, thinking = list(server_prompt[0]), server_prompt[1]
    else:
        requested = thinking_from_request(request)
        thinking = True if requested is None else requested
        prompt_ids = fmt.encode_prompt(messages, request.get("tools") or None, thinking=thinking)
    tools = writer.declared_tools(request)
    history = count_history_tool_calls(messages)

    if script is None:
        calls = _plan_calls(rng, request, tools, history, config, shapes, writer)
    else:
        calls = _script_calls(rng, script, history, config, shapes)
    reasoning = None
    if thinking:
        reasoning = writer.prose(rng, _length(rng, config.reasoning_tokens_mean, config))
        reasoning = _lead(rng, config) + reasoning
    if script is not None and script.content is not None:
        content = script.content
    else:
        content = _content(rng, config, bool(calls), writer)
    # Drawn unconditionally so that turning one shape on leaves the other draws as they were.
    in_think = shapes.random() < config.section_in_think_rate and thinking and bool(calls)
    after = _after_section(shapes, config, writer) if calls else ""

    enc = fmt.tok.encode_ordinary
    marker = fmt.ids
    segments: list[Segment] = []
    if reasoning is not None:
        segments.append(Segment("reasoning", reasoning, tuple(enc(reasoning))))
        if not in_think:
            segments.append(Segment("think_end", THINK_END, (marker[THINK_END],)))
    if content and not in_think:
        segments.append(Segment("content", content, tuple(enc(content))))
    if calls:
        segments.append(Segment("section_begin", SECTION_BEGIN, (marker[SECTION_BEGIN],)))
        for i, call in enumerate(calls):
            gap = "\n" if shapes.random() < config.section_whitespace_rate else ""
            if gap:
                segments.append(Segment("section_text", gap, tuple(enc(gap)), i))
            segments += [
                Segment("call_begin", CALL_BEGIN, (marker[CALL_BEGIN],), i),
                Segment("call_id", call.id, tuple(enc(call.id)), i),
                Segment("arg_begin", ARG_BEGIN, (marker[ARG_BEGIN],), i),
                Segment("arguments", call.arguments, tuple(enc(call.arguments)), i),
                Segment("call_end", CALL_END, (marker[CALL_END],), i),
            ]
        segments.append(Segment("section_end", SECTION_END, (marker[SECTION_END],)))
        if after:
            segments.append(Segment("after_section", after, tuple(enc(after))))
    segments.append(Segment("im_end", IM_END, (marker[IM_END],)))

    if config.noncanonical_rate > 0:
        if splitter is None:
            raise ValueError("noncanonical_rate > 0 needs a BpeSplitter")
        segments = _inject_splits(segments, splitter, rng, config.noncanonical_rate)
    return Generation(
        prompt_ids=tuple(prompt_ids),
        thinking=thinking,
        segments=tuple(segments),
        ids=tuple(itertools.chain.from_iterable(s.ids for s in segments)),
        calls=tuple(calls),
        history_tool_calls=history,
    )


def _length(rng: random.Random, mean: int, config: Any) -> int:
    sigma = config.length_sigma
    value = rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma) if sigma else mean
    return max(8, min(8 * mean, round(value)))


def _lead(rng: random.Random, config: Any) -> str:
    # Kimi sometimes starts a field with a space or a newline; APIs must keep it byte-exact.
    if rng.random() < config.leading_whitespace_rate:
        return rng.choice([" ", "\n", "\n\n"])
    return ""


def _after_section(rng: random.Random, config: Any, writer: Any) -> str:
    if rng.random() >= config.text_after_section_rate:
        return ""
    return rng.choice(["\n", " ", "\n\n" + writer.prose(rng, rng.randint(4, 12))])


def _content(rng: random.Random, config: Any, has_calls: bool, writer: Any) -> str:
    if has_calls:
        if rng.random() < config.no_content_before_calls_rate:
            return NO_CONTENT
        if rng.random() < 0.8:  # usually straight to the calls
            return ""
        return _lead(rng, config) + writer.prose(rng, rng.randint(8, 24))
    n = _length(rng, config.content_tokens_mean, config)
    return _lead(rng, config) + writer.answer(rng, n, literal_rate=config.literal_marker_rate,
                                              literals=LITERALS)


def _plan_calls(
    rng: random.Random,
    request: dict[str, Any],
    tools: list[Any],
    history: int,
    config: Any,
    shapes: random.Random,
    writer: Any,
) -> list[PlannedCall]:
    # Drawn first and always: without a call, the text is the same whatever the tool knobs.
    roll = rng.random()
    if not tools:
        return []
    choice = request.get("tool_choice")
    if choice == "none":
        return []
    forced: Any | None = None
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        forced = next((t for t in tools if t.name == name), None)
        if forced is None:
            raise FormatError(f"tool_choice names {name!r}, which is not among the tools")
    mentioned = writer.mentioned_tools(request, tools)
    if not (forced or choice == "required" or mentioned or roll < config.tool_call_rate):
        return []
    first = forced or (mentioned[0] if mentioned else rng.choice(tools))
    r = rng.random()
    count = 1 if r < 0.75 else 2 if r < 0.92 else 3
    chosen = [first] + [rng.choice(tools) for _ in range(count - 1)]
    calls = []
    for i, tool in enumerate(chosen):
        index = history + i
        if rng.random() < config.wrong_tool_index_rate:
            index += 1
        arguments = writer.arguments(rng, tool.parameters)
        calls.append(_shaped_call(rng, shapes, config, tool.name, index, arguments))
    return calls


def _shaped_call(rng: random.Random, shapes: random.Random, config: Any, name: str, index: int,
                 arguments: str) -> PlannedCall:
    """A call as K2.5 writes it (`functions.NAME:IDX`), with the config's shape knobs applied:
    whitespace around the arguments, a bare id, whitespace around the id."""
    if rng.random() < config.tool_args_whitespace_rate:
        arguments = rng.choice([" ", "\n"]) + arguments + rng.choice(["", " ", "\n"])
    call_id = f"functions.{name}:{index}"
    if shapes.random() < config.bare_tool_id_rate:
        call_id = f"{name}:{index}"
    if shapes.random() < config.tool_id_whitespace_rate:
        call_id = shapes.choice([" ", "\n"]) + call_id + shapes.choice(["", " ", "\n"])
    return PlannedCall(call_id, name, arguments)


def _script_calls(
    rng: random.Random,
    script: Any,
    history: int,
    config: Any,
    shapes: random.Random,
) -> list[PlannedCall]:
    """The script's calls as K2.5 writes them: `functions.NAME:IDX` with IDX counted over the
    conversation, arguments as JSON text (a dataset's non-JSON text verbatim); the shape knobs
    apply as to any call."""
    calls = []
    for i, call in enumerate(script.calls):
        index = history + i
        if rng.random() < config.wrong_tool_index_rate:
            index += 1
        arguments = call.text if call.text is not None else json.dumps(call.arguments,
                                                                        ensure_ascii=False)
        calls.append(_shaped_call(rng, shapes, config, call.name, index, arguments))
    return calls


def _inject_splits(
    segments: list[Segment], splitter: Any, rng: random.Random, rate: float
) -> list[Segment]:
    out = []
    for seg in segments:
        if seg.kind in TEXT_KINDS:
            seg = Segment(seg.kind, seg.text, tuple(splitter.inject(seg.ids, rng, rate)), seg.call)
        out.append(seg)
    return out


# ---------------------------------------------------------------------------------------------
# Where the model stopped


def view(gen: Generation, tok: Tokenizer, max_tokens: int | None = None) -> CompletionView:
    """The completion as delivered: whole, or cut after `max_tokens` ids (no `<|im_end|>`)."""
    budget = len(gen.ids) if max_tokens is None else max_tokens
    truncated = budget < len(gen.ids)
    texts: dict[str, str] = {}
    section: list[str] = []
    done_calls: list[PlannedCall] = []
    think_closed = False
    reasoning_tokens = 0
    for seg in gen.segments:
        if budget <= 0:
            break
        taken = min(len(seg.ids), budget)
        budget -= taken
        if taken == len(seg.ids):
            text = seg.text
        else:
            # Incremental detokenizers hold back an unfinished UTF-8 character; at a cut, the
            # held-back bytes are never sent.
            text = tok.decode_bytes(list(seg.ids[:taken])).decode("utf-8", errors="ignore")
        if seg.kind in ("reasoning", "content"):
            texts[seg.kind] = text
            if seg.kind == "reasoning":
                reasoning_tokens = taken
        elif seg.kind == "think_end":
            think_closed = True
        elif seg.kind != "im_end":
            section.append(text)
            if seg.kind == "call_end":
                done_calls.append(gen.calls[seg.call])
    return CompletionView(
        ids=gen.ids[:max_tokens] if truncated else gen.ids,
        thinking=gen.thinking,
        reasoning=texts.get("reasoning", "") if gen.thinking else None,
        think_closed=think_closed,
        content=texts.get("content", ""),
        calls=tuple(done_calls),
        section_text="".join(section),
        made_calls=bool(section),
        truncated=truncated,
        reasoning_tokens=reasoning_tokens,
    )


# ---------------------------------------------------------------------------------------------
# What each provider returns


def render_message(
    spec: Any, view: CompletionView, gen: Generation, request: dict[str, Any],
    *, tok: Tokenizer | None = None, stream: bool = False,
) -> ServedMessage:
    """What the provider's parsers make of the completion (`spec`: the emulator's profile;
    `stream`: of its streamed deltas; only the upstream profiles treat the two differently, and
    they need the tokenizer)."""
    if spec.server is not None:
        if tok is None:
            raise ValueError(f"profile {spec.name} decodes the completion: pass the tokenizer")
        return _server_message(spec.server, view, request, tok, stream, gen.prompt_ids)
    reasoning = view.reasoning
    if spec.openrouter and reasoning_excluded(request):
        reasoning = None
    # Without `</think>` the reasoning parser puts all text into reasoning (SPEC 3.1).
    content: str | None = None if view.thinking and not view.think_closed else view.content
    calls: tuple[ServedCall, ...] = ()
    if view.made_calls and content is not None:
        if spec.parse_tools and request.get("tools"):
            calls = tuple(_out_call(spec, call) for call in view.calls)
        elif spec.strip_markers:
            content += strip_markers(view.section_text)
        else:
            content += view.section_text
    if content == "":
        content = spec.empty_content
    if view.truncated:
        finish = "length"
    elif calls or (spec.strip_markers and view.made_calls):
        finish = "tool_calls"
    else:
        finish = "stop"
    return ServedMessage(reasoning, content, calls, finish)


def _server_message(server: servers.Server, view: CompletionView, request: dict[str, Any],
                    tok: Tokenizer, stream: bool, prompt_ids: Sequence[int]) -> ServedMessage:
    vllm = server.startswith("vllm")
    # vLLM's slow detokenizer puts spaces around K2.5's added tokens unless the request says
    # `spaces_between_special_tokens: false`; SGLang's profiles are restated without them.
    spaces = vllm and request.get("spaces_between_special_tokens") is not False
    after_added = not prompt_ids or servers.vllm_added(tok, prompt_ids[-1])
    out = servers.decode_output(view.ids, tok, view.truncated, spaces=spaces,
                                after_added=after_added)
    reasoning_tokens: int | None = None
    if server == "vllm":
        seed = len(view.ids)  # made call ids: random-looking, the same for the same answer
        if stream:
            ended = vllm032.prompt_ended(prompt_ids, tok, vllm032.parser_thinking(request))
            parsed, counted = vllm032.stream(out, request, tok, prompt_ended=ended, seed=seed,
                                             id_type=VLLM_ID_TYPE)
        else:
            parsed, counted = vllm032.plain(out, request, seed=seed, id_type=VLLM_ID_TYPE), False
        reasoning_tokens = vllm032.reasoning_tokens(view.ids, tok, request,
                                                    out if counted else None)
    else:
        parsed = servers.parse(server, out, request, servers.MarkerIds.of(tok), stream=stream)
    content = parsed.content
    if stream and content is None:
        # Both servers open a stream with `content: ""` in the role chunk.
        content = ""
    # vLLM 0.32's stream keeps the index of each call it parsed, gaps included.
    gaps = stream and server == "vllm"
    calls = tuple(ServedCall(c.id, c.name, c.arguments, c.index if gaps else None)
                  for c in parsed.calls)
    return ServedMessage(parsed.reasoning, content, calls, parsed.finish_reason,
                         parsed.content_at_calls if stream else None, reasoning_tokens)


def strip_markers(text: str) -> str:
    for marker in TOOL_MARKERS:
        text = text.replace(marker, "")
    return text


def _out_call(spec: Any, call: Any) -> ServedCall:
    call_id, arguments = call.id, call.arguments
    if spec.trim_tool_calls:
        call_id, arguments = call_id.strip(), arguments.strip()
    return ServedCall(call_id, call.name, arguments)


# ---------------------------------------------------------------------------------------------
# The served side the registry hands the emulator


class KimiK25Server:
    """K2.5 behind the emulator's providers: the model writes ids itself (`generate`), with the
    K2.5 shapes the emulator's knobs ask for, and each profile returns them its own way."""

    format_name = "kimi-k2.5"
    profiles = PROFILES
    model_name = MODEL_NAME
    # The model writes its ids (with the shape knobs); the emulator caches them per request.
    writes_ids = True

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tok = tokenizer
        self.fmt = KimiK25(tokenizer)

    def server_prompt(self, server: str, request: dict[str, Any]) -> tuple[list[int], bool]:
        """The prompt ids and thinking mode of a vLLM / SGLang server (`server`: the profile's
        parser family) for `request`: the server's own rendering, not ours."""
        family: serverside.Family = ("sglang" if server.startswith("sglang") else
                                     "vllm" if server == "vllm" else "vllm-legacy")
        thinking = servers.request_thinking(request)
        return serverside.encode_prompt(family, request, self.tok, thinking), thinking

    def generate(self, request: dict[str, Any], config: Any, seed: int, writer: Any,
                 splitter: Any | None = None,
                 server_prompt: tuple[Sequence[int], bool] | None = None,
                 script: Any | None = None) -> Generation:
        return generate(request, self.fmt, config, seed, writer, splitter, server_prompt, script)

    def view(self, gen: Generation, max_tokens: int | None = None) -> CompletionView:
        return view(gen, self.tok, max_tokens)

    def answer_ids(self, spec: Any, request: dict[str, Any], ids: Sequence[int],
                   max_tokens: int | None, stream: bool, seed: int = 0) -> ScriptedAnswer:
        """What profile `spec` (one that runs a server's parsers) returns when the model wrote
        `ids` for `request`, cut at `max_tokens` (the real-server conformance's side)."""
        if spec.server is None:
            raise ValueError(f"profile {spec.name} does not run a server's parsers")
        prompt, thinking = self.server_prompt(spec.server, request)
        cut = tuple(ids[:max_tokens]) if max_tokens is not None else tuple(ids)
        truncated = len(cut) < len(ids)
        think_end = self.tok.token_id(THINK_END)
        reasoning_tokens = (cut.index(think_end) if think_end in cut else len(cut)) \
            if thinking else 0
        completion = CompletionView(
            ids=cut, thinking=thinking, reasoning=None, think_closed=think_end in cut,
            content="", calls=(), section_text="", made_calls=False, truncated=truncated,
            reasoning_tokens=reasoning_tokens)
        message = _server_message(spec.server, completion, request, self.tok, stream, prompt)
        if message.reasoning_tokens is not None:
            reasoning_tokens = message.reasoning_tokens
        return ScriptedAnswer(message, cut, reasoning_tokens, tuple(prompt))

    def message(self, spec: Any, completion: CompletionView, gen: Generation,
                request: dict[str, Any], *, stream: bool = False) -> ServedMessage:
        return render_message(spec, completion, gen, request, tok=self.tok, stream=stream)


def make_server(tokenizer: Tokenizer) -> KimiK25Server:
    """The registry's constructor for the emulator (`registry.get_server`)."""
    return KimiK25Server(tokenizer)
