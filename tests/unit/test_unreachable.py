"""An endpoint nothing answers at is named at once (issue 21): the URL, the error and what to
check, with its own exit code, and those refused connections use none of a sample's attempts.
Once the endpoint has answered, a refused connection is an ordinary retryable failure."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path

import httpx
from typer.testing import CliRunner

from specregen.cli import app
from specregen.client.engine import run_inference
from specregen.emulator.config import EmulatorConfig
from specregen.emulator.server import serve_in_thread
from specregen.errors import EXIT_UNREACHABLE
from specregen.models.tokenizer import load_tokenizer
from specregen.store.rawlog import RawLog
from tests.unit.test_client_support import completion, json_response, make_cfg, make_prompts


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def infer_args(prompts: Path, out: Path, url: str, config: Path) -> list[str]:
    return ["infer", str(prompts), "--base-url", url, "--model", "moonshotai/kimi-k2.5",
            "--out", str(out), "--config", str(config), "--tokenizer", "mini"]


def test_infer_against_a_closed_port_names_the_url_at_once_and_uses_no_attempt(tmp_path):
    port = closed_port()
    url = f"http://127.0.0.1:{port}/api/v1"
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"sample_id": f"s{i}", "messages": [
        {"role": "user", "content": f"Write function {i}"}]}) + "\n" for i in range(6)))
    # One attempt per sample: if the refusals had counted, nothing would be asked again.
    config = tmp_path / "endpoint.yaml"
    config.write_text("retry: {max_attempts: 1}\nconcurrency: 4\n")
    out = tmp_path / "raw"
    started = time.monotonic()
    result = CliRunner().invoke(app, infer_args(prompts, out, url, config))
    took = time.monotonic() - started
    assert result.exit_code == EXIT_UNREACHABLE, result.output
    assert took < 10, took
    said = " ".join(result.output.split())
    assert f"cannot reach the endpoint {url}" in said
    assert "Connect" in said  # the error itself
    assert f"specregen emulator --port {port}" in said  # what to do about it
    assert "Traceback" not in result.output
    assert list(RawLog(str(out)).iter_records()) == []  # 0 attempts used, nothing recorded

    # The server comes up there: each sample still has its one attempt.
    with serve_in_thread(EmulatorConfig(seed=1), load_tokenizer("mini"), port=port) as emu:
        again = CliRunner().invoke(app, infer_args(prompts, out, url, config))
        assert again.exit_code == 0, again.output
        assert emu.stats()["chat_requests"] == 6
    records = list(RawLog(str(out)).iter_records())
    assert sorted(r["sample_id"] for r in records) == [f"s{i}" for i in range(6)]
    assert all(r["final"] and r["status"] == "ok" for r in records)


def test_probe_against_a_closed_port_names_the_url(tmp_path):
    port = closed_port()
    url = f"http://127.0.0.1:{port}/api/v1"
    result = CliRunner().invoke(app, ["probe", "--out", str(tmp_path / "profile.json"),
                                      "--base-url", url, "--model", "moonshotai/kimi-k2.5"])
    assert result.exit_code == EXIT_UNREACHABLE, result.output
    assert f"cannot reach the endpoint {url}" in " ".join(result.output.split())
    assert not (tmp_path / "profile.json").exists()


def test_a_refused_connection_after_the_endpoint_answered_is_a_counted_retry(tmp_path):
    """The server answered, then went away: its refusals are attempts like any failure
    (retried, recorded, counted against max_attempts), not "unreachable"."""
    answered = []

    def handler(request: httpx.Request) -> httpx.Response:
        if not answered:
            answered.append(True)
            return json_response(completion())
        raise httpx.ConnectError("All connection attempts failed")

    cfg = make_cfg(concurrency=1, retry={"max_attempts": 2})
    log = RawLog(str(tmp_path / "raw"))

    async def main():
        async with log:
            return await run_inference(make_prompts(2), cfg, log, api_key=None,
                                       transport=httpx.MockTransport(handler))

    summary = asyncio.run(main())
    assert (summary.ok, summary.failed) == (1, 1)
    failed = [r for r in RawLog(str(tmp_path / "raw")).iter_records() if r["sample_id"] == "s1"]
    assert [r["error_class"] for r in failed] == ["connect_error", "connect_error"]
    assert failed[-1]["final"]
