"""Client CPU of streamed answers: per SSE event, per completion token, before vs after.

    python bench/streaming.py [--streams 500 1000 2000] [--tokens 2000] [--seconds 8]

Starts the emulator in its own process, answering every request with a K2.5-length answer
(`--tokens` completion tokens: 3/4 reasoning, 1/4 content) streamed in the emulator's realistic
chunks (1-12 characters per event, ~2 tokens) and spread over `--seconds` (each event is its own
write, as a paced stream arrives). For each concurrency level the same requests run twice in
this process:

* before: the stream path as it was (httpx `aiter_lines` -> str SSE decoder -> `json.loads` ->
  field-by-field assembler; bench/sse_baseline.py is a frozen copy of it);
* httpx: `specregen.client.transport.send` over a plain `httpx.AsyncClient` (the cheaper byte
  path of the previous session, still what a custom transport or a proxy gets);
* aiohttp: `send` over `transport.HTTPClient`, the engine's client: the same byte path, read
  through aiohttp's C HTTP parser instead of httpcore/h11;
* after: the same as aiohttp, on the event loop `specregen infer` runs
  (`specregen.client.loop`: uvloop when installed).

before, httpx and aiohttp run on asyncio's default loop.

Client CPU is this process's CPU time (the emulator has its own process). Printed: CPU per event,
per 1,000 completion tokens, the after/before and after/aiohttp (the loop's share) ratios,
and how many 2,000-token streams at
50 tokens/s one core sustains (1 / (CPU per token x 50)); target >= 2,000. A loaded emulator
coalesces events into fewer network reads, which makes every path cheaper per event, so only
paths measured in the same run compare.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import sse_baseline as baseline

from specregen.client import loop as client_loop
from specregen.client.config import EndpointConfig
from specregen.client.transport import HTTPClient, judge_body, send

TOKENS_PER_SECOND = 50
PATHS = ("before", "httpx", "aiohttp", "after")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(port: int, tokens: int, seconds: float) -> None:
    """The emulator in this (child) process."""
    from specregen.emulator.config import EmulatorConfig
    from specregen.emulator.server import serve_forever
    from specregen.models.tokenizer import load_tokenizer

    config = EmulatorConfig(
        reasoning_tokens_mean=tokens * 3 // 4, content_tokens_mean=tokens // 4,
        length_sigma=0.05, tool_call_rate=0.0, latency="fixed", latency_mean=seconds,
        seed=1,
    )
    serve_forever(config, load_tokenizer("mini"), port=port)


def start_emulator(port: int, tokens: int, seconds: float) -> subprocess.Popen:
    cmd = [sys.executable, __file__, "--serve", str(port), "--tokens", str(tokens),
           "--seconds", str(seconds)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1).raise_for_status()
            return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"the emulator did not start: {proc.stderr.read().decode()[-2000:]}")


def body(i: int) -> dict:
    # One prompt for all: the emulator generates the answer once and caches it, so its CPU
    # goes to streaming, not to writing text. The client still parses every event.
    return {"model": "moonshotai/kimi-k2.5", "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "Write a long, careful answer."}]}


async def before_one(client: httpx.AsyncClient, url: str, payload: dict) -> tuple[int, int]:
    """The pre-issue-11 stream loop (transport._stream as it was), minus its timeouts."""
    events = 0
    async with client.stream("POST", url, content=json.dumps(payload).encode(),
                             headers={"Content-Type": "application/json",
                                      "Accept": "text/event-stream"}) as response:
        decoder = baseline.SSEDecoder()
        assembler = baseline.StreamAssembler()
        done = False
        async for line in response.aiter_lines():
            if done:
                continue
            event = decoder.feed(line)
            if event is None:
                continue
            events += 1
            chunk = baseline.parse_event(event)
            if chunk is None:
                done = True
                continue
            assembler.add(chunk)
    result = judge_body(assembler.result(), 200)
    assert result.status == "ok", result.error_message
    return events, result.response["usage"]["completion_tokens"]


async def after_one(client: httpx.AsyncClient, cfg: EndpointConfig,
                    payload: dict) -> tuple[int, int]:
    result = await send(client, cfg, payload, None)
    assert result.status == "ok", result.error_message
    return 0, result.response["usage"]["completion_tokens"]


async def run_level(base: str, streams: int, which: str) -> dict:
    cfg = EndpointConfig(base_url=base, model="moonshotai/kimi-k2.5", dialect="vllm",
                         concurrency=streams, connections_per_shard=25)
    per = cfg.connections_per_shard
    limits = httpx.Limits(max_connections=per, max_keepalive_connections=per)
    # The engine's shard clients: HTTPClient for aiohttp/after, a plain httpx client otherwise.
    kind = HTTPClient if which in ("aiohttp", "after") else httpx.AsyncClient
    clients = [kind(limits=limits, timeout=httpx.Timeout(300.0))
               for _ in range(math.ceil(streams / per))]
    url = cfg.chat_url
    totals = {"events": 0, "tokens": 0}

    async def one(i: int) -> None:
        client = clients[i // per]
        if which == "before":
            events, tokens = await before_one(client, url, body(i))
        else:
            events, tokens = await after_one(client, cfg, body(i))
        totals["events"] += events
        totals["tokens"] += tokens

    cpu = time.process_time()
    wall = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(streams)))
    cpu = time.process_time() - cpu
    wall = time.monotonic() - wall
    for client in clients:
        await client.aclose()
    return {"cpu": cpu, "wall": wall, **totals}


def run_path(coro, which: str):
    """"after" on the CLI's loop (the same function `specregen infer` calls); the others on
    asyncio's default loop."""
    if which == "after":
        return client_loop.run(coro)
    return asyncio.run(coro)


def count_events(base: str) -> int:
    """Events of one answer (the same for every request), counted on the raw stream."""
    with httpx.stream("POST", base + "/chat/completions", json=body(0), timeout=300) as r:
        return sum(1 for line in r.iter_lines() if line.startswith("data:"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, nargs="+", default=[500, 1000, 2000])
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS),
                        help="paths to measure (before and after are always measured)")
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve, args.tokens, args.seconds)
        return
    port = free_port()
    emulator = start_emulator(port, args.tokens, args.seconds)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        events_per_answer = count_events(base)
        paths = [p for p in PATHS if p in {"before", "after", *args.paths}]
        print(f"answer: {events_per_answer} SSE events; {os.cpu_count()} CPUs, load"
              f" {os.getloadavg()[0]:.1f}; after runs on {client_loop.loop_name()}")
        print(f"{'streams':>8} {'path':>7} {'wall s':>7} {'cpu s':>7} {'us/event':>9}"
              f" {'cpu s/1k tok':>12} {'streams/core @50 tok/s':>23}")
        summary = []
        for streams in args.streams:
            best: dict[str, float] = {}
            # Alternating rounds; the least disturbed (lowest) CPU of each path counts: the
            # machine is shared, and a busy neighbour only ever adds CPU time.
            for _ in range(args.rounds):
                for which in paths:
                    r = run_path(run_level(base, streams, which), which)
                    events = streams * events_per_answer
                    per_token = r["cpu"] / max(1, r["tokens"])
                    sustained = 1.0 / (per_token * TOKENS_PER_SECOND)
                    best[which] = min(best.get(which, math.inf), per_token)
                    print(f"{streams:>8} {which:>7} {r['wall']:>7.1f} {r['cpu']:>7.2f}"
                          f" {1e6 * r['cpu'] / events:>9.1f} {1e3 * per_token:>12.4f}"
                          f" {sustained:>23,.0f}", flush=True)
            summary.append((streams, best))
        print(f"\nbest of {args.rounds} rounds: client CPU s per 1,000 completion tokens, and"
              f" 2,000-token streams at {TOKENS_PER_SECOND} tokens/s one core sustains"
              f" (target >= 2,000)")
        loop_ratio = "aiohttp" in paths
        print(f"{'streams':>8}" + "".join(f" {p + ' s/1k':>12} {p + ' str/core':>16}"
                                          for p in paths) + f" {'after/before':>13}"
              + (f" {'after/aiohttp':>14}" if loop_ratio else ""))
        for streams, best in summary:
            cells = "".join(f" {1e3 * best[p]:>12.4f}"
                            f" {1.0 / (best[p] * TOKENS_PER_SECOND):>16,.0f}" for p in paths)
            print(f"{streams:>8}{cells} {best['after'] / best['before']:>13.3f}"
                  + (f" {best['after'] / best['aiohttp']:>14.3f}" if loop_ratio else ""),
                  flush=True)
    finally:
        emulator.terminate()
        emulator.wait(10)


if __name__ == "__main__":
    main()
