"""`specregen reconstruct`: token ids from requests and responses, one parquet row each."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from specregen.console import make_console

console = make_console(stderr=True)


def reconstruct(
    input_path: Annotated[
        str,
        typer.Argument(
            metavar="INPUT", help="JSONL of sample_id/request/response, or a raw log folder/URL"
        ),
    ],
    tokenizer: Annotated[
        str, typer.Option(help="A bundled test tokenizer ('mini', ...), a folder, or a hub id")
    ],
    out: Annotated[Path, typer.Option(help="Output parquet file")],
    chat_format: Annotated[
        str | None, typer.Option("--format", help="Chat format (a registered name); default: "
                                 "from the first request's model")
    ] = None,
    thinking: Annotated[
        bool, typer.Option(help="Thinking mode when the request does not say")
    ] = True,
    tools_format: Annotated[
        str, typer.Option(help="How tools are declared: typescript (K2.5) or json")
    ] = "typescript",
    hf_chat_template: Annotated[
        bool, typer.Option(help="Render prompts with the tokenizer folder's chat template")
    ] = False,
    prompts: Annotated[
        Path | None,
        typer.Option(help="The prompts JSONL given to `specregen infer`: a raw log of whole "
                          "conversations (--turns all) needs it to walk their turns"),
    ] = None,
    provider_profile: Annotated[
        Path | None,
        typer.Option(help="`specregen probe` result for the endpoint: what its parsers and "
                          "detokenizer do to answers (without it, each is unknown)"),
    ] = None,
) -> None:
    """Rebuild token ids from requests and responses; one parquet row per input record, and
    per user turn reached of a whole conversation (with --prompts)."""
    from specregen.errors import user_errors

    with user_errors():
        _reconstruct(input_path, tokenizer, out, thinking, tools_format, hf_chat_template,
                     chat_format, prompts, provider_profile)


def _reconstruct(
    input_path: str, tokenizer: str, out: Path, thinking: bool, tools_format: str,
    hf_chat_template: bool, chat_format: str | None = None, prompts: Path | None = None,
    provider_profile: Path | None = None,
) -> None:
    from specregen.errors import storage_error
    from specregen.models.registry import get_format
    from specregen.models.tokenizer import TokenizerError, load_tokenizer
    from specregen.reconstruct import ReconstructSummary, reconstruct_records
    from specregen.store.fs import make_dirs
    from specregen.store.token_samples import token_file_meta, write_token_samples

    if tools_format not in ("typescript", "json"):
        raise typer.BadParameter("must be 'typescript' or 'json'", param_hint="--tools-format")
    try:
        records = open_reconstruct_input(input_path)
    except OSError as exc:
        console.print(f"[red]error:[/red] cannot read {input_path}: {exc}")
        raise typer.Exit(2) from None
    records, conversations = _split_conversations(input_path, records, prompts)
    first, records = _peek(records)
    if first is None and conversations is not None:
        first = next(iter(conversations[1].items()), None)
    name = format_name_for(chat_format, first)
    # Only the options a user changed reach the format: a format without them refuses them.
    options: dict[str, object] = {}
    if tools_format != "typescript":
        options["tools_format"] = tools_format
    if hf_chat_template:
        options["use_hf_chat_template"] = True
    try:
        fmt = get_format(name, load_tokenizer(tokenizer), **options)
    except TokenizerError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    except TypeError as exc:
        raise typer.BadParameter(f"the {name} format does not take this option ({exc})",
                                 param_hint="--tools-format/--hf-chat-template") from None
    traits = None
    if provider_profile is not None:
        from specregen.probe.model import load_profile

        traits = load_profile(provider_profile).traits()
    summary = ReconstructSummary()
    tmp = out.with_name(out.name + ".tmp")
    try:
        # Checked before the work: an output under a file or on a read-only disk fails now.
        make_dirs(out.parent)
        tmp.touch()
    except OSError as exc:
        raise storage_error(exc, str(out)) from None
    from specregen.progress import count_lines, live_progress

    try:
        with live_progress("reconstruct", count_lines(input_path), console=console) as progress:

            def tracked():
                import itertools

                samples = reconstruct_records(records, fmt, default_thinking=thinking,
                                              traits=traits)
                if conversations is not None:
                    from specregen.conversation.samples import iter_conversation_samples

                    plans, finals = conversations
                    samples = itertools.chain(samples, iter_conversation_samples(
                        plans, finals, fmt, default_thinking=thinking, traits=traits))
                for sample in samples:
                    summary.add(sample)
                    failed = sample.status == "error"
                    progress.advance(done=not failed, failed=failed,
                                     tokens=sample.completion_len)
                    yield sample

            write_token_samples(tracked(), tmp, token_file_meta(fmt, tokenizer))
        tmp.replace(out)
    except BaseException as exc:
        # Full disk, a kill, a bug: never leave the half-written file behind.
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise storage_error(exc, str(out)) from None
        raise
    print_reconstruct_summary(summary, out)


def _split_conversations(input_path: str, records, prompts: Path | None):
    """A raw log of whole conversations: its single-request records, and (the conversations'
    plans from `prompts`, their final records by request id); (records, None) otherwise."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(input_path)
    if not fs.isdir(path):
        return records, None
    from specregen.conversation.samples import conversation_finals, conversation_ids
    from specregen.errors import UsageError
    from specregen.store.rawlog import RawLog

    finals = conversation_finals(RawLog(input_path).iter_records())
    if not finals:
        return records, None
    wanted = conversation_ids(finals)
    if prompts is None:
        raise UsageError(f"{input_path} holds the requests of {len(wanted):,} whole "
                         "conversation(s) (`--turns all`); pass --prompts with the prompts "
                         "JSONL given to `specregen infer` so their turns can be walked")
    plans = _conversation_plans(prompts, wanted)
    singles = ((where, r) for where, r in records if r.get("sample_id") not in finals)
    return singles, (plans, finals)


def _conversation_plans(prompts: Path, wanted: list[str]) -> list:
    """The plans of the `wanted` conversations from the prompts file, in its line order."""
    from dataclasses import replace

    from specregen.client.prompts import PromptLineError, parse_prompt_line
    from specregen.conversation.plan import ConversationError, plan_conversation
    from specregen.errors import UsageError

    ids = set(wanted)
    plans = []
    try:
        handle = prompts.open(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {prompts}: {exc.strerror}") from None
    with handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                prompt = parse_prompt_line(line)
                if prompt.sample_id in ids:
                    ids.discard(prompt.sample_id)
                    plans.append(plan_conversation(replace(prompt, turns="all")))
            except (PromptLineError, ConversationError) as exc:
                raise UsageError(f"{prompts}:{number}: {exc}") from None
    if ids:
        missing = sorted(ids)
        raise UsageError(f"{prompts} has no line for conversation(s) "
                         f"{', '.join(map(repr, missing[:5]))}"
                         + (f" (+{len(missing) - 5} more)" if len(missing) > 5 else "")
                         + " whose requests are in the raw log")
    return plans


def _peek(records):
    """The first record and an iterator that still yields it."""
    import itertools

    iterator = iter(records)
    first = next(iterator, None)
    return first, (iterator if first is None else itertools.chain([first], iterator))


def format_name_for(chat_format: str | None, first: tuple[str, object] | None) -> str:
    """`--format`, else the format of the first request's `model`, else the default."""
    import json

    from specregen.models.registry import resolve_format_name

    model = None
    if chat_format is None and first is not None:
        record = first[1]
        if isinstance(record, str):
            try:
                record = json.loads(record)
            except json.JSONDecodeError:
                record = None
        request = record.get("request") if isinstance(record, dict) else None
        if isinstance(request, dict) and isinstance(request.get("model"), str):
            model = request["model"]
    return resolve_format_name(chat_format, model)


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
                    # Without its newline: a JSON error then names the column in the line.
                    yield f"line {number}", line.rstrip("\r\n")

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
    make_console().print(table)
