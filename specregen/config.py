"""The pipeline configuration: one YAML file, validated before anything is requested.

    storage: s3://bucket/specregen          # or a local folder
    tokenizer: org/model                    # a hub id, or a folder, or `mini`
    endpoint: {base_url: ..., model: ..., api_key_env: OPENROUTER_API_KEY, ...}
    api_key_secret: openrouter-api-key      # optional: a Prefect Secret block instead of the env
    datasets:
      - {name: B1_glaive, adapter: glaive, source: hf://..., tool_mode: tools,
         gate: {max_quarantine_share: 0.02}}

Errors name the field, a dataset's by the dataset's name (`datasets[B1_glaive].adapter: ...`),
suggest the nearest field for an unknown one, and never echo values, in case a key was pasted
into the wrong place.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from specregen.client.config import ConfigError as _EndpointConfigError
from specregen.client.config import EndpointConfig
from specregen.client.limits import LimitConfig
from specregen.fielderrors import describe_errors
from specregen.gate.config import GateConfig
from specregen.sources import ADAPTERS, BUNDLED_SAMPLES

if TYPE_CHECKING:
    from specregen.reconstruct import ReconstructConfig

_STRICT = ConfigDict(extra="forbid", hide_input_in_errors=True, frozen=True)
BUNDLED_PREFIX = "bundled:"
# Adapters that can give whole conversations (`turns: all`).
CONVERSATION_ADAPTERS = ("glaive", "messages", "sharegpt")


# One ConfigError for every config (the endpoint's and the pipeline's): the client's.
ConfigError = _EndpointConfigError


class DatasetConfig(BaseModel):
    model_config = _STRICT

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,63}$")
    adapter: str
    # A path or URL (local, s3://, hf://), or `bundled:NAME` for a sample shipped with specregen.
    source: str
    limit: int | None = Field(default=None, ge=1)
    tool_mode: Literal["tools", "system_prompt"] = "tools"
    # `all`: whole conversations, every assistant turn regenerated on the model's own history
    # (specregen/conversation); the adapters glaive, messages and sharegpt can give them.
    turns: Literal["first", "all"] = "first"
    # Adapter options, e.g. {instruction_prefix: true} for magicoder.
    options: dict[str, Any] = Field(default_factory=dict)
    # Gate overrides for this dataset; the gate itself cannot be turned off.
    gate: dict[str, Any] = Field(default_factory=dict)
    # Refuse to start when the endpoint's probe says tool calls are unrecoverable. By default on
    # for datasets that declare tools.
    requires_tool_calls: bool | None = None

    @field_validator("adapter")
    @classmethod
    def _known_adapter(cls, value: str) -> str:
        if value not in ADAPTERS:
            raise ValueError(f"unknown adapter; known: {', '.join(sorted(ADAPTERS))}")
        return value

    @field_validator("gate")
    @classmethod
    def _valid_gate(cls, value: dict[str, Any]) -> dict[str, Any]:
        GateConfig().override(value)  # raises with the setting's name
        return value

    @field_validator("source")
    @classmethod
    def _known_bundle(cls, value: str) -> str:
        if value.startswith(BUNDLED_PREFIX) and value[len(BUNDLED_PREFIX) :] not in BUNDLED_SAMPLES:
            raise ValueError(f"no bundled sample; known: {', '.join(sorted(BUNDLED_SAMPLES))}")
        return value

    @model_validator(mode="after")
    def _turns_supported(self) -> DatasetConfig:
        if self.turns == "all" and self.adapter not in CONVERSATION_ADAPTERS:
            raise ValueError(f"turns: all needs an adapter with whole conversations "
                             f"({', '.join(CONVERSATION_ADAPTERS)}), not {self.adapter!r}")
        return self

    @property
    def adapter_options(self) -> dict[str, Any]:
        options = dict(self.options)
        if self.adapter == "glaive":
            options.setdefault("tool_mode", self.tool_mode)
        # Only when "all": the prompts fingerprint of a first-turn dataset stays what it was.
        if self.turns == "all":
            options["turns"] = "all"
        return options

    def gate_config(self) -> GateConfig:
        return GateConfig().override(self.gate)

    def reconstruct_config(self) -> ReconstructConfig:
        # The usage tolerances live in the gate settings alone; reconstruction takes them there.
        return self.gate_config().reconstruct_config()

    def resolved_source(self, base: Path | None = None) -> str:
        """The source as a path or URL; relative paths are relative to the config file."""
        if self.source.startswith(BUNDLED_PREFIX):
            return str(BUNDLED_SAMPLES[self.source[len(BUNDLED_PREFIX) :]][1])
        if "://" in self.source or base is None or Path(self.source).is_absolute():
            return self.source
        return str((base / self.source).resolve())


class PipelineConfig(BaseModel):
    model_config = _STRICT

    storage: str
    tokenizer: str = "mini"
    # The model's chat format (a name in specregen/models/registry.py); unset, the endpoint's
    # model id names it, and a model no format claims gets the registry's DEFAULT_FORMAT.
    format: str | None = None
    endpoint: EndpointConfig
    # A Prefect Secret block holding the API key; when unset, the key comes from the
    # environment variable named by endpoint.api_key_env.
    api_key_secret: str | None = None
    # Samples per inference task (PREFECT.md: 500-2,000, tens of seconds of work each).
    chunk_size: int = Field(default=1000, ge=1)
    # Inference tasks of one dataset running at once; together they fill endpoint.concurrency.
    chunks_in_flight: int = Field(default=4, ge=1)
    # Processes for reconstruction (CPU work).
    reconstruct_workers: int = Field(default=2, ge=1)
    # Workers (machines) one dataset's reconstruction is spread over when it runs as a
    # deployment run: chunk groups become deployment runs of reconstruct-chunks/spread
    # (flows/chunks.py). 1: all on the dataset's own worker.
    reconstruct_spread: int = Field(default=1, ge=1, le=1000)
    # Seconds a chunk group's run may still take to start on another worker once this worker
    # has done its own group, before it is taken back and done here (0: at once; a pool
    # whose workers poll slowly, or a test, waits for them).
    reconstruct_spread_wait_s: float = Field(default=0.0, ge=0, le=3600)
    export_specforge: bool = False
    # train.jsonl: the exact ids and masks as rows speculators and SpecForge read unchanged.
    export_train: bool = True
    # messages.jsonl: text conversations a trainer tokenizes again (lossy); export_specforge
    # is its former name.
    export_messages: bool = False
    # The endpoint probe before paid requests (pipeline/probing.py): `auto` probes when a
    # dataset of the config needs tool calls and no profile is stored for this endpoint; `required`
    # probes for every dataset without one; `off` never probes, refuses or uses a profile.
    probe: Literal["auto", "required", "off"] = "auto"
    # The provider's limits for this key, shared by every worker and dataset through the
    # Prefect server (tasks/limits.py): requests_per_minute, in_flight, batch.
    shared_limit: LimitConfig | None = None
    datasets: list[DatasetConfig] = Field(min_length=1)

    @field_validator("api_key_secret")
    @classmethod
    def _secret_name(cls, value: str | None) -> str | None:
        from specregen.client.secrets import looks_like_secret

        # A key pasted here would be logged as a block name: refuse it, never echo it.
        if value is not None and looks_like_secret(value):
            raise ValueError(
                "must be the NAME of a Prefect Secret block, not a key: the value looks like a"
                " credential (not shown); store the key in a Secret block and give its name"
            )
        return value

    @field_validator("format")
    @classmethod
    def _known_format(cls, value: str | None) -> str | None:
        from specregen.models.registry import canonical_name

        return None if value is None else canonical_name(value)

    @model_validator(mode="before")
    @classmethod
    def _format_to_endpoint(cls, raw: Any) -> Any:
        # The request bodies need the format too (its thinking switch): the endpoint carries it.
        if not isinstance(raw, dict) or raw.get("format") is None:
            return raw
        endpoint = raw.get("endpoint")
        if isinstance(endpoint, dict):
            given = endpoint.get("format")
            if given is not None and given != raw["format"]:
                raise ValueError(f"format {raw['format']!r} and endpoint.format {given!r} "
                                 "disagree; set one")
            raw = {**raw, "endpoint": {**endpoint, "format": raw["format"]}}
        return raw

    @property
    def format_name(self) -> str:
        """The chat format this config's answers are reconstructed with."""
        return self.endpoint.format_name

    @model_validator(mode="after")
    def _format_known(self) -> PipelineConfig:
        # Every dataset is reconstructed: a model no format claims must name its format here,
        # not fall back to another family's and publish wrong ids.
        from specregen.models.registry import resolve_format_name

        resolve_format_name(self.endpoint.format, self.endpoint.model)
        return self

    @model_validator(mode="after")
    def _conversations_realtime(self) -> PipelineConfig:
        # Each request of a conversation waits for the answer before it: no batch API.
        whole = [d.name for d in self.datasets if d.turns == "all"]
        if whole and self.endpoint.mode == "batch":
            raise ValueError(f"datasets {', '.join(whole)} have turns: all, which needs "
                             "endpoint.mode realtime (each request waits for the one before)")
        return self

    @model_validator(mode="after")
    def _unique_names(self) -> PipelineConfig:
        names = [d.name for d in self.datasets]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"dataset names must be unique; repeated: {', '.join(duplicates)}")
        return self

    def dataset(self, name: str) -> DatasetConfig:
        for dataset in self.datasets:
            if dataset.name == name:
                return dataset
        known = ", ".join(d.name for d in self.datasets)
        raise ConfigError(f"no dataset named {name!r} in the config; known: {known}")


def load_config(path: str | Path) -> PipelineConfig:
    """Read and validate a YAML config; relative dataset paths resolve against its folder."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config {path} is not valid YAML: {exc}") from None
    config = parse_config(raw, source=str(path))
    base = path.resolve().parent
    datasets = [
        d.model_copy(update={"source": d.resolved_source(base)}) for d in config.datasets
    ]
    return config.model_copy(update={"datasets": datasets})


def parse_config(raw: Any, source: str = "config") -> PipelineConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the top level must be a mapping")
    try:
        return PipelineConfig.model_validate(raw)
    except ValidationError as exc:
        # Datasets by their name, and the nearest field to a typo (specregen/fielderrors.py).
        problems = "; ".join(describe_errors(exc, PipelineConfig, raw))
        raise ConfigError(f"{source}: {problems}") from None
