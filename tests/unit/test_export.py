"""The trainer exports: row shape, shard-by-shard files with their sha256, the publish
fingerprint over the export options, and `specregen export` on an older publication."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import fsspec
import pytest
from typer.testing import CliRunner

from specregen.config import parse_config
from specregen.export.rows import ExportContext, RunMeta, messages_row, train_row
from specregen.export.writer import ExportShard, write_exports
from specregen.models.kimi_k25 import KimiK25
from specregen.pipeline.layout import DatasetRun
from specregen.reconstruct import reconstruct
from specregen.store.manifest import StageManifest, write_manifest
from specregen.store.token_samples import token_samples_bytes
from tests.support import get_tokenizer

CTX = ExportContext(dataset="D", format="kimi_k25", tokenizer="mini",
                    tokenizer_fingerprint="abc", model="moonshotai/kimi-k2.5")
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]


@pytest.fixture(scope="module")
def fmt() -> KimiK25:
    return KimiK25(get_tokenizer("mini"))


def answer(reasoning: str, content: str | None, calls=(), finish="stop") -> dict:
    message = {"role": "assistant", "content": content, "reasoning": reasoning}
    if calls:
        message["tool_calls"] = [
            {"id": f"functions.{name}:{i}", "type": "function",
             "function": {"name": name, "arguments": args}}
            for i, (name, args) in enumerate(calls)
        ]
    return {"choices": [{"message": message, "finish_reason": finish}]}


@pytest.fixture(scope="module")
def samples(fmt):
    """Reconstructed samples: a tool call, a plain answer, a truncated one."""
    request = {"model": "m", "messages": [{"role": "user", "content": "Weather in Paris?"}],
               "tools": TOOLS}
    plain = {"model": "m", "messages": [{"role": "user", "content": "Say hi."}]}
    out = [
        reconstruct("tool", request, answer("Need the tool.", None,
                                             [("get_weather", '{"city": "Paris"}')],
                                             "tool_calls"), fmt),
        reconstruct("plain", plain, answer("Greet them.", "Hi!"), fmt),
        reconstruct("cut", plain, answer("Greet them and then say a great deal", "",
                                         finish="length"), fmt),
    ]
    # The status does not matter to the exports (the gate decided what is published).
    assert all(s.input_ids and s.status != "error" for s in out), [s.error for s in out]
    return out


def test_train_rows_keep_ids_and_masks_and_one_metadata_shape(samples, fmt):
    metas = [RunMeta(usage={"prompt_tokens": 9, "completion_tokens": 4,
                            "completion_tokens_details": {"reasoning_tokens": 3}},
                     provider="P", model="x/y"),
             None,
             RunMeta(usage={"prompt_tokens": "9"})]  # a provider's odd type becomes null
    rows = [train_row(s, CTX, fmt.tok.decode(s.input_ids), m)
            for s, m in zip(samples, metas, strict=True)]
    for sample, row in zip(samples, rows, strict=True):
        assert list(row) == ["id", "input_ids", "loss_mask", "text", "metadata"]
        assert row["input_ids"] == sample.input_ids and row["loss_mask"] == sample.loss_mask
        assert row["loss_mask"].index(1) == sample.prompt_len  # unshifted
        json.dumps(row)  # plain JSON values only
    shapes = {tuple(row["metadata"]) for row in rows}
    assert len(shapes) == 1
    assert {tuple(row["metadata"]["usage"]) for row in rows} == {
        ("prompt_tokens", "completion_tokens", "total_tokens", "reasoning_tokens",
         "cached_tokens")}
    for key in rows[0]["metadata"]:
        kinds = {type(row["metadata"][key]).__name__ for row in rows} - {"NoneType"}
        assert len(kinds) <= 1, (key, kinds)
    assert rows[0]["metadata"]["usage"]["reasoning_tokens"] == 3
    assert rows[0]["metadata"]["provider"] == "P" and rows[0]["metadata"]["model"] == "x/y"
    assert rows[1]["metadata"]["model"] == CTX.model  # the configured one when the log is silent
    assert rows[2]["metadata"]["usage"]["prompt_tokens"] is None
    assert rows[2]["metadata"]["finish_reason"] == "length"


def test_a_sample_whose_mask_length_differs_is_refused_by_name(samples):
    from dataclasses import replace

    broken = replace(samples[0], loss_mask=samples[0].loss_mask[:-1])
    with pytest.raises(ValueError, match="'tool'"):
        train_row(broken, CTX, "")


def test_exports_are_written_shard_by_shard_into_one_file_with_its_sha256(samples, fmt,
                                                                         tmp_path):
    shards = [ExportShard(token_samples_bytes(samples[:2]), chunk=0),
              ExportShard(token_samples_bytes(samples[2:]), chunk=3)]
    seen_chunks = []

    def run_meta(shard, ids):
        seen_chunks.append((shard.chunk, ids))
        return {i: RunMeta(provider=f"chunk{shard.chunk}") for i in ids}

    entries = write_exports(fsspec.filesystem("file"), str(tmp_path), iter(shards),
                            ["train", "messages"], context=lambda s: CTX,
                            decode=fmt.tok.decode, run_meta=run_meta)
    assert seen_chunks == [(0, ["tool", "plain"]), (3, ["cut"])]
    assert [(e.path, e.rows) for e in entries] == [("train.jsonl", 3), ("messages.jsonl", 3)]
    for entry in entries:
        data = (tmp_path / entry.path).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry.sha256
    train = [json.loads(line) for line in (tmp_path / "train.jsonl").open()]
    assert [r["id"] for r in train] == ["tool", "plain", "cut"]
    assert [r["metadata"]["provider"] for r in train] == ["chunk0", "chunk0", "chunk3"]
    assert train[1]["text"] == fmt.tok.decode(samples[1].input_ids)
    messages = [json.loads(line) for line in (tmp_path / "messages.jsonl").open()]
    assert messages == [messages_row(s) for s in samples]
    assert messages[0]["conversations"][-1]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert not list(tmp_path.glob("*.tmp-*"))


def test_a_failed_export_leaves_no_file_behind(samples, fmt, tmp_path):
    def shards():
        yield ExportShard(token_samples_bytes(samples[:1]))
        raise OSError("storage went away")

    with pytest.raises(OSError, match="went away"):
        write_exports(fsspec.filesystem("file"), str(tmp_path), shards(), ["train"],
                      context=lambda s: CTX, decode=fmt.tok.decode)
    assert list(tmp_path.iterdir()) == []


def gated_run(tmp_path: Path, samples, **options) -> DatasetRun:
    """A dataset whose gate passed with these samples in chunks 0 and 2 (chunk 1 empty)."""
    config = parse_config({
        "storage": str(tmp_path / "store"), "tokenizer": "mini",
        "endpoint": {"base_url": "http://127.0.0.1:9/v1", "model": "moonshotai/kimi-k2.5"},
        "datasets": [{"name": "D", "adapter": "glaive", "source": "bundled:B1_glaive"}],
        **options,
    })
    run = DatasetRun(config, config.datasets[0])
    shards = []
    for name, part in (("chunk-00000.parquet", samples[:2]), ("chunk-00001.parquet", []),
                       ("chunk-00002.parquet", samples[2:])):
        from specregen.store.manifest import Shard

        data = token_samples_bytes(part)
        digest = run.store.write_bytes(data, "D", "gate", run.gate_fp, "accepted", name)
        shards.append(Shard(path=f"accepted/{name}", rows=len(part), sha256=digest))
    write_manifest(run.store, StageManifest(dataset="D", stage="gate", fingerprint=run.gate_fp,
                                            shards=shards, extra={"passed": True}))
    return run


def test_the_publish_fingerprint_covers_the_export_options(tmp_path, samples):
    from specregen.pipeline.publish import publish_dataset, publish_fp, published
    from specregen.store.manifest import read_manifest

    run = gated_run(tmp_path, samples)
    first = publish_dataset(run, read_manifest(run.store, "D", "gate", run.gate_fp))
    assert [s.path for s in first.shards] == ["data/data-00000.parquet",
                                              "data/data-00001.parquet", "train.jsonl"]
    assert first.extra["chunks"] == [0, 2]
    # The same options: already published. The messages export turned on: published again.
    assert published(run) is not None
    on = gated_run(tmp_path, samples, export_messages=True)
    assert on.gate_fp == run.gate_fp and publish_fp(on) != publish_fp(run)
    assert published(on) is None
    second = publish_dataset(on, read_manifest(on.store, "D", "gate", on.gate_fp))
    assert "messages.jsonl" in [s.path for s in second.shards]
    assert "LOSSY" in second.extra["exports"]["messages.jsonl"]
    assert on.store.read_json("D", "published", "LATEST.json")["fingerprint"] == publish_fp(on)
    assert on.store.exists("D", "published", publish_fp(run), "train.jsonl")  # left alone
    # The former option name still turns the messages export on.
    legacy = gated_run(tmp_path, samples, export_specforge=True)
    assert publish_fp(legacy) == publish_fp(on)


def older_publication(tmp_path: Path, samples) -> Path:
    """A publication as made before the exports: named by the gate's fingerprint, no chunk
    list, only specforge.jsonl; and a raw log for chunk 2 with the answer's usage."""
    from specregen.pipeline.publish import publish_dataset
    from specregen.store.manifest import read_manifest

    run = gated_run(tmp_path, samples, export_train=False)
    manifest = publish_dataset(run, read_manifest(run.store, "D", "gate", run.gate_fp))
    new = Path(run.store.path("D", "published", manifest.fingerprint))
    old = new.parent / run.gate_fp
    new.rename(old)
    raw = json.loads((old / "manifest.json").read_text())
    raw["fingerprint"] = run.gate_fp
    raw["extra"] = {"tokenizer": "mini", "model": "moonshotai/kimi-k2.5"}
    (old / "manifest.json").write_text(json.dumps(raw))
    rawlog = Path(run.store.path("D", "rawlog", "chunk-00002"))
    rawlog.mkdir(parents=True)
    record = {"v": 1, "sample_id": "cut", "fingerprint": "f", "attempt": 1, "status": "truncated",
              "final": True, "provider": "Moonshot AI", "model": "moonshotai/kimi-k2.5",
              "usage": {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16}}
    (rawlog / "part-20260101T000000000000Z-1-abcd.jsonl").write_text(json.dumps(record) + "\n")
    return old


def test_export_command_writes_the_exact_rows_of_an_older_publication(tmp_path, samples):
    from specregen.cli import app

    folder = older_publication(tmp_path, samples)
    out = tmp_path / "train.jsonl"
    result = CliRunner().invoke(app, ["export", str(folder), "--to", "speculators",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "exact" in result.output
    rows = [json.loads(line) for line in out.open()]
    assert [(r["id"], r["input_ids"], r["loss_mask"]) for r in rows] == [
        (s.sample_id, s.input_ids, s.loss_mask) for s in samples]
    usage = {r["id"]: (r["metadata"]["provider"], r["metadata"]["usage"]["total_tokens"])
             for r in rows}
    # Chunk 2's answer came from its raw log, found through the gate manifest.
    assert usage == {"tool": (None, None), "plain": (None, None), "cut": ("Moonshot AI", 16)}


def test_export_command_names_the_messages_export_lossy_and_counts_what_differs(tmp_path,
                                                                               samples):
    from specregen.cli import app

    folder = older_publication(tmp_path, samples)
    out = tmp_path / "messages.jsonl"
    result = CliRunner().invoke(app, ["export", str(folder), "--to", "messages",
                                      "--out", str(out)], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "LOSSY" in result.output
    # K2.5's template keeps the reasoning of a tool-call turn, drops that of a final plain
    # answer (it renders it as history), and always closes the turn, which a truncated answer
    # never did: two of three samples come back with other ids.
    assert "2 of 3 samples re-tokenize" in result.output
    assert "'plain'" in result.output and "'cut'" in result.output
    assert [json.loads(line)["id"] for line in out.open()] == ["tool", "plain", "cut"]


def test_export_command_refuses_a_folder_that_is_not_a_publication(tmp_path):
    from specregen.cli import app

    result = CliRunner().invoke(app, ["export", str(tmp_path), "--to", "speculators"])
    assert result.exit_code == 2
    assert "manifest.json" in result.output



def test_export_command_writes_the_publications_own_train_jsonl_metadata_included(tmp_path,
                                                                                samples):
    """`specregen export --to speculators` of a publication made WITH its train.jsonl writes
    the same file byte for byte: the same metadata, tokenizer_fingerprint included."""
    from specregen.cli import app
    from specregen.pipeline.publish import publish_dataset
    from specregen.store.manifest import read_manifest

    run = gated_run(tmp_path, samples)
    manifest = publish_dataset(run, read_manifest(run.store, "D", "gate", run.gate_fp))
    folder = Path(run.store.path("D", "published", manifest.fingerprint))
    out = tmp_path / "exported.jsonl"
    result = CliRunner().invoke(app, ["export", str(folder), "--to", "speculators",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    published_rows = [json.loads(line) for line in (folder / "train.jsonl").open()]
    exported_rows = [json.loads(line) for line in out.open()]
    assert {r["metadata"]["tokenizer_fingerprint"] for r in exported_rows} == {
        r["metadata"]["tokenizer_fingerprint"] for r in published_rows} != {None}
    assert out.read_bytes() == (folder / "train.jsonl").read_bytes()
