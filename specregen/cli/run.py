"""`specregen demo` and `specregen run`: pipeline configs under Prefect (the flows).

The CLI is the top floor: it imports `flows` (inside the commands, where they run); no library
module does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from specregen.console import make_console

console = make_console(stderr=True)


def demo(
    out: Annotated[Path, typer.Option(help="Where the demo writes its data and server")] = Path(
        "out/demo"
    ),
    keep_server: Annotated[
        bool, typer.Option(help="Leave the Prefect server running for the UI")
    ] = False,
    port: Annotated[
        int, typer.Option(envvar="PREFECT_SERVER_API_PORT",
                          help="Port of the local Prefect server (infra/env.sh's variable)")
    ] = 4200,
) -> None:
    """The whole pipeline on the bundled samples, against the built-in emulator, under Prefect."""
    _pipeline_command("demo", lambda: _demo(out, keep_server, port))


def _demo(out: Path, keep_server: bool, port: int) -> list[dict]:
    from flows.demo import run_demo

    return run_demo(out, keep_server=keep_server, port=port, log=console.print)


def run(
    config: Annotated[Path, typer.Option(help="Pipeline YAML config")],
    dataset: Annotated[
        list[str] | None, typer.Option(help="Only these datasets (repeatable)")
    ] = None,
    wait: Annotated[
        float, typer.Option(help="Seconds to wait for another run of the same dataset and"
                            " storage to finish (default: stop at once, naming it)")
    ] = 0.0,
) -> None:
    """Run a pipeline config under Prefect (PREFECT_API_URL, or a temporary local server).

    Exit codes: 0 done; 2 bad config; 3 API key; 4 budget; 5 storage; 6 some datasets failed
    (their gate, or causes of different kinds); 7 another run holds a dataset. When every failed
    dataset failed for one kind of cause, that cause's code; the last line names each cause.
    """
    from specregen.progress import watching_stages

    def body() -> list[dict]:
        from flows.command import run_pipeline

        return run_pipeline(config, dataset or None, wait=wait, log=console.print)

    with watching_stages(console):  # live progress of the stages that report it
        _pipeline_command("run", body)


def _pipeline_command(command: str, body) -> None:
    from specregen.cli.checkout import prefect_side
    from specregen.errors import fail, user_errors

    with user_errors():
        prefect_side(command)  # the checkout's flows, or one line saying where to run from
        from flows.pipeline import DatasetsFailedError

        try:
            results = body()
        except DatasetsFailedError as exc:
            print_pipeline_results(exc.results)
            fail(exc)  # the last line: each failed dataset and its cause
    print_pipeline_results(results)


def print_pipeline_results(results: list[dict]) -> None:
    table = Table(title="datasets")
    for column in ("dataset", "outcome", "accepted", "quarantined", "cost USD"):
        table.add_column(column, overflow="fold")
    for r in results:
        gate = r.get("gate", {})
        table.add_row(
            str(r.get("dataset")), str(r.get("outcome")), str(gate.get("accepted", "-")),
            str(gate.get("quarantined", "-")), str(r.get("cost_usd", "-")),
        )
    out = make_console()
    out.print(table)
    for r in results:
        if r.get("outcome") == "skipped":
            out.print(f"{r.get('dataset')}: already published; skipped (nothing was requested)")
        elif r.get("published"):
            out.print(f"{r['dataset']}: published to {r['published']['path']}")
            out.print(f"{r['dataset']}: gate report {r.get('gate_report')}")
