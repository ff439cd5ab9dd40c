"""Peak memory of publishing with the trainer exports on, as the dataset grows.

    python bench/publish.py [--small 10000] [--large 100000] [--tokens 600] [--keep DIR]

For each size, a child process lays out a dataset whose gate passed: accepted shards of 1,000
samples (`--tokens` ids each, a third of them prompt), the prompts chunks and a raw log per
chunk with each sample's final answer (usage, provider), exactly where the pipeline puts them.
Then a fresh child process publishes it with `train.jsonl` and `messages.jsonl` on (the
library's `publish_dataset`, the stage the Prefect task runs) and reports its own peak RSS
(ru_maxrss). The ratio large/small is printed (target <= 1.3: memory does not grow with the
dataset). The run checks that every sample reached train.jsonl with its raw-log usage.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DATASET = "bench_publish"
CHUNK_SIZE = 1000
RESULT_TAG = "BENCH-RESULT "


def config_dict(storage: Path) -> dict:
    return {
        "storage": str(storage), "tokenizer": "mini", "chunk_size": CHUNK_SIZE,
        "endpoint": {"base_url": "http://127.0.0.1:9/api/v1", "model": "moonshotai/kimi-k2.5"},
        "export_train": True, "export_messages": True,
        "datasets": [{"name": DATASET, "adapter": "glaive", "source": "bundled:B1_glaive"}],
    }


def lay_out(storage: Path, samples: int, tokens: int) -> None:
    """The stages before publish, as files: prompts chunks, raw logs, accepted shards, gate."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from specregen.client.request import build_request
    from specregen.config import parse_config
    from specregen.pipeline.layout import DatasetRun, chunk_name
    from specregen.pipeline.prompts import prompt_to_json
    from specregen.records import Prompt
    from specregen.store.manifest import Shard, StageManifest, write_manifest
    from specregen.store.token_samples import SCHEMA
    from specregen.wire.request import request_fingerprint

    config = parse_config(config_dict(storage))
    run = DatasetRun(config, config.datasets[0])
    rng = np.random.default_rng(0)
    prompt_len = tokens // 3
    shards = []
    for chunk in range((samples + CHUNK_SIZE - 1) // CHUNK_SIZE):
        n = min(CHUNK_SIZE, samples - chunk * CHUNK_SIZE)
        ids = [f"s{chunk:05d}-{i:04d}" for i in range(n)]
        prompts = [Prompt(sample_id=i, messages=[{"role": "user", "content": f"question {i}"}])
                   for i in ids]
        run.store.write_bytes("".join(prompt_to_json(p) + "\n" for p in prompts).encode(),
                              DATASET, "prompts", run.prompts_fp, chunk_name(chunk) + ".jsonl")
        log_lines = []
        for p in prompts:
            fp = request_fingerprint(build_request(p, config.endpoint))
            log_lines.append(json.dumps({
                "v": 1, "sample_id": p.sample_id, "fingerprint": fp, "attempt": 1,
                "status": "ok", "final": True, "provider": "Moonshot AI",
                "model": "moonshotai/kimi-k2.5",
                "usage": {"prompt_tokens": prompt_len, "completion_tokens": tokens - prompt_len,
                          "total_tokens": tokens}}))
        run.store.write_bytes(("\n".join(log_lines) + "\n").encode(), DATASET, "rawlog",
                              chunk_name(chunk), "part-20260101T000000000000Z-1-bench.jsonl")
        # Ids inside the mini tokenizer's ranks, so the review text decodes.
        flat = rng.integers(0, 4096, size=n * tokens, dtype=np.int32)
        mask = np.tile(np.r_[np.zeros(prompt_len, np.int8), np.ones(tokens - prompt_len,
                                                                    np.int8)], n)
        offsets = pa.array(np.arange(0, (n + 1) * tokens, tokens, dtype=np.int32))
        messages = json.dumps([{"role": "user", "content": "question"}])
        columns = {
            "sample_id": pa.array(ids),
            "input_ids": pa.ListArray.from_arrays(offsets, pa.array(flat)),
            "loss_mask": pa.ListArray.from_arrays(offsets, pa.array(mask)),
            "prompt_len": pa.array([prompt_len] * n, pa.int32()),
            "completion_len": pa.array([tokens - prompt_len] * n, pa.int32()),
            "status": pa.array(["ok"] * n),
            "flags": pa.array([[]] * n, pa.list_(pa.string())),
            "finish_reason": pa.array(["stop"] * n),
            "thinking": pa.array([True] * n),
            "reasoning": pa.array(["thinking about it " * 20] * n),
            "content": pa.array(["the answer " * 40] * n),
            "tool_calls": pa.array(["[]"] * n),
            "api_tool_calls": pa.array(["[]"] * n),
            "messages": pa.array([messages] * n),
            "tool_mode": pa.array(["tools"] * n),
        }
        table = pa.table({f.name: columns.get(f.name, pa.nulls(n, f.type)) for f in SCHEMA},
                         schema=SCHEMA)
        name = f"accepted/{chunk_name(chunk)}.parquet"
        folder = Path(run.store.path(DATASET, "gate", run.gate_fp, "accepted"))
        folder.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, folder / f"{chunk_name(chunk)}.parquet", row_group_size=2000)
        data = (folder / f"{chunk_name(chunk)}.parquet").read_bytes()
        import hashlib

        shards.append(Shard(path=name, rows=n, sha256=hashlib.sha256(data).hexdigest()))
    write_manifest(run.store, StageManifest(dataset=DATASET, stage="gate",
                                            fingerprint=run.gate_fp, shards=shards,
                                            extra={"passed": True}))


def publish(storage: Path) -> dict:
    from specregen.config import parse_config
    from specregen.pipeline.layout import DatasetRun
    from specregen.pipeline.publish import publish_dataset
    from specregen.store.manifest import read_manifest

    config = parse_config(config_dict(storage))
    run = DatasetRun(config, config.datasets[0])
    started = time.monotonic()
    manifest = publish_dataset(run, read_manifest(run.store, DATASET, "gate", run.gate_fp))
    seconds = time.monotonic() - started
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    folder = Path(run.store.path(DATASET, "published", manifest.fingerprint))
    rows = with_usage = 0
    with (folder / "train.jsonl").open() as handle:
        for line in handle:
            rows += 1
            with_usage += json.loads(line)["metadata"]["usage"]["total_tokens"] is not None
    return {"samples": manifest.counts["samples"], "train_rows": rows, "with_usage": with_usage,
            "seconds": round(seconds, 1), "peak_rss_mb": round(peak_mb, 1),
            "train_mb": round((folder / "train.jsonl").stat().st_size / 2**20, 1)}


def child(role: str, storage: Path, samples: int, tokens: int) -> dict | None:
    command = [sys.executable, __file__, "--child", role, "--storage", str(storage),
               "--samples", str(samples), "--tokens", str(tokens)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        sys.exit(f"{role} of {samples} samples failed:\n{done.stderr[-3000:]}")
    for line in done.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--large", type=int, default=100_000)
    parser.add_argument("--tokens", type=int, default=600)
    parser.add_argument("--keep", type=Path, help="lay the runs out here and keep them")
    parser.add_argument("--child", choices=("layout", "publish"), help=argparse.SUPPRESS)
    parser.add_argument("--storage", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--samples", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "layout":
        lay_out(args.storage, args.samples, args.tokens)
        return
    if args.child == "publish":
        print(RESULT_TAG + json.dumps(publish(args.storage)))
        return

    base = args.keep or Path(tempfile.mkdtemp(prefix="bench-publish-"))
    results = {}
    try:
        for samples in (args.small, args.large):
            storage = base / f"n{samples}"
            shutil.rmtree(storage, ignore_errors=True)
            started = time.monotonic()
            child("layout", storage, samples, args.tokens)
            laid = time.monotonic() - started
            result = child("publish", storage, samples, args.tokens)
            assert result is not None
            if not result["samples"] == result["train_rows"] == result["with_usage"] == samples:
                sys.exit(f"{samples} samples: not every one reached train.jsonl with its "
                         f"raw-log usage: {result}")
            results[samples] = result
            print(f"{samples:>7} samples x {args.tokens} tokens: publish {result['seconds']} s, "
                  f"peak RSS {result['peak_rss_mb']} MB, train.jsonl {result['train_mb']} MB "
                  f"(layout {laid:.0f} s)", flush=True)
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)
    ratio = results[args.large]["peak_rss_mb"] / results[args.small]["peak_rss_mb"]
    verdict = "OK" if ratio <= 1.3 else "ABOVE TARGET"
    print(f"peak RSS ratio {args.large}/{args.small}: {ratio:.3f} (target <= 1.3) {verdict}")


if __name__ == "__main__":
    main()
