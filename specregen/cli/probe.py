"""`specregen probe`: ask an endpoint how it returns tool calls, write the profile, print a table.

Exit codes (specregen.errors): 0 the probe ran (whatever it found), 2 bad usage (options, config,
tokenizer, glaive source, missing key for a remote endpoint, an endpoint URL that cannot be
used), 3 the endpoint refused the key or the account (the message names the key's variable),
5 --out cannot be written, 9 nothing answers at the endpoint's URL.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from specregen.console import make_console
from specregen.errors import storage_error, user_errors
from specregen.probe.model import TOOL_MODES, ProviderProfile, ScenarioResult

EXIT_USAGE = 2
EXIT_FATAL = 3


def _csv(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [part.strip() for part in value.split(",") if part.strip()]


def probe_command(
    out: Annotated[Path, typer.Option(help="Where to write the provider profile (JSON)")],
    base_url: Annotated[str | None, typer.Option(help="e.g. https://openrouter.ai/api/v1")] = None,
    model: Annotated[str | None, typer.Option(help="the endpoint's model id")] = None,
    dialect: Annotated[
        str | None, typer.Option(help="openrouter (default), vllm, sglang or moonshot")
    ] = None,
    api_key_env: Annotated[
        str | None,
        typer.Option(help="NAME of the variable holding the key [default: OPENROUTER_API_KEY]"),
    ] = None,
    provider_order: Annotated[
        str | None, typer.Option(help="OpenRouter: provider slugs to try in order, a,b")
    ] = None,
    provider_only: Annotated[
        str | None, typer.Option(help="OpenRouter: only these provider slugs, a,b")
    ] = None,
    allow_fallbacks: Annotated[
        bool | None,
        typer.Option("--allow-fallbacks/--no-allow-fallbacks", help="OpenRouter fallbacks"),
    ] = None,
    quantizations: Annotated[
        str | None, typer.Option(help="OpenRouter: allowed quantizations, e.g. int4,fp8")
    ] = None,
    require_parameters: Annotated[
        bool,
        typer.Option("--require-parameters", help="OpenRouter: only providers that take every"
                     " parameter sent"),
    ] = False,
    tokenizer: Annotated[
        str | None,
        typer.Option(help="'mini' or a tokenizer folder: compare usage counts with ours"),
    ] = None,
    glaive_source: Annotated[
        str | None,
        typer.Option(help="glaive-function-calling-v2 file or URL: also probe a real prompt"),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(help="YAML/JSON endpoint config, as `specregen infer --config`; flags win"),
    ] = None,
    tool_mode: Annotated[
        str, typer.Option(help="How the run will send tools: tools or system_prompt")
    ] = "tools",
    requests: Annotated[int, typer.Option(help="Requests per scenario (1-10)")] = 3,
    return_token_ids: Annotated[
        bool | None,
        typer.Option("--return-token-ids",
                     help="vLLM: ask for token ids, to check arguments are verbatim"),
    ] = None,
    chat_format: Annotated[
        str | None, typer.Option("--format", help="Chat format [default: from --model]")
    ] = None,
    server_defaults: Annotated[
        bool,
        typer.Option("--server-defaults",
                     help="vLLM/SGLang: leave the server's detokenizer defaults (do not send"
                          " spaces_between_special_tokens: false), to see what it does then"),
    ] = False,
) -> None:
    """Probe how an endpoint returns tool calls and reasoning, before a long paid run."""
    from specregen.cli.common import config_file
    from specregen.client.config import ConfigError, EndpointConfig
    from specregen.client.reach import is_loopback
    from specregen.client.secrets import ApiKey
    from specregen.probe.model import save_profile
    from specregen.probe.run import ProbeFatalError, probe_endpoint
    from specregen.probe.scenarios import (
        ProbeSetupError,
        build_scenarios,
        glaive_probe_prompt,
        rules_of,
    )

    console = make_console(stderr=True)

    def usage_error(message: str) -> typer.Exit:
        console.print(f"[red]error:[/red] {message}", highlight=False)
        return typer.Exit(EXIT_USAGE)

    if tool_mode not in TOOL_MODES:
        raise usage_error(f"--tool-mode must be one of {', '.join(TOOL_MODES)}")
    data = config_file(config, console) if config is not None else {}
    overrides = {"base_url": base_url, "model": model, "dialect": dialect,
                 "api_key_env": api_key_env, "return_token_ids": return_token_ids,
                 "format": chat_format,
                 "text_as_written": False if server_defaults else None}
    data.update({k: v for k, v in overrides.items() if v is not None})
    routing = {
        "order": _csv(provider_order),
        "only": _csv(provider_only),
        "allow_fallbacks": allow_fallbacks,
        "quantizations": _csv(quantizations),
        "require_parameters": True if require_parameters else None,
    }
    routing = {k: v for k, v in routing.items() if v is not None}
    if routing:
        data["provider"] = {**(data.get("provider") or {}), **routing}
    try:
        cfg = EndpointConfig.load(data)
    except ConfigError as exc:
        raise usage_error(str(exc)) from None
    from specregen.models.registry import reads_provider_traits

    if not reads_provider_traits(cfg.format_name):
        raise usage_error(f"the {cfg.format_name} format reads no provider traits: its "
                          "reconstruction needs no probe (a format has a probe when its "
                          "package brings probe rules)")

    key = ApiKey.from_env(cfg.api_key_env)
    if key is None and not is_loopback(cfg.base_url):
        raise usage_error(f"environment variable {cfg.api_key_env} is not set; it must hold the"
                          f" API key for {cfg.base_url} (see --api-key-env)")
    try:
        fmt = _load_format(tokenizer, cfg.format_name)
        glaive = glaive_probe_prompt(glaive_source) if glaive_source else None
        scenarios = build_scenarios(requests, glaive, rules=rules_of(cfg.format_name))
    except ProbeSetupError as exc:
        raise usage_error(str(exc)) from None

    # An unreachable endpoint (exit 9) and an unwritable --out (exit 5) answer as in `infer`.
    with user_errors(), console.status(f"probing {cfg.model} at {cfg.base_url}"):
        try:
            profile = probe_endpoint(cfg, key, scenarios, tool_mode=tool_mode,
                                     fmt=fmt, tokenizer=tokenizer, glaive_source=glaive_source)
        except ProbeFatalError as exc:
            console.print(f"[red]fatal:[/red] {exc}", highlight=False)
            raise typer.Exit(EXIT_FATAL if exc.key_error else EXIT_USAGE) from None
    with user_errors():
        try:
            save_profile(profile, out)
        except OSError as exc:
            raise storage_error(exc, str(out)) from None
    print_profile(profile, make_console(), out)


def _load_format(tokenizer: str | None, format_name: str) -> Any:
    if tokenizer is None:
        return None
    from specregen.models.registry import get_format
    from specregen.models.tokenizer import TokenizerError, load_tokenizer
    from specregen.probe.scenarios import ProbeSetupError

    try:
        return get_format(format_name, load_tokenizer(tokenizer))
    except TokenizerError as exc:
        raise ProbeSetupError(str(exc)) from None


# ---------------------------------------------------------------------------------------------
# The table


def _thinking(s: ScenarioResult) -> str:
    return {None: "default", True: "on", False: "off"}[s.thinking]


def _calls(s: ScenarioResult) -> str:
    if s.calls_where is None:
        return "[red]failed[/red]"
    total = sum(s.where_counts.values())
    text = f"{s.calls_where} {s.where_counts.get(s.calls_where, 0)}/{total}"
    colour = {True: "green", False: "red", None: "yellow"}[s.recoverable]
    return f"[{colour}]{text}[/{colour}]"


def _offsets(values: list[int]) -> str:
    return ",".join(f"{v:+d}" if v else "0" for v in values) or "-"


def _ids(s: ScenarioResult) -> str:
    if s.id_form == "none":
        return "-"
    # A canonical example shows the form by itself.
    return f"other: {s.id_example}" if s.id_form == "other" else str(s.id_example)


def _arguments(s: ScenarioResult) -> str:
    return "-" if s.arguments == "none" else f"{s.arguments}, JSON {s.arguments_json}"


def _errors(s: ScenarioResult) -> str:
    failed = [o for o in s.observations if not o.ok]
    return f"[red]{len(failed)}: {failed[0].error}[/red]" if failed else "0"


# One row per finding, one column per scenario: five columns fit a terminal, fourteen do not.
ROWS = (
    ("tools as", lambda s: s.tool_mode),
    ("thinking", _thinking),
    ("calls", _calls),
    ("reasoning", lambda s: s.reasoning_field),
    ("id", _ids),
    ("arguments", _arguments),
    ("whitespace", lambda s: "-" if s.whitespace == "none" else s.whitespace),
    ("Δ prompt", lambda s: _offsets(s.prompt_offsets)),
    ("Δ completion", lambda s: _offsets(s.completion_offsets)),
    ("finish", lambda s: ", ".join(f"{k}×{v}" for k, v in sorted(s.finish_reasons.items()))
     or "-"),
    ("latency", lambda s: f"{s.latency_s_max:.1f}s"),
    ("provider", lambda s: ", ".join(s.providers) or "-"),
    ("errors", _errors),
)


def profile_table(profile: ProviderProfile) -> Table:
    """The findings per scenario; Δ = usage minus our token count."""
    table = Table(title=f"probe: {profile.model} at {profile.base_url} ({profile.dialect})",
                  title_justify="left")
    table.add_column("", style="bold", no_wrap=True)
    for s in profile.scenarios:
        table.add_column(s.name, overflow="fold")
    for label, cell in ROWS:
        table.add_row(label, *(cell(s) for s in profile.scenarios))
    return table


def print_profile(profile: ProviderProfile, console: Console, out: Path | None = None) -> None:
    console.print(profile_table(profile))
    modes = ", ".join(
        f"{mode} {'yes' if ok else 'NO'}"
        for mode, ok in profile.tool_calls_recoverable_by_mode.items()
    )
    verdict = "[green]yes[/green]" if profile.tool_calls_recoverable else "[red]NO[/red]"
    console.print(f"tool calls recoverable as {profile.tool_mode}: {verdict} (by mode: {modes})")
    console.print(f"reasoning field: {profile.reasoning_field}", highlight=False)
    console.print(f"probe: {profile.probe_requests} requests, ${profile.probe_cost_usd:.6f}",
                  highlight=False)
    for note in profile.notes:
        console.print(f"  • {note}", highlight=False, markup=False)
    if out is not None:
        console.print(f"profile written to {out}", highlight=False)
