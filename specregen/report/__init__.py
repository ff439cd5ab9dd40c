"""The dataset report: distributions and counts of a gated dataset as one HTML page.

    data = read_gate_dir(Path("out/gate"), tok)        # or collect(...) from shard bytes
    html = render_report(data); rows = headline(data)

`stats` reads the gate's token shards into counters and length arrays, `build` finds the
inputs (report.json, shards, what inference spent), `html` and `svg` draw the page.
"""

from specregen.report.build import ReportData, collect, read_gate_dir, sum_inference
from specregen.report.html import headline, headline_rows, render_report
from specregen.report.stats import DatasetStats, ReportError

__all__ = [
    "DatasetStats",
    "ReportData",
    "ReportError",
    "collect",
    "headline",
    "headline_rows",
    "read_gate_dir",
    "render_report",
    "sum_inference",
]
