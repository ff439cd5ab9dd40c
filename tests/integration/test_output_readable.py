"""Output read from a file or a log is whole (issue 21): when stdout is not a terminal, tables
take the width they need, paths are never cut or wrapped, there is no ellipsis, and no warning
that calls for no action. The commands run as a user runs them, piped to a file.

The demo's own output is checked the same way by tests/integration/test_readme.py, which runs
`bash scripts/demo.sh` as the README says.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from specregen.emulator.config import EmulatorConfig
from specregen.emulator.server import serve_in_thread
from tests.support import REPO, get_tokenizer

pytestmark = pytest.mark.integration

COMMAND = [sys.executable, "-m", "specregen"]


def assert_readable(text: str, whole: list[str]) -> None:
    """No ellipsis anywhere, and each of `whole` (paths, headers, names) on one line."""
    assert "\u2026" not in text, text[-3000:]
    lines = text.splitlines()
    for item in whole:
        assert any(item in line for line in lines), (item, text[-3000:])
    # Rich's padding to an imagined width would show as trailing blanks on every line.
    assert not any(line.endswith("  ") for line in lines if "\u2502" not in line), text[-3000:]


def piped(args: list[str], out: Path, env: dict | None = None, cwd: Path = REPO) -> str:
    """Run a command with stdout and stderr going to a file (not a terminal)."""
    with out.open("w") as handle:
        done = subprocess.run([*COMMAND, *args], stdout=handle, stderr=subprocess.STDOUT,
                              cwd=cwd, env={**os.environ, **(env or {})}, timeout=600)
    text = out.read_text()
    assert done.returncode == 0, text[-3000:]
    return text


@pytest.fixture(scope="module")
def emulator():
    with serve_in_thread(EmulatorConfig(seed=4, literal_marker_rate=0.0),
                         get_tokenizer("mini")) as emu:
        yield emu


def deep_config(tmp_path: Path, base_url: str) -> Path:
    """The demo config with storage deep enough that its paths pass 80 columns."""
    config = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())
    config["storage"] = str(tmp_path / ("a-storage-folder-with-a-long-name" + "/deeper" * 6))
    config["endpoint"]["base_url"] = base_url
    config["datasets"] = [d for d in config["datasets"] if d["name"] == "B2_opencodeinstruct"]
    config["datasets"][0]["limit"] = 4
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_estimate_and_infer_piped_to_a_file_are_whole(emulator, tmp_path):
    config = deep_config(tmp_path, emulator.openrouter_url)
    text = piped(["estimate", "--config", str(config), "--pilot", "2"], tmp_path / "est.txt")
    assert_readable(text, ["prompt tokens", "completion p10/p50/p90", "realtime", "batch",
                           "B2_opencodeinstruct", "projected cost (USD)"])

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"sample_id": f"s{i}", "messages": [
        {"role": "user", "content": f"Write function {i}"}]}) + "\n" for i in range(3)))
    raw = tmp_path / ("a-raw-log-folder-with-a-long-name" + "/deeper" * 8)
    text = piped(["infer", str(prompts), "--out", str(raw), "--base-url",
                  emulator.openrouter_url, "--model", "moonshotai/kimi-k2.5",
                  "--tokenizer", "mini"], tmp_path / "infer.txt")
    assert_readable(text, [f"inference -> {raw}", "mean in flight, input left"])
    # The bundled test tokenizer states no context length on purpose: nothing to act on.
    assert "model_max_length" not in text


def test_run_piped_to_a_file_prints_whole_paths(prefect_server, emulator, tmp_path):
    from prefect.settings import PREFECT_API_URL

    config = deep_config(tmp_path, emulator.openrouter_url)
    text = piped(["run", "--config", str(config)], tmp_path / "run.txt",
                 env={"PREFECT_API_URL": PREFECT_API_URL.value()})
    storage = Path(yaml.safe_load(config.read_text())["storage"])
    latest = json.loads((storage / "B2_opencodeinstruct" / "published" / "LATEST.json")
                        .read_text())
    published = storage / "B2_opencodeinstruct" / "published" / latest["fingerprint"]
    assert len(str(published)) > 100
    assert_readable(text, [f"B2_opencodeinstruct: published to {published}",
                           "B2_opencodeinstruct: gate report ", "quarantined", "cost USD"])
