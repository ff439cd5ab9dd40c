"""Qwen3 reconstruction throughput against raw `tokenizers` encoding, in one process and run.

    python bench/reconstruct_qwen3.py [--samples 2000] [--tokenizer DIR] [--repeat 3]

Builds realistic samples (system + user prompt, tools on a third of them, reasoning of a few
hundred to a few thousand tokens, an answer with code, tool calls) shaped like what vLLM's
qwen3 + hermes parsers return, then times the Qwen3 format's reconstruction of each (prompt
rendering and encoding, completion assembly from the API fields) and raw
`tokenizers.Tokenizer.encode` over the same texts (the rendered prompt, reasoning, content and
call blocks). Prints completion tokens per second for both and the ratio. Default tokenizer:
the bundled mini Qwen3 tokenizer.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from tokenizers import Tokenizer as RawTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specregen.models import textgen
from specregen.models.qwen3 import MINI_QWEN3_TOKENIZER_DIR, Qwen3, tool_call_text
from specregen.models.tokenizer import load_tokenizer
from specregen.records import ToolCall

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather for a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "description": "Forecast days"}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search_web", "description": "Search the web.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"}, "limit": {"type": "integer"}},
            "required": ["query"]}}},
]


def make_samples(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    samples = []
    for _ in range(n):
        with_tools = rng.random() < 0.33
        messages = [{"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": textgen.prose(rng, rng.randint(30, 300))}]
        reasoning = "\n" + textgen.prose(rng, int(rng.lognormvariate(6.3, 0.7))) + "\n"
        calls: list[ToolCall] = []
        content: str | None
        if with_tools and rng.random() < 0.7:
            content = None
            for tool in rng.sample(TOOLS, rng.randint(1, 2)):
                fn = tool["function"]
                args = json.loads(textgen.arguments(rng, fn["parameters"]))
                calls.append(ToolCall(f"chatcmpl-tool-{rng.getrandbits(128):032x}",
                                      fn["name"], json.dumps(args, ensure_ascii=False)))
        else:
            content = "\n\n" + textgen.answer(rng, int(rng.lognormvariate(5.8, 0.6)))
        samples.append({"messages": messages, "tools": TOOLS if with_tools else None,
                        "reasoning": reasoning, "content": content, "calls": calls})
    return samples


def texts_of(fmt: Qwen3, sample: dict) -> list[str]:
    out = [fmt.render_prompt(sample["messages"], sample["tools"]), sample["reasoning"],
           sample["content"] or ""]
    out += [tool_call_text(c.name, c.arguments) for c in sample["calls"]]
    return out


def reconstruct(fmt: Qwen3, sample: dict) -> tuple[int, int]:
    prompt = fmt.encode_prompt(sample["messages"], sample["tools"])
    done = fmt.assemble(sample["reasoning"], sample["content"], sample["calls"], thinking=True,
                        truncated=False)
    return len(prompt), len(done.ids)


def as_record(sample: dict) -> tuple[dict, dict]:
    """The sample as the request and vLLM response body the generic `reconstruct` reads."""
    request = {"model": "Qwen/Qwen3-8B", "messages": sample["messages"]}
    if sample["tools"]:
        request["tools"] = sample["tools"]
    message: dict = {"role": "assistant", "content": sample["content"] or None,
                     "reasoning": sample["reasoning"]}
    if sample["calls"]:
        message["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}}
                                 for c in sample["calls"]]
    finish = "tool_calls" if sample["calls"] else "stop"
    return request, {"choices": [{"index": 0, "message": message, "finish_reason": finish}]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tokenizer", default=str(MINI_QWEN3_TOKENIZER_DIR))
    args = parser.parse_args()

    tok = load_tokenizer(args.tokenizer)
    fmt = Qwen3(tok)
    raw = RawTokenizer.from_file(str(Path(args.tokenizer) / "tokenizer.json"))
    samples = make_samples(args.samples)
    all_texts = [texts_of(fmt, s) for s in samples]

    best_ours = best_raw = float("inf")
    prompt_tokens = completion_tokens = 0
    for _ in range(args.repeat):
        start = time.perf_counter()
        lens = [reconstruct(fmt, s) for s in samples]
        best_ours = min(best_ours, time.perf_counter() - start)
        prompt_tokens = sum(p for p, _ in lens)
        completion_tokens = sum(c for _, c in lens)
        start = time.perf_counter()
        for texts in all_texts:
            for text in texts:
                raw.encode(text, add_special_tokens=False)
        best_raw = min(best_raw, time.perf_counter() - start)

    # The whole path a run takes: `specregen.reconstruct.reconstruct` through the ChatFormat
    # protocol (response reading, readings, prompt variants, checks).
    from specregen.reconstruct import reconstruct as full_reconstruct

    records = [as_record(s) for s in samples]
    best_full = float("inf")
    for _ in range(args.repeat):
        start = time.perf_counter()
        for k, (request, response) in enumerate(records):
            full_reconstruct(f"s{k}", request, response, fmt)
        best_full = min(best_full, time.perf_counter() - start)

    ours_tps = completion_tokens / best_ours
    raw_tps = completion_tokens / best_raw
    print(f"tokenizer: {tok.name} ({len(tok.added_tokens)} added tokens)")
    print(f"samples: {len(samples)}  prompt tokens: {prompt_tokens}  "
          f"completion tokens: {completion_tokens}")
    print(f"specregen Qwen3 reconstruction: {best_ours:.3f} s  {ours_tps:,.0f} completion tokens/s")
    print(f"raw tokenizers encode (same texts): {best_raw:.3f} s  {raw_tps:,.0f} tokens/s")
    print(f"ratio (reconstruction / raw tokenizers): {ours_tps / raw_tps:.2f}x")
    full_tps = completion_tokens / best_full
    print(f"specregen reconstruct() (whole path): {best_full:.3f} s  {full_tps:,.0f} completion "
          f"tokens/s; ratio to raw tokenizers {full_tps / raw_tps:.2f}x")


if __name__ == "__main__":
    main()
