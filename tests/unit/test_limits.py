"""The shared request limiter over the in-process store: rate and window held together by two
limiters (two "workers"), batched store calls, an unreachable store, and a holder that died.

Schedules (how soon a slot comes back, how fully the rate is used) are checked on a virtual
clock (`VirtualClockLoop`): the loop's time moves only while nothing is ready to run, so the
times are those of the limiter's own schedule, however slow or loaded the machine.
"""

from __future__ import annotations

import asyncio
import selectors
import time
import types

import pytest

from specregen.client import limits as limits_module
from specregen.client.limits import LimitStoreError, MemorySlots, SharedLimiter

PERIOD = 1.0  # a "minute" of one second keeps the test short


def limiter(store, per_period, window, batch=5, **options):
    return SharedLimiter(store, rate_name="rate", per_minute=per_period, window_name="window",
                         in_flight=window, batch=batch, poll_s=0.02, period_s=PERIOD,
                         **options)


class _JumpingSelector(selectors.DefaultSelector):
    def __init__(self, clock: list[float]) -> None:
        super().__init__()
        self.clock = clock

    def select(self, timeout=None):
        if timeout is None:  # no timer at all: only I/O (none here) could wake the loop
            return super().select(timeout)
        events = super().select(0)
        if not events and timeout > 0:
            self.clock[0] += timeout  # nothing to run until the next timer: jump to it
        return events


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop on a virtual clock: instead of sleeping until its next timer it jumps to
    it, so a coroutine's times are exactly its schedule (the time it computes takes none).
    For code without I/O and threads; `run_virtual` also puts the in-process slot store on
    this clock."""

    def __init__(self) -> None:
        self.clock = [1000.0]
        super().__init__(_JumpingSelector(self.clock))

    def time(self) -> float:
        return self.clock[0]


def run_virtual(main, monkeypatch):
    """Run `main()` on a VirtualClockLoop; MemorySlots' leases expire on the same clock."""
    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        loop = runner.get_loop()
        monkeypatch.setattr(limits_module, "time", types.SimpleNamespace(monotonic=loop.time))
        return runner.run(main())


def test_the_virtual_clock_jumps_to_the_next_timer_and_runs_in_order(monkeypatch):
    order = []

    async def main():
        loop = asyncio.get_running_loop()
        start = loop.time()

        async def after(delay, name):
            await asyncio.sleep(delay)
            order.append((name, loop.time() - start))

        real = time.monotonic()
        await asyncio.gather(after(30.0, "b"), after(10.0, "a"), after(3600.0, "c"))
        return time.monotonic() - real

    real = run_virtual(main, monkeypatch)
    assert order == [("a", 10.0), ("b", 30.0), ("c", 3600.0)]
    assert real < 30.0  # an hour of the schedule, not of the machine


async def requests(lim: SharedLimiter, n: int, latency: float, sent: list, flight: list):
    async def one():
        await lim.acquire()
        sent.append(asyncio.get_running_loop().time())
        flight[0] += 1
        flight[1] = max(flight[1], flight[0])
        try:
            await asyncio.sleep(latency)
        finally:
            flight[0] -= 1
            lim.release()

    await asyncio.gather(*(one() for _ in range(n)))


def max_in_any_period(times: list[float]) -> int:
    times = sorted(times)
    best, start = 0, 0
    for end in range(len(times)):
        while times[end] - times[start] >= PERIOD:
            start += 1
        best = max(best, end - start + 1)
    return best


def test_two_limiters_share_one_rate_and_one_window_and_use_all_of_the_rate(monkeypatch):
    async def main():
        loop = asyncio.get_running_loop()
        store = MemorySlots({"rate": 40, "window": 6})
        a = limiter(store, 40, 6, clock=loop.time)
        b = limiter(store, 40, 6, clock=loop.time)
        sent: list[float] = []
        flight = [0, 0]
        start = loop.time()
        await asyncio.gather(requests(a, 100, 0.01, sent, flight),
                             requests(b, 100, 0.01, sent, flight))
        wall = loop.time() - start
        for lim in (a, b):
            await lim.aclose()
        return sent, flight, wall, a.store_calls, b.store_calls, store

    # On the virtual clock: the times are the limiters' schedule, not the machine's speed.
    sent, flight, wall, calls_a, calls_b, store = run_virtual(main, monkeypatch)
    assert len(sent) == 200
    # Never more than the rate in any period, never more than the window in flight.
    assert max_in_any_period(sent) <= 40
    assert flight[1] <= 6
    # The limit is used, not left idle: 200 requests at 40 per period take about 4 periods
    # after the first burst (a slot is freed one period after its batch's last request).
    assert wall < 200 / 40 * PERIOD * 1.35, wall
    # Batched: a take per 5 requests per limit, not one per request.
    takes = calls_a["take"] + calls_b["take"]
    assert takes <= 2 * (200 / 5) + 4, takes
    # Window slots and unused rate slots went back.
    assert store.used["window"] == 0


def test_unreachable_store_is_retried_then_named():
    class Flaky(MemorySlots):
        down_until = 0.0

        async def take(self, name, slots, lease_s):
            if time.monotonic() < self.down_until:
                raise ConnectionError("server down")
            return await super().take(name, slots, lease_s)

    async def main(down_for, outage_s):
        store = Flaky({"rate": 10, "window": 2})
        store.down_until = time.monotonic() + down_for
        lim = limiter(store, 10, 2, outage_s=outage_s)
        try:
            await asyncio.wait_for(lim.acquire(), 10)
            lim.release()
        finally:
            await lim.aclose()

    asyncio.run(main(0.6, 30.0))  # rides out a short outage
    with pytest.raises(LimitStoreError, match=r"could not be reached for 0\.3 s"):
        asyncio.run(main(5.0, 0.3))


def test_slots_of_a_holder_that_died_come_back_when_its_leases_expire(monkeypatch):
    async def main():
        loop = asyncio.get_running_loop()
        store = MemorySlots({"rate": 100, "window": 4})
        dead = limiter(store, 100, 4, batch=4, lease_s=0.5, window_lease_s=0.5, renew_s=0.1,
                       clock=loop.time)
        for _ in range(4):  # all the window, then "killed": never released, never closed
            await dead.acquire()
        dead._closed = True
        dead._keeper.cancel()
        alive = limiter(store, 100, 4, batch=4, lease_s=0.5, window_lease_s=0.5, renew_s=0.1,
                        clock=loop.time)
        start = loop.time()
        await asyncio.wait_for(alive.acquire(), 5)
        waited = loop.time() - start
        alive.release()
        await alive.aclose()
        return waited

    # Virtual clock: the leases (0.5 s) expire, then the next poll (0.02 s) takes the slots.
    waited = run_virtual(main, monkeypatch)
    assert 0.5 <= waited < 0.5 + 0.1, waited


def test_the_engine_asks_the_limiter_before_every_request_and_releases_after(tmp_path):
    from specregen.client.engine import run_inference
    from specregen.client.limits import LimitConfig, local_limiter
    from specregen.store.rawlog import RawLog
    from tests.unit.test_client_support import (
        SECRET_KEY,
        FakeServer,
        make_cfg,
        make_prompts,
        ok_handler,
    )

    server = FakeServer(ok_handler(delay=0.02))
    limit = LimitConfig(requests_per_minute=20, period_s=PERIOD, in_flight=3, batch=2)

    async def main():
        lim = local_limiter(limit, poll_s=0.02)
        async with RawLog(tmp_path) as log:
            summary = await run_inference(make_prompts(50), make_cfg(concurrency=16), log,
                                          api_key=SECRET_KEY, transport=server.transport,
                                          limiter=lim)
        await lim.aclose()
        return summary, lim

    summary, lim = asyncio.run(main())
    assert summary.ok == 50
    # The engine's own window is 16; the limiter's is 3, and at most 20 per period.
    assert max(count for _, count in server.timeline) <= 3
    assert max_in_any_period(server.starts) <= 20
    assert lim.in_flight == 0  # every acquire was released
