"""Cost of the same prompts through the batch API vs realtime, on the emulator's price table.

    python bench/cost.py [--prompts 20000] [--api openrouter|openai-files] [--concurrency 256]

Starts an emulator (its own process), sends the same prompts once through
`specregen.client.batch.run_batch_inference` (batches of at most 5,000) and once through the
realtime engine, each into its own raw log, and prints what each cost (the API's `usage.cost`,
summed by the client exactly as `specregen infer` does), the batch/realtime ratio (target
<= 0.55) and the batch run's cost view (projected total, savings against realtime).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specregen.client.batch import run_batch_inference
from specregen.client.config import EndpointConfig
from specregen.client.engine import run_inference
from specregen.records import Prompt
from specregen.store.rawlog import RawLog


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(port: int, profile: str) -> None:
    from specregen.emulator.config import EmulatorConfig
    from specregen.emulator.server import serve_forever
    from specregen.models.tokenizer import load_tokenizer

    serve_forever(EmulatorConfig(profile=profile, seed=3, max_cached=50_000),
                  load_tokenizer("mini"), port=port)


def start_emulator(port: int, profile: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, __file__, "--serve", str(port), "--profile", profile],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1).raise_for_status()
            return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"the emulator did not start: {proc.stderr.read().decode()[-2000:]}")


def prompts(n: int) -> list[Prompt]:
    return [Prompt(sample_id=f"c{i}", messages=[
        {"role": "system", "content": "You are a careful assistant."},
        {"role": "user", "content": f"Explain item {i} in a few sentences."}]) for i in range(n)]


async def run(cfg: EndpointConfig, out: str, items: list[Prompt]):
    async with RawLog(out) as log:
        if cfg.mode == "batch":
            return await run_batch_inference(items, cfg, log, api_key=None)
        return await run_inference(items, cfg, log, api_key=None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=20_000)
    parser.add_argument("--api", choices=["openrouter", "openai-files"], default="openrouter")
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--profile", default="openrouter", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve, args.profile)
        return
    profile = "openrouter" if args.api == "openrouter" else "moonshot"
    port = free_port()
    emulator = start_emulator(port, profile)
    base = f"http://127.0.0.1:{port}" + ("/api/v1" if args.api == "openrouter" else "/v1")
    common = {
        "base_url": base, "model": "moonshotai/kimi-k2.5",
        "dialect": "openrouter" if args.api == "openrouter" else "moonshot",
        # The emulator's price table (EmulatorConfig.price_*: USD per token) per million; its
        # batch price is batch_price_share (0.5) of it, i.e. batch_discount 0.5. usage.cost is
        # what both runs sum.
        "prices": {"prompt_per_million": 0.6, "completion_per_million": 2.5,
                   "batch_discount": 0.5},
        "stream": False, "concurrency": args.concurrency,
    }
    if args.api == "openrouter":
        common["provider"] = {"only": ["moonshotai"]}
    batch_cfg = EndpointConfig.load({**common, "mode": "batch",
                                     "batch": {"api": args.api, "poll_seconds": 0.2}})
    real_cfg = EndpointConfig.load({**common, "mode": "realtime"})
    items = prompts(args.prompts)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            t = time.monotonic()
            batch = asyncio.run(run(batch_cfg, f"{tmp}/batch", items))
            batch_wall = time.monotonic() - t
            t = time.monotonic()
            real = asyncio.run(run(real_cfg, f"{tmp}/realtime", items))
            real_wall = time.monotonic() - t
    finally:
        emulator.terminate()
        emulator.wait(10)
    assert batch.done == real.done == args.prompts, (batch.done, real.done)
    print(f"{args.prompts} prompts, {args.api} batch API vs realtime, emulator price table")
    print(f"  batch:    ${batch.cost_usd:.4f}  ({batch.batches_submitted} batches,"
          f" {batch.completion_tokens} completion tokens, {batch_wall:.1f} s)")
    print(f"  realtime: ${real.cost_usd:.4f}  ({real.requests_sent} requests,"
          f" {real.completion_tokens} completion tokens, {real_wall:.1f} s)")
    print(f"  batch cost view: spent ${batch.cost_usd:.4f}, projected ${batch.projected_usd:.4f},"
          f" realtime equivalent ${batch.realtime_equivalent_usd:.4f},"
          f" savings ${batch.savings_usd:.4f}")
    ratio = batch.cost_usd / real.cost_usd if real.cost_usd else float("nan")
    print(f"cost ratio batch/realtime: {ratio:.3f} (target <= 0.55)")


if __name__ == "__main__":
    main()
