"""The dataset report of a 20,000-sample dataset: its size, and its render time in Chromium
against a minimal page loaded by the same browser in the same run.

    python bench/report.py [--samples 20000] [--distinct 2000] [--tokenizer DIR|mini]

Builds `--distinct` realistic samples as bench/gate.py does (bench/reconstruct.py's prompts and
answers, exact `usage`, `reconstruct`), repeats them under new ids up to `--samples`, runs the
gate over all of them and writes its output folder (accepted / quarantined shards, report.json),
then builds report.html with `specregen.report` and opens it in headless Chromium (Debian's
package) three times. Prints the page size (target < 2 MB), the build time, the load time
(navigation to the load event; target < 2 s) and its ratio to a minimal page's, and the first
contentful paint. The inspector's page of 500 of the samples is measured the same way.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.chromium import chromium
from specregen.gate import GateConfig, run_gate
from specregen.models.kimi_k25 import KimiK25
from specregen.models.tokenizer import load_tokenizer
from specregen.reconstruct import reconstruct
from specregen.report import read_gate_dir, render_report
from specregen.store.token_samples import token_samples_bytes


def _load(name: str):
    path = Path(__file__).resolve().with_name(f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_dataset(folder: Path, fmt: KimiK25, samples: int, distinct: int) -> float:
    """The gate's output folder for `samples` samples; returns the seconds it took."""
    start = time.perf_counter()
    pairs = _load("gate").with_exact_usage(_load("reconstruct").make_samples(distinct), fmt)
    built = [reconstruct(f"d{i}", req, resp, fmt) for i, (req, resp) in enumerate(pairs)]
    every = (dataclasses.replace(built[i % distinct], sample_id=f"s{i}") for i in range(samples))
    accepted, quarantined, reasons = [], [], []

    def on_quarantine(sample, decision):
        quarantined.append(sample)
        reasons.append(decision.reason_strings())

    report = run_gate(every, fmt, GateConfig(max_quarantine_share=1.0), dataset="bench",
                      on_accept=lambda s, _: accepted.append(s), on_quarantine=on_quarantine)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "accepted.parquet").write_bytes(token_samples_bytes(accepted))
    (folder / "quarantined.parquet").write_bytes(token_samples_bytes(quarantined, reasons))
    (folder / "report.json").write_text(report.to_json())
    return time.perf_counter() - start


def load_times(page: Path, repeat: int) -> tuple[list[float], list[float], list[str]]:
    """Seconds to the load event, and to the first contentful paint, per fresh browser."""
    loads, paints, problems = [], [], []
    for _ in range(repeat):
        with chromium() as tab:
            loads.append(tab.open(page))
            paint = tab.evaluate(
                "new Promise(r => { new PerformanceObserver(list => {"
                " const e = list.getEntriesByName('first-contentful-paint')[0];"
                " if (e) r(e.startTime); }).observe({type: 'paint', buffered: true});"
                " setTimeout(() => r(null), 5000); })")
            if paint is not None:
                paints.append(paint / 1000)
        problems += tab.problems.errors + tab.problems.requests
    return loads, paints, problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--distinct", type=int, default=2_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tokenizer", default=os.environ.get("KIMI_TOKENIZER_DIR") or "mini")
    args = parser.parse_args()

    tok = load_tokenizer(args.tokenizer)
    fmt = KimiK25(tok)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "gate"
        setup = build_dataset(folder, fmt, args.samples, min(args.distinct, args.samples))
        start = time.perf_counter()
        data = read_gate_dir(folder, tok)
        page = render_report(data)
        build = time.perf_counter() - start
        report_html = folder / "report.html"
        report_html.write_text(page, encoding="utf-8")
        blank = Path(tmp) / "blank.html"
        blank.write_text("<!DOCTYPE html><html><head><meta charset='utf-8'><title>b</title>"
                         "</head><body><p>blank</p></body></html>")

        from specregen.inspect.html import render_page
        from specregen.inspect.source import Selection, read_rows
        from specregen.inspect.view import build_view

        rows = read_rows(folder / "accepted.parquet", Selection(), 500)
        inspect_html = Path(tmp) / "inspect.html"
        inspect_html.write_text(render_page([build_view(r.sample, tok, markers=fmt.markers)
                                                 for r in rows], tok,
                                            title="bench", source="bench"), encoding="utf-8")

        blank_loads, _, _ = load_times(blank, args.repeat)
        loads, paints, problems = load_times(report_html, args.repeat)
        i_loads, i_paints, i_problems = load_times(inspect_html, args.repeat)
        size = report_html.stat().st_size
        i_size = inspect_html.stat().st_size

    base = statistics.median(blank_loads)
    print(f"tokenizer: {tok.name}  samples: {data.stats.samples:,} ({args.distinct:,} distinct)"
          f"  dataset built in {setup:.1f} s")
    print(f"report.html: {size / 1e6:.3f} MB  (target < 2 MB)   built in {build:.2f} s")
    print(f"report load (navigation -> load event), median of {args.repeat}: "
          f"{statistics.median(loads):.3f} s  (target < 2 s)   first contentful paint: "
          f"{statistics.median(paints) if paints else float('nan'):.3f} s")
    print(f"minimal page load, same browser: {base:.3f} s   ratio report / minimal: "
          f"{statistics.median(loads) / base:.2f}")
    print(f"inspect page of 500 samples: {i_size / 1e6:.3f} MB, load "
          f"{statistics.median(i_loads):.3f} s, first contentful paint "
          f"{statistics.median(i_paints) if i_paints else float('nan'):.3f} s")
    print(f"page problems (script errors, network requests): "
          f"{json.dumps(problems + i_problems) if problems or i_problems else 'none'}")


if __name__ == "__main__":
    main()
