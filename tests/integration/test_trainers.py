"""A publication's train.jsonl through the real trainers' own loaders: speculators 0.9.0
(`speculators prepare-data`, then its training dataset class) and SpecForge 0.2.0 (the
`data.prompts_path` preparation `specforge train` runs). What they hand to training must be the
published parquet's ids and masks, unchanged and unshifted, for tool-call and truncated samples.

The trainers live in their own environment (`.venv-trainers`, built by scripts/setup.sh for the
test command: CPU torch, the trainer packages and what their loading code imports) and run here
in subprocesses with its python. Without that environment the tests skip and say how to get it.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections import Counter
from pathlib import Path

import pyarrow.dataset as pads
import pytest
import yaml

from tests.support import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TRAINERS_PYTHON = Path(os.environ.get("SPECREGEN_TRAINERS_PYTHON")
                       or REPO / ".venv-trainers" / "bin" / "python")
SEQ_LENGTH = 8192

# Runs in the trainers' environment: SpecForge's own config loader and prompt preparation.
SPECFORGE_CHILD = """
import json, sys
from specforge.algorithms.builtin import builtin_algorithm_registry
from specforge.config import load_config
from specforge.training.assembly import _prepare_prompts

cfg = load_config(sys.argv[1])
algorithm = builtin_algorithm_registry().resolve(cfg.training.strategy)
# The tokenizer is only used for raw conversations; pre-tokenized rows never touch it.
prompts = _prepare_prompts(cfg, None, algorithm=algorithm, draft_config=None)
json.dump([p["payload"] for p in prompts], open(sys.argv[2], "w"))
"""

# Runs in the trainers' environment: the dataset class speculators trains from, over what
# `speculators prepare-data` wrote.
SPECULATORS_CHILD = """
import json, sys
from speculators.train.data import ArrowDataset

ds = ArrowDataset(max_len=int(sys.argv[2]), datapath=sys.argv[1], on_missing="skip")
rows = [{"input_ids": ds.data[i]["input_ids"].tolist(),
         "loss_mask": ds.data[i]["loss_mask"].tolist(),
         "seq_len": int(ds.data[i]["seq_len"])} for i in range(len(ds))]
json.dump(rows, open(sys.argv[3], "w"))
"""


@pytest.fixture(scope="module")
def trainers_python() -> Path:
    if not TRAINERS_PYTHON.is_file():
        pytest.skip(f"no trainers' environment at {TRAINERS_PYTHON.parent.parent}: run "
                    "`SPECREGEN_TRAINERS=1 source scripts/setup.sh` once (it installs "
                    "speculators and SpecForge from PyPI)")
    probe = subprocess.run(
        [str(TRAINERS_PYTHON), "-c", "import speculators.data_generation.preprocessing, "
         "speculators.train.data, specforge.data.prompt_builder, specforge.training.assembly"],
        capture_output=True, text=True, timeout=300,
    )
    if probe.returncode != 0:
        pytest.skip("the trainers cannot be imported in "
                    f"{TRAINERS_PYTHON}: {probe.stderr.strip().splitlines()[-1:]}")
    return TRAINERS_PYTHON


@pytest.fixture(scope="module")
def publications(tmp_path_factory) -> dict[str, Path]:
    """Two publications through the library pipeline and the emulator: glaive (tool calls) and
    opencodeinstruct with a 40-token budget (every answer truncated)."""
    from specregen.config import load_config
    from specregen.emulator.config import EmulatorConfig
    from specregen.emulator.server import serve_in_thread
    from specregen.pipeline.layout import DatasetRun
    from specregen.pipeline.run import run_dataset
    from tests.support import get_tokenizer

    root = tmp_path_factory.mktemp("trainers")
    found: dict[str, Path] = {}
    with serve_in_thread(EmulatorConfig(seed=4, literal_marker_rate=0.0),
                         get_tokenizer("mini")) as emu:
        for name, max_tokens in (("B1_glaive", 2048), ("B2_opencodeinstruct", 40)):
            config = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())
            config.update(storage=str(root / "store"), chunk_size=10)
            config["endpoint"]["base_url"] = emu.openrouter_url
            config["endpoint"]["sampling"] = {"max_tokens": max_tokens}
            config["datasets"] = [d for d in config["datasets"] if d["name"] == name]
            path = root / f"{name}.yaml"
            path.write_text(yaml.safe_dump(config))
            loaded = load_config(path)
            run = DatasetRun(loaded, loaded.datasets[0])
            result = asyncio.run(run_dataset(run, None))
            assert result.outcome == "published", result
            # LATEST.json: the run may refine its DatasetRun (probe traits) on the way.
            latest = run.store.read_json(name, "published", "LATEST.json")["fingerprint"]
            found[name] = Path(run.store.path(name, "published", latest))
    return found


def parquet_rows(folder: Path) -> list[dict]:
    table = pads.dataset(str(folder / "data"), format="parquet").to_table(
        columns=["sample_id", "input_ids", "loss_mask", "prompt_len", "finish_reason"])
    return table.to_pylist()


def supervised(rows: list[dict]) -> list[dict]:
    # Both trainers drop a row without a single supervised token (documented behaviour).
    return [r for r in rows if any(r["loss_mask"])]


def test_the_publications_hold_tool_call_and_truncated_samples(publications):
    glaive = parquet_rows(publications["B1_glaive"])
    truncated = parquet_rows(publications["B2_opencodeinstruct"])
    assert any(r["finish_reason"] == "tool_calls" for r in glaive)
    assert truncated and all(r["finish_reason"] == "length" for r in truncated)
    for folder in publications.values():
        rows = [json.loads(line) for line in (folder / "train.jsonl").open()]
        assert [r["id"] for r in rows] == [r["sample_id"] for r in parquet_rows(folder)]


def test_speculators_prepare_data_hands_over_the_published_ids_and_masks(
    trainers_python, publications, tmp_path
):
    tokenizer = mini_tokenizer_folder(tmp_path / "model")
    out = tmp_path / "prepared"
    command = [str(trainers_python), "-m", "speculators", "prepare-data",
               "--model", str(tokenizer), "--output", str(out),
               "--seq-length", str(SEQ_LENGTH), "--num-preprocessing-workers", "1"]
    for folder in publications.values():
        command += ["--data", str(folder / "train.jsonl")]
    run(command, tmp_path)
    handed_file = tmp_path / "handed.json"
    run([str(trainers_python), "-c", SPECULATORS_CHILD, str(out), str(SEQ_LENGTH),
         str(handed_file)], tmp_path)
    handed = json.loads(handed_file.read_text())

    ours = [r for folder in publications.values() for r in supervised(parquet_rows(folder))]
    # prepare-data shuffles: compare the rows as a multiset.
    assert Counter(key(r) for r in handed) == Counter(key(r) for r in ours)
    for row in handed:
        assert row["seq_len"] == len(row["input_ids"]) == len(row["loss_mask"])
    assert_unshifted(ours)


def test_specforge_prompts_path_hands_over_the_published_ids_and_masks(
    trainers_python, publications, tmp_path
):
    for name, folder in publications.items():
        config = tmp_path / f"{name}.yaml"
        config.write_text(yaml.safe_dump({
            "model": {"target_model_path": str(tmp_path / "model"), "target_backend": "sglang"},
            "data": {"prompts_path": str(folder / "train.jsonl"), "max_length": SEQ_LENGTH,
                     "cache_dir": str(tmp_path / "cache")},
            "training": {"strategy": "eagle3"},
            "deployment": {"mode": "disaggregated",
                           "disaggregated": {"control_dir": str(tmp_path / "control"),
                                             "backend": "mooncake"}},
            "output_dir": str(tmp_path / "out"),
        }))
        handed_file = tmp_path / f"{name}.json"
        run([str(trainers_python), "-c", SPECFORGE_CHILD, str(config), str(handed_file)],
            tmp_path)
        handed = json.loads(handed_file.read_text())
        ours = supervised(parquet_rows(folder))
        # In file order, which is the parquet's.
        assert [key(r) for r in handed] == [key(r) for r in ours], name
        assert_unshifted(ours)


def key(row: dict) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return tuple(row["input_ids"]), tuple(row["loss_mask"])


def assert_unshifted(rows: list[dict]) -> None:
    # The mask is aligned with the ids: 0 over the prompt, 1 from the first generated token.
    for row in rows:
        assert row["loss_mask"].index(1) == row["prompt_len"], row["sample_id"]


def run(command: list[str], cwd: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, f"{command[:4]} failed:\n{done.stderr[-4000:]}"


def mini_tokenizer_folder(folder: Path) -> Path:
    """The bundled mini tokenizer as a transformers folder (tokenizer.json), which is what
    `prepare-data --model` loads. speculators uses it only for its log's coloured preview of
    one sample; pre-tokenized rows are never tokenized again."""
    from transformers.convert_slow_tokenizer import TikTokenConverter

    from specregen.models.tokenizer import KIMI_PAT_STR, MINI_TOKENIZER_DIR, load_tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    tok = load_tokenizer("mini")
    fast = TikTokenConverter(vocab_file=str(MINI_TOKENIZER_DIR / "tiktoken.model"),
                             pattern=KIMI_PAT_STR,
                             extra_special_tokens=tok.added_tokens).converted()
    fast.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>"}))
    return folder
