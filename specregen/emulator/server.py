"""Running the emulator: in a background thread (tests, demos, benchmarks) or in the foreground.

URL convention: `RunningEmulator.url` is the OpenAI-style base URL ending in `/v1`
(`http://127.0.0.1:PORT/v1`, so `url + "/chat/completions"`); `openrouter_url` is the same server
under OpenRouter's `/api/v1`; `base_url` is the bare origin (for `/_emulator/stats`).

uvicorn picks httptools and uvloop when they are installed (much faster at thousands of
connections) and falls back to h11 and asyncio otherwise; either works.
"""

from __future__ import annotations

import contextlib
import resource
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import uvicorn

from specregen.emulator.app import EmulatorApp, EmulatorState, create_app
from specregen.emulator.config import EmulatorConfig
from specregen.models.tokenizer import Tokenizer

# Thousands of clients connect at once in the load benchmarks; the kernel caps this further
# at net.core.somaxconn.
BACKLOG = 4096


@dataclass
class RunningEmulator:
    """A started emulator. Use as a context manager, or call `stop()`."""

    host: str
    port: int
    app: EmulatorApp
    _server: uvicorn.Server = field(repr=False)
    _thread: threading.Thread = field(repr=False)

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def url(self) -> str:
        return self.base_url + "/v1"

    @property
    def openrouter_url(self) -> str:
        return self.base_url + "/api/v1"

    @property
    def state(self) -> EmulatorState:
        return self.app.state.emulator

    def stats(self) -> dict[str, Any]:
        """Same as `GET /_emulator/stats`."""
        return self.state.snapshot()

    def reset(self) -> None:
        """Same as `POST /_emulator/reset`; call it while no request is in flight."""
        self.state.reset()

    def stop(self, timeout: float = 10.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout / 2)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(timeout / 2)
        if self._thread.is_alive():
            raise RuntimeError(f"the emulator on {self.base_url} did not stop in {timeout} s")

    def __enter__(self) -> RunningEmulator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def uvicorn_config(
    app: EmulatorApp,
    *,
    http: str = "auto",
    loop: str = "auto",
    log_config: dict[str, Any] | None = None,
) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        http=http,
        loop=loop,
        lifespan="off",
        log_level="warning",
        log_config=log_config,
        access_log=False,
        backlog=BACKLOG,
        limit_concurrency=None,
        timeout_keep_alive=30,
        timeout_graceful_shutdown=2,
        server_header=False,
        date_header=False,
    )


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from None
    # Listening now, not when the loop starts: a client that read the printed URL may connect
    # at once, and its connection then waits in the backlog instead of being refused.
    sock.listen(BACKLOG)
    return sock


def raise_open_file_limit() -> None:
    """Lift the soft limit on open files to the hard one: each connection is a descriptor."""
    with contextlib.suppress(ValueError, OSError):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def serve_in_thread(
    config: EmulatorConfig,
    tokenizer: Tokenizer,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    http: str = "auto",
    loop: str = "auto",
    startup_timeout: float = 10.0,
) -> RunningEmulator:
    """Start an emulator on `host:port` (0: a free port) in a daemon thread; returns when up.

    `http` / `loop` choose uvicorn's implementations ("h11"/"httptools", "asyncio"/"uvloop").
    """
    app = create_app(config, tokenizer)
    raise_open_file_limit()
    sock = bind_socket(host, port)
    server = uvicorn.Server(uvicorn_config(app, http=http, loop=loop))
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="specregen-emulator", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise RuntimeError(f"the emulator did not start on {host}:{port}")
        time.sleep(0.01)
    bound_host, bound_port = sock.getsockname()[:2]
    return RunningEmulator(bound_host, bound_port, app, server, thread)


def serve_forever(
    config: EmulatorConfig,
    tokenizer: Tokenizer,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    on_listening: Any = None,
) -> None:
    """Serve in the foreground until interrupted (Ctrl-C / SIGTERM)."""
    app = create_app(config, tokenizer)
    raise_open_file_limit()
    sock = bind_socket(host, port)
    server = uvicorn.Server(uvicorn_config(app, log_config=uvicorn.config.LOGGING_CONFIG))
    if on_listening is not None:
        bound_host, bound_port = sock.getsockname()[:2]
        on_listening(bound_host, bound_port)
    server.run(sockets=[sock])
