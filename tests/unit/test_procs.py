"""Children that specregen starts die with it, SIGKILL included."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from specregen.procs import guarded_command

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def start_parent(code: str) -> tuple[subprocess.Popen, list[int]]:
    """A parent process that starts children and prints their pids, then waits."""
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)],
                              stdout=subprocess.PIPE, text=True)
    line = parent.stdout.readline()
    assert line, "the parent printed no child pids"
    return parent, [int(p) for p in line.split()]


def test_pool_workers_exit_when_their_parent_is_killed():
    # The pool both runners reconstruct in: the library's per run, the Prefect task's kept.
    parent, workers = start_parent("""
        import os, time
        from specregen.procs import guarded_pool, kept_pool
        library = guarded_pool(1)  # a library run's, still running
        pool = kept_pool(1)
        assert kept_pool(1) is pool  # kept: its worker keeps its tokenizer
        for each in (library, pool):
            each.submit(time.sleep, 0.2).result()
        print(*library._processes, *pool._processes, flush=True)
        time.sleep(60)
    """)
    assert len(workers) == 2 and all(alive(p) for p in workers)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    assert wait_gone(workers, 5.0) == []


def test_a_guarded_command_dies_with_its_parent():
    parent, (child,) = start_parent("""
        import subprocess, sys, time
        from specregen.procs import guarded_command
        cmd = [sys.executable, "-c", "import time; time.sleep(60)"]
        proc = subprocess.Popen(guarded_command(cmd))
        print(proc.pid, flush=True)
        time.sleep(60)
    """)
    time.sleep(0.5)  # the guard has exec'd the command by now
    assert alive(child)
    with open(f"/proc/{child}/cmdline", "rb") as handle:
        assert b"time.sleep(60)" in handle.read()  # the exec'd command, same pid
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    assert wait_gone([child], 5.0) == []


def test_a_guarded_command_keeps_running_while_its_parent_lives():
    proc = subprocess.Popen(guarded_command([sys.executable, "-c", "print(40 + 2)"]),
                            stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and out.strip() == "42"
    assert os.getpid() != proc.pid
