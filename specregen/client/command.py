"""`specregen infer`: send a JSONL of prompts to an endpoint, append every attempt to a raw log.

Exit codes: 0 the run completed (permanently failed samples included; the summary counts them),
2 bad usage (options, config, prompts file, missing key for a remote endpoint), 3 a fatal API
error (bad key, no credits: the message names the key's variable), 4 stopped by the budget,
130 interrupted.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from specregen.records import Prompt

EXIT_USAGE = 2
EXIT_FATAL = 3
EXIT_BUDGET = 4
EXIT_INTERRUPTED = 130

TOOL_MODES = ("tools", "system_prompt")


class PromptLineError(ValueError):
    """A prompts-file line that is not a usable prompt; the message says why."""


def parse_prompt_line(line: str) -> Prompt:
    """One Prompt from a JSONL line `{sample_id, messages, tools?, tool_mode?, meta?}`."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise PromptLineError(f"not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(row, dict):
        raise PromptLineError(f"a JSON {type(row).__name__}, not an object")
    sample_id = row.get("sample_id")
    if not isinstance(sample_id, str) or not sample_id.strip():
        raise PromptLineError("'sample_id' is missing or not a non-empty string")
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages:
        raise PromptLineError(f"sample {sample_id}: 'messages' is missing or not a non-empty list")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise PromptLineError(f"sample {sample_id}: messages[{i}] has no string 'role'")
    tools = row.get("tools")
    if tools is not None and not (
        isinstance(tools, list) and all(isinstance(t, dict) for t in tools)
    ):
        raise PromptLineError(f"sample {sample_id}: 'tools' is not a list of objects")
    tool_mode = row.get("tool_mode") or "tools"
    if tool_mode not in TOOL_MODES:
        raise PromptLineError(
            f"sample {sample_id}: 'tool_mode' must be one of {', '.join(TOOL_MODES)}"
        )
    meta = row.get("meta") or {}
    if not isinstance(meta, dict):
        raise PromptLineError(f"sample {sample_id}: 'meta' is not an object")
    return Prompt(
        sample_id=sample_id, messages=messages, tools=tools or None, tool_mode=tool_mode, meta=meta
    )


def read_prompts(handle: Any, report: Callable[[int, str], None]) -> Iterator[Prompt]:
    """Prompts of an open text file, lazily; a bad line goes to `report(line_no, reason)`."""
    for number, line in enumerate(handle, start=1):
        if not line.strip():
            continue
        try:
            yield parse_prompt_line(line)
        except PromptLineError as exc:
            report(number, str(exc))


def is_loopback(url: str) -> bool:
    import httpx

    try:
        host = httpx.URL(url).host
    except httpx.InvalidURL:
        return False
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def infer(
    prompts: Annotated[
        str, typer.Argument(metavar="PROMPTS.jsonl", help="JSONL: sample_id, messages, tools?")
    ],
    out: Annotated[str, typer.Option(help="Raw log folder: a path or s3://bucket/prefix")],
    base_url: Annotated[str | None, typer.Option(help="e.g. https://openrouter.ai/api/v1")] = None,
    model: Annotated[str | None, typer.Option(help="e.g. moonshotai/kimi-k2.5")] = None,
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
    retry_failed: Annotated[
        bool, typer.Option("--retry-failed", help="Request permanently failed samples again")
    ] = False,
    connections_per_client: Annotated[
        int | None, typer.Option(help="Connections per HTTP client shard [default: 25]")
    ] = None,
    rpm: Annotated[float | None, typer.Option(help="Requests-per-minute limit")] = None,
    thinking: Annotated[
        bool | None, typer.Option("--thinking/--no-thinking", help="Kimi thinking on or off")
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(help="YAML/JSON endpoint config (provider routing, prices...); flags win"),
    ] = None,
    provider_profile: Annotated[
        Path | None,
        typer.Option(help="`specregen probe` result: refuse tool prompts it finds unrecoverable"),
    ] = None,
) -> None:
    """Request completions for every prompt without a final result in the raw log yet."""
    from specregen.client.config import ConfigError, EndpointConfig
    from specregen.client.secrets import ApiKey

    console = Console(stderr=True)
    data = _config_file(config, console) if config is not None else {}
    overrides = {
        "base_url": base_url,
        "model": model,
        "dialect": dialect,
        "concurrency": concurrency,
        "stream": stream,
        "budget_usd": budget_usd,
        "api_key_env": api_key_env,
        "return_token_ids": return_token_ids,
        "connections_per_shard": connections_per_client,
        "requests_per_minute": rpm,
        "thinking": thinking,
    }
    data.update({k: v for k, v in overrides.items() if v is not None})
    if max_tokens is not None:
        data["sampling"] = {**(data.get("sampling") or {}), "max_tokens": max_tokens}
    try:
        cfg = EndpointConfig.load(data)
    except ConfigError as exc:
        console.print(f"[red]error:[/red] {exc}", markup=True, highlight=False)
        raise typer.Exit(EXIT_USAGE) from None

    key = ApiKey.from_env(cfg.api_key_env)
    if key is None and not is_loopback(cfg.base_url):
        console.print(
            f"[red]error:[/red] environment variable {cfg.api_key_env} is not set; it must hold"
            f" the API key for {cfg.base_url} (see --api-key-env)",
            highlight=False,
        )
        raise typer.Exit(EXIT_USAGE)
    if provider_profile is not None:
        from specregen.probe import ProbeRefusal, check_run_against_profile

        try:
            check_run_against_profile(provider_profile, prompts, cfg)
        except ProbeRefusal as exc:
            console.print(f"[red]refused:[/red] {exc}", highlight=False)
            raise typer.Exit(EXIT_USAGE) from None
    code = _run(prompts, out, cfg, key, retry_failed, console)
    raise typer.Exit(code)


def _config_file(path: Path, console: Console) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        console.print(f"[red]error:[/red] cannot read {path}: {exc.strerror}", highlight=False)
        raise typer.Exit(EXIT_USAGE) from None
    except yaml.YAMLError as exc:
        console.print(f"[red]error:[/red] {path} is not YAML/JSON: {exc}", highlight=False)
        raise typer.Exit(EXIT_USAGE) from None
    if not isinstance(data, dict):
        console.print(f"[red]error:[/red] {path} must hold a mapping of fields", highlight=False)
        raise typer.Exit(EXIT_USAGE)
    return data


def _run(
    prompts_path: str, out: str, cfg: Any, key: Any, retry_failed: bool, console: Console
) -> int:
    import fsspec
    from rich.live import Live

    from specregen.client.engine import FatalAPIError, run_inference
    from specregen.store.rawlog import RawLog, RawLogError

    try:
        handle = fsspec.open(prompts_path, "rt", encoding="utf-8", errors="replace").open()
    except (OSError, ValueError) as exc:
        console.print(f"[red]error:[/red] cannot read {prompts_path}: {exc}", highlight=False)
        return EXIT_USAGE
    try:
        raw_log = RawLog(out)
    except (OSError, ValueError, ImportError) as exc:
        handle.close()
        console.print(f"[red]error:[/red] cannot use {out} as the raw log: {exc}", highlight=False)
        return EXIT_USAGE
    _route_warnings(console)
    bad_lines = 0

    def report(number: int, reason: str) -> None:
        nonlocal bad_lines
        bad_lines += 1
        console.print(
            f"[yellow]skipped[/yellow] {prompts_path} line {number}: {reason}", highlight=False
        )

    live = Live(_progress_table(None), console=console, refresh_per_second=4, transient=False)

    async def main() -> Any:
        async with raw_log:
            return await run_inference(
                read_prompts(handle, report),
                cfg,
                raw_log,
                api_key=key,
                progress=lambda snap: live.update(_progress_table(snap)),
                retry_failed=retry_failed,
            )

    code = 0
    summary = None
    try:
        with handle, live:
            summary = asyncio.run(main())
    except FatalAPIError as exc:
        summary = exc.summary
        code = EXIT_FATAL
        console.print(f"[red]fatal:[/red] {exc}", highlight=False)
    except RawLogError as exc:
        console.print(f"[red]error:[/red] {exc}", highlight=False)
        return 1
    except KeyboardInterrupt:
        console.print(
            "[yellow]interrupted[/yellow]: finished results are in the raw log;"
            " run again to continue"
        )
        return EXIT_INTERRUPTED
    if summary is not None:
        _print_summary(summary, out, bad_lines)
        if code == 0 and summary.stopped_reason == "budget":
            console.print(f"[yellow]stopped:[/yellow] budget of ${cfg.budget_usd:g} reached")
            code = EXIT_BUDGET
    return code


def _route_warnings(console: Console) -> None:
    from rich.logging import RichHandler

    logger = logging.getLogger("specregen")
    if not logger.handlers:
        handler = RichHandler(console=console, show_path=False, rich_tracebacks=False)
        handler.setLevel(logging.WARNING)
        logger.addHandler(handler)


def _progress_table(snap: Any) -> Table:
    table = Table(box=None, show_header=True, header_style="bold")
    for name in ("done", "failed", "in flight", "req/s", "tok/s", "cost $", "skipped", "elapsed"):
        table.add_column(name, justify="right")
    if snap is None:
        table.add_row("0", "0", "0", "-", "-", "0", "0", "0s")
    else:
        table.add_row(
            str(snap.done),
            str(snap.failed),
            str(snap.in_flight),
            f"{snap.requests_per_s:.1f}",
            f"{snap.tokens_per_s:.0f}",
            f"{snap.cost_usd:.4f}",
            str(snap.skipped),
            f"{snap.elapsed_s:.0f}s",
        )
    return table


def _print_summary(summary: Any, out: str, bad_lines: int) -> None:
    table = Table(title=f"inference -> {out}")
    table.add_column("what")
    table.add_column("value", justify="right")
    rows = [
        ("ok", summary.ok),
        ("truncated (length)", summary.truncated),
        ("failed permanently", summary.failed),
        ("skipped (already final)", summary.skipped),
        ("duplicate sample ids", summary.duplicates),
        ("bad prompt lines", bad_lines),
        ("abandoned (stopped)", summary.abandoned),
        ("requests sent", summary.requests_sent),
        ("retries", summary.retries),
        ("prompt tokens", summary.prompt_tokens),
        ("completion tokens", summary.completion_tokens),
        ("cost USD", f"{summary.cost_usd:.4f}"),
        ("wall s", f"{summary.wall_s:.1f}"),
        ("mean in flight", f"{summary.mean_in_flight:.1f}"),
    ]
    for name, value in rows:
        table.add_row(name, str(value))
    for name, count in sorted(summary.errors.items()):
        table.add_row(f"error: {name}", str(count))
    if summary.stopped_reason:
        table.add_row("stopped", summary.stopped_reason)
    Console().print(table)
