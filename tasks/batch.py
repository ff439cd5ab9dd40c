"""One short batch pass over one chunk: submit what it lacks, collect what finished, return.

Never cached: a pass while batches run returns `batches_open` > 0 and must run again later. A
chunk whose every sample is final returns its stored summary at once (pipeline/inference.py),
and the batch ledger in its raw log makes a rerun or a UI retry resubmit nothing.
"""

from __future__ import annotations

from prefect import task
from prefect.tasks import exponential_backoff

from specregen.pipeline.apikey import load_api_key
from specregen.pipeline.inference import infer_chunk
from specregen.pipeline.window import chunk_concurrency
from tasks.common import dataset_run
from tasks.inference import _retry_unless_fatal
from tasks.secrets import read_prefect_secret


@task(
    name="batch-chunk",
    retries=2,
    retry_delay_seconds=exponential_backoff(backoff_factor=5),
    retry_jitter_factor=0.5,
    retry_condition_fn=_retry_unless_fatal,
)
async def batch_chunk_task(config_path: str, dataset: str, chunk: int, fingerprint: str) -> dict:
    """Submit the chunk's missing requests as batches (at most once each), poll its open
    batches once and record the finished results; seconds, not the batch's day."""
    run = dataset_run(config_path, dataset)
    key = await load_api_key(run.config, read_prefect_secret)
    result = await infer_chunk(run, chunk, api_key=key, wait=False,
                               concurrency=chunk_concurrency(run.config))
    return result  # a budget stop too: an outcome (the chain ends `stopped`), not an error
