"""One writer per output: the lease on local folders and object stores."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import fsspec
import pytest

from specregen.errors import EXIT_BUSY, OutputBusyError
from specregen.store.lease import LEASE_NAME, Lease, LeaseHolder, acquire_lease, lease_path_for


def test_second_local_writer_is_refused_with_the_holder_named(tmp_path):
    out = str(tmp_path / "out")
    with acquire_lease(out, what="specregen infer"), pytest.raises(OutputBusyError) as info:
        acquire_lease(out)
    message = info.value.one_line()
    assert f"pid {os.getpid()}" in message and socket.gethostname() in message
    assert "specregen infer" in message and "--wait" in message
    assert info.value.exit_code == EXIT_BUSY
    # Released: the file is gone and the next writer gets it.
    assert not os.path.exists(lease_path_for(out))
    with acquire_lease(out):
        pass


def test_waiting_writer_gets_the_lease_when_the_holder_releases(tmp_path):
    out = str(tmp_path)
    first = acquire_lease(out)
    threading.Timer(0.4, first.release).start()
    started = time.monotonic()
    with acquire_lease(out, wait=10, ttl=4):
        waited = time.monotonic() - started
    assert 0.3 < waited < 5


def test_bounded_wait_gives_up(tmp_path):
    out = str(tmp_path)
    with acquire_lease(out):
        started = time.monotonic()
        with pytest.raises(OutputBusyError, match=r"waited 0\.5 s"):
            acquire_lease(out, wait=0.5, ttl=1)
        assert time.monotonic() - started < 3


HOLD = """
import sys, time
from specregen.store.lease import acquire_lease
lease = acquire_lease(sys.argv[1], ttl=3600)
print("held", flush=True)
time.sleep(600)
"""


def test_lease_of_a_killed_process_is_taken_over_at_once(tmp_path):
    out = str(tmp_path / "out")
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, out], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(OutputBusyError, match=f"pid {proc.pid} "):
            acquire_lease(out)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        # ttl is an hour, yet the dead holder's lock is gone with it.
        with acquire_lease(out) as lease:
            assert lease.holder is not None and lease.holder.pid == os.getpid()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_local_heartbeat_touches_the_file(tmp_path):
    out = str(tmp_path)
    with acquire_lease(out, ttl=0.3):
        path = lease_path_for(out)
        os.utime(path, (0, 0))
        time.sleep(0.35)
        assert os.stat(path).st_mtime > time.time() - 5


def test_unwritable_lease_location_is_a_storage_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    from specregen.errors import StorageError

    with pytest.raises(StorageError, match="regular file in the way"):
        acquire_lease(str(blocker / "out"))


# -- object stores (memory://, same code path as s3://) -------------------------------------------


def _memory_url(name: str) -> str:
    return f"memory://lease-tests/{name}-{time.monotonic_ns()}"


def test_object_store_second_writer_refused_then_free_after_release():
    out = _memory_url("a")
    with acquire_lease(out, what="run"), pytest.raises(OutputBusyError,
                                                        match=f"pid {os.getpid()}"):
        acquire_lease(out)
    fs = fsspec.filesystem("memory")
    assert not fs.exists(lease_path_for(out).removeprefix("memory://"))
    with acquire_lease(out):
        pass


def test_object_store_expired_lease_of_a_dead_writer_is_taken_over():
    out = _memory_url("b")
    fs, path = fsspec.core.url_to_fs(lease_path_for(out))
    dead = LeaseHolder(
        owner="dead", host="gone", pid=4242, since="2026-01-01T00:00:00Z",
        heartbeat=time.time() - 100, ttl_s=60,
    )
    fs.pipe_file(path, dead.to_json())
    with acquire_lease(out, ttl=60) as lease:
        assert LeaseHolder.from_json(fs.cat_file(path)).owner == lease.holder.owner
    # A fresh one is respected.
    alive = LeaseHolder(**{**dead.__dict__, "owner": "alive", "heartbeat": time.time()})
    fs.pipe_file(path, alive.to_json())
    with pytest.raises(OutputBusyError, match="pid 4242 on host gone"):
        acquire_lease(out, ttl=60)


def test_object_store_holder_notices_it_lost_the_lease():
    out = _memory_url("c")
    lost = threading.Event()
    lease = Lease(lease_path_for(out), ttl=0.3, on_lost=lost.set)
    lease.acquire()
    fs, path = fsspec.core.url_to_fs(lease_path_for(out))
    other = LeaseHolder(
        owner="other", host="h", pid=1, since="x", heartbeat=time.time(), ttl_s=60
    )
    fs.pipe_file(path, other.to_json())
    assert lost.wait(3)
    assert lease.lost
    lease.release()
    # Not ours any more: release leaves the other writer's lease alone.
    assert LeaseHolder.from_json(fs.cat_file(path)).owner == "other"


def test_object_store_heartbeat_keeps_a_live_lease_from_expiring():
    out = _memory_url("d")
    with acquire_lease(out, ttl=0.6):
        time.sleep(1.0)
        with pytest.raises(OutputBusyError):
            acquire_lease(out, ttl=0.6)


def test_lease_name_is_outside_the_raw_log_part_glob():
    assert not LEASE_NAME.startswith("part-")


@pytest.mark.integration
def test_s3_lease_against_a_moto_server(monkeypatch):
    """The object-store path on a real S3 API (moto on loopback): create-only put or put +
    read-back, refusal naming the holder, release."""
    moto_server = pytest.importorskip("moto.server")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        for key, value in {"AWS_ENDPOINT_URL": f"http://{host}:{port}",
                           "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                           "AWS_DEFAULT_REGION": "us-east-1"}.items():
            monkeypatch.setenv(key, value)
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()
        s3fs.S3FileSystem().mkdir("lease-test")
        out = "s3://lease-test/raw"
        with acquire_lease(out, settle=0.2, what="specregen infer"), pytest.raises(
                OutputBusyError, match=f"pid {os.getpid()}"):
            acquire_lease(out, settle=0.2)
        with acquire_lease(out, settle=0.2) as lease:
            assert lease.holder is not None
        s3fs.S3FileSystem.clear_instance_cache()
    finally:
        server.stop()
