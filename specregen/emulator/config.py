"""What an emulator instance is: which provider it imitates, how its model writes, how it fails.

Every rate is a probability per attempt (faults) or per opportunity (text knobs); every default
gives a well-behaved, fast, recoverable provider, so a test turns on exactly what it checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from specregen.models.registry import DEFAULT_MODEL, profile_specs

# An emulator profile's name: one of the built-in profiles (`PROFILES`) or one a family declares
# (its descriptor's `profile_specs`, `models/<family>/family.py`).
Profile = str
# The built-in profiles, the default family's (K2.5: emulator/generate.py + profiles.py); the
# other families are served with some of them (`openrouter`, `sglang`) and with their own.
PROFILES: tuple[Profile, ...] = ("openrouter", "vllm", "vllm-legacy", "vllm-k25", "sglang",
                                 "sglang-noforce", "moonshot", "raw", "stripped")


def all_profiles() -> tuple[Profile, ...]:
    """Every profile: the built-in ones, then those the registered families declare."""
    declared = (spec.name for spec in profile_specs())
    return tuple(dict.fromkeys((*PROFILES, *declared)))

# The profiles that run our re-statement of the vLLM / SGLang parser and prompt code
# (models/kimi_k25/vllm032.py, servers.py, serverside.py; docs/vllm-0.32.md,
# docs/upstream-parsers.md). `vllm` is vLLM 0.32; `vllm-legacy` and `vllm-k25` are vLLM's Kimi
# parsers before its parser engine.
UPSTREAM_PROFILES: tuple[Profile, ...] = ("vllm", "vllm-legacy", "vllm-k25", "sglang",
                                          "sglang-noforce")
# Profiles whose output reconstruction can turn back into the exact ids (with the breaking knobs
# at 0, thinking on, non-streaming); `stripped` deletes the tool markers on purpose, and the
# upstream profiles lose text on some paths (docs/upstream-parsers.md), e.g. `sglang-noforce`
# returns K2.5's reasoning unsplit and `vllm-k25` reads instant answers as reasoning.
RECOVERABLE_PROFILES: tuple[Profile, ...] = ("openrouter", "vllm", "vllm-legacy", "sglang",
                                             "moonshot", "raw")

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
    "section_in_think_rate",
    "text_after_section_rate",
    "tool_id_whitespace_rate",
    "section_whitespace_rate",
    "bare_tool_id_rate",
    "batch_failure_rate",
    "batch_expire_rate",
    "batch_price_share",
    "divergence_rate",
)


@dataclass(frozen=True)
class EmulatorConfig:
    """One emulated model deployment behind one provider."""

    profile: Profile = "openrouter"
    seed: int = 0
    model: str = DEFAULT_MODEL
    # The model's chat format (specregen/models/registry.py); None: the one `model` names. Its
    # served side (`models/<format>/served.py`) says which profiles it is served with: K2.5
    # writes its ids itself (`PROFILES`), Qwen3 gets its text from emulator/served.py.
    format: str | None = None
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
    # The format's marker strings written as plain text in the answer (its served side names
    # them; K2.5's).
    literal_marker_rate: float = 0.02
    leading_whitespace_rate: float = 0.1
    # Text tokens replaced by two tokens spelling the same bytes, as sampling produces.
    noncanonical_rate: float = 0.0
    # What the model does now and then that some providers cannot pass through losslessly.
    tool_args_whitespace_rate: float = 0.0
    no_content_before_calls_rate: float = 0.0
    wrong_tool_index_rate: float = 0.0
    # Shapes K2.5 writes that the upstream parsers treat unevenly (docs/upstream-parsers.md):
    # a tool section opened before the end of the reasoning (reasoning never closed), text
    # after the section's end marker, whitespace around a call id, newlines between the
    # section's markers, and an id without the `functions.` prefix.
    section_in_think_rate: float = 0.0
    text_after_section_rate: float = 0.0
    tool_id_whitespace_rate: float = 0.0
    section_whitespace_rate: float = 0.0
    bare_tool_id_rate: float = 0.0

    # Billing and access.
    price_prompt: float = 6e-7  # credits per prompt token
    price_completion: float = 2.5e-6  # credits per completion token
    require_key: str | None = field(default=None, repr=False)
    credits_exhausted: bool = False

    # Batch APIs (emulator/batch.py): seconds until a batch finishes, the share of its requests
    # that fail (500) or are left unprocessed when it expires, and the batch price as a share
    # of the realtime price (OpenRouter: 0.5, Moonshot: 0.6). Not a discount: the client's
    # `prices.batch_discount` is the cut, 1 - this share (Moonshot 0.4).
    batch_delay: float = 0.0
    batch_failure_rate: float = 0.0
    batch_expire_rate: float = 0.0
    batch_price_share: float = 0.5
    # Seconds between creating a batch and answering its POST (a client killed meanwhile has
    # a batch it never heard of: the crash case of batch submission).
    batch_submit_delay: float = 0.0

    # Generated completions kept per request (an LRU), so retries and repeats cost nothing.
    max_cached: int = 4096

    # Conversation mode (emulator/conversations.py): a JSONL of whole dataset conversations
    # (the prompt lines `specregen infer` reads). A request continuing one of them (recognised
    # by its first user message) is answered with the dataset's own next step, or, with
    # probability `divergence_rate` (seeded by conversation, position and `seed`), otherwise.
    conversations: str | None = None
    divergence_rate: float = 0.2

    def __post_init__(self) -> None:
        profiles = all_profiles()
        if self.profile not in profiles:
            raise ValueError(f"profile {self.profile!r} is not one of {', '.join(profiles)}")
        if self.latency not in ("fixed", "lognormal"):
            raise ValueError(f"latency {self.latency!r} is neither 'fixed' nor 'lognormal'")
        for name in _RATE_FIELDS:
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} is {value}; a rate must be between 0 and 1")
        for name in ("latency_mean", "latency_sigma", "latency_scale", "stall_seconds",
                     "length_sigma", "price_prompt", "price_completion", "batch_delay",
                     "batch_submit_delay"):
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
