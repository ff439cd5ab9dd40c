"""The provider's limits for one key, shared by every worker: Prefect global concurrency limits.

`shared_limiter(config)` gives this process's `SharedLimiter` (specregen/client/limits.py) for
the config's `shared_limit`, over two global concurrency limits on the Prefect server:

* `specregen-rpm-<name>`: R slots, one per request, each held until 60 s after its request
  (a sliding one-minute window).
* `specregen-inflight-<name>`: W slots, held while requests are in flight.

Both are taken `batch` slots at a time with leases (`increment-with-lease`), which the limiter
renews; a lost worker's slots come back when its leases run out. The server must keep leases
across its own restarts: infra/env.sh sets PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE to the
file-based storage (the default keeps them in memory, so a restarted server would keep the slots
of leases it forgot, for ever).

Why not Prefect's rate-limit mode (slot decay): the server applies the decay only when the
limit's row is written, and every write (a refused take included) restarts the decay clock, so
two workers polling a saturated limit lose decay and run below R; it also rounds the decay down
at each take. docs/ARCHITECTURE.md, "Running on many machines", has the measurement.
"""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID

import httpx
from prefect.client.orchestration import get_client

from specregen.client.limits import LimitConfig, SharedLimiter
from specregen.config import PipelineConfig
from specregen.store.manifest import fingerprint

_LIMITERS: dict[tuple[str, int], SharedLimiter] = {}


class PrefectSlots:
    """`SlotStore` on the Prefect server's global concurrency limits (v2 API, leases)."""

    async def take(self, name: str, slots: int, lease_s: float) -> UUID | None:
        async with get_client() as client:
            try:
                response = await client.increment_concurrency_slots_with_lease(
                    names=[name], slots=slots, mode="concurrency", lease_duration=lease_s)
            except httpx.HTTPStatusError as exc:
                if exc.response.status_code == 423:  # no room now
                    return None
                raise
        return UUID(response.json()["lease_id"])

    async def give(self, lease: UUID) -> None:
        async with get_client() as client:
            try:
                await client.release_concurrency_slots_with_lease(lease)
            except httpx.HTTPStatusError as exc:
                if exc.response.status_code != 404:  # already expired: nothing to give
                    raise

    async def renew(self, lease: UUID, lease_s: float) -> bool:
        async with get_client() as client:
            try:
                await client.renew_concurrency_lease(lease, lease_s)
            except httpx.HTTPStatusError as exc:
                if exc.response.status_code in (404, 410):
                    return False
                raise
        return True


def limit_names(config: PipelineConfig) -> tuple[str, str]:
    """(rate limit, window limit) names: one key (endpoint + its variable or Secret), one pair."""
    limit = config.shared_limit
    assert limit is not None
    name = limit.name or fingerprint(
        "limit", config.endpoint.base_url, config.endpoint.api_key_env, config.api_key_secret
    )[:16]
    return f"specregen-rpm-{name}", f"specregen-inflight-{name}"


async def ensure_limits(config: PipelineConfig) -> tuple[str, str]:
    """Create or resize the two limits to the config's values (idempotent)."""
    limit: LimitConfig = config.shared_limit  # type: ignore[assignment]
    rate, window = limit_names(config)
    async with get_client() as client:
        if limit.requests_per_minute:
            await client.upsert_global_concurrency_limit_by_name(
                rate, int(limit.requests_per_minute))
        if limit.in_flight:
            await client.upsert_global_concurrency_limit_by_name(window, limit.in_flight)
    return rate, window


async def shared_limiter(config: PipelineConfig, **options: Any) -> SharedLimiter | None:
    """This process's limiter for the config's key (one per event loop), or None when the
    config has no `shared_limit`."""
    limit = config.shared_limit
    if limit is None or not (limit.requests_per_minute or limit.in_flight):
        return None
    rate, window = limit_names(config)
    key = (f"{rate}|{window}|{limit.model_dump_json()}",
           id(asyncio.get_running_loop()))
    limiter = _LIMITERS.get(key)
    if limiter is None:
        await ensure_limits(config)
        limiter = SharedLimiter(
            PrefectSlots(), rate_name=rate, per_minute=limit.requests_per_minute,
            window_name=window, in_flight=limit.in_flight, batch=limit.batch,
            period_s=limit.period_s, **options,
        )
        _LIMITERS[key] = limiter
    return limiter
