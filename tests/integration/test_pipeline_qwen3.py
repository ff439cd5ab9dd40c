"""configs/demo-qwen3.yaml end to end (the library runner of the stage chain) against the
emulator serving Qwen3 behind vLLM with the hermes parser: every demo dataset is published, its
samples' ids equal the emulator's true ids, and a second run skips them all."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pyarrow.dataset as pads
import pytest
import yaml

from specregen.config import load_config
from specregen.emulator.config import EmulatorConfig
from specregen.emulator.server import serve_in_thread
from specregen.models.tokenizer import load_tokenizer
from specregen.pipeline.layout import DatasetRun
from specregen.pipeline.run import run_dataset
from specregen.store.fs import Store
from specregen.store.token_samples import read_token_meta
from tests.support import REPO

pytestmark = pytest.mark.integration


def test_demo_qwen3_publishes_every_dataset_with_the_true_ids(tmp_path: Path):
    raw = yaml.safe_load((REPO / "configs" / "demo-qwen3.yaml").read_text())
    emulator = EmulatorConfig(profile="vllm-hermes", model=raw["endpoint"]["model"], seed=3,
                              reasoning_tokens_mean=60, content_tokens_mean=40)
    with serve_in_thread(emulator, load_tokenizer(raw["tokenizer"])) as emu:
        raw["storage"] = str(tmp_path / "store")
        raw["endpoint"]["base_url"] = emu.url
        raw["chunk_size"] = 10
        path = tmp_path / "pipeline.yaml"
        path.write_text(yaml.safe_dump(raw))
        config = load_config(path)
        assert config.format_name == "qwen3"
        for dataset in config.datasets:
            run = DatasetRun(config, dataset)
            result = asyncio.run(run_dataset(run, None))
            assert result.outcome == "published", result.summary
            summary = result.summary
            assert summary["probe"]["status"] == "not_needed"
            assert summary["reference_match"] == {"exact": summary["prompts"]}, summary
            store = Store(config.storage)
            shards = store.path(run.name, "reconstruct", run.reconstruct_fp)
            files = sorted(str(p) for p in Path(shards).glob("*.parquet"))
            table = pads.dataset(files, format="parquet").to_table()
            assert set(table.column("status").to_pylist()) == {"ok"}
            assert table.num_rows == summary["prompts"]
            assert read_token_meta(files[0]).format["name"] == "qwen3"
            again = asyncio.run(run_dataset(DatasetRun(config, dataset), None))
            assert again.outcome == "skipped"
