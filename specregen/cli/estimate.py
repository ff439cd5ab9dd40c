"""`specregen estimate --config FILE`: the projected cost of a pipeline run
(specregen.pipeline.estimate), as a table."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from specregen.console import make_console
from specregen.errors import user_errors
from specregen.pipeline.estimate import DEFAULT_PILOT, DatasetEstimate, estimate_config


def estimate(
    config: Annotated[Path, typer.Option(help="The pipeline config (YAML)")],
    pilot: Annotated[int, typer.Option(min=0, help="Paid pilot requests per dataset")] = (
        DEFAULT_PILOT),
    dataset: Annotated[
        list[str] | None, typer.Option(help="Only these datasets (repeatable)")
    ] = None,
) -> None:
    """Count prompts and prompt tokens exactly, ask a small paid pilot, project the cost."""
    with user_errors():
        results = asyncio.run(estimate_config(str(config), pilot, dataset))
        print_estimates(results)


def print_estimates(results: list[DatasetEstimate]) -> None:
    table = Table(title="projected cost (USD)")
    for name in ("dataset", "prompts", "prompt tokens", "pilot", "completion p10/p50/p90",
                 "mean", "realtime", "batch"):
        table.add_column(name, justify="left" if name == "dataset" else "right",
                         no_wrap=name == "dataset")

    def usd(value: float | None) -> str:
        return "-" if value is None else f"{value:,.2f}"

    for r in results:
        table.add_row(r.dataset, f"{r.prompts:,}", f"{r.prompt_tokens:,}",
                      f"{r.pilot} conv." if r.conversations else str(r.pilot),
                      f"{r.completion_p10:g}/{r.completion_p50:g}/{r.completion_p90:g}",
                      f"{r.completion_mean:g}", usd(r.realtime_usd), usd(r.batch_usd))
    known = [r for r in results if r.realtime_usd is not None]
    if len(known) > 1:
        table.add_row("all", f"{sum(r.prompts for r in results):,}",
                      f"{sum(r.prompt_tokens for r in results):,}", "", "", "",
                      usd(sum(r.realtime_usd or 0 for r in known)),
                      usd(sum(r.batch_usd or 0 for r in known)))
    console = make_console()
    console.print(table)
    for r in results:
        if r.conversations:
            console.print(f"{r.dataset}: whole conversations -- prompt tokens are the first "
                          "requests'; the pilot's completion tokens and the projection are per "
                          "conversation (all its requests)", highlight=False)
    spent = sum(r.pilot_cost_usd for r in results)
    console.print(f"pilot spent ${spent:.4f}; its answers are in the raw logs and the run reuses"
                  " them", highlight=False)
