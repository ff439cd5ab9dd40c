"""The API key goes into the Authorization header and nowhere else: not into files, logs,
exceptions, reprs or CLI output, even when the server echoes it back."""

from __future__ import annotations

import asyncio
import logging
import pickle
from pathlib import Path

import pytest

from specregen.client.engine import FatalAPIError, run_inference
from specregen.client.secrets import ApiKey, BearerAuth, scrub_obj
from specregen.store.rawlog import RawLog
from tests.unit.test_client_command import invoke, write_prompts
from tests.unit.test_client_command import server as server  # fixture
from tests.unit.test_client_command import state as state  # fixture
from tests.unit.test_client_support import (
    SECRET_KEY,
    FakeServer,
    completion,
    json_response,
    make_cfg,
    make_prompts,
)


def files_containing(root: Path, needle: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


def test_api_key_object_never_shows_the_key():
    key = ApiKey(SECRET_KEY)
    for text in (repr(key), str(key), f"{key}", f"{key!r}", repr([key]), repr(BearerAuth(key))):
        assert SECRET_KEY not in text
    with pytest.raises(TypeError):
        pickle.dumps(key)
    assert key.reveal() == SECRET_KEY
    assert scrub_obj({"a": [f"x{SECRET_KEY}y"], SECRET_KEY: 1}, key) == {
        "a": ["x[redacted]y"],
        "[redacted]": 1,
    }


def test_engine_writes_and_logs_no_key_even_when_the_server_echoes_it(tmp_path, caplog):
    async def respond(request, body):
        auth = request.headers["authorization"]
        n = len(server.bodies)
        if body["messages"][0]["content"] == "q5":
            return json_response({"error": {"code": 401, "message": f"bad {auth}"}}, 401)
        if n % 2:
            return json_response(
                {"error": {"code": 500, "message": f"echo {auth}"}}, 500, {"x-debug": auth}
            )
        return json_response(completion(f"you sent {auth}", reasoning=auth))

    server = FakeServer(respond)
    log = RawLog(tmp_path / "raw")
    cfg = make_cfg(concurrency=2, retry={"max_attempts": 5})

    async def main():
        async with log:
            return await run_inference(
                make_prompts(8), cfg, log, api_key=SECRET_KEY, transport=server.transport
            )

    caplog.set_level(logging.DEBUG)
    with pytest.raises(FatalAPIError) as caught:
        asyncio.run(main())
    # The key did go out, in the header.
    assert all(h["authorization"] == f"Bearer {SECRET_KEY}" for h in server.headers)
    records = list(RawLog(tmp_path / "raw").iter_records())
    assert any("[redacted]" in (r.get("error_message") or "") for r in records)
    assert any(r.get("response") and "[redacted]" in str(r["response"]) for r in records)
    assert files_containing(tmp_path, SECRET_KEY) == []
    assert SECRET_KEY not in caplog.text
    exc = caught.value
    for text in (str(exc), repr(exc), repr(exc.summary), repr(vars(exc))):
        assert SECRET_KEY not in text
    assert "$OPENROUTER_API_KEY" in str(exc)


def test_cli_output_and_files_hold_no_key(server, state, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    prompts = write_prompts(tmp_path / "p.jsonl", 4)
    result = invoke(
        [
            str(prompts),
            "--base-url",
            server.url,
            "--model",
            "echo",
            "--out",
            str(tmp_path / "raw"),
            "--concurrency",
            "2",
            "--stream",
        ]
    )
    assert result.exit_code == 0, result.output
    assert state.auth[0] == f"Bearer {SECRET_KEY}"
    assert SECRET_KEY not in result.output
    assert SECRET_KEY not in caplog.text
    assert files_containing(tmp_path, SECRET_KEY) == []
    contents = [
        s["response"]["choices"][0]["message"]["content"]
        for s in RawLog(tmp_path / "raw").iter_final_samples()
    ]
    assert contents and all(c.endswith("(you sent Bearer [redacted])") for c in contents)

    fatal = invoke(
        [
            str(prompts),
            "--base-url",
            server.url,
            "--model",
            "unauthorized",
            "--out",
            str(tmp_path / "raw2"),
        ]
    )
    assert fatal.exit_code == 3
    assert SECRET_KEY not in fatal.output
    assert files_containing(tmp_path, SECRET_KEY) == []
