"""What goes wrong on an attempt, decided up front, and the low-level ways of doing it.

Faults are drawn from an rng of (config seed, attempt number), never from the request: a retry
of a failed request is a new attempt and can succeed, and a run with the same seed and the same
order of attempts fails the same way. At most one response-breaking fault strikes an attempt
(the first whose roll fires, in `FAULT_ORDER`); a stall is drawn on its own and only delays.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import socket
import struct
from dataclasses import dataclass
from typing import Any, Literal

from specregen.emulator.config import EmulatorConfig

FaultKind = Literal["429", "5xx", "reset", "truncated", "error_200", "stream_error", "stall"]
# Faults that end the attempt before any byte of a completion is sent.
EARLY_FAULTS = frozenset({"429", "5xx", "reset"})
FAULT_ORDER: tuple[FaultKind, ...] = (
    "429", "5xx", "reset", "truncated", "error_200", "stream_error"
)


@dataclass(frozen=True, slots=True)
class AttemptPlan:
    fault: FaultKind | None  # the response-breaking fault, if any
    status: int  # the HTTP status of a 5xx fault
    stall: Literal["start", "middle"] | None
    cut: float  # where in the body or the stream a truncation, error or mid stall strikes
    latency: float  # seconds for the whole response
    rng: random.Random  # for what else varies per attempt (keep-alive comments)


def plan_attempt(config: EmulatorConfig, attempt: int, stream: bool) -> AttemptPlan:
    rng = random.Random((config.seed << 64) + attempt)
    rates: dict[FaultKind, float] = {
        "429": config.rate_429,
        "5xx": config.rate_5xx,
        "reset": config.rate_reset,
        "truncated": config.rate_truncated,
        "error_200": 0.0 if stream else config.rate_error_200,
        "stream_error": config.rate_stream_error if stream else 0.0,
    }
    # Every roll is drawn whatever fires, so one rate does not shift the others' sequences.
    rolls = {kind: rng.random() for kind in FAULT_ORDER}
    fault = next((kind for kind in FAULT_ORDER if rolls[kind] < rates[kind]), None)
    status = rng.choice((500, 502, 503))
    stall_roll, stall_where, cut = rng.random(), rng.random(), rng.uniform(0.2, 0.8)
    stall: Literal["start", "middle"] | None = None
    if stall_roll < config.rate_stall and fault not in EARLY_FAULTS:
        stall = "start" if stall_where < 0.5 else "middle"
    return AttemptPlan(fault, status, stall, cut, _latency(config, rng), rng)


def _latency(config: EmulatorConfig, rng: random.Random) -> float:
    mean = config.latency_mean
    if mean <= 0 or config.latency_scale <= 0:
        return 0.0
    if config.latency == "fixed" or config.latency_sigma == 0:
        return mean * config.latency_scale
    sigma = config.latency_sigma
    return rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma) * config.latency_scale


def error_json(code: int, message: str, metadata: dict[str, Any] | None = None) -> bytes:
    """OpenRouter's error shape (SPEC 4.3)."""
    error: dict[str, Any] = {"code": code, "message": message}
    if metadata:
        error["metadata"] = metadata
    return json.dumps({"error": error}).encode()


FAULT_MESSAGES = {
    500: "Internal server error",
    502: "Provider returned error: upstream connection failed",
    503: "No available provider could serve this request",
}


# ---------------------------------------------------------------------------------------------
# Breaking the connection. ASGI has no way to do this, so the app finds uvicorn's transport
# through the `send` callable it is given (a bound method of uvicorn's request cycle, which
# holds the transport) and keeps it in the scope under this key.

TRANSPORT_KEY = "specregen.transport"


def transport_of(send: Any) -> asyncio.Transport | None:
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    # By its methods: uvloop's transports do not derive from asyncio's classes.
    if all(callable(getattr(transport, m, None)) for m in ("abort", "close", "get_extra_info")):
        return transport
    return None


def _require(transport: asyncio.Transport | None) -> asyncio.Transport:
    if transport is None:
        raise RuntimeError(
            "this fault needs the connection's transport, which the emulator reaches only when "
            "served by uvicorn (serve_in_thread or `specregen emulator`)"
        )
    return transport


async def reset_connection(transport: asyncio.Transport | None, receive: Any) -> None:
    """Abort with a TCP RST (SO_LINGER 0), before any response byte."""
    transport = _require(transport)
    sock = transport.get_extra_info("socket")
    if sock is not None:
        # Should this fail, the abort still drops the connection, with a FIN instead of a RST.
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()
    await _until_disconnected(receive)


async def close_connection(transport: asyncio.Transport | None, receive: Any) -> None:
    """Close after what was written is flushed: the client sees a body cut short."""
    transport = _require(transport)
    transport.close()
    await _until_disconnected(receive)


async def _until_disconnected(receive: Any) -> None:
    # Returning before the server noticed the loss would make it log an incomplete response.
    # Ours is its `http.disconnect`; the timeout only guards against a server that never says.
    try:
        while (await asyncio.wait_for(receive(), 2.0)).get("type") != "http.disconnect":
            pass
    except TimeoutError:
        pass
