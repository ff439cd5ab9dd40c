"""Headless Chromium over the DevTools protocol (one websocket), for the browser tests and the
report benchmark: open a local page, collect JavaScript errors and any network request, run
script in the page, time the load, take a screenshot.

Uses Debian's `chromium` (/usr/bin/chromium) with a fresh profile, and the `websockets` package;
nothing is downloaded.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-extensions", "--hide-scrollbars", "--mute-audio",
)


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class PageProblems:
    errors: list[str] = field(default_factory=list)  # console errors and uncaught exceptions
    requests: list[str] = field(default_factory=list)  # URLs other than the page itself


class Page:
    """One tab, driven over its DevTools websocket."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.ids = itertools.count(1)
        self.problems = PageProblems()
        self.events: list[dict[str, Any]] = []
        self.page_url = ""

    def call(self, method: str, timeout: float = 30.0, **params: Any) -> dict[str, Any]:
        msg_id = next(self.ids)
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            message = json.loads(self.ws.recv(timeout=max(0.01, deadline - time.monotonic())))
            if message.get("id") == msg_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self._event(message)

    def wait_for(self, method: str, timeout: float = 30.0) -> dict[str, Any]:
        for seen in self.events:
            if seen.get("method") == method:
                self.events.remove(seen)
                return seen
        deadline = time.monotonic() + timeout
        while True:
            message = json.loads(self.ws.recv(timeout=max(0.01, deadline - time.monotonic())))
            self._event(message)
            if message.get("method") == method:
                self.events.remove(message)
                return message

    def _event(self, message: dict[str, Any]) -> None:
        method = message.get("method")
        params = message.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            text = details.get("exception", {}).get("description") or details.get("text")
            self.problems.errors.append(f"uncaught: {text}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            args = [a.get("value", a.get("description")) for a in params.get("args", [])]
            self.problems.errors.append(f"console.{params['type']}: {args}")
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            self.problems.errors.append(f"log: {entry.get('text')} {entry.get('url', '')}")
        elif method == "Network.requestWillBeSent":
            url = params.get("request", {}).get("url", "")
            if url != self.page_url and not url.startswith(("data:", "about:")):
                self.problems.requests.append(url)
        if method:
            self.events.append(message)
            del self.events[:-200]

    def open(self, path: Path | str, *, width: int = 1400, height: int = 900) -> float:
        """Load a local file (or a URL: a page of a server on loopback); returns seconds from
        navigation to the load event."""
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                  deviceScaleFactor=1, mobile=False)
        self.page_url = path if isinstance(path, str) else path.resolve().as_uri()
        self.events.clear()
        start = time.perf_counter()
        self.call("Page.navigate", url=self.page_url)
        self.wait_for("Page.loadEventFired", timeout=60)
        return time.perf_counter() - start

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise RuntimeError(details.get("exception", {}).get("description")
                               or details.get("text"))
        return result.get("result", {}).get("value")

    def wait_for_text(self, text: str, timeout: float = 30.0) -> str:
        """The page's text once it contains `text` (a page that renders after loading, such as
        a single-page app); the last text seen, when it never does."""
        deadline = time.monotonic() + timeout
        while True:
            seen = self.evaluate("document.body ? document.body.innerText : ''") or ""
            if text in seen or time.monotonic() > deadline:
                return seen
            time.sleep(0.3)

    def screenshot(self, out: Path, *, full_page: bool = False) -> Path:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = self.evaluate("[document.documentElement.scrollWidth, "
                                 "document.documentElement.scrollHeight]")
            params["clip"] = {"x": 0, "y": 0, "width": size[0], "height": min(size[1], 6000),
                              "scale": 1}
            params["captureBeyondViewport"] = True
        data = self.call("Page.captureScreenshot", **params)["data"]
        out.write_bytes(base64.b64decode(data))
        return out


@contextlib.contextmanager
def chromium(binary: str | None = None) -> Iterator[Page]:
    """A headless Chromium with a fresh profile and one page; stopped on exit."""
    from websockets.sync.client import connect

    binary = binary or chromium_path()
    if binary is None:
        raise FileNotFoundError("no chromium binary (Debian: apt-get install chromium)")
    profile = tempfile.mkdtemp(prefix="specregen-chromium-")
    # A file, not a pipe: Chromium's chatter on stderr must never block it.
    log = tempfile.TemporaryFile()  # noqa: SIM115 -- closed in the finally below
    process = subprocess.Popen(
        [binary, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0",
         "--remote-allow-origins=*", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=log,
    )
    try:
        port = _devtools_port(Path(profile), process, log)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            targets = json.load(r)
        page = next(t for t in targets if t.get("type") == "page")
        with connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=20) as ws:
            yield Page(ws)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        shutil.rmtree(profile, ignore_errors=True)
        log.close()


def _devtools_port(profile: Path, process: subprocess.Popen, log: Any) -> int:
    # Chromium writes the port it chose to this file once it listens.
    marker = profile / "DevToolsActivePort"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log.seek(0)
            err = log.read().decode(errors="replace")[-2000:]
            raise RuntimeError(f"chromium exited with {process.returncode}: {err}")
        if marker.is_file():
            lines = marker.read_text().split()
            if lines:
                return int(lines[0])
        time.sleep(0.05)
    raise RuntimeError("chromium did not open its DevTools port within 60 s")


if __name__ == "__main__":  # a quick manual check: python bench/chromium.py PAGE.html OUT.png
    import sys

    with chromium() as tab:
        seconds = tab.open(Path(sys.argv[1]))
        tab.screenshot(Path(sys.argv[2]))
        print(f"loaded in {seconds:.3f} s; problems: {tab.problems}; pid {os.getpid()}")
