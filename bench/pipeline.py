"""The dataset pipeline under Prefect against the library path, and its memory as data grows.

    python bench/pipeline.py [--samples 20000] [--rss-small 10000] [--rss-large 100000]
                             [--skip-rss] [--keep DIR]

1. Wall time. One JSONL source of `--samples` rows (`messages` adapter: system + short user
   turn) goes through the pipeline twice, each time into its own fresh storage folder and
   against its own fresh zero-latency emulator process (so the emulator's completion cache
   favours neither): once through `specregen.pipeline.run.run_dataset` (the library path) and
   once through `flows.pipeline.pipeline_flow` for that one dataset (the Prefect path). Each
   path runs in a fresh Python process, so neither inherits the other's imports, tokenizer,
   reconstruction workers or garbage. The Prefect path talks to a `prefect server start`
   subprocess (SQLite) on a free loopback port whose PREFECT_HOME, database and result storage
   live in the benchmark's temp folder, the way `infra/server.sh` runs in production; the
   server is started before the clock starts (a one-off cost of a long-lived server, not of a
   pipeline run). The wall time of a path is its `pipeline_flow(...)` / `run_dataset(...)` call.
   Prints both and the ratio Prefect/library (target <= 1.15).
2. Memory. The library path at `--rss-small` and `--rss-large` samples, each in a fresh child
   process with the emulator in its own process; prints the child's peak RSS (ru_maxrss of
   RUSAGE_SELF) and the largest peak of its reconstruction worker processes (RUSAGE_CHILDREN),
   the ratio large/small of the pipeline process (target <= 1.3), and the peak RSS during each
   stage, so a stage whose memory grows with the dataset is named.

Both paths must publish the same number of samples, every prompt must have been requested
(nothing skipped from an earlier run) and gated; anything else exits non-zero with the reason.
The gate threshold is 1.0 (the emulator writes literal markers now and then, which the gate
quarantines): this measures speed and memory, not quality.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DATASET = "bench_messages"
RESULT_TAG = "BENCH-RESULT "
SERVER_PORT_ENV = "SPECREGEN_BENCH_PREFECT_PORT"

# Completions: short, so the run measures the pipeline's own work (requests, raw log,
# reconstruction, gate, publish) within minutes on 2 cores, not text generation.
WALL_LENGTHS = {"reasoning": 24, "content": 16, "max_tokens": 64, "concurrency": 256}
# The emulator's floor is 8 tokens per text segment; the larger window keeps 100k samples short.
RSS_LENGTHS = {"reasoning": 8, "content": 8, "max_tokens": 32, "concurrency": 400}

TOPICS = ("binary search", "a CSV parser", "rate limiting", "unit tests", "a linked list",
          "HTTP caching", "regular expressions", "a thread pool", "JSON schemas", "hash maps")


class BenchError(SystemExit):
    """A path did not do the work it was timed for; the message says what is wrong."""

    def __init__(self, message: str) -> None:
        super().__init__(f"bench/pipeline.py: FAILED: {message}")


# --- inputs -------------------------------------------------------------------------------------


def write_source(path: Path, samples: int) -> Path:
    """A `messages` JSONL of distinct short prompts (distinct: each is a new request)."""
    with path.open("w", encoding="utf-8") as out:
        for i in range(samples):
            row = {
                "id": f"bench-{i:07d}",
                "messages": [
                    {"role": "system", "content": "You are a concise programming assistant."},
                    {"role": "user", "content": f"In two sentences, explain "
                                                f"{TOPICS[i % len(TOPICS)]} (note {i})."},
                ],
            }
            out.write(json.dumps(row) + "\n")
    return path


def write_config(path: Path, *, storage: Path, source: Path, base_url: str,
                 lengths: dict[str, int]) -> Path:
    config = {
        "storage": str(storage),
        "tokenizer": "mini",
        "endpoint": {
            "base_url": base_url,
            "model": "moonshotai/kimi-k2.5",
            "dialect": "openrouter",
            # Unset on purpose: a loopback endpoint runs without a key.
            "api_key_env": "SPECREGEN_BENCH_KEY",
            "stream": False,
            "return_token_ids": True,
            "concurrency": lengths["concurrency"],
            "sampling": {"max_tokens": lengths["max_tokens"]},
        },
        "chunk_size": 1000,
        "chunks_in_flight": 4,
        "reconstruct_workers": 2,
        "export_specforge": False,
        "datasets": [{"name": DATASET, "adapter": "messages", "source": str(source),
                      "gate": {"max_quarantine_share": 1.0}}],
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


# --- processes ----------------------------------------------------------------------------------


@contextlib.contextmanager
def emulator_process(lengths: dict[str, int], log_path: Path) -> Iterator[str]:
    """A fresh emulator in its own process; yields its OpenRouter-style base URL."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--emulator-child",
           "--reasoning-tokens", str(lengths["reasoning"]),
           "--content-tokens", str(lengths["content"])]
    with log_path.open("ab") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode().strip()
        if not line.startswith("http://"):
            proc.wait(timeout=10)
            raise BenchError(f"the emulator did not start; see {log_path}")
        yield line
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def serve_emulator(reasoning: int, content: int) -> None:
    from specregen.emulator.config import EmulatorConfig
    from specregen.emulator.server import serve_forever
    from specregen.models.tokenizer import load_tokenizer

    config = EmulatorConfig(seed=0, reasoning_tokens_mean=reasoning, content_tokens_mean=content)

    def announce(host: str, port: int) -> None:
        print(f"http://{host}:{port}/api/v1", flush=True)

    with contextlib.suppress(KeyboardInterrupt):
        serve_forever(config, load_tokenizer("mini"), "127.0.0.1", 0, on_listening=announce)


def run_child(args: list[str], env: dict[str, str], log_path: Path) -> dict[str, Any]:
    """Run this file as a child process; its last tagged stdout line is its result."""
    cmd = [sys.executable, str(Path(__file__).resolve()), *args]
    with log_path.open("ab") as err:
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=err, check=False)
    lines = [x for x in proc.stdout.decode().splitlines() if x.startswith(RESULT_TAG)]
    if proc.returncode != 0 or not lines:
        tail = log_path.read_text(errors="replace")[-3000:]
        raise BenchError(f"child {' '.join(args)} exited {proc.returncode}; "
                         f"log {log_path}:\n{tail}")
    return json.loads(lines[-1][len(RESULT_TAG):])


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("PREFECT_API_URL", None)
    env.pop("SPECREGEN_BENCH_KEY", None)
    env.update(extra or {})
    return env


def prefect_env(root: Path, api_url: str) -> dict[str, str]:
    # The client's PREFECT_HOME and result storage: temp folders, never ~/.prefect.
    return {
        "PREFECT_API_URL": api_url,
        "PREFECT_HOME": str(root / "client-home"),
        "PREFECT_LOCAL_STORAGE_PATH": str(root / "results"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",
    }


# --- children: one pipeline run each ------------------------------------------------------------


class StageMemory:
    """Peak RSS while each library stage runs, sampled from /proc by a background thread.

    The stage functions are wrapped where `run_dataset` looks them up (this process only), so
    the run itself is unchanged; only which stage is current is recorded.
    """

    STAGES = ("prepare_prompts", "infer_chunk", "reconstruct_dataset", "gate_dataset",
              "publish_dataset")

    def __init__(self, interval: float = 0.05) -> None:
        self.interval = interval
        self.stage = "start"
        self.peaks: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    @staticmethod
    def rss_bytes() -> int:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _sample(self) -> None:
        while not self._stop.is_set():
            rss = self.rss_bytes()
            self.peaks[self.stage] = max(self.peaks.get(self.stage, 0), rss)
            self._stop.wait(self.interval)

    def install(self) -> None:
        import specregen.pipeline.run as run_module

        for name in self.STAGES:
            setattr(run_module, name, self._wrap(name, getattr(run_module, name)))
        self._thread.start()

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        if asyncio.iscoroutinefunction(fn):
            async def async_stage(*args: Any, **kwargs: Any) -> Any:
                self.stage = name
                return await fn(*args, **kwargs)
            return async_stage

        def stage(*args: Any, **kwargs: Any) -> Any:
            self.stage = name
            try:
                return fn(*args, **kwargs)
            finally:
                # Catch the stage's own peak before the next stage starts.
                self.peaks[name] = max(self.peaks.get(name, 0), self.rss_bytes())
        return stage

    def stop(self) -> dict[str, int]:
        self._stop.set()
        self._thread.join()
        return dict(self.peaks)


def run_library(config_path: str) -> dict[str, Any]:
    from specregen.config import load_config
    from specregen.pipeline.layout import DatasetRun
    from specregen.pipeline.run import resolve_api_key, run_dataset

    config = load_config(config_path)
    run = DatasetRun(config, config.dataset(DATASET))
    key = resolve_api_key(config)
    started = time.perf_counter()
    result = asyncio.run(run_dataset(run, key))
    wall = time.perf_counter() - started
    return {"wall_s": wall, "outcome": result.outcome, "summary": result.summary}


def run_prefect(config_path: str) -> dict[str, Any]:
    from flows.demo import drain_prefect_workers
    from flows.pipeline import pipeline_flow

    started = time.perf_counter()
    results = asyncio.run(pipeline_flow(config_path, datasets=[DATASET]))
    wall = time.perf_counter() - started
    # Logs and events still queued go to the server before this process exits; not part of
    # the run's wall time (a long-lived worker sends them in the background).
    drained = time.perf_counter()
    drain_prefect_workers()
    (summary,) = results
    return {"wall_s": wall, "drain_s": time.perf_counter() - drained,
            "outcome": summary.get("outcome"), "summary": summary}


def published_samples(config_path: str) -> int | None:
    from specregen.config import load_config
    from specregen.pipeline.layout import DatasetRun
    from specregen.pipeline.publish import published

    config = load_config(config_path)
    manifest = published(DatasetRun(config, config.dataset(DATASET)))
    return None if manifest is None else manifest.counts.get("samples")


def child_main(kind: str, config_path: str, stages: bool) -> None:
    memory = StageMemory() if stages else None
    if memory is not None:
        memory.install()
    cpu = time.process_time()
    result = run_prefect(config_path) if kind == "prefect" else run_library(config_path)
    result["cpu_s"] = time.process_time() - cpu
    if memory is not None:
        result["stage_peak_rss"] = memory.stop()
    result["published"] = published_samples(config_path)
    # Linux reports ru_maxrss in KiB; RUSAGE_CHILDREN is the largest of the waited-for
    # children (the reconstruction workers), not their sum.
    result["maxrss_self"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    result["maxrss_children"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    print(RESULT_TAG + json.dumps(result, default=str), flush=True)


# --- checks -------------------------------------------------------------------------------------


def check_run(name: str, result: dict[str, Any], samples: int) -> int:
    """The published count of a run that did all of its work; raises BenchError otherwise."""
    summary = result["summary"]
    gate = summary.get("gate") or {}
    problems = []
    if result["outcome"] != "published":
        problems.append(f"outcome {result['outcome']!r}, not 'published' (skipped or stopped?)")
    if summary.get("prompts") != samples:
        problems.append(f"{summary.get('prompts')} prompts, expected {samples}")
    if summary.get("requests_sent", 0) < samples:
        problems.append(f"only {summary.get('requests_sent')} requests sent for {samples} "
                        "prompts (answers reused from an earlier run?)")
    if summary.get("failed_requests"):
        problems.append(f"{summary['failed_requests']} requests failed for good")
    if gate.get("samples") != samples:
        problems.append(f"the gate saw {gate.get('samples')} samples, expected {samples}")
    if result["published"] is None:
        problems.append("no published manifest")
    elif result["published"] != gate.get("accepted"):
        problems.append(f"published {result['published']} but the gate accepted "
                        f"{gate.get('accepted')}")
    elif result["published"] < 0.9 * samples:
        # A benchmark of a pipeline that quarantines most of its input measures the wrong thing.
        problems.append(f"only {result['published']} of {samples} published")
    if problems:
        raise BenchError(f"{name} path: " + "; ".join(problems))
    return result["published"]


# --- the two measurements -----------------------------------------------------------------------


@contextlib.contextmanager
def prefect_server(root: Path) -> Iterator[str]:
    from flows.demo import free_port
    from flows.demo import prefect_server as start_server

    port = int(os.environ.get(SERVER_PORT_ENV) or free_port())
    with start_server(root / "server-home", port, keep=False, log=lambda _: None) as api_url:
        yield api_url


def wall_comparison(root: Path, samples: int) -> tuple[float, float]:
    source = write_source(root / "wall-source.jsonl", samples)
    results: dict[str, dict[str, Any]] = {}
    started = time.perf_counter()
    with prefect_server(root / "prefect") as api_url:
        server_ready = time.perf_counter() - started
        for kind in ("library", "prefect"):
            folder = root / f"wall-{kind}"
            folder.mkdir()
            with emulator_process(WALL_LENGTHS, folder / "emulator.log") as base_url:
                config = write_config(folder / "config.yaml", storage=folder / "store",
                                      source=source, base_url=base_url, lengths=WALL_LENGTHS)
                extra = prefect_env(root / "prefect", api_url) if kind == "prefect" else {}
                results[kind] = run_child(["--child", kind, "--config", str(config)],
                                          child_env(extra), folder / "child.log")
    lib, pre = results["library"], results["prefect"]
    published = {kind: check_run(kind, r, samples) for kind, r in results.items()}
    if published["library"] != published["prefect"]:
        raise BenchError(f"the paths published different counts: {published}")
    print(f"samples: {samples}, published by each path: {published['library']} "
          f"(chunk_size 1000, chunks_in_flight 4, concurrency {WALL_LENGTHS['concurrency']}, "
          f"max_tokens {WALL_LENGTHS['max_tokens']}, cores {os.cpu_count()})")
    print(f"prefect server ready in {server_ready:.1f} s (not timed); prefect client CPU "
          f"{pre['cpu_s']:.1f} s, library client CPU {lib['cpu_s']:.1f} s; "
          f"prefect log/event drain after the run {pre['drain_s']:.1f} s (not timed)")
    ratio = pre["wall_s"] / lib["wall_s"]
    print(f"wall: prefect {pre['wall_s']:.1f} s, library {lib['wall_s']:.1f} s, "
          f"ratio {ratio:.2f} (target <= 1.15)", flush=True)
    return pre["wall_s"], lib["wall_s"]


def rss_run(root: Path, samples: int) -> dict[str, Any]:
    folder = root / f"rss-{samples}"
    folder.mkdir()
    source = write_source(folder / "source.jsonl", samples)
    with emulator_process(RSS_LENGTHS, folder / "emulator.log") as base_url:
        config = write_config(folder / "config.yaml", storage=folder / "store", source=source,
                              base_url=base_url, lengths=RSS_LENGTHS)
        result = run_child(["--child", "library", "--config", str(config), "--stages"],
                           child_env(), folder / "child.log")
    check_run(f"library ({samples} samples)", result, samples)
    return result


def rss_comparison(root: Path, small: int, large: int) -> None:
    results = {}
    for n in (small, large):
        results[n] = r = rss_run(root, n)
        stages = ", ".join(f"{k} {v / 2**20:.0f}" for k, v in r["stage_peak_rss"].items())
        print(f"{n} samples: library wall {r['wall_s']:.1f} s; peak RSS pipeline process "
              f"{mb(r['maxrss_self'])} MB, largest reconstruction worker "
              f"{mb(r['maxrss_children'])} MB; by stage (MB): {stages}", flush=True)
    a, b = results[small], results[large]
    ratio = b["maxrss_self"] / a["maxrss_self"]
    # One chunk is reconstructed in the pipeline process itself: no worker to compare then.
    workers = (f"ratio {b['maxrss_children'] / a['maxrss_children']:.2f}"
               if a["maxrss_children"] else "no workers at the small size")
    print(f"peak RSS: {label(small)} {mb(a['maxrss_self'])} MB, {label(large)} "
          f"{mb(b['maxrss_self'])} MB, ratio {ratio:.2f} (target <= 1.3); reconstruction "
          f"workers {mb(a['maxrss_children'])} / {mb(b['maxrss_children'])} MB, {workers}",
          flush=True)


def mb(n: int) -> str:
    return f"{n / 2**20:.0f}"


def label(n: int) -> str:
    return f"{n // 1000}k" if n % 1000 == 0 else str(n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--rss-small", type=int, default=10_000)
    parser.add_argument("--rss-large", type=int, default=100_000)
    parser.add_argument("--skip-rss", action="store_true", help="only the Prefect comparison")
    parser.add_argument("--skip-wall", action="store_true", help="only the memory comparison")
    parser.add_argument("--keep", type=Path, default=None,
                        help="work in this folder and keep it (logs, stores, configs)")
    # Internal: the processes this benchmark starts.
    parser.add_argument("--child", choices=("library", "prefect"), help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--stages", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--emulator-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--reasoning-tokens", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--content-tokens", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.emulator_child:
        serve_emulator(args.reasoning_tokens, args.content_tokens)
        return
    if args.child:
        child_main(args.child, args.config, args.stages)
        return

    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=False)
            root = args.keep.resolve()
        else:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-pipe-")))
        print(f"work folder: {root}", flush=True)
        if not args.skip_wall:
            wall_comparison(root, args.samples)
        if not args.skip_rss:
            rss_comparison(root, args.rss_small, args.rss_large)
    print(f"benchmark took {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
