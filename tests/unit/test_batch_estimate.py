"""`specregen estimate` (issue 11): exact prompt counts, a paid pilot the real run reuses."""

from __future__ import annotations

import asyncio

import yaml
from typer.testing import CliRunner

from specregen.cli import app
from specregen.config import load_config
from specregen.emulator.config import EmulatorConfig
from specregen.emulator.server import serve_in_thread
from specregen.models.tokenizer import load_tokenizer
from specregen.pipeline.estimate import estimate_config
from specregen.pipeline.inference import infer_chunk
from specregen.pipeline.layout import DatasetRun
from specregen.store.rawlog import RawLog
from tests.support import REPO


def write_config(tmp_path, emu) -> str:
    config = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())
    config["storage"] = str(tmp_path / "store")
    config["chunk_size"] = 8
    endpoint = config["endpoint"]
    endpoint.update(base_url=emu.url, dialect="vllm", stream=False)
    endpoint.pop("provider", None)
    endpoint["prices"] = {"prompt_per_million": 0.6, "completion_per_million": 2.5,
                          "batch_discount": 0.4}
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_estimate_counts_exactly_and_the_run_reuses_the_pilot(tmp_path):
    # The vllm profile renders prompts with the server-side template code (transformers'
    # jinja over the K2.5 template), not with our renderer: its usage.prompt_tokens is an
    # independent count to check ours against.
    with serve_in_thread(EmulatorConfig(profile="vllm", seed=2), load_tokenizer("mini")) as emu:
        path = write_config(tmp_path, emu)
        [est] = asyncio.run(estimate_config(path, 12, ["B3_magicoder"]))
        pilot_requests = emu.stats()["chat_requests"]
        assert est.pilot == 12 == pilot_requests
        config = load_config(path)
        run = DatasetRun(config, config.dataset("B3_magicoder"))
        chunks = -(-est.prompts // 8)
        served_prompt_tokens = 0
        answered = 0
        for chunk in range(chunks):
            for record in RawLog(run.rawlog_url(chunk)).iter_records():
                served_prompt_tokens += record["usage"]["prompt_tokens"]
                answered += 1
        assert answered == 12
        # The real run: every chunk; the pilot's 12 are not asked again, the rest are.
        for chunk in range(chunks):
            asyncio.run(infer_chunk(run, chunk, api_key=None))
        assert emu.stats()["chat_requests"] == pilot_requests + est.prompts - 12
        total = 0
        for chunk in range(chunks):
            for record in RawLog(run.rawlog_url(chunk)).iter_records():
                total += record["usage"]["prompt_tokens"]
        assert est.prompt_tokens == total  # exact, against the server's own count
        assert est.completion_p10 <= est.completion_p50 <= est.completion_p90
        assert est.batch_usd == round(est.realtime_usd * 0.6, 4) or abs(
            est.batch_usd - est.realtime_usd * 0.6) < 1e-3
        assert served_prompt_tokens > 0


def test_estimate_command_prints_both_modes(tmp_path):
    with serve_in_thread(EmulatorConfig(profile="vllm", seed=2), load_tokenizer("mini")) as emu:
        path = write_config(tmp_path, emu)
        result = CliRunner().invoke(app, ["estimate", "--config", path, "--pilot", "3",
                                          "--dataset", "B2_opencodeinstruct"],
                                    env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "realtime" in result.output and "batch" in result.output
    assert "B2_opencodeinstruct" in result.output and "pilot spent" in result.output
