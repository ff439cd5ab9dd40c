"""A model family as one typed descriptor: `Family`, declared once by each family package in its
`family.py` (`FAMILY`), listed by `specregen.models.registry` (one line a family).

A descriptor imports nothing of its family's code: every part that needs the family's modules
(its format, fingerprint files, probe rules, served side, real-vLLM spec, fidelity corpus) is a
callable that imports on call, so that a run loads only the chosen format's code. Also here,
because a family declares them: `ProfileSpec` (how an emulator profile returns a completion:
plain data, the emulator's framing reads it) and the protocols of the served side, what the
emulator calls on a family's `make_server(tokenizer)`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import import_module
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from specregen.models.chat_format import (
    ChatFormat,
    RealVllmSpec,
    ScriptedAnswer,
    ServedMessage,
)
from specregen.models.corpus import FidelityCorpus
from specregen.models.probe_rules import ProbeRules
from specregen.models.tokenizer_base import Tokenizer

# -- imports on call -----------------------------------------------------------------------------


def lazy(module: str, name: str) -> Callable[..., Any]:
    """`module.name`, imported on the first call: a descriptor's parts (a run imports only the
    chosen family's code)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(import_module(module), name)(*args, **kwargs)

    call.__qualname__ = call.__name__ = f"{module}.{name}"
    return call


def lazy_exports(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """A package's module `__getattr__` (PEP 562) that imports each exported name from the
    module `where` names, on first use: reading a family's descriptor imports nothing else of
    it, and its names stay importable from the package."""

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(f"{package}.{module}"), name)
        setattr(import_module(package), name, value)
        return value

    return __getattr__


# -- emulator profiles ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProfileSpec:
    """How one emulated provider returns a completion (the emulator's `profiles.py` frames the
    body and the stream from it)."""

    name: str
    reasoning_field: str
    parse_tools: bool  # structured `tool_calls` when the request sent `tools`
    trim_tool_calls: bool  # the parser's `\s*` around ids and arguments
    empty_content: str | None  # what an empty content is returned as
    strip_markers: bool
    openrouter: bool  # OpenRouter's extra fields, header and keep-alive comments
    # The upstream parser family this profile runs (the format's served side knows it).
    server: str | None
    # A stream's first chunk carries `content: ""` beside the role whatever follows (vLLM
    # 0.32's serving layer); else only when the message has content.
    role_content: bool


def profile_spec(name: str, reasoning_field: str, *, parse_tools: bool = True,
                 trim_tool_calls: bool = True, empty_content: str | None = None,
                 strip_markers: bool = False, openrouter: bool = False,
                 server: str | None = None, role_content: bool = False) -> ProfileSpec:
    """A `ProfileSpec` with the common defaults (a parser that trims, no OpenRouter extras)."""
    return ProfileSpec(name, reasoning_field, parse_tools, trim_tool_calls, empty_content,
                       strip_markers, openrouter, server, role_content)


# -- the served side (what the emulator calls on `make_server(tokenizer)`) -----------------------


class CompletionLike(Protocol):
    """What the emulator's body needs of a completion as delivered: its ids, reasoning share."""

    @property
    def ids(self) -> Sequence[int]: ...

    @property
    def reasoning_tokens(self) -> int: ...


class GenerationLike(Protocol):
    """What the emulator's body needs of a generation: the prompt ids the model saw."""

    @property
    def prompt_ids(self) -> Sequence[int]: ...


class Generated(GenerationLike, Protocol):
    """A generation of a served side that writes its ids: the prompt's and the completion's."""

    @property
    def ids(self) -> Sequence[int]: ...


class ServedAnswerLike(Protocol):
    """A text-given served side's answer: what the server saw, generated and returned."""

    @property
    def prompt_ids(self) -> Sequence[int]: ...

    @property
    def ids(self) -> Sequence[int]: ...

    @property
    def reasoning(self) -> str | None: ...

    @property
    def content(self) -> str | None: ...

    @property
    def calls(self) -> Sequence[tuple[str, str]]: ...

    @property
    def finish_reason(self) -> str: ...

    @property
    def reasoning_tokens(self) -> int: ...


@runtime_checkable
class ServedSide(Protocol):
    """A family's served side for the emulator (`Family.make_server`): every one answers ids
    it is given the way a profile's server returns them (the real-server conformance)."""

    def answer_ids(self, spec: ProfileSpec, request: dict[str, Any], ids: Sequence[int],
                   max_tokens: int | None, stream: bool, seed: int = 0) -> ScriptedAnswer: ...


@runtime_checkable
class IdServedSide(ServedSide, Protocol):
    """A served side whose model writes its ids itself, with the emulator's shape knobs (K2.5):
    the emulator asks it for a generation per request (cached) and for each profile's message.
    `config`, `writer`, `splitter` and `script` are the emulator's (passed through)."""

    @property
    def model_name(self) -> str: ...

    def server_prompt(self, server: str, request: dict[str, Any]) -> tuple[list[int], bool]: ...

    def generate(self, request: dict[str, Any], config: Any, seed: int, writer: Any,
                 splitter: Any | None = None,
                 server_prompt: tuple[Sequence[int], bool] | None = None,
                 script: Any | None = None) -> Generated: ...

    def view(self, gen: Any, max_tokens: int | None = None) -> CompletionLike: ...

    def message(self, spec: ProfileSpec, completion: Any, gen: Any, request: dict[str, Any], *,
                stream: bool = False) -> ServedMessage: ...


@runtime_checkable
class TextServedSide(ServedSide, Protocol):
    """A served side given the text (Qwen3, K3): the emulator decides what the model says
    (`emulator/served.py`), the family writes it as ids and parses it as the profile's server."""

    def for_profile(self, profile: str) -> TextServedSide: ...

    def call_id(self, bits: int) -> str: ...

    def answer(self, request: dict[str, Any], *, reasoning: str, content: str,
               calls: Sequence[tuple[str, Any]], max_tokens: int | None = None
               ) -> ServedAnswerLike: ...


# -- the descriptor ------------------------------------------------------------------------------


class FormatFactory(Protocol):
    """`make_format(tokenizer, **options)`: the family's chat format over a tokenizer."""

    def __call__(self, tokenizer: Tokenizer, **options: Any) -> ChatFormat: ...


@dataclass(frozen=True)
class Family:
    """Everything the rest of specregen asks of a model family, found by the registry.

    The callables import the family's modules when called (a descriptor module imports none).
    """

    name: str  # the registry name (`format:` in configs, `--format`)
    models: re.Pattern[str]  # the model ids (any provider prefix) this family serves
    # The `chat_template_kwargs` key its template reads for thinking on/off (the format's
    # `thinking_switch`; the request builder needs it without loading the format).
    thinking_switch: str
    make_format: FormatFactory
    # The files whose text decides the ids the format builds (the reconstruct fingerprint).
    source_files: Callable[[], tuple[Path, ...]]
    aliases: tuple[str, ...] = ()
    # Bundled test tokenizers (its real added tokens over a small vocabulary), `load_tokenizer`
    # alias -> folder; the first is the family's default. Fingerprinted by their files.
    bundled_tokenizers: Mapping[str, Path] = field(default_factory=dict)
    # The environment variable naming the family's real tokenizer folder, if it has one.
    tokenizer_env: str | None = None
    # Whether reconstruction reads what the endpoint probe finds (`ProviderTraits`).
    reads_provider_traits: bool = False
    # What the probe needs to read its answers, and the traits the family brings with their
    # vote rules (`ProbeRules.traits`, models/probe_rules.py).
    make_probe_rules: Callable[[], ProbeRules] | None = None
    # The emulator's side: the served side, the profile names it is served with (the first the
    # family's own vLLM), and the profiles it adds to the emulator's (names of the emulator's
    # built-in K2.5 profiles, e.g. `openrouter`, are shared).
    make_server: Callable[[Tokenizer], ServedSide] | None = None
    emulator_profiles: tuple[str, ...] = ()
    profile_specs: tuple[ProfileSpec, ...] = ()
    # How a real vLLM serves it with the scripted model (`tokenizer_dir`: its real tokenizer).
    real_vllm_spec: Callable[[Path | None], RealVllmSpec] | None = None
    # Its fidelity corpus (`models/<family>/corpus.py`: the answers the model writes, for the
    # emulator's fidelity bench and the real-vLLM harness), if it has one.
    make_corpus: Callable[[], FidelityCorpus] | None = None
    # What the gate's `tool_id_form` check asks of a call id, in words (its report's line).
    tool_id_rule: str = "the call ids break the format's id rule"

    @property
    def bundled_tokenizer(self) -> str | None:
        """The alias of the family's default bundled tokenizer, or None."""
        return next(iter(self.bundled_tokenizers), None)
