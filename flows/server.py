"""The Prefect servers specregen starts: telemetry off, loopback only, dying with their parent.

`specregen run` without `PREFECT_API_URL` gets a temporary server (Prefect's own "ephemeral"
server would do, but it outlives a SIGKILLed parent and keeps telemetry on); `specregen demo`
gets one with the UI. Both are children of this process that the kernel stops when it dies
(`specregen.procs.guarded_command`), unless the demo is asked to keep its server.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from specregen.errors import UnavailableError
from specregen.procs import guarded_command

# Every server specregen starts, and its own client, send nothing home.
TELEMETRY_OFF = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_UI_SHOW_PROMOTIONAL_CONTENT": "false",
    "DO_NOT_TRACK": "1",
}
STARTUP_TIMEOUT_S = 120.0


class ServerStartError(UnavailableError):
    """The local Prefect server did not come up."""


def telemetry_off() -> None:
    """In this process (the Prefect client side) too."""
    os.environ.update(TELEMETRY_OFF)


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
def local_server(
    *, port: int, home: Path | None = None, ui: bool = True, keep: bool = False,
    log_file: Path | None = None, log=print,
) -> Iterator[str]:
    """A Prefect server on 127.0.0.1:`port`; yields its API URL and stops it on exit.

    `home`: its PREFECT_HOME (SQLite database); None keeps the caller's (the default
    ~/.prefect, as Prefect's own temporary server does). `keep`: leave it running afterwards
    (then it is started in its own session and does not die with this process).
    """
    api_url = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, **TELEMETRY_OFF}
    env.pop("PREFECT_API_URL", None)
    if home is not None:
        home.mkdir(parents=True, exist_ok=True)
        env["PREFECT_HOME"] = str(home)
    if ui:
        # The UI asks the API at the URL the settings name, not the one `--port` serves: on
        # any port but 4200 it would ask a server that is not there.
        env["PREFECT_UI_API_URL"] = api_url
        cmd = [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
               "--port", str(port), "--analytics-off"]
    else:  # what Prefect's temporary server runs: the API alone, no UI
        env.update(PREFECT_UI_ENABLED="0", PREFECT__SERVER_EPHEMERAL="1")
        cmd = [sys.executable, "-m", "uvicorn", "--factory",
               "prefect.server.api.server:create_app", "--host", "127.0.0.1",
               "--port", str(port), "--log-level", "error", "--lifespan", "on"]
    out = log_file.open("ab") if log_file is not None else None  # None: this terminal
    process = subprocess.Popen(
        cmd if keep else guarded_command(cmd), env=env, stdout=out, stderr=subprocess.STDOUT,
        start_new_session=keep,
    )
    where = f" (log {log_file})" if log_file is not None else ""
    log(f"starting a Prefect server at {api_url}{where} ...")
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not healthy(api_url):
        if process.poll() is not None or time.monotonic() > deadline:
            stop(process)
            raise ServerStartError(
                f"the Prefect server at {api_url} did not start{where}",
                hint="check that the port is free, or set PREFECT_API_URL to a running server",
            )
        time.sleep(0.3)
    try:
        yield api_url
    finally:
        if not keep:
            stop(process)
        if log_file is not None:
            out.close()  # type: ignore[union-attr]


@contextlib.contextmanager
def using_api(api_url: str) -> Iterator[None]:
    """Point this process (Prefect's settings, read once at import) and the processes it
    starts (the environment) at `api_url`."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    saved = os.environ.get("PREFECT_API_URL")
    os.environ["PREFECT_API_URL"] = api_url
    try:
        with temporary_settings(updates={PREFECT_API_URL: api_url}):
            yield
    finally:
        if saved is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = saved


def stop(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
