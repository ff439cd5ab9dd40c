"""The `specregen` command."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    name="specregen",
    help="Regenerate draft-model training data from Kimi K2.5, token-exact.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console(stderr=True)


@app.callback()
def _main() -> None:
    """Regenerate draft-model training data from Kimi K2.5, token-exact."""


@app.command()
def reconstruct(
    input_path: Annotated[
        str,
        typer.Argument(
            metavar="INPUT", help="JSONL of sample_id/request/response, or a raw log folder/URL"
        ),
    ],
    tokenizer: Annotated[
        str, typer.Option(help="'mini', a tokenizer folder, or a hub id like moonshotai/Kimi-K2.5")
    ],
    out: Annotated[Path, typer.Option(help="Output parquet file")],
    thinking: Annotated[
        bool, typer.Option(help="Thinking mode when the request does not say")
    ] = True,
    tools_format: Annotated[
        str, typer.Option(help="How tools are declared: typescript (K2.5) or json")
    ] = "typescript",
    hf_chat_template: Annotated[
        bool, typer.Option(help="Render prompts with the tokenizer folder's chat template")
    ] = False,
) -> None:
    """Rebuild token ids from requests and responses; one parquet row per input record."""
    from specregen.models.kimi_k25 import KimiK25
    from specregen.models.tokenizer import TokenizerError, load_tokenizer
    from specregen.reconstruct import ReconstructSummary, reconstruct_records
    from specregen.store.token_samples import write_token_samples

    if tools_format not in ("typescript", "json"):
        raise typer.BadParameter("must be 'typescript' or 'json'", param_hint="--tools-format")
    try:
        fmt = KimiK25(
            load_tokenizer(tokenizer),
            tools_format=tools_format,  # type: ignore[arg-type]
            use_hf_chat_template=hf_chat_template,
        )
    except TokenizerError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    try:
        records = open_reconstruct_input(input_path)
    except OSError as exc:
        console.print(f"[red]error:[/red] cannot read {input_path}: {exc}")
        raise typer.Exit(2) from None
    summary = ReconstructSummary()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with console.status("reconstructing") as status:

        def tracked():
            for sample in reconstruct_records(records, fmt, default_thinking=thinking):
                summary.add(sample)
                if summary.total % 1000 == 0:
                    status.update(f"reconstructing: {summary.total} samples")
                yield sample

        write_token_samples(tracked(), tmp)
    tmp.replace(out)
    print_reconstruct_summary(summary, out)


def open_reconstruct_input(source: str):
    """`(where, record)` pairs from a JSONL file, or the final results of a raw log folder."""
    import fsspec

    from specregen.store.rawlog import RawLog

    fs, path = fsspec.core.url_to_fs(source)
    if fs.isdir(path):
        log = RawLog(source)
        if not log.part_paths():
            raise OSError(f"{source} is a folder without raw log parts (part-*.jsonl)")
        return ((f"raw log record {r['sample_id']}", r) for r in log.iter_final_samples())
    handle = fs.open(path, "rt", encoding="utf-8", errors="replace")  # raises when missing

    def lines():
        with handle:
            for number, line in enumerate(handle, start=1):
                if line.strip():
                    yield f"line {number}", line

    return lines()


def print_reconstruct_summary(summary, out: Path) -> None:
    table = Table(title=f"{summary.total} samples -> {out}")
    table.add_column("what")
    table.add_column("value")
    table.add_column("count", justify="right")
    for name, counter in (
        ("status", summary.by_status),
        ("flag", summary.by_flag),
        ("reference", summary.by_reference),
    ):
        for key, count in sorted(counter.items()):
            table.add_row(name, key, str(count))
    table.add_row("tokens", "completion", str(summary.completion_tokens))
    Console().print(table)


@app.command()
def demo(
    out: Annotated[Path, typer.Option(help="Where the demo writes its data and server")] = Path(
        "out/demo"
    ),
    keep_server: Annotated[
        bool, typer.Option(help="Leave the Prefect server running for the UI")
    ] = False,
    port: Annotated[int, typer.Option(help="Port of the local Prefect server")] = 4200,
) -> None:
    """The whole pipeline on the bundled samples, against the built-in emulator, under Prefect."""
    from flows.demo import DemoError, run_demo

    try:
        results = run_demo(out, keep_server=keep_server, port=port, log=console.print)
    except DemoError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
    print_pipeline_results(results)
    if not results or any(r.get("outcome") not in ("published", "skipped") for r in results):
        raise typer.Exit(1)


@app.command()
def run(
    config: Annotated[Path, typer.Option(help="Pipeline YAML config")],
    dataset: Annotated[
        list[str] | None, typer.Option(help="Only these datasets (repeatable)")
    ] = None,
) -> None:
    """Run a pipeline config under Prefect (PREFECT_API_URL, or a temporary local server)."""
    import asyncio

    from flows.pipeline import DatasetsFailedError, pipeline_flow
    from specregen.config import ConfigError, load_config

    try:
        load_config(config)  # a wrong field fails here, before any request
    except ConfigError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    try:
        results = asyncio.run(pipeline_flow(str(config.resolve()), datasets=dataset or None))
    except DatasetsFailedError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(1) from None
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
    out = Console()
    out.print(table)
    for r in results:
        if r.get("outcome") == "skipped":
            out.print(f"{r.get('dataset')}: already published; skipped (nothing was requested)")
        elif r.get("published"):
            out.print(f"{r['dataset']}: published to {r['published']['path']}")
            out.print(f"{r['dataset']}: gate report {r.get('gate_report')}")


def _register_commands() -> None:
    from specregen.client.command import infer
    from specregen.emulator.command import emulator
    from specregen.gate_command import gate
    from specregen.probe import probe_command

    app.command(name="infer")(infer)
    app.command(name="gate")(gate)
    app.command(name="probe")(probe_command)
    app.command(name="emulator")(emulator)


_register_commands()

if __name__ == "__main__":
    app()
