"""The dataset report: lengths by part (numpy) against the inspector's token walk, counters,
histograms, spend, the page, and `specregen report` / `specregen gate` writing report.html."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from typer.testing import CliRunner

from specregen.cli import app
from specregen.inspect.view import build_view
from specregen.models.kimi_k25 import KimiK25
from specregen.reconstruct import reconstruct
from specregen.report import collect, headline, render_report, sum_inference
from specregen.report.stats import DatasetStats, histogram
from specregen.store.token_samples import token_samples_bytes, write_token_samples
from tests.unit.test_inspect import REQUEST, response, text_sample, tool_sample


def truncated_in_reasoning(fmt, sample_id="cut"):
    message = {"reasoning": "Still thinking about the", "content": None}
    return reconstruct(sample_id, REQUEST, response(message, "length"), fmt)


def instant(fmt, sample_id="instant"):
    request = {**REQUEST, "chat_template_kwargs": {"thinking": False}}
    return reconstruct(sample_id, request, response({"content": "Sunny."}, "stop"), fmt)


def walk_lengths(sample, tok) -> tuple[int, int, int]:
    """Reasoning (without `</think>`), content and tool-section counts by the inspector."""
    view = build_view(sample, tok, markers=KimiK25.markers)
    parts = [t.part for t in view.completion]
    reasoning = sum(p == "reasoning" for p in parts)
    reasoning -= any(t.special == "</think>" for t in view.completion)
    section = sum(p in ("tool_markers", "tool_id", "tool_arguments") for p in parts)
    return reasoning, parts.count("content"), section


def test_lengths_by_part_agree_with_the_token_walk(fmt, tmp_path):
    samples = [tool_sample(fmt, "a"), text_sample(fmt, "b"), truncated_in_reasoning(fmt),
               instant(fmt), tool_sample(fmt, "e")]
    assert all(s.status != "error" for s in samples), [s.error for s in samples]
    path = tmp_path / "shard.parquet"
    write_token_samples(samples, path)
    stats = DatasetStats()
    stats.add_shard(path, "accepted", fmt.tok, "shard")
    got = list(zip(stats.length_array("reasoning"), stats.length_array("content"),
                   stats.length_array("tool_section"), strict=True))
    assert got == [walk_lengths(s, fmt.tok) for s in samples]
    assert got[2][0] > 0 and got[2][1] == 0  # cut off while reasoning: all of it is reasoning
    assert got[3][0] == 0 and got[3][1] > 0  # instant mode: no reasoning
    assert list(stats.length_array("completion")) == [s.completion_len for s in samples]
    assert stats.prompt_tokens == sum(s.prompt_len for s in samples)


def test_counters_from_accepted_and_quarantined_shards(mini_fmt, tmp_path):
    accepted = [tool_sample(mini_fmt, "a"), text_sample(mini_fmt, "b")]
    quarantined = [tool_sample(mini_fmt, "c"), truncated_in_reasoning(mini_fmt)]
    data = collect("ds", None, [
        ("accepted", _shard(tmp_path / "a.parquet", accepted), "a"),
        ("quarantined", _shard(tmp_path / "q.parquet", quarantined,
                               [["round_trip: x", "round_trip: y", "arguments_json: z"],
                                ["finish_reason: length"]]), "q"),
    ], mini_fmt.tok)
    s = data.stats
    assert (s.samples, s.accepted, s.quarantined) == (4, 2, 2)
    assert s.calls_per_sample == {2: 2, 0: 2}
    assert s.tools == {"get_weather": 4}
    assert s.finish_reasons == {"tool_calls": 2, "stop": 1, "length": 1}
    # Each check once per sample.
    assert s.quarantine_checks == {"round_trip": 1, "arguments_json": 1, "finish_reason": 1}
    assert "truncated" in s.flags


def _shard(path, samples, reasons=None):
    path.write_bytes(token_samples_bytes(samples, reasons))
    return path


def test_histogram_keeps_every_sample():
    values = np.concatenate([np.arange(1000), [10**6]])
    hist = histogram(values)
    assert sum(hist["counts"]) + hist["over"] == values.size
    assert hist["over"] >= 1 and hist["edges"][-1] < 10**6
    assert histogram(np.zeros(0, dtype=np.int64))["counts"] == []


def test_spend_sums_chunk_summaries():
    total = sum_inference([
        {"cost_usd": 0.5, "requests_sent": 10, "retries": 1, "errors": {"http_429": 2}},
        {"cost_usd": 0.25, "requests_sent": 5, "retries": 0, "errors": {"http_429": 1}},
    ])
    assert total["cost_usd"] == 0.75 and total["requests_sent"] == 15
    assert total["errors"] == {"http_429": 3} and total["chunks"] == 2
    assert sum_inference([]) is None


def test_page_is_self_contained_with_charts_and_headline(mini_fmt, tmp_path):
    gate = {"dataset": "ds", "verdict": "pass", "why": ["fine <b>"],
            "totals": {"samples": 2, "accepted": 2, "quarantined": 0, "samples_with_calls": 1,
                       "tool_calls": 2},
            "by_check": {"round_trip": 0},
            "by_tool": [{"name": "get_weather", "calls": 2, "quarantined": 0}],
            "tools_not_listed": {"tools": 0, "calls": 0, "quarantined": 0},
            "trigger_agreement": {"dataset_called": 4, "model_called": 3, "same_tool": 2,
                                  "same_arguments": 1, "dataset_text": 2, "model_text": 2,
                                  "no_reference": 0}}
    shard = _shard(tmp_path / "a.parquet", [tool_sample(mini_fmt), text_sample(mini_fmt)])
    data = collect("ds", gate, [("accepted", shard, "a")], mini_fmt.tok,
                   {"cost_usd": 0.02, "completion_tokens": 100})
    page = render_report(data)
    assert page.count("<svg") >= 8
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)
    assert "<script" not in page and "url(" not in page
    assert "fine &lt;b&gt;" in page
    assert "3 of 4" in page and "75.0%" in page  # trigger agreement
    rows = {r["what"]: r["value"] for r in headline(data)}
    assert rows["cost"] == "$0.0200" and rows["cost per 1,000 samples"] == "$10.0000"
    assert rows["accepted"] == "2 (100.0%)"


@pytest.fixture
def gate_out(tmp_path, mini_fmt):
    tokens = tmp_path / "tokens.parquet"
    write_token_samples([tool_sample(mini_fmt, f"t{i}") for i in range(3)]
                        + [text_sample(mini_fmt, f"x{i}") for i in range(3)], tokens)
    out = tmp_path / "gate"
    result = CliRunner().invoke(app, ["gate", str(tokens), "--out", str(out),
                                      "--max-quarantine-share", "1"])
    assert result.exit_code == 0, result.output
    return out


def test_gate_writes_report_html_beside_report_md(gate_out):
    page = (gate_out / "report.html").read_text()
    assert (gate_out / "report.md").is_file()
    assert "specregen report: tokens" in page and "<svg" in page
    assert "spend not recorded" in page


def test_report_command_adds_spend_from_a_raw_log(gate_out, tmp_path):
    rawlog = tmp_path / "raw"
    rawlog.mkdir()
    records = [{"sample_id": "t0", "final": False, "status": "retry", "cost_usd": 0.001},
               {"sample_id": "t0", "final": True, "status": "ok", "cost_usd": 0.002,
                "usage": {"prompt_tokens": 50, "completion_tokens": 20}}]
    (rawlog / "part-1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "r.html"
    result = CliRunner().invoke(app, ["report", str(gate_out), "--out", str(out),
                                      "--rawlog", str(rawlog)])
    assert result.exit_code == 0, result.output
    assert "cost: $0.0030" in result.output
    assert "requests sent" in out.read_text()
    bad = CliRunner().invoke(app, ["report", str(tmp_path / "nothing")])
    assert bad.exit_code == 2 and "no report.json" in bad.output


def test_stage_report_reads_shards_and_spend_from_pipeline_storage(mini_fmt, tmp_path):
    from types import SimpleNamespace

    from specregen.report.stage import inference_spend, stage_report
    from specregen.store.fs import Store
    from specregen.store.manifest import Shard

    store = Store(str(tmp_path / "store"))
    run = SimpleNamespace(store=store, name="ds", gate_fp="g1", prompts_fp="p1",
                          endpoint_fp="e1")
    shards = []
    for kind, samples in (("accepted", [tool_sample(mini_fmt, "a")]),
                          ("quarantined", [text_sample(mini_fmt, "b")])):
        data = token_samples_bytes(samples, [["round_trip: x"]] if kind == "quarantined"
                                   else None)
        digest = store.write_bytes(data, "ds", "gate", "g1", kind, "chunk-00000.parquet")
        shards.append(Shard(path=f"{kind}/chunk-00000.parquet", rows=1, sha256=digest))
    for chunk, cost in enumerate((0.25, 0.5)):
        store.write_json({"cost_usd": cost, "requests_sent": 3, "completion_tokens": 10},
                         "ds", "infer", "p1-e1", f"chunk-0000{chunk}.json")
    # Another endpoint's run of the same prompts is not this run's spend.
    store.write_json({"cost_usd": 99.0}, "ds", "infer", "p1-other", "chunk-00000.json")
    assert inference_spend(run)["cost_usd"] == 0.75
    data = stage_report(run, {"dataset": "ds", "totals": {"samples": 2}}, shards,
                        mini_fmt.tok)
    assert (data.stats.accepted, data.stats.quarantined) == (1, 1)
    assert data.stats.quarantine_checks == {"round_trip": 1}
    assert data.inference["requests_sent"] == 6
    assert "$0.7500" in render_report(data)
