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
from specregen.models.chat_format import ChatFormat
from specregen.models.tokenizer import Tokenizer


class UnknownFormatError(UsageError, ValueError):
    """A format name or model id no registered format serves."""


@dataclass(frozen=True)
class FormatEntry:
    name: str
    package: str  # module exposing make_format(tokenizer, **options)
    models: re.Pattern[str]  # model ids (any provider prefix) this format serves
    aliases: tuple[str, ...] = ()


FORMATS: tuple[FormatEntry, ...] = (
    FormatEntry("kimi-k2.5", "specregen.models.kimi_k25",
                re.compile(r"(?:^|/)kimi-k2\.?5", re.IGNORECASE), aliases=("kimi-k25",)),
    FormatEntry("qwen3", "specregen.models.qwen3",
                re.compile(r"(?:^|/)qwen3(?![\w.]*-?vl)", re.IGNORECASE)),
)
DEFAULT_FORMAT = "kimi-k2.5"


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
    ids, the server's parsers), or None when the format brings none (the emulator's own K2.5
    path serves Kimi)."""
    module = importlib.import_module(_entry(name).package)
    make = getattr(module, "make_server", None)
    return None if make is None else make(tokenizer)


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
