"""Limits one API key shares with every process using it: requests per minute, requests in flight.

The engine calls `await limiter.acquire()` before each request and `limiter.release(sent)` after
it (`RequestLimiter`). `SharedLimiter` keeps the counts in a `SlotStore` that every worker sees
(the Prefect server: tasks/limits.py) and talks to it in batches, never once per request:

* Requests per minute: a limit of R slots. A request spends one slot, and the slot stays taken
  until 60 s after the request was sent, so any 60 s hold at most R requests (a sliding window,
  exact; a token bucket would allow a burst on top). Slots are taken `batch` at a time; a batch
  goes back to the store 60 s after the last request that used it.
* Requests in flight: a limit of W slots, taken `batch` at a time, given back when this process
  has had a batch more than it needs for a second (so a short gap between two requests does not
  ask the store twice).
* Everything is taken with a lease that a background loop renews: slots of a process that died
  (a lost worker) come back when its leases expire, at least 60 s after its last request.
* The store unreachable (a server restart): requests keep using the slots already held; taking
  more is retried until `outage_s` has passed, then the error is raised.

`MemorySlots` is the same store in this process (one process, or tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from specregen.errors import UnavailableError

log = logging.getLogger(__name__)

T = TypeVar("T")
PERIOD_S = 60.0  # requests "per minute"
# A lease outlives its last renewal by this much. Rate slots must stay taken 60 s after their
# request even when their holder dies: 60 + RENEW_S + margin. Window slots of a dead holder
# should come back soon: the store's minimum, 60.
LEASE_S = 90.0
WINDOW_LEASE_S = 60.0
RENEW_S = 20.0


class LimitConfig(BaseModel):
    """`shared_limit:` in the pipeline config: what the provider allows this key."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requests_per_minute: float | None = Field(default=None, ge=1)
    in_flight: int | None = Field(default=None, ge=1)
    # Slots taken from the store at once: fewer store calls, but up to this many slots per
    # process may sit unused for a moment.
    batch: int = Field(default=10, ge=1, le=10_000)
    # The rate's window: requests_per_minute requests per period_s seconds (a provider that
    # counts per second or per 10 s, or a short test).
    period_s: float = Field(default=PERIOD_S, gt=0, le=86_400)
    # Limit names on the Prefect server are `specregen-rpm-<name>` and `specregen-inflight-
    # <name>`; default: derived from the endpoint URL and the key's variable (one key, one
    # limit), never from the key itself.
    name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,63}$")


class LimitStoreError(UnavailableError):
    """The store of the shared limits could not be reached for longer than allowed."""


class RequestLimiter(Protocol):
    async def acquire(self) -> None:
        """Wait until one more request may start."""

    def release(self, sent: bool = True) -> None:
        """The request ended (`sent`) or never started."""


class SlotStore(Protocol):
    """Named counters with a maximum, whose slots are taken under a lease."""

    async def take(self, name: str, slots: int, lease_s: float) -> Any | None:
        """A lease on `slots` slots of limit `name`, or None when they are not free."""

    async def give(self, lease: Any) -> None:
        """Free the lease's slots."""

    async def renew(self, lease: Any, lease_s: float) -> bool:
        """Extend the lease; False when the store no longer knows it (it expired)."""


@dataclass
class _RateBatch:
    lease: Any
    size: int
    renewed: float
    used: int = 0
    last_use: float = 0.0


@dataclass
class _Held:
    lease: Any
    size: int
    renewed: float


class SharedLimiter:
    """`RequestLimiter` over a `SlotStore`; see the module docstring. One per event loop."""

    def __init__(
        self,
        store: SlotStore,
        *,
        rate_name: str | None,
        per_minute: float | None,
        window_name: str | None,
        in_flight: int | None,
        batch: int = 10,
        poll_s: float = 0.25,
        outage_s: float = 300.0,
        period_s: float = PERIOD_S,
        lease_s: float = LEASE_S,
        window_lease_s: float = WINDOW_LEASE_S,
        renew_s: float = RENEW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.rate_name = rate_name if per_minute else None
        self.window_name = window_name if in_flight else None
        self.rate_batch = max(1, min(batch, int(per_minute or 1)))
        self.window_batch = max(1, min(batch, in_flight or 1))
        self.poll_s = poll_s
        self.outage_s = outage_s
        self.period_s = period_s
        # A slot is freed this much later than period_s after its request was let go: the
        # request reaches the provider a little after (connection, a busy loop), and the
        # provider counts arrivals.
        self.margin_s = max(0.2, 0.01 * period_s)
        self.lease_s = lease_s
        self.window_lease_s = window_lease_s
        self.renew_s = renew_s
        self._clock = clock
        self._rate: deque[_RateBatch] = deque()  # the first one with room is used
        self._spent: list[_RateBatch] = []  # full, given back at last_use + period
        self._window: list[_Held] = []
        self._surplus_since: float | None = None
        self.in_flight = 0
        self._waiting = 0
        self._changed = asyncio.Event()
        self._refill_task: asyncio.Task[None] | None = None
        self._keeper: asyncio.Task[None] | None = None
        self._error: BaseException | None = None
        self._closed = False
        # What the store was asked (a benchmark prints it): takes granted, refused, gives.
        self.store_calls = {"take": 0, "refused": 0, "give": 0, "renew": 0}

    # -- the engine's side ---------------------------------------------------------------

    async def acquire(self) -> None:
        self._waiting += 1
        try:
            while True:
                if self._error is not None:
                    raise self._error
                if self._closed:
                    raise RuntimeError("the limiter is closed")
                if self._rate_free() and self._window_free():
                    self._take_one()
                    return
                self._ensure_refill()
                changed = self._changed
                await changed.wait()
        finally:
            self._waiting -= 1

    def release(self, sent: bool = True) -> None:
        # A slot taken but not sent (the run stopped) still counts against the rate: it is
        # rare (the end of a run), and giving it back would reopen a batch already timed.
        self.in_flight -= 1
        self._notify()

    # -- the rest ------------------------------------------------------------------------

    def _rate_free(self) -> bool:
        return self.rate_name is None or any(b.used < b.size for b in self._rate)

    def _window_free(self) -> bool:
        return self.window_name is None or self.in_flight < self._capacity()

    def _capacity(self) -> int:
        return sum(h.size for h in self._window)

    def _take_one(self) -> None:
        self.in_flight += 1
        if self.rate_name is None:
            return
        batch = self._rate[0]
        batch.used += 1
        batch.last_use = self._clock()
        if batch.used >= batch.size:
            self._spent.append(self._rate.popleft())
        self._start_keeper()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _ensure_refill(self) -> None:
        if self._refill_task is None or self._refill_task.done():
            self._refill_task = asyncio.ensure_future(self._refill())
        self._start_keeper()

    def _start_keeper(self) -> None:
        if self._keeper is None or self._keeper.done():
            self._keeper = asyncio.ensure_future(self._keep())

    async def _refill(self) -> None:
        """Take batches while someone waits for one; polls the store while it has no room."""
        try:
            while self._waiting and not self._closed:
                got = False
                if not self._rate_free():
                    lease = await self._call(self.store.take, self.rate_name, self.rate_batch,
                                             self.lease_s)
                    if lease is not None:
                        self._rate.append(_RateBatch(lease, self.rate_batch, self._clock()))
                        got = True
                if not self._window_free():
                    lease = await self._call(self.store.take, self.window_name,
                                             self.window_batch, self.window_lease_s)
                    if lease is not None:
                        self._window.append(_Held(lease, self.window_batch, self._clock()))
                        got = True
                if got:
                    self._notify()
                    await asyncio.sleep(0)  # let the waiters take their slots
                elif self._rate_free() and self._window_free():
                    self._notify()  # a release made room meanwhile
                    await asyncio.sleep(0)
                else:
                    await asyncio.sleep(self.poll_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the waiters raise it
            self._error = exc
        finally:
            self._notify()

    async def _call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """One store call; a store that cannot be reached is retried until `outage_s`."""
        deadline = self._clock() + self.outage_s
        delay = 0.5
        while True:
            try:
                result = await fn(*args)
            except Exception as exc:
                if self._clock() > deadline:
                    raise LimitStoreError(
                        f"the shared request limits could not be reached for {self.outage_s:g} s:"
                        f" {type(exc).__name__}: {exc}",
                        hint="check that the Prefect server is up (PREFECT_API_URL)",
                    ) from None
                log.warning("shared limits: %s: %s; retrying in %.1f s", type(exc).__name__,
                            exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
                continue
            name = getattr(fn, "__name__", "")
            if name == "take":
                self.store_calls["take" if result is not None else "refused"] += 1
            elif name in self.store_calls:
                self.store_calls[name] += 1
            return result

    async def _keep(self) -> None:
        """Give back spent rate batches when due and surplus window slots; renew leases."""
        while not self._closed:
            # Wake when the next spent batch is due (its slots are the rate's room), at the
            # latest after a short tick for the window and the renewals.
            tick = min(self.poll_s * 2, 1.0)
            if self._spent:
                due_at = min(b.last_use for b in self._spent) + self.period_s + self.margin_s
                tick = min(tick, max(0.0, due_at - self._clock()))
            await asyncio.sleep(tick)
            now = self._clock()
            due = [b for b in self._spent if now >= b.last_use + self.period_s + self.margin_s]
            for batch in due:
                self._spent.remove(batch)
                await self._give(batch.lease)
            # A batch half used and then left (this process has no more requests for now):
            # its used slots are old enough and the rest are free, so other workers get them.
            idle = [b for b in self._rate
                    if not self._waiting and now >= b.last_use + self.period_s + self.margin_s]
            for batch in idle:
                self._rate.remove(batch)
                await self._give(batch.lease)
            surplus = self._capacity() - self.in_flight - self._waiting
            if surplus >= self.window_batch and self._window:
                self._surplus_since = self._surplus_since or now
                if now - self._surplus_since >= 1.0:
                    await self._give(self._window.pop().lease)
                    self._surplus_since = None
            else:
                self._surplus_since = None
            await self._renew_all(now)
            if not (self._rate or self._spent or self._window or self._waiting):
                return  # nothing held: the next acquire starts the loop again

    async def _renew_all(self, now: float) -> None:
        # A used rate slot must stay taken 60 s after its request even if this process dies:
        # renewing every renew_s with a lease of lease_s >= period_s + renew_s ensures it.
        items: list[_RateBatch | _Held] = [*self._rate, *self._spent, *self._window]
        for item in items:
            if now - item.renewed < self.renew_s:
                continue
            item.renewed = now
            lease_s = self.window_lease_s if isinstance(item, _Held) else self.lease_s
            ok = await self._call(self.store.renew, item.lease, lease_s)
            if not ok:  # expired (the store was down longer than the lease): no longer held
                log.warning("shared limits: a lease expired; its slots are no longer held")
                for group in (self._rate, self._spent, self._window):
                    with contextlib.suppress(ValueError):
                        group.remove(item)  # type: ignore[arg-type]

    async def _give(self, lease: Any) -> None:
        try:
            await self._call(self.store.give, lease)
        except LimitStoreError as exc:  # the lease expires by itself
            log.warning("shared limits: %s", exc)

    async def aclose(self) -> None:
        """Give back the window slots and unused rate slots now; rate slots that were used
        stay taken until 60 s after their last request (their leases run out then)."""
        self._closed = True
        for task in (self._refill_task, self._keeper):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        for held in self._window:
            await self._give(held.lease)
        self._window.clear()
        now = self._clock()
        for batch in [*self._rate, *self._spent]:
            if batch.used == 0 or now >= batch.last_use + self.period_s + self.margin_s:
                await self._give(batch.lease)
            else:  # its lease, renewed now, frees it after period_s at the earliest
                with contextlib.suppress(LimitStoreError):
                    await self._call(self.store.renew, batch.lease, self.lease_s)
        self._rate.clear()
        self._spent.clear()
        self._notify()


class MemorySlots:
    """`SlotStore` in this process: one process sharing a limit between its chunks."""

    def __init__(self, limits: dict[str, int]) -> None:
        self.limits = dict(limits)
        self.used = dict.fromkeys(limits, 0)
        self._leases: dict[int, tuple[str, int, float]] = {}
        self._next = 0

    def _expire(self) -> None:
        now = time.monotonic()
        for lease, (name, slots, until) in list(self._leases.items()):
            if until <= now:
                del self._leases[lease]
                self.used[name] -= slots

    async def take(self, name: str, slots: int, lease_s: float) -> int | None:
        self._expire()
        if self.used[name] + slots > self.limits[name]:
            return None
        self.used[name] += slots
        self._next += 1
        self._leases[self._next] = (name, slots, time.monotonic() + lease_s)
        return self._next

    async def give(self, lease: int) -> None:
        name, slots, _ = self._leases.pop(lease, (None, 0, 0.0))
        if name is not None:
            self.used[name] -= slots

    async def renew(self, lease: int, lease_s: float) -> bool:
        self._expire()
        if lease not in self._leases:
            return False
        name, slots, _ = self._leases[lease]
        self._leases[lease] = (name, slots, time.monotonic() + lease_s)
        return True


def local_limiter(limit: LimitConfig, **options: Any) -> SharedLimiter:
    """The shared limits within this one process."""
    limits = {"rate": int(limit.requests_per_minute or 1), "window": limit.in_flight or 1}
    return SharedLimiter(
        MemorySlots(limits), rate_name="rate", per_minute=limit.requests_per_minute,
        window_name="window", in_flight=limit.in_flight, batch=limit.batch,
        period_s=limit.period_s, **options,
    )
