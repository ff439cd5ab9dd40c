"""Gate cost against reconstruction cost, in one process and one run.

    python bench/gate.py [--samples 2000] [--tokenizer DIR|mini] [--repeat 3]

Builds realistic samples with `bench/reconstruct.py`'s `make_samples` (system + user prompt,
tools on a third of them, reasoning of a few hundred to a few thousand tokens, answers with code,
tool calls), gives each response the `usage` a faithful provider would report, reconstructs them
with `specregen.reconstruct.reconstruct`, then runs `specregen.gate.run_gate` over the result.
Prints the time per 1,000 samples of both and the ratio gate / reconstruction (target: <= 0.5).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specregen.gate import GateConfig, run_gate
from specregen.models.kimi_k25 import KimiK25
from specregen.models.tokenizer import load_tokenizer
from specregen.reconstruct import reconstruct


def _bench_reconstruct():
    # Imported by path: the module's name, "reconstruct", would shadow nothing but reads badly.
    path = Path(__file__).resolve().with_name("reconstruct.py")
    spec = importlib.util.spec_from_file_location("bench_reconstruct", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def with_exact_usage(samples: list[tuple[dict, dict]], fmt: KimiK25) -> list[tuple[dict, dict]]:
    """The same requests and responses, with `usage` equal to our counts (as a faithful
    provider reports), so the usage checks of reconstruction and gate do real work."""
    out = []
    for i, (request, response) in enumerate(samples):
        built = reconstruct(f"u{i}", request, response, fmt)
        usage = {"prompt_tokens": built.prompt_len, "completion_tokens": built.completion_len,
                 "completion_tokens_details": {"reasoning_tokens": 1}}
        out.append((request, {**response, "usage": usage}))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tokenizer", default=os.environ.get("KIMI_TOKENIZER_DIR") or "mini")
    args = parser.parse_args()

    tok = load_tokenizer(args.tokenizer)
    fmt = KimiK25(tok)
    samples = with_exact_usage(_bench_reconstruct().make_samples(args.samples), fmt)
    config = GateConfig()

    best_reconstruct = best_gate = float("inf")
    for _ in range(args.repeat):
        start = time.perf_counter()
        built = [reconstruct(f"s{i}", req, resp, fmt) for i, (req, resp) in enumerate(samples)]
        best_reconstruct = min(best_reconstruct, time.perf_counter() - start)
        start = time.perf_counter()
        report = run_gate(built, fmt, config, dataset="bench")
        best_gate = min(best_gate, time.perf_counter() - start)

    per_k = 1000 / len(samples)
    completion_tokens = sum(s.completion_len for s in built)
    print(f"tokenizer: {tok.name} ({tok.base_vocab_size} ranks)")
    print(f"samples: {len(samples)}  completion tokens: {completion_tokens}  "
          f"with tool calls: {report.totals['samples_with_calls']}")
    print(f"gate verdict: {report.verdict}  accepted {report.totals['accepted']}  "
          f"quarantined {report.totals['quarantined']}  "
          f"failing checks: {({c: k for c, k in report.by_check.items() if k}) or 'none'}")
    print(f"reconstruct: {best_reconstruct * per_k * 1000:.1f} ms per 1,000 samples")
    print(f"gate:        {best_gate * per_k * 1000:.1f} ms per 1,000 samples")
    print(f"ratio (gate / reconstruct): {best_gate / best_reconstruct:.3f}  (target <= 0.5)")


if __name__ == "__main__":
    main()
