"""The event loop of the client's command-line runs (`specregen infer`, bench/streaming.py).

uvloop (libuv) when it is installed, asyncio's default loop otherwise. At 2,000 concurrent
streams the client's remaining cost per SSE event is the loop waking the reading task for every
network read; uvloop's C loop does that wake-up cheaper (bench/streaming.py measures it).
uvloop is a dependency on Linux only, so elsewhere (or with SPECREGEN_EVENT_LOOP=asyncio, the
escape hatch if uvloop misbehaves somewhere) the default loop runs the same code.

Prefect flows and tasks keep Prefect's own loop: only the CLI paths call `run`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from specregen.errors import UsageError

T = TypeVar("T")

LOOP_ENV = "SPECREGEN_EVENT_LOOP"
CHOICES = ("auto", "uvloop", "asyncio")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop constructor, or None for asyncio's default (asyncio.Runner's convention).

    SPECREGEN_EVENT_LOOP: auto (default: uvloop if importable), uvloop (required: an error if
    it is missing), asyncio (the default loop).
    """
    choice = os.environ.get(LOOP_ENV, "auto").strip().lower() or "auto"
    if choice not in CHOICES:
        raise UsageError(f"{LOOP_ENV}={choice!r} is not one of {', '.join(CHOICES)}")
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise UsageError(f"{LOOP_ENV}=uvloop but uvloop is not installed",
                             hint="pip install uvloop (Linux/macOS), or unset it") from None
        return None
    return uvloop.new_event_loop


def loop_name() -> str:
    """The loop `run` uses, for reports ("uvloop" or "asyncio")."""
    return "asyncio" if loop_factory() is None else "uvloop"


def run(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run(main) on the client's loop.

    asyncio.Runner keeps asyncio.run's behaviour on either loop: Ctrl-C cancels `main` (so its
    `async with` blocks close the raw log and the connections) and then raises
    KeyboardInterrupt to the caller.
    """
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
