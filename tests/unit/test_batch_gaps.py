"""Batch mode around the client (issue 11): the emulator CLI's batch knobs, the pipeline summary's
cost in batch mode, and the scheduled poller (deployments/specs.py)."""

from __future__ import annotations

from types import SimpleNamespace

from specregen.store.manifest import StageManifest
from tests.support import REPO


def test_emulator_cli_sets_the_batch_knobs(monkeypatch):
    from typer.testing import CliRunner

    from specregen.cli import app
    from specregen.emulator import server

    seen = {}

    def fake_serve(config, tok, host, port, on_listening=None):
        seen["config"] = config
        on_listening(host, port)

    monkeypatch.setattr(server, "serve_forever", fake_serve)
    result = CliRunner().invoke(app, [
        "emulator", "--port", "8124", "--batch-delay", "30", "--batch-failure-rate", "0.1",
        "--batch-expire-rate", "0.05", "--batch-price-share", "0.6"])
    assert result.exit_code == 0, result.output
    config = seen["config"]
    assert (config.batch_delay, config.batch_failure_rate, config.batch_expire_rate,
            config.batch_price_share) == (30.0, 0.1, 0.05, 0.6)
    # Defaults unchanged when the flags are absent.
    CliRunner().invoke(app, ["emulator", "--port", "8125"])
    config = seen["config"]
    assert (config.batch_delay, config.batch_failure_rate, config.batch_expire_rate,
            config.batch_price_share) == (0.0, 0.0, 0.0, 0.5)
    bad = CliRunner().invoke(app, ["emulator", "--batch-failure-rate", "1.5"])
    assert bad.exit_code == 2


def _summary(inferred, probe=None):
    from specregen.pipeline.summary import summarize

    run = SimpleNamespace(name="B1", store=SimpleNamespace(url_of=lambda *parts: "/".join(parts)))
    prompts = StageManifest("B1", "prompts", "fp", counts={"prompts": 30})
    return summarize(run, prompts, inferred, None, None, 1.0, probe=probe)


def test_pipeline_summary_counts_every_batch_pass_and_shows_savings():
    # Two chunks in batch mode: cost_usd is what the LAST pass paid (often 0: it only read
    # results); spent_total_usd is the chunk's whole raw log.
    chunks = [
        {"cost_usd": 0.0, "spent_total_usd": 1.25, "projected_total_usd": 1.25,
         "realtime_equivalent_total_usd": 2.5, "savings_total_usd": 1.25},
        {"cost_usd": 0.5, "spent_total_usd": 2.0, "projected_total_usd": 3.0,
         "realtime_equivalent_total_usd": 4.0, "savings_total_usd": 2.0},
    ]
    summary = _summary(chunks)
    assert summary["cost_usd"] == 3.25
    assert summary["projected_total_usd"] == 4.25
    assert summary["realtime_equivalent_usd"] == 6.5
    assert summary["savings_usd"] == 3.25
    # The endpoint probe is paid realtime on top of both spent and projected.
    with_probe = _summary(chunks, probe={"status": "probed", "requests": 3, "cost_usd": 0.1})
    assert with_probe["cost_usd"] == 3.35 and with_probe["projected_total_usd"] == 4.35

    from specregen.pipeline.summary import summary_markdown

    text = summary_markdown({**summary, "gate": {}, "reference_match": {}})
    assert "| cost (USD) | 3.25 |" in text
    assert "| projected total (USD) | 4.25 |" in text
    assert "| savings vs realtime (USD) | 3.25 |" in text


def test_pipeline_summary_in_realtime_mode_is_unchanged():
    summary = _summary([{"cost_usd": 0.5}, {"cost_usd": 0.25}])
    assert summary["cost_usd"] == 0.75
    assert "projected_total_usd" not in summary and "savings_usd" not in summary

    from specregen.pipeline.summary import summary_markdown

    assert "projected" not in summary_markdown({**summary, "gate": {}, "reference_match": {}})


def test_batch_poll_is_deployed_on_a_schedule_active_in_batch_mode():
    """`specregen deploy` (deployments/specs.py) deploys the poller every config; its schedule
    is active exactly when the deployed config is in batch mode."""
    from deployments.specs import deployment_specs
    from specregen.config import load_config

    config = load_config(REPO / "configs" / "pipeline.yaml")
    for mode, active in (("realtime", False), ("batch", True)):
        endpoint = config.endpoint.model_copy(update={"mode": mode})
        specs = {s.full_name: s for s in deployment_specs(
            config.model_copy(update={"endpoint": endpoint}), "configs/pipeline.yaml")}
        poll = specs["batch-poll/batch-poll"]
        assert poll.entrypoint == "flows/batch.py:batch_poll_flow"
        assert poll.parameters == {"config_path": "configs/pipeline.yaml"}
        assert poll.interval_s and poll.interval_s > 0 and poll.cron is None
        assert poll.schedule_active is active
    # The entrypoint names a real flow.
    from flows.batch import batch_poll_flow

    assert batch_poll_flow.name == "batch-poll"
