"""The inference engine against a bare asyncio + httpx loop, on the same emulator, in one run.

    python bench/inference.py [--requests 20000] [--concurrency 2000] [--latency-mean 2.0]

Starts the emulator in its own process (lognormal latency), then sends the same requests twice:
once through `specregen.client.engine.run_inference` (raw log, retries, accounting included) and
once through a minimal loop: 2,000 workers over sharded `httpx.AsyncClient`s of 100
connections, posting and parsing JSON, nothing else. Prints the makespan ratio (target <= 1.10),
client CPU seconds per 1,000 requests for both and their ratio (target <= 1.3), and the mean
in-flight / window before the tail of both, sampled alike, and their ratio (target >= 0.95).
bench/window.py measures the window on in-process fake servers (uneven latencies, backoffs).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specregen.client.config import EndpointConfig
from specregen.client.engine import ProgressSnapshot, run_inference
from specregen.client.request import build_request
from specregen.records import Prompt
from specregen.store.rawlog import RawLog


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_emulator(port: int, latency_mean: float) -> subprocess.Popen:
    cmd = [
        sys.executable, "-m", "specregen.cli", "emulator", "--port", str(port),
        "--tokenizer", "mini", "--latency", "lognormal", "--latency-mean", str(latency_mean),
        "--latency-sigma", "0.5", "--seed", "1",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1).raise_for_status()
            return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"the emulator did not start: {proc.stderr.read().decode()[-2000:]}")


def make_prompts(n: int) -> list[Prompt]:
    # Short answers: the benchmark measures the client, not text generation.
    return [
        Prompt(
            sample_id=f"b{i}",
            messages=[
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": f"Say hello number {i}."},
            ],
        )
        for i in range(n)
    ]


def endpoint(base_url: str, concurrency: int, per_client: int) -> EndpointConfig:
    return EndpointConfig(
        base_url=base_url, model="moonshotai/kimi-k2.5", stream=False, concurrency=concurrency,
        connections_per_shard=per_client, sampling={"max_tokens": 64},
    )


async def engine_run(prompts, cfg, folder) -> tuple[float, float, float]:
    window = cfg.concurrency
    n = len(prompts)
    fills: list[float] = []

    def progress(snap: ProgressSnapshot) -> None:
        # Before the tail: some samples have not been sent yet (this run has no retries, so
        # requests sent counts samples started). The first second is the ramp-up.
        if snap.requests_sent < n and snap.elapsed_s > 1.0:
            fills.append(snap.in_flight / window)

    cpu = time.process_time()
    start = time.perf_counter()
    async with RawLog(folder) as log:
        summary = await run_inference(prompts, cfg, log, api_key=None, progress=progress,
                                      progress_interval=0.1)
    wall = time.perf_counter() - start
    assert summary.done == n, f"the engine finished {summary.done} of {n}: {summary.errors}"
    return wall, time.process_time() - cpu, sum(fills) / max(1, len(fills))


async def bare_run(prompts, cfg) -> tuple[float, float, float]:
    # The same sharding as the engine, so the comparison isolates what the engine adds.
    per_client = cfg.connections_per_shard
    shards = math.ceil(cfg.concurrency / per_client)
    limits = httpx.Limits(max_connections=per_client, max_keepalive_connections=per_client)
    tls = httpx.create_ssl_context()
    clients = [
        httpx.AsyncClient(base_url=cfg.base_url, timeout=120, limits=limits, verify=tls)
        for _ in range(shards)
    ]
    queue = iter(prompts)
    done = started = in_flight = 0
    fills: list[float] = []

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal done, started, in_flight
        for prompt in queue:
            started += 1
            in_flight += 1
            try:
                response = await client.post("/chat/completions",
                                             json=build_request(prompt, cfg))
            finally:
                in_flight -= 1
            response.raise_for_status()
            response.json()
            done += 1

    async def sample() -> None:
        # As the engine's progress is sampled: every 0.1 s before the tail, after the first s.
        while True:
            await asyncio.sleep(0.1)
            if started < len(prompts) and time.perf_counter() - start > 1.0:
                fills.append(in_flight / cfg.concurrency)

    cpu = time.process_time()
    start = time.perf_counter()
    sampler = asyncio.ensure_future(sample())
    await asyncio.gather(*(worker(clients[i % shards]) for i in range(cfg.concurrency)))
    wall = time.perf_counter() - start
    sampler.cancel()
    for client in clients:
        await client.aclose()
    assert done == len(prompts)
    return wall, time.process_time() - cpu, sum(fills) / max(1, len(fills))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=2_000)
    parser.add_argument("--latency-mean", type=float, default=2.0)
    parser.add_argument("--connections-per-client", type=int, default=None,
                        help="default: the engine's own default")
    args = parser.parse_args()

    port = free_port()
    emulator = start_emulator(port, args.latency_mean)
    try:
        per_client = args.connections_per_client or EndpointConfig.model_fields[
            "connections_per_shard"].default
        cfg = endpoint(f"http://127.0.0.1:{port}/v1", args.concurrency, per_client)
        prompts = make_prompts(args.requests)
        # Warm the emulator up; then the baseline goes first, so whatever the emulator caches
        # favours the baseline, not the engine.
        asyncio.run(bare_run(prompts[: args.concurrency], cfg))
        b_wall, b_cpu, b_fill = asyncio.run(bare_run(prompts, cfg))
        with tempfile.TemporaryDirectory() as folder:
            e_wall, e_cpu, fill = asyncio.run(engine_run(prompts, cfg, folder))
    finally:
        emulator.terminate()
        emulator.wait(timeout=10)
    per_k = 1000 / args.requests
    print(f"requests: {args.requests}  concurrency: {args.concurrency}  "
          f"connections per client: {cfg.connections_per_shard}  "
          f"emulator latency: lognormal mean {args.latency_mean}s  cores: {os.cpu_count()}")
    print(f"engine: makespan {e_wall:.2f} s, client CPU {e_cpu * per_k:.3f} s / 1000 requests")
    print(f"bare:   makespan {b_wall:.2f} s, client CPU {b_cpu * per_k:.3f} s / 1000 requests")
    print(f"makespan ratio engine/bare: {e_wall / b_wall:.3f}  (target <= 1.10)")
    print(f"client CPU ratio engine/bare: {e_cpu / b_cpu:.3f}  (target <= 1.3)")
    print(f"mean in-flight / window before the tail: engine {fill:.3f}, bare {b_fill:.3f},"
          f" ratio engine/bare {fill / b_fill:.3f}  (target >= 0.95)")


if __name__ == "__main__":
    main()
