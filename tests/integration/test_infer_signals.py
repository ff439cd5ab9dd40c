"""`specregen infer` interrupted by Ctrl-C (SIGINT) or SIGTERM, on each event loop it can run.

SIGINT: exit 130 with the "interrupted" line, the raw log keeps what finished, and a rerun
completes every sample exactly once without asking again for finished ones. SIGTERM ends the
process (no handler: the default action, as before uvloop), and the rerun resumes the same way.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specregen.client.loop import LOOP_ENV
from specregen.emulator.config import EmulatorConfig
from specregen.emulator.server import serve_in_thread
from specregen.store.rawlog import RawLog
from tests.support import get_tokenizer

pytestmark = pytest.mark.integration

LOOPS = [pytest.param("uvloop", marks=pytest.mark.skipif(
    importlib.util.find_spec("uvloop") is None, reason="uvloop is not installed")), "asyncio"]


def final_ids(out: Path) -> list[str]:
    return [r["sample_id"] for r in RawLog(str(out)).iter_records() if r.get("final")]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
@pytest.mark.parametrize("loop", LOOPS)
def test_interrupted_infer_stops_and_resumes(tmp_path, loop, sig):
    n, window = 120, 8
    src = tmp_path / "prompts.jsonl"
    src.write_text("".join(json.dumps({"sample_id": f"s{i}", "messages": [
        {"role": "user", "content": f"Write a Python function number {i} that sorts."}]}) + "\n"
        for i in range(n)))
    out = tmp_path / "rawlog"
    config = EmulatorConfig(seed=7, latency="fixed", latency_mean=0.15)
    with serve_in_thread(config, get_tokenizer("mini")) as emu:
        # Streaming (the default): the path uvloop is there for.
        cmd = [sys.executable, "-m", "specregen.cli", "infer", str(src), "--out", str(out),
               "--base-url", emu.openrouter_url, "--model", "moonshotai/kimi-k2.5",
               "--concurrency", str(window)]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", LOOP_ENV: loop}
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(final_ids(out)) < n // 4:
            time.sleep(0.05)
        proc.send_signal(sig)
        output, _ = proc.communicate(timeout=30)
        if sig == signal.SIGINT:
            assert proc.returncode == 130, output[-2000:]
            assert "interrupted" in output
        else:
            assert proc.returncode == -signal.SIGTERM, output[-2000:]
        done_before = final_ids(out)
        assert 0 < len(done_before) < n, "the signal did not land mid-run"
        asked_before = emu.stats()["chat_requests"]
        second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
        asked_again = emu.stats()["chat_requests"] - asked_before
    ids = final_ids(out)
    assert sorted(ids) == sorted(f"s{i}" for i in range(n))  # each sample final exactly once
    # Only what was not final is asked again.
    assert asked_again == n - len(done_before)


def test_ctrl_c_at_any_moment_is_one_line_and_no_traceback(tmp_path):
    """Ctrl-C while the command is still importing, preparing or sending: exit 130 and one
    line saying what is kept, never a traceback (issue 21). (The interpreter's own start-up,
    before the first line of specregen runs, is out of reach: the first signal comes after
    it; the command's imports take seconds on a loaded machine, so the next ones land in
    them.)"""
    src = tmp_path / "prompts.jsonl"
    src.write_text("".join(json.dumps({"sample_id": f"s{i}", "messages": [
        {"role": "user", "content": f"Write a function number {i}."}]}) + "\n"
        for i in range(200)))
    command = Path(sys.executable).parent / "specregen"  # the installed command
    config = EmulatorConfig(seed=7, latency="fixed", latency_mean=0.3)
    with serve_in_thread(config, get_tokenizer("mini")) as emu:
        for delay in (0.5, 1.0, 1.5, 2.5, 4.0):
            out = tmp_path / f"rawlog-{delay}"
            proc = subprocess.Popen(
                [str(command), "infer", str(src), "--out", str(out), "--base-url",
                 emu.openrouter_url, "--model", "moonshotai/kimi-k2.5", "--concurrency", "4"],
                env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True)
            time.sleep(delay)
            proc.send_signal(signal.SIGINT)
            output, _ = proc.communicate(timeout=60)
            assert "Traceback" not in output, (delay, output[-3000:])
            assert proc.returncode == 130, (delay, proc.returncode, output[-2000:])
            assert "interrupted" in output.splitlines()[-1], (delay, output[-2000:])
