"""The raw log: durable group commits, torn lines, final index, reconstruct input, object stores."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import uuid

import fsspec
import pytest

from specregen.reconstruct import reconstruct_jsonl_lines
from specregen.store import rawlog as rawlog_module
from specregen.store.rawlog import AttemptRecord, RawLog, RawLogError

REQUEST = {
    "model": "moonshotai/kimi-k2.5",
    "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
}
RESPONSE = {
    "choices": [
        {
            "message": {"role": "assistant", "content": "Hello!", "reasoning": "Greet."},
            "finish_reason": "stop",
        }
    ],
    "usage": {},
}


def record(sample_id="a", fingerprint="f1", attempt=1, status="ok", final=True, **extra):
    if final and status != "failed":
        extra.setdefault("request", REQUEST)
        extra.setdefault("response", RESPONSE)
    return AttemptRecord(
        sample_id=sample_id,
        fingerprint=fingerprint,
        attempt=attempt,
        status=status,
        final=final,
        **extra,
    )


def test_each_append_is_on_disk_and_readable_when_it_returns(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(rawlog_module.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))

    async def main():
        async with RawLog(tmp_path) as log:
            for i in range(3):
                await log.append(record(sample_id=f"s{i}"))
                # A fresh reader (another process, in effect) sees it at once.
                assert [r["sample_id"] for r in RawLog(tmp_path).iter_records()] == [
                    f"s{j}" for j in range(i + 1)
                ]
                (part,) = log.parts_written
                with open(part, "rb") as handle:
                    assert handle.read().count(b"\n") == i + 1
            return log.parts_written

    (part,) = asyncio.run(main())
    assert len(synced) >= 3
    assert os.path.basename(part).startswith("part-") and part.endswith(".jsonl")
    name = os.path.basename(part)
    assert f"-{os.getpid()}-" in name


def test_concurrent_appends_are_group_committed(tmp_path, monkeypatch):
    commits = []
    original = RawLog._commit_local

    def counting(self, lines):
        commits.append(len(lines))
        original(self, lines)

    monkeypatch.setattr(RawLog, "_commit_local", counting)

    async def main():
        async with RawLog(tmp_path) as log:
            await asyncio.gather(*(log.append(record(sample_id=f"s{i}")) for i in range(200)))

    asyncio.run(main())
    assert sum(commits) == 200
    assert len(commits) < 50  # many records per fsync


def test_record_schema(tmp_path):
    async def main():
        async with RawLog(tmp_path) as log:
            await log.append(
                record(
                    status="failed",
                    final=False,
                    error_class="rate_limited",
                    error_message="HTTP 429: slow",
                    latency_s=0.123456,
                    http_status=429,
                )
            )
            await log.append(
                record(
                    attempt=2,
                    usage={"prompt_tokens": 3},
                    cost_usd=0.002,
                    provider="P",
                    reference_completion_ids=[1, 2],
                    prompt_token_ids=[9],
                )
            )

    asyncio.run(main())
    failed, ok = RawLog(tmp_path).iter_records()
    assert failed["v"] == 1
    assert {k: failed[k] for k in ("status", "final", "error_class", "http_status")} == {
        "status": "failed",
        "final": False,
        "error_class": "rate_limited",
        "http_status": 429,
    }
    assert failed["latency_s"] == 0.1235
    assert "request" not in failed and "response" not in failed
    assert failed["created_at"].endswith("Z")
    assert ok["request"] == REQUEST and ok["response"] == RESPONSE
    assert (ok["reference_completion_ids"], ok["prompt_token_ids"]) == ([1, 2], [9])


def test_torn_last_line_is_skipped_with_a_warning(tmp_path, caplog):
    good = json.dumps(record().as_dict())
    (tmp_path / "part-20260101T000000000000Z-1-aaaa.jsonl").write_text(
        good + "\n" + good.replace('"a"', '"b"')[:40]
    )
    with caplog.at_level(logging.WARNING, logger="specregen.store.rawlog"):
        records = list(RawLog(tmp_path).iter_records())
    assert [r["sample_id"] for r in records] == ["a"]
    assert "line 2 is not a complete JSON record" in caplog.text
    assert RawLog(tmp_path).final_index() == {("a", "f1"): "ok"}


def test_a_new_run_writes_its_own_part_and_never_touches_old_ones(tmp_path):
    torn = tmp_path / "part-20260101T000000000000Z-1-aaaa.jsonl"
    torn.write_bytes(json.dumps(record().as_dict()).encode() + b'\n{"sample_id": "x')
    before = torn.read_bytes()

    async def main():
        async with RawLog(tmp_path) as log:
            await log.append(record(sample_id="b"))

    asyncio.run(main())
    assert torn.read_bytes() == before
    assert len(list(tmp_path.glob("part-*.jsonl"))) == 2
    assert [r["sample_id"] for r in RawLog(tmp_path).iter_records()] == ["a", "b"]


def test_final_index_and_final_samples(tmp_path):
    async def main():
        async with RawLog(tmp_path) as log:
            await log.append(record("a", status="failed", final=False))
            await log.append(record("a", attempt=2))
            await log.append(record("b", status="failed", final=True, request=REQUEST))
            await log.append(record("c", status="truncated"))
            await log.append(record("c", fingerprint="f2", reference_completion_ids=[7]))
            # A retried failure that later succeeded: the answer wins.
            await log.append(record("d", status="failed", final=True))
            await log.append(record("d", attempt=2))

    asyncio.run(main())
    log = RawLog(tmp_path)
    assert log.final_index() == {
        ("a", "f1"): "ok",
        ("b", "f1"): "failed",
        ("c", "f1"): "truncated",
        ("c", "f2"): "ok",
        ("d", "f1"): "ok",
    }
    samples = list(log.iter_final_samples())
    assert [s["sample_id"] for s in samples] == ["a", "c", "c", "d"]
    assert all(
        set(s) == {"sample_id", "request", "response", "reference_completion_ids"} for s in samples
    )
    assert samples[2]["reference_completion_ids"] == [7]


def test_final_samples_are_what_reconstruct_takes(tmp_path, mini_fmt):
    async def main():
        async with RawLog(tmp_path) as log:
            await log.append(record("a"))
            await log.append(record("b", status="failed", final=True))

    asyncio.run(main())
    lines = [json.dumps(s) for s in RawLog(tmp_path).iter_final_samples()]
    (sample,) = reconstruct_jsonl_lines(lines, mini_fmt)
    assert sample.sample_id == "a"
    assert sample.status != "error", sample.error


def test_missing_root_reads_as_empty(tmp_path):
    log = RawLog(tmp_path / "nothing-here")
    assert list(log.iter_records()) == [] and log.final_index() == {}


def _memory_root() -> str:
    return f"memory://rawlog-{uuid.uuid4().hex}"


def test_object_store_rolls_parts_by_record_count(tmp_path):
    root = _memory_root()

    async def main():
        log = RawLog(root, roll_records=3, roll_seconds=60)
        futures = [log.submit(record(sample_id=f"s{i}")) for i in range(7)]
        await asyncio.gather(*futures[:6])  # two full parts, put as soon as they filled
        assert len(log.parts_written) == 2
        assert not futures[6].done()  # the 7th waits for its part to roll
        await log.aclose()
        assert futures[6].done()
        return log.parts_written

    parts = asyncio.run(main())
    assert len(parts) == 3
    fs = fsspec.filesystem("memory")
    assert [fs.cat_file(p).count(b"\n") for p in parts] == [3, 3, 1]
    assert [r["sample_id"] for r in RawLog(root).iter_records()] == [f"s{i}" for i in range(7)]


def test_object_store_rolls_parts_by_age():
    root = _memory_root()

    async def main():
        async with RawLog(root, roll_records=1000, roll_seconds=0.1) as log:
            loop = asyncio.get_running_loop()
            started = loop.time()
            await log.append(record("a"))
            waited = loop.time() - started
            assert 0.09 <= waited < 1.0
            assert [r["sample_id"] for r in RawLog(root).iter_records()] == ["a"]

    asyncio.run(main())


def test_object_store_flush_puts_a_part_now():
    root = _memory_root()

    async def main():
        log = RawLog(root, roll_records=1000, roll_seconds=3600)
        log.submit(record("a"))
        await log.flush()
        assert RawLog(root).final_index() == {("a", "f1"): "ok"}
        await log.aclose()

    asyncio.run(main())


def test_a_failing_store_fails_the_futures_and_later_submits(monkeypatch):
    root = _memory_root()
    monkeypatch.setattr(rawlog_module, "PUT_ATTEMPTS", 2)
    monkeypatch.setattr(rawlog_module.time, "sleep", lambda s: None)

    async def main():
        log = RawLog(root, roll_records=1)
        monkeypatch.setattr(log.fs, "pipe_file", _raise)
        with pytest.raises(RawLogError, match="write failed"):
            await log.append(record("a"))
        with pytest.raises(RawLogError):
            log.submit(record("b"))
        with pytest.raises(RawLogError):
            await log.aclose()

    asyncio.run(main())


def _raise(*args, **kwargs):
    raise OSError("bucket is gone")
