"""Stage `probe`: how the configured endpoint returns tool calls, stored beside the datasets.

A dataset that needs tool calls refuses to start when the stored profile of its endpoint says
they are unrecoverable, before any paid request.
"""

from __future__ import annotations

import json

from specregen.config import DatasetConfig, PipelineConfig
from specregen.pipeline.layout import DatasetRun
from specregen.probe.model import ProviderProfile, profile_from_dict
from specregen.probe.refusal import require_recoverable_tool_calls
from specregen.probe.run import probe_endpoint
from specregen.probe.scenarios import build_scenarios, glaive_probe_prompt
from specregen.store.fs import Store

STAGE = "_probe"


def profile_parts(endpoint_fp: str) -> tuple[str, ...]:
    return (STAGE, f"{endpoint_fp}.json")


def probe_config_endpoint(
    config: PipelineConfig, endpoint_fp: str, api_key, *, requests: int = 3
) -> ProviderProfile:
    """Probe the endpoint (blocking) and store its profile under the storage root."""
    from specregen.pipeline.reconstruction import kimi_format

    glaive = next((d for d in config.datasets if d.adapter == "glaive"), None)
    prompt = glaive_probe_prompt(glaive.source) if glaive else None
    profile = probe_endpoint(
        config.endpoint, api_key, build_scenarios(requests, prompt),
        fmt=kimi_format(config.tokenizer), tokenizer=config.tokenizer,
        glaive_source=glaive.source if glaive else None,
    )
    Store(config.storage).write_bytes(profile.to_json().encode(), *profile_parts(endpoint_fp))
    return profile


def needs_tool_calls(dataset: DatasetConfig) -> bool:
    if dataset.requires_tool_calls is not None:
        return dataset.requires_tool_calls
    return dataset.adapter in ("glaive", "messages", "sharegpt")


def check_endpoint_for(run: DatasetRun) -> str | None:
    """Raise ProbeRefusal when the stored profile says this dataset's calls are unrecoverable;
    returns where the profile is, or None when the endpoint was never probed."""
    parts = profile_parts(run.endpoint_fp)
    if not needs_tool_calls(run.dataset) or not run.store.exists(*parts):
        return None
    where = run.store.url_of(*parts)
    profile = profile_from_dict(json.loads(run.store.read_bytes(*parts)), where=where)
    require_recoverable_tool_calls(profile, run.dataset.tool_mode, probe_file=where)
    return where
