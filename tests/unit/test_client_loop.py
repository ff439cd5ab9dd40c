"""specregen.client.loop: uvloop when installed, asyncio's loop otherwise, Ctrl-C as asyncio.run."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import sys

import pytest

from specregen.client import loop as client_loop
from specregen.errors import UsageError

HAS_UVLOOP = importlib.util.find_spec("uvloop") is not None
needs_uvloop = pytest.mark.skipif(not HAS_UVLOOP, reason="uvloop is not installed")


async def running_loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    monkeypatch.delenv(client_loop.LOOP_ENV, raising=False)


@needs_uvloop
def test_runs_on_uvloop_when_installed():
    assert client_loop.loop_name() == "uvloop"
    assert client_loop.run(running_loop_module()).startswith("uvloop")


def test_falls_back_to_asyncio_without_uvloop(monkeypatch):
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop -> ImportError
    assert client_loop.loop_factory() is None
    assert client_loop.loop_name() == "asyncio"
    assert client_loop.run(running_loop_module()).startswith("asyncio")


@needs_uvloop
def test_env_chooses_asyncio_even_with_uvloop(monkeypatch):
    monkeypatch.setenv(client_loop.LOOP_ENV, "asyncio")
    assert client_loop.run(running_loop_module()).startswith("asyncio")


def test_env_requiring_a_missing_uvloop_is_a_usage_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "uvloop", None)
    monkeypatch.setenv(client_loop.LOOP_ENV, "uvloop")
    with pytest.raises(UsageError, match="uvloop is not installed"):
        client_loop.loop_factory()


def test_env_with_an_unknown_loop_is_a_usage_error(monkeypatch):
    monkeypatch.setenv(client_loop.LOOP_ENV, "trio")
    with pytest.raises(UsageError, match="SPECREGEN_EVENT_LOOP='trio'"):
        client_loop.loop_factory()


@pytest.mark.parametrize("which", [
    pytest.param("uvloop", marks=needs_uvloop), "asyncio"])
def test_ctrl_c_cancels_main_then_raises_keyboard_interrupt(monkeypatch, which):
    # What `specregen infer` relies on: the main coroutine is cancelled (its `async with`
    # blocks close the raw log), then KeyboardInterrupt reaches the caller.
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT is not Python's default handler here")
    monkeypatch.setenv(client_loop.LOOP_ENV, which)
    seen = []

    async def main() -> None:
        try:
            asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), signal.SIGINT)
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append(await running_loop_module())
            raise

    with pytest.raises(KeyboardInterrupt):
        client_loop.run(main())
    assert len(seen) == 1 and seen[0].startswith(which)
