"""`specregen estimate` on a dataset of whole conversations (`turns: all`, issue 10): the pilot
is `--pilot` conversations in all (not per chunk), each run to its stop; the projection is per
conversation; prompt tokens are the first requests'. The oracle is the raw log and the
emulator's own counts (`usage`, requests served), not the estimate's arithmetic."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict

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
from specregen.records import Prompt
from specregen.sources import read_source
from specregen.store.rawlog import RawLog
from tests.support import REPO

PROMPT, COMPLETION = 0.6, 2.5  # USD per million tokens


def conversation_lines(path) -> str:
    """The bundled glaive rows as whole-conversation prompt lines (the emulator follows them)."""
    rows = [r for r in read_source("glaive", REPO / "specregen/assets/samples/B1_glaive.json",
                                   dataset="B1_glaive", turns="all") if isinstance(r, Prompt)]
    path.write_text("".join(json.dumps({"sample_id": r.sample_id, "messages": r.messages,
                                        "tools": r.tools, "turns": "all"}) + "\n"
                            for r in rows))
    return str(path)


def write_config(tmp_path, emu) -> str:
    config = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())
    config["storage"] = str(tmp_path / "store")
    config["chunk_size"] = 8
    endpoint = config["endpoint"]
    endpoint.update(base_url=emu.url, dialect="vllm", stream=False, return_token_ids=False)
    endpoint.pop("provider", None)
    endpoint["prices"] = {"prompt_per_million": PROMPT, "completion_per_million": COMPLETION,
                          "batch_discount": 0.5}
    config["datasets"] = [{"name": "B1_conv", "adapter": "glaive", "source": "bundled:B1_glaive",
                           "tool_mode": "tools", "turns": "all"}]
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def by_conversation(run, chunks) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = defaultdict(list)
    for chunk in range(chunks):
        for record in RawLog(run.rawlog_url(chunk)).iter_records():
            out[record["conversation"]["id"]].append(record)
    return out


def test_the_pilot_is_a_few_whole_conversations_and_the_projection_is_per_conversation(
        tmp_path):
    config = EmulatorConfig(profile="vllm", seed=3, divergence_rate=0.2,
                            conversations=conversation_lines(tmp_path / "conv.jsonl"))
    with serve_in_thread(config, load_tokenizer("mini")) as emu:
        path = write_config(tmp_path, emu)
        [est] = asyncio.run(estimate_config(path, 5, ["B1_conv"]))
        paid = emu.stats()["chat_requests"]
        config = load_config(path)
        run = DatasetRun(config, config.dataset("B1_conv"))
        chunks = -(-est.prompts // 8)
        assert (est.prompts, chunks, est.conversations) == (24, 3, True)
        # 5 conversations in all (3 chunks of 8: a per-chunk pilot would ask 5 in each),
        # every one run to its stop, nothing else asked.
        pilot = by_conversation(run, chunks)
        assert len(pilot) == 5 == est.pilot
        assert sum(len(records) for records in pilot.values()) == paid
        assert any(len(records) > 1 for records in pilot.values())  # tool loops, turns
        # Per conversation: completion tokens and price summed over its requests (the server's
        # usage), the projection 24 x their mean.
        completions = sorted(sum(r["usage"]["completion_tokens"] for r in records)
                             for records in pilot.values())
        prices = [sum(r["usage"]["prompt_tokens"] * PROMPT
                      + r["usage"]["completion_tokens"] * COMPLETION for r in records) / 1e6
                  for records in pilot.values()]
        assert est.completion_mean == round(sum(completions) / 5, 1)
        assert est.completion_p50 == completions[2]
        assert abs(est.realtime_usd - 24 * sum(prices) / 5) < 1e-4
        assert abs(est.batch_usd - est.realtime_usd * 0.5) < 1e-4
        # The real run reuses the pilot's answers and asks the rest; prompt tokens were the
        # first requests' as the server counts them.
        for chunk in range(chunks):
            asyncio.run(infer_chunk(run, chunk, api_key=None))
        every = by_conversation(run, chunks)
        assert len(every) == 24
        assert emu.stats()["chat_requests"] == sum(len(r) for r in every.values())
        assert est.prompt_tokens == sum(r["usage"]["prompt_tokens"] for records in every.values()
                                        for r in records if r["sample_id"].endswith("/t0/s0"))


def test_the_estimate_table_says_the_pilot_counts_conversations(tmp_path):
    with serve_in_thread(EmulatorConfig(profile="vllm", seed=3), load_tokenizer("mini")) as emu:
        path = write_config(tmp_path, emu)
        result = CliRunner().invoke(app, ["estimate", "--config", path, "--pilot", "2"],
                                    env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "2 conv." in result.output
    assert "B1_conv: whole conversations -- prompt tokens are the first requests'" in (
        " ".join(result.output.split()))
