"""Storage roots, atomic writes, stage manifests, token-sample parquet."""

from __future__ import annotations

import hashlib

import pytest

from specregen.records import TokenSample, ToolCall
from specregen.store.fs import Store
from specregen.store.manifest import (
    Shard,
    StageManifest,
    fingerprint,
    read_manifest,
    write_manifest,
)
from specregen.store.token_samples import read_token_samples, write_token_samples


@pytest.fixture(params=["local", "memory"])
def store(request, tmp_path):
    if request.param == "local":
        return Store(str(tmp_path / "root"))
    return Store(f"memory://specregen-test-{tmp_path.name}")


def test_atomic_write_and_read(store):
    digest = store.write_bytes(b"hello", "ds", "stage", "f.bin")
    assert digest == hashlib.sha256(b"hello").hexdigest()
    assert store.read_bytes("ds", "stage", "f.bin") == b"hello"
    assert store.list("ds", "stage") == ["f.bin"]  # no temporary file left behind
    assert store.list("nothing", "here") == []
    store.write_json({"b": 1, "a": [1, 2]}, "x.json")
    assert store.read_json("x.json") == {"a": [1, 2], "b": 1}


def test_manifest_round_trip_marks_the_stage_done(store):
    assert read_manifest(store, "B1", "reconstruct", "abc") is None
    manifest = StageManifest(
        dataset="B1", stage="reconstruct", fingerprint="abc", counts={"ok": 3},
        shards=[Shard("shard-00000.parquet", 3, "00ff")],
    )
    write_manifest(store, manifest)
    back = read_manifest(store, "B1", "reconstruct", "abc")
    assert back == manifest and back.finished_at
    assert read_manifest(store, "B1", "reconstruct", "other") is None


def test_fingerprint_is_stable_and_order_free():
    assert fingerprint({"a": 1, "b": [1, 2]}) == fingerprint({"b": [1, 2], "a": 1})
    assert fingerprint({"a": 1}) != fingerprint({"a": 2})
    assert len(fingerprint("x")) == 16


def test_token_samples_parquet_round_trip(tmp_path):
    sample = TokenSample(
        sample_id="s1", input_ids=[1, 2, 3], loss_mask=[0, 1, 1], prompt_len=1, completion_len=2,
        status="flagged", flags=["tool_id_rewritten"], usage_prompt_delta=0,
        usage_completion_delta=-1, reference_match="benign_bpe", reasoning="r", content=None,
        tool_calls=[ToolCall("functions.f:0", "f", '{"a": "日本"}')],
        api_tool_calls=[ToolCall("call_1", "f", '{"a": "日本"}')], finish_reason="tool_calls",
        messages=[{"role": "user", "content": "hi"}], tools=[{"type": "function"}],
    )
    failed = TokenSample.failed("line:3", "line 3 is not JSON")
    path = tmp_path / "t.parquet"
    assert write_token_samples([sample, failed], path) == 2
    assert list(read_token_samples(path)) == [sample, failed]
    assert write_token_samples([], tmp_path / "empty.parquet") == 0
    assert list(read_token_samples(tmp_path / "empty.parquet")) == []
