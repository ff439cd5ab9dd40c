from __future__ import annotations

import asyncio
from dataclasses import asdict

from prefect import task

from specregen.pipeline.reconstruction import finish_reconstruction, reconstruct_chunk
from specregen.procs import kept_pool
from specregen.store.manifest import Shard
from tasks.common import dataset_run, stage_key


@task(name="reconstruct-chunk", retries=1, cache_key_fn=stage_key("reconstruct"),
      persist_result=True)
async def reconstruct_chunk_task(
    config_path: str, dataset: str, chunk: int, fingerprint: str
) -> dict:
    run = dataset_run(config_path, dataset)
    loop = asyncio.get_running_loop()
    # Tokenization is CPU work: in worker processes kept from one chunk to the next (their
    # tokenizer stays loaded), which exit if this process dies.
    shard, counts = await loop.run_in_executor(
        kept_pool(run.config.reconstruct_workers), reconstruct_chunk, run, chunk
    )
    return {"shard": asdict(shard), "counts": counts}


@task(name="finish-reconstruction")
def finish_reconstruction_task(config_path: str, dataset: str, results: list[dict]) -> dict:
    run = dataset_run(config_path, dataset)
    manifest = finish_reconstruction(
        run, [(Shard(**r["shard"]), r["counts"]) for r in results]
    )
    return {"fingerprint": manifest.fingerprint, **manifest.counts}
