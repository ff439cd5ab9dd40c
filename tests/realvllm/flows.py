"""specregen's own command line against the real vLLM, through the scripting proxy: `infer`
(single turns or whole conversations), then `reconstruct`, with the server's ids as the truth."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from specregen.cli import app
from specregen.realserver.proxy import ScriptingProxy
from specregen.store.rawlog import RawLog
from specregen.store.token_samples import read_token_samples
from tests.integration.test_conversation_samples import conversations
from tests.support import strip_server_ids

# The families whose tests are written once for all (K3's own are in test_k3_conformance.py).
FAMILIES = ["kimi-k2.5", "qwen3"]


def single_turns(n: int) -> list[dict]:
    """Prompts that call for the tool, and some that do not."""
    weather = conversations(1)[0]["tools"]
    out = []
    for i in range(n):
        question = (f"What is the weather in Lima, day {i}?" if i % 2 == 0
                    else f"Explain an LRU cache in two sentences ({i}).")
        out.append({"sample_id": f"one{i}", "tools": weather,
                    "messages": [{"role": "user", "content": question}]})
    return out


def infer_and_reconstruct(family, tmp_path: Path, prompts: list[dict], *args: str,
                          blind: bool = True, keep_logprobs: bool = False,
                          **knobs) -> tuple[list, dict[str, dict]]:
    """`specregen infer` through the proxy (the emulator's model decides what the real server's
    model writes; `knobs` set it), then `specregen reconstruct` of the raw log -- without the
    server's ids (and logprobs, unless `keep_logprobs`) when `blind`. Returns the samples and
    the final raw-log records by id."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    if "--turns" in args:
        knobs.setdefault("conversations", str(path))
    front = ScriptingProxy.for_server(family.server, family.tok, **knobs)
    running = front.serve()
    raw = tmp_path / "raw"
    try:
        result = CliRunner().invoke(app, [
            "infer", str(path), "--out", str(raw), "--base-url", running.url,
            "--model", family.spec.served_model_name, "--dialect", "vllm",
            "--format", family.name, "--tokenizer", family.tok.source,
            "--return-token-ids", "--concurrency", "4", *args])
    finally:
        running.stop()
    assert result.exit_code == 0, result.output
    truth = {r["sample_id"]: r for r in RawLog(str(raw)).iter_records() if r.get("final")}
    source = raw
    if blind:
        source = strip_server_ids(raw, tmp_path / "blind", keep_logprobs=keep_logprobs)
    tokens = tmp_path / "tokens.parquet"
    result = CliRunner().invoke(app, ["reconstruct", str(source), "--tokenizer",
                                      family.tok.source, "--out", str(tokens),
                                      "--prompts", str(path), "--format", family.name])
    assert result.exit_code == 0, result.output
    return list(read_token_samples(tokens)), truth
