"""The real vLLM server in the loop: conformance of the emulator, fidelity of reconstruction.

    python bench/real_vllm.py [--families kimi-k2.5,qwen3,kimi-k3] [--requests 500] [--seed 0]
                              [--variants defaults,client] [--modes plain,stream]
                              [--dump FILE.jsonl]

For each family a real vLLM (the CPU build in .venv-vllm, scripts/setup_vllm.sh) serves the
scripted model (specregen/realserver/) with the family's parsers. Each request of the family's
fidelity corpus (bench/fidelity.py for K2.5, bench/fidelity_corpus.py for the others) is scripted
with the ids the model writes and sent plain and streamed, with the server's defaults and with
the options the client sends. Prints per family:

* the conformance table: shape x {plain, stream} x {equal, differs} (the emulator's profile
  given the same ids and request, compared with what the real server returned, as the client
  reads both), and the fields that differ;
* real-server fidelity of reconstruction without the server's ids: ok / ok_resplit / wrong_ok /
  flagged_right / false_alarm / error per mode and variant, by group, in three passes:
  `blind` (no provider traits), `probed` (the traits specregen's endpoint probe finds against
  this server, asked the variant's way: what a pipeline run has), `logprobs` (the client
  variant's logprobs, which vLLM returns as `token_id:N`: evidence `logprobs`), plus whether
  the ids the logprobs name equal the server's token ids;
* yield: template-shaped answers `ok` with exact ids, and what is not exact by reason;
* prompt ids equal to the server's `prompt_token_ids`.

K2.5 and K3 need the real Kimi vocabulary (KIMI_TOKENIZER_DIR or ../shared/kimi; K3 takes its
ranks under its own added-token table). Specregen reads the tokenizer from the model folder the
server serves. An answer rebuilt `ok` with wrong ids is asked again with our ids scripted: when
the server gives the same answer, the deviation is not in the answer (`unseen`: no reader
without the server's ids can see it; counted apart). Exits 1 when any other `ok` answer, in any
group, has wrong ids.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specregen.models.registry import get_format, real_vllm_spec
from specregen.models.tokenizer import load_tokenizer
from specregen.realserver import conformance
from specregen.realserver.server import VllmServer

ROOT = Path(__file__).resolve().parents[1]


def kimi_dir() -> Path | None:
    named = os.environ.get("KIMI_TOKENIZER_DIR")
    path = Path(named) if named else ROOT.parent / "shared" / "kimi"
    return path if (path / "tiktoken.model").is_file() else None


def family_run(name: str, args: argparse.Namespace) -> int:
    tokenizer_dir = kimi_dir() if name.startswith("kimi") else None
    spec = real_vllm_spec(name, tokenizer_dir)
    assert spec is not None
    variants = args.variants.split(",")
    streams = [m == "stream" for m in args.modes.split(",")]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="specregen-vllm-") as work:
        server = VllmServer.start(spec, Path(work))
        print(f"\n=== {name}: server up in {time.monotonic() - started:.0f} s", flush=True)
        try:
            # The vocabulary and added-token table the server runs: the model folder's.
            tok = load_tokenizer(server.folder)
            fmt = get_format(name, tok)
            cases = conformance.real_cases(spec, tok, args.requests, args.seed)
            total = len(cases) * len(variants) * len(streams)
            print(f"{len(cases)} requests x {len(variants)} variants x {len(streams)} modes = "
                  f"{total} answers (shapes {dict(Counter(c.shape for c in cases))})",
                  flush=True)
            traits = {}
            if not args.no_probe:
                for variant in variants:
                    traits[variant] = conformance.probe_profile(server, fmt, variant).traits()
                    print(f"probe ({variant}): {traits[variant]}", flush=True)

            def progress(i: int) -> None:
                if i % 100 == 0:
                    print(f"  {i}/{total} ({time.monotonic() - started:.0f} s)", flush=True)

            results = list(conformance.run(server, fmt, cases, variants, streams,
                                           traits=traits, progress=progress))
        finally:
            server.stop()
    print(f"{total} answers in {time.monotonic() - started:.0f} s\n")
    print(conformance.conformance_table(results))
    rows = conformance.tally(results)
    wrong = 0
    for (mode, variant), row in sorted(rows.items()):
        print(f"\n-- {mode}/{variant}: {row.answers} answers, emulator equal {row.equal}, "
              f"differs {row.answers - row.equal} {dict(row.differs)}")
        for name, outcomes in row.outcomes.items():
            right = outcomes["ok"] + outcomes["ok_resplit"] + outcomes["false_alarm"]
            template = row.template.get(name, Counter())
            t = sum(template.values())
            print(f"   [{name}] {dict(outcomes)}; wrong ok {outcomes['wrong_ok']} (unseen "
                  f"{outcomes['unseen']}: the answer to our ids is the same); false alarms "
                  f"{outcomes['false_alarm']}/{right} "
                  f"({100 * outcomes['false_alarm'] / max(1, right):.1f}%); evidence "
                  f"{dict(row.evidence.get(name, {}))}")
            for group, counter in sorted(row.by_group.get(name, {}).items()):
                print(f"      {group}: {dict(counter)}")
            print(f"      yield: {template['ok']}/{t} template-shaped ok with exact ids "
                  f"({100 * template['ok'] / max(1, t):.1f}%); not exact: "
                  f"{dict(row.not_exact.get(name, Counter()).most_common(8))}")
            wrong += outcomes["wrong_ok"]
        if row.logprob_ids:
            print(f"   ids named by the logprobs vs the server's token ids: "
                  f"{dict(row.logprob_ids)}")
        print(f"   prompt ids equal to the server's: {row.prompt_equal}/{row.answers}")
        for example in row.examples[:3]:
            print(f"   e.g. {example}")
    if args.dump:
        with open(args.dump, "a", encoding="utf-8") as out:
            for line in conformance.dump(results):
                out.write(line + "\n")
    return wrong


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--families", default="kimi-k2.5,qwen3")
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variants", default=",".join(conformance.VARIANTS))
    parser.add_argument("--modes", default="plain,stream")
    parser.add_argument("--dump", help="append the answers that differ or are not exact here")
    parser.add_argument("--no-probe", action="store_true",
                        help="skip the endpoint probe (no `probed` pass)")
    args = parser.parse_args()
    wrong = 0
    for name in args.families.split(","):
        wrong += family_run(name, args)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
