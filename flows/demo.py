"""The demo: a local Prefect server, the emulator, and the pipeline over the bundled samples."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import yaml

# bench/pipeline.py takes free_port and drain_prefect_workers from here.
from flows.command import drain_prefect_workers, run_flows  # noqa: F401
from flows.server import (  # noqa: F401
    ServerStartError,
    free_port,
    healthy,
    local_server,
    telemetry_off,
    using_api,
)

REPO = Path(__file__).resolve().parents[1]
DEMO_CONFIG = REPO / "configs" / "demo.yaml"
SERVER_PORT = 4200


def demo_emulator_config(conversations: str | None = None):
    """The demo's provider: the emulator's OpenRouter profile, returning token ids.

    K2.5 now and then writes whitespace around a call's arguments; the provider's tool parser
    trims it (`\\s*` around the arguments, docs/upstream-parsers.md) while the ids it returns
    keep it. On the bundled B1_glaive rows that happens to an answer or two: reconstruction
    from the returned text differs from the server's ids, they are flagged
    `reference_text_diff` and quarantined, and `specregen inspect ... --flag
    reference_text_diff` shows where.

    `conversations`: the JSONL of the demo's whole conversations (`write_demo_conversations`);
    the emulator then answers a request that continues one of them with the dataset's own
    next step, or (20 %, seeded) diverges, so most conversations run their tool loops and
    user turns to the end instead of stopping at the first answer that differs from the
    dataset's. It recognises a conversation by its first user message, so the single-turn
    B1_glaive requests get the dataset's first answers too (or a divergence)."""
    from specregen.emulator.config import EmulatorConfig

    return EmulatorConfig(seed=0, tool_args_whitespace_rate=0.1, conversations=conversations)


def write_demo_conversations(out: Path) -> str | None:
    """The prompt lines of the demo's `turns: all` datasets, for the emulator's conversation
    mode; None when it has none. Read from the bundled samples: no request, a fraction of a
    second."""
    from specregen.config import load_config
    from specregen.pipeline.prompts import prompt_to_json
    from specregen.records import Prompt
    from specregen.sources import read_source

    config = load_config(str(DEMO_CONFIG))
    lines = [prompt_to_json(p) for d in config.datasets if d.turns == "all"
             for p in read_source(d.adapter, d.source, dataset=d.name, limit=d.limit,
                                  **d.adapter_options) if isinstance(p, Prompt)]
    if not lines:
        return None
    path = out / ".demo-conversations.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


class DemoError(ServerStartError):
    pass


@contextlib.contextmanager
def prefect_server(home: Path, port: int, keep: bool, log) -> Iterator[str]:
    """A Prefect server on loopback with its SQLite database under `home`; reused if running.
    Telemetry off; it dies with this process unless `keep`."""
    api_url = f"http://127.0.0.1:{port}/api"
    if healthy(api_url):
        log(f"using the Prefect server already running at {api_url}")
        yield api_url
        return
    with local_server(port=port, home=home, ui=True, keep=keep,
                      log_file=home / "server.log", log=log) as url:
        yield url


def write_demo_config(out: Path, base_url: str) -> Path:
    config = yaml.safe_load(DEMO_CONFIG.read_text())
    config["storage"] = str(out / "data")
    config["endpoint"]["base_url"] = base_url
    path = out / "demo.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@contextlib.contextmanager
def demo_emulator(out: Path, config, tokenizer) -> Iterator:
    """The emulator on the port the last demo used, when it is free: the endpoint's probe
    profile is keyed by its URL, so a new port would mean a new probe (paid requests) and no
    skip on the second run."""
    from specregen.emulator.server import serve_in_thread

    remembered = out / ".emulator-port"
    try:
        port = int(remembered.read_text())
    except (OSError, ValueError):
        port = 0
    try:
        emulator = serve_in_thread(config, tokenizer, port=port)
    except OSError:  # taken by something else now
        emulator = serve_in_thread(config, tokenizer)
    with emulator:
        remembered.write_text(str(emulator.port))
        yield emulator


def run_demo(out: Path, *, keep_server: bool = False, port: int = SERVER_PORT, log=print) -> list:
    """Run the pipeline over the bundled samples; returns the datasets' results, or raises
    DatasetsFailedError (with the results) when some failed."""
    from specregen.models.tokenizer import load_tokenizer

    telemetry_off()
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    with (
        prefect_server(out / ".prefect", port, keep_server, log) as api_url,
        demo_emulator(out, demo_emulator_config(write_demo_conversations(out)),
                      load_tokenizer("mini")) as emulator,
    ):
        log(f"emulator (openrouter profile, mini tokenizer) at {emulator.openrouter_url}")
        config_path = write_demo_config(out, emulator.openrouter_url)
        from flows.pipeline import DatasetsFailedError

        failure: DatasetsFailedError | None = None
        try:
            with using_api(api_url):
                results = run_flows(config_path, None, log=log)
        except DatasetsFailedError as exc:
            failure, results = exc, exc.results
        ui = api_url.removesuffix("/api")
        log(f"Prefect UI: {ui}" + ("" if keep_server else " (stopped; --keep-server keeps it)"))
        log(f"config: {config_path}")
    if failure is not None:
        raise failure  # after the lines above: the caller prints the results, then the causes
    return results
