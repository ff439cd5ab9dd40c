"""configs/demo-qwen3.yaml end to end (the library runner of the stage chain) against the
emulator serving Qwen3 behind vLLM with the hermes parser: the endpoint is probed before the
first paid request (the config has a tool-call dataset, `probe: auto`), every demo dataset is
published with the probe's traits, its samples' ids equal the emulator's true ids, and a second
run skips them all."""

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
from specregen.pipeline.probing import with_stored_traits
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
        for n, dataset in enumerate(config.datasets):
            run = DatasetRun(config, dataset)
            result = asyncio.run(run_dataset(run, None))
            assert result.outcome == "published", result.summary
            summary = result.summary
            probe = summary["probe"]
            # Qwen3 has probe rules: the first dataset probes (B1_glaive needs tool calls, so
            # `auto` probes for the whole config), the others read the stored profile.
            assert probe["status"] == ("probed" if n == 0 else "stored"), probe
            assert probe["refusal"] is None
            assert (probe["requests"] > 0) == (n == 0)
            assert probe["recoverable_by_mode"]["tools"] is True
            # vLLM counts <|im_end|> and splits the reasoning; Qwen3 ids carry no count and no
            # parser deletes a placeholder, so those stay unknown.
            traits = probe["traits"]
            assert (traits["counts_stop_token"], traits["splits_reasoning"]) == (True, True)
            assert (traits["renumbers_tool_ids"], traits["deletes_no_content"]) == (None, None)
            # vLLM's hermes returns the text before the calls as written.
            assert traits["strips_content_beside_calls"] is False
            assert summary["reference_match"] == {"exact": summary["prompts"]}, summary
            store = Store(config.storage)
            # Reconstruction ran with the stored traits: its fingerprint includes them.
            traced = with_stored_traits(run)
            assert traced.traits is not None and traced.reconstruct_fp != run.reconstruct_fp
            shards = store.path(run.name, "reconstruct", traced.reconstruct_fp)
            files = sorted(str(p) for p in Path(shards).glob("*.parquet"))
            table = pads.dataset(files, format="parquet").to_table()
            assert set(table.column("status").to_pylist()) == {"ok"}
            assert table.num_rows == summary["prompts"]
            assert read_token_meta(files[0]).format["name"] == "qwen3"
            again = asyncio.run(run_dataset(DatasetRun(config, dataset), None))
            assert again.outcome == "skipped"
