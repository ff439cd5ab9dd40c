"""Small inline SVG charts: horizontal bars for counts, columns for a length histogram.

Plain strings, no JavaScript: each bar carries a <title> tooltip with its exact numbers, and the
numbers are also written beside the bars, so a chart reads at a glance and prints.
"""

from __future__ import annotations

from html import escape
from typing import Any

FONT = 'font-family="system-ui,sans-serif" font-size="12"'
COLORS = {"blue": "#4c8df6", "red": "#e5534b", "green": "#3fb950", "amber": "#d29922",
          "grey": "#8c959f"}


def _fmt(value: float) -> str:
    if value == int(value):
        return f"{int(value):,}"
    return f"{value:,.2f}"


def bars(
    rows: list[tuple[str, float]],
    *,
    total: float | None = None,
    color: str = "blue",
    width: int = 560,
    label_width: int = 210,
    colors: dict[str, str] | None = None,
) -> str:
    """One horizontal bar per (label, value); with `total`, the share is written too."""
    if not rows:
        return '<p class="none">none</p>'
    bar_h, gap = 18, 6
    height = len(rows) * (bar_h + gap) + gap
    top = max(v for _, v in rows) or 1
    room = width - label_width - 120
    parts = [f'<svg class="chart" role="img" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg" {FONT}>']
    for i, (label, value) in enumerate(rows):
        y = gap + i * (bar_h + gap)
        w = max(1.0, room * value / top) if value else 0
        share = f" ({value / total:.1%})" if total else ""
        fill = COLORS[(colors or {}).get(label, color)]
        short = label if len(label) <= 32 else label[:31] + "…"
        parts.append(
            f'<g><title>{escape(label)}: {_fmt(value)}{share}</title>'
            f'<text x="{label_width - 6}" y="{y + 13}" text-anchor="end">{escape(short)}</text>'
            f'<rect x="{label_width}" y="{y}" width="{w:.1f}" height="{bar_h}" rx="2" '
            f'fill="{fill}"/>'
            f'<text x="{label_width + w + 6:.1f}" y="{y + 13}">{_fmt(value)}{share}</text></g>')
    parts.append("</svg>")
    return "".join(parts)


def histogram(hist: dict[str, Any], *, width: int = 560, height: int = 150,
              color: str = "blue", unit: str = "tokens") -> str:
    """Columns of a histogram from `stats.histogram` (the last column: at and above p99)."""
    counts = list(hist.get("counts", []))
    edges = list(hist.get("edges", []))
    if not counts:
        return '<p class="none">no samples</p>'
    over = int(hist.get("over", 0))
    columns = [*counts, over]
    top = max(columns) or 1
    left, bottom, pad = 46, 22, 4
    plot_w = width - left - pad
    plot_h = height - bottom - pad
    step = plot_w / len(columns)
    parts = [f'<svg class="chart" role="img" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg" {FONT}>',
             f'<line x1="{left}" y1="{pad + plot_h}" x2="{width - pad}" y2="{pad + plot_h}" '
             'stroke="#8c959f"/>',
             f'<text x="{left - 4}" y="{pad + 10}" text-anchor="end">{top:,}</text>',
             f'<text x="{left - 4}" y="{pad + plot_h}" text-anchor="end">0</text>']
    for i, count in enumerate(columns):
        h = plot_h * count / top
        x = left + i * step
        if i < len(counts):
            what = f"{_fmt(edges[i])}–{_fmt(edges[i + 1])} {unit}"
            fill = COLORS[color]
        else:
            what = f"≥ {_fmt(edges[-1])} {unit} (above the 99th percentile)"
            fill = COLORS["grey"]
        parts.append(f'<rect x="{x + 0.5:.1f}" y="{pad + plot_h - h:.1f}" '
                     f'width="{max(1.0, step - 1):.1f}" height="{h:.1f}" fill="{fill}">'
                     f'<title>{escape(what)}: {count:,} samples</title></rect>')
    for i in (0, len(counts) // 2, len(counts)):
        x = left + i * step
        parts.append(f'<text x="{x:.1f}" y="{height - 6}" text-anchor="middle">'
                     f'{_fmt(edges[i])}</text>')
    parts.append("</svg>")
    return "".join(parts)
