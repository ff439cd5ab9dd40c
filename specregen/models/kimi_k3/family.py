"""Kimi K3's descriptor (`specregen.models.family.Family`), listed by the registry.

It imports none of the family's code: each part is imported when asked for. Not in the
reconstruct fingerprint (`chat_format.package_files` leaves every family's `family.py` out).
"""

from __future__ import annotations

import re
from pathlib import Path

from specregen.models.family import Family, lazy, profile_spec

# The mini ranks under Kimi K3's added-token table (tokens.py `write_mini`): `mini-k3`, kept in
# the family's package.
MINI_K3_TOKENIZER_DIR = Path(__file__).resolve().parent / "assets" / "mini_tokenizer"

_PACKAGE = __name__.rpartition(".")[0]

FAMILY = Family(
    name="kimi-k3",
    models=re.compile(r"(?:^|/)kimi-k3(?![\w.])", re.IGNORECASE),
    thinking_switch="thinking",
    make_format=lazy(f"{_PACKAGE}.format", "make_format"),
    source_files=lazy(f"{_PACKAGE}.format", "source_files"),
    bundled_tokenizers={"mini-k3": MINI_K3_TOKENIZER_DIR},
    tokenizer_env="KIMI_K3_TOKENIZER_DIR",
    # Reconstruction reads the probe's `counts_stop_token`; the probe also refuses a tool-call
    # dataset whose calls come back unrecoverable before anything is paid.
    reads_provider_traits=True,
    make_probe_rules=lazy(f"{_PACKAGE}.probe", "make_probe_rules"),
    make_server=lazy(f"{_PACKAGE}.served", "make_server"),
    # vLLM 0.32 with the kimi_k3 parsers (its own profile), OpenRouter in front of one.
    emulator_profiles=("vllm-k3", "openrouter"),
    profile_specs=(profile_spec("vllm-k3", "reasoning", role_content=True),),
    real_vllm_spec=lazy(f"{_PACKAGE}.realvllm", "real_vllm_spec"),
    make_corpus=lazy(f"{_PACKAGE}.corpus", "make_corpus"),
    tool_id_rule="an id breaks the format's id rule (K3's ids are the server's: none is"
                 " written by the model)",
)
