"""The pipeline with storage on s3:// (a moto server on loopback), bad input, and a crash."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from flows.pipeline import pipeline_flow
from specregen.cli import app
from specregen.emulator.config import EmulatorConfig
from specregen.emulator.server import serve_in_thread
from specregen.store.fs import Store
from specregen.store.rawlog import RawLog
from tests.support import REPO, get_tokenizer

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def emulator():
    config = EmulatorConfig(seed=6, literal_marker_rate=0.0)
    with serve_in_thread(config, get_tokenizer("mini")) as emu:
        yield emu


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    s3fs.S3FileSystem().mkdir("specregen-test")
    yield "s3://specregen-test"
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    server.stop()


def write_config(path: Path, base_url: str, storage: str, datasets: list[dict] | None = None,
                 **top) -> Path:
    config = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())
    config.update({"storage": storage, "chunk_size": 10, **top})
    config["endpoint"]["base_url"] = base_url
    if datasets is not None:
        config["datasets"] = datasets
    path.write_text(yaml.safe_dump(config))
    return path


def published_bytes(store: Store, dataset: str) -> dict[str, bytes]:
    latest = store.read_json(dataset, "published", "LATEST.json")["fingerprint"]
    folder = (dataset, "published", latest, "data")
    return {name: store.read_bytes(*folder, name) for name in store.list(*folder)}


def test_s3_storage_publishes_the_same_bytes_as_local(prefect_server, emulator, s3, tmp_path):
    only_b3 = [d for d in yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())["datasets"]
               if d["name"] == "B3_magicoder"]
    local = write_config(tmp_path / "local.yaml", emulator.openrouter_url,
                         str(tmp_path / "store"), only_b3)
    remote = write_config(tmp_path / "s3.yaml", emulator.openrouter_url, f"{s3}/run",
                          only_b3)
    assert asyncio.run(pipeline_flow(str(local)))[0]["outcome"] == "published"
    assert asyncio.run(pipeline_flow(str(remote)))[0]["outcome"] == "published"
    on_disk = published_bytes(Store(str(tmp_path / "store")), "B3_magicoder")
    on_s3 = published_bytes(Store(f"{s3}/run"), "B3_magicoder")
    assert on_disk and on_disk == on_s3
    assert RawLog(f"{s3}/run/B3_magicoder/rawlog/chunk-00000").part_paths()


def test_glaive_defect_rows_are_refused_with_reasons_and_the_rest_runs(
    prefect_server, emulator, tmp_path
):
    source = REPO / "tests" / "fixtures" / "datasets" / "glaive_defects.json"
    datasets = [{"name": "B1_glaive", "adapter": "glaive", "source": str(source),
                 "gate": {"max_quarantine_share": 0.3}}]
    config = write_config(tmp_path / "c.yaml", emulator.openrouter_url, str(tmp_path / "s"),
                          datasets)
    (result,) = asyncio.run(pipeline_flow(str(config)))
    assert result["outcome"] == "published"
    assert result["rejected_rows"] >= 15 and result["prompts"] >= 8
    store = Store(str(tmp_path / "s"))
    (prompts_fp,) = store.list("B1_glaive", "prompts")
    rejects = [json.loads(line) for line in
               store.read_bytes("B1_glaive", "prompts", prompts_fp, "rejects.jsonl").splitlines()]
    reasons = " | ".join(r["reason"] for r in rejects)
    for expected in ("not valid JSON", "undeclared function", "text before <functioncall>",
                     "FUNCTION RESPONSE follows no call", "'parameters' instead of 'arguments'"):
        assert expected in reasons


def test_a_config_with_a_wrong_field_fails_before_any_request(emulator, tmp_path):
    config = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())
    config["endpoint"]["base_url"] = emulator.openrouter_url
    config["datasets"][0]["adapterr"] = "glaive"
    config["endpoint"]["sampling"]["max_tokens"] = -5
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    before = emulator.stats()["chat_requests"]
    result = CliRunner().invoke(app, ["run", "--config", str(path)])
    assert result.exit_code == 2
    # The dataset by its name, and the nearest field to the typo (issue 21).
    said = " ".join(result.output.split())
    assert "datasets[B1_glaive].adapterr: unknown field (did you mean 'adapter'?)" in said
    assert "endpoint.sampling.max_tokens" in result.output
    assert emulator.stats()["chat_requests"] == before


def test_the_demo_config_without_its_emulator_says_how_to_start_it(prefect_server, tmp_path):
    """Issue 21: `specregen run --config configs/demo.yaml` with nothing on the emulator's port
    fails every dataset at once with the unreachable code, naming the URL and the emulator
    command for that port; nothing is requested or recorded."""
    import socket

    from prefect.settings import PREFECT_API_URL

    from specregen.errors import EXIT_UNREACHABLE

    with socket.socket() as sock:  # the demo's 8765 may be taken here: any closed port
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())
    assert config["endpoint"]["base_url"] == "http://127.0.0.1:8765/api/v1"
    config["endpoint"]["base_url"] = f"http://127.0.0.1:{port}/api/v1"
    config["storage"] = str(tmp_path / "store")
    path = tmp_path / "demo.yaml"
    path.write_text(yaml.safe_dump(config))
    started = time.monotonic()
    result = CliRunner().invoke(app, ["run", "--config", str(path)],
                                env={"PREFECT_API_URL": PREFECT_API_URL.value()})
    assert result.exit_code == EXIT_UNREACHABLE, result.output
    said = " ".join(result.output.split())
    assert f"cannot reach the endpoint http://127.0.0.1:{port}/api/v1" in said
    assert f"specregen emulator --port {port}" in said
    assert all(d["name"] in said for d in config["datasets"])  # each dataset's failure
    assert time.monotonic() - started < 120  # the temporary flow runs, not 27 s per sample
    assert not list(RawLog(str(tmp_path / "store" / "B2_opencodeinstruct" / "rawlog"))
                    .iter_records())


def test_a_run_killed_midway_completes_without_paying_twice(prefect_server, tmp_path):
    n, concurrency = 160, 8
    rows = [{"id": f"m{i}", "messages": [{"role": "system", "content": "Be brief."},
                                         {"role": "user", "content": f"Count to {i}."}]}
            for i in range(n)]
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    slow = EmulatorConfig(seed=2, latency="fixed", latency_mean=0.1, literal_marker_rate=0.0)
    with serve_in_thread(slow, get_tokenizer("mini")) as emu:
        datasets = [{"name": "M", "adapter": "messages", "source": str(source),
                     "gate": {"max_quarantine_share": 1.0}}]
        endpoint = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())["endpoint"]
        endpoint.update(base_url=emu.openrouter_url, concurrency=concurrency)
        config = write_config(tmp_path / "c.yaml", emu.openrouter_url, str(tmp_path / "s"),
                              datasets, endpoint=endpoint, chunk_size=40, chunks_in_flight=1,
                              probe="off")  # the probe's requests would count as paid twice
        cmd = [sys.executable, "-m", "specregen.cli", "run", "--config", str(config)]
        # Its own temporary Prefect server, with its database in a known place.
        env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home")}
        env.pop("PREFECT_API_URL", None)
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=env)
        deadline = time.monotonic() + 90
        started: set[int] = set()
        while time.monotonic() < deadline and emu.stats()["completed"] < n // 3:
            started |= descendants(proc.pid)
            time.sleep(0.05)
        started |= descendants(proc.pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        answered = emu.stats()["completed"]
        assert 0 < answered < n, "the kill did not land mid-run"
        # Nothing it started outlives it: the temporary server (and any worker) is gone.
        assert started, "the run started no process (its temporary server?)"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(map(pid_alive, started)):
            time.sleep(0.1)
        assert not [pid for pid in started if pid_alive(pid)], "orphans of the killed run"
        second = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
        assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
        stats = emu.stats()
    # The runs the kill left RUNNING are marked Crashed by the next start; none stays RUNNING.
    assert "of killed processes crashed" in second.stderr + second.stdout
    with sqlite3.connect(tmp_path / "prefect-home" / "prefect.db") as db:
        for table in ("flow_run", "task_run"):
            states = dict(db.execute(f"SELECT state_type, count(*) FROM {table} GROUP BY 1"))
            assert "RUNNING" not in states and "PENDING" not in states, (table, states)
            assert states.get("CRASHED", 0) >= (2 if table == "flow_run" else 1), states
    # Only the requests in flight at the kill were paid twice.
    assert stats["chat_requests"] - n <= concurrency
    store = Store(str(tmp_path / "s"))
    assert store.exists("M", "published", "LATEST.json")
    shutil.rmtree(tmp_path / "s")


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


def pid_alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
