"""The trainer exports of Kimi K3 samples: train.jsonl rows carry the exact ids and name the
kimi-k3 format (from the token file's metadata, or the run's format), and the messages check
re-tokenizes through K3's own encoder the way its tokenizer's `apply_chat_template` does (ids,
segment by segment; K3 has no Jinja template)."""

from __future__ import annotations

import json
from pathlib import Path

import fsspec
import pytest

from specregen.config import parse_config
from specregen.export.check import check_messages, retokenize
from specregen.export.context import context_from_metadata
from specregen.export.rows import ExportContext, messages_row, train_row
from specregen.export.writer import ExportShard, parquet_metadata, write_exports
from specregen.models.kimi_k3 import KimiK3
from specregen.models.kimi_k3 import servers as sv
from specregen.models.kimi_k3.format import completion_segments
from specregen.models.tokenizer import load_tokenizer
from specregen.pipeline.layout import DatasetRun
from specregen.reconstruct import reconstruct
from specregen.store.manifest import Shard, StageManifest, read_manifest, write_manifest
from specregen.store.token_samples import token_file_meta, token_samples_bytes

MODEL = "moonshotai/kimi-k3"
# With every field vLLM's dump writes (a missing description would be rendered as null by the
# server, and not by a trainer's tokenizer: another id sequence).
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather.",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string"}}}}}]

def _stopped(fmt, segments) -> list[int]:
    """The ids of a completion's segments, with the stop id."""
    return [*fmt.encode_segments(segments), fmt.stop_id]



@pytest.fixture(scope="module")
def fmt() -> KimiK3:
    return KimiK3(load_tokenizer("mini-k3"))


def _sample(fmt: KimiK3, sample_id: str, request: dict, reasoning: str, content: str,
            calls: list, max_tokens: int | None = None):
    ids = _stopped(fmt, completion_segments(reasoning, content, calls, thinking=True))
    cut = ids[:max_tokens] if max_tokens else ids
    prompt = sv.encode_prompt(request, fmt.tok)
    parsed = sv.parse(sv.decode_output(cut, fmt.tok, len(cut) < len(ids)), request)
    message = {"role": "assistant", "content": parsed.content, "reasoning": parsed.reasoning}
    if parsed.calls:
        message["tool_calls"] = [{"id": f"chatcmpl-tool-{k:016x}", "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}}
                                 for k, c in enumerate(parsed.calls)]
    body = {"choices": [{"message": message, "finish_reason": parsed.finish_reason}],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(cut)}}
    return reconstruct(sample_id, request, body, fmt), prompt + cut


@pytest.fixture(scope="module")
def samples(fmt: KimiK3):
    tool = {"model": MODEL, "messages": [{"role": "user", "content": "Weather in Oslo?"}],
            "tools": TOOLS}
    plain = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}]}
    out = [
        _sample(fmt, "tool", tool, "Need the tool.", "", [("get_weather", {"city": "Oslo"})]),
        _sample(fmt, "plain", plain, "Greet them.", "Hi!", []),
        _sample(fmt, "cut", plain, "Greet them and then say a great deal more", "", [],
                max_tokens=4),
    ]
    for sample, truth in out:
        assert sample.input_ids == truth, sample.flags
    return [s for s, _ in out]


def test_train_rows_keep_the_ids_and_name_the_format(fmt: KimiK3, samples) -> None:
    data = token_samples_bytes(samples, meta=token_file_meta(fmt))
    fallback = ExportContext(dataset="D", format="kimi_k25", tokenizer="mini-k3",
                             tokenizer_fingerprint=None, model=MODEL)
    ctx = context_from_metadata(parquet_metadata(data), fallback)
    assert ctx.format == "kimi-k3"  # read off the token file, not the legacy fallback
    for sample in samples:
        row = train_row(sample, ctx, fmt.tok.decode(sample.input_ids))
        assert row["input_ids"] == sample.input_ids and len(row["loss_mask"]) == len(
            row["input_ids"])
        assert row["metadata"]["format"] == "kimi-k3"
        assert sum(row["loss_mask"]) == sample.completion_len


def test_the_messages_check_retokenizes_through_the_encoder(fmt: KimiK3, samples) -> None:
    """The whole conversation rendered by K3's encoder (no generation prompt) is the published
    prompt and completion for a whole answer; a cut answer never closed its turn."""
    rows = {s.sample_id: messages_row(s) for s in samples}
    for sample_id in ("tool", "plain"):
        ids = retokenize(rows[sample_id], fmt, fmt.template_text())
        sample = next(s for s in samples if s.sample_id == sample_id)
        assert ids == sample.input_ids, sample_id
    report = check_messages(samples, fmt, fmt.template_text(), "specregen's kimi-k3 template")
    assert (report.samples, report.differ) == (3, 1)
    assert report.examples[0]["id"] == "cut"
    # The text view of the same rendering (markers as their strings).
    text = fmt.trainer_render(rows["plain"]["conversations"], None, thinking=True,
                              template=fmt.template_text())
    assert text.endswith("<|open|>think<|sep|>Greet them.<|close|>think<|sep|><|open|>response"
                         "<|sep|>Hi!<|close|>response<|sep|><|close|>message<|sep|>"
                         "<|end_of_msg|>")


def test_a_k3_publication_exports_kimi_k3_rows(fmt: KimiK3, samples, tmp_path: Path) -> None:
    from specregen.pipeline.publish import publish_dataset

    config = parse_config({
        "storage": str(tmp_path / "store"), "tokenizer": "mini-k3",
        "endpoint": {"base_url": "http://127.0.0.1:9/v1", "model": MODEL},
        "datasets": [{"name": "D", "adapter": "glaive", "source": "bundled:B1_glaive"}],
        "export_messages": True,
    })
    run = DatasetRun(config, config.datasets[0])
    data = token_samples_bytes(samples)  # an older shard: no metadata, the run's format
    digest = run.store.write_bytes(data, "D", "gate", run.gate_fp, "accepted",
                                   "chunk-00000.parquet")
    write_manifest(run.store, StageManifest(
        dataset="D", stage="gate", fingerprint=run.gate_fp, extra={"passed": True},
        shards=[Shard(path="accepted/chunk-00000.parquet", rows=len(samples), sha256=digest)]))
    manifest = publish_dataset(run, read_manifest(run.store, "D", "gate", run.gate_fp))
    folder = Path(run.store.path("D", "published", manifest.fingerprint))
    rows = [json.loads(line) for line in (folder / "train.jsonl").open()]
    assert [(r["id"], r["input_ids"]) for r in rows] == [(s.sample_id, s.input_ids)
                                                        for s in samples]
    assert {r["metadata"]["format"] for r in rows} == {"kimi-k3"}
    assert manifest.extra["format"] == "kimi-k3"
    messages = [json.loads(line) for line in (folder / "messages.jsonl").open()]
    assert [m["id"] for m in messages] == ["tool", "plain", "cut"]


def test_write_exports_for_k3_shards(fmt: KimiK3, samples, tmp_path: Path) -> None:
    data = token_samples_bytes(samples, meta=token_file_meta(fmt, "mini-k3"))
    fallback = ExportContext(dataset="D", format=None, tokenizer="mini-k3",
                             tokenizer_fingerprint=None, model=MODEL)
    [entry] = write_exports(fsspec.filesystem("file"), str(tmp_path),
                            iter([ExportShard(parquet=data, chunk=0)]), ["train"],
                            context=lambda s: context_from_metadata(parquet_metadata(s.parquet),
                                                                    fallback),
                            decode=fmt.tok.decode)
    rows = [json.loads(line) for line in (tmp_path / entry.path).read_text().splitlines()]
    assert [r["metadata"]["format"] for r in rows] == ["kimi-k3"] * 3
