"""Chat formats by name, the way tiktoken finds encodings: one line per family.

A family's package exposes `make_format(tokenizer, **options) -> ChatFormat`; the registry
imports it only when that format is asked for, so a run loads (and fingerprints) the chosen
format's code alone.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specregen.errors import UsageError
from specregen.models.chat_format import ChatFormat, ProbeRules, RealVllmSpec
from specregen.models.tokenizer import Tokenizer


class UnknownFormatError(UsageError, ValueError):
    """A format name or model id no registered format serves."""


@dataclass(frozen=True)
class FormatEntry:
    name: str
    package: str  # module exposing make_format(tokenizer, **options)
    models: re.Pattern[str]  # model ids (any provider prefix) this format serves
    aliases: tuple[str, ...] = ()
    # The bundled test tokenizer with the family's added tokens (a `load_tokenizer` alias).
    bundled_tokenizer: str | None = None
    # The environment variable naming the family's real tokenizer folder, if it has one.
    tokenizer_env: str | None = None
    # The module of the family's answer-shape corpus for the fidelity bench (emulator code:
    # `SHAPES`, `GATED_GROUPS`, `cases`, `group`, `probed_traits`), if it has one.
    corpus: str | None = None


FORMATS: tuple[FormatEntry, ...] = (
    FormatEntry("kimi-k2.5", "specregen.models.kimi_k25",
                re.compile(r"(?:^|/)kimi-k2\.?5", re.IGNORECASE), aliases=("kimi-k25",),
                bundled_tokenizer="mini", tokenizer_env="KIMI_TOKENIZER_DIR"),
    FormatEntry("qwen3", "specregen.models.qwen3",
                re.compile(r"(?:^|/)qwen3(?![\w.]*-?vl)", re.IGNORECASE),
                bundled_tokenizer="mini-qwen3", corpus="specregen.emulator.fidelity_qwen3"),
    FormatEntry("kimi-k3", "specregen.models.kimi_k3",
                re.compile(r"(?:^|/)kimi-k3(?![\w.])", re.IGNORECASE),
                bundled_tokenizer="mini-k3", tokenizer_env="KIMI_K3_TOKENIZER_DIR",
                corpus="specregen.emulator.fidelity_k3"),
)
DEFAULT_FORMAT = "kimi-k2.5"
# The model id a tool serves or asks for when none is given (the emulator's default model).
DEFAULT_MODEL = "moonshotai/kimi-k2.5"


def format_names() -> list[str]:
    return [e.name for e in FORMATS]


def _entry(name: str) -> FormatEntry:
    wanted = name.strip().lower()
    for entry in FORMATS:
        if wanted == entry.name or wanted in entry.aliases:
            return entry
    raise UnknownFormatError(
        f"unknown chat format {name!r}; known formats: {', '.join(format_names())}")


def canonical_name(name: str) -> str:
    """The registry name of `name` (an alias or the name itself); UnknownFormatError if none."""
    return _entry(name).name


def get_format(name: str, tokenizer: Tokenizer, **options: Any) -> ChatFormat:
    """The format `name` over `tokenizer` (`options`: the format's own, e.g. Kimi's
    `tools_format`); checks that the tokenizer has every token the format needs."""
    module = importlib.import_module(_entry(name).package)
    return module.make_format(tokenizer, **options)


def get_server(name: str, tokenizer: Tokenizer) -> Any | None:
    """The format's served side for the emulator (prompt as the server renders it, the model's
    ids, the server's parsers): `make_server` of the package's `served` module (imported only
    here, so loading a format never loads its emulation), or None when the format has none."""
    module = _optional_module(name, "served")
    make = getattr(module, "make_server", None)
    return None if make is None else make(tokenizer)


def _optional_module(name: str, module: str) -> Any | None:
    """The family's `module` (imported only when asked for), or None when it has none."""
    full = f"{_entry(name).package}.{module}"
    try:
        return importlib.import_module(full)
    except ModuleNotFoundError as exc:
        if exc.name != full:
            raise
        return None


def real_vllm_spec(name: str, tokenizer_dir: Path | None = None) -> RealVllmSpec | None:
    """How format `name` is served by a real vLLM with the scripted model (its package's
    `realvllm.real_vllm_spec`, imported only here), or None when the family has no such
    folder. `tokenizer_dir`: the family's real tokenizer, where it needs one."""
    module = _optional_module(name, "realvllm")
    return None if module is None else module.real_vllm_spec(tokenizer_dir)


def fidelity_corpus(name: str) -> Any | None:
    """Format `name`'s answer-shape corpus module for the fidelity bench (`FormatEntry.corpus`),
    or None. K2.5's has its own bench (`emulator/fidelity.py`, bench/fidelity.py)."""
    module = _entry(name).corpus
    return None if module is None else importlib.import_module(module)


def format_source_files(name: str) -> tuple[Path, ...]:
    """The files whose text decides the ids format `name` builds (for fingerprints)."""
    module = importlib.import_module(_entry(name).package)
    return tuple(module.source_files())


def thinking_switch(name: str) -> str:
    """The `chat_template_kwargs` key format `name`'s template reads for thinking on/off."""
    return importlib.import_module(_entry(name).package).THINKING_SWITCH


def reads_provider_traits(name: str) -> bool:
    """Whether format `name`'s reconstruction depends on what the endpoint probe finds about a
    provider's parsers (`ProviderTraits`, today the K2.5 parsers' traits); a format that does
    not (the default) needs no probe."""
    module = importlib.import_module(_entry(name).package)
    return bool(getattr(module, "READS_PROVIDER_TRAITS", False))


def bundled_tokenizer(name: str) -> str | None:
    """The `load_tokenizer` alias of format `name`'s bundled test tokenizer (its real added
    tokens over a small vocabulary), or None when the format bundles none."""
    return _entry(name).bundled_tokenizer


def tokenizer_env(name: str) -> str | None:
    """The environment variable that names format `name`'s tokenizer folder (a default for
    commands that count tokens), or None."""
    return _entry(name).tokenizer_env


def probe_rules(name: str) -> ProbeRules | None:
    """What the endpoint probe needs to know about format `name` (its package's
    `make_probe_rules`), or None when the format has no probe (it reads no provider traits)."""
    module = importlib.import_module(_entry(name).package)
    make = getattr(module, "make_probe_rules", None)
    return None if make is None else make()


def format_for_model(model_id: str) -> str:
    """The format that serves `model_id` (e.g. "moonshotai/kimi-k2.5", "Qwen/Qwen3-8B")."""
    for entry in FORMATS:
        if entry.models.search(model_id or ""):
            return entry.name
    raise UnknownFormatError(
        f"no chat format is known for model {model_id!r}; pass one of "
        f"{', '.join(format_names())} (--format, or `format:` in the pipeline config)")


def resolve_format_name(name: str | None, model_id: str | None) -> str:
    """An explicit name wins; else the model id decides; else the default format."""
    if name:
        return canonical_name(name)
    if model_id:
        return format_for_model(model_id)
    return DEFAULT_FORMAT
