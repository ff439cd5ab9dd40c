"""Qwen3's descriptor (`specregen.models.family.Family`), listed by the registry.

It imports none of the family's code: each part is imported when asked for. Not in the
reconstruct fingerprint (`chat_format.package_files` leaves every family's `family.py` out).
"""

from __future__ import annotations

import re
from pathlib import Path

from specregen.models.family import Family, lazy, profile_spec

# The bundled Qwen3-style tokenizer.json (scripts/train_mini_qwen3_tokenizer.py): `mini-qwen3`,
# kept in the family's package.
MINI_QWEN3_TOKENIZER_DIR = Path(__file__).resolve().parent / "assets" / "mini_tokenizer"

_PACKAGE = __name__.rpartition(".")[0]

FAMILY = Family(
    name="qwen3",
    models=re.compile(r"(?:^|/)qwen3(?![\w.]*-?vl)", re.IGNORECASE),
    thinking_switch="enable_thinking",
    make_format=lazy(f"{_PACKAGE}.format", "make_format"),
    source_files=lazy(f"{_PACKAGE}.format", "source_files"),
    bundled_tokenizers={"mini-qwen3": MINI_QWEN3_TOKENIZER_DIR},
    # Reconstruction reads provider traits: whether the provider counts `<|im_end|>` and
    # whether it strips the content beside calls (SGLang does, vLLM does not: docs/qwen3.md).
    reads_provider_traits=True,
    make_probe_rules=lazy(f"{_PACKAGE}.probe", "make_probe_rules"),
    make_server=lazy(f"{_PACKAGE}.served", "make_server"),
    # vLLM 0.32 with the qwen3 + hermes parsers (its own profile), OpenRouter in front of the
    # earlier vLLM, SGLang (qwen3 + qwen25): `served.Qwen3Server.for_profile`.
    emulator_profiles=("vllm-hermes", "openrouter", "sglang"),
    profile_specs=(profile_spec("vllm-hermes", "reasoning", role_content=True),),
    real_vllm_spec=lazy(f"{_PACKAGE}.realvllm", "real_vllm_spec"),
    make_corpus=lazy(f"{_PACKAGE}.corpus", "make_corpus"),
    tool_id_rule="an id breaks the format's id rule (Qwen3's ids are the server's: none is"
                 " written by the model)",
)
