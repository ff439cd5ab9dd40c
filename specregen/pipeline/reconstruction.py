"""Stage `reconstruct`: each chunk's raw log -> one TokenSample parquet shard. Free work.

Only the final results of the current requests count: a record whose request fingerprint is not
the one the chunk's prompt gives today (another model, other sampling) is ignored, so changing
the endpoint never mixes answers. Runs in worker processes; the tokenizer loads once per process.
The endpoint's provider traits (`run.traits`, from its probe profile) go into reconstruction,
and so into its fingerprint (`DatasetRun.reconstruct_fp`).

A prompt with `turns == "all"` is a whole conversation: its requests are raw-log samples of
their own (`{cid}/t{k}/s{j}`), and it becomes one sample per user turn reached
(specregen/conversation/samples.py), at the prompt's place in the chunk, turns in order. Its
records count when each is what today's endpoint sends for its own messages (the path's walk
then checks the messages), as the driver's resume does.
"""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Iterator
from functools import lru_cache

from specregen.client.request import build_request
from specregen.conversation.plan import plan_conversation
from specregen.conversation.samples import conversation_samples, final_records_by_id
from specregen.models.chat_format import ChatFormat
from specregen.models.registry import get_format
from specregen.models.tokenizer import load_tokenizer
from specregen.pipeline.layout import DatasetRun, chunk_name
from specregen.pipeline.prompts import read_chunk
from specregen.procs import guarded_pool
from specregen.reconstruct import reconstruct_records
from specregen.records import Prompt, TokenSample
from specregen.store.manifest import Shard, StageManifest, read_manifest, write_manifest
from specregen.store.rawlog import RawLog
from specregen.store.token_samples import token_file_meta, write_token_samples
from specregen.wire.request import request_fingerprint

STAGE = "reconstruct"


@lru_cache(maxsize=4)
def chat_format(format_name: str, tokenizer: str) -> ChatFormat:
    """The config's chat format over its tokenizer, loaded once per process."""
    return get_format(format_name, load_tokenizer(tokenizer))


def run_format(run: DatasetRun) -> ChatFormat:
    return chat_format(run.config.format_name, run.config.tokenizer)


def shard_parts(run: DatasetRun, chunk: int, suffix: str) -> tuple[str, ...]:
    return (run.name, STAGE, run.reconstruct_fp, chunk_name(chunk) + suffix)


def reconstruct_chunk(run: DatasetRun, chunk: int) -> tuple[Shard, dict[str, int]]:
    """Write the chunk's shard (unless it exists); returns it and its counts by status."""
    info_parts = shard_parts(run, chunk, ".json")
    if run.store.exists(*info_parts):
        info = run.store.read_json(*info_parts)
        return Shard(**info["shard"]), info["counts"]
    prompts = read_chunk(run, chunk)
    single = [p for p in prompts if p.turns != "all"]
    wanted = {
        p.sample_id: request_fingerprint(build_request(p, run.config.endpoint)) for p in single
    }
    log = RawLog(run.rawlog_url(chunk))
    # Prompt order, not the order answers arrived in: the same inputs give the same bytes.
    order = {sample_id: i for i, sample_id in enumerate(wanted)}
    answers = sorted(
        (
            r
            for r in log.iter_final_samples()
            if isinstance(r.get("request"), dict)
            and wanted.get(r["sample_id"]) == request_fingerprint(r["request"])
        ),
        key=lambda r: order[r["sample_id"]],
    )
    records = ((f"raw log record {r['sample_id']}", r) for r in answers)
    counts: Counter[str] = Counter()
    fmt = run_format(run)
    config = run.dataset.gate_config().reconstruct_config()
    samples = reconstruct_records(records, fmt, traits=run.traits, config=config)
    if len(single) < len(prompts):
        samples = _with_conversations(run, prompts, samples, log, fmt, counts)

    def counted(samples):
        for sample in samples:
            counts[sample.status] += 1
            counts["completion_tokens"] += sample.completion_len
            if sample.reference_match:
                counts[f"reference_{sample.reference_match}"] += 1
            yield sample

    buffer = io.BytesIO()
    rows = write_token_samples(counted(samples), buffer,
                               token_file_meta(fmt, run.config.tokenizer))
    # Failed for good, or never answered (a conversation: without any sample).
    singles_written = rows - counts.get("conversation_samples", 0)
    counts["missing"] = len(single) - singles_written + counts.get("conversations_without_sample",
                                                                   0)
    name = chunk_name(chunk) + ".parquet"
    digest = run.store.write_bytes(buffer.getvalue(), *shard_parts(run, chunk, ".parquet"))
    shard = Shard(path=name, rows=rows, sha256=digest)
    run.store.write_json({"shard": shard.__dict__, "counts": dict(counts)}, *info_parts)
    return shard, dict(counts)


def _with_conversations(
    run: DatasetRun, prompts: list[Prompt], singles: Iterator[TokenSample], log: RawLog,
    fmt: ChatFormat, counts: Counter[str],
) -> Iterator[TokenSample]:
    """Every prompt's samples in prompt order: a single turn's from `singles` (already in
    prompt order), a conversation's built from its requests' final records."""
    endpoint = run.config.endpoint
    cids = {p.sample_id: p for p in prompts if p.turns == "all"}

    def today(record: dict) -> bool:
        # What today's endpoint sends for the record's own messages (the walk checks that
        # those are the path's): an answer to another model or sampling never counts.
        cid = str(record.get("sample_id", "")).rsplit("/", 2)[0]
        prompt = cids.get(cid)
        request = record.get("request")
        if prompt is None or not isinstance(request, dict) or not isinstance(
                request.get("messages"), list):
            return False
        body = build_request(Prompt(record["sample_id"], request["messages"], prompt.tools,
                                    prompt.tool_mode), endpoint)
        return request_fingerprint(body) == request_fingerprint(request)

    finals = final_records_by_id(r for r in log.iter_records()
                                 if r.get("final") and r.get("conversation") is not None
                                 and today(r))
    config = run.dataset.gate_config().reconstruct_config()
    singles = iter(singles)
    pending = next(singles, None)
    for prompt in prompts:
        if prompt.turns != "all":
            if pending is not None and pending.sample_id == prompt.sample_id:
                yield pending
                pending = next(singles, None)
            continue
        built = conversation_samples(plan_conversation(prompt), finals, fmt,
                                     thinking=endpoint.thinking is not False,
                                     config=config, traits=run.traits)
        counts["conversations"] += 1
        counts["conversation_samples"] += len(built)
        counts["conversations_without_sample"] += not built
        yield from built


def finish_reconstruction(
    run: DatasetRun, results: list[tuple[Shard, dict[str, int]]]
) -> StageManifest:
    total: Counter[str] = Counter()
    for _, counts in results:
        total.update(counts)
    manifest = StageManifest(
        dataset=run.name, stage=STAGE, fingerprint=run.reconstruct_fp, counts=dict(total),
        shards=[shard for shard, _ in results],
    )
    write_manifest(run.store, manifest)
    return manifest


def reconstruct_dataset(run: DatasetRun, chunks: int) -> StageManifest:
    """Every chunk in worker processes (guarded as the flow's: they die with this process),
    then the stage manifest (the library path)."""
    done = read_manifest(run.store, run.name, STAGE, run.reconstruct_fp)
    if done is not None:
        return done
    workers = min(run.config.reconstruct_workers, max(1, chunks))
    if workers == 1:
        results = [reconstruct_chunk(run, k) for k in range(chunks)]
    else:
        with guarded_pool(workers) as pool:
            results = list(pool.map(reconstruct_chunk, [run] * chunks, range(chunks)))
    return finish_reconstruction(run, results)
