from __future__ import annotations

from prefect import task
from prefect.tasks import exponential_backoff

from specregen.client.engine import FatalAPIError
from specregen.pipeline.apikey import load_api_key
from specregen.pipeline.inference import chunk_inferred, infer_chunk
from specregen.pipeline.window import chunk_concurrency
from specregen.progress import Progress, engine_observer, publish
from tasks.common import (
    ProgressArtifacts,
    chunk_rows,
    dataset_run,
    retry_unless_user_error,
    stage_key,
)
from tasks.gate import artifact_key
from tasks.limits import shared_limiter
from tasks.secrets import read_prefect_secret


def _retry_unless_fatal(task, task_run, state) -> bool:
    # A bad key, no credits or any other failure the user must fix fails every retry too: stop
    # at once. Crashes and outages retry. (A spent budget is not a failure here: the chunk
    # returns its stop, and the chain ends `stopped`.)
    error = state.result(raise_on_failure=False, _sync=True)
    if isinstance(error, FatalAPIError):
        return False
    return retry_unless_user_error(task, task_run, state)


@task(
    name="infer-chunk",
    retries=2,
    retry_delay_seconds=exponential_backoff(backoff_factor=5),
    retry_jitter_factor=0.5,
    retry_condition_fn=_retry_unless_fatal,
    # Cached only once the chunk is finished: a chunk stopped by the budget returns its stop
    # (not an error: the chain ends `stopped` with its summary) and must run again next time.
    cache_key_fn=stage_key("infer", finished=lambda run, p: chunk_inferred(run, p["chunk"])
                           is not None),
    persist_result=True,
    # No concurrency tag by default: with no limit behind it, every task run still asks the
    # server for a slot, which on SQLite collided with state writes (503, 2 s client backoff,
    # the whole window idle). Add one with `.with_options(tags=[...])` when a limit exists.
)
async def infer_chunk_task(config_path: str, dataset: str, chunk: int, fingerprint: str) -> dict:
    """Request what this chunk's raw log lacks. Per-request retries happen inside the client."""
    run = dataset_run(config_path, dataset)
    done = chunk_inferred(run, chunk)
    if done is not None:  # nothing to ask, nothing to watch
        return done
    key = await load_api_key(run.config, read_prefect_secret)
    # The key's limits shared with every worker (config `shared_limit`), else None.
    limiter = await shared_limiter(run.config)
    # Live numbers: `specregen run`'s board (publish) and a progress artifact in the UI.
    progress = Progress(f"infer {dataset} chunk {chunk}", total=chunk_rows(run, chunk),
                        interval=2.0, observers=[publish])
    artifact = ProgressArtifacts(artifact_key(dataset, f"infer-chunk-{chunk}"),
                                 f"Inference of {dataset}, chunk {chunk}")
    progress.subscribe(artifact)
    try:
        result = await infer_chunk(run, chunk, api_key=key,
                                   concurrency=chunk_concurrency(run.config),
                                   progress=engine_observer(progress), limiter=limiter)
    finally:
        progress.close()
        await artifact.aclose()
    # A stopped chunk (`stopped_reason`) is an outcome, returned like any other: the chain ends
    # `stopped`, and the flow fails after it published the run summary.
    return result
