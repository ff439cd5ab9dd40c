"""Kimi K2.5's descriptor (`specregen.models.family.Family`), listed by the registry.

It imports none of the family's code: each part is imported when asked for. Not in the
reconstruct fingerprint (`chat_format.package_files` leaves every family's `family.py` out): it
names things, the format's files decide the ids.
"""

from __future__ import annotations

import re

from specregen.models.family import Family, lazy
from specregen.models.tokenizer_base import MINI_TOKENIZER_DIR

_PACKAGE = __name__.rpartition(".")[0]

FAMILY = Family(
    name="kimi-k2.5",
    models=re.compile(r"(?:^|/)kimi-k2\.?5", re.IGNORECASE),
    aliases=("kimi-k25",),
    thinking_switch="thinking",
    make_format=lazy(f"{_PACKAGE}.format", "make_format"),
    source_files=lazy(f"{_PACKAGE}.format", "source_files"),
    bundled_tokenizers={"mini": MINI_TOKENIZER_DIR},
    tokenizer_env="KIMI_TOKENIZER_DIR",
    reads_provider_traits=True,
    make_probe_rules=lazy(f"{_PACKAGE}.probe", "make_probe_rules"),
    make_server=lazy(f"{_PACKAGE}.served", "make_server"),
    # The emulator's built-in profiles (emulator/profiles.py `PROFILE_SPECS`: K2.5 is the
    # default family, its profiles are the emulator's own), so it adds none.
    emulator_profiles=("openrouter", "vllm", "vllm-legacy", "vllm-k25", "sglang",
                       "sglang-noforce", "moonshot", "raw", "stripped"),
    real_vllm_spec=lazy(f"{_PACKAGE}.realvllm", "real_vllm_spec"),
    make_corpus=lazy(f"{_PACKAGE}.corpus", "make_corpus"),
    tool_id_rule="an id is not `functions.NAME:IDX` with the conversation's index",
)
