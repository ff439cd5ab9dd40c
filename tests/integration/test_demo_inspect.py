"""`specregen inspect` on what the demo produces (issue 13's "done when").

The demo's provider (flows/demo.py `demo_emulator_config`) returns token ids, and its tool
parser trims the whitespace K2.5 now and then writes around a call's arguments, as the
upstream parsers do. The bundled B1_glaive rows go through the library pipeline with the
demo's config; inspect then shows a flagged sample's first difference from the server's ids
side by side, and a tool-call sample with its markers named.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from flows.demo import DEMO_CONFIG, demo_emulator_config
from specregen.cli import app
from specregen.config import load_config
from specregen.emulator.server import serve_in_thread
from specregen.pipeline.layout import DatasetRun
from specregen.pipeline.run import run_dataset
from tests.support import get_tokenizer

pytestmark = pytest.mark.integration

WIDE = {"COLUMNS": "200"}


@pytest.fixture(scope="module")
def demo_b1(tmp_path_factory) -> list[Path]:
    """The demo's B1_glaive, run as the demo runs it (same config, same emulator); its
    reconstruction shards."""
    base = tmp_path_factory.mktemp("demo")
    with serve_in_thread(demo_emulator_config(), get_tokenizer("mini")) as emu:
        config = yaml.safe_load(DEMO_CONFIG.read_text())
        config["storage"] = str(base / "data")
        config["endpoint"]["base_url"] = emu.openrouter_url
        config["datasets"] = [d for d in config["datasets"] if d["name"] == "B1_glaive"]
        path = base / "demo.yaml"
        path.write_text(yaml.safe_dump(config))
        loaded = load_config(str(path))
        result = asyncio.run(run_dataset(DatasetRun(loaded, loaded.datasets[0]), None))
    # The flagged samples are quarantined; the rest pass the demo's gate.
    assert result.outcome == "published", result
    shards = sorted((base / "data" / "B1_glaive" / "reconstruct").glob("*/chunk-*.parquet"))
    assert shards
    return shards


def _rows(shards: list[Path]) -> list[tuple[Path, dict]]:
    return [(shard, row) for shard in shards for row in pq.read_table(
        shard, columns=["sample_id", "status", "flags", "reference_match", "tool_calls"]
    ).to_pylist()]


def test_inspect_shows_a_flagged_sample_next_to_the_servers_ids(demo_b1) -> None:
    flagged = [(shard, row) for shard, row in _rows(demo_b1)
               if "reference_text_diff" in row["flags"]]
    assert flagged, "the demo's output has no sample whose ids differ from the server's"
    shard, row = flagged[0]
    assert row["status"] == "flagged" and row["reference_match"] == "text_diff"
    # The reference ids come from the raw log beside the stage folder, as in out/demo.
    result = CliRunner().invoke(app, ["inspect", str(shard), "--flag", "reference_text_diff"],
                                env=WIDE)
    assert result.exit_code == 0, result.output
    out = result.output
    assert f"sample {row['sample_id']}" in out
    assert "first difference at completion token" in out
    for column in ("ours: id", "ours: text", "server: id", "server: text"):
        assert column in out, column
    # What differs: the server's ids keep the whitespace before the arguments that the
    # returned text lost.
    ours = _after(out, "ours from there")
    server = _after(out, "server from there")
    assert ours.startswith("'{"), ours
    assert re.match(r"'( |\\n|\\t)+\{", server), server
    assert server.lstrip("' \\nt") == ours.lstrip("'"), (ours, server)


def test_inspect_names_the_markers_of_a_tool_call_sample(demo_b1) -> None:
    calls = [(shard, row) for shard, row in _rows(demo_b1)
             if row["status"] == "ok" and row["tool_calls"]]
    assert calls, "the demo's output has no accepted tool-call sample"
    shard, row = calls[0]
    result = CliRunner().invoke(app, ["inspect", str(shard), "--sample", row["sample_id"]],
                                env=WIDE)
    assert result.exit_code == 0, result.output
    out = result.output
    for marker in ("<|tool_calls_section_begin|>", "<|tool_call_begin|>",
                   "<|tool_call_argument_begin|>", "<|tool_call_end|>",
                   "<|tool_calls_section_end|>"):
        assert marker in out, marker
    assert "tool call 0" in out and "tool calls in the ids" in out
    calls = json.loads(row["tool_calls"]) if isinstance(row["tool_calls"], str) else row[
        "tool_calls"]
    assert calls[0]["id"] in out, calls


def _after(out: str, label: str) -> str:
    """The repr printed after a label of inspect's side-by-side lines."""
    line = next(line for line in out.splitlines() if line.startswith(label))
    return line[len(label):].strip()
