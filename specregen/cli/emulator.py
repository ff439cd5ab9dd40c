"""`specregen emulator`: serve an emulated model behind a provider until interrupted."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from specregen.console import make_console
from specregen.emulator.app import ADMIN_TOKEN_ENV
from specregen.emulator.config import EmulatorConfig, all_profiles
from specregen.models.registry import DEFAULT_MODEL, bundled_tokenizer_folders, families

console = make_console(stderr=True)

Rate = Annotated[float, typer.Option(min=0.0, max=1.0)]


def emulator(
    host: Annotated[str, typer.Option(help="Address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free port)")] = 8000,
    tokenizer: Annotated[
        str | None,
        typer.Option(help=", ".join(repr(a) for a in bundled_tokenizer_folders())
                          + ", a tokenizer folder, or a hub id "
                          "[default: the chat format's bundled test tokenizer]")
    ] = None,
    profile: Annotated[
        str, typer.Option(help="Provider to imitate: " + ", ".join(all_profiles()))
    ] = "openrouter",
    seed: Annotated[int, typer.Option(help="Seed of the model and of the fault sequence")] = 0,
    model: Annotated[
        str, typer.Option(help="Model id served; it names the chat format, whose profiles are "
                               + "; ".join(f"{f.name}: {', '.join(f.emulator_profiles)}"
                                           for f in families()))
    ] = DEFAULT_MODEL,
    chat_format: Annotated[
        str | None, typer.Option("--format", help="Chat format [default: from --model]")
    ] = None,
    latency: Annotated[str, typer.Option(help="fixed or lognormal")] = "fixed",
    latency_mean: Annotated[float, typer.Option(help="Mean seconds per response")] = 0.0,
    latency_sigma: Annotated[float, typer.Option(help="Sigma of the lognormal latency")] = 0.5,
    latency_scale: Annotated[float, typer.Option(help="Factor on every latency")] = 1.0,
    rate_429: Annotated[float, typer.Option("--rate-429", min=0.0, max=1.0)] = 0.0,
    rate_5xx: Annotated[float, typer.Option("--rate-5xx", min=0.0, max=1.0)] = 0.0,
    rate_reset: Rate = 0.0,
    rate_truncated: Rate = 0.0,
    rate_error_200: Annotated[float, typer.Option("--rate-error-200", min=0.0, max=1.0)] = 0.0,
    rate_stream_error: Rate = 0.0,
    rate_stall: Rate = 0.0,
    stall_seconds: Annotated[float, typer.Option(min=0.0)] = 5.0,
    keepalive_rate: Rate = 0.0,
    noncanonical_rate: Rate = 0.0,
    tool_call_rate: Rate = 0.1,
    conversations: Annotated[
        str | None,
        typer.Option(help="JSONL of whole conversations (prompt lines): a request continuing "
                          "one is answered with the dataset's next step, or diverges from it"),
    ] = None,
    divergence_rate: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Share of conversation steps answered "
                                                   "otherwise than the dataset (seeded)")
    ] = 0.2,
    require_key_env: Annotated[
        str | None,
        typer.Option(help="Name of an environment variable holding the API key to require"),
    ] = None,
    credits_exhausted: Annotated[
        bool, typer.Option("--credits-exhausted", help="Answer every request with 402")
    ] = False,
    batch_delay: Annotated[
        float, typer.Option(min=0.0, help="Batch APIs: seconds until a batch finishes")
    ] = 0.0,
    batch_failure_rate: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Batch APIs: share of requests that fail "
                                                   "(a 500 result)")
    ] = 0.0,
    batch_expire_rate: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Batch APIs: share of requests left "
                                                   "unprocessed (their batch ends expired)")
    ] = 0.0,
    batch_price_share: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Batch APIs: batch price as a share of "
                                                   "the realtime price (OpenRouter 0.5, "
                                                   "Moonshot 0.6); not the client's "
                                                   "prices.batch_discount (the cut, 1 - "
                                                   "share)")
    ] = 0.5,
) -> None:
    """Serve an OpenAI/OpenRouter-compatible endpoint that answers like the model (its chat
    format) behind a provider; prints the base URL, then serves until interrupted."""
    from specregen.emulator.server import serve_forever
    from specregen.models.tokenizer import TokenizerError, load_tokenizer

    require_key = None
    if require_key_env is not None:
        require_key = os.environ.get(require_key_env)
        if not require_key:
            console.print(f"[red]error:[/red] environment variable {require_key_env} is not set")
            raise typer.Exit(2)
    try:
        config = EmulatorConfig(
            profile=profile,
            seed=seed,
            model=model,
            format=chat_format,
            latency=latency,  # type: ignore[arg-type]
            latency_mean=latency_mean,
            latency_sigma=latency_sigma,
            latency_scale=latency_scale,
            rate_429=rate_429,
            rate_5xx=rate_5xx,
            rate_reset=rate_reset,
            rate_truncated=rate_truncated,
            rate_error_200=rate_error_200,
            rate_stream_error=rate_stream_error,
            rate_stall=rate_stall,
            stall_seconds=stall_seconds,
            keepalive_rate=keepalive_rate,
            noncanonical_rate=noncanonical_rate,
            tool_call_rate=tool_call_rate,
            conversations=conversations,
            divergence_rate=divergence_rate,
            require_key=require_key,
            credits_exhausted=credits_exhausted,
            batch_delay=batch_delay,
            batch_failure_rate=batch_failure_rate,
            batch_expire_rate=batch_expire_rate,
            batch_price_share=batch_price_share,
        )
        tok = load_tokenizer(tokenizer or _default_tokenizer(chat_format, model))
        if conversations is not None:
            _announce_conversations(conversations)
    except (ValueError, TokenizerError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None

    def announce(bound_host: str, bound_port: int) -> None:
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        # stdout, alone on its line, so a script can read the URL.
        print(f"http://{shown}:{bound_port}/v1", flush=True)
        console.print(f"emulating {config.model} via {config.profile} with tokenizer {tok.name}; "
                      f"OpenRouter-style base URL http://{shown}:{bound_port}/api/v1")

    if not is_loopback_host(host):
        token = "set" if os.environ.get(ADMIN_TOKEN_ENV) else "not set: loopback clients only"
        console.print(
            f"[yellow]warning:[/yellow] listening on {host}, beyond loopback: anyone who can "
            "reach this port can send requests"
            + (" (no key is required; --require-key-env NAME sets one)" if require_key is None
               else "")
            + f". Admin routes /_emulator/* need X-Emulator-Token = ${ADMIN_TOKEN_ENV} ({token})."
        )
    try:
        serve_forever(config, tok, host, port, on_listening=announce)
    except (OSError, TokenizerError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None


def _default_tokenizer(chat_format: str | None, model: str) -> str:
    """The bundled test tokenizer of the format served (`registry.bundled_tokenizer`); `mini`
    for a model no format claims (the emulator then serves its default format)."""
    from specregen.models.registry import (
        UnknownFormatError,
        bundled_tokenizer,
        resolve_format_name,
    )

    try:
        return bundled_tokenizer(resolve_format_name(chat_format, model)) or "mini"
    except UnknownFormatError:
        if chat_format is not None:
            raise ValueError(f"unknown chat format {chat_format!r}") from None
        return "mini"


def _announce_conversations(path: str) -> None:
    """How many conversations the file holds, and each line that is not one (skipped)."""
    from specregen.emulator.conversations import ConversationBook

    book = ConversationBook.load(path)
    for number, reason in book.rejected:
        console.print(f"[yellow]warning:[/yellow] {path} line {number} skipped: {reason}")
    console.print(f"conversation mode: {book.size} conversations from {path}")


def is_loopback_host(host: str) -> bool:
    """Whether a listen address stays on this machine ('localhost', 127.x, ::1)."""
    import ipaddress

    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface
