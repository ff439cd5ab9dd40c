"""One writer per output: a lease on an output location, taken before anything is paid for.

    with acquire_lease(out_url, wait=30.0) as lease:   # OutputBusyError names the holder
        ...                                             # lease.lost turns True if taken over

Two writers on one raw log would each request every sample the other has not finished yet, so
each sample would be paid for twice. The lease makes the second writer wait (bounded) or stop
with a message naming the holder (host, pid, since when).

Local paths: the lease is a file `{output}/.specregen-lease` held with `fcntl.flock`. The kernel
drops the lock when its process dies, however it dies (SIGKILL included), so a lease left by a
dead process on this host is taken over at once. The file holds the holder's host, pid and start
time (for the message); a daemon thread touches its mtime every `ttl/3` seconds (the
heartbeat). A holder on ANOTHER host (a shared network filesystem) whose heartbeat is older than
`ttl` is taken to be dead and its file is replaced; on this host a live process keeps its lock
whatever its heartbeat.

Object stores (fsspec: s3://, gs://, memory://): the lease is an object with the holder's
identity and a heartbeat time, rewritten every `ttl/3` seconds. An absent or expired lease is
taken by writing ours -- with a create-only put where the store has one, else a plain put -- then
reading it back after `settle` seconds: if another writer's identity is there, it won the race.
A lease whose heartbeat is older than `ttl` (a killed process) is taken over.

A holder that finds its lease replaced (its heartbeat sees another owner) sets `lease.lost` and
calls `on_lost`; it should stop starting new work.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from specregen.errors import OutputBusyError, storage_error
from specregen.store.fs import make_dirs

log = logging.getLogger(__name__)

LEASE_NAME = ".specregen-lease"
DEFAULT_TTL = 60.0


@dataclass(frozen=True)
class LeaseHolder:
    owner: str  # random id of one lease acquisition
    host: str
    pid: int
    since: str  # ISO 8601 UTC, when the lease was taken
    heartbeat: float  # epoch seconds of the last heartbeat (object stores; local: file mtime)
    ttl_s: float
    what: str = ""  # e.g. "specregen infer"

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> LeaseHolder | None:
        try:
            raw = json.loads(data)
            return cls(
                owner=str(raw["owner"]),
                host=str(raw["host"]),
                pid=int(raw["pid"]),
                since=str(raw["since"]),
                heartbeat=float(raw["heartbeat"]),
                ttl_s=float(raw["ttl_s"]),
                what=str(raw.get("what", "")),
            )
        except (ValueError, KeyError, TypeError):
            return None

    def expired(self, now: float) -> bool:
        return now - self.heartbeat > self.ttl_s

    def describe(self) -> str:
        by = f"{self.what} " if self.what else ""
        return f"{by}pid {self.pid} on host {self.host} since {self.since}"


def lease_path_for(output: str) -> str:
    """The lease location of an output folder (a local path or URL)."""
    return output.rstrip("/") + "/" + LEASE_NAME


def acquire_lease(
    output: str,
    *,
    wait: float = 0.0,
    ttl: float = DEFAULT_TTL,
    what: str = "",
    on_lost: Callable[[], None] | None = None,
    storage_options: dict[str, Any] | None = None,
    settle: float | None = None,
) -> Lease:
    """Take the lease on output folder `output` (waiting up to `wait` s); raises OutputBusyError.

    The returned Lease is also a context manager that releases it.
    """
    lease = Lease(
        lease_path_for(output),
        ttl=ttl,
        what=what,
        on_lost=on_lost,
        storage_options=storage_options,
        settle=settle,
    )
    lease.acquire(wait=wait)
    return lease


class Lease:
    """A lease on one location; see the module docstring. Use `acquire_lease` or `with`."""

    def __init__(
        self,
        url: str,
        *,
        ttl: float = DEFAULT_TTL,
        what: str = "",
        on_lost: Callable[[], None] | None = None,
        storage_options: dict[str, Any] | None = None,
        settle: float | None = None,
        poll: float | None = None,
    ) -> None:
        if ttl <= 0:
            raise ValueError("ttl must be positive")
        self.url = url
        self.fs, self.path = fsspec.core.url_to_fs(url, **(storage_options or {}))
        self.local = isinstance(self.fs, LocalFileSystem)
        self.ttl = ttl
        self.what = what
        self.on_lost = on_lost
        # Read-back delay for object stores: long enough for a racing put to land.
        self.settle = (0.0 if self.fs.protocol in ("memory", ("memory",)) else 1.0) if (
            settle is None
        ) else settle
        self.poll = poll if poll is not None else min(1.0, ttl / 4)
        self.holder: LeaseHolder | None = None
        self.lost = False
        self._fd: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"Lease({self.url!r}, held={self.holder is not None})"

    # -- public ----------------------------------------------------------------------------

    def acquire(self, wait: float = 0.0) -> Lease:
        if self.holder is not None:
            return self
        deadline = time.monotonic() + max(0.0, wait)
        while True:
            other = self._try_local() if self.local else self._try_object()
            if other is None:
                break
            if time.monotonic() >= deadline:
                raise self._busy(other, wait)
            time.sleep(min(self.poll, max(0.0, deadline - time.monotonic())) or self.poll)
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._heartbeat_loop, name=f"lease-heartbeat {self.url}", daemon=True
        )
        self._thread.start()
        return self

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if self.holder is None:
            return
        mine, self.holder = self.holder, None
        if self.local:
            self._release_local()
        elif not self.lost:
            with contextlib.suppress(Exception):
                current = self._read_object()
                if current is not None and current.owner == mine.owner:
                    self.fs.rm_file(self.path)

    def __enter__(self) -> Lease:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    # -- local files -----------------------------------------------------------------------

    def _new_holder(self) -> LeaseHolder:
        return LeaseHolder(
            owner=uuid.uuid4().hex,
            host=socket.gethostname(),
            pid=os.getpid(),
            since=datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
            heartbeat=time.time(),
            ttl_s=self.ttl,
            what=self.what,
        )

    def _try_local(self) -> LeaseHolder | None:
        """None when we hold the lease now; else the current holder (as far as it is known)."""
        import fcntl

        folder = os.path.dirname(self.path) or "."
        try:
            make_dirs(folder)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise storage_error(exc, folder) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                os.close(fd)
                raise storage_error(exc, self.path, "lock") from exc
            holder = _read_fd(fd)
            os.close(fd)
            if holder is None:
                return _unknown_holder(self.ttl)
            mtime = _mtime(self.path)
            beat = max(holder.heartbeat, mtime or 0.0)
            # A live process on this host keeps its lock; one on another host is judged by its
            # heartbeat, since its lock may not be visible here.
            if holder.host != socket.gethostname() and time.time() - beat > self.ttl:
                log.warning("taking over the expired lease %s of %s", self.path, holder.describe())
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)
                return self._try_local()
            return holder
        # Locked: make sure the file is still the one at the path (a releasing holder unlinks it
        # after we opened it; the lock would then be on a dead inode).
        try:
            same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)
            return _unknown_holder(self.ttl, retry=True)
        holder = self._new_holder()
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, holder.to_json(), 0)
            os.fsync(fd)
        except OSError as exc:
            os.close(fd)
            raise storage_error(exc, self.path) from exc
        self._fd = fd
        self.holder = holder
        return None

    def _release_local(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        # Unlink while still locked, so no one can lock this inode and believe it current.
        with contextlib.suppress(OSError):
            if os.fstat(fd).st_ino == os.stat(self.path).st_ino:
                os.unlink(self.path)
        os.close(fd)

    def _beat_local(self) -> bool:
        fd = self._fd
        if fd is None:
            return False
        try:
            if os.fstat(fd).st_ino != os.stat(self.path).st_ino:
                return False
            os.utime(fd)
        except FileNotFoundError:
            return False
        except OSError as exc:
            log.warning("lease %s: heartbeat failed: %s", self.path, exc)
        return True

    # -- object stores ---------------------------------------------------------------------

    def _read_object(self) -> LeaseHolder | None:
        with contextlib.suppress(Exception):
            self.fs.invalidate_cache(self.path)
        try:
            data = self.fs.cat_file(self.path)
        except FileNotFoundError:
            return None
        holder = LeaseHolder.from_json(data)
        if holder is None:
            # Puts are atomic, so an unreadable lease object is garbage, not a write in
            # progress: it counts as expired and is taken over.
            return LeaseHolder(
                owner="?", host="?", pid=-1, since="?", heartbeat=0.0, ttl_s=self.ttl
            )
        return holder

    def _put_object(self, holder: LeaseHolder, create: bool) -> None:
        data = holder.to_json()
        if create:
            try:
                with self.fs.open(self.path, "xb") as handle:
                    handle.write(data)
                return
            except FileExistsError:
                raise
            except (NotImplementedError, ValueError, TypeError):
                pass  # no create-only put here: plain put, then the read-back decides
        self.fs.pipe_file(self.path, data)

    def _try_object(self) -> LeaseHolder | None:
        try:
            current = self._read_object()
            if current is not None and not current.expired(time.time()):
                return current
            if current is not None:
                log.warning("taking over the expired lease %s of %s", self.url, current.describe())
            mine = self._new_holder()
            try:
                self._put_object(mine, create=current is None)
            except FileExistsError:
                return self._read_object() or _unknown_holder(self.ttl, retry=True)
            if self.settle:
                time.sleep(self.settle)
            back = self._read_object()
        except OutputBusyError:
            raise
        except Exception as exc:
            raise storage_error(exc, self.url, "take the lease at") from exc
        if back is None or back.owner != mine.owner:
            return back or _unknown_holder(self.ttl, retry=True)
        self.holder = mine
        return None

    def _beat_object(self) -> bool:
        assert self.holder is not None
        current = self._read_object()
        if current is None or current.owner != self.holder.owner:
            return False
        self.holder = LeaseHolder(**{**asdict(self.holder), "heartbeat": time.time()})
        self.fs.pipe_file(self.path, self.holder.to_json())
        return True

    # -- heartbeat -------------------------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        interval = self.ttl / 3
        while not self._stop.wait(interval):
            try:
                ok = self._beat_local() if self.local else self._beat_object()
            except Exception as exc:  # a flaky store: try again next beat, before expiry
                log.warning("lease %s: heartbeat failed: %s", self.url, exc)
                continue
            if not ok:
                self.lost = True
                log.error("lease %s was taken over by another writer; stopping", self.url)
                if self.on_lost is not None:
                    with contextlib.suppress(Exception):
                        self.on_lost()
                return

    def _busy(self, holder: LeaseHolder, wait: float) -> OutputBusyError:
        output = self.url.rsplit("/", 1)[0]
        waited = f" (waited {wait:g} s)" if wait > 0 else ""
        who = holder.describe() if holder.pid >= 0 else "another writer (taking the lease now)"
        return OutputBusyError(
            f"{output} is in use by {who}{waited}",
            hint="let it finish, or pass --wait SECONDS to wait for it; a lease left by a"
            f" killed process is taken over {self.ttl:g} s after its last heartbeat",
        )


def _unknown_holder(ttl: float, retry: bool = False) -> LeaseHolder:
    # A lease being written or released right now: report "unknown", poll again.
    return LeaseHolder(
        owner="", host="?", pid=-1, since="?", heartbeat=time.time(), ttl_s=ttl,
        what="retry" if retry else "",
    )


def _read_fd(fd: int) -> LeaseHolder | None:
    try:
        data = os.pread(fd, 4096, 0)
    except OSError:
        return None
    return LeaseHolder.from_json(data) if data else None


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None
