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


app.command(name="infer")(__import__("specregen.client.command", fromlist=["infer"]).infer)
app.command(name="gate")(__import__("specregen.gate_command", fromlist=["gate"]).gate)
app.command(name="probe")(__import__("specregen.probe", fromlist=["probe_command"]).probe_command)

app.command("emulator")(__import__("specregen.emulator.command", fromlist=["emulator"]).emulator)

if __name__ == "__main__":
    app()
