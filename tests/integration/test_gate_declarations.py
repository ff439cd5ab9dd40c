"""The pipeline's gate judges calls by what each prompt declares, as its adapter stated it.

glaive in `system_prompt` mode sends no `tools`: the functions are in the system prompt, and
the gate reads them from the prompt chunks (`declared_tools`), not from the system text. A chunk
written before adapters stated declarations gates the same.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
import yaml

from flows.demo import DEMO_CONFIG, demo_emulator_config
from specregen.config import load_config
from specregen.emulator.server import serve_in_thread
from specregen.pipeline.layout import DatasetRun
from specregen.pipeline.run import run_dataset
from tests.support import get_tokenizer

pytestmark = pytest.mark.integration


def test_system_prompt_glaive_gates_by_the_prompts_declarations(tmp_path: Path) -> None:
    config = yaml.safe_load(DEMO_CONFIG.read_text())
    config["storage"] = str(tmp_path / "data")
    config["datasets"] = [{"name": "B1_sp", "adapter": "glaive", "source": "bundled:B1_glaive",
                           "tool_mode": "system_prompt",
                           "gate": {"max_quarantine_share": 0.2, "allow_stop_with_calls": True}}]
    path = tmp_path / "c.yaml"
    root = tmp_path / "data" / "B1_sp"

    def run() -> dict:
        loaded = load_config(str(path))
        result = asyncio.run(run_dataset(DatasetRun(loaded, loaded.datasets[0]), None))
        assert result.outcome == "published", result
        (report,) = root.glob("gate/*/report.json")
        return json.loads(report.read_text())

    with serve_in_thread(demo_emulator_config(), get_tokenizer("mini")) as emu:
        config["endpoint"]["base_url"] = emu.openrouter_url
        path.write_text(yaml.safe_dump(config))
        first = run()
        assert first["by_check"]["name_declared"] == 0
        assert sum(t["calls"] for t in first["by_tool"]) > 5, first["by_tool"]
        chunks = list(root.glob("prompts/*/chunk-*.jsonl"))
        lines = [json.loads(line) for chunk in chunks for line in chunk.read_text().splitlines()]
        assert sum(bool(line["declared_tools"]) for line in lines) > 5

        # A chunk from before declarations were stated: the gate reruns and reads the same.
        for chunk in chunks:
            rows = [json.loads(line) for line in chunk.read_text().splitlines()]
            for row in rows:
                del row["declared_tools"]
            chunk.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        for stage in ("gate", "published"):
            shutil.rmtree(root / stage)
        assert run() == first
