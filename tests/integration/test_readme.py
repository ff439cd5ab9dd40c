"""README.md runs as written (issue 21).

Every shell block of the README is executed in order, each in a fresh `bash` (so a block must
set what it needs: nothing is inherited from the one before but files), in a scratch copy of
the checkout, against the emulator: the demo, the Prefect server, `infra/deploy.sh`, a worker,
a dataset run that fails, its retry in place, and `pipeline/nightly` publishing every dataset
of configs/pipeline.yaml. A comment right before a block marks it:

    <!-- readme-test: not run (why) -->          shell syntax (`bash -n`) and its paths only
    <!-- readme-test: fails (why) -->            run; it must exit non-zero
    <!-- readme-test: skip-line "CMD" (why) -->  run without the line CMD (checked like the
                                                  not-run blocks): the test command itself

What differs from a person's first hour, and why: the scratch copy shares this test's `.venv`
(`SPECREGEN_VENV`; building one takes minutes and the network), the Prefect server's port
(`PREFECT_SERVER_API_PORT`, read by infra/env.sh and the demo) and the emulator's port 8765 (in
the blocks and configs/pipeline.yaml) are free ports, so a server already on this machine is
never used, and `.venv/bin` is taken off the PATH the blocks start with.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.integration.test_output_readable import assert_readable
from tests.support import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow]

README = REPO / "README.md"
EMULATOR_PORT = "8765"  # configs/pipeline.yaml's endpoint
_BLOCK = re.compile(
    r"(?:<!--\s*readme-test:\s*(?P<mark>.*?)\s*-->\s*\n)?^```(?P<lang>[\w-]*)\n(?P<body>.*?)^```",
    re.S | re.M)
# Named by the README, written on another branch at the same time (issue 20's real-vLLM
# tests); drop from here once merged.
PENDING = {"tests/realvllm"}
# Paths into the checkout, as the README names them (placeholders like <fp> end a path).
_PATH = re.compile(r"(?<![\w./-])((?:infra|scripts|configs|docs|bench|flows|tasks|deployments|"
                   r"specregen|tests)/[\w./-]*[\w/])")


@dataclass
class Block:
    index: int
    body: str
    mark: str  # "run", "fails", "not run" or "skip-line"
    skip_line: str | None = None


def readme_blocks(text: str) -> list[Block]:
    blocks = []
    for match in _BLOCK.finditer(text):
        if match["lang"] not in ("bash", "sh", "shell"):
            continue
        mark = (match["mark"] or "").strip()
        skip = None
        if not mark:
            kind = "run"
        elif mark.startswith("not run"):
            kind = "not run"
        elif mark.startswith("fails"):
            kind = "fails"
        elif mark.startswith("skip-line"):
            kind, skip = "skip-line", re.match(r'skip-line\s+"([^"]+)"', mark)[1]
        else:
            raise AssertionError(f"unknown readme-test mark {mark!r}")
        blocks.append(Block(len(blocks), match["body"], kind, skip))
    return blocks


def command_of(line: str) -> str:
    return line.split("#", 1)[0].strip()


def test_every_block_is_marked_known_and_every_named_path_exists():
    """Fast: the marks parse, the skipped lines exist, syntax of every block, and every path
    into the checkout the README names (in a block or in its text) exists."""
    text = README.read_text()
    blocks = readme_blocks(text)
    assert blocks and any(b.mark == "run" for b in blocks)
    for block in blocks:
        done = subprocess.run(["bash", "-n"], input=block.body, text=True, capture_output=True)
        assert done.returncode == 0, (block.body, done.stderr)
        if block.skip_line is not None:
            assert block.skip_line in map(command_of, block.body.splitlines()), block
    named = sorted(set(_PATH.findall(text)))
    assert "configs/pipeline.yaml" in named and "infra/deploy.sh" in named
    missing = [p for p in named if not (REPO / p).exists() and p not in PENDING]
    assert missing == [], missing
    # The README's own test command is never run by this test (it would run this test).
    for block in blocks:
        if block.mark != "not run" and "scripts/test.sh" in block.body:
            assert block.skip_line == "bash scripts/test.sh", block


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scratch_copy(target: Path) -> Path:
    """The checkout's files as a fresh clone has them (tracked and not ignored), with their
    times: setup.sh compares pyproject.toml's time with the shared .venv's stamp."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=REPO, capture_output=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: cannot tell the clone's files")
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = REPO / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def block_env(scratch: Path, prefect_port: int) -> dict[str, str]:
    venv_bin = str(Path(sys.prefix) / "bin")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PREFECT_", "SPECREGEN_", "VIRTUAL_ENV", "PYTEST_"))}
    env["PATH"] = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                                  if p != venv_bin)
    env.update(SPECREGEN_VENV=sys.prefix, PREFECT_SERVER_API_PORT=str(prefect_port),
               HOME=str(scratch / ".home"), PYTHONUNBUFFERED="1")
    (scratch / ".home").mkdir(exist_ok=True)
    return env


def test_the_readme_runs_as_written(tmp_path):
    stamp = Path(sys.prefix) / ".specregen-installed"
    if not stamp.is_file():
        pytest.skip(f"{sys.prefix} was not made by scripts/setup.sh (no {stamp.name})")
    scratch = scratch_copy(tmp_path / "clone")
    # Older than the shared .venv's stamp: setup.sh must not reinstall it from the copy.
    old = stamp.stat().st_mtime - 60
    os.utime(scratch / "pyproject.toml", (old, old))
    emulator_port, prefect_port = str(free_port()), free_port()
    pipeline_yaml = scratch / "configs" / "pipeline.yaml"
    pipeline_yaml.write_text(pipeline_yaml.read_text().replace(f":{EMULATOR_PORT}/",
                                                               f":{emulator_port}/"))
    env = block_env(scratch, prefect_port)
    groups: list[int] = []  # every block's process group: what it left running
    logs = tmp_path / "logs"
    logs.mkdir()
    try:
        for block in readme_blocks(README.read_text()):
            body = block.body.replace(EMULATOR_PORT, emulator_port)
            if block.mark == "not run":
                continue  # checked by the test above
            if block.skip_line is not None:
                body = "\n".join(line for line in body.splitlines()
                                 if command_of(line) != block.skip_line)
            log = logs / f"block-{block.index}.txt"
            with log.open("w") as out:
                proc = subprocess.Popen(["bash", "-c", "set -eo pipefail\n" + body],
                                        cwd=scratch, env=env, stdout=out,
                                        stderr=subprocess.STDOUT, start_new_session=True)
                groups.append(proc.pid)
                try:
                    code = proc.wait(timeout=900)
                except subprocess.TimeoutExpired:
                    pytest.fail(f"block {block.index} ran over 900 s:\n{block.body}\n"
                                f"{log.read_text()[-4000:]}")
            said = log.read_text()
            where = f"block {block.index}:\n{block.body}\n--- output ---\n{said[-5000:]}"
            if block.mark == "fails":
                assert code != 0, where
            else:
                assert code == 0, where + _server_logs(scratch)
            check_block(block, said, scratch, emulator_port)
        # `pipeline/nightly` published every dataset of the shipped config.
        config = yaml.safe_load(pipeline_yaml.read_text())
        storage = scratch / config["storage"]
        for dataset in config["datasets"]:
            assert (storage / dataset["name"] / "published" / "LATEST.json").is_file(), dataset
    finally:
        for group in reversed(groups):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for group in groups:
            while time.monotonic() < deadline and _alive(group):
                time.sleep(0.2)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)


def check_block(block: Block, said: str, scratch: Path, emulator_port: str) -> None:
    """What each kind of block must have done, beyond its exit code."""
    if "scripts/demo.sh" in block.body:
        # The demo's output, piped to a file: whole paths, no ellipsis (issue 21).
        published = sorted((scratch / "out" / "demo" / "data").glob("*/published/LATEST.json"))
        assert len(published) == 4, published
        paths = [str(p.parent / yaml.safe_load(p.read_text())["fingerprint"])
                 for p in published]
        assert_readable(said, [f"published to {p}" for p in paths])
    if block.mark == "fails":
        # The failed run's state names the endpoint it could not reach, and what to do.
        worker_log = (scratch / ".prefect" / "worker.log").read_text()
        url = f"http://127.0.0.1:{emulator_port}/api/v1"
        assert f"cannot reach the endpoint {url}" in worker_log, worker_log[-3000:]
        assert f"specregen emulator --port {emulator_port}" in worker_log, worker_log[-3000:]
    if "specregen retry" in block.body:
        assert "scheduled again" in said and "completed" in said, said[-3000:]


def _alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def _server_logs(scratch: Path) -> str:
    out = []
    for name in ("server.log", "worker.log", "emulator.log"):
        path = scratch / ".prefect" / name
        if path.is_file():
            out.append(f"--- {name} ---\n{path.read_text()[-3000:]}")
    return "\n".join(out)
