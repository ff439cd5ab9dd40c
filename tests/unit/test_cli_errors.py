"""Failures a newcomer meets in the first hour, named by their cause (issue 21): a broken JSON
line at its real column (prompts, sources, reconstruct input), a prompts file whose every line
is rejected, and an unwritable gate output answered with the storage code like infer and run."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from specregen.cli import app
from specregen.errors import EXIT_STORAGE, EXIT_USAGE
from specregen.records import SourceReject
from specregen.sources import read_source

GOOD = json.dumps({"sample_id": "a", "messages": [{"role": "user", "content": "hi"}]})
CUT = GOOD[:-1]  # the closing brace lost: JSON ends at the end of the line
MISSING_COMMA = '{"sample_id": "b" "messages": []}'  # column 19 is where the comma belongs


def said(result) -> str:
    return " ".join(result.output.split())


def test_prompt_lines_are_reported_at_their_real_column(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join([GOOD, CUT, MISSING_COMMA]) + "\n")
    result = CliRunner().invoke(app, [
        "infer", str(prompts), "--out", str(tmp_path / "raw"), "--base-url",
        "http://127.0.0.1:9/v1", "--model", "moonshotai/kimi-k2.5", "--tokenizer", "mini",
        "--concurrency", "1"])
    text = said(result)
    assert f"line 2: not JSON (Expecting ',' delimiter at column {len(CUT) + 1})" in text
    assert "line 3: not JSON (Expecting ',' delimiter at column 19)" in text


def test_a_prompts_file_whose_every_line_is_rejected_fails_saying_why(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"id": f"x{i}", "messages": [
        {"role": "user", "content": "hi"}]}) for i in range(3)) + "\n")
    result = CliRunner().invoke(app, [
        "infer", str(prompts), "--out", str(tmp_path / "raw"), "--base-url",
        "http://127.0.0.1:9/v1", "--model", "moonshotai/kimi-k2.5", "--tokenizer", "mini"])
    assert result.exit_code == EXIT_USAGE, result.output
    text = said(result)
    assert "line 1: 'sample_id' is missing" in text
    assert f"every line of {prompts} was rejected (3 line(s)" in text
    assert "nothing was sent" in text and "Traceback" not in result.output


def test_source_and_reconstruct_lines_are_reported_at_their_real_column(tmp_path):
    source = tmp_path / "rows.jsonl"
    source.write_text('{"problem": "Sum.", "solution": "a + b"\n')
    (reject,) = read_source("magicoder", source, dataset="mc")
    assert isinstance(reject, SourceReject)
    # The line is 39 characters long: the comma (or brace) is missing just after its end.
    assert reject.reason.endswith("line is not valid JSON: Expecting ',' delimiter at column 40")

    records = tmp_path / "records.jsonl"
    cut = '{"sample_id": "s", "request": {}'
    records.write_text(cut + "\n")
    out = tmp_path / "tokens.parquet"
    result = CliRunner().invoke(app, ["reconstruct", str(records), "--tokenizer", "mini",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    import pyarrow.parquet as pq

    (row,) = pq.read_table(out, columns=["error"]).to_pylist()
    assert f"line 1 column {len(cut) + 1}" in row["error"], row  # not "line 2 column 1"


def test_gate_with_an_unwritable_out_answers_like_infer_and_run(tmp_path):
    """The storage code (5) and one line, as `infer` and `run` answer an unwritable output."""
    from tests.unit.test_gate import write_requests

    requests = tmp_path / "requests.jsonl"
    write_requests(requests, 4, 0)
    tokens = tmp_path / "tokens.parquet"
    built = CliRunner().invoke(app, ["reconstruct", str(requests), "--tokenizer", "mini",
                                     "--out", str(tokens)])
    assert built.exit_code == 0, built.output
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = CliRunner().invoke(app, ["gate", str(tokens), "--out", str(blocker / "gate")])
    assert result.exit_code == EXIT_STORAGE, result.output
    assert "regular file in the way" in said(result) and "Traceback" not in result.output
    infer = CliRunner().invoke(app, [
        "infer", str(tmp_path / "p.jsonl"), "--out", str(blocker / "raw"), "--base-url",
        "http://127.0.0.1:9/v1", "--model", "moonshotai/kimi-k2.5"])
    assert infer.exit_code == result.exit_code, infer.output
