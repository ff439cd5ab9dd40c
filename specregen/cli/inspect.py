"""`specregen inspect`: a sample's tokens in the terminal, or a page of samples as HTML."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from specregen.console import make_console
from specregen.errors import EXIT_USAGE

console = make_console(stderr=True)

EXIT_BAD_INPUT = EXIT_USAGE
# A selection that matches nothing is the selection's problem; 1 is every command's "a bug".
EXIT_NO_MATCH = EXIT_USAGE


def inspect(
    tokens: Annotated[
        Path, typer.Argument(metavar="TOKENS", help="Token parquet (reconstruct output or a "
                                                    "gate shard)")
    ],
    sample: Annotated[str | None, typer.Option(help="Only this sample id")] = None,
    flag: Annotated[str | None, typer.Option(help="Only samples with this flag")] = None,
    status: Annotated[
        str | None, typer.Option(help="Only samples with this status: ok, flagged, error")
    ] = None,
    html: Annotated[
        Path | None, typer.Option(help="Write a self-contained HTML page of the matching "
                                       "samples here instead")
    ] = None,
    limit: Annotated[
        int | None, typer.Option(min=1, help="At most this many samples (default: 1 in the "
                                             "terminal, 500 in HTML)")
    ] = None,
    tokenizer: Annotated[
        str | None, typer.Option(help="Tokenizer when the file records none: 'mini', a folder "
                                      "or a hub id")
    ] = None,
    reference: Annotated[
        Path | None, typer.Option(help="The server's own ids: a raw log folder or a JSONL with "
                                       "reference_completion_ids (default: the raw log of the "
                                       "pipeline storage the file is in)")
    ] = None,
    full: Annotated[bool, typer.Option(help="Show every prompt and answer token")] = False,
) -> None:
    """Show samples token by token: boundaries, special and marker tokens by name, loss mask,
    reasoning / content / tool calls, flags, evidence, and the first difference from the
    server's own ids where they exist.

    Exit code 0 when something was shown, 2 on bad input or when no sample matched.
    """
    from specregen.inspect.source import InspectError, Selection

    if status is not None and status not in ("ok", "flagged", "error"):
        raise typer.BadParameter("must be ok, flagged or error", param_hint="--status")
    selection = Selection(sample=sample, flag=flag, status=status)
    try:
        shown = _run(tokens, selection, html, limit, tokenizer, reference, full)
    except InspectError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None
    if not shown:
        console.print(f"no sample in {escape(str(tokens))} matches {selection.describe()}")
        raise typer.Exit(EXIT_NO_MATCH)


def _run(tokens: Path, selection, html: Path | None, limit: int | None, tokenizer: str | None,
         reference: Path | None, full: bool) -> int:
    from specregen.inspect.source import (
        InspectError,
        find_rawlog,
        open_parquet,
        read_rows,
        reference_ids,
        token_meta,
    )
    from specregen.inspect.view import build_view
    from specregen.models.chat_format import FormatError
    from specregen.models.registry import DEFAULT_FORMAT, UnknownFormatError, get_format
    from specregen.models.tokenizer import TokenizerError, load_tokenizer
    from specregen.store.token_samples import TokenFileError, check_tokenizer_matches

    open_parquet(tokens)  # a missing or foreign file: said plainly, before anything else
    meta = token_meta(tokens)
    try:
        tok = load_tokenizer(tokenizer or (meta.tokenizer if meta is not None else "mini"))
        if meta is not None:
            check_tokenizer_matches(meta, tok, tokens)
        # The parts are laid out by the format the file records (older files: the default).
        recorded = meta.format.get("name") if meta is not None and isinstance(
            meta.format, dict) else None
        markers = get_format(recorded or DEFAULT_FORMAT, tok).markers
    except (TokenizerError, TokenFileError, FormatError, UnknownFormatError) as exc:
        raise InspectError(str(exc)) from None

    rows = list(read_rows(tokens, selection, limit or (500 if html else 1)))
    if not rows:
        return 0
    if meta is None and tokenizer is None:
        _check_guess(tokens, tok, rows)
    refs: dict[str, list[int]] = {r.sample.sample_id: r.reference_ids for r in rows
                                  if r.reference_ids is not None}
    note = ""
    source = reference or find_rawlog(tokens)
    missing = {r.sample.sample_id for r in rows} - set(refs)
    if source is not None and missing:
        refs.update(reference_ids(source, missing))
        note = f"the raw log ({source}) holds no ids the server returned for this sample"
    elif source is None:
        note = ("the parquet stores no reference ids and no raw log was found; pass "
                "--reference RAWLOG_FOLDER")
    views = [build_view(r.sample, tok, markers=markers, evidence=r.evidence, reasons=r.reasons,
                        reference_ids=refs.get(r.sample.sample_id), reference_note=note)
             for r in rows]
    if html is not None:
        from specregen.inspect.html import render_page

        page = render_page(views, tok, title=f"specregen inspect: {tokens.name}",
                           source=str(tokens))
        try:
            html.parent.mkdir(parents=True, exist_ok=True)
            html.write_text(page, encoding="utf-8")
        except OSError as exc:
            raise InspectError(f"cannot write {html}: {exc.strerror}") from None
        console.print(f"{len(views)} sample(s) -> {escape(str(html))}")
        return len(views)
    from specregen.inspect.terminal import render_sample

    out = Console()
    for view in views:
        out.print(render_sample(view, tok, prompt_tokens=0 if full else 48,
                                part_tokens=0 if full else 600))
    return len(views)


def _check_guess(tokens: Path, tok, rows) -> None:
    """Without a recorded tokenizer the bundled one is tried; a prompt that does not decode
    and encode back to itself means it is the wrong one, and nothing is shown."""
    from specregen.inspect.source import InspectError

    sample = next((r.sample for r in rows if r.sample.prompt_len), None)
    if sample is None:
        return
    prompt = sample.input_ids[: sample.prompt_len]
    try:
        same = tok.encode_with_specials(tok.decode(prompt)) == prompt
    except (KeyError, ValueError):
        same = False
    if not same:
        raise InspectError(f"{tokens} does not record its tokenizer and its ids are not the "
                           "bundled 'mini' one's; pass --tokenizer (the one `specregen "
                           "reconstruct` used: a folder or a hub id)")
