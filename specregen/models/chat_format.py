"""What a model family's chat format must provide: the `ChatFormat` protocol.

Reconstruction, the CLI and the pipeline see a model only through this protocol; everything a
family knows (its markers, template, tool-call syntax, id policy, thinking switch, the readings
its servers' parsers leave open) lives in its own package under `specregen/models/`, found by
name in `specregen.models.registry`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from specregen.errors import UsageError
from specregen.models.tokenizer_base import Tokenizer
from specregen.records import Completion, ProviderTraits, ToolCall


class FormatError(UsageError, ValueError):
    """A message or tool definition a format's template cannot render."""


@runtime_checkable
class AssembledLike(Protocol):
    """A completion rebuilt as ids (each format's `Assembled` has this shape)."""

    ids: list[int]
    reasoning: str | None
    content: str | None
    tool_calls: list[ToolCall]
    api_tool_calls: list[ToolCall]
    flags: list[str]


@dataclass
class Reading:
    """One way the answer may have been written; the evidence picks among them."""

    thinking: bool
    assembled: AssembledLike
    flags: list[str]
    prompt_ids: list[int] = field(default_factory=list)
    prompt_flags: list[str] = field(default_factory=list)

    @property
    def ids(self) -> list[int]:
        return self.assembled.ids


@runtime_checkable
class ChatFormat(Protocol):
    """One model family's chat format over a loaded tokenizer.

    `name` is the registry name; `tok` the tokenizer; `stop_id` the end-of-turn id the model
    writes last (servers differ on returning it); `source_files` the files whose text decides the
    ids (they enter the reconstruct fingerprint, and only the chosen format's do);
    `thinking_switch` the `chat_template_kwargs` key that turns thinking on or off for servers
    that render the template themselves (vLLM, SGLang); `default_system_prompt` what the
    template injects when the conversation has no system message (None: nothing).
    """

    name: str
    tok: Tokenizer
    thinking_switch: str
    default_system_prompt: str | None

    @property
    def stop_id(self) -> int: ...

    @property
    def source_files(self) -> tuple[Path, ...]: ...

    def describe(self) -> dict[str, Any]:
        """The format's options, stored with every token file it builds."""
        ...

    def encode_prompt(self, messages: Sequence[dict[str, Any]],
                      tools: Sequence[dict[str, Any]] | None = None, *,
                      thinking: bool = True) -> list[int]: ...

    def thinking_requested(self, request: dict[str, Any]) -> bool | None:
        """Whether the request turned thinking on or off, in any dialect; None if silent."""
        ...

    def history_tool_calls(self, messages: Sequence[dict[str, Any]]) -> int:
        """Tool calls the conversation already holds (formats that number calls need it)."""
        ...

    def undo_id_rewrites(self, calls: list[ToolCall], history: int, traits: ProviderTraits,
                         streamed: bool, flags: list[str]) -> list[ToolCall]:
        """The calls with the ids as the model wrote them, where a provider's rewrite is known."""
        ...

    def readings(self, request: dict[str, Any], completion: Completion, calls: list[ToolCall],
                 thinking: bool, truncated: bool, history: int,
                 traits: ProviderTraits) -> list[Reading]:
        """Every reading of the answer the response allows, the most likely first."""
        ...

    def prompt_variants(self, messages: list[dict[str, Any]],
                        tools: list[dict[str, Any]] | None, thinking: bool,
                        traits: ProviderTraits, request: dict[str, Any] | None = None
                        ) -> list[list[int]]:
        """The prompt ids as servers may render it, the most common first. `request`: the
        whole request, for a format whose prompt depends on more than the messages and tools
        (K3 renders `tool_choice`, `response_format` and the thinking effort)."""
        ...

    def history_message(self, completion: Completion, *, thinking: bool) -> dict[str, Any]:
        """The model's answer as the assistant message a later request of the conversation
        sends: content, the reasoning when thinking (as `reasoning` and `reasoning_content`),
        `tool_calls` with the model's ids."""
        ...


    # -- export -------------------------------------------------------------------------

    def template_text(self) -> str:
        """The format's own Jinja chat template (the export check's default)."""
        ...

    def trainer_render(self, conversation: Sequence[dict[str, Any]],
                       tools: Sequence[dict[str, Any]] | None, *, thinking: bool,
                       template: str) -> str:
        """A whole conversation through `template`, as a re-tokenizing trainer renders it."""
        ...

    # -- the gate's rules -----------------------------------------------------------------
    # `tool_id_in_tokens`: the model writes the call ids (they must parse back); `calls_open`:
    # the text that opens the tool calls (where a round-trip excerpt starts).

    tool_id_in_tokens: bool
    calls_open: str

    def call_structure(self, ids: Sequence[int], *, n_calls: int, thinking: bool,
                       truncated: bool) -> CallStructure:
        """Special ids where the completion layout puts them, and how many calls are whole."""
        ...

    def parse_tool_calls(self, text: str, *, truncated: bool) -> ParsedCalls | None:
        """The format's one raw tool-call parser (what a client reads from raw text)."""
        ...

    def comparable_arguments(self, arguments: str) -> str:
        """Arguments as the round trip compares them (the parser's normal form)."""
        ...

    def tool_id_problems(self, calls: Sequence[ToolCall],
                         messages: list[dict[str, Any]] | None) -> list[str]:
        """Call ids the format's id policy rejects, one line each."""
        ...

    def find_marker_text(self, text: str | None) -> str | None:
        """The first of the format's marker strings written as text in `text`, if any."""
        ...

    # -- viewers (inspector, report) ------------------------------------------------------
    # `markers`: the special tokens that lay a completion out, by role.

    markers: CompletionMarkers


def assistant_history_message(content: str | None, reasoning: str | None,
                              calls: Sequence[ToolCall], *, thinking: bool) -> dict[str, Any]:
    """An assistant message in OpenAI shape from an answer's parts (the formats' common part of
    `history_message`): arguments stay the strings the model wrote. The reasoning travels under
    both names servers read it from: vLLM reads only `reasoning` and silently drops
    `reasoning_content` (`chat_utils._parse_chat_message_content`, vllm-project/vllm#38488);
    SGLang and Moonshot read only `reasoning_content`; each ignores the other name."""
    message: dict[str, Any] = {"role": "assistant", "content": content or ""}
    if thinking and reasoning is not None:
        message["reasoning"] = message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [
            {"id": call.id, "type": "function",
             "function": {"name": call.name, "arguments": call.arguments}}
            for call in calls
        ]
    return message


def pick_prompt(variants: list[list[int]], reported: int | None) -> tuple[list[int], list[str]]:
    """The prompt variant `usage.prompt_tokens` singles out, else the first (flagged)."""
    if len(variants) == 1:
        return variants[0], []
    fitting = [v for v in variants if len(v) == reported]
    if len(fitting) == 1:
        return fitting[0], []
    # Without a count that tells them apart, which rendering the server used is unknown.
    return variants[0], ["prompt_uncertain"]


def streams_calls_as_parsed(fmt: ChatFormat) -> bool:
    """Whether each server the format documents streams a tool call as its parser reads it
    (the name, then the arguments in pieces) and sends content written before the first call
    ahead of it: the format's optional class attribute `calls_streamed_as_parsed` (absent =
    False). Then the client's record of the stream's order (`Completion.content_at_calls`)
    places the content without a probe. A format whose providers a probe tells apart leaves
    it out: the probe's traits say it per provider."""
    return getattr(fmt, "calls_streamed_as_parsed", False) is True


def parsers_drop_text(fmt: ChatFormat) -> bool:
    """Whether every server parser the format documents can drop model text unseen, on every
    path (K3's unwrap the response channel even for an instant answer without tools): the
    format's optional class attribute `parsers_drop_text` (absent = False). Then no count
    within the tolerance passes a reading, only an exact one (reconstruct.py `_lossy`)."""
    return getattr(fmt, "parsers_drop_text", False) is True


def streamed_content_after_calls(fmt: ChatFormat) -> bool:
    """Whether a stream may send text the model wrote after (or between) its calls as content,
    so that without a record of the stream's order the content's place is unknown: the
    format's optional class attribute `streamed_content_after_calls` (absent = True). K3's
    vLLM stream sends content from the response channel only, which its layout puts before
    the calls."""
    return getattr(fmt, "streamed_content_after_calls", True) is not False


# Each family package's descriptor module (`specregen.models.family.Family` as `FAMILY`).
DESCRIPTOR_MODULE = "family.py"


def package_files(package_dir: Path, *extra: Path,
                  exclude: frozenset[str] = frozenset()) -> tuple[Path, ...]:
    """Every source and template file of a format package, in a stable order; `exclude` names
    modules that do not decide the ids (the emulator's served side), so
    editing them does not rerun reconstruction. The family's descriptor (`family.py`, read by
    the registry: names and where things are) is never one of them."""
    files = sorted(p for p in package_dir.rglob("*") if p.suffix in (".py", ".jinja")
                   and "__pycache__" not in p.parts and p.name not in exclude
                   and p.name != DESCRIPTOR_MODULE)
    return (*files, *extra)


@dataclass(frozen=True)
class CallStructure:
    """What the gate's structure check found in a completion's ids.

    `problems`: special ids out of place (empty when the layout fits); `whole_ids` /
    `whole_args`: how many calls have their id (name) / arguments whole -- a truncated sample
    may end inside its last call, which is then exempt from the checks that need it whole.
    """

    problems: list[str]
    whole_ids: int
    whole_args: int


@dataclass(frozen=True)
class ParsedCalls:
    """Tool calls a client parser reads back from raw completion text (the gate's round trip)."""

    start: int  # where the first call (or the section holding them) starts in the text
    calls: list[ToolCall]


def whole_calls(n_calls: int, closing_markers: int, truncated: bool) -> int:
    """Calls whose part closed by `closing_markers` is whole: a cut may leave the last open."""
    if truncated and n_calls and closing_markers < n_calls:
        return n_calls - 1
    return n_calls


@dataclass(frozen=True)
class CompletionMarkers:
    """The special tokens that lay a completion out, by role, as token names (viewers look
    them up in the tokenizer): the inspector and the report name a completion's parts with
    them and never need a family's constants.

    A completion is `reasoning [reasoning_end] content [calls] end`. `calls_begin` is the
    first token of the tool calls (a section opener, or the first call's own opener when
    the format has no section); `arguments_begin` separates a call's id from its arguments
    (None: a call's whole body is its arguments); `calls_end` closes a section (None: no
    section). `literals` are the marker strings that, written by the model as plain text,
    make reconstruction raise a flag (the inspector points at them).
    """

    reasoning_end: str
    calls_begin: str
    call_begin: str
    call_end: str
    end: str
    arguments_begin: str | None = None
    calls_end: str | None = None
    literals: tuple[str, ...] = ()

    def names(self) -> tuple[str, ...]:
        """Every structural token name, each once."""
        found = (self.reasoning_end, self.calls_begin, self.call_begin, self.arguments_begin,
                 self.call_end, self.calls_end, self.end)
        return tuple(dict.fromkeys(n for n in found if n))


# -- the served side (the emulator's formats) --------------------------------------------------


@dataclass(frozen=True, slots=True)
class ServedCall:
    id: str
    name: str
    arguments: str
    # The `index` a stream gives the call when it is not its position (vLLM 0.32 skips the
    # index of a call it dropped); None: its position.
    index: int | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class ServedMessage:
    """The assistant message a provider returns, before it becomes JSON (what a format's served
    side hands the emulator's profiles)."""

    reasoning: str | None
    content: str | None
    tool_calls: tuple[ServedCall, ...]
    finish_reason: str
    # Streams: per call, the characters of `content` sent before its first delta (the upstream
    # stream parsers send text between and after calls after them); None: all before.
    content_at_calls: tuple[int, ...] | None = field(default=None, compare=False)
    # The usage's reasoning share when the profile's server counts it from what it parsed
    # (vLLM 0.32); None: the completion's own count.
    reasoning_tokens: int | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class ScriptedAnswer:
    """A served side's answer to ids it was given (`answer_ids`): the message, the ids as
    delivered (cut at `max_tokens`), the reasoning share the usage reports, the prompt ids the
    server rendered. It is both the completion and the generation the emulator's body
    builders read."""

    message: ServedMessage
    ids: tuple[int, ...]
    reasoning_tokens: int
    prompt_ids: tuple[int, ...]


# -- the real server (the real-vLLM harness, `specregen.realserver`) ---------------------------


@dataclass(frozen=True)
class RealVllmSpec:
    """How a family is served by a real vLLM with the scripted model: its parsers and its
    model folder. `build_folder(dest)` writes the tokenizer files and the chat template into
    `dest` (the harness adds the model's config, and reads specregen's tokenizer from the same
    folder); `stop_id` ends an answer; `vocab_size` is the model's output size (every id the
    tokenizer knows, added ones included)."""

    format_name: str
    served_model_name: str
    tool_parser: str
    reasoning_parser: str
    build_folder: Callable[[Path], None]
    stop_id: int
    bos_id: int | None
    vocab_size: int
    # The emulator profile that restates this server (the served side's `answer_ids`; the
    # real cases of the family's fidelity corpus are drawn for it).
    emulator_profile: str
    trust_remote_code: bool = False
    # More `vllm serve` arguments the family needs (K3: `--tokenizer-mode kimi_k3`, the mode
    # a real K3 checkpoint's architecture selects by itself).
    server_args: tuple[str, ...] = ()
