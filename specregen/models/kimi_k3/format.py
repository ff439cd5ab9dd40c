"""Kimi K3 as a chat format (`specregen.models.chat_format.ChatFormat`): prompt encoding,
completion assembly, the raw tool-call parser, the id policy, the gate's rules.

A K3 completion, as the model writes it (docs/kimi-k3.md §3; the prompt ends in
`<|open|>message role="assistant"<|sep|><|open|>think<|sep|>`, or `...<|open|>response<|sep|>`
with thinking off, when the completion starts at CONTENT):

    REASONING <|close|>think<|sep|> <|open|>response<|sep|> CONTENT <|close|>response<|sep|>
    [ <|open|>tools<|sep|> ( <|open|>call tool="NAME" index="k"<|sep|>
          ( <|open|>argument key="KEY" type="T"<|sep|> VALUE <|close|>argument<|sep|> )*
        <|close|>call<|sep|> )+ <|close|>tools<|sep|> ]
    <|close|>message<|sep|> <|end_of_msg|>

The assembly writes it segment by segment, as the encoder writes a history turn (encoding.py):
the four markers as their ids, each tag name, attribute piece and text as ordinary BPE on its
own (the assumption of docs/kimi-k3.md §3: the model's tokens follow the encoder's
segmentation, which it was trained on). Model-written text is never scanned for special-token
strings: a literal `<|open|>` typed in content is ordinary text.

Call ids: K3 writes none. vLLM 0.32 makes them (`chatcmpl-tool-` + 16 hex digits), so they
are not in the tokens, are never rendered back into a prompt (tool results are matched by id
and rendered by name and position) and reconstruction ignores them, as for Qwen3.

Arguments: vLLM's parser returns `json.dumps` of the parsed arguments; string values are the
model's raw text, other values were `json.loads`ed and dumped again, so their spelling is the
canonical one the encoder shows the model (`json.dumps`, default separators) by assumption.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specregen.models.chat_format import (
    CallStructure,
    CompletionMarkers,
    FormatError,
    ParsedCalls,
    Reading,
    package_files,
    whole_calls,
)
from specregen.models.kimi_k3 import encoding as enc
from specregen.models.kimi_k3 import readings as kimi_readings
from specregen.models.kimi_k3.completion import (
    Assembled,
    arguments_object,
    completion_segments,
    parse_calls,
)
from specregen.models.kimi_k3.encoding import (
    CLOSE,
    END_OF_MSG,
    MARKERS,
    OPEN,
    SEP,
    EncodingError,
    Segment,
)
from specregen.models.kimi_k3.servers import (
    TOOLS_CLOSE,
    TOOLS_OPEN,
    TOOLS_OPEN_RE,
    MarkerIds,
)
from specregen.models.kimi_k3.tokens import check_tokenizer, encode_segments
from specregen.models.tokenizer import Tokenizer
from specregen.records import Completion, ProviderTraits, ToolCall

# The chat_template_kwargs key vLLM's K3 renderer and parsers read first for thinking on/off.
THINKING_SWITCH = "thinking"
TOOL_ID_IN_TOKENS = False
# vLLM's ids (`make_tool_call_id`: 16 hex digits) and OpenAI-style routers' `call_...`.
SERVER_ID_PREFIXES = ("chatcmpl-tool-", "call_")

THINK_CLOSE = CLOSE + "think" + SEP
MESSAGE_CLOSE = CLOSE + "message" + SEP


def is_server_tool_id(tool_id: str | None) -> bool:
    return bool(tool_id) and str(tool_id).startswith(SERVER_ID_PREFIXES)


def canonical_arguments(arguments: str) -> str:
    """Arguments in the parser's normal form (`json.dumps`, default separators), or as they
    are when not JSON."""
    try:
        return json.dumps(json.loads(arguments), ensure_ascii=False)
    except (ValueError, TypeError):
        return arguments


_CACHE_SIZE = 256


class KimiK3:
    """Kimi K3 prompt and completion encoding over a loaded tokenizer (a `ChatFormat`)."""

    name = "kimi-k3"
    thinking_switch = THINKING_SWITCH
    default_system_prompt = None  # the encoder injects none
    # K3's roles are tag sequences (`<|close|>think<|sep|>`, `<|open|>tools<|sep|>`, ...), not
    # single tokens: the completion's first `<|close|>` does close the reasoning and
    # `<|end_of_msg|>` ends it, but no single token opens or closes the calls -- those roles
    # name the tag texts, which single-token viewers find no id for.
    markers = CompletionMarkers(
        reasoning_end=CLOSE, calls_begin=TOOLS_OPEN, call_begin=OPEN + "call",
        call_end=CLOSE + "call" + SEP, calls_end=TOOLS_CLOSE, end=END_OF_MSG,
        literals=MARKERS)
    # vLLM's K3 stream sends content only from the response channel, which the layout puts
    # before the tools channel: nothing written after a call is sent as content
    # (`chat_format.streamed_content_after_calls`).
    streamed_content_after_calls = False
    # Every vLLM K3 path unwraps the response channel and can drop text around it, the plain
    # instant answer too (`chat_format.parsers_drop_text`): only an exact count proves a
    # reading.
    parsers_drop_text = True

    def __init__(self, tokenizer: Tokenizer, *, revision: str = "r3") -> None:
        if revision not in enc.REVISIONS:
            raise FormatError(f"unknown K3 encoder revision {revision!r}; known: "
                              f"{', '.join(enc.REVISIONS)}")
        self.tok = tokenizer
        self.ids = check_tokenizer(tokenizer)
        self.revision = revision
        self.marker_ids = MarkerIds.of(tokenizer)
        self._short: dict[str, list[int]] = {}
        self._long: OrderedDict[str, list[int]] = OrderedDict()

    # -- ChatFormat -----------------------------------------------------------------------

    @property
    def stop_id(self) -> int:
        return self.ids[END_OF_MSG]

    @property
    def source_files(self) -> tuple[Path, ...]:
        return source_files()

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "encoder_revision": self.revision}

    def thinking_requested(self, request: dict[str, Any]) -> bool | None:
        """`chat_template_kwargs.thinking`, else `enable_thinking`, else a top-level
        `reasoning_effort` ("none": off), else the API dialects' own fields."""
        from specregen.wire.response import dialect_thinking

        kwargs = request.get("chat_template_kwargs")
        if isinstance(kwargs, dict):
            for key in (THINKING_SWITCH, "enable_thinking"):
                if isinstance(kwargs.get(key), bool):
                    return kwargs[key]
        effort = request.get("reasoning_effort")
        if isinstance(effort, str):
            return effort != "none"
        return dialect_thinking(request)

    def history_tool_calls(self, messages: Sequence[dict[str, Any]]) -> int:
        return sum(len(m.get("tool_calls") or []) for m in messages
                   if isinstance(m, dict) and m.get("role") == "assistant")

    def undo_id_rewrites(self, calls: list[ToolCall], history: int, traits: ProviderTraits,
                         streamed: bool, flags: list[str]) -> list[ToolCall]:
        return calls  # the ids are the server's: never in the tokens

    def readings(self, request: dict[str, Any], completion: Completion, calls: list[ToolCall],
                 thinking: bool, truncated: bool, history: int,
                 traits: ProviderTraits) -> list[Reading]:
        return kimi_readings.readings(self, request, completion, calls, thinking, truncated)

    def prompt_variants(self, messages: list[dict[str, Any]],
                        tools: list[dict[str, Any]] | None, thinking: bool,
                        traits: ProviderTraits, request: dict[str, Any] | None = None
                        ) -> list[list[int]]:
        return kimi_readings.prompt_variants(self, messages, tools, thinking, request)

    def history_message(self, completion: Completion, *, thinking: bool) -> dict[str, Any]:
        """The answer as a history turn: content and reasoning as returned (the response and
        think channels' bodies, which the encoder writes back as they are), the calls with
        the server's ids (results are matched to them; the ids are never rendered). Calls
        left as raw tools-channel text in the content become structured calls."""
        from specregen.models.chat_format import assistant_history_message

        content, calls = completion.content, list(completion.tool_calls)
        if not calls and content and TOOLS_OPEN_RE.search(content):
            found = parse_calls(content, truncated=False)
            if found is not None and found.calls:
                calls, content = found.calls, content[: found.start]
        calls = [c if c.id else ToolCall(f"call_{i}", c.name, c.arguments)
                 for i, c in enumerate(calls)]
        return assistant_history_message(content, completion.reasoning, calls,
                                         thinking=thinking)

    # -- export ---------------------------------------------------------------------------

    def template_text(self) -> str:
        """K3 has no Jinja template: its "template" is the Python encoder (encoding.py, our
        own), whose source is what the export check names."""
        return (Path(__file__).resolve().parent / "encoding.py").read_text(encoding="utf-8")

    def trainer_render(self, conversation: Sequence[dict[str, Any]],
                       tools: Sequence[dict[str, Any]] | None, *, thinking: bool,
                       template: str) -> str:
        """The whole conversation (no generation prompt) as the encoder renders it, as text
        (markers as their strings). A re-tokenizing trainer does not encode this text: it
        asks the tokenizer's `apply_chat_template` for ids (`trainer_ids`)."""
        return enc.joined(self._trainer_segments(conversation, tools, thinking))

    def trainer_ids(self, conversation: Sequence[dict[str, Any]],
                    tools: Sequence[dict[str, Any]] | None, *, thinking: bool,
                    template: str) -> list[int]:
        """The ids a trainer gets from K3's tokenizer (`apply_chat_template(..., tokenize=
        True)`): the encoder's segments, each tokenized on its own."""
        return self.encode_segments(self._trainer_segments(conversation, tools, thinking))

    def _trainer_segments(self, conversation: Sequence[dict[str, Any]],
                          tools: Sequence[dict[str, Any]] | None, thinking: bool
                          ) -> list[Segment]:
        try:
            return enc.render_segments(list(conversation), list(tools) if tools else None,
                                       thinking=thinking, add_generation_prompt=False,
                                       revision=self.revision)
        except EncodingError as exc:
            raise FormatError(str(exc)) from None

    # -- prompt ---------------------------------------------------------------------------

    def encode_segments(self, segments: list[Segment]) -> list[int]:
        """Segments as ids; long texts that repeat across a dataset (the tool declaration, the
        effort message) are kept, bounded."""
        ids: list[int] = []
        run: list[Segment] = []
        for piece in segments:
            if not piece[1] and len(piece[0]) > 256:
                ids += encode_segments(self.tok, run, self._short)
                run = []
                ids += self._long_ids(piece[0])
            else:
                run.append(piece)
        return ids + encode_segments(self.tok, run, self._short)

    def _long_ids(self, value: str) -> list[int]:
        found = self._long.get(value)
        if found is not None:
            self._long.move_to_end(value)
            return found
        found = self._long[value] = self.tok.encode_ordinary(value)
        if len(self._long) > _CACHE_SIZE:
            self._long.popitem(last=False)
        return found

    def render_prompt(self, messages: Sequence[dict[str, Any]],
                      tools: Sequence[dict[str, Any]] | None = None, *,
                      thinking: bool = True) -> str:
        return enc.joined(self.prompt_segments(messages, tools, thinking=thinking))

    def prompt_segments(self, messages: Sequence[dict[str, Any]],
                        tools: Sequence[dict[str, Any]] | None = None, *, thinking: bool = True,
                        **options: Any) -> list[Segment]:
        try:
            return enc.render_segments(list(messages), list(tools) if tools else None,
                                       thinking=thinking, revision=self.revision, **options)
        except EncodingError as exc:
            raise FormatError(str(exc)) from None

    def encode_prompt(self, messages: Sequence[dict[str, Any]],
                      tools: Sequence[dict[str, Any]] | None = None, *,
                      thinking: bool = True) -> list[int]:
        """The messages as given (history arguments strings parsed), the default effort."""
        return self.encode_segments(self.prompt_segments(messages, tools, thinking=thinking))

    # -- completion -----------------------------------------------------------------------

    def assemble(self, reasoning: str | None, content: str | None,
                 tool_calls: Sequence[ToolCall], *, thinking: bool, truncated: bool,
                 think_channel: bool = True) -> Assembled:
        """Completion ids from the API's fields in K3's layout (the module's docstring):
        reasoning and content verbatim (empty channels when null), each call's arguments
        object written back one `argument` tag per key, in order, typed by its JSON value.
        Not truncated: the stop id last. (Readings of lossy or cut answers: readings.py.)"""
        flags: list[str] = []
        objects: list[tuple[str, dict[str, Any]]] = []
        for call in tool_calls:
            value = arguments_object(call.arguments)
            if value is None:
                flags.append("arguments_not_object")
                value = {}
            objects.append((call.name, value))
        if any(not_string(v) for _, a in objects for v in a.values()):
            flags.append("arguments_canonical_assumed")
        if any(c.id and not is_server_tool_id(c.id) for c in tool_calls):
            flags.append("tool_id_unexpected")
        segments = completion_segments(reasoning, content, objects, thinking=thinking,
                                       think_channel=think_channel)
        ids = self.encode_segments(segments)
        if not truncated:
            ids.append(self.stop_id)
        rebuilt = [ToolCall("", name, json.dumps(args, ensure_ascii=False))
                   for name, args in objects]
        return Assembled(ids, reasoning, content, rebuilt, list(tool_calls), flags)

    # -- ChatFormat: the gate's rules ------------------------------------------------------

    tool_id_in_tokens = TOOL_ID_IN_TOKENS  # the server makes the ids
    calls_open = TOOLS_OPEN

    def call_structure(self, ids: Sequence[int], *, n_calls: int, thinking: bool,
                       truncated: bool) -> CallStructure:
        return structure(self, ids, n_calls=n_calls, thinking=thinking, truncated=truncated)

    def parse_tool_calls(self, text_value: str, *, truncated: bool) -> ParsedCalls | None:
        return parse_calls(text_value, truncated=truncated)

    def comparable_arguments(self, arguments: str) -> str:
        # vLLM's parser dumps the arguments object again: compare its canonical text.
        return canonical_arguments(arguments)

    def tool_id_problems(self, calls: Sequence[ToolCall],
                         messages: list[dict[str, Any]] | None) -> list[str]:
        return []  # no id is in the tokens: nothing the ids could get wrong

    def find_marker_text(self, text_value: str | None) -> str | None:
        if not text_value or "<|" not in text_value:
            return None
        return next((m for m in MARKERS if m in text_value), None)


def not_string(value: Any) -> bool:
    return not isinstance(value, str)


def structure(fmt: KimiK3, ids: Sequence[int], *, n_calls: int, thinking: bool,
              truncated: bool) -> CallStructure:
    """Marker ids where K3's layout puts them (for the gate): the completion's tags balance
    (every `<|open|>`/`<|close|>` ends at a `<|sep|>`), the think channel closes at most once
    when thinking (and never opens), one tools channel holding one call per returned call,
    `<|close|>message<|sep|>` then `<|end_of_msg|>` last unless cut."""
    o, c, s, end = (fmt.ids[m] for m in (OPEN, CLOSE, SEP, END_OF_MSG))
    text_of = fmt.tok.decode
    tags: list[tuple[str, str]] = []  # ("open"/"close", tag name)
    problems: list[str] = []
    i = 0
    ids = list(ids)
    while i < len(ids):
        t = ids[i]
        if t in (o, c):
            j = i + 1
            while j < len(ids) and ids[j] not in (o, c, s, end):
                j += 1
            if j < len(ids) and ids[j] == s:
                name = text_of(ids[i + 1:j]).strip().split(" ", 1)[0]
                tags.append(("open" if t == o else "close", name))
                i = j + 1
                continue
            if not (truncated and j == len(ids)):
                problems.append(f"a {'<|open|>' if t == o else '<|close|>'} tag is not ended by "
                                "<|sep|>")
            i = j
            continue
        if t == s:
            problems.append("a <|sep|> id outside a tag")
        elif t == end and i != len(ids) - 1:
            problems.append("<|end_of_msg|> inside the completion")
        i += 1
    opened = [n for k, n in tags if k == "open"]
    closed = [n for k, n in tags if k == "close"]
    if thinking and "think" in opened:
        problems.append("a think channel opened inside the completion (the prompt opens it)")
    if thinking and closed.count("think") > 1:
        # None is a think channel the model never closed (a reading of its own).
        problems.append(f"{closed.count('think')} think-channel close tags with thinking on")
    if not thinking and "think" in opened + closed:
        problems.append("think tags with thinking off")
    calls_opened, calls_closed = opened.count("call"), closed.count("call")
    if opened.count("tools") > 1 or closed.count("tools") > 1:
        problems.append("more than one tools channel")
    if not truncated:
        if list(ids[-1:]) != [end]:
            problems.append("<|end_of_msg|> is not the last id")
        if closed[-1:] != ["message"]:
            problems.append("the completion does not close its message before <|end_of_msg|>")
        if calls_opened != calls_closed or calls_closed != n_calls:
            problems.append(f"call tags ({calls_opened}/{calls_closed}) do not fit {n_calls} "
                            "call(s)")
    else:
        if end in ids:
            problems.append("a truncated completion holds <|end_of_msg|>")
        if not (calls_closed == n_calls and calls_opened in (n_calls, n_calls + 1)):
            problems.append(f"call tags ({calls_opened}/{calls_closed}) do not fit {n_calls} "
                            "call(s)")
    # A cut inside the last call leaves its name (an attribute) and arguments in doubt.
    whole = whole_calls(n_calls, calls_closed, truncated)
    return CallStructure(problems, whole, whole)


def source_files() -> tuple[Path, ...]:
    """The files whose text decides the ids this format builds (the reconstruct fingerprint):
    the package's, and the server kit's parser types its readings run (servers.py)."""
    here = Path(__file__).resolve().parent
    return package_files(here, here.parent / "serverkit" / "stream.py",
                         exclude=NOT_RECONSTRUCTION)


# The emulator's served side, the fidelity corpus and the real-vLLM folder's files:
# reconstruction never imports them.
NOT_RECONSTRUCTION = frozenset({"served.py", "corpus.py", "realvllm.py", "hf_tokenizer.py"})


def make_format(tokenizer: Tokenizer, **options: Any) -> KimiK3:
    """The registry's constructor; option `revision` ("r3", the default, or "r2"): the
    model-repo revision of the encoder the server runs (docs/kimi-k3.md §5 #1)."""
    unknown = set(options) - {"revision"}
    if unknown:
        raise FormatError(f"the kimi-k3 format takes only `revision` (got {', '.join(unknown)})")
    return KimiK3(tokenizer, **options)
