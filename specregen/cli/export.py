"""`specregen export`: trainer files from a publication made before they were published with it."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Annotated, Literal

import fsspec
import typer

from specregen.console import make_console
from specregen.errors import EXIT_USAGE, fail, storage_error
from specregen.export.context import LEGACY_FORMAT, context_from_metadata
from specregen.export.rows import ExportContext
from specregen.export.writer import EXPORT_NOTES, ExportKind, parquet_metadata, write_exports

console = make_console(stderr=True)
Target = Literal["speculators", "specforge", "messages"]
_KIND: dict[str, ExportKind] = {"speculators": "train", "specforge": "train",
                                "messages": "messages"}


def export(
    published_dir: Annotated[
        str, typer.Argument(metavar="PUBLISHED_DIR",
                            help="A published/<fingerprint> folder or URL (or published/: the "
                                 "newest)")
    ],
    to: Annotated[
        str,
        typer.Option(
            "--to",
            help="speculators or specforge: exact token rows (input_ids, loss_mask unshifted, "
                 "text, metadata), read by both trainers without tokenizing again. messages: "
                 "LOSSY text conversations that a trainer tokenizes again with its own chat "
                 "template, so its ids can differ from the published ones.",
        ),
    ],
    out: Annotated[
        Path | None, typer.Option(help="Output JSONL file (default: ./DATASET-KIND.jsonl)")
    ] = None,
    tokenizer: Annotated[
        str | None,
        typer.Option(help="Tokenizer for the review text and the messages check (default: the "
                          "one named in the publication's manifest)"),
    ] = None,
    template: Annotated[
        str,
        typer.Option(help="messages only: the chat template the check re-tokenizes through: "
                          "'ours' (specregen's template of the publication's chat format) or "
                          "a tokenizer folder with its own template"),
    ] = "ours",
) -> None:
    """Write the training rows of an existing publication; says which export loses exactness."""
    from specregen.export.check import check_messages
    from specregen.export.published import PublicationError, open_publication
    from specregen.models.registry import DEFAULT_FORMAT, get_format
    from specregen.models.tokenizer import TokenizerError, load_tokenizer
    from specregen.pipeline.layout import tokenizer_fingerprint
    from specregen.store.token_samples import read_token_samples

    if to not in _KIND:
        raise typer.BadParameter("must be speculators, specforge or messages", param_hint="--to")
    kind = _KIND[to]
    try:
        pub = open_publication(published_dir)
    except (PublicationError, OSError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    extra = pub.manifest.get("extra", {})
    spec = tokenizer or extra.get("tokenizer")
    if not spec:
        console.print("[red]error:[/red] the manifest names no tokenizer; pass --tokenizer")
        raise typer.Exit(2)
    try:
        tok = load_tokenizer(spec)
    except TokenizerError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    target = out or Path(f"{pub.dataset}-{kind}.jsonl")
    # The metadata the pipeline's own train.jsonl carries (pipeline/publish.py), the
    # tokenizer's fingerprint included.
    fallback = ExportContext(dataset=pub.dataset,
                             format=extra.get("format") or LEGACY_FORMAT, tokenizer=spec,
                             tokenizer_fingerprint=tokenizer_fingerprint(
                                 extra.get("tokenizer") or spec),
                             model=extra.get("model"))
    fs = fsspec.filesystem("file")
    target = target.resolve()
    try:
        entries = write_exports(
            fs, str(target.parent), pub.shards(), [kind],
            context=lambda s: context_from_metadata(parquet_metadata(s.parquet), fallback),
            decode=tok.decode, run_meta=pub.run_meta, names={kind: target.name},
        )
    except (PublicationError, ValueError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(EXIT_USAGE) from None
    except OSError as exc:
        fail(storage_error(exc, str(target)))
    console.print(f"{to}: {entries[0].rows} rows -> {target} (sha256 {entries[0].sha256})")
    console.print(f"{target.name}: {EXPORT_NOTES[kind]}")
    if kind != "messages":
        return
    # The publication names its chat format (older ones: the default).
    format_name = extra.get("format") or DEFAULT_FORMAT
    if template == "ours":
        fmt = get_format(format_name, tok)
        text, name = fmt.template_text(), f"specregen's {fmt.name} template"
    else:
        try:
            check_tok = load_tokenizer(template)
        except TokenizerError as exc:
            console.print(f"[red]error:[/red] --template: {exc}")
            raise typer.Exit(2) from None
        if not check_tok.chat_template:
            console.print(f"[red]error:[/red] --template: {template} has no chat template")
            raise typer.Exit(2)
        text, name = check_tok.chat_template, f"the template of {template}"
        fmt = get_format(format_name, check_tok)

    def samples():
        for shard in pub.shards():
            yield from read_token_samples(io.BytesIO(shard.parquet))

    report = check_messages(samples(), fmt, text, name)
    console.print(f"check: {report.summary()}")
    for example in report.examples:
        console.print(f"  {example}")
