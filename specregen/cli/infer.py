"""`specregen infer`: send a JSONL of prompts to an endpoint, append every attempt to a raw log.

Before the first request: the options and config validate, the key is present, the output's
lease is taken (one writer per output; this also proves the output writable), and every line of
the prompts file is decoded, parsed, built, fingerprinted and checked against the context
length (specregen.client.preflight). A bad line is a reject (line and reason in the summary and
in the raw log's `rejects-*.jsonl`); the others are sent.

Exit codes (specregen.errors; docs/exit-codes.md): 0 every sample answered (rejected lines and
skipped samples aside), 1 internal error (a bug), 2 bad usage (options, config, prompts file,
every line rejected, tokenizer), 3 authentication (missing or refused key, no credits: the
message names the key's variable), 4 stopped by the budget, 5 storage (output not writable, raw
log failed, no storage credentials), 6 some samples failed permanently (rerun with
--retry-failed), 7 another writer holds the output, 9 the endpoint cannot be reached,
130 interrupted.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from specregen.cli.common import config_file
from specregen.client.prompts import TURNS, parse_prompt_line
from specregen.client.reach import is_loopback
from specregen.console import make_console
from specregen.errors import (
    EXIT_AUTH,
    EXIT_BUDGET,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PARTIAL,
    AuthError,
    UsageError,
    user_errors,
)
from specregen.records import Prompt

EXIT_FATAL = EXIT_AUTH

def infer(
    prompts: Annotated[
        str, typer.Argument(metavar="PROMPTS.jsonl", help="JSONL: sample_id, messages, tools?")
    ],
    out: Annotated[str, typer.Option(help="Raw log folder: a path or s3://bucket/prefix")],
    base_url: Annotated[str | None, typer.Option(help="e.g. https://openrouter.ai/api/v1")] = None,
    model: Annotated[
        str | None, typer.Option(help="The endpoint's model id (it names the format)")
    ] = None,
    dialect: Annotated[
        str | None, typer.Option(help="openrouter (default), vllm, sglang or moonshot")
    ] = None,
    concurrency: Annotated[int | None, typer.Option(help="Requests in flight at once")] = None,
    max_tokens: Annotated[int | None, typer.Option(help="Completion token limit")] = None,
    stream: Annotated[bool | None, typer.Option("--stream/--no-stream")] = None,
    budget_usd: Annotated[
        float | None, typer.Option(help="Stop starting requests at this spend (USD)")
    ] = None,
    api_key_env: Annotated[
        str | None,
        typer.Option(help="NAME of the variable holding the key [default: OPENROUTER_API_KEY]"),
    ] = None,
    return_token_ids: Annotated[
        bool | None, typer.Option("--return-token-ids", help="vLLM: ask for the token ids")
    ] = None,
    logprobs: Annotated[
        bool | None,
        typer.Option("--logprobs/--no-logprobs",
                     help="Ask for logprobs: the sampled tokens prove the rebuilt ids"),
    ] = None,
    retry_failed: Annotated[
        bool, typer.Option("--retry-failed", help="Request permanently failed samples again")
    ] = False,
    connections_per_client: Annotated[
        int | None, typer.Option(help="Connections per HTTP client shard [default: 25]")
    ] = None,
    rpm: Annotated[float | None, typer.Option(help="Requests-per-minute limit")] = None,
    thinking: Annotated[
        bool | None, typer.Option("--thinking/--no-thinking", help="Model thinking on or off")
    ] = None,
    chat_format: Annotated[
        str | None,
        typer.Option("--format", help="Chat format (a registered name): its thinking switch "
                                      "and prompt rendering [default: from --model]"),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(help="YAML/JSON endpoint config (provider routing, prices...); flags win"),
    ] = None,
    provider_profile: Annotated[
        Path | None,
        typer.Option(help="`specregen probe` result: refuse tool prompts it finds unrecoverable"),
    ] = None,
    tokenizer: Annotated[
        str | None,
        typer.Option(
            help="Tokenizer to check prompts against the context length ('mini', a folder, a"
            " hub id) [default: the folder the format's tokenizer variable names, if set]"
        ),
    ] = None,
    max_context_tokens: Annotated[
        int | None,
        typer.Option(help="Context length in tokens [default: the tokenizer's model_max_length]"),
    ] = None,
    wait: Annotated[
        float,
        typer.Option(help="Seconds to wait while another writer holds --out (0: stop at once)"),
    ] = 0.0,
    mode: Annotated[
        str | None,
        typer.Option(help="realtime (default) or batch: the provider's batch API at its price"),
    ] = None,
    turns: Annotated[
        str | None,
        typer.Option(help="all: every line is a whole conversation, each assistant turn"
                          " regenerated on the model's own answers [default: each line's"
                          " `turns`, else first]"),
    ] = None,
) -> None:
    """Request completions for every prompt without a final result in the raw log yet."""
    with user_errors():
        code = _infer(
            prompts, out, base_url=base_url, model=model, dialect=dialect,
            concurrency=concurrency, max_tokens=max_tokens, stream=stream,
            budget_usd=budget_usd, api_key_env=api_key_env, return_token_ids=return_token_ids,
            logprobs=logprobs, retry_failed=retry_failed,
            connections_per_client=connections_per_client, rpm=rpm,
            thinking=thinking, config=config, provider_profile=provider_profile,
            tokenizer=tokenizer, max_context_tokens=max_context_tokens, wait=wait, mode=mode,
            format=chat_format, turns=turns,
        )
    raise typer.Exit(code)


def _infer(prompts: str, out: str, **opts: Any) -> int:
    from specregen.client.config import EndpointConfig
    from specregen.client.secrets import ApiKey

    console = make_console(stderr=True)
    config = opts["config"]
    data = config_file(config, console) if config is not None else {}
    overrides = {
        "base_url": opts["base_url"],
        "model": opts["model"],
        "dialect": opts["dialect"],
        "concurrency": opts["concurrency"],
        "stream": opts["stream"],
        "budget_usd": opts["budget_usd"],
        "api_key_env": opts["api_key_env"],
        "return_token_ids": opts["return_token_ids"],
        "logprobs": opts.get("logprobs"),
        "connections_per_shard": opts["connections_per_client"],
        "requests_per_minute": opts["rpm"],
        "thinking": opts["thinking"],
        "max_context_tokens": opts["max_context_tokens"],
        "mode": opts.get("mode"),
        "format": opts.get("format"),
    }
    data.update({k: v for k, v in overrides.items() if v is not None})
    if opts["max_tokens"] is not None:
        data["sampling"] = {**(data.get("sampling") or {}), "max_tokens": opts["max_tokens"]}
    cfg = EndpointConfig.load(data)  # ConfigError: a UsageError naming each bad field
    turns = opts.get("turns")
    if turns is not None and turns not in TURNS:
        raise UsageError(f"--turns must be one of {', '.join(TURNS)}, not {turns!r}")
    if turns == "all" and cfg.mode == "batch":
        raise UsageError("--turns all cannot run in batch mode: each request of a conversation"
                         " waits for the answer before it", hint="use --mode realtime")

    key = ApiKey.from_env(cfg.api_key_env)
    if key is None and not is_loopback(cfg.base_url):
        raise AuthError(
            f"environment variable {cfg.api_key_env} is not set; it must hold the API key for"
            f" {cfg.base_url}",
            hint=f"export {cfg.api_key_env}=... or name another variable with --api-key-env",
        )
    if opts["provider_profile"] is not None:
        from specregen.probe import ProbeRefusal, check_run_against_profile

        try:
            check_run_against_profile(opts["provider_profile"], prompts, cfg)
        except ProbeRefusal as exc:
            raise UsageError(f"refused: {exc}") from None
    return _run(
        prompts, out, cfg, key, opts["retry_failed"], console,
        tokenizer=opts["tokenizer"], wait=opts["wait"], turns=turns,
    )


def _run(
    prompts_path: str,
    out: str,
    cfg: Any,
    key: Any,
    retry_failed: bool,
    console: Console,
    *,
    tokenizer: str | None = None,
    wait: float = 0.0,
    turns: str | None = None,
) -> int:
    from functools import partial

    from rich.markup import escape

    from specregen.client import loop as client_loop
    from specregen.client.engine import FatalAPIError, run_inference
    from specregen.client.preflight import context_check, preflight
    from specregen.errors import storage_error
    from specregen.store.lease import acquire_lease
    from specregen.store.rawlog import RawLog, commit_rolls

    _route_warnings(console)
    try:
        raw_log = RawLog(out, **commit_rolls(cfg.concurrency, cfg.requests_per_minute,
                                             cfg.log_commit_seconds))
    except (OSError, ValueError, ImportError) as exc:
        raise storage_error(exc, out, "use") from None
    # The lease writes into the output: an unwritable output (read-only, under a file, no
    # credentials) fails here, before anything is paid.
    lease = acquire_lease(out, wait=wait, what="specregen infer")
    try:
        check = context_check(cfg, tokenizer, cfg.max_context_tokens)
        checked = preflight(prompts_path, cfg, _first_request_check(check),
                            partial(parse_prompt_line, turns=turns))
        if any(p.turns == "all" for p in checked.prompts):
            if cfg.mode == "batch":
                raise UsageError("whole conversations (turns: all) cannot run in batch mode:"
                                 " each request waits for the answer before it",
                                 hint="use --mode realtime")
            # Each later request carries the model's answers in the format's history shape:
            # UnknownFormatError (a UsageError naming --format) for a model no format claims.
            from specregen.models.registry import resolve_format_name

            resolve_format_name(cfg.format, cfg.model)
        for reject in checked.rejects:
            where = f"line {reject.line}" if reject.line is not None else "prompt"
            # The reason quotes input text: escaped, so "[/x]" in a prompt is not Rich markup.
            console.print(
                f"[yellow]rejected[/yellow] {escape(prompts_path)} {where}:"
                f" {escape(reject.reason)}",
                highlight=False, markup=True,
            )
        # Live progress (done / in flight / failed, rates, spend and projection, time left) on
        # a terminal; one summary line per interval otherwise.
        from specregen.progress import engine_observer, live_progress

        whole = sum(p.turns == "all" for p in checked.prompts)
        if whole:
            # Whole conversations: progress counts conversations (a conversation is done when
            # it stopped; single prompts of the same file count one each); in flight counts
            # requests.
            done = "conversations done" if whole == len(checked.prompts) else "done"
            watch = live_progress("infer", len(checked.prompts), console=console,
                                  names=(done, "failed"))
        else:
            watch = live_progress("infer", len(checked.prompts), console=console)
        feed: Any = None

        async def main() -> Any:
            if cfg.mode == "batch":
                from specregen.client.batch import run_batch_inference

                async with raw_log:
                    return await run_batch_inference(
                        checked.prompts, cfg, raw_log, api_key=key,
                        progress=feed,
                        retry_failed=retry_failed, rejects=checked.rejects,
                        should_stop=lambda: "lease_lost" if lease.lost else None,
                    )
            async with raw_log:
                return await run_inference(
                    checked.prompts,
                    cfg,
                    raw_log,
                    api_key=key,
                    progress=feed,
                    retry_failed=retry_failed,
                    prompt_check=None,  # every prompt passed the preflight already
                    # A conversation's later requests grow: each is checked as it is built.
                    followup_check=check,
                    rejects=checked.rejects,
                    should_stop=lambda: "lease_lost" if lease.lost else None,
                    chat_format=check.fmt if check is not None else None,
                )

        code = EXIT_OK
        summary = None
        try:
            with watch as progress:
                feed = engine_observer(progress)
                # uvloop when installed (specregen.client.loop): cheaper per streamed event.
                summary = client_loop.run(main())
        except FatalAPIError as exc:
            summary = exc.summary
            code = EXIT_FATAL
            console.print(f"[red]fatal:[/red] {escape(str(exc))}", highlight=False)
        except KeyboardInterrupt:
            console.print(
                "[yellow]interrupted[/yellow]: finished results are in the raw log;"
                " run again to continue"
            )
            return EXIT_INTERRUPTED
    finally:
        lease.release()
    if summary is not None:
        _print_summary(summary, out)
        if code == EXIT_OK and checked.rejects and not checked.prompts:
            raise UsageError(
                f"every line of {prompts_path} was rejected ({len(checked.rejects)} line(s),"
                " each named above with its reason); nothing was sent",
                hint="each line must be a JSON object with 'sample_id' and 'messages'",
            )
        if code == EXIT_OK and summary.stopped_reason == "budget":
            console.print(f"[yellow]stopped:[/yellow] budget of ${cfg.budget_usd:g} reached")
            code = EXIT_BUDGET
        elif code == EXIT_OK and summary.stopped_reason == "lease_lost":
            raise _lease_lost(out)
        elif code == EXIT_OK and summary.failed:
            console.print(
                f"[yellow]partial:[/yellow] {summary.failed} sample(s) failed permanently; run"
                " again with --retry-failed to request them again",
                highlight=False,
            )
            code = EXIT_PARTIAL
    return code


def _cost_rows(summary: Any) -> list[tuple[str, Any]]:
    """The batch run's cost view: projected total and savings against realtime."""
    if getattr(summary, "mode", "realtime") != "batch":
        return []
    return [
        ("mode", "batch"),
        ("batches submitted / recovered", f"{summary.batches_submitted} /"
                                          f" {summary.batches_recovered}"),
        ("batches finished / open", f"{summary.batches_finished} / {summary.batches_open}"),
        ("sent realtime (fallback)", summary.sent_realtime),
        ("spent USD (this output, every run)", f"{summary.spent_total_usd:.4f}"),
        ("projected total USD", f"{summary.projected_total_usd:.4f}"),
        ("same answers realtime USD", f"{summary.realtime_equivalent_total_usd:.4f}"),
        ("savings vs realtime USD", f"{summary.savings_total_usd:.4f}"),
    ]


def _first_request_check(check: Any) -> Any:
    """The context check of a whole conversation is its first request's (the body's messages);
    the engine checks each later request when it is built."""
    if check is None:
        return None

    def first(prompt: Prompt, body: dict[str, Any]) -> str | None:
        if prompt.turns == "all":
            from dataclasses import replace

            prompt = replace(prompt, messages=body["messages"], turns="first")
        return check(prompt, body)

    return first


def _conversation_rows(summary: Any) -> list[tuple[str, Any]]:
    """Whole conversations: how many, and how each ended (the counts above are requests)."""
    if not getattr(summary, "conversations", 0):
        return []
    from specregen.conversation.plan import STOP_REASONS

    stops = summary.conversation_stops
    rows: list[tuple[str, Any]] = [("conversations", summary.conversations)]
    # The order (`end` first), then any other reason a newer log holds.
    for reason in [*STOP_REASONS, *sorted(set(stops) - set(STOP_REASONS))]:
        if stops.get(reason):
            rows.append((f"  {STOP_LABELS.get(reason, reason)}", stops[reason]))
    if summary.conversations_open:
        rows.append(("  left open (run again to continue)",
                     summary.conversations_open))
    return rows


# How `specregen infer` names each stop reason in its summary (the reason itself stays visible:
# it is the `stop_reason` column of the samples).
STOP_LABELS = {
    "end": "end (regenerated to the end)",
    "length": "length (cut, or outgrew the context)",
    "error": "error (a request failed)",
}


def _lease_lost(out: str) -> Exception:
    from specregen.errors import OutputBusyError

    return OutputBusyError(
        f"another writer took over {out} during the run; finished results are in the raw log",
        hint="make sure only one run writes to this output, then run again",
    )


def _route_warnings(console: Console) -> None:
    from specregen.console import log_handler

    logger = logging.getLogger("specregen")
    if not logger.handlers:
        handler = log_handler(console)
        handler.setLevel(logging.WARNING)
        logger.addHandler(handler)


def _print_summary(summary: Any, out: str) -> None:
    table = Table(title=f"inference -> {out}")
    table.add_column("what")
    table.add_column("value", justify="right")
    # With whole conversations every count up to the cost is of requests (a conversation is
    # several); the conversations' outcomes follow.
    unit = "requests " if getattr(summary, "conversations", 0) else ""
    rows = [
        (f"{unit}ok", summary.ok),
        (f"{unit}truncated (length)", summary.truncated),
        (f"{unit}failed permanently", summary.failed),
        (f"{unit}skipped (already final)", summary.skipped),
        ("duplicate sample ids", summary.duplicates),
        ("rejected (not sent)", summary.rejected),
        ("abandoned (stopped)", summary.abandoned),
        ("requests sent", summary.requests_sent),
        ("retries", summary.retries),
        ("prompt tokens", summary.prompt_tokens),
        ("completion tokens", summary.completion_tokens),
        ("cost USD", f"{summary.cost_usd:.4f}"),
        *_cost_rows(summary),
        *_conversation_rows(summary),
        ("wall s", f"{summary.wall_s:.1f}"),
        ("mean in flight", f"{summary.mean_in_flight:.1f}"),
        ("mean in flight, input left", f"{summary.mean_in_flight_input:.1f}"),
    ]
    for name, value in rows:
        table.add_row(name, str(value))
    for name, count in sorted(summary.errors.items()):
        table.add_row(f"error: {name}", str(count))
    if summary.stopped_reason:
        table.add_row("stopped", summary.stopped_reason)
    make_console().print(table)
