"""`specregen infer` as a person runs it: live progress in a terminal, and what it costs.

    python bench/infer_terminal.py [--requests 20000] [--concurrency 2000] [--rounds 2]
                                   [--latency-mean 2.0] [--captures DIR]

Starts the emulator in its own process (as bench/inference.py does) and writes `--requests`
prompts. Then runs the real command, `specregen infer PROMPTS --out RAW ...`, in alternating
rounds:

* in a terminal: a tmux pane (160 x 40) is the command's terminal, so it shows the live view
  (rich), repainted about once a second; the pane is captured while it runs (printed, and kept
  in `--captures` if given) to show what a person sees;
* not in a terminal: stderr to a file, where the command writes one summary line per 30 s.

Each run gets a fresh raw log folder. The command's own CPU time (user + system, from
`/usr/bin/time`) is compared: median with the live view / median without (target: the live
view costs under 2 % of the client CPU, ratio <= 1.02; the box's noise is a few %).
bench/progress.py measures the same with the engine called directly, and the CPU inside the
progress callback itself.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SESSION = f"specregen-bench-{os.getpid()}"
# A tmux server of our own (its own socket): it starts with this process's environment, and
# nobody else's sessions are touched.
TMUX = ("tmux", "-L", SESSION)


def _bench_inference():
    path = REPO / "bench" / "inference.py"
    spec = importlib.util.spec_from_file_location("bench_inference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_prompts(path: Path, n: int) -> None:
    with path.open("w") as out:
        for i in range(n):
            out.write(json.dumps({"sample_id": f"t{i}", "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": f"Say hello number {i}."}]}) + "\n")


def infer_command(prompts: Path, out: Path, port: int, concurrency: int) -> list[str]:
    specregen = shutil.which("specregen") or str(Path(sys.executable).with_name("specregen"))
    return [specregen, "infer", str(prompts), "--out", str(out),
            "--base-url", f"http://127.0.0.1:{port}/v1", "--model", "moonshotai/kimi-k2.5",
            "--dialect", "vllm", "--no-stream", "--max-tokens", "64",
            "--concurrency", str(concurrency)]


def cpu_of(times: Path) -> float:
    user, system = times.read_text().split()[-2:]
    return float(user) + float(system)


def in_terminal(cmd: list[str], work: Path, captures: list[str]) -> float:
    """The command in a tmux pane; returns its CPU seconds; appends pane captures."""
    times = work / "times"
    done = work / "done"
    script = work / "run.sh"
    script.write_text(
        "#!/bin/sh\n"
        f"/usr/bin/time -f '%U %S' -o {times} {' '.join(map(_quote, cmd))}\n"
        f"echo $? > {done}\n"
        "sleep 30\n")  # the pane stays for the last capture; the session is killed after
    script.chmod(0o755)
    subprocess.run([*TMUX, "new-session", "-d", "-s", SESSION, "-x", "160", "-y", "40",
                    str(script)], check=True)
    try:
        started = time.monotonic()
        next_capture = started + 8.0
        while not done.exists():
            if time.monotonic() >= next_capture:
                captures.append(_capture(f"{time.monotonic() - started:.0f} s in"))
                next_capture += 20.0
            time.sleep(0.5)
        captures.append(_capture("after the end"))
    finally:
        subprocess.run([*TMUX, "kill-server"], capture_output=True)
    code = done.read_text().strip()
    if code != "0":
        raise SystemExit(f"specregen infer exited {code} in the terminal run:\n{captures[-1]}")
    return cpu_of(times)


def not_in_terminal(cmd: list[str], work: Path) -> tuple[float, str]:
    times = work / "times"
    with (work / "stderr").open("w") as err:
        code = subprocess.run(["/usr/bin/time", "-f", "%U %S", "-o", str(times), *cmd],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=err).returncode
    text = (work / "stderr").read_text()
    if code != 0:
        raise SystemExit(f"specregen infer exited {code} without a terminal:\n{text[-3000:]}")
    return cpu_of(times), text


def _capture(label: str) -> str:
    pane = subprocess.run([*TMUX, "capture-pane", "-p", "-t", SESSION], capture_output=True,
                          text=True).stdout.rstrip()
    return f"--- pane, {label} ---\n{pane}"


def _quote(arg: str) -> str:
    return "'" + arg.replace("'", "'\\''") + "'"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=2_000)
    parser.add_argument("--latency-mean", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--captures", type=Path, help="keep the pane captures in this folder")
    args = parser.parse_args()
    if shutil.which("tmux") is None:
        raise SystemExit("tmux is needed (Debian: apt-get install tmux)")

    bench = _bench_inference()
    port = bench.free_port()
    emulator = bench.start_emulator(port, args.latency_mean)
    cpu: dict[bool, list[float]] = {True: [], False: []}
    captures: list[str] = []
    quiet = ""
    try:
        with tempfile.TemporaryDirectory(prefix="bench-infer-term-") as root:
            root_path = Path(root)
            prompts = root_path / "prompts.jsonl"
            write_prompts(prompts, args.requests)
            for r in range(args.rounds):
                for terminal in (True, False):
                    work = root_path / f"run-{r}-{'tty' if terminal else 'pipe'}"
                    work.mkdir()
                    cmd = infer_command(prompts, work / "raw", port, args.concurrency)
                    if terminal:
                        cpu[True].append(in_terminal(cmd, work, captures))
                    else:
                        seconds, quiet = not_in_terminal(cmd, work)
                        cpu[False].append(seconds)
                    print(f"round {r + 1}, {'terminal' if terminal else 'no terminal'}: "
                          f"client CPU {cpu[terminal][-1]:.2f} s", flush=True)
    finally:
        emulator.terminate()
        emulator.wait(timeout=10)
    live = captures[0] if captures else "(no capture)"
    print(live)
    print(captures[-1] if captures else "")
    print("--- stderr without a terminal (last run) ---")
    print(quiet.rstrip())
    if args.captures:
        args.captures.mkdir(parents=True, exist_ok=True)
        (args.captures / "panes.txt").write_text("\n\n".join(captures) + "\n")
    on, off = statistics.median(cpu[True]), statistics.median(cpu[False])
    print(f"requests: {args.requests:,}  concurrency: {args.concurrency:,}  rounds: "
          f"{args.rounds}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} on "
          f"{os.cpu_count()} cores")
    print(f"client CPU of `specregen infer`: in a terminal (live view) {on:.2f} s "
          f"({', '.join(f'{c:.2f}' for c in cpu[True])}), without {off:.2f} s "
          f"({', '.join(f'{c:.2f}' for c in cpu[False])})")
    print(f"ratio live / without: {on / off:.3f}  (target <= 1.02: the live view costs under "
          "2 % of the client CPU)")


if __name__ == "__main__":
    main()
