"""`specregen report DIR`: the HTML dataset report of a gate output folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from specregen.console import make_console

console = make_console(stderr=True)


def report(
    folder: Annotated[
        Path, typer.Argument(metavar="DIR", help="Output of `specregen gate`, a pipeline gate "
                                                 "stage folder, or a dataset folder")
    ],
    out: Annotated[
        Path | None, typer.Option(help="Where to write the page (default: DIR/report.html)")
    ] = None,
    tokenizer: Annotated[
        str | None, typer.Option(help="Tokenizer when the shards record none: 'mini', a folder "
                                      "or a hub id")
    ] = None,
    rawlog: Annotated[
        Path | None, typer.Option(help="Raw log folder to count spend from (a pipeline's own "
                                       "infer summaries are found without it)")
    ] = None,
) -> None:
    """Write report.html: length distributions, finish reasons, flags, evidence, quarantine
    reasons, tool calls, trigger agreement, cost and tokens (inline SVG, no network).

    Exit code 0 when written, 2 when an input cannot be read.
    """
    from specregen.report import ReportError, headline, read_gate_dir, render_report
    from specregen.report.build import find_gate_dir, shard_files

    try:
        gate_dir = find_gate_dir(folder)
        files = shard_files(gate_dir)
        tok = resolve_tokenizer(files[0][1] if files else None, tokenizer)
        data = read_gate_dir(gate_dir, tok, rawlog)
        target = out or gate_dir / "report.html"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(render_report(data), encoding="utf-8")
    except ReportError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(2) from None
    except OSError as exc:
        console.print(f"[red]error:[/red] cannot write the report: {escape(str(exc))}",
                      soft_wrap=True)
        raise typer.Exit(2) from None
    for row in headline(data):
        console.print(f"  {row['what']}: {row['value']}", highlight=False)
    console.print(f"written: {escape(str(target))}", soft_wrap=True)


def resolve_tokenizer(shard: Path | None, given: str | None) -> Any:
    """The tokenizer the shard records, else the one given, else the bundled one when the ids
    are its own; None (lengths by part left out) when none of these can be had."""
    from specregen.inspect.source import InspectError, token_meta
    from specregen.models.tokenizer import TokenizerError, load_tokenizer
    from specregen.report.stats import ReportError
    from specregen.store.token_samples import TokenFileError, check_tokenizer_matches

    try:
        meta = token_meta(shard) if shard is not None else None
        spec = given or (meta.tokenizer if meta is not None else None)
        if spec is not None:
            tok = load_tokenizer(spec)
            if meta is not None:
                check_tokenizer_matches(meta, tok, shard)
            return tok
    except (InspectError, TokenizerError, TokenFileError) as exc:
        raise ReportError(str(exc)) from None
    tok = load_tokenizer("mini")
    return tok if shard is None or ids_are_its_own(shard, tok) else None


def ids_are_its_own(shard: Path, tok: Any) -> bool:
    """Whether the first prompt of the shard decodes and encodes back to itself."""
    import pyarrow.parquet as pq

    for batch in pq.ParquetFile(shard).iter_batches(batch_size=64,
                                                    columns=["input_ids", "prompt_len"]):
        for ids, prompt_len in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(),
                                   strict=True):
            if prompt_len:
                prompt = ids[:prompt_len]
                try:
                    return tok.encode_with_specials(tok.decode(prompt)) == prompt
                except (KeyError, ValueError):
                    return False
    return True
