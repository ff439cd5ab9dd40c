from __future__ import annotations

import asyncio
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict

from prefect import task

from specregen.pipeline.reconstruction import finish_reconstruction, reconstruct_chunk
from specregen.procs import exit_with_parent
from specregen.store.manifest import Shard
from tasks.common import dataset_run, stage_key

_POOLS: dict[tuple[int, int], ProcessPoolExecutor] = {}


def _pool(workers: int) -> ProcessPoolExecutor:
    # Tokenization is CPU work: it runs in worker processes, which keep their tokenizer loaded
    # from one chunk to the next. Workers see the environment of the moment they started, and
    # storage credentials come from it: when it changes, start fresh workers.
    key = (workers, hash(frozenset(os.environ.items())))
    if key not in _POOLS:
        for old in list(_POOLS):
            if old[0] == workers:
                _POOLS.pop(old).shutdown(wait=False, cancel_futures=False)
        # Workers exit when this process dies (SIGKILL included): no shard is written after.
        _POOLS[key] = ProcessPoolExecutor(workers, initializer=exit_with_parent,
                                          initargs=(os.getpid(),))
    return _POOLS[key]


@task(name="reconstruct-chunk", retries=1, cache_key_fn=stage_key("reconstruct"),
      persist_result=True)
async def reconstruct_chunk_task(
    config_path: str, dataset: str, chunk: int, fingerprint: str
) -> dict:
    run = dataset_run(config_path, dataset)
    loop = asyncio.get_running_loop()
    shard, counts = await loop.run_in_executor(
        _pool(run.config.reconstruct_workers), reconstruct_chunk, run, chunk
    )
    return {"shard": asdict(shard), "counts": counts}


@task(name="finish-reconstruction")
def finish_reconstruction_task(config_path: str, dataset: str, results: list[dict]) -> dict:
    run = dataset_run(config_path, dataset)
    manifest = finish_reconstruction(
        run, [(Shard(**r["shard"]), r["counts"]) for r in results]
    )
    return {"fingerprint": manifest.fingerprint, **manifest.counts}
