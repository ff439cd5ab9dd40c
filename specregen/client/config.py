"""Settings of one inference endpoint: where, which model, how to ask, how hard to push.

The API key itself is never part of the config, only the NAME of the environment variable that
holds it (`api_key_env`), so a config can be logged, hashed and committed safely. Validation
errors name the field (`sampling.max_tokens: ...`) and never echo the input value, in case a key
was pasted into the wrong field.
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from specregen.client.secrets import looks_like_secret
from specregen.errors import UsageError
from specregen.wire.request import Dialect

Effort = Literal["xhigh", "high", "medium", "low", "minimal", "none"]
Quantization = Literal["int4", "int8", "fp4", "fp6", "fp8", "fp16", "bf16", "fp32", "unknown"]

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_STRICT = ConfigDict(extra="forbid", hide_input_in_errors=True, frozen=True)


class ConfigError(UsageError, ValueError):
    """An endpoint config that does not validate; the message lists each field and its problem."""


class ProviderRouting(BaseModel):
    """OpenRouter's `provider` object (sent only to the openrouter dialect)."""

    model_config = _STRICT

    order: list[str] | None = None
    only: list[str] | None = None
    ignore: list[str] | None = None
    allow_fallbacks: bool | None = None
    require_parameters: bool | None = None
    quantizations: list[Quantization] | None = None
    data_collection: Literal["allow", "deny"] | None = None
    enforce_distillable_text: bool | None = None
    zdr: bool | None = None
    sort: Literal["price", "throughput", "latency"] | dict[str, Any] | None = None

    def as_body(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class ReasoningConfig(BaseModel):
    """OpenRouter's `reasoning` object."""

    model_config = _STRICT

    enabled: bool | None = None
    effort: Effort | None = None
    exclude: bool | None = None
    max_tokens: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _effort_or_budget(self) -> ReasoningConfig:
        if self.effort is not None and self.max_tokens is not None:
            raise ValueError("set either effort or max_tokens, not both (OpenRouter rejects both)")
        return self

    def as_body(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class Sampling(BaseModel):
    model_config = _STRICT

    max_tokens: int | None = Field(default=None, gt=0)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = None


class Timeouts(BaseModel):
    """Seconds. Streams are judged by the gap between chunks, not by their total length."""

    model_config = _STRICT

    connect: float = Field(default=15.0, gt=0)
    # Streaming: the longest silence allowed between two received lines (keep-alive comments
    # count: OpenRouter sends them while the upstream is still queueing or prefilling). Also
    # bounds the wait for the response headers.
    idle: float = Field(default=120.0, gt=0)
    # Non-streaming: the longest wait for the whole response after the connection is made.
    read: float = Field(default=900.0, gt=0)
    # Optional hard cap on one attempt, stream or not (None: no cap beyond the above).
    attempt: float | None = Field(default=None, gt=0)


class RetryPolicy(BaseModel):
    model_config = _STRICT

    # Attempts per sample, the first one included.
    max_attempts: int = Field(default=6, ge=1)
    base_delay: float = Field(default=1.0, ge=0)
    max_delay: float = Field(default=60.0, ge=0)
    # Full jitter: the delay is uniform in [0, min(max_delay, base_delay * 2**(n-1))].
    jitter: bool = True
    # A server's Retry-After is honoured up to this many seconds.
    max_retry_after: float = Field(default=300.0, ge=0)


class Prices(BaseModel):
    """USD per million tokens of this endpoint's model, realtime; batch = realtime x
    (1 - batch_discount). Used for responses that carry no `usage.cost`, for projections
    (`specregen estimate`) and for the savings the cost view reports."""

    model_config = _STRICT

    prompt_per_million: float = Field(ge=0)
    completion_per_million: float = Field(ge=0)
    # Prompt tokens served from the provider's prompt cache (`prompt_tokens_details.
    # cached_tokens`); None: billed like any prompt token.
    cached_prompt_per_million: float | None = Field(default=None, ge=0)
    # Share taken off every price in batch mode: OpenRouter 0.5, Moonshot 0.4 (60% price).
    batch_discount: float = Field(default=0.5, ge=0, le=1)

    def factor(self, mode: str) -> float:
        return 1.0 - self.batch_discount if mode == "batch" else 1.0


BatchApi = Literal["openrouter", "openai-files"]


class BatchSettings(BaseModel):
    """Batch mode (client/batch.py): which API shape, how big a batch, how often to poll."""

    model_config = _STRICT

    # `openrouter`: inline `requests` in POST /batches; `openai-files`: upload a JSONL to
    # /files, then POST /batches with input_file_id (Moonshot, vLLM, OpenAI-compatible).
    api: BatchApi = "openrouter"
    # OpenRouter's limits per batch: 5,000 requests and 200 MB.
    max_requests: int = Field(default=5_000, ge=1, le=50_000)
    max_bytes: int = Field(default=200 * 1024 * 1024, ge=1_000)
    poll_seconds: float = Field(default=60.0, gt=0)
    completion_window: str = "24h"
    # The `endpoint` each request targets, as the batch API names it.
    endpoint: str = "/v1/chat/completions"


class EndpointConfig(BaseModel):
    model_config = _STRICT

    base_url: str
    model: str = Field(min_length=1)
    dialect: Dialect = "openrouter"
    # The NAME of the environment variable that holds the key, never the key.
    api_key_env: str = "OPENROUTER_API_KEY"

    provider: ProviderRouting | None = None
    reasoning: ReasoningConfig | None = None
    # The model's thinking switch, mapped per dialect (reasoning.enabled, the chat format's
    # chat_template_kwargs key, Moonshot `thinking`); None sends nothing and leaves the server
    # default (thinking on).
    thinking: bool | None = None
    # The model's chat format (specregen/models/registry.py); None: the one `model` names (a
    # model no format claims is an error wherever a format is needed). The pipeline config's
    # top-level `format:` is copied here.
    format: str | None = None
    sampling: Sampling = Sampling()
    stream: bool = True
    # Ask for `prompt_token_ids` and per-choice `token_ids` (the reference ids). vLLM and the
    # emulator honour it whatever the dialect; hosted APIs do not return ids (and OpenRouter
    # with `require_parameters` may refuse to route a request that carries it).
    return_token_ids: bool = False
    # vLLM and SGLang: ask for the model's text as it wrote it (`spaces_between_special_tokens:
    # false`; by default their detokenizer puts a space around every added token of a slow
    # tokenizer such as Kimi's). False sends the server's defaults (what `specregen probe
    # --server-defaults` examines). Outside the request fingerprint: it changes how the ids
    # come back as text, not what the model is asked.
    text_as_written: bool = True
    # Ask for `logprobs` (and, from vLLM, `return_tokens_as_token_ids`): the tokens the model
    # sampled, which prove the rebuilt ids (evidence `logprobs`, docs/evidence.md). None: when
    # the endpoint probe found that they come back covering every token (the pipeline).
    logprobs: bool | None = None

    http_referer: str | None = None
    app_title: str | None = None

    timeouts: Timeouts = Timeouts()
    retry: RetryPolicy = RetryPolicy()
    prices: Prices | None = None

    # `realtime`: one request per prompt (engine.py); `batch`: the provider's batch API at its
    # batch price (batch.py). Requests and fingerprints are the same, so one raw log holds both.
    mode: Literal["realtime", "batch"] = "realtime"
    batch: BatchSettings = BatchSettings()
    # What happens to batch requests that failed or expired: `resubmit` them in a later batch,
    # or send them `realtime` (full price, within the budget).
    batch_fallback: Literal["resubmit", "realtime"] = "resubmit"

    # Requests in flight at once; spread over ceil(concurrency / connections_per_shard)
    # httpx clients because one client's pool bookkeeping is quadratic in its connections.
    # Client CPU per request grows with connections per client (measured on 2 vCPUs: ~3 ms at
    # 25, ~11 ms at 100), so shards are small.
    concurrency: int = Field(default=64, ge=1, le=100_000)
    connections_per_shard: int = Field(default=25, ge=1, le=1_000)
    requests_per_minute: float | None = Field(default=None, gt=0)
    # On object storage the raw log puts one part per commit: answers not yet put are paid again
    # after a crash. A part is put once `concurrency` answers wait, or when the oldest has
    # waited this long; None: the time the window takes at the configured rate (10 s without
    # one), so a crash loses at most about one window besides the one in flight
    # (store/rawlog.py `commit_rolls`). Local files commit (fsync) at once.
    log_commit_seconds: float | None = Field(default=None, gt=0, le=3600)
    budget_usd: float | None = Field(default=None, ge=0)
    # The model's context length in tokens (prompt + max_tokens must fit); None: the
    # tokenizer folder's model_max_length when `infer` has a tokenizer.
    max_context_tokens: int | None = Field(default=None, gt=0)

    @field_validator("format")
    @classmethod
    def _known_format(cls, value: str | None) -> str | None:
        from specregen.models.registry import canonical_name

        return None if value is None else canonical_name(value)

    @property
    def format_name(self) -> str:
        """The chat format: `format`, else the one `model` names; UnknownFormatError (a usage
        error saying to set one) for a model no format claims."""
        from specregen.models.registry import resolve_format_name

        return resolve_format_name(self.format, self.model)

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        value = value.strip()
        if not value.startswith(("http://", "https://")) or len(value) <= len("https://"):
            raise ValueError("must be an http:// or https:// URL")
        return value.rstrip("/")

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, value: str) -> str:
        # A key pasted here would be stored with the config: refuse anything that is not a
        # plausible variable name (keys contain '-' and are long), and names that look like
        # keys themselves (hf_..., AKIA..., long random runs). The value is never echoed.
        if looks_like_secret(value):
            raise ValueError(
                "must be the NAME of an environment variable, not a key: the value looks like a"
                " credential (not shown); put the key in a variable and give its name"
            )
        if not _ENV_NAME.fullmatch(value):
            raise ValueError(
                "must be the NAME of an environment variable (letters, digits, '_', at most 64"
                " characters), not a key"
            )
        return value

    @model_validator(mode="after")
    def _dialect_fields(self) -> EndpointConfig:
        if self.thinking is not None and self.dialect in ("vllm", "sglang"):
            # The switch is a chat_template_kwargs key of the format's template, so the format
            # must be known (UnknownFormatError is a ValueError: reported as a config error).
            from specregen.models.registry import resolve_format_name

            resolve_format_name(self.format, self.model)
        if self.dialect != "openrouter":
            for name in ("provider", "reasoning"):
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"{name}: only the openrouter dialect has it (dialect is {self.dialect});"
                        " use 'thinking' to switch reasoning"
                    )
        reasoning = self.reasoning
        if reasoning is not None and self.thinking is not None:
            off = reasoning.enabled is False or reasoning.effort == "none"
            on = reasoning.enabled is True or (reasoning.effort not in (None, "none"))
            if (self.thinking and off) or (not self.thinking and on):
                raise ValueError("thinking: contradicts the reasoning settings")
        if self.mode == "batch" and self.batch.api == "openrouter":
            only = self.provider.only if self.provider else None
            if not only or len(only) != 1:
                raise ValueError(
                    "provider.only: batch mode on OpenRouter runs one provider per batch; pin"
                    " exactly one (e.g. provider: {only: [moonshotai]})"
                )
        if self.budget_usd is not None and self.prices is None and self.dialect != "openrouter":
            raise ValueError(
                f"budget_usd: needs prices (the {self.dialect} API reports no usage.cost)"
            )
        return self

    @property
    def chat_url(self) -> str:
        return f"{self.base_url}/chat/completions"

    @property
    def shards(self) -> int:
        return math.ceil(self.concurrency / self.connections_per_shard)

    @classmethod
    def load(cls, data: dict[str, Any]) -> EndpointConfig:
        """Validate a plain mapping; a failure raises ConfigError naming every bad field."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise ConfigError(format_errors(exc, data)) from None


def format_errors(exc: ValidationError, data: Any = None) -> str:
    from specregen.fielderrors import describe_errors  # the nearest field to a typo

    return "invalid endpoint config: " + "; ".join(describe_errors(exc, EndpointConfig, data))
