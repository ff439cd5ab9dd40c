"""The demo: a local Prefect server, the emulator, and the pipeline over the bundled samples."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]
DEMO_CONFIG = REPO / "configs" / "demo.yaml"
SERVER_PORT = 4200


class DemoError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthy(api_url: str) -> bool:
    try:
        return httpx.get(f"{api_url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def prefect_server(home: Path, port: int, keep: bool, log) -> Iterator[str]:
    """A Prefect server on loopback with its SQLite database under `home`; reused if running."""
    api_url = f"http://127.0.0.1:{port}/api"
    if healthy(api_url):
        log(f"using the Prefect server already running at {api_url}")
        yield api_url
        return
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_SERVER_UI_SHOW_PROMOTIONAL_CONTENT": "false", "DO_NOT_TRACK": "1"}
    env.pop("PREFECT_API_URL", None)
    server_log = (home / "server.log").open("ab")
    process = subprocess.Popen(
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
         "--port", str(port)],
        env=env, stdout=server_log, stderr=subprocess.STDOUT,
        start_new_session=keep,  # a kept server outlives this command
    )
    log(f"starting a Prefect server at {api_url} (home {home}) ...")
    deadline = time.monotonic() + 120
    while not healthy(api_url):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise DemoError(f"the Prefect server did not start; see {home / 'server.log'}")
        time.sleep(0.5)
    try:
        yield api_url
    finally:
        if not keep:
            process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=15)


def drain_prefect_workers() -> None:
    """Send the logs and events still queued before the server they go to stops."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=10)
    EventsWorker.drain_all(timeout=10)


def write_demo_config(out: Path, base_url: str) -> Path:
    config = yaml.safe_load(DEMO_CONFIG.read_text())
    config["storage"] = str(out / "data")
    config["endpoint"]["base_url"] = base_url
    path = out / "demo.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def run_demo(out: Path, *, keep_server: bool = False, port: int = SERVER_PORT, log=print) -> list:
    """Run the pipeline over the bundled samples; returns the datasets' results."""
    from specregen.emulator.config import EmulatorConfig
    from specregen.emulator.server import serve_in_thread
    from specregen.models.tokenizer import load_tokenizer

    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    with (
        prefect_server(out / ".prefect", port, keep_server, log) as api_url,
        serve_in_thread(EmulatorConfig(seed=0), load_tokenizer("mini")) as emulator,
    ):
        log(f"emulator (openrouter profile, mini tokenizer) at {emulator.openrouter_url}")
        config_path = write_demo_config(out, emulator.openrouter_url)
        os.environ["PREFECT_API_URL"] = api_url
        from flows.pipeline import DatasetsFailedError, pipeline_flow

        try:
            results = asyncio.run(pipeline_flow(str(config_path)))
        except DatasetsFailedError as exc:
            log(f"some datasets failed: {exc}")
            results = []
        finally:
            drain_prefect_workers()
        ui = api_url.removesuffix("/api")
        log(f"Prefect UI: {ui}" + ("" if keep_server else " (stopped; --keep-server keeps it)"))
        log(f"config: {config_path}")
    return results
