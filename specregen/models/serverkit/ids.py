"""Tool-call ids as the servers write them, from random bits (the emulator draws the bits)."""

from __future__ import annotations

import hashlib

# vLLM's prefix (`chatcmpl-tool-`), before and since 0.32.
VLLM_PREFIX = "chatcmpl-tool-"


def vllm_call_id(bits: int) -> str:
    """vLLM 0.32: `chatcmpl-tool-` + the low 64 bits of a uuid4, 16 hex digits
    (`utils.random_uuid`)."""
    return f"{VLLM_PREFIX}{bits & ((1 << 64) - 1):016x}"


def vllm_legacy_call_id(bits: int) -> str:
    """vLLM before 0.32: `chatcmpl-tool-` + a uuid4's 32 hex digits."""
    return f"{VLLM_PREFIX}{bits:032x}"


def sglang_call_id(bits: int) -> str:
    """SGLang: `call_` + the first 24 hex digits of a uuid4."""
    return f"call_{bits:032x}"[:29]


def fixed_vllm_call_id(seed: str) -> str:
    """A vLLM 0.32 id whose bits come from `seed` rather than chance: the id a client sends
    back for an earlier call (the probe's `history` scenario), the same in every run so a
    repeated request is the same request."""
    return vllm_call_id(int.from_bytes(hashlib.sha256(seed.encode()).digest()[:8], "big"))
