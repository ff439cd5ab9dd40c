"""What an emulator instance is: which provider it imitates, how its model writes, how it fails.

Every rate is a probability per attempt (faults) or per opportunity (text knobs); every default
gives a well-behaved, fast, recoverable provider, so a test turns on exactly what it checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Profile = Literal["openrouter", "vllm", "sglang", "moonshot", "raw", "stripped"]
PROFILES: tuple[Profile, ...] = ("openrouter", "vllm", "sglang", "moonshot", "raw", "stripped")
# Profiles whose output reconstruction can turn back into the exact ids (with the breaking knobs
# at 0); `stripped` deletes the tool markers and is unrecoverable on purpose.
RECOVERABLE_PROFILES: tuple[Profile, ...] = ("openrouter", "vllm", "sglang", "moonshot", "raw")

LatencyKind = Literal["fixed", "lognormal"]

_RATE_FIELDS = (
    "rate_429",
    "rate_5xx",
    "rate_reset",
    "rate_truncated",
    "rate_error_200",
    "rate_stream_error",
    "rate_stall",
    "keepalive_rate",
    "tool_call_rate",
    "literal_marker_rate",
    "leading_whitespace_rate",
    "noncanonical_rate",
    "tool_args_whitespace_rate",
    "no_content_before_calls_rate",
    "wrong_tool_index_rate",
)


@dataclass(frozen=True)
class EmulatorConfig:
    """One emulated Kimi K2.5 deployment behind one provider."""

    profile: Profile = "openrouter"
    seed: int = 0
    model: str = "moonshotai/kimi-k2.5"
    # The upstream named in OpenRouter's `provider` field and first in the endpoints list.
    provider_name: str = "Moonshot AI"
    quantization: str = "int4"
    context_length: int = 262_144

    # Latency of a whole response (spread over the chunks of a stream), in seconds.
    latency: LatencyKind = "fixed"
    latency_mean: float = 0.0
    latency_sigma: float = 0.5
    latency_scale: float = 1.0

    # Faults, each a probability per attempt, drawn from an rng of (seed, attempt number).
    rate_429: float = 0.0
    retry_after_seconds: int = 1
    rate_5xx: float = 0.0
    rate_reset: float = 0.0
    rate_truncated: float = 0.0
    rate_error_200: float = 0.0  # non-streaming only
    rate_stream_error: float = 0.0  # streaming only
    rate_stall: float = 0.0
    stall_seconds: float = 5.0
    # `: OPENROUTER PROCESSING` comment lines, a probability per SSE event.
    keepalive_rate: float = 0.0

    # The model. Lengths are in tokens, drawn lognormally around the mean.
    reasoning_tokens_mean: int = 120
    content_tokens_mean: int = 50
    length_sigma: float = 0.5
    # A call even when the user text names no declared tool (as models sometimes do).
    tool_call_rate: float = 0.1
    # Literal marker strings (`<|im_end|>`, `<think>`, ...) written as text in the answer.
    literal_marker_rate: float = 0.02
    leading_whitespace_rate: float = 0.1
    # Text tokens replaced by two tokens spelling the same bytes, as sampling produces.
    noncanonical_rate: float = 0.0
    # What the model does now and then that some providers cannot pass through losslessly.
    tool_args_whitespace_rate: float = 0.0
    no_content_before_calls_rate: float = 0.0
    wrong_tool_index_rate: float = 0.0

    # Billing and access.
    price_prompt: float = 6e-7  # credits per prompt token
    price_completion: float = 2.5e-6  # credits per completion token
    require_key: str | None = field(default=None, repr=False)
    credits_exhausted: bool = False

    # Generated completions kept per request (an LRU), so retries and repeats cost nothing.
    max_cached: int = 4096

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise ValueError(f"profile {self.profile!r} is not one of {', '.join(PROFILES)}")
        if self.latency not in ("fixed", "lognormal"):
            raise ValueError(f"latency {self.latency!r} is neither 'fixed' nor 'lognormal'")
        for name in _RATE_FIELDS:
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} is {value}; a rate must be between 0 and 1")
        for name in ("latency_mean", "latency_sigma", "latency_scale", "stall_seconds",
                     "length_sigma", "price_prompt", "price_completion"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} is {getattr(self, name)}; it must not be negative")
        for name in ("reasoning_tokens_mean", "content_tokens_mean", "max_cached",
                     "context_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} is {getattr(self, name)}; it must be at least 1")
        if self.retry_after_seconds < 0:
            raise ValueError("retry_after_seconds must not be negative")
        if self.require_key is not None and not self.require_key:
            raise ValueError("require_key is empty; give a key or None")
