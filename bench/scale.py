"""specregen past one machine: PostgreSQL, a Prefect server, several workers, one shared limit.

    python bench/scale.py [--rpm 600] [--minutes 2] [--samples 20000] [--skip-rate]
                          [--skip-wall] [--skip-placement] [--outage SECONDS [--heartbeat 60]]
                          [--database postgres|sqlite] [--keep DIR]

Everything runs on this machine but nothing is shared through local disk: the storage root is
an S3 bucket (a moto server on loopback), each worker has its own PREFECT_HOME and result
folder, the Prefect server runs on PostgreSQL started by infra/postgres.sh (or SQLite with
`--database sqlite`, to compare), and the deployments are made by infra/deploy.sh.

1. Rate. Two datasets on two workers through `pipeline/nightly`, with `shared_limit:
   {requests_per_minute: R}` in the config, against an emulator that answers 429 to a request
   beyond R in any 60 s (`RateWindowApp`). Prints the requests of each whole minute and the
   most in any 60 s, both vs R (target: within R + 5 %, and above R - 5 %: the limit is used,
   not left idle), the 429s (target 0), and how often the workers asked the Prefect server
   for slots.
2. Wall time. Three datasets of `--samples` samples each through `pipeline/nightly` on one
   worker, then on two (a fresh bucket each time, a zero-latency emulator). Prints both and
   the ratio. On one 2-core machine two workers share the same cores: the ratio shows the
   cost of spreading, not the gain of a second machine.
3. Server 503s (answers the server gave up on; the client retries them after ~2 s) during
   every run, from the server's log (target 0 on PostgreSQL).
4. Placement (docs/ARCHITECTURE.md): the fixed cost of a chunk sent to another worker as a
   deployment run, and as a prefect-dask task when prefect-dask is importable.
5. `--outage S`: the server SIGKILLed for S seconds mid-run and started again: the runs' final
   states and the requests paid for.

`Cluster`, `RateWindowApp` and `serve_limited` are also what tests/integration/test_cluster.py
starts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from flows.server import TELEMETRY_OFF, free_port, healthy, using_api  # noqa: E402
from specregen.procs import guarded_command  # noqa: E402

DATASETS = ("B1_glaive", "B2_opencodeinstruct", "B3_magicoder")  # deployed by infra/deploy.sh


# --- the provider's limit, in front of the emulator ----------------------------------------------


class RateWindowApp:
    """An ASGI wrapper: more than `limit` chat requests within any `period_s` seconds are
    answered 429 (Retry-After: when the oldest leaves the window), as a provider does. Records
    the arrival time of every chat request, refused ones included."""

    def __init__(self, app: Any, limit: int | None, period_s: float = 60.0) -> None:
        self.app = app
        self.limit = limit
        self.period_s = period_s
        self.arrivals: list[float] = []
        self.refused = 0
        self._window: deque[float] = deque()
        self._lock = threading.Lock()

    def reset(self) -> None:
        with self._lock:
            self.arrivals.clear()
            self._window.clear()
            self.refused = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if (scope["type"] == "http" and scope["method"] == "POST"
                and scope["path"].endswith("/chat/completions")):
            now = time.monotonic()
            with self._lock:
                self.arrivals.append(now)
                while self._window and now - self._window[0] >= self.period_s:
                    self._window.popleft()
                over = self.limit is not None and len(self._window) >= self.limit
                if over:
                    self.refused += 1
                    wait = self._window[0] + self.period_s - now
                else:
                    self._window.append(now)
            if over:
                body = json.dumps({"error": {"code": 429, "message": "rate limit exceeded"}})
                await send({"type": "http.response.start", "status": 429, "headers": [
                    (b"content-type", b"application/json"),
                    (b"retry-after", str(max(1, math.ceil(wait))).encode())]})
                await send({"type": "http.response.body", "body": body.encode()})
                return
        await self.app(scope, receive, send)

    def most_in_any_window(self) -> int:
        times = sorted(self.arrivals)
        best = start = 0
        for end in range(len(times)):
            while times[end] - times[start] >= self.period_s:
                start += 1
            best = max(best, end - start + 1)
        return best


def serve_limited(config: Any, tokenizer: Any, limit: int | None, period_s: float = 60.0):
    """The emulator on a free loopback port behind `RateWindowApp`: (RunningEmulator, wrapper)."""
    import uvicorn

    from specregen.emulator.app import create_app
    from specregen.emulator.server import RunningEmulator, bind_socket, uvicorn_config

    app = create_app(config, tokenizer)
    limited = RateWindowApp(app, limit, period_s)
    sock = bind_socket("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn_config(limited))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True,
                              name="limited-emulator")
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("the emulator did not start")
        time.sleep(0.01)
    host, port = sock.getsockname()[:2]
    return RunningEmulator(host, port, app, server, thread), limited


# --- the cluster --------------------------------------------------------------------------------


def descendants(pid: int) -> set[int]:
    """Every living process below `pid` (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


@dataclass
class Worker:
    name: str
    proc: subprocess.Popen
    home: Path
    seen: set[int] = field(default_factory=set)  # every process it ever started

    def refresh(self) -> set[int]:
        if self.proc.poll() is None:
            self.seen |= descendants(self.proc.pid)
        return self.seen


class Cluster:
    """PostgreSQL (infra/postgres.sh), a Prefect server on it (infra/server.sh), an S3 bucket
    (moto on loopback), workers (infra/worker.sh), each with its own PREFECT_HOME: the machines
    of a cluster, on this one. Deploys with infra/deploy.sh."""

    def __init__(self, base: Path, *, database: str = "postgres", heartbeat_s: int = 30,
                 zombie_after_s: float = 60.0, worker_limit: int = 2, bucket: str | None = None,
                 log=print) -> None:
        self.base = base
        self.database = database
        self.heartbeat_s = heartbeat_s
        self.zombie_after_s = zombie_after_s
        self.worker_limit = worker_limit
        # moto's servers in one process share their buckets: a bucket per cluster.
        self.bucket = bucket or f"specregen-{os.urandom(4).hex()}"
        self.log = log
        self.workers: list[Worker] = []
        self.server: subprocess.Popen | None = None
        self.server_log = base / "server.log"
        self.api_url = ""
        self.s3_env: dict[str, str] = {}
        self._moto: Any = None
        self._pg_dir = base / "pg"
        self._pg_url: str | None = None

    # -- pieces --

    def start(self) -> Cluster:
        self.base.mkdir(parents=True, exist_ok=True)
        os.chmod(self.base, 0o755)  # PostgreSQL runs as its own user below this folder
        if self.database == "postgres":
            out = subprocess.run(["bash", str(REPO / "infra" / "postgres.sh"), "start",
                                  str(self._pg_dir), str(free_port())],
                                 capture_output=True, text=True, timeout=120)
            if out.returncode != 0:
                raise RuntimeError(f"PostgreSQL did not start: {out.stderr[-2000:]}")
            self._pg_url = out.stdout.strip()
        self._start_s3()
        self.port = free_port()
        self.api_url = f"http://127.0.0.1:{self.port}/api"
        self.start_server()
        return self

    def _start_s3(self) -> None:
        from moto.server import ThreadedMotoServer

        self._moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._moto.start()
        host, port = self._moto.get_host_and_port()
        self.s3_env = {"AWS_ENDPOINT_URL": f"http://{host}:{port}",
                       "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"}
        import boto3

        boto3.client("s3", endpoint_url=self.s3_env["AWS_ENDPOINT_URL"],
                     aws_access_key_id="testing", aws_secret_access_key="testing",
                     region_name="us-east-1").create_bucket(Bucket=self.bucket)

    def env(self, **extra: str) -> dict[str, str]:
        env = {**os.environ, **TELEMETRY_OFF, **self.s3_env,
               "PREFECT_API_URL": self.api_url,
               "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(self.heartbeat_s),
               "PREFECT_WORKER_QUERY_SECONDS": "2",
               "PREFECT_LOGGING_LEVEL": "WARNING"}
        env.pop("PREFECT_HOME", None)
        env.pop("PREFECT_LOCAL_STORAGE_PATH", None)
        env.update(extra)
        return env

    def start_server(self) -> None:
        home = self.base / "server-home"
        home.mkdir(exist_ok=True)
        env = self.env(PREFECT_HOME=str(home), PREFECT_SERVER_API_PORT=str(self.port),
                       PREFECT_API_LOG_RETRYABLE_ERRORS="true")
        env.pop("PREFECT_API_URL")
        if self._pg_url:
            env["PREFECT_SERVER_DATABASE_CONNECTION_URL"] = self._pg_url
        out = self.server_log.open("ab")
        self.server = subprocess.Popen(guarded_command(["bash", str(REPO / "infra/server.sh")]),
                                       env=env, stdout=out, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        out.close()
        deadline = time.monotonic() + 180
        while not healthy(self.api_url):
            if self.server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Prefect server did not start; see {self.server_log}")
            time.sleep(0.3)

    def kill_server(self) -> None:
        if self.server is not None and self.server.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.server.pid, signal.SIGKILL)
            self.server.wait()

    def deploy(self, config: Path) -> None:
        env = self.env(SPECREGEN_CONFIG=str(config),
                       SPECREGEN_ZOMBIE_AFTER_S=str(self.zombie_after_s),
                       PREFECT_HOME=str(self.base / "deploy-home"))
        out = subprocess.run(["bash", str(REPO / "infra" / "deploy.sh")], env=env,
                             capture_output=True, text=True, timeout=300)
        if out.returncode != 0:
            raise RuntimeError(f"infra/deploy.sh failed: {out.stdout[-2000:]}"
                               f"{out.stderr[-3000:]}")

    def start_worker(self) -> Worker:
        name = f"worker-{len(self.workers) + 1}"
        home = self.base / name
        home.mkdir(exist_ok=True)
        env = self.env(PREFECT_HOME=str(home), PREFECT_LOCAL_STORAGE_PATH=str(home / "results"))
        log = (self.base / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            guarded_command(["bash", str(REPO / "infra" / "worker.sh"), "--name", name,
                             "--limit", str(self.worker_limit)]),
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        worker = Worker(name, proc, home)
        self.workers.append(worker)
        return worker

    def kill_worker(self, worker: Worker) -> None:
        """SIGKILL the worker and everything it started: its machine is gone."""
        pids = worker.refresh() | {worker.proc.pid}
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        worker.proc.wait()

    def worker_of(self, pid: int) -> Worker | None:
        for worker in self.workers:
            if pid in worker.refresh():
                return worker
        return None

    def server_503s(self) -> int:
        text = self.server_log.read_text(errors="replace") if self.server_log.exists() else ""
        return len(re.findall(r"Encountered retryable exception", text))

    def stop(self) -> None:
        for worker in self.workers:
            if worker.proc.poll() is None:
                self.kill_worker(worker)
        self.kill_server()
        if self._pg_url:
            subprocess.run(["bash", str(REPO / "infra" / "postgres.sh"), "stop",
                            str(self._pg_dir)], capture_output=True, timeout=60)
        if self._moto is not None:
            self._moto.stop()

    # -- runs --

    def run_nightly(self, config: Path, datasets: list[str] | None = None,
                    timeout: float = 900, on_poll=None) -> Any:
        """Start `pipeline/nightly` on the pool and wait for its final state (the flow run)."""
        return asyncio.run(self._run_nightly(config, datasets, timeout, on_poll))

    async def _run_nightly(self, config, datasets, timeout, on_poll):
        from prefect.client.orchestration import get_client

        with using_api(self.api_url):
            async with get_client() as client:
                deployment = await client.read_deployment_by_name("pipeline/nightly")
                params: dict[str, Any] = {"config_path": str(config)}
                if datasets:
                    params["datasets"] = datasets
                run = await client.create_flow_run_from_deployment(deployment.id,
                                                                   parameters=params)
                deadline = time.monotonic() + timeout
                while True:
                    run = await client.read_flow_run(run.id)
                    if run.state is not None and run.state.is_final():
                        return run
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"pipeline/nightly not done in {timeout} s "
                                           f"({run.state.type if run.state else None})")
                    if on_poll is not None:
                        await on_poll(client)
                    await asyncio.sleep(1.0)

    def task_spans(self) -> dict[str, list[float]]:
        """Run time of every completed task run, by task name (infer-chunk, ...)."""

        async def read():
            from prefect.client.orchestration import get_client

            runs: list[Any] = []
            with using_api(self.api_url):
                async with get_client() as client:
                    while True:
                        page = await client.read_task_runs(limit=200, offset=len(runs))
                        runs += page
                        if len(page) < 200:
                            return runs

        spans: dict[str, list[float]] = {}
        for run in asyncio.run(read()):
            # specregen's task functions are all `*_task`; run_deployment's placeholder task
            # runs (the parent waiting for a child) are not tasks of ours.
            if (run.state is not None and run.state.is_completed() and run.total_run_time
                    and run.task_key.split("-", 1)[0].endswith("_task")):
                name = run.name.rsplit("-", 1)[0]
                spans.setdefault(name, []).append(run.total_run_time.total_seconds())
        return spans

    def dataset_runs(self) -> list[Any]:
        async def read():
            from prefect.client.orchestration import get_client
            from prefect.client.schemas.filters import FlowFilter, FlowFilterName

            with using_api(self.api_url):
                async with get_client() as client:
                    return await client.read_flow_runs(
                        flow_filter=FlowFilter(name=FlowFilterName(any_=["dataset"])))

        return asyncio.run(read())


# --- the benchmark ------------------------------------------------------------------------------


def write_rows(path: Path, n: int, tag: str) -> Path:
    with path.open("w") as out:
        for i in range(n):
            out.write(json.dumps({"id": f"{tag}{i}", "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": f"Name {i % 97} things about {tag} {i}."}]}) + "\n")
    return path


def write_config(path: Path, *, base_url: str, storage: str, sources: dict[str, Path],
                 shared_limit: dict | None = None, concurrency: int = 32,
                 chunk_size: int = 1000, **top: Any) -> Path:
    config = {
        "storage": storage, "tokenizer": "mini", "probe": "off",
        "endpoint": {"base_url": base_url, "model": "moonshotai/kimi-k2.5",
                     "dialect": "openrouter", "api_key_env": "SPECREGEN_DEMO_KEY",
                     "stream": True, "return_token_ids": True, "concurrency": concurrency,
                     "sampling": {"max_tokens": 64},
                     "provider": {"allow_fallbacks": False, "require_parameters": True}},
        "chunk_size": chunk_size, "chunks_in_flight": 2, "reconstruct_workers": 1,
        "datasets": [{"name": name, "adapter": "messages", "source": str(src),
                      "gate": {"max_quarantine_share": 1.0}} for name, src in sources.items()],
    }
    if shared_limit:
        config["shared_limit"] = shared_limit
    config.update(top)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


class _Enough(Exception):
    """The measured minutes are over."""


def bench_rate(args, tok, base: Path) -> None:
    from specregen.emulator.config import EmulatorConfig

    rpm = args.rpm
    # Enough work to keep both datasets busy past the measured minutes.
    per_dataset = int(rpm * (args.minutes + 1) / 2) + rpm // 2
    emu, limited = serve_limited(EmulatorConfig(seed=3, latency="fixed", latency_mean=0.2,
                                                literal_marker_rate=0.0), tok, rpm, 60.0)
    cluster = Cluster(base / "rate", database=args.database).start()
    try:
        sources = {name: write_rows(base / f"{name}.jsonl", per_dataset, name[:2])
                   for name in DATASETS[:2]}
        config = write_config(base / "rate.yaml", base_url=emu.openrouter_url,
                              storage=f"s3://{cluster.bucket}/rate", sources=sources,
                              shared_limit={"requests_per_minute": rpm, "in_flight": 64},
                              concurrency=64)
        cluster.deploy(config)
        cluster.start_worker()
        cluster.start_worker()
        started = time.monotonic()
        stop_at = started + 60 * (args.minutes + 0.5)

        async def poll(client):
            if time.monotonic() > stop_at:
                raise _Enough

        with contextlib.suppress(_Enough):
            cluster.run_nightly(config, list(DATASETS[:2]), timeout=60 * (args.minutes + 3),
                                on_poll=poll)
        times = sorted(limited.arrivals)
        first = times[0]
        minutes = [sum(1 for t in times if first + 60 * m <= t < first + 60 * (m + 1))
                   for m in range(args.minutes)]
        print(f"rate: limit {rpm}/min shared by 2 workers x 1 dataset each (PostgreSQL server:"
              f" {args.database})")
        for m, count in enumerate(minutes):
            print(f"  minute {m + 1}: {count} requests ({count / rpm:.3f} of the limit)")
        most = limited.most_in_any_window()
        print(f"  most in any 60 s: {most} ({most / rpm:.3f} of the limit); 429s: "
              f"{limited.refused}; server 503s: {cluster.server_503s()}; {_load()}")
    finally:
        cluster.stop()
        emu.stop()


def _load() -> str:
    """The machine's load next to a number: on a shared box a wall time means little alone."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"


def bench_wall(args, tok, base: Path) -> None:
    from specregen.emulator.config import EmulatorConfig

    sources = {name: write_rows(base / f"wall-{name}.jsonl", args.samples, name[:2])
               for name in DATASETS}
    walls = {}
    for workers in (1, 2):
        emu, _ = serve_limited(EmulatorConfig(seed=4, literal_marker_rate=0.0), tok, None)
        cluster = Cluster(base / f"wall{workers}", database=args.database,
                          worker_limit=4).start()
        try:
            config = write_config(base / f"wall{workers}.yaml", base_url=emu.openrouter_url,
                                  storage=f"s3://{cluster.bucket}/wall", sources=sources,
                                  chunk_size=max(100, args.samples // 10))
            cluster.deploy(config)
            for _ in range(workers):
                cluster.start_worker()
            started = time.monotonic()
            run = cluster.run_nightly(config, timeout=7200)
            walls[workers] = time.monotonic() - started
            state = run.state.type.value if run.state else "?"
            print(f"wall: 3 datasets x {args.samples} samples on {workers} worker(s): "
                  f"{walls[workers]:.1f} s ({state}); server 503s: {cluster.server_503s()}; "
                  f"{_load()}")
            spans = cluster.task_spans()
            print("      task run time, median per chunk of "
                  f"{max(100, args.samples // 10)} samples: "
                  + ", ".join(f"{name} {sorted(v)[len(v) // 2]:.2f} s (n={len(v)})"
                              for name, v in sorted(spans.items())))
        finally:
            cluster.stop()
            emu.stop()
    print(f"wall: 2 workers / 1 worker = {walls[2] / walls[1]:.2f}")


def bench_outage(args, tok, base: Path) -> None:
    """The Prefect server SIGKILLed for `--outage` seconds in the middle of three datasets
    (3 s latency, 4 requests in flight each), then started again on the same database: do the
    runs ride it out, and is anything paid twice?"""
    from specregen.emulator.config import EmulatorConfig

    emu, _ = serve_limited(EmulatorConfig(seed=1, latency="fixed", latency_mean=3.0,
                                          literal_marker_rate=0.0), tok, None)
    cluster = Cluster(base / "outage", database=args.database, heartbeat_s=args.heartbeat,
                      zombie_after_s=3 * args.heartbeat).start()
    try:
        sources = {name: write_rows(base / f"outage-{name}.jsonl", 60, name[:2])
                   for name in DATASETS}
        config = write_config(base / "outage.yaml", base_url=emu.openrouter_url,
                              storage=f"s3://{cluster.bucket}/outage", sources=sources,
                              concurrency=4, chunk_size=10)
        cluster.deploy(config)
        cluster.start_worker()
        cluster.start_worker()
        started = time.monotonic()
        down: list[float] = []

        async def outage(client):
            if not down and emu.stats()["completed"] >= 30:
                down.append(time.monotonic() - started)
                cluster.kill_server()
                await asyncio.sleep(args.outage)
                cluster.start_server()
                down.append(time.monotonic() - started)

        run = cluster.run_nightly(config, timeout=1200, on_poll=outage)
        deadline = time.monotonic() + 300
        runs = cluster.dataset_runs()
        while not all(r.state and r.state.is_final() for r in runs):
            if time.monotonic() > deadline:
                break
            time.sleep(5)
            runs = cluster.dataset_runs()
        stats = emu.stats()
        print(f"outage: server down from {down[0]:.0f} s to {down[1]:.0f} s (heartbeat "
              f"{args.heartbeat} s, zombie window {3 * args.heartbeat} s); nightly "
              f"{run.state.name if run.state else '?'} after {time.monotonic() - started:.0f} s;"
              " datasets: " + ", ".join(f"{r.name} {r.state.name if r.state else '?'} (run "
                                         f"{r.run_count})" for r in runs)
              + f"; requests {stats['chat_requests']} for {stats['distinct_requests']} samples")
    finally:
        cluster.stop()
        emu.stop()


def bench_placement(args, tok, base: Path) -> None:
    """What it costs to send one reconstruction chunk to another machine, two ways: as a
    deployment run of a flow (a new flow-run process on some worker) or as a task of a Dask
    cluster (prefect-dask's DaskTaskRunner; the cluster's worker processes stay up). The chunk's
    own work is the same either way (read the raw log from storage, tokenize, write a shard);
    what differs is the fixed cost per chunk, measured here with chunks that do no work: a
    deployment run of an already published dataset (it loads the config, finds the publication
    and returns) and a Dask task that returns at once."""
    from specregen.emulator.config import EmulatorConfig

    emu, _ = serve_limited(EmulatorConfig(seed=5, literal_marker_rate=0.0), tok, None)
    cluster = Cluster(base / "placement", database=args.database).start()
    try:
        sources = {DATASETS[0]: write_rows(base / "placement.jsonl", 50, "pl")}
        config = write_config(base / "placement.yaml", base_url=emu.openrouter_url,
                              storage=f"s3://{cluster.bucket}/placement", sources=sources)
        cluster.deploy(config)
        cluster.start_worker()
        cluster.run_nightly(config, timeout=600)  # publishes it: the next runs are no-ops
        spans = []
        for _ in range(args.repeat):
            started = time.monotonic()
            run = asyncio.run(_deployment_run(cluster, f"dataset/{DATASETS[0]}", config))
            spans.append(time.monotonic() - started)
            assert run.state is not None and run.state.is_completed(), run.state
        print(f"placement: deployment run of a no-op chunk, create -> Completed: "
              f"best {min(spans):.2f} s, median {sorted(spans)[len(spans) // 2]:.2f} s "
              f"(worker polls every 2 s)")
    finally:
        cluster.stop()
        emu.stop()
    try:
        import prefect_dask  # noqa: F401
    except ImportError:
        print("placement: prefect-dask is not installed; Dask not measured "
              "(PYTHONPATH=<dir with prefect-dask, dask, distributed> to measure it)")
        return
    out = subprocess.run([sys.executable, __file__, "--dask-probe", str(args.repeat)],
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ, **TELEMETRY_OFF})
    print(out.stdout.strip() or out.stderr[-2000:])


async def _deployment_run(cluster: Cluster, name: str, config: Path) -> Any:
    from prefect.client.orchestration import get_client

    with using_api(cluster.api_url):
        async with get_client() as client:
            deployment = await client.read_deployment_by_name(name)
            run = await client.create_flow_run_from_deployment(
                deployment.id, parameters={"config_path": str(config)})
            while True:
                run = await client.read_flow_run(run.id)
                if run.state is not None and run.state.is_final():
                    return run
                await asyncio.sleep(0.1)


def dask_probe(repeat: int) -> None:
    """Run in a child (its own temporary Prefect server): a flow on a DaskTaskRunner over a
    local Dask cluster of 2 worker processes; the time to start it, and per no-op task."""
    from prefect import flow, task
    from prefect_dask import DaskTaskRunner

    @task
    def noop(i: int) -> int:
        return i

    n = 40

    @flow(task_runner=DaskTaskRunner(cluster_kwargs={"n_workers": 2, "threads_per_worker": 1,
                                                     "processes": True}))
    def chunks() -> tuple[float, float]:
        first = time.monotonic()
        noop.submit(-1).result()
        warm = time.monotonic() - first
        started = time.monotonic()
        futures = [noop.submit(i) for i in range(n)]
        [f.result() for f in futures]
        return warm, (time.monotonic() - started) / n

    started = time.monotonic()
    results = [chunks() for _ in range(repeat)]
    total = time.monotonic() - started
    per_task = min(r[1] for r in results)
    print(f"placement: Dask task of a no-op chunk (2 worker processes): {per_task * 1000:.0f} ms"
          f" each, {n} submitted at once; first task after the cluster started "
          f"{min(r[0] for r in results):.2f} s; {repeat} flow runs incl. cluster start "
          f"{total / repeat:.1f} s each")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rpm", type=int, default=600)
    parser.add_argument("--minutes", type=int, default=2)
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--database", choices=["postgres", "sqlite"], default="postgres")
    parser.add_argument("--skip-rate", action="store_true")
    parser.add_argument("--skip-wall", action="store_true")
    parser.add_argument("--skip-placement", action="store_true")
    parser.add_argument("--outage", type=float, default=0.0,
                        help="also kill the Prefect server for this many seconds mid-run")
    parser.add_argument("--heartbeat", type=int, default=60)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="keep the work folder here")
    parser.add_argument("--dask-probe", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.dask_probe:
        dask_probe(args.dask_probe)
        return

    from specregen.models.tokenizer import load_tokenizer

    tok = load_tokenizer("mini")
    base = Path(tempfile.mkdtemp(prefix="specregen-scale-", dir=args.keep))
    os.chmod(base, 0o755)  # PostgreSQL runs as its own user below this folder
    try:
        if not args.skip_rate:
            bench_rate(args, tok, base)
        if not args.skip_wall:
            bench_wall(args, tok, base)
        if not args.skip_placement:
            bench_placement(args, tok, base)
        if args.outage:
            bench_outage(args, tok, base)
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
