"""What live progress costs the inference client: 20,000 emulator prompts with and without it.

    python bench/progress.py [--requests 20000] [--concurrency 2000] [--rounds 2]

Starts the emulator in its own process (as bench/inference.py does), then runs the engine over
the same prompts in alternating rounds: without a progress callback, and with the one
`specregen infer` uses (`progress.engine_observer` into a `Progress` shown by `TerminalView` on
a terminal console writing to memory, so the rendering is paid and the terminal's own I/O is
not). Prints the client CPU seconds of both (median over rounds), their ratio (target: <= 1.02),
and the CPU spent inside the progress callback itself, measured directly, as a share of the
client CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console

from specregen.client.config import EndpointConfig
from specregen.client.engine import run_inference
from specregen.progress import engine_observer, live_progress
from specregen.store.rawlog import RawLog


def _bench_inference():
    path = Path(__file__).resolve().with_name("inference.py")
    spec = importlib.util.spec_from_file_location("bench_inference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def one_run(prompts, cfg, folder: str, with_progress: bool) -> tuple[float, float, int]:
    """Client CPU seconds, CPU seconds inside the progress callback, and repaints."""
    inside = 0.0
    repaints = 0
    cpu = time.process_time()
    async with RawLog(folder) as log:
        if not with_progress:
            summary = await run_inference(prompts, cfg, log, api_key=None)
        else:
            console = Console(file=io.StringIO(), force_terminal=True, width=120)
            with live_progress("infer", len(prompts), console=console) as progress:
                feed = engine_observer(progress)

                def callback(snap) -> None:
                    nonlocal inside, repaints
                    start = time.process_time()
                    before = progress._last_emit
                    feed(snap)
                    repaints += progress._last_emit != before
                    inside += time.process_time() - start

                summary = await run_inference(prompts, cfg, log, api_key=None,
                                              progress=callback)
    assert summary.done == len(prompts), f"{summary.done} of {len(prompts)}: {summary.errors}"
    return time.process_time() - cpu, inside, repaints


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=2_000)
    parser.add_argument("--latency-mean", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    bench = _bench_inference()
    port = bench.free_port()
    emulator = bench.start_emulator(port, args.latency_mean)
    results: dict[bool, list[tuple[float, float, int]]] = {False: [], True: []}
    try:
        per_client = EndpointConfig.model_fields["connections_per_shard"].default
        cfg = bench.endpoint(f"http://127.0.0.1:{port}/v1", args.concurrency, per_client)
        prompts = bench.make_prompts(args.requests)
        with tempfile.TemporaryDirectory() as warm:
            asyncio.run(one_run(prompts[: args.concurrency], cfg, warm, False))
        for _ in range(args.rounds):
            for with_progress in (False, True):
                with tempfile.TemporaryDirectory() as folder:
                    results[with_progress].append(
                        asyncio.run(one_run(prompts, cfg, folder, with_progress)))
    finally:
        emulator.terminate()
        emulator.wait(timeout=10)
    off = statistics.median(r[0] for r in results[False])
    on = statistics.median(r[0] for r in results[True])
    inside = statistics.median(r[1] for r in results[True])
    repaints = statistics.median(r[2] for r in results[True])
    print(f"requests: {args.requests:,}  concurrency: {args.concurrency:,}  rounds: {args.rounds}")
    print(f"client CPU without progress: {off:.2f} s  "
          f"({', '.join(f'{r[0]:.2f}' for r in results[False])})")
    print(f"client CPU with progress:    {on:.2f} s  "
          f"({', '.join(f'{r[0]:.2f}' for r in results[True])})")
    print(f"ratio with / without: {on / off:.3f}  (target <= 1.02; run-to-run noise included)")
    print(f"CPU inside the progress callback: {inside:.3f} s over {repaints:.0f} repaints = "
          f"{inside / on:.2%} of the client CPU  (target < 2%)")


if __name__ == "__main__":
    main()
