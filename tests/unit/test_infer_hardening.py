"""`specregen infer` hardening (issue 14): bad rows never crash a run, nothing is paid twice or
lost, everything is checked before the first request, one line per failure, distinct exit codes.

The server counts requests per sample (by the prompt text), so "paid twice" is measured where
it is paid.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from typer.testing import CliRunner

from specregen.cli import app
from specregen.client.engine import run_inference
from specregen.errors import EXIT_BUSY, EXIT_PARTIAL, EXIT_STORAGE, EXIT_USAGE
from specregen.records import Prompt
from specregen.store.rawlog import AttemptRecord, RawLog
from tests.unit.test_client_support import (
    GATED_TIMEOUTS,
    FakeServer,
    GatedServer,
    ThreadedApp,
    completion,
    gated_run,
    json_response,
    make_cfg,
    make_prompts,
    ok_handler,
)

USAGE = {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7, "cost": 0.001}


class Counting:
    """Requests per prompt text; behaviour by model name."""

    def __init__(self) -> None:
        self.per_sample: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.delay = 0.0
        self.fail = False  # answer every request with a 500

    def reset(self, delay: float = 0.0, fail: bool = False) -> None:
        with self.lock:
            self.per_sample.clear()
        self.delay = delay
        self.fail = fail

    @property
    def total(self) -> int:
        return sum(self.per_sample.values())


COUNT = Counting()


async def chat(request: Request) -> Response:
    body = await request.json()
    text = body["messages"][-1]["content"]
    with COUNT.lock:
        COUNT.per_sample[text] += 1
    if COUNT.delay:
        await asyncio.sleep(COUNT.delay)
    if COUNT.fail:
        return JSONResponse({"error": {"code": 500, "message": "upstream down"}}, 500)
    return JSONResponse(completion(f"answer to {text}", usage=USAGE))


@pytest.fixture(scope="module")
def server():
    with ThreadedApp(Starlette(routes=[Route("/v1/chat/completions", chat,
                                             methods=["POST"])])) as running:
        yield running


@pytest.fixture
def counting(server):
    COUNT.reset()
    return COUNT


def line(i: int, **extra) -> str:
    row = {"sample_id": f"id{i}", "messages": [{"role": "user", "content": f"q{i}"}], **extra}
    return json.dumps(row)


def write_lines(path: Path, lines: list[str | bytes]) -> Path:
    path.write_bytes(b"".join((x if isinstance(x, bytes) else x.encode()) + b"\n" for x in lines))
    return path


def infer(server, prompts: Path, out, *extra: str, env: dict | None = None):
    args = ["infer", str(prompts), "--base-url", server.url, "--model",
            extra[0] if extra and not extra[0].startswith("-") else "ok", "--out", str(out),
            "--concurrency", "8",
            *(extra[1:] if extra and not extra[0].startswith("-") else extra)]
    return CliRunner().invoke(app, args, env={"OPENROUTER_API_KEY": None, **(env or {})})


def finals(out) -> list[dict]:
    return [r for r in RawLog(str(out)).iter_records() if r["final"]]


# -- 1. a row that cannot be sent is a reject, never a crash -------------------------------------


def test_nan_in_a_tool_schema_at_line_101_of_201_rejects_that_row_only(server, counting,
                                                                       tmp_path):
    bad_tool = '{"type": "function", "function": {"name": "f", "parameters": {"maximum": NaN}}}'
    lines = [line(i) for i in range(201)]
    lines[100] = line(100)[:-1] + f', "tools": [{bad_tool}]}}'
    prompts = write_lines(tmp_path / "p.jsonl", lines)
    out = tmp_path / "raw"
    result = infer(server, prompts, out)
    assert result.exit_code == 0, result.output
    assert "line 101" in result.output and "NaN" in result.output
    assert counting.total == 200 and "q100" not in counting.per_sample
    assert len(finals(out)) == 200
    (reject,) = RawLog(str(out)).iter_rejects()
    assert reject["line"] == 101 and "NaN" in reject["reason"]
    # A rerun is not poisoned either: nothing to send, the row rejected again.
    again = infer(server, prompts, out)
    assert again.exit_code == 0 and counting.total == 200


def test_library_callers_get_rejects_too_for_unsendable_prompts(tmp_path):
    """The pipeline hands Prompt objects straight to the engine: NaN in a schema there."""
    server = FakeServer(ok_handler())
    prompts = make_prompts(30)
    prompts[17] = Prompt(sample_id="bad", messages=[{"role": "user", "content": "x"}],
                         tools=[{"type": "function", "function": {"name": "f", "parameters":
                                                                   {"maximum": math.inf}}}])
    log = RawLog(tmp_path)

    async def main():
        async with log:
            return await run_inference(prompts, make_cfg(), log, api_key=None,
                                       transport=server.transport)

    summary = asyncio.run(main())
    assert summary.ok == 29 and summary.rejected == 1
    assert summary.rejects[0]["sample_id"] == "bad"
    assert [r["sample_id"] for r in log.iter_rejects()] == ["bad"]


def test_answers_that_arrived_are_logged_when_the_input_fails_mid_run(tmp_path):
    """A failing prompt source (or any bug in one worker) must not cancel the requests in flight:
    every answer the server served is in the raw log."""
    served = []

    async def respond(request, body):
        await asyncio.sleep(0.05)
        served.append(body["messages"][0]["content"])
        return json_response(completion())

    server = FakeServer(respond)

    def source():
        yield from make_prompts(100)
        raise RuntimeError("the dataset reader broke")

    log = RawLog(tmp_path)

    async def main():
        async with log:
            return await run_inference(source(), make_cfg(concurrency=16), log, api_key=None,
                                       transport=server.transport)

    with pytest.raises(RuntimeError, match="reader broke"):
        asyncio.run(main())
    logged = {r["sample_id"] for r in log.iter_records() if r["final"]}
    assert len(served) == 100
    assert len(logged) == len(served)


def test_non_utf8_bytes_in_a_prompt_are_rejected_not_replaced(server, counting, tmp_path):
    bad = line(1).encode().replace(b"q1", b"q1 \xff\xfe")
    prompts = write_lines(tmp_path / "p.jsonl", [line(0), bad, line(2)])
    result = infer(server, prompts, tmp_path / "raw")
    assert result.exit_code == 0, result.output
    assert "line 2: not UTF-8" in result.output
    assert sorted(counting.per_sample) == ["q0", "q2"]
    assert not any("\ufffd" in text for text in counting.per_sample)


def test_a_reject_reason_quoting_markup_like_text_is_printed_verbatim(server, counting,
                                                                     tmp_path):
    odd = json.dumps({"sample_id": "[/x] [bold]", "messages": []})
    prompts = write_lines(tmp_path / "p.jsonl", [line(0), odd])
    result = infer(server, prompts, tmp_path / "raw")
    assert result.exit_code == 0, result.output
    assert "sample [/x] [bold]: 'messages' is missing" in result.output
    assert counting.total == 1


def test_bad_row_anywhere_in_10000_prompts_the_other_9999_are_answered(tmp_path, monkeypatch):
    n, bad_at = 10_000, 6_543
    lines = [line(i) for i in range(n)]
    lines[bad_at] = line(bad_at)[:-1] + ', "tools": [{"function": {"x": Infinity}}]}'
    prompts = write_lines(tmp_path / "p.jsonl", lines)
    # A zero-latency endpoint in place of the HTTP exchange (the transport has its own tests):
    # this test is about rows, and 10,000 HTTP round trips would cost seconds of CPU.
    from specregen.client import engine
    from specregen.client.transport import AttemptResult

    sent: list[str] = []

    async def answer(client, cfg, body, key):
        sent.append(body["messages"][-1]["content"])
        return AttemptResult(status="ok", response=completion(usage=USAGE), latency_s=0.0,
                             http_status=200)

    monkeypatch.setattr(engine, "send", answer)
    out = tmp_path / "raw"
    result = CliRunner().invoke(app, ["infer", str(prompts), "--base-url",
                                      "http://127.0.0.1:9/v1", "--model", "m", "--out",
                                      str(out), "--concurrency", "64", "--no-stream"],
                                env={"OPENROUTER_API_KEY": None})
    assert result.exit_code == 0, result.output
    assert len(sent) == len(set(sent)) == n - 1 and f"q{bad_at}" not in sent
    assert len(finals(out)) == n - 1
    assert [r["line"] for r in RawLog(str(out)).iter_rejects()] == [bad_at + 1]


# -- 3. checks before paying ---------------------------------------------------------------------


def test_prompt_over_the_context_length_is_rejected_before_sending(server, counting, tmp_path):
    huge = json.dumps({"sample_id": "huge", "messages": [
        {"role": "user", "content": "word " * 300_000}]})  # 1.5 MB
    long = json.dumps({"sample_id": "long", "messages": [
        {"role": "user", "content": "word " * 3_000}]})
    prompts = write_lines(tmp_path / "p.jsonl", [line(0), huge, long, line(3)])
    result = infer(server, prompts, tmp_path / "raw", "--tokenizer", "mini",
                   "--max-context-tokens", "2000", "--format", "kimi-k2.5")
    assert result.exit_code == 0, result.output
    assert sorted(counting.per_sample) == ["q0", "q3"]
    rejects = {r["sample_id"]: r for r in RawLog(str(tmp_path / "raw")).iter_rejects()}
    assert rejects["huge"]["line"] == 2 and "cannot fit" in rejects["huge"]["reason"]
    assert rejects["long"]["line"] == 3 and "exceeds the context length of 2,000" in (
        rejects["long"]["reason"])


def test_context_limit_without_a_tokenizer_is_a_usage_error(server, counting, tmp_path,
                                                            monkeypatch):
    monkeypatch.delenv("KIMI_TOKENIZER_DIR", raising=False)
    prompts = write_lines(tmp_path / "p.jsonl", [line(0)])
    result = infer(server, prompts, tmp_path / "raw", "--max-context-tokens", "100",
                   "--format", "kimi-k2.5")
    assert result.exit_code == EXIT_USAGE, result.output
    assert "--tokenizer" in result.output and counting.total == 0
    # A model no format claims cannot be counted at all: the error names --format instead.
    result = infer(server, prompts, tmp_path / "raw2", "--max-context-tokens", "100",
                   "--tokenizer", "mini")
    assert result.exit_code == EXIT_USAGE, result.output
    assert "no chat format is known for model 'ok'" in result.output
    assert "--format" in result.output and counting.total == 0


def test_output_under_a_regular_file_fails_before_any_request(server, counting, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    prompts = write_lines(tmp_path / "p.jsonl", [line(i) for i in range(20)])
    result = infer(server, prompts, blocker / "raw")
    assert result.exit_code == EXIT_STORAGE, result.output
    assert "regular file in the way" in result.output
    assert "Traceback" not in result.output
    assert counting.total == 0


def test_read_only_output_fails_before_any_request(server, counting, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    mounted = False
    if os.geteuid() == 0:  # root writes through permissions: a read-only tmpfs instead
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(ro)],
                                 capture_output=True).returncode == 0
        if not mounted:
            pytest.skip("root without permission to mount a read-only tmpfs")
    else:
        ro.chmod(0o555)
    prompts = write_lines(tmp_path / "p.jsonl", [line(0)])
    try:
        result = infer(server, prompts, ro / "raw")
    finally:
        if mounted:
            subprocess.run(["umount", str(ro)], capture_output=True)
        else:
            ro.chmod(0o755)
    assert result.exit_code == EXIT_STORAGE, result.output
    assert ("read-only" in result.output or "permission denied" in result.output), result.output
    assert "Traceback" not in result.output
    assert counting.total == 0


@pytest.fixture
def fresh_s3fs():
    # fsspec caches filesystem instances by their arguments: one made by an earlier test (with a
    # moto server's credentials in the environment) would be reused and keep those credentials.
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    yield
    s3fs.S3FileSystem.clear_instance_cache()


def test_s3_output_without_credentials_is_one_line(server, counting, tmp_path, fresh_s3fs):
    prompts = write_lines(tmp_path / "p.jsonl", [line(0)])
    env = {
        "AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None, "AWS_SESSION_TOKEN": None,
        "AWS_PROFILE": None, "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_DEFAULT_REGION": "us-east-1",
    }
    result = infer(server, prompts, "s3://specregen-test-bucket/raw", env=env)
    assert result.exit_code == EXIT_STORAGE, result.output
    assert "no storage credentials" in result.output
    assert "NoCredentialsError" not in result.output and "Traceback" not in result.output
    assert counting.total == 0


def test_s3_prompts_without_credentials_is_one_line(server, counting, tmp_path, fresh_s3fs):
    env = {
        "AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None, "AWS_SESSION_TOKEN": None,
        "AWS_PROFILE": None, "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_DEFAULT_REGION": "us-east-1",
    }
    result = infer(server, "s3://specregen-test-bucket/prompts.jsonl", tmp_path / "raw", env=env)
    assert result.exit_code == EXIT_STORAGE, result.output
    assert "cannot read s3://" in result.output and "no storage credentials" in result.output
    assert "Traceback" not in result.output and counting.total == 0


def test_out_that_is_a_regular_file_fails_before_any_request(server, counting, tmp_path):
    out = tmp_path / "raw"
    out.write_text("not a folder")
    prompts = write_lines(tmp_path / "p.jsonl", [line(0)])
    result = infer(server, prompts, out)
    assert result.exit_code == EXIT_STORAGE, result.output
    assert "regular file in the way" in result.output and counting.total == 0


def test_missing_prompts_file_is_one_line_and_takes_no_lease(server, counting, tmp_path):
    result = infer(server, tmp_path / "nope.jsonl", tmp_path / "raw")
    assert result.exit_code == EXIT_USAGE, result.output
    assert "does not exist" in result.output
    assert not (tmp_path / "raw" / ".specregen-lease").exists()


# -- 4. secrets where a name belongs -------------------------------------------------------------


@pytest.mark.parametrize("secret", [
    "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345",
    "AKIAIOSFODNN7EXAMPLE",
    "sk-ant-api03-abcdefghijklmnop",
    "x9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3",
])
def test_a_key_given_as_api_key_env_is_refused_without_echo(server, counting, tmp_path, secret,
                                                            caplog):
    prompts = write_lines(tmp_path / "p.jsonl", [line(0)])
    result = infer(server, prompts, tmp_path / "raw", "--api-key-env", secret)
    assert result.exit_code == EXIT_USAGE, result.output
    assert "api_key_env" in result.output and "looks like a credential" in result.output
    assert secret not in result.output and secret not in caplog.text
    assert counting.total == 0
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


def test_a_key_given_as_api_key_secret_is_refused_without_echo(tmp_path, caplog):
    secret = "sk-or-v1-" + "0a1b2c3d4e5f" * 5
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        "storage: " + str(tmp_path / "store") + "\n"
        "endpoint: {base_url: 'http://127.0.0.1:9/v1', model: m}\n"
        f"api_key_secret: {secret}\n"
        "datasets: [{name: d, adapter: glaive, source: 'bundled:glaive'}]\n"
    )
    from specregen.config import ConfigError, load_config

    with pytest.raises(ConfigError) as info:
        load_config(config)
    assert "api_key_secret" in str(info.value) and secret not in str(info.value)
    result = CliRunner().invoke(app, ["run", "--config", str(config)])
    assert result.exit_code == EXIT_USAGE, result.output
    assert secret not in result.output and secret not in caplog.text
    for path in tmp_path.rglob("*"):
        if path.is_file() and path != config:
            assert secret.encode() not in path.read_bytes(), path


# -- 2. one writer per output --------------------------------------------------------------------


@pytest.mark.parametrize("wait", [False, True], ids=["stop", "wait"])
def test_two_infers_on_one_output_pay_each_sample_once(server, counting, tmp_path, wait):
    """A second `infer` on the same --out while the first runs (in another process): it stops
    naming the holder, or waits (--wait) and then finds everything final."""
    n = 200
    counting.reset(delay=0.03)
    prompts = write_lines(tmp_path / "p.jsonl", [line(i) for i in range(n)])
    out = tmp_path / "raw"
    args = ["infer", str(prompts), "--base-url", server.url, "--model", "ok", "--out",
            str(out), "--concurrency", "4", "--no-stream"]
    env = {k: v for k, v in os.environ.items() if k != "OPENROUTER_API_KEY"}
    first = subprocess.Popen([sys.executable, "-m", "specregen.cli", *args], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while counting.total < 8 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert first.poll() is None, "the first run ended before the second started"
        second = CliRunner().invoke(app, [*args, *(["--wait", "60"] if wait else [])],
                                    env={"OPENROUTER_API_KEY": None})
        _, first_err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, first_err[-2000:]
    if wait:
        assert second.exit_code == 0, second.output
        assert "skipped (already final)" in second.output
    else:
        assert second.exit_code == EXIT_BUSY, second.output
        assert f"pid {first.pid}" in second.output and "--wait" in second.output
        assert "Traceback" not in second.output
    assert set(counting.per_sample.values()) == {1}  # nobody paid twice
    assert len(counting.per_sample) == n
    assert len(finals(out)) == n


# -- 7. attempts per sample, partial failure, one line ------------------------------------------


def test_max_attempts_counts_attempts_of_earlier_runs(server, counting, tmp_path):
    """A killed run made 2 attempts at id0; with max_attempts 3 the rerun makes only one more,
    numbered 3, and it is final."""
    out = tmp_path / "raw"
    prompts = write_lines(tmp_path / "p.jsonl", [line(0)])
    from specregen.client.config import EndpointConfig
    from specregen.client.prompts import parse_prompt_line
    from specregen.client.request import build_request
    from specregen.wire.request import request_fingerprint

    counting.reset(fail=True)
    cfg = EndpointConfig.load({"base_url": server.url, "model": "ok", "stream": False})
    fp = request_fingerprint(build_request(parse_prompt_line(line(0)), cfg))

    async def seed():
        async with RawLog(str(out)) as log:
            for attempt in (1, 2):
                await log.append(AttemptRecord(sample_id="id0", fingerprint=fp, attempt=attempt,
                                               status="failed", final=False,
                                               error_class="server_error"))

    asyncio.run(seed())
    config = tmp_path / "endpoint.json"
    config.write_text(json.dumps({"retry": {"max_attempts": 3, "base_delay": 0.01,
                                            "max_delay": 0.01}}))
    result = infer(server, prompts, out, "--no-stream", "--config", str(config))
    assert result.exit_code == EXIT_PARTIAL, result.output
    assert counting.per_sample["q0"] == 1
    (final,) = finals(out)
    assert final["attempt"] == 3 and final["status"] == "failed"


def test_permanent_failures_exit_with_the_partial_code_then_retry_failed_recovers(
        server, counting, tmp_path):
    out = tmp_path / "raw"
    prompts = write_lines(tmp_path / "p.jsonl", [line(i) for i in range(3)])
    config = tmp_path / "endpoint.json"
    config.write_text(json.dumps({"retry": {"max_attempts": 2, "base_delay": 0.01}}))
    counting.reset(fail=True)
    result = infer(server, prompts, out, "--no-stream", "--config", str(config))
    assert result.exit_code == EXIT_PARTIAL, result.output
    assert "3 sample(s) failed permanently" in result.output and "--retry-failed" in result.output
    assert counting.total == 6
    # Still failing: a new round of max_attempts each, and still the partial code, never 0.
    counting.reset(fail=True)
    result = infer(server, prompts, out, "--no-stream", "--config", str(config), "--retry-failed")
    assert result.exit_code == EXIT_PARTIAL and counting.total == 6
    # The server is back: one --retry-failed answers every sample.
    counting.reset()
    result = infer(server, prompts, out, "--no-stream", "--config", str(config), "--retry-failed")
    assert result.exit_code == 0, result.output
    assert counting.total == 3
    assert {r["sample_id"] for r in finals(out) if r["status"] == "ok"} == {"id0", "id1", "id2"}


def test_internal_errors_are_one_line_and_debug_shows_the_traceback(server, counting, tmp_path,
                                                                    monkeypatch):
    from specregen.cli import infer as command

    def broken(*args, **kwargs):
        raise KeyError("boom")

    monkeypatch.setattr(command, "_run", broken)
    prompts = write_lines(tmp_path / "p.jsonl", [line(0)])
    args = ["infer", str(prompts), "--base-url", server.url, "--model", "m", "--out",
            str(tmp_path / "raw")]
    monkeypatch.delenv("SPECREGEN_DEBUG", raising=False)
    plain = CliRunner().invoke(app, args)
    assert plain.exit_code == 1
    assert "Traceback" not in plain.output
    assert "internal error: KeyError" in plain.output and "--debug" in plain.output
    debug = CliRunner().invoke(app, ["--debug", *args])
    monkeypatch.delenv("SPECREGEN_DEBUG", raising=False)
    assert debug.exit_code == 1 and "Traceback" in debug.output


def test_requests_waiting_out_a_backoff_do_not_hold_window_slots(tmp_path):
    """A sample answered 429 waits out its backoff (600 s here) in a queue, not in its slot:
    the slot sends another prompt at once, so `window` requests are in flight while samples
    wait (a slot held during the backoff would leave window - waiting). The server holds every
    request until the test answers it: order and state, not time (the waits only guard against
    a hang). The run is then stopped; the waiting samples are abandoned, their 429s logged."""
    window, n, waiting = 8, 100, 3
    server = GatedServer()
    rng = random.Random(5)
    stop: list[str] = []
    cfg = make_cfg(concurrency=window, timeouts=GATED_TIMEOUTS,
                   retry={"max_attempts": 3, "base_delay": 600.0, "max_delay": 600.0,
                          "jitter": False})  # longer than any wait of the test (HANG_S)
    log = RawLog(tmp_path)

    def sent(text):
        return sum(b["messages"][0]["content"] == text for b in server.bodies)

    async def answer_one(response=None):
        arrived = len(server.bodies)
        held = server.release(rng.randrange(1, len(server.held)), response)  # not the oldest
        body = await server.arrival(arrived, f"a new request after request {arrived}")
        new = body["messages"][0]["content"]
        assert len(server.bodies) == arrived + 1 and server.in_flight == window, server.state()
        return held.body["messages"][0]["content"], new

    async def steps():
        await server.until(lambda: server.in_flight == window, f"{window} requests in flight")
        backoff: list[str] = []
        for _ in range(waiting):
            text, new = await answer_one(
                json_response({"error": {"code": 429, "message": "slow down"}}, 429))
            backoff.append(text)
            # The slot went to another prompt (its first request), not to the retry.
            assert new not in backoff and sent(new) == 1, (new, backoff)
        # Answers go on while the samples wait: each slot is refilled, the window stays full,
        # and no retry is sent (its backoff is not over).
        for _ in range(2 * window):
            _, new = await answer_one()
            assert sent(new) == 1 and all(sent(text) == 1 for text in backoff), new
        stop.append("test done")

    async def main():
        async with log:
            return await gated_run(server, run_inference(
                make_prompts(n), cfg, log, api_key=None, transport=server.transport,
                should_stop=lambda: stop[0] if stop else None), steps)

    summary = asyncio.run(main())
    assert summary.stopped_reason == "test done"
    assert summary.retries == waiting and summary.peak_in_flight == window == server.peak
    rate_limited = [r for r in log.iter_records() if r["error_class"] == "rate_limited"]
    assert len(rate_limited) == waiting and not any(r["final"] for r in rate_limited)
