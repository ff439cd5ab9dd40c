"""This checkout against an earlier commit, in one run: is a refactor slower?

    python bench/versus.py --base REF [--rounds 3] [--only reconstruct,gate,streaming,inference]

Checks REF out into a temporary git worktree, then runs the same benchmarks of both checkouts
in alternation (base, head, base, head, ...), each checkout's own `bench/` script in its own
process with that checkout first on the path. Every benchmark already prints a number measured
against a baseline in its own run (reconstruction against raw tiktoken, the gate against
reconstruction, the engine's client CPU against a bare httpx loop, the SSE client's CPU
against the original line-by-line path), which load on the machine moves far less than a
wall clock; this prints, per number, the median over the rounds for both checkouts and head /
base, oriented so that a ratio above 1.00 means head is slower. Run it with the project's
venv (`.venv/bin/python`).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Measure:
    bench: str  # the script under bench/
    args: tuple[str, ...]
    label: str
    pattern: str  # a regex whose first group is the number
    higher_is_slower: bool  # a cost (seconds, a ratio to a fast baseline) or a speed


MEASURES = (
    Measure("reconstruct.py", ("--samples", "1000"), "reconstruct: tiktoken CPU / ours",
            r"ratio in CPU time \(process_time\): ([\d.]+)x", higher_is_slower=False),
    Measure("gate.py", ("--samples", "1000"), "gate: gate / reconstruct time",
            r"ratio \(gate / reconstruct\): ([\d.]+)", higher_is_slower=True),
    # The last number printed: the client's CPU per token over the original line path's.
    Measure("streaming.py", ("--streams", "300", "--rounds", "1", "--paths", "after"),
            "streaming: client CPU / line path's", r"([\d.]+)\s*\Z", higher_is_slower=True),
    Measure("inference.py", ("--requests", "4000", "--concurrency", "400"),
            "inference: engine / bare client CPU",
            r"client CPU ratio engine/bare: ([\d.]+)", higher_is_slower=True),
)


def run(checkout: Path, measure: Measure) -> float | None:
    script = checkout / "bench" / measure.bench
    if not script.exists():
        return None
    done = subprocess.run([sys.executable, str(script), *measure.args], cwd=checkout,
                          capture_output=True, text=True, env=_env(checkout))
    found = re.search(measure.pattern, done.stdout.strip())
    if done.returncode != 0 or found is None:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        print(f"  {checkout.name} {measure.bench}: no number ({' | '.join(tail)})")
        return None
    return float(found.group(1))


def _env(checkout: Path) -> dict[str, str]:
    # The checkout first, so each side imports its own `specregen` (the venv's editable
    # install points at one of them; sys.path[0] wins over its finder).
    return {**os.environ, "PYTHONPATH": str(checkout), "SPECREGEN_ROOT": str(checkout)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True, help="the commit to compare against")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default="", help="comma-separated bench script stems")
    args = parser.parse_args()
    wanted = {s.strip() for s in args.only.split(",") if s.strip()}
    measures = [m for m in MEASURES if not wanted or m.bench.removesuffix(".py") in wanted]
    base_rev = subprocess.run(["git", "rev-parse", "--short", args.base], cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout.strip()
    head_rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="specregen-versus-") as tmp:
        base = Path(tmp) / f"base-{base_rev}"
        subprocess.run(["git", "worktree", "add", "--detach", str(base), args.base], cwd=ROOT,
                       check=True, capture_output=True)
        try:
            numbers: dict[str, dict[str, list[float]]] = {
                m.label: {"base": [], "head": []} for m in measures}
            for r in range(args.rounds):
                for m in measures:
                    for side, checkout in (("base", base), ("head", ROOT)):
                        value = run(checkout, m)
                        if value is not None:
                            numbers[m.label][side].append(value)
                print(f"round {r + 1} of {args.rounds} done", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT,
                           capture_output=True)
    print(f"\nhead {head_rev} against base {base_rev}, medians of {args.rounds} rounds "
          "(head / base > 1.00: head is slower)")
    print(f"{'measure':44} {'base':>9} {'head':>9} {'head/base':>10}")
    for m in measures:
        got = numbers[m.label]
        if not got["base"] or not got["head"]:
            print(f"{m.label:44} {'-':>9} {'-':>9} {'n/a':>10}")
            continue
        b, h = statistics.median(got["base"]), statistics.median(got["head"])
        slower = h / b if m.higher_is_slower else b / h
        print(f"{m.label:44} {b:9.3f} {h:9.3f} {slower:10.3f}")


if __name__ == "__main__":
    main()
