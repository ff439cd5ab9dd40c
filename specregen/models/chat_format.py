"""What a model family's chat format must provide: the `ChatFormat` protocol.

Reconstruction, the CLI and the pipeline see a model only through this protocol; everything a
family knows (its markers, template, tool-call syntax, id policy, thinking switch, the readings
its servers' parsers leave open) lives in its own package under `specregen/models/`, found by
name in `specregen.models.registry`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from specregen.errors import UsageError
from specregen.models.tokenizer import Tokenizer
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
                        traits: ProviderTraits) -> list[list[int]]:
        """The prompt ids as servers may render it, the most common first."""
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


def pick_prompt(variants: list[list[int]], reported: int | None) -> tuple[list[int], list[str]]:
    """The prompt variant `usage.prompt_tokens` singles out, else the first (flagged)."""
    if len(variants) == 1:
        return variants[0], []
    fitting = [v for v in variants if len(v) == reported]
    if len(fitting) == 1:
        return fitting[0], []
    # Without a count that tells them apart, which rendering the server used is unknown.
    return variants[0], ["prompt_uncertain"]


def package_files(package_dir: Path, *extra: Path) -> tuple[Path, ...]:
    """Every source and template file of a format package, in a stable order."""
    files = sorted(p for p in package_dir.rglob("*") if p.suffix in (".py", ".jinja")
                   and "__pycache__" not in p.parts)
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
