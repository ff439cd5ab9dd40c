"""tasks.common.ProgressArtifacts: the async progress artifact of inference and reconstruction
chunks, without a server (the real server: tests/integration/test_progress_artifacts.py)."""

from __future__ import annotations

import asyncio
import logging

import prefect.artifacts

from specregen.progress import Progress
from tasks.common import ProgressArtifacts


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_states_arriving_during_a_slow_write_collapse_into_the_next(monkeypatch) -> None:
    sent: list[tuple[str, float, str]] = []

    async def create(progress, key=None, description=None):
        await asyncio.sleep(0.05)  # a slow server
        sent.append(("create", progress, description))
        return "artifact-1"

    async def update(artifact_id, progress, description=None):
        await asyncio.sleep(0.05)
        sent.append(("update", progress, description))
        return artifact_id

    monkeypatch.setattr(prefect.artifacts, "acreate_progress_artifact", create)
    monkeypatch.setattr(prefect.artifacts, "aupdate_progress_artifact", update)

    async def main() -> ProgressArtifacts:
        clock = FakeClock()
        artifact = ProgressArtifacts("ds-infer-chunk-0", "Inference of ds, chunk 0")
        progress = Progress("infer ds chunk 0", total=100, interval=1.0, clock=clock,
                            observers=[artifact])
        for i in range(1, 11):  # ten states while the first write is still on its way
            clock.now += 1.0
            progress.set(done=10 * i - 5, in_flight=5, cost_usd=0.01 * i)
        await asyncio.sleep(0.2)
        clock.now += 1.0
        progress.set(done=100, in_flight=0, cost_usd=0.11)
        progress.close()
        await artifact.aclose()
        return artifact

    artifact = asyncio.run(main())
    # Ten states before the writer ran: it sent the newest only; then the two last states
    # (done, then closed) went as one write of the final state. Never a call per state.
    assert [(kind, percent) for kind, percent, _ in sent] == [("create", 95.0),
                                                               ("update", 100.0)], sent
    assert "95/100 (95.0%), 95 done, 0 failed, 5 in flight" in sent[0][2]
    assert "left" in sent[0][2] and "projected" in sent[0][2]
    kind, percent, text = sent[-1]
    assert (kind, percent) == ("update", 100.0)
    assert text.startswith("Inference of ds, chunk 0: infer ds chunk 0: 100/100 (100.0%)")
    assert "$0.1100 spent" in text and "took" in text
    assert artifact.written == [t for _, _, t in sent]


def test_a_failing_server_stops_the_display_not_the_work(monkeypatch, caplog) -> None:
    calls = []

    async def create(progress, key=None, description=None):
        calls.append(progress)
        raise RuntimeError("503 from the Prefect API")

    monkeypatch.setattr(prefect.artifacts, "acreate_progress_artifact", create)

    async def main() -> None:
        clock = FakeClock()
        artifact = ProgressArtifacts("ds-infer-chunk-0", "Inference")
        progress = Progress("infer", total=10, interval=1.0, clock=clock, observers=[artifact])
        for i in range(1, 11):
            clock.now += 1.0
            progress.set(done=i)
            await asyncio.sleep(0)
        progress.close()
        await artifact.aclose()  # does not raise

    with caplog.at_level(logging.WARNING, logger="tasks.common"):
        asyncio.run(main())
    assert len(calls) == 1  # tried once, then quiet
    assert sum("could not be written" in r.getMessage() for r in caplog.records) == 1
