"""Stage `infer`: one chunk's prompts -> its raw log. Paid work: resumable, never repeated.

The raw log is the source of truth: a chunk run again sends only the samples without a final
result for the same request fingerprint. The chunk's summary is written when it ends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from specregen.client.config import EndpointConfig
from specregen.client.engine import InferenceSummary, ProgressSnapshot, run_inference
from specregen.client.limits import RequestLimiter
from specregen.client.preflight import ContextCheck, model_max_length
from specregen.client.secrets import ApiKey
from specregen.errors import BudgetError
from specregen.pipeline.layout import DatasetRun, chunk_name
from specregen.pipeline.probing import logprobs_wanted
from specregen.pipeline.prompts import read_chunk
from specregen.pipeline.reconstruction import run_format
from specregen.store.rawlog import RawLog, RollSettings, commit_rolls

STAGE = "infer"


class InferenceStoppedError(BudgetError, RuntimeError):
    """A chunk stopped before every sample had a result (budget); a rerun resumes it."""


def infer_parts(run: DatasetRun, chunk: int) -> tuple[str, ...]:
    return (run.name, STAGE, f"{run.prompts_fp}-{run.endpoint_fp}", chunk_name(chunk) + ".json")


def chunk_inferred(run: DatasetRun, chunk: int) -> dict[str, Any] | None:
    """The summary of a chunk whose every sample has a final result, else None."""
    parts = infer_parts(run, chunk)
    return run.store.read_json(*parts) if run.store.exists(*parts) else None


async def infer_chunk(
    run: DatasetRun,
    chunk: int,
    *,
    api_key: ApiKey | None,
    concurrency: int | None = None,
    progress: Callable[[ProgressSnapshot], Any] | None = None,
    wait: bool = True,
    limiter: RequestLimiter | None = None,
) -> dict[str, Any]:
    """Request what the chunk's raw log lacks; returns the chunk's summary (small, JSON).

    `endpoint.mode: batch` goes through the batch API (client/batch.py); with `wait=False` it
    submits, collects what has finished and returns `batches_open` > 0 while batches run (the
    chunk is not done then: call again later)."""
    done = chunk_inferred(run, chunk)
    if done is not None:
        return done
    cfg = run.config.endpoint
    update: dict[str, Any] = {"logprobs": logprobs_wanted(run)}
    if concurrency is not None:
        update["concurrency"] = concurrency
    cfg = cfg.model_copy(update=update)
    prompts = read_chunk(run, chunk)
    check = context_check(run)
    summary: InferenceSummary  # a BatchSummary in batch mode
    async with RawLog(run.rawlog_url(chunk), **_rolls(run, cfg)) as log:
        if cfg.mode == "batch":
            from specregen.client.batch import run_batch_inference

            summary = await run_batch_inference(prompts, cfg, log, api_key=api_key,
                                                progress=progress, wait=wait,
                                                prompt_check=check)
        else:
            summary = await run_inference(prompts, cfg, log, api_key=api_key, progress=progress,
                                          limiter=limiter, prompt_check=check)
    result = {"chunk": chunk, "prompts": len(prompts), **summary.as_dict()}
    # Done only when nothing is missing: a budget stop leaves the chunk open for the next run,
    # and so do batches still running.
    if summary.stopped_reason is None and not result.get("batches_open"):
        run.store.write_json(result, *infer_parts(run, chunk))
    return result


def context_check(run: DatasetRun) -> ContextCheck | None:
    """The run's context check, as `specregen infer` has it: a prompt whose tokens (the run's
    own format and tokenizer) plus `max_tokens` exceed `endpoint.max_context_tokens`, else the
    tokenizer folder's `model_max_length`, is not sent (a reject: a server would answer 400);
    a conversation's later request that outgrew it stops the conversation with `length`."""
    cfg = run.config.endpoint
    limit = cfg.max_context_tokens or model_max_length(run.config.tokenizer)
    if limit is None:
        return None
    return ContextCheck(run_format(run), limit, cfg, run.config.tokenizer)


def _rolls(run: DatasetRun, cfg: EndpointConfig) -> RollSettings:
    """The chunk's raw log commits once its window of answers waits (see commit_rolls): a lost
    worker's rerun pays again for about two windows at most, not for 10 s of answers."""
    limit = run.config.shared_limit
    window, rates = cfg.concurrency, [cfg.requests_per_minute]
    if limit is not None:
        window = min(window, limit.in_flight or window)
        if limit.requests_per_minute:
            rates.append(limit.requests_per_minute * 60.0 / limit.period_s)
    known = [r for r in rates if r]
    return commit_rolls(window, min(known) if known else None, cfg.log_commit_seconds)
