"""The provider probe as a flow: how the configured endpoint returns tool calls, before paying."""

from __future__ import annotations

from prefect import flow, get_run_logger

from specregen.config import load_config
from tasks.artifacts import amarkdown_artifact
from tasks.probe import probe_task


@flow(name="probe")
async def probe_flow(config_path: str) -> dict:
    """Probe the config's endpoint and store the profile; dataset flows check it before paying."""
    config = load_config(config_path)
    # Any dataset names the endpoint; the profile is stored per endpoint fingerprint.
    profile = await probe_task(config_path, config.datasets[0].name)
    recoverable = profile.get("tool_calls_recoverable_by_mode", {})
    lines = ["# Provider probe", "", f"{profile['model']} at {profile['base_url']}", "",
             "| tool mode | tool calls recoverable |", "|---|---|"]
    lines += [f"| {mode} | {'yes' if ok else 'NO'} |" for mode, ok in recoverable.items()]
    lines += ["", f"{profile['probe_requests']} requests, ${profile['probe_cost_usd']:.6f}"]
    lines += ["", *[f"- {note}" for note in profile.get("notes", [])]]
    await amarkdown_artifact("\n".join(lines) + "\n", key="provider-probe",
                             description="How the endpoint returns tool calls")
    get_run_logger().info("probe: tool calls recoverable by mode: %s", recoverable)
    return profile
