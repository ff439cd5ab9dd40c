"""The dataset pipeline under Prefect against the library path, and its memory as data grows.

    python bench/pipeline.py [--samples 20000] [--repeat 3] [--rss-small 10000]
                             [--rss-large 100000] [--skip-rss] [--skip-wall] [--keep DIR]
                             [--exports all|train|none]

1. Wall time. One generated JSONL source of `--samples` rows (`messages` adapter: system, a
   short user turn and the dataset's own short answer, which becomes the gate's reference)
   goes through the pipeline by both paths: `specregen.pipeline.run.run_dataset` (the library
   path) and `flows.pipeline.pipeline_flow(config, datasets=[name])` (the Prefect path).
   - Every run gets a fresh storage folder, a fresh zero-latency emulator process (so the
     emulator's completion cache favours no run) and a fresh Python process (so no run
     inherits another's imports, tokenizer, worker processes or garbage).
   - The Prefect path talks to a `prefect server start` subprocess (SQLite, as
     `infra/server.sh` runs it) on a free loopback port; its PREFECT_HOME, database and the
     tasks' result storage live in the benchmark's temp folder. The server starts before the
     clock (a one-off cost of a long-lived server, not of a pipeline run).
   - A run's wall time is its `pipeline_flow(...)` / `run_dataset(...)` call. The paths
     alternate `--repeat` times and the best run of each path counts: other work on a shared
     box slows single runs by 10-30 %, never speeds them up.
   - Prints every run (with the Prefect server's CPU time and the requests it answered 503,
     which its client retries after a backoff of about 2 s), the stage spans of the best runs
     (from the Prefect task runs, and from the library's stage functions) and the ratio
     Prefect/library (target <= 1.15).
2. Memory. The library path at `--rss-small` and `--rss-large` samples, each in a fresh child
   process (the emulator in its own process): the child's peak RSS (ru_maxrss, RUSAGE_SELF),
   the largest peak of its reconstruction worker processes (RUSAGE_CHILDREN), and the peak RSS
   during each stage, so a stage whose memory grows with the dataset is named; then the ratio
   large/small of the pipeline process (target <= 1.3).

`--exports` (both measurements): `all` (the default) publishes train.jsonl and the SpecForge /
messages export (messages.jsonl) with every dataset, as issue 12 measures it; `train` only
train.jsonl; `none` the parquet alone.

Both paths must publish the same number of samples, every sample must have reached the
emulator during its own run (nothing skipped or reused from an earlier run) and through the
gate; anything else exits non-zero with the reason. The gate threshold is 1.0 (the emulator
writes literal markers now and then, which the gate quarantines): this measures speed and
memory, not quality. Completions are short (max_tokens 64, or 32 for the memory runs) so the
run measures the pipeline's own work, not text generation.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DATASET = "bench_messages"
CHUNK_SIZE = 1000
CHUNKS_IN_FLIGHT = 4
RESULT_TAG = "BENCH-RESULT "
LOG_RETRYABLE = "PREFECT_API_LOG_RETRYABLE_ERRORS"
STAGES = ("prompts", "infer", "reconstruct", "gate", "publish")

# Emulator text lengths (tokens; its floor is 8 per segment), max_tokens and the endpoint's
# window. The memory runs use the shortest answers and a larger window so 100k samples take
# minutes, not tens of minutes.
WALL_RUN = {"reasoning": 24, "content": 16, "max_tokens": 64, "concurrency": 256}
RSS_RUN = {"reasoning": 8, "content": 8, "max_tokens": 32, "concurrency": 400}

TOPICS = ("binary search", "a CSV parser", "rate limiting", "unit tests", "a linked list",
          "HTTP caching", "regular expressions", "a thread pool", "JSON schemas", "hash maps")


class BenchError(SystemExit):
    """A run did not do the work it was timed for; the message says what is wrong."""

    def __init__(self, message: str) -> None:
        super().__init__(f"bench/pipeline.py: FAILED: {message}")


# --- inputs -------------------------------------------------------------------------------------


def write_source(path: Path, samples: int) -> Path:
    """A `messages` JSONL of distinct short prompts (each one is a new request)."""
    with path.open("w", encoding="utf-8") as out:
        for i in range(samples):
            topic = TOPICS[i % len(TOPICS)]
            row = {
                "id": f"bench-{i:07d}",
                "messages": [
                    {"role": "system", "content": "You are a concise programming assistant."},
                    {"role": "user", "content": f"In two sentences, explain {topic} (note {i})."},
                    {"role": "assistant", "content": f"{topic.capitalize()} is a standard "
                                                     "technique. It trades memory for speed."},
                ],
            }
            out.write(json.dumps(row) + "\n")
    return path


EXPORTS = {"all": {"export_train": True, "export_messages": True},
           "train": {"export_train": True, "export_messages": False},
           "none": {"export_train": False, "export_messages": False}}


def write_config(path: Path, *, storage: Path, source: Path, base_url: str,
                 knobs: dict[str, int], exports: str = "all") -> Path:
    config = {
        "storage": str(storage),
        "tokenizer": "mini",
        # Measured here: the pipeline's own time and memory. The probe (12-14 requests that
        # classify the endpoint) refuses this bare emulator's shapes; it has its own tests.
        "probe": "off",
        "endpoint": {
            "base_url": base_url,
            "model": "moonshotai/kimi-k2.5",
            "dialect": "openrouter",
            # Never set: a loopback endpoint runs without a key.
            "api_key_env": "SPECREGEN_BENCH_KEY",
            "stream": False,
            "return_token_ids": True,
            "concurrency": knobs["concurrency"],
            "sampling": {"max_tokens": knobs["max_tokens"]},
        },
        "chunk_size": CHUNK_SIZE,
        "chunks_in_flight": CHUNKS_IN_FLIGHT,
        "reconstruct_workers": 2,
        **EXPORTS[exports],
        "datasets": [{"name": DATASET, "adapter": "messages", "source": str(source),
                      "gate": {"max_quarantine_share": 1.0}}],
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


# --- processes ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Emulator:
    url: str  # OpenRouter-style base URL, for the config

    def stats(self) -> dict[str, Any]:
        origin = self.url.removesuffix("/api/v1")
        return httpx.get(f"{origin}/_emulator/stats", timeout=10).json()


@contextlib.contextmanager
def emulator_process(knobs: dict[str, int], log_path: Path) -> Iterator[Emulator]:
    """A fresh emulator in its own process, on a port it picks itself (no race for it)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--emulator-child",
           "--reasoning-tokens", str(knobs["reasoning"]),
           "--content-tokens", str(knobs["content"])]
    with log_path.open("ab") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode().strip()
        if not line.startswith("http://"):
            raise BenchError(f"the emulator did not start; see {log_path}")
        yield Emulator(line)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def serve_emulator(reasoning: int, content: int) -> None:
    # `specregen emulator` has no flags for the text lengths, so the benchmark serves its own.
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
    for name in ("PREFECT_API_URL", "SPECREGEN_BENCH_KEY", LOG_RETRYABLE):
        env.pop(name, None)
    env.update(extra or {})
    return env


def prefect_env(root: Path, api_url: str) -> dict[str, str]:
    # The client's PREFECT_HOME and result storage are temp folders, never ~/.prefect.
    return {
        "PREFECT_API_URL": api_url,
        "PREFECT_HOME": str(root / "client-home"),
        "PREFECT_LOCAL_STORAGE_PATH": str(root / "results"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",
    }


@contextlib.contextmanager
def prefect_server(root: Path) -> Iterator[str]:
    from flows.demo import free_port
    from flows.demo import prefect_server as start_server

    # The server logs the errors it answers with 503 (the client retries those after a
    # backoff), so each run can say how many it hit and why.
    os.environ[LOG_RETRYABLE] = "true"
    try:
        with start_server(root / "server-home", free_port(), keep=False,
                          log=lambda _: None) as url:
            yield url
    finally:
        os.environ.pop(LOG_RETRYABLE, None)


def server_503s(log: Path, start: int) -> tuple[int, int]:
    """Requests the server answered with 503 since byte `start` of its log, and how many of
    them were SQLite's `database is locked`."""
    text = log.read_bytes()[start:].decode(errors="replace")
    errors = re.split(r"\n\d\d:\d\d:\d\d\.\d+ \| ", text)
    retryable = [e for e in errors if "Encountered retryable exception" in e]
    return len(retryable), sum("database is locked" in e for e in retryable)


def server_cpu_seconds() -> float:
    """CPU time of the `prefect server start` process this benchmark started (0 if none)."""
    ticks = os.sysconf("SC_CLK_TCK")
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        # After the command name: state, ppid, ..., then utime, stime, cutime, cstime at 11-14.
        if int(fields[1]) == os.getpid() and b"prefect\0server\0start" in cmdline:
            return sum(int(x) for x in fields[11:15]) / ticks
    return 0.0


# --- children: one pipeline run each ------------------------------------------------------------


class StageProbe:
    """When each library stage ran and, optionally, the peak RSS while it ran.

    The stage functions are wrapped where `run_dataset` looks them up, in this child process
    only: the run is unchanged, only which stage is current is recorded. RSS is sampled from
    /proc by a background thread.
    """

    WRAPPED: ClassVar[dict[str, str]] = {"prepare_prompts": "prompts", "infer_chunk": "infer",
                                         "reconstruct_dataset": "reconstruct",
                                         "gate_dataset": "gate", "publish_dataset": "publish"}

    def __init__(self, sample_rss: bool) -> None:
        self.base = time.perf_counter()
        self.stage = "start"
        self.spans: dict[str, list[tuple[float, float]]] = {}
        self.peaks: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True) if sample_rss else None

    @staticmethod
    def rss_bytes() -> int:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._peak(self.stage)
            self._stop.wait(0.05)

    def _peak(self, stage: str) -> None:
        self.peaks[stage] = max(self.peaks.get(stage, 0), self.rss_bytes())

    def install(self) -> None:
        import specregen.pipeline.run as run_module

        for name, stage in self.WRAPPED.items():
            setattr(run_module, name, self._wrap(stage, getattr(run_module, name)))
        if self._thread is not None:
            self._thread.start()

    def start(self) -> None:
        self.base = time.perf_counter()

    def _record(self, stage: str, started: float) -> None:
        now = time.perf_counter()
        self.spans.setdefault(stage, []).append((started - self.base, now - self.base))
        if self._thread is not None:
            self._peak(stage)  # the stage's own peak, before the next stage starts

    def _wrap(self, stage: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        if asyncio.iscoroutinefunction(fn):
            async def async_stage(*args: Any, **kwargs: Any) -> Any:
                self.stage, started = stage, time.perf_counter()
                try:
                    return await fn(*args, **kwargs)
                finally:
                    self._record(stage, started)
            return async_stage

        def sync_stage(*args: Any, **kwargs: Any) -> Any:
            self.stage, started = stage, time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._record(stage, started)
        return sync_stage

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def load_run(config_path: str):
    from specregen.config import load_config
    from specregen.pipeline.layout import DatasetRun

    config = load_config(config_path)
    return DatasetRun(config, config.dataset(DATASET))


def run_library(config_path: str, sample_rss: bool) -> dict[str, Any]:
    from specregen.pipeline.apikey import resolve_api_key
    from specregen.pipeline.run import run_dataset

    probe = StageProbe(sample_rss)
    probe.install()
    run = load_run(config_path)
    key = resolve_api_key(run.config)
    probe.start()
    result = asyncio.run(run_dataset(run, key))
    wall = time.perf_counter() - probe.base
    probe.stop()
    return {"wall_s": wall, "outcome": result.outcome, "summary": result.summary,
            "stages": probe.spans, "stage_peak_rss": probe.peaks}


def run_prefect(config_path: str) -> dict[str, Any]:
    from flows.demo import drain_prefect_workers
    from flows.pipeline import pipeline_flow

    since = time.time()
    started = time.perf_counter()
    results = asyncio.run(pipeline_flow(config_path, datasets=[DATASET]))
    wall = time.perf_counter() - started
    # Logs and events still queued go to the server before this process exits; not part of
    # the run's wall time (a long-lived worker sends them in the background).
    drained = time.perf_counter()
    drain_prefect_workers()
    drain = time.perf_counter() - drained
    (summary,) = results
    chunks = math.ceil(summary.get("prompts", 0) / CHUNK_SIZE)
    stages = asyncio.run(prefect_stage_spans(since, chunks))
    return {"wall_s": wall, "drain_s": drain, "outcome": summary.get("outcome"),
            "summary": summary, "stages": stages}


PREFECT_TASK_STAGES = {"prepare-prompts": "prompts", "infer-chunk": "infer",
                       "reconstruct-chunk": "reconstruct", "finish-reconstruction": "reconstruct",
                       "tool-call-gate": "gate", "publish": "publish"}


async def prefect_stage_spans(since: float, chunks: int) -> dict[str, list[tuple[float, float]]]:
    """The task runs' start and end, as the Prefect server recorded them, by stage."""
    from prefect.client.orchestration import get_client

    # The server records task runs from events, a little after the client moved on.
    deadline = time.monotonic() + 60
    async with get_client() as client:
        while True:
            runs, offset = [], 0
            while batch := await client.read_task_runs(limit=200, offset=offset):
                runs += batch
                offset += len(batch)
            spans: dict[str, list[tuple[float, float]]] = {}
            for r in runs:
                stage = PREFECT_TASK_STAGES.get(r.name.rsplit("-", 1)[0])
                if stage and r.start_time and r.end_time and r.start_time.timestamp() >= since:
                    spans.setdefault(stage, []).append(
                        (r.start_time.timestamp() - since, r.end_time.timestamp() - since))
            complete = (len(spans.get("infer", [])) == chunks
                        and len(spans.get("reconstruct", [])) == chunks + 1
                        and "publish" in spans)
            if complete or time.monotonic() > deadline:
                return spans
            await asyncio.sleep(0.5)


def published_samples(config_path: str) -> int | None:
    from specregen.pipeline.publish import published

    manifest = published(load_run(config_path))
    return None if manifest is None else manifest.counts.get("samples")


def child_main(kind: str, config_path: str, sample_rss: bool) -> None:
    cpu = time.process_time()
    result = run_prefect(config_path) if kind == "prefect" else run_library(config_path,
                                                                            sample_rss)
    result["cpu_s"] = time.process_time() - cpu
    result["published"] = published_samples(config_path)
    # Linux reports ru_maxrss in KiB; RUSAGE_CHILDREN is the largest of the waited-for
    # children (the reconstruction workers), not their sum.
    result["maxrss_self"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    result["maxrss_children"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    print(RESULT_TAG + json.dumps(result, default=str), flush=True)


# --- one checked run ----------------------------------------------------------------------------


def check_run(name: str, result: dict[str, Any], samples: int) -> int:
    """The published count of a run that did all of its work; raises BenchError otherwise."""
    summary = result["summary"]
    gate = summary.get("gate") or {}
    served = result["emulator"].get("distinct_requests", 0)
    problems = []
    if result["outcome"] != "published":
        problems.append(f"outcome {result['outcome']!r}, not 'published' (skipped or stopped?)")
    if summary.get("prompts") != samples:
        problems.append(f"{summary.get('prompts')} prompts, expected {samples}")
    if served < samples:
        problems.append(f"the emulator saw {served} distinct requests for {samples} samples "
                        "(answers reused from an earlier run?)")
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
        # A pipeline that quarantines most of its input is not the pipeline being measured.
        problems.append(f"only {result['published']} of {samples} published")
    if problems:
        raise BenchError(f"{name}: " + "; ".join(problems))
    return result["published"]


def pipeline_run(folder: Path, kind: str, source: Path, samples: int, knobs: dict[str, int],
                 env: dict[str, str], *, sample_rss: bool = False,
                 exports: str = "all") -> dict[str, Any]:
    """One path over `source` into a fresh store, against a fresh emulator; checked."""
    folder.mkdir()
    with emulator_process(knobs, folder / "emulator.log") as emulator:
        config = write_config(folder / "config.yaml", storage=folder / "store", source=source,
                              base_url=emulator.url, knobs=knobs, exports=exports)
        args = ["--child", kind, "--config", str(config)] + (["--rss"] if sample_rss else [])
        result = run_child(args, env, folder / "child.log")
        result["emulator"] = emulator.stats()
    check_run(f"{kind} path ({folder.name})", result, samples)
    wanted = [n for n, on in (("train.jsonl", EXPORTS[exports]["export_train"]),
                              ("messages.jsonl", EXPORTS[exports]["export_messages"])) if on]
    for name in wanted:  # the export measured is the export written
        if not list((folder / "store").glob(f"*/published/*/{name}")):
            raise BenchError(f"{kind} path ({folder.name}): no {name} published")
    return result


# --- the two measurements -----------------------------------------------------------------------


def wall_comparison(root: Path, samples: int, repeat: int, exports: str = "all") -> None:
    source = write_source(root / "wall-source.jsonl", samples)
    runs: dict[str, list[dict[str, Any]]] = {"library": [], "prefect": []}
    started = time.perf_counter()
    server_log = root / "prefect" / "server-home" / "server.log"
    with prefect_server(root / "prefect") as api_url:
        print(f"prefect server ready in {time.perf_counter() - started:.1f} s (not timed)",
              flush=True)
        for i in range(1, repeat + 1):
            lib = pipeline_run(root / f"wall-{i}-library", "library", source, samples,
                               WALL_RUN, child_env(), exports=exports)
            cpu, log_at = server_cpu_seconds(), server_log.stat().st_size
            pre = pipeline_run(root / f"wall-{i}-prefect", "prefect", source, samples,
                               WALL_RUN, child_env(prefect_env(root / "prefect", api_url)),
                               exports=exports)
            server_cpu = server_cpu_seconds() - cpu
            errors, locked = server_503s(server_log, log_at)
            runs["library"].append(lib)
            runs["prefect"].append(pre)
            print(f"run {i}: library {lib['wall_s']:.1f} s (client CPU {lib['cpu_s']:.1f} s), "
                  f"prefect {pre['wall_s']:.1f} s (client CPU {pre['cpu_s']:.1f} s, server CPU "
                  f"{server_cpu:.1f} s, server answered 503 {errors} times, {locked} of them "
                  f"SQLite 'database is locked'; log/event drain after the run "
                  f"{pre['drain_s']:.1f} s, not timed)", flush=True)
    published = {r["published"] for rs in runs.values() for r in rs}
    if len(published) != 1:
        raise BenchError(f"the runs published different sample counts: {sorted(published)}")
    lib = min(runs["library"], key=lambda r: r["wall_s"])
    pre = min(runs["prefect"], key=lambda r: r["wall_s"])
    print(f"samples {samples}, published by every run {published.pop()}; chunk_size "
          f"{CHUNK_SIZE}, chunks_in_flight {CHUNKS_IN_FLIGHT}, concurrency "
          f"{WALL_RUN['concurrency']}, max_tokens {WALL_RUN['max_tokens']}, "
          f"{os.cpu_count()} cores")
    print("stage spans of the best runs, library / prefect: "
          + ", ".join(f"{s} {span(lib['stages'], s):.1f} / {span(pre['stages'], s):.1f} s"
                      for s in STAGES)
          + f"; outside every stage {outside(lib):.1f} / {outside(pre):.1f} s; within infer, "
          f"no chunk running {idle(lib['stages'], 'infer'):.1f} / "
          f"{idle(pre['stages'], 'infer'):.1f} s")
    ratio = pre["wall_s"] / lib["wall_s"]
    print(f"wall: prefect {pre['wall_s']:.1f} s, library {lib['wall_s']:.1f} s, "
          f"ratio {ratio:.2f} (target <= 1.15)" + (f"; best of {repeat}" if repeat > 1 else ""),
          flush=True)


def span(stages: dict[str, list], stage: str) -> float:
    """From the stage's first start to its last end."""
    spans = stages.get(stage) or [(0.0, 0.0)]
    return max(e for _, e in spans) - min(s for s, _ in spans)


def outside(result: dict[str, Any]) -> float:
    """Wall time in no stage: flow runs, task orchestration before a stage, waits between."""
    return result["wall_s"] - sum(span(result["stages"], s) for s in STAGES)


def idle(stages: dict[str, list], stage: str) -> float:
    """Time within the stage's span when none of its calls was running."""
    covered, reach = 0.0, -math.inf
    for start, end in sorted(stages.get(stage) or []):
        covered += max(0.0, end - max(start, reach))
        reach = max(reach, end)
    return span(stages, stage) - covered


def rss_comparison(root: Path, small: int, large: int, exports: str = "all") -> None:
    results = {}
    for n in (small, large):
        source = write_source(root / f"rss-source-{n}.jsonl", n)
        results[n] = r = pipeline_run(root / f"rss-{n}", "library", source, n, RSS_RUN,
                                      child_env(), sample_rss=True, exports=exports)
        peaks = r["stage_peak_rss"]
        print(f"{n} samples: library wall {r['wall_s']:.1f} s; peak RSS of the pipeline "
              f"process {mb(r['maxrss_self'])} MB, of the largest reconstruction worker "
              f"{mb(r['maxrss_children'])} MB; peak by stage: "
              + ", ".join(f"{s} {mb(peaks[s])}" for s in STAGES if s in peaks) + " MB",
              flush=True)
    a, b = results[small], results[large]
    print(f"peak RSS: {label(small)} {mb(a['maxrss_self'])} MB, {label(large)} "
          f"{mb(b['maxrss_self'])} MB, ratio {b['maxrss_self'] / a['maxrss_self']:.2f} "
          f"(target <= 1.3; exports: {exports})")
    # One chunk is reconstructed in the pipeline process itself: then there is no worker.
    workers = (f", ratio {b['maxrss_children'] / a['maxrss_children']:.2f}"
               if a["maxrss_children"] else "")
    print(f"peak RSS of a reconstruction worker: {label(small)} {mb(a['maxrss_children'])} MB, "
          f"{label(large)} {mb(b['maxrss_children'])} MB{workers}", flush=True)


def mb(n: int) -> str:
    return f"{n / 2**20:.0f}"


def label(n: int) -> str:
    return f"{n // 1000}k" if n % 1000 == 0 else str(n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs of each path, alternating; the best of each counts")
    parser.add_argument("--rss-small", type=int, default=10_000)
    parser.add_argument("--rss-large", type=int, default=100_000)
    parser.add_argument("--skip-rss", action="store_true", help="only the Prefect comparison")
    parser.add_argument("--skip-wall", action="store_true", help="only the memory comparison")
    parser.add_argument("--exports", choices=tuple(EXPORTS), default="all",
                        help="what each publication writes besides its parquet (default all: "
                             "train.jsonl and the SpecForge/messages export)")
    parser.add_argument("--keep", type=Path, default=None,
                        help="work in this new folder and keep it (configs, stores, logs)")
    # The processes this benchmark starts.
    parser.add_argument("--child", choices=("library", "prefect"), help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--rss", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--emulator-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--reasoning-tokens", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--content-tokens", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.emulator_child:
        serve_emulator(args.reasoning_tokens, args.content_tokens)
        return
    if args.child:
        child_main(args.child, args.config, args.rss)
        return
    if min(args.samples, args.rss_small, args.rss_large, args.repeat) < 1:
        parser.error("--samples, --rss-small, --rss-large and --repeat must be at least 1")

    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if args.keep is not None:
            args.keep.mkdir(parents=True)
            root = args.keep.resolve()
        else:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-pipe-")))
        print(f"work folder: {root}", flush=True)
        if not args.skip_wall:
            wall_comparison(root, args.samples, args.repeat, args.exports)
        if not args.skip_rss:
            rss_comparison(root, args.rss_small, args.rss_large, args.exports)
    print(f"benchmark took {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
