"""`specregen gate`: the tool-call correctness gate over the output of `specregen reconstruct`.

Kept out of the `specregen.gate` package so that importing the CLI does not import jsonschema and
pyarrow; everything heavy is imported when the command runs.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from specregen.console import make_console
from specregen.errors import EXIT_OK, EXIT_PARTIAL, UsageError, storage_error, user_errors

if TYPE_CHECKING:
    from specregen.records import Declaration, TokenSample

console = make_console(stderr=True)

OUTPUT_FILES = ("accepted.parquet", "quarantined.parquet", "report.json", "report.md",
                "report.html")


class GateInputError(UsageError):
    """An input the gate cannot read; the message says which file and why (exit code 2)."""


# Help texts go through rich markup (typer's rich mode), where "[default: ...]" is a tag and
# vanishes: the ones that name a default are escaped.
def gate(
    tokens: Annotated[
        Path, typer.Argument(metavar="TOKENS", help="Parquet written by `specregen reconstruct`")
    ],
    out: Annotated[Path, typer.Option(help="Folder for accepted/quarantined parquet + report")],
    max_quarantine_share: Annotated[
        float | None,
        typer.Option(min=0.0, max=1.0,
                     help=escape("Fail above this quarantined share [default: 0.02]")),
    ] = None,
    tokenizer: Annotated[
        str | None,
        typer.Option(help=escape("Tokenizer the ids were built with: 'mini', a folder or a hub "
                                 "id [default: the one the file records; 'mini' for older "
                                 "files]")),
    ] = None,
    dataset: Annotated[
        str | None, typer.Option(help=escape("Dataset name for the report [default: TOKENS' stem]"))
    ] = None,
    prompts: Annotated[
        Path | None,
        typer.Option(help="Prompts JSONL (sample_id, meta.reference_first_turn, "
                          "declared_tools) for trigger agreement with the dataset's own answers "
                          "and the functions each prompt declares"),
    ] = None,
    accept_truncated: Annotated[
        bool, typer.Option("--accept-truncated/--reject-truncated",
                           help="Accept samples cut off by the length limit")
    ] = True,
    allow_stop_with_calls: Annotated[
        bool, typer.Option(help="Tolerate finish_reason 'stop' on samples with tool calls")
    ] = False,
    min_evidence: Annotated[
        str | None,
        typer.Option(help=escape("Weakest evidence accepted: reference, usage_exact, "
                                 "usage_tolerated or none [default: usage_tolerated]")),
    ] = None,
    chat_format: Annotated[
        str | None,
        typer.Option("--format", help=escape("Chat format the ids were built with (a registered "
                                             "name) [default: the one the file records; the "
                                             "default format for older files]")),
    ] = None,
) -> None:
    """Check every sample's tool calls; write accepted/quarantined shards and the report.

    Exit code 0 when the dataset passes, 6 when it fails, 2 when an input cannot be read, 5
    when --out cannot be written (the codes of every command: docs/exit-codes.md).
    """
    from specregen.gate import GateConfig

    overrides: dict[str, Any] = {"accept_truncated": accept_truncated,
                                 "allow_stop_with_calls": allow_stop_with_calls}
    if max_quarantine_share is not None:
        overrides["max_quarantine_share"] = max_quarantine_share
    if min_evidence is not None:
        overrides["min_evidence"] = min_evidence
    try:
        config = GateConfig().override(overrides)
    except ValueError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(2) from None
    with user_errors():
        passed = _run(tokens, out, config, tokenizer, dataset or tokens.stem, prompts,
                      chat_format)
    # A failed gate is a run that finished with part of its data failing its check: the
    # code `specregen run` answers a failed gate with.
    raise typer.Exit(EXIT_OK if passed else EXIT_PARTIAL)


def _run(
    tokens: Path, out: Path, config: Any, tokenizer: str | None, dataset: str,
    prompts: Path | None, chat_format: str | None = None,
) -> bool:
    import pyarrow as pa

    from specregen.gate import run_gate
    from specregen.gate.declared import by_prompt
    from specregen.models.registry import DEFAULT_FORMAT, UnknownFormatError, get_format
    from specregen.models.tokenizer import TokenizerError, load_tokenizer
    from specregen.store.token_samples import (
        TokenFileError,
        check_tokenizer_matches,
        read_token_meta,
        read_token_samples,
    )

    _check_tokens_file(tokens)
    reference, stated = load_prompts(prompts) if prompts is not None else (None, {})
    by_id = by_prompt(stated)

    def declarations(sample: TokenSample) -> Declaration:
        # A prompt line's own statement, else (a line that states none, or no prompts file)
        # what the sample's request declares, read as such a line would be.
        found = by_id(sample)
        return found if found is not None else own_declaration(sample)
    try:
        meta = read_token_meta(tokens)
    except (TokenFileError, pa.ArrowException, OSError) as exc:
        raise GateInputError(str(exc)) from None
    # The file names the tokenizer its ids were built with; older files do not (then `mini`).
    spec = tokenizer or (meta.tokenizer if meta is not None else "mini")
    # Likewise the format (the gate renders no prompt: the format's options do not matter).
    recorded = meta.format.get("name") if meta is not None and isinstance(meta.format, dict) \
        else None
    try:
        fmt = get_format(chat_format or recorded or DEFAULT_FORMAT, load_tokenizer(spec))
    except UnknownFormatError as exc:
        raise GateInputError(str(exc)) from None
    except TokenizerError as exc:
        hint = "" if tokenizer or meta is None else (
            f" (the tokenizer {tokens} records; pass --tokenizer to load it from elsewhere)")
        raise GateInputError(f"{exc}{hint}") from None
    if meta is not None:
        try:
            check_tokenizer_matches(meta, fmt.tok, tokens)
        except TokenFileError as exc:
            raise GateInputError(str(exc)) from None
    else:
        _check_same_tokenizer(tokens, fmt)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise storage_error(exc, f"the output folder {out}") from None

    temps = {name: out / f".{name}.tmp" for name in OUTPUT_FILES}
    accepted = _Shard(temps["accepted.parquet"], with_reasons=False, meta=meta)
    quarantined = _Shard(temps["quarantined.parquet"], with_reasons=True, meta=meta)
    try:
        from specregen.progress import live_progress, parquet_rows

        with live_progress("gate", parquet_rows(tokens), console=console,
                           names=("accepted", "quarantined")) as progress:

            def samples():
                try:
                    yield from read_token_samples(tokens)
                except (pa.ArrowException, OSError, ValueError, TypeError) as exc:
                    raise GateInputError(f"cannot read {tokens}: {exc}") from None

            def on_accept(sample, _decision):
                accepted.add(sample, None)
                progress.advance(done=1, tokens=sample.completion_len)

            def on_quarantine(sample, decision):
                quarantined.add(sample, decision.reason_strings())
                progress.advance(failed=1, tokens=sample.completion_len)

            report = run_gate(
                samples(), fmt, config, dataset=dataset, reference=reference,
                on_accept=on_accept, on_quarantine=on_quarantine, declarations=declarations,
            )
            accepted.close()
            quarantined.close()
            temps["report.json"].write_text(report.to_json() + "\n", encoding="utf-8")
            temps["report.md"].write_text(report.to_markdown(), encoding="utf-8")
            temps["report.html"].write_text(_html_report(report, temps, fmt), encoding="utf-8")
    except (GateInputError, OSError) as exc:
        accepted.abort()
        quarantined.abort()
        for temp in temps.values():
            temp.unlink(missing_ok=True)
        if isinstance(exc, GateInputError):
            raise
        raise storage_error(exc, str(out)) from None
    for name, temp in temps.items():
        temp.replace(out / name)
    _print_summary(report, out)
    return report.passed


def _html_report(report: Any, temps: dict[str, Path], fmt: Any) -> str:
    """The HTML report (charts) from the shards just written."""
    from specregen.report import collect, render_report

    shards = [(kind, temps[f"{kind}.parquet"], f"{kind}.parquet")
              for kind in ("accepted", "quarantined")]
    data = collect(report.dataset, report.to_dict(), shards, fmt.tok)
    data.notes.insert(0, "spend not recorded by `specregen gate`: `specregen report DIR "
                         "--rawlog RAWLOG` adds it")
    return render_report(data)


def _check_tokens_file(tokens: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from specregen.store.token_samples import OPTIONAL_COLUMNS, SCHEMA

    if not tokens.is_file():
        raise GateInputError(f"{tokens}: no such file (give the parquet `specregen reconstruct` "
                             "wrote)")
    try:
        names = pq.read_schema(tokens).names
    except (pa.ArrowException, OSError) as exc:
        raise GateInputError(f"cannot read {tokens} as parquet: {exc}") from None
    missing = [name for name in SCHEMA.names if name not in names
               and name not in OPTIONAL_COLUMNS]
    if missing:
        raise GateInputError(f"{tokens} is not `specregen reconstruct` output: it lacks the "
                             f"column(s) {', '.join(missing)}")


def _check_same_tokenizer(tokens: Path, fmt: Any) -> None:
    """Refuse a tokenizer other than the one the ids were built with: every sample would
    otherwise fail its round trip, which reads as a reconstruction bug."""
    from specregen.store.token_samples import read_token_samples

    try:
        first = next((s for s in read_token_samples(tokens) if s.prompt_len), None)
    except (OSError, ValueError, TypeError) as exc:
        raise GateInputError(f"cannot read {tokens}: {exc}") from None
    if first is None:
        return
    prompt = first.input_ids[: first.prompt_len]
    try:
        same = fmt.tok.encode_with_specials(fmt.tok.decode(prompt)) == prompt
    except KeyError:
        same = False
    if not same:
        raise GateInputError(
            f"{tokens} was not built with tokenizer {fmt.tok.name!r} (the prompt ids of sample "
            f"{first.sample_id!r} do not decode and encode back to themselves); pass the "
            "--tokenizer that `specregen reconstruct` used"
        )


def load_prompts(path: Path) -> tuple[dict[str, dict[str, Any] | None], dict[str, Declaration]]:
    """From a prompts JSONL file: sample_id -> the dataset's own first answer, and sample_id ->
    the functions the line states its prompt declares (`declared_tools`, as the pipeline's
    prompt chunks hold them), for the lines that state them."""
    from specregen.records import Declaration

    reference: dict[str, dict[str, Any] | None] = {}
    declarations: dict[str, Declaration] = {}
    try:
        handle = path.open(encoding="utf-8")
    except OSError as exc:
        raise GateInputError(f"cannot read {path}: {exc.strerror}") from None
    with handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise GateInputError(f"{path}:{number}: not JSON ({exc.msg})") from None
            if not isinstance(row, dict) or not isinstance(row.get("sample_id"), str):
                raise GateInputError(f"{path}:{number}: not an object with a string sample_id")
            meta = row.get("meta")
            meta = meta if isinstance(meta, dict) else {}
            reference[row["sample_id"]] = _compact(meta.get("reference_first_turn"))
            if "declared_tools" in row:
                declarations[row["sample_id"]] = Declaration(
                    row["declared_tools"] or None, row.get("declaration_problem"))
    return reference, declarations


def own_declaration(sample: TokenSample) -> Declaration:
    """What a sample's own request declares (its tools, else those of a glaive-style system
    prompt): the rule for a prompt line that states nothing (specregen/sources/declared.py)."""
    from specregen.sources.declared import declared_by

    return declared_by(sample.tools, sample.messages)


def _compact(ref: Any) -> dict[str, Any] | None:
    # Text answers can be long and only their kind matters: keep 100k references small.
    if not isinstance(ref, dict):
        return None
    return {"kind": "text"} if ref.get("kind") == "text" else ref


class _Shard:
    """A parquet file written in row groups, with a `reasons` column for quarantined rows."""

    def __init__(self, path: Path, *, with_reasons: bool, meta: Any = None) -> None:
        from specregen.store.token_samples import META_KEY, QUARANTINE_SCHEMA, SCHEMA

        self.path = path
        self.schema = QUARANTINE_SCHEMA if with_reasons else SCHEMA
        if meta is not None:
            # The shards keep naming the tokenizer, for whoever reads them next.
            self.schema = self.schema.with_metadata({META_KEY: meta.to_bytes()})
        self.rows: list[dict[str, Any]] = []
        self.writer: Any = None
        self.closed = False

    def add(self, sample: Any, reasons: list[str] | None) -> None:
        from specregen.store.token_samples import ROW_GROUP_SIZE, to_row

        row = to_row(sample)
        if reasons is not None:
            row["reasons"] = reasons
        self.rows.append(row)
        if len(self.rows) >= ROW_GROUP_SIZE:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self.writer is None:
            self.writer = pq.ParquetWriter(self.path, self.schema)
        self.writer.write_table(pa.Table.from_pylist(self.rows, schema=self.schema))
        self.rows = []

    def abort(self) -> None:
        """Stop writing after a failure; the caller removes the partial file."""
        import pyarrow as pa

        self.closed = True
        self.rows = []
        if self.writer is not None:
            with contextlib.suppress(OSError, pa.ArrowException):
                self.writer.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.rows or self.writer is None:
            self._flush()  # an empty shard still gets a file with the schema
        self.writer.close()


def _print_summary(report: Any, out: Path) -> None:
    t = report.totals
    colour = "green" if report.passed else "red"
    console.print(f"[{colour}]{escape(report.dataset)}: {report.verdict.upper()}[/{colour}] — "
                  f"{t['accepted']:,} accepted, {t['quarantined']:,} quarantined of "
                  f"{t['samples']:,}", soft_wrap=True)
    for reason in report.why:
        console.print(f"  {escape(reason)}", soft_wrap=True)
    failing = {c: k for c, k in report.by_check.items() if k}
    if failing:
        console.print("  by check: " + ", ".join(f"{c} {k:,}" for c, k in failing.items()),
                      soft_wrap=True)
    console.print(escape(f"  written: {', '.join(str(out / name) for name in OUTPUT_FILES)}"),
                  soft_wrap=True)
