"""`specregen reconstruct`: one parquet row per input line, bad lines as error rows."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
from typer.testing import CliRunner

from specregen.cli import app
from specregen.store.token_samples import read_token_samples

REQUEST = {
    "model": "moonshotai/kimi-k2.5",
    "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
}


def body(content: str, reasoning: str | None = "Greet back.") -> dict:
    message = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning"] = reasoning
    return {"choices": [{"message": message, "finish_reason": "stop"}], "usage": {}}


def write_input(path, mini_fmt) -> None:
    good = reconstruct_reference(mini_fmt)
    lines = [
        json.dumps({"sample_id": "a", "request": REQUEST, "response": body("Hello!")}),
        "{not json",
        json.dumps({"sample_id": "b", "request": REQUEST}),
        json.dumps({"sample_id": "c", "request": {**REQUEST, "reasoning": {"enabled": False}},
                    "response": body("Hey.", reasoning=None)}),
        json.dumps({"sample_id": "d", "request": REQUEST, "response": body("Hello!"),
                    "reference_completion_ids": good}),
        json.dumps({"request": REQUEST, "response": body("x")}),
        "",
        json.dumps({"sample_id": "e", "request": REQUEST, "response": body("Hi", None)}),
    ]
    path.write_text("\n".join(lines) + "\n")


def reconstruct_reference(fmt) -> list[int]:
    from specregen.reconstruct import reconstruct

    sample = reconstruct("a", REQUEST, body("Hello!"), fmt)
    return sample.input_ids[sample.prompt_len :]


def test_reconstruct_cli_writes_one_row_per_line(tmp_path, mini_fmt):
    src = tmp_path / "in.jsonl"
    write_input(src, mini_fmt)
    out = tmp_path / "out" / "tokens.parquet"
    result = CliRunner().invoke(
        app, ["reconstruct", str(src), "--tokenizer", "mini", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    rows = {s.sample_id: s for s in read_token_samples(out)}
    assert list(rows) == ["a", "line:2", "b", "c", "d", "line:6", "e"]
    assert rows["a"].status == "ok" and rows["a"].thinking is True
    assert rows["c"].status == "ok" and rows["c"].thinking is False
    assert rows["d"].reference_match == "exact"
    assert rows["e"].status == "flagged" and "reasoning_missing" in rows["e"].flags
    assert "not JSON" in rows["line:2"].error
    assert "response" in rows["b"].error and rows["b"].status == "error"
    assert "sample_id" in rows["line:6"].error
    assert set(pq.read_schema(out).names) >= {
        "sample_id", "input_ids", "loss_mask", "prompt_len", "completion_len", "status", "flags",
        "usage_prompt_delta", "usage_completion_delta", "reference_match", "error",
    }
    assert "exact" in result.output and "reasoning_missing" in result.output
    assert not (out.parent / "tokens.parquet.tmp").exists()


def test_no_thinking_flag_sets_the_default(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"sample_id": "a", "request": REQUEST,
                               "response": body("Hey.", reasoning=None)}) + "\n")
    out = tmp_path / "o.parquet"
    result = CliRunner().invoke(
        app, ["reconstruct", str(src), "--tokenizer", "mini", "--out", str(out), "--no-thinking"]
    )
    assert result.exit_code == 0, result.output
    (sample,) = read_token_samples(out)
    assert sample.thinking is False and sample.status == "ok"


def test_unreadable_input_exits_nonzero(tmp_path):
    result = CliRunner().invoke(
        app, ["reconstruct", str(tmp_path / "missing.jsonl"), "--tokenizer", "mini",
              "--out", str(tmp_path / "o.parquet")]
    )
    assert result.exit_code == 2
    assert "cannot read" in result.output


def test_bad_tokenizer_exits_nonzero(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("")
    result = CliRunner().invoke(
        app, ["reconstruct", str(src), "--tokenizer", str(tmp_path), "--out",
              str(tmp_path / "o.parquet")]
    )
    assert result.exit_code == 2 and "tiktoken.model" in result.output


# -- failures writing the output: one line, exit 5, no `*.tmp` left ------------------------------


def _no_tmp_left(folder) -> None:
    assert not [p for p in folder.rglob("*") if ".tmp" in p.name], list(folder.rglob("*"))


def test_out_under_a_regular_file_is_one_line_exit_5(tmp_path, mini_fmt):
    src = tmp_path / "in.jsonl"
    write_input(src, mini_fmt)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = CliRunner().invoke(
        app, ["reconstruct", str(src), "--tokenizer", "mini", "--out",
              str(blocker / "tokens.parquet")]
    )
    assert result.exit_code == 5, result.output
    assert "regular file in the way" in result.output
    assert "Traceback" not in result.output
    _no_tmp_left(tmp_path)


FULL_DISK = """
import resource, sys
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
from specregen.cli import app
sys.argv = ["specregen", "reconstruct", sys.argv[1], "--tokenizer", "mini", "--out", sys.argv[2]]
app()
"""


def test_full_disk_is_one_line_exit_5_and_no_tmp_left(tmp_path, mini_fmt):
    """A file size limit (RLIMIT_FSIZE: the write fails with EFBIG, like a full disk with
    ENOSPC) hit while writing the parquet."""
    import subprocess
    import sys

    src = tmp_path / "in.jsonl"
    lines = [json.dumps({"sample_id": f"s{i}", "request": REQUEST,
                         "response": body("Hello there! " * 20)}) for i in range(200)]
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out" / "tokens.parquet"
    done = subprocess.run([sys.executable, "-c", FULL_DISK, str(src), str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 5, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert "file size limit" in done.stderr or "no space left" in done.stderr
    assert not out.exists()
    _no_tmp_left(tmp_path)


def _mount_tmpfs(path, options: str) -> bool:
    import os
    import subprocess

    if os.geteuid() != 0:
        return False
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                          capture_output=True)
    return done.returncode == 0


def _umount(path) -> None:
    import subprocess

    subprocess.run(["umount", str(path)], capture_output=True)


def test_full_tmpfs_and_read_only_mount_are_one_line_exit_5(tmp_path, mini_fmt):
    """The real thing where the test may mount: a 64 KiB tmpfs (ENOSPC) and a read-only one."""
    import pytest

    src = tmp_path / "in.jsonl"
    import random

    rng = random.Random(1)  # incompressible text, so the parquet outgrows 64 KiB
    lines = [json.dumps({"sample_id": f"s{i}", "request": REQUEST,
                         "response": body(" ".join(str(rng.random()) for _ in range(20)))})
             for i in range(600)]
    src.write_text("\n".join(lines) + "\n")
    small, ro = tmp_path / "small", tmp_path / "ro"
    if not _mount_tmpfs(small, "size=64k"):
        pytest.skip("cannot mount a tmpfs here (not root, or no CAP_SYS_ADMIN)")
    try:
        full = CliRunner().invoke(
            app, ["reconstruct", str(src), "--tokenizer", "mini", "--out",
                  str(small / "tokens.parquet")])
        assert full.exit_code == 5, full.output
        assert "no space left" in full.output and "Traceback" not in full.output
        _no_tmp_left(small)
        assert _mount_tmpfs(ro, "ro,size=64k")
        try:
            read_only = CliRunner().invoke(
                app, ["reconstruct", str(src), "--tokenizer", "mini", "--out",
                      str(ro / "tokens.parquet")])
        finally:
            _umount(ro)
        assert read_only.exit_code == 5, read_only.output
        assert "read-only" in read_only.output and "Traceback" not in read_only.output
    finally:
        _umount(small)
