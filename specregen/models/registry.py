"""Chat formats by name, the way tiktoken finds encodings: one line per family.

`FAMILY_MODULES` lists each family's descriptor module (`specregen/models/<family>/family.py`,
a `specregen.models.family.Family` named `FAMILY`); everything the rest of specregen asks about
a family goes through it: its format (`get_format`, `format_for_model`), fingerprint files,
thinking switch, bundled tokenizers (the `load_tokenizer` aliases), tokenizer variable, probe
rules, served side and emulator profiles, real-vLLM spec and fidelity corpus. A descriptor
imports none of its family's code; each part is imported when asked for, so a run loads (and
fingerprints) the chosen format's code alone.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from specregen.errors import UsageError
from specregen.models.chat_format import ChatFormat, RealVllmSpec
from specregen.models.corpus import FidelityCorpus
from specregen.models.family import Family, ProfileSpec, ServedSide
from specregen.models.probe_rules import ProbeRules, TraitReport
from specregen.models.tokenizer_base import Tokenizer

# The families, one line each: the module holding the family's `FAMILY` descriptor. The first
# is the default format's.
FAMILY_MODULES: tuple[str, ...] = (
    "specregen.models.kimi_k25.family",
    "specregen.models.qwen3.family",
    "specregen.models.kimi_k3.family",
)
DEFAULT_FORMAT = "kimi-k2.5"
# The model id a tool serves or asks for when none is given (the emulator's default model).
DEFAULT_MODEL = "moonshotai/kimi-k2.5"


class UnknownFormatError(UsageError, ValueError):
    """A format name or model id no registered format serves."""


_loaded: dict[str, Family] = {}


def _descriptor(module: str) -> Family:
    family = _loaded.get(module)
    if family is None:
        found = getattr(importlib.import_module(module), "FAMILY", None)
        if not isinstance(found, Family):
            raise TypeError(f"{module}.FAMILY is not a specregen.models.family.Family")
        family = _loaded[module] = found
    return family


def families() -> tuple[Family, ...]:
    """Every registered family's descriptor, in `FAMILY_MODULES` order."""
    return tuple(_descriptor(m) for m in FAMILY_MODULES)


def format_names() -> list[str]:
    return [f.name for f in families()]


def family(name: str) -> Family:
    """The descriptor of format `name` (its registry name or an alias)."""
    wanted = name.strip().lower()
    for fam in families():
        if wanted == fam.name or wanted in fam.aliases:
            return fam
    raise UnknownFormatError(
        f"unknown chat format {name!r}; known formats: {', '.join(format_names())}")


def canonical_name(name: str) -> str:
    """The registry name of `name` (an alias or the name itself); UnknownFormatError if none."""
    return family(name).name


def get_format(name: str, tokenizer: Tokenizer, **options: Any) -> ChatFormat:
    """The format `name` over `tokenizer` (`options`: the format's own, e.g. Kimi's
    `tools_format`); checks that the tokenizer has every token the format needs."""
    return family(name).make_format(tokenizer, **options)


def get_server(name: str, tokenizer: Tokenizer) -> ServedSide | None:
    """The format's served side for the emulator (prompt as the server renders it, the model's
    ids, the server's parsers): the descriptor's `make_server` (the family's `served` module,
    imported only then, so loading a format never loads its emulation), or None when the
    format has none."""
    make = family(name).make_server
    return None if make is None else make(tokenizer)


def real_vllm_spec(name: str, tokenizer_dir: Path | None = None) -> RealVllmSpec | None:
    """How format `name` is served by a real vLLM with the scripted model (the descriptor's
    `real_vllm_spec`, imported only here), or None when the family has no such folder.
    `tokenizer_dir`: the family's real tokenizer, where it needs one."""
    make = family(name).real_vllm_spec
    return None if make is None else make(tokenizer_dir)


def fidelity_corpus(name: str) -> FidelityCorpus | None:
    """Format `name`'s fidelity corpus (the descriptor's `make_corpus`: the family's
    `corpus.py`, imported only here), or None when the family has none."""
    make = family(name).make_corpus
    return None if make is None else make()


def format_source_files(name: str) -> tuple[Path, ...]:
    """The files whose text decides the ids format `name` builds (for fingerprints)."""
    return tuple(family(name).source_files())


def thinking_switch(name: str) -> str:
    """The `chat_template_kwargs` key format `name`'s template reads for thinking on/off."""
    return family(name).thinking_switch


def reads_provider_traits(name: str) -> bool:
    """Whether format `name`'s reconstruction depends on what the endpoint probe finds about a
    provider's parsers (`ProviderTraits`); a format that does not needs no probe."""
    return family(name).reads_provider_traits


def bundled_tokenizer(name: str) -> str | None:
    """The `load_tokenizer` alias of format `name`'s bundled test tokenizer (its real added
    tokens over a small vocabulary), or None when the format bundles none."""
    return family(name).bundled_tokenizer


def bundled_tokenizer_folders() -> Mapping[str, Path]:
    """Every family's bundled tokenizers: `load_tokenizer` alias -> folder."""
    folders: dict[str, Path] = {}
    for fam in families():
        for alias, folder in fam.bundled_tokenizers.items():
            if folders.setdefault(alias, folder) != folder:
                raise ValueError(f"two families bundle a tokenizer named {alias!r}")
    return folders


def tokenizer_env(name: str) -> str | None:
    """The environment variable that names format `name`'s tokenizer folder (a default for
    commands that count tokens), or None."""
    return family(name).tokenizer_env


def probe_rules(name: str) -> ProbeRules | None:
    """What the endpoint probe needs to know about format `name` (the descriptor's
    `make_probe_rules`), or None when the format has no probe (it reads no provider traits)."""
    make = family(name).make_probe_rules
    return None if make is None else make()


def trait_reports(name: str | None = None) -> dict[str, TraitReport]:
    """The gate report's words for the family traits that change the server's text (their
    `FamilyTrait.report`), by trait name: format `name`'s, or every family's."""
    found: dict[str, TraitReport] = {}
    for fam in families() if name is None else (family(name),):
        rules = None if fam.make_probe_rules is None else fam.make_probe_rules()
        for trait in rules.traits if rules is not None else ():
            if trait.report is not None:
                found.setdefault(trait.name, trait.report)
    return found


def emulator_profiles(name: str) -> tuple[str, ...]:
    """The emulator profiles format `name` is served with."""
    return family(name).emulator_profiles


def profile_specs() -> tuple[ProfileSpec, ...]:
    """The emulator profiles the families add to the emulator's built-in ones."""
    return tuple(spec for fam in families() for spec in fam.profile_specs)


def tool_id_rule(name: str) -> str:
    """What the gate's `tool_id_form` check asks of format `name`'s call ids, in words."""
    return family(name).tool_id_rule


def format_for_model(model_id: str) -> str:
    """The format that serves `model_id` (e.g. "moonshotai/kimi-k2.5", "Qwen/Qwen3-8B")."""
    for fam in families():
        if fam.models.search(model_id or ""):
            return fam.name
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

