"""Fidelity of a family's reconstruction against its restated server parsers, on answer shapes.

    python bench/fidelity_corpus.py [--format qwen3] [--requests 200] [--seed 0]
                                    [--tokenizer TOKENIZER]

Each random answer of the family's corpus (`models/<family>/corpus.py`, found by the family's
name: the template's or the encoder's layout and the ways a sampled model leaves it, as true
ids, maybe cut by `max_tokens`) is served by the corpus' emulator profiles (Qwen3:
`vllm-hermes`, `openrouter` -- the earlier vLLM behind the router -- and `sglang`; Kimi K3:
`vllm-k3` and `openrouter`), plain and streamed, through the harness
(`specregen/emulator/fidelity.py`), and rebuilt by `specregen.reconstruct.reconstruct`:

* `blind`: no server ids, no provider traits (as from OpenRouter);
* `traits`: with the traits a probe learns of the profile (the corpus' `probed_traits`);
* `reference`: with the server's own completion ids.

Prints a table per pass (ok / ok_resplit / wrong_ok / flagged_right / false_alarm / error),
then per group and shape, the flags on false alarms and the first wrong-ok cases. Exits 1 when
an answer of a gated group (the corpus' `gated_groups`) is `ok` with wrong ids in any pass.
bench/fidelity.py prints K2.5's corpus its own way (the evidence split).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from typing import Any

from specregen.emulator.fidelity import Tally, cases, measure, table
from specregen.models.registry import bundled_tokenizer, fidelity_corpus, get_format
from specregen.models.tokenizer import load_tokenizer
from specregen.records import TokenSample


def describe(case: Any, sample: TokenSample, where: str, tok) -> str:
    truth = tok.decode(list(case.truth[len(case.body["prompt_token_ids"]):]))
    ours = tok.decode(list(sample.input_ids[sample.prompt_len:]))
    msg = case.body["choices"][0]["message"]
    fields = {k: msg.get(k) for k in ("reasoning", "reasoning_content", "content")
              if msg.get(k) is not None}
    calls = [(c["function"]["name"], c["function"]["arguments"])
             for c in msg.get("tool_calls") or ()]
    return (f"{case.sample_id} shape={case.shape} diff={where} flags={sample.flags}\n"
            f"      fields={fields!r} calls={calls!r} "
            f"finish={case.body['choices'][0]['finish_reason']}\n"
            f"      truth={truth!r}\n      ours ={ours!r}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--format", default="qwen3", help="the family (qwen3, kimi-k3)")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokenizer", help="default: the family's bundled one")
    parser.add_argument("--modes", default="plain,stream")
    parser.add_argument("--passes", default="blind,traits,reference")
    parser.add_argument("--shapes", default="", help="only these shapes (comma-separated)")
    parser.add_argument("--show", type=int, default=3, help="wrong-ok cases shown per table row")
    args = parser.parse_args()

    corpus = fidelity_corpus(args.format)
    if corpus is None:
        parser.error(f"format {args.format!r} has no answer-shape corpus")
    tok = load_tokenizer(args.tokenizer or bundled_tokenizer(args.format))
    fmt = get_format(args.format, tok)
    streams = tuple(m == "stream" for m in args.modes.split(","))
    shapes = [s for s in args.shapes.split(",") if s] or None
    for s in shapes or ():
        if s not in corpus.shapes:
            parser.error(f"unknown shape {s!r}; known: {', '.join(corpus.shapes)}")
    started = time.perf_counter()
    drawn = list(cases(args.format, tok, args.requests, args.seed, streams=streams,
                       shapes=shapes))
    built = time.perf_counter() - started
    print(f"{len(drawn)} cases from {args.requests} answers in {built:.1f}s "
          f"(shapes {dict(Counter(c.shape for c in drawn))}; tokenizer {tok.name})")
    gated_wrong = 0
    for how in args.passes.split(","):
        started = time.perf_counter()
        tallies: dict[tuple[str, bool], Tally] = {}
        errors: Counter[str] = Counter()
        for case in drawn:
            sample, outcome, where = measure(corpus, case, fmt, how)  # type: ignore[arg-type]
            if outcome == "error":
                errors[where] += 1
            tallies.setdefault((case.profile, case.stream), Tally()).add(case, sample, outcome,
                                                                          where)
        print(f"\n== {how} ({time.perf_counter() - started:.1f}s)")
        print(table(tallies))
        total: Counter[str] = Counter()
        by_shape: dict[str, Counter[str]] = {}
        by_group: dict[str, Counter[str]] = {}
        flags: Counter[str] = Counter()
        for (profile, stream), tally in tallies.items():
            total.update(tally.outcomes)
            flags.update(tally.flags)
            for shape, counter in tally.by_shape.items():
                by_shape.setdefault(shape, Counter()).update(counter)
                by_group.setdefault(corpus.group(shape, profile, stream),
                                    Counter()).update(counter)
        n = sum(total.values())
        right = total["ok"] + total["ok_resplit"] + total["false_alarm"]
        print(f"all: wrong_ok {total['wrong_ok']}/{n}, false alarms {total['false_alarm']}/"
              f"{right} of the samples with right ids "
              f"({100 * total['false_alarm'] / max(1, right):.1f}%), errors {total['error']}")
        for name in ("headline", "adversarial", "erased"):
            counter = by_group.get(name, Counter())
            right = counter["ok"] + counter["ok_resplit"] + counter["false_alarm"]
            print(f"{name}: wrong_ok {counter['wrong_ok']}/{sum(counter.values())}, "
                  f"false alarms {counter['false_alarm']}/{right}")
            if name in corpus.gated_groups:
                gated_wrong += counter["wrong_ok"]
        for shape, c in sorted(by_shape.items()):
            right = c["ok"] + c["ok_resplit"] + c["false_alarm"]
            print(f"  shape {shape:<16} n={sum(c.values()):>5} wrong_ok={c['wrong_ok']:>3} "
                  f"false_alarm={c['false_alarm']}/{right} "
                  f"flagged_right={c['flagged_right']} error={c['error']}")
        if flags:
            print(f"  flags on false alarms: {dict(flags.most_common(10))}")
        for (profile, stream), tally in sorted(tallies.items()):
            for case, sample, where in tally.wrong[:args.show]:
                print(f"  wrong_ok {profile} {'stream' if stream else 'plain'}: "
                      + describe(case, sample, where, tok))
        for error, count in errors.most_common(3):
            print(f"  error x{count}: {error}")
    return 1 if gated_wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
