"""Child processes that die with their parent: no orphan outlives a killed `specregen`.

A SIGKILLed parent runs no cleanup, so its children must notice on their own:

- A child started with `guarded_command(cmd)` runs through `python -m specregen.procs`, which
  asks the kernel (Linux `prctl(PR_SET_PDEATHSIG)`) to send it `signal` when its parent dies,
  then `exec`s the real command; the request survives the exec. (The kernel ties it to the
  parent *thread* that started the child: start such children from a thread that lives as long
  as the process, e.g. the main thread.)
- A Python worker process (a `ProcessPoolExecutor` worker) calls `exit_with_parent(pid)` as its
  initializer: a daemon thread polls the parent's pid and exits the worker when it changes. No
  signal, so a pool created from a short-lived thread is not killed by that thread's end.
  `guarded_pool(n)` makes such a pool (the library runner's reconstruction, one per run) and
  `kept_pool(n)` keeps one for a long-lived process (the Prefect task's).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor

PR_SET_PDEATHSIG = 1
# Seconds between two looks at the parent: a dead parent's workers are gone within this.
POLL_S = 0.5


def set_parent_death_signal(sig: int = signal.SIGTERM) -> bool:
    """Ask the kernel to send `sig` to this process when its parent dies (Linux only)."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def guarded_command(cmd: list[str], sig: int = signal.SIGTERM) -> list[str]:
    """`cmd` wrapped so that it receives `sig` when the process that starts it dies."""
    return [sys.executable, "-m", "specregen.procs", str(os.getpid()), str(int(sig)), "--",
            *cmd]


def exit_with_parent(parent_pid: int, poll_s: float = POLL_S) -> None:
    """Pool initializer: exit this worker (at once, no cleanup) when `parent_pid` is gone."""
    if os.getppid() != parent_pid:
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            # A dead parent's children are adopted by init or a subreaper: the ppid changes.
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def guarded_pool(workers: int) -> ProcessPoolExecutor:
    """A process pool whose workers exit when this process dies (SIGKILL included): a killed
    run leaves no worker writing after it."""
    return ProcessPoolExecutor(workers, initializer=exit_with_parent, initargs=(os.getpid(),))


_KEPT: dict[tuple[int, int], ProcessPoolExecutor] = {}
_KEPT_LOCK = threading.Lock()


def kept_pool(workers: int) -> ProcessPoolExecutor:
    """A `guarded_pool` kept for the process's life (a long-lived Prefect worker): its workers
    keep what they loaded, a tokenizer, from one task to the next.

    Workers see the environment of the moment they started, and storage credentials come from
    it: when the environment changes, the next call starts fresh workers (only a hash of the
    environment is kept, never its values)."""
    key = (workers, hash(frozenset(os.environ.items())))
    with _KEPT_LOCK:
        if key not in _KEPT:
            for old in [k for k in _KEPT if k[0] == workers]:
                _KEPT.pop(old).shutdown(wait=False, cancel_futures=False)
            _KEPT[key] = guarded_pool(workers)
        return _KEPT[key]


def _main(argv: list[str]) -> None:
    parent, sig, sep, *cmd = argv
    if sep != "--" or not cmd:
        raise SystemExit("usage: python -m specregen.procs PARENT_PID SIGNAL -- COMMAND...")
    set_parent_death_signal(int(sig))
    # The parent may have died before the request above took effect.
    if os.getppid() != int(parent):
        raise SystemExit(1)
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    _main(sys.argv[1:])
