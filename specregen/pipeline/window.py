"""The inference window over a dataset's chunks, the same in the library runner and the flow:
`chunks_in_flight` chunks at once, each with its share of the endpoint's request window."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from specregen.config import PipelineConfig

T = TypeVar("T")


def chunk_concurrency(config: PipelineConfig) -> int:
    """Each of the chunks running at once gets its share of the endpoint's window."""
    return max(1, config.endpoint.concurrency // config.chunks_in_flight)


async def each_chunk(
    config: PipelineConfig, chunks: int, one: Callable[[int], Awaitable[T]],
    after: Callable[[int, T], Awaitable[None]] | None = None,
) -> list[T]:
    """`one(k)` for every chunk k, at most `chunks_in_flight` at once (more would only split
    the endpoint's window thinner); results in chunk order. `after(k, result)` runs once the
    chunk has given its place to the next (a progress display must not hold the window)."""
    window = asyncio.Semaphore(config.chunks_in_flight)

    async def held(k: int) -> T:
        async with window:
            result = await one(k)
        if after is not None:
            await after(k, result)
        return result

    return list(await asyncio.gather(*(held(k) for k in range(chunks))))
