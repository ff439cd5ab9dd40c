"""`specregen run` as a user meets it: two runs at once, a missing source, one-line failures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from specregen.emulator.config import EmulatorConfig
from specregen.emulator.server import serve_in_thread
from specregen.errors import EXIT_BUSY, EXIT_USAGE
from tests.support import REPO, get_tokenizer

pytestmark = pytest.mark.integration


def write_config(tmp_path: Path, base_url: str, datasets: list[dict], **top) -> Path:
    config = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())
    config.update(storage=str(tmp_path / "store"), chunk_size=20, datasets=datasets, **top)
    config["endpoint"]["base_url"] = base_url
    config["endpoint"]["concurrency"] = 4
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def messages_source(tmp_path: Path, n: int) -> Path:
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(
        json.dumps({"id": f"m{i}", "messages": [{"role": "user", "content": f"Count to {i}."}]})
        + "\n" for i in range(n)))
    return source


@pytest.fixture
def run_env(prefect_server):
    """The CLI in a subprocess against the session's Prefect server (no server per run)."""
    from prefect.settings import PREFECT_API_URL

    return {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}


def specregen_run(config: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "specregen.cli", "run", "--config", str(config), *extra]


def test_two_runs_of_one_config_pay_no_sample_twice(run_env, tmp_path):
    n = 120
    slow = EmulatorConfig(seed=3, latency="fixed", latency_mean=0.4, literal_marker_rate=0.0)
    with serve_in_thread(slow, get_tokenizer("mini")) as emu:
        datasets = [{"name": "M", "adapter": "messages",
                     "source": str(messages_source(tmp_path, n)),
                     "gate": {"max_quarantine_share": 1.0}}]
        # No probe: its requests would blur the count of requests per sample.
        config = write_config(tmp_path, emu.openrouter_url, datasets, probe="off")
        logs = {k: (tmp_path / f"{k}.out", tmp_path / f"{k}.err") for k in (1, 2, 3)}

        def start(k: int, *extra: str) -> subprocess.Popen:
            out, err = logs[k]
            # Files, not pipes: a run writing more than a pipe holds must not block.
            return subprocess.Popen(specregen_run(config, *extra), env=run_env,
                                    stdout=out.open("w"), stderr=err.open("w"))

        first = start(1)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and emu.stats()["completed"] < 4:
            time.sleep(0.05)
        assert first.poll() is None, "the first run ended before answering"
        # Started while the first one pays: one stops at once, one waits for it.
        second, third = start(2), start(3, "--wait", "300")
        second.wait(timeout=180)
        assert first.poll() is None, "the first run ended before the second one checked"
        first.wait(timeout=300)
        third.wait(timeout=300)
        stats = emu.stats()
    (out1, err1), (out2, err2), (out3, err3) = (
        (out.read_text(), err.read_text()) for out, err in logs.values())
    assert first.returncode == 0, err1[-3000:]
    assert second.returncode == EXIT_BUSY, err2[-3000:]
    last = err2.strip().splitlines()[-1]
    assert last.startswith("error: datasets failed: M (") and f"pid {first.pid}" in last, last
    assert "specregen run of M" in last and "--wait" in last
    assert third.returncode == 0, err3[-3000:]
    assert "waiting up to 300 s for the run that holds it" in err3 + out3
    assert "M: already published; skipped" in out3
    # Every sample was requested once: by the first run only.
    assert stats["chat_requests"] == stats["distinct_requests"] == n, stats
    assert "Traceback" not in out1 + err1 + out2 + err2 + err3


def test_a_missing_source_fails_at_once_with_one_line_and_the_others_publish(run_env, tmp_path):
    missing = tmp_path / "gone" / "rows.jsonl"
    with serve_in_thread(EmulatorConfig(seed=5, literal_marker_rate=0.0),
                         get_tokenizer("mini")) as emu:
        datasets = [
            {"name": "M", "adapter": "messages", "source": str(missing)},
            {"name": "B3_magicoder", "adapter": "magicoder", "source": "bundled:B3_magicoder",
             "options": {"instruction_prefix": True}, "gate": {"max_quarantine_share": 1.0}},
        ]
        config = write_config(tmp_path, emu.openrouter_url, datasets)
        done = subprocess.run(specregen_run(config), env=run_env, text=True,
                              capture_output=True, timeout=300)
    assert done.returncode == EXIT_USAGE, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last == (f"error: datasets failed: M (source {missing} does not exist -- fix the"
                    " dataset's `source` in the config); the other 1 finished"), last
    assert "Traceback" not in done.stdout + done.stderr
    assert "Retry" not in done.stderr  # a missing source is not retried
    assert "B3_magicoder: published to" in done.stdout
