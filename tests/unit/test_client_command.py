"""`specregen infer` against a real loopback server: exit codes, bad lines, resume, config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from typer.testing import CliRunner

from specregen.cli import app
from specregen.client.prompts import parse_prompt_line
from specregen.client.reach import is_loopback
from specregen.store.rawlog import RawLog
from tests.unit.test_client_support import SECRET_KEY, ThreadedApp, completion, sse, stream_of


class ChatState:
    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.auth: list[str | None] = []

    def reset(self) -> None:
        self.bodies.clear()
        self.auth.clear()


STATE = ChatState()
USAGE = {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7, "cost": 0.01}


async def chat(request: Request) -> Response:
    """Behaviour by model name: ok (default), unauthorized, echo (repeats the auth header)."""
    body = await request.json()
    auth = request.headers.get("authorization")
    STATE.bodies.append(body)
    STATE.auth.append(auth)
    model = body["model"]
    if model == "unauthorized":
        return JSONResponse({"error": {"code": 401, "message": "User not found."}}, 401)
    if model == "echo" and len(STATE.bodies) % 2:
        # A misbehaving server that quotes the credentials back in an error.
        return JSONResponse({"error": {"code": 500, "message": f"bad header {auth}"}}, 500)
    content = f"answer to {body['messages'][-1]['content']}"
    if model == "echo":
        content += f" (you sent {auth})"
    answer = completion(content, usage=USAGE)
    if body.get("stream"):
        return Response(
            sse([": OPENROUTER PROCESSING", "", *stream_of(answer)]), media_type="text/event-stream"
        )
    return JSONResponse(answer)


@pytest.fixture(scope="module")
def server():
    app_ = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    with ThreadedApp(app_) as running:
        yield running


@pytest.fixture
def state(server):
    STATE.reset()
    return STATE


def write_prompts(path: Path, n: int, bad: bool = False) -> Path:
    lines = [
        json.dumps({"sample_id": f"id{i}", "messages": [{"role": "user", "content": f"q{i}"}]})
        for i in range(n)
    ]
    if bad:
        lines.insert(1, "{broken json")
        lines.insert(3, json.dumps({"sample_id": "nomsg"}))
        lines.append(
            json.dumps(
                {
                    "sample_id": "t",
                    "messages": [{"role": "user", "content": "x"}],
                    "tool_mode": "sideways",
                }
            )
        )
    path.write_text("\n".join(lines) + "\n")
    return path


def invoke(args: list[str], env: dict[str, str | None] | None = None):
    env = {"OPENROUTER_API_KEY": SECRET_KEY, **(env or {})}
    return CliRunner().invoke(app, ["infer", *args], env=env, catch_exceptions=False)


def base_args(server, tmp_path, model="ok", prompts=None):
    prompts = prompts or write_prompts(tmp_path / "prompts.jsonl", 5)
    return [
        str(prompts),
        "--base-url",
        server.url,
        "--model",
        model,
        "--out",
        str(tmp_path / "raw"),
        "--concurrency",
        "3",
    ]


def test_infer_runs_reports_bad_lines_and_resumes(server, state, tmp_path):
    prompts = write_prompts(tmp_path / "p.jsonl", 5, bad=True)
    result = invoke(base_args(server, tmp_path, prompts=prompts))
    assert result.exit_code == 0, result.output
    assert "line 2: not JSON" in result.output
    assert "line 4: sample nomsg: 'messages' is missing" in result.output
    assert "'tool_mode' must be one of" in result.output
    assert len(state.bodies) == 5
    assert state.auth[0] == f"Bearer {SECRET_KEY}"
    log = RawLog(tmp_path / "raw")
    assert sorted(s for s, _ in log.final_index()) == [f"id{i}" for i in range(5)]

    state.reset()
    again = invoke(base_args(server, tmp_path, prompts=prompts))
    assert again.exit_code == 0, again.output
    assert state.bodies == []
    assert "skipped (already final)" in again.output


def test_infer_streams(server, state, tmp_path):
    result = invoke(
        [*base_args(server, tmp_path), "--stream", "--max-tokens", "64", "--no-thinking"]
    )
    assert result.exit_code == 0, result.output
    body = state.bodies[0]
    assert body["stream"] is True and body["max_tokens"] == 64
    assert body["reasoning"] == {"enabled": False}
    (sample, *_) = sorted(
        RawLog(tmp_path / "raw").iter_final_samples(), key=lambda s: s["sample_id"]
    )
    assert sample["response"]["choices"][0]["message"]["content"] == "answer to q0"


def test_fatal_api_error_exits_3_naming_the_variable(server, state, tmp_path):
    result = invoke(
        [*base_args(server, tmp_path, model="unauthorized"), "--api-key-env", "KIMI_KEY"],
        env={"KIMI_KEY": SECRET_KEY},
    )
    assert result.exit_code == 3, result.output
    assert "$KIMI_KEY" in result.output
    assert SECRET_KEY not in result.output
    assert len(state.bodies) <= 3


def test_budget_stop_exits_4(server, state, tmp_path):
    prompts = write_prompts(tmp_path / "p.jsonl", 40)
    result = invoke(
        [
            *base_args(server, tmp_path, prompts=prompts),
            "--budget-usd",
            "0.05",
            "--concurrency",
            "1",
        ]
    )
    assert result.exit_code == 4, result.output
    assert "budget" in result.output
    assert len(state.bodies) == 5


def test_missing_key_for_a_remote_endpoint_exits_3_before_anything(tmp_path):
    prompts = write_prompts(tmp_path / "p.jsonl", 1)
    result = invoke(
        [
            str(prompts),
            "--base-url",
            "https://openrouter.ai/api/v1",
            "--model",
            "m",
            "--out",
            str(tmp_path / "raw"),
        ],
        env={"OPENROUTER_API_KEY": None},
    )
    assert result.exit_code == 3  # authentication (README: exit codes)
    assert "OPENROUTER_API_KEY is not set" in result.output
    assert not (tmp_path / "raw").exists()


def test_missing_key_on_loopback_sends_no_key(server, state, tmp_path):
    result = invoke(base_args(server, tmp_path), env={"OPENROUTER_API_KEY": None})
    assert result.exit_code == 0, result.output
    assert state.auth and all(a is None for a in state.auth)


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--concurrency", "0"], "concurrency"),
        (["--dialect", "bedrock"], "dialect"),
        (["--max-tokens", "0"], "sampling.max_tokens"),
        (["--api-key-env", "sk-or-v1-abcdef"], "api_key_env"),
    ],
)
def test_bad_settings_exit_2_naming_the_field(server, tmp_path, extra, words):
    result = invoke([*base_args(server, tmp_path), *extra])
    assert result.exit_code == 2, result.output
    assert words in result.output
    assert "sk-or-v1-abcdef" not in result.output


def test_missing_prompts_file_exits_2(server, tmp_path):
    result = invoke(
        [
            str(tmp_path / "nope.jsonl"),
            "--base-url",
            server.url,
            "--model",
            "m",
            "--out",
            str(tmp_path / "raw"),
        ]
    )
    assert result.exit_code == 2
    assert "cannot read" in result.output


def test_config_file_supplies_routing_and_flags_win(server, state, tmp_path):
    config = tmp_path / "endpoint.yaml"
    config.write_text(
        "model: from-config\n"
        "provider: {order: [moonshotai], allow_fallbacks: false, enforce_distillable_text: true}\n"
        "reasoning: {effort: high}\n"
        "sampling: {temperature: 1.0}\n"
    )
    result = invoke([*base_args(server, tmp_path), "--config", str(config)])
    assert result.exit_code == 0, result.output
    body = state.bodies[0]
    assert body["model"] == "ok"  # the flag wins over the file
    assert body["provider"] == {
        "order": ["moonshotai"],
        "allow_fallbacks": False,
        "enforce_distillable_text": True,
    }
    assert body["reasoning"] == {"effort": "high"} and body["temperature"] == 1.0


def test_parse_prompt_line_and_loopback():
    prompt = parse_prompt_line(
        json.dumps(
            {
                "sample_id": "x",
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [{"type": "function", "function": {"name": "f"}}],
                "tool_mode": "system_prompt",
            }
        )
    )
    assert (prompt.sample_id, prompt.tool_mode, len(prompt.tools)) == ("x", "system_prompt", 1)
    assert is_loopback("http://127.0.0.1:8000/v1") and is_loopback("http://localhost/v1")
    assert is_loopback("http://[::1]:9/v1")
    assert not is_loopback("https://openrouter.ai/api/v1")
