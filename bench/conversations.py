"""Throughput of whole conversations against single-turn requests, same window, same emulator.

    python bench/conversations.py [--conversations 800] [--concurrency 64] [--latency 0.5]
                                  [--repeat 2]

Starts the emulator in its own process (fixed latency, conversation mode on glaive's
conversations: the ShareGPT conversion's 265 rows, copied with a distinct first question until
there are enough), then:

1. the conversation run: `run_inference` on the whole conversations (`turns: all`): each
   conversation's next request is sent once its previous answer is durable;
2. the baseline: exactly the requests the conversation run sent (the same bodies, so the same
   answers), as independent single-turn prompts, at the same concurrency.

Each is run `--repeat` times, alternating (the box is shared: the best run of each is the one
least disturbed). Prints requests per second of both over the whole run (tail included) and
their ratio (target: the conversation run within 10% of the baseline, ratio >= 0.90), and the
mean in flight while the input lasted (the window kept full across conversations).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specregen.client.config import EndpointConfig
from specregen.client.engine import InferenceSummary, run_inference
from specregen.records import Prompt
from specregen.sources import read_source
from specregen.store.rawlog import RawLog

ROOT = Path(__file__).resolve().parents[1]
GLAIVE = ROOT.parent / "shared" / "datasets" / "B1_glaive_llamafactory_sharegpt_demo.jsonl"

SERVER = """
import sys, time
from specregen.emulator.config import EmulatorConfig
from specregen.emulator.server import serve_in_thread
from specregen.models.tokenizer import load_tokenizer
config = EmulatorConfig(seed=1, conversations=sys.argv[1], divergence_rate=0.2,
                        latency="fixed", latency_mean=float(sys.argv[2]),
                        reasoning_tokens_mean=40, content_tokens_mean=30)
with serve_in_thread(config, load_tokenizer("mini")) as emu:
    print(emu.openrouter_url, flush=True)
    while True:
        time.sleep(3600)
"""


def conversations(n: int) -> list[Prompt]:
    base = [r for r in read_source("sharegpt", GLAIVE, dataset="B1_glaive", turns="all")
            if isinstance(r, Prompt)]
    out: list[Prompt] = []
    copy = 0
    while len(out) < n:
        for prompt in base[: n - len(out)]:
            messages = [dict(m) for m in prompt.messages]
            if copy:
                first = next(m for m in messages if m["role"] == "user")
                first["content"] += f" ({copy})"
            out.append(Prompt(f"{prompt.sample_id}-{copy}", messages, tools=prompt.tools,
                              turns="all"))
        copy += 1
    return out


def write_lines(path: Path, prompts: list[Prompt]) -> None:
    path.write_text("".join(json.dumps({"sample_id": p.sample_id, "messages": p.messages,
                                        "tools": p.tools, "turns": "all"}) + "\n"
                            for p in prompts))


async def run(prompts: list[Prompt], url: str, concurrency: int, out: Path) -> InferenceSummary:
    cfg = EndpointConfig(base_url=url, model="moonshotai/kimi-k2.5", stream=False,
                         concurrency=concurrency, sampling={"max_tokens": 4096})
    async with RawLog(out) as log:
        return await run_inference(prompts, cfg, log, api_key=None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=800)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--latency", type=float, default=0.5)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-conv-"))
    prompts = conversations(args.conversations)
    source = work / "conversations.jsonl"
    write_lines(source, prompts)
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(source), str(args.latency)],
                              stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        url = server.stdout.readline().strip()
        if not url:
            raise SystemExit("the emulator did not start")
        started = time.monotonic()
        convs, singles_runs = [], []
        for n in range(args.repeat):
            out = work / f"conversations-{n}"
            convs.append(asyncio.run(run(prompts, url, args.concurrency, out)))
            bodies = [r["request"] for r in RawLog(out).iter_records() if r.get("final")]
            singles = [Prompt(f"single-{i}", b["messages"], tools=b.get("tools"))
                       for i, b in enumerate(bodies)]
            singles_runs.append(asyncio.run(run(singles, url, args.concurrency,
                                                work / f"single-{n}")))
        total = time.monotonic() - started
    finally:
        server.kill()
        server.wait()

    print(f"conversations: {convs[0].conversations}, stops {convs[0].conversation_stops}")
    print(f"window {args.concurrency}, fixed latency {args.latency} s, {total:.0f} s in all; "
          f"ideal wall {convs[0].requests_sent / args.concurrency * args.latency:.1f} s")
    print(f"{'run':<16}{'requests':>10}{'wall s':>9}{'req/s':>9}{'mean in flight':>16}"
          f"{'(input left)':>14}")
    for n, (c, s1) in enumerate(zip(convs, singles_runs, strict=True)):
        for name, s in ((f"conversations {n}", c), (f"single-turn {n}", s1)):
            print(f"{name:<16}{s.requests_sent:>10}{s.wall_s:>9.1f}"
                  f"{s.requests_sent / s.wall_s:>9.1f}{s.mean_in_flight:>16.1f}"
                  f"{s.mean_in_flight_input:>14.1f}")
    conv = max(convs, key=lambda s: s.requests_sent / s.wall_s)
    single = max(singles_runs, key=lambda s: s.requests_sent / s.wall_s)
    conv_rate = conv.requests_sent / conv.wall_s
    single_rate = single.requests_sent / single.wall_s
    ratio = conv_rate / single_rate
    window = conv.mean_in_flight_input / single.mean_in_flight_input
    print(f"ratio conversations / single-turn (best runs): req/s {ratio:.3f} (target >= 0.90);"
          f" mean in flight while the input lasts {window:.3f}")


if __name__ == "__main__":
    main()
