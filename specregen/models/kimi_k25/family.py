"""Kimi K2.5's descriptor (`specregen.models.family.Family`), listed by the registry.

It imports none of the family's code: each part is imported when asked for. Not in the
reconstruct fingerprint (`chat_format.package_files` leaves every family's `family.py` out): it
names things, the format's files decide the ids.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from specregen.models.chat_format import ChatFormat, ProbeRules, RealVllmSpec
from specregen.models.family import Family, ServedSide
from specregen.models.tokenizer_base import MINI_TOKENIZER_DIR, Tokenizer


def make_format(tokenizer: Tokenizer, **options: Any) -> ChatFormat:
    from specregen.models.kimi_k25.format import make_format

    return make_format(tokenizer, **options)


def source_files() -> tuple[Path, ...]:
    from specregen.models.kimi_k25.format import source_files

    return source_files()


def make_probe_rules() -> ProbeRules:
    from specregen.models.kimi_k25.probe import make_probe_rules

    return make_probe_rules()


def make_server(tokenizer: Tokenizer) -> ServedSide:
    from specregen.models.kimi_k25.served import make_server

    return make_server(tokenizer)


def real_vllm_spec(tokenizer_dir: Path | None) -> RealVllmSpec:
    from specregen.models.kimi_k25.realvllm import real_vllm_spec

    return real_vllm_spec(tokenizer_dir)


FAMILY = Family(
    name="kimi-k2.5",
    models=re.compile(r"(?:^|/)kimi-k2\.?5", re.IGNORECASE),
    aliases=("kimi-k25",),
    thinking_switch="thinking",
    make_format=make_format,
    source_files=source_files,
    bundled_tokenizers={"mini": MINI_TOKENIZER_DIR},
    tokenizer_env="KIMI_TOKENIZER_DIR",
    reads_provider_traits=True,
    make_probe_rules=make_probe_rules,
    make_server=make_server,
    # The emulator's built-in profiles (emulator/profiles.py `PROFILE_SPECS`: K2.5 is the
    # default family, its profiles are the emulator's own), so it adds none.
    emulator_profiles=("openrouter", "vllm", "vllm-legacy", "vllm-k25", "sglang",
                       "sglang-noforce", "moonshot", "raw", "stripped"),
    real_vllm_spec=real_vllm_spec,
    tool_id_rule="an id is not `functions.NAME:IDX` with the conversation's index",
)
