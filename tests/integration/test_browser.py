"""The HTML pages as a person opens them: headless Chromium (Debian's package) over the DevTools
protocol, offline, with JavaScript errors and any network request failing the test, a click
through the sample list, and screenshots (set SPECREGEN_SCREENSHOTS=DIR to keep them)."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from bench.chromium import chromium, chromium_path
from specregen.cli import app
from specregen.inspect.terminal import render_sample
from specregen.inspect.view import build_view
from specregen.store.token_samples import write_token_samples
from tests.unit.test_inspect import text_sample, tool_sample

pytestmark = pytest.mark.integration

if chromium_path() is None:
    if os.environ.get("CI"):
        raise RuntimeError("CI must install Debian's chromium (scripts/setup.sh does)")
    pytest.skip("no chromium here (apt-get install chromium)", allow_module_level=True)


@pytest.fixture
def shots(tmp_path) -> Path:
    folder = Path(os.environ.get("SPECREGEN_SCREENSHOTS") or tmp_path / "shots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def check_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, path


def test_the_harness_catches_script_errors_and_network_requests(tmp_path):
    page = tmp_path / "broken.html"
    page.write_text('<html><body><img src="http://198.51.100.1/x.png">'
                    '<script>console.error("bad"); undefinedName();</script></body></html>')
    with chromium() as tab:
        tab.open(page)
        tab.evaluate("new Promise(r => setTimeout(r, 100))")
    assert any("undefinedName" in e for e in tab.problems.errors), tab.problems
    assert any("console.error" in e for e in tab.problems.errors), tab.problems
    assert tab.problems.requests == ["http://198.51.100.1/x.png"]


def test_inspect_page_works_offline_and_clicks_through(tmp_path, mini_fmt, shots):
    plain = text_sample(mini_fmt, "plain")
    changed = list(plain.input_ids[plain.prompt_len :])
    changed[3] = mini_fmt.tok.encode_ordinary(" zebra")[0]
    tokens = tmp_path / "tokens.parquet"
    write_token_samples([tool_sample(mini_fmt, "with-calls"), plain,
                         text_sample(mini_fmt, "differs", reference=changed)], tokens)
    refs = tmp_path / "refs.jsonl"
    refs.write_text(json.dumps({"sample_id": "differs", "reference_completion_ids": changed})
                    + "\n")
    page = tmp_path / "inspect.html"
    result = CliRunner().invoke(app, ["inspect", str(tokens), "--html", str(page),
                                      "--reference", str(refs), "--tokenizer", "mini"])
    assert result.exit_code == 0, result.output
    with chromium() as tab:
        tab.open(page)
        assert tab.evaluate("document.querySelectorAll('nav a').length") == 3
        first = tab.evaluate("document.getElementById('sample').innerText")
        assert "with-calls" in first and "tool call 1" in first
        assert "<|tool_call_argument_begin|>" in first
        tab.screenshot(shots / "inspect-tool-calls.png")
        tab.evaluate("document.querySelectorAll('nav a')[2].click()")
        shown = tab.evaluate("document.getElementById('sample').innerText")
        assert "first difference at completion token 3" in shown
        # Every token of the sample is a span (the prompt's head expands on a click).
        tab.evaluate("document.querySelector('#sample .more').click()")
        spans = tab.evaluate("document.querySelectorAll('#sample .toks .t').length")
        assert spans == len(plain.input_ids)
        assert tab.evaluate("document.querySelectorAll('#sample .toks .t.diff').length") == 1
        tab.evaluate("document.getElementById('filter').value = 'plain';"
                     "document.getElementById('filter').dispatchEvent(new Event('input'))")
        visible = tab.evaluate("[...document.querySelectorAll('nav a')]"
                               ".filter(a => a.style.display !== 'none').length")
        assert visible == 1
        tab.screenshot(shots / "inspect-difference.png")
    assert tab.problems.errors == [] and tab.problems.requests == []
    check_png(shots / "inspect-tool-calls.png")
    check_png(shots / "inspect-difference.png")


def test_report_page_renders_offline(tmp_path, mini_fmt, shots):
    tokens = tmp_path / "tokens.parquet"
    write_token_samples([tool_sample(mini_fmt, f"t{i}") for i in range(5)]
                        + [text_sample(mini_fmt, f"x{i}") for i in range(5)], tokens)
    out = tmp_path / "gate"
    result = CliRunner().invoke(app, ["gate", str(tokens), "--out", str(out),
                                      "--max-quarantine-share", "1"])
    assert result.exit_code == 0, result.output
    with chromium() as tab:
        seconds = tab.open(out / "report.html")
        charts = tab.evaluate("[...document.querySelectorAll('svg.chart')]"
                              ".filter(s => s.getBoundingClientRect().width > 100).length")
        assert charts >= 8
        tab.screenshot(shots / "report.png", full_page=True)
    assert tab.problems.errors == [] and tab.problems.requests == []
    assert seconds < 30  # a sanity bound; the 2 s target is measured by bench/report.py
    check_png(shots / "report.png")


def test_terminal_view_as_a_screenshot(tmp_path, mini_fmt, shots):
    # rich's recording of the terminal view, exported as HTML and looked at in the browser
    # (its SVG export would fetch a web font).
    view = build_view(tool_sample(mini_fmt), mini_fmt.tok, markers=mini_fmt.markers)
    console = Console(record=True, force_terminal=True, width=100, file=io.StringIO(),
                      color_system="truecolor")
    console.print(render_sample(view, mini_fmt.tok, prompt_tokens=24))
    page = tmp_path / "terminal.html"
    page.write_text(console.export_html(inline_styles=True))
    with chromium() as tab:
        tab.open(page, width=1000)
        tab.screenshot(shots / "terminal.png", full_page=True)
    assert tab.problems.errors == [] and tab.problems.requests == []
    check_png(shots / "terminal.png")


def test_every_artifact_shows_its_body_on_its_key_page(tmp_path, shots):
    """Issue 21: the Prefect UI's page of an artifact KEY (where the Artifacts list links)
    shows the body of every artifact a dataset run makes -- summary, gate report and tables,
    report link, probe, progress -- in both UI versions, on a server on any port."""
    import asyncio

    import yaml

    from flows.pipeline import pipeline_flow
    from flows.server import free_port, local_server, using_api
    from specregen.emulator.config import EmulatorConfig
    from specregen.emulator.server import serve_in_thread
    from tests.support import REPO, get_tokenizer

    config = yaml.safe_load((REPO / "configs" / "pipeline.yaml").read_text())
    config["datasets"] = [{**config["datasets"][0], "limit": 6}]  # B1_glaive: tool calls
    config["storage"] = str(tmp_path / "store")
    with serve_in_thread(EmulatorConfig(seed=4), get_tokenizer("mini")) as emulator, \
            local_server(port=free_port(), home=tmp_path / "prefect", ui=True,
                         log_file=tmp_path / "server.log", log=lambda line: None) as api:
        config["endpoint"]["base_url"] = emulator.openrouter_url
        path = tmp_path / "pipeline.yaml"
        path.write_text(yaml.safe_dump(config))
        with using_api(api):
            results = asyncio.run(pipeline_flow(str(path)))
            assert results[0]["outcome"] == "published", results
            artifacts = asyncio.run(_latest_artifacts())
        kinds = {a.type for a in artifacts}
        assert {"markdown", "table", "progress"} <= kinds, kinds
        # A link artifact is stored as markdown `[text](url)`: report.html's is among them.
        assert "b1-glaive-report-html" in {a.key for a in artifacts}
        base = api.removesuffix("/api")
        with chromium() as tab:
            for artifact in artifacts:
                expected = _body_text(artifact)
                for ui in ("", "/v2"):
                    tab.open(f"{base}{ui}/artifacts/key/{artifact.key}")
                    seen = tab.wait_for_text(expected[-1])
                    missing = [t for t in expected if t not in seen]
                    name = f"artifact-key{ui.replace('/', '-')}-{artifact.key}.png"
                    tab.screenshot(shots / name)
                    assert missing == [], (ui or "/v1", artifact.key, artifact.type, seen[:2000])


async def _latest_artifacts():
    from prefect.client.orchestration import get_client

    async with get_client() as client:
        found = await client.read_latest_artifacts()
    return [a for a in found if a.key]


def _body_text(artifact) -> list[str]:
    """Text of the artifact's BODY a reader must find on the page (not its key or time)."""
    data = artifact.data
    if artifact.type == "markdown":
        if data.startswith("["):  # a link artifact: its text
            return [data[1:data.index("](")]]
        heading = next(line for line in data.splitlines() if line.startswith("#"))
        return [heading.lstrip("#").strip()]
    if artifact.type == "table":
        rows = json.loads(data) if isinstance(data, str) else data
        return [str(column) for column in rows[0]] + [str(next(iter(rows[0].values())))]
    if artifact.type == "progress":
        return [artifact.description.split(":")[0]]
    raise AssertionError(f"an artifact type this test does not know: {artifact.type}")
