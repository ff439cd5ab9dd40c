"""How much a crash loses on object storage: the raw log's commit settings (issue 12).

A part is put once the writer's in-flight window of answers waits, or once the oldest has waited
the time that window takes at the configured rate; `endpoint.log_commit_seconds` overrides the
time. Answers not yet put when a worker dies are paid again by its rerun.
"""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace

from specregen.client.config import EndpointConfig
from specregen.client.limits import LimitConfig
from specregen.pipeline.inference import _rolls
from specregen.store.rawlog import AttemptRecord, RawLog, commit_rolls


def _record(i: int) -> AttemptRecord:
    return AttemptRecord(sample_id=f"s{i}", fingerprint="f", attempt=1, status="failed",
                         final=False)


def _root() -> str:
    return f"memory://commit-{uuid.uuid4().hex}"


def test_rolls_follow_the_window_and_the_rate() -> None:
    # 64 in flight at 600/min: the window is answered in 6.4 s.
    assert commit_rolls(64, 600) == {"roll_records": 64, "roll_seconds": 6.4}
    # No rate known: the count bounds the loss; the time stays at most 10 s.
    assert commit_rolls(64) == {"roll_records": 64, "roll_seconds": 10.0}
    # A slow rate never waits longer than before.
    assert commit_rolls(64, 60)["roll_seconds"] == 10.0
    # The configured time wins; a huge window still makes parts of at most 2,000 records.
    assert commit_rolls(5000, 600, 2.5) == {"roll_records": 2000, "roll_seconds": 2.5}


def test_a_crash_loses_at_most_one_window_of_answers() -> None:
    """Answers arriving fast (no rate configured): without a clean close, everything but the
    last partial window is already in parts (the 10 s / 2,000-record defaults had put none)."""
    root, window = _root(), 8

    async def main() -> int:
        log = RawLog(root, **commit_rolls(window))
        for i in range(100):
            log.submit(_record(i))
            await asyncio.sleep(0.002)
        await asyncio.sleep(0.05)  # the writer's last put, if due
        # The process "dies" here: no flush, no aclose.
        return len(list(RawLog(root).iter_records()))

    durable = asyncio.run(main())
    assert 100 - window <= durable <= 100, durable


def test_a_slow_rate_commits_by_time() -> None:
    """Fewer answers than the window at 2,400/min with 4 in flight: put after 0.1 s."""
    root = _root()
    settings = commit_rolls(4, 2400)
    assert settings["roll_seconds"] == 0.1

    async def main() -> tuple[int, int]:
        log = RawLog(root, **settings)
        log.submit(_record(0))
        log.submit(_record(1))
        await asyncio.sleep(0.01)
        before = len(list(RawLog(root).iter_records()))
        await asyncio.sleep(0.3)
        return before, len(list(RawLog(root).iter_records()))

    assert asyncio.run(main()) == (0, 2)


def test_the_pipeline_chunk_takes_the_endpoint_setting_and_the_shared_rate() -> None:
    endpoint = EndpointConfig(base_url="http://127.0.0.1:1/v1", model="m", concurrency=16)
    shared = SimpleNamespace(config=SimpleNamespace(
        shared_limit=LimitConfig(requests_per_minute=480, in_flight=16)))
    alone = SimpleNamespace(config=SimpleNamespace(shared_limit=None))
    # 16 in flight at the key's 480/min: 2 s.
    assert _rolls(shared, endpoint) == {"roll_records": 16, "roll_seconds": 2.0}
    assert _rolls(alone, endpoint) == {"roll_records": 16, "roll_seconds": 10.0}
    configured = EndpointConfig(base_url="http://127.0.0.1:1/v1", model="m", concurrency=16,
                                log_commit_seconds=3.0)
    assert _rolls(shared, configured)["roll_seconds"] == 3.0
    # A limit counted per 5 s (16 per 5 s = 192/min) and a smaller shared window: 8 answered
    # in 2.5 s.
    per_5s = SimpleNamespace(config=SimpleNamespace(
        shared_limit=LimitConfig(requests_per_minute=16, period_s=5.0, in_flight=8)))
    assert _rolls(per_5s, endpoint) == {"roll_records": 8, "roll_seconds": 2.5}
