"""A dataset run's summary, whatever its outcome, the same under both runners: the library
returns it (`run_dataset`), the flow publishes it as the `<dataset>-summary` artifact (as
Markdown, `summary_markdown`) before a failing outcome fails its run."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from specregen.errors import StorageError
from specregen.pipeline.chain import ChainEnd
from specregen.pipeline.gating import STAGE as GATE
from specregen.pipeline.gating import GateVerdict
from specregen.pipeline.layout import DatasetRun
from specregen.pipeline.prompts import STAGE as PROMPTS
from specregen.pipeline.reconstruction import STAGE as RECONSTRUCT
from specregen.store.manifest import StageManifest, read_manifest

# The outcomes whose run reached reconstruction and the gate (their manifests count).
_GATED = ("gate_failed", "published")


def end_summary(end: ChainEnd, wall_s: float) -> dict[str, Any]:
    """The summary of a chain that ran (not skipped): its outcome, what each stage it reached
    counted (read from their manifests), the probe, and the cost."""
    run = end.run
    probe = end.probe
    if end.outcome == "refused":  # nothing ran after the probe
        assert probe is not None
        return {"dataset": run.name, "outcome": end.outcome, "refusal": probe.refusal,
                "probe": probe.summary, "cost_usd": round(probe.cost_usd, 6),
                "wall_s": round(wall_s, 2)}
    prompts = read_manifest(run.store, run.name, PROMPTS, run.prompts_fp)
    assert prompts is not None, "the chain prepares the prompts before inference"
    gated = end.outcome in _GATED
    summary = summarize(
        run, prompts, end.inferred,
        read_manifest(run.store, run.name, RECONSTRUCT, run.reconstruct_fp) if gated else None,
        read_manifest(run.store, run.name, GATE, run.gate_fp) if gated else None,
        wall_s, probe=probe.summary if probe else None)
    summary["outcome"] = end.outcome
    if end.published is not None:
        summary["published"] = end.published
    return summary


def summarize(
    run: DatasetRun,
    prompts: StageManifest,
    inferred: list[dict[str, Any]],
    reconstructed: StageManifest | None,
    gated: StageManifest | None,
    wall_s: float,
    probe: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The run summary: samples, accepted, quarantined by reason, tokens, cost (the endpoint
    probe's included, see `probe`), match rates."""
    recon = reconstructed.counts if reconstructed else {}
    summary: dict[str, Any] = {
        "dataset": run.name,
        "prompts": prompts.counts.get("prompts", 0),
        "rejected_rows": prompts.counts.get("rejected", 0),
        # never sent: over the context length (pipeline/inference.py) or not JSON
        "rejected_requests": sum(r.get("rejected", 0) for r in inferred),
        "requests_sent": sum(r.get("requests_sent", 0) for r in inferred),
        "failed_requests": sum(r.get("failed", 0) for r in inferred),
        "prompt_tokens": sum(r.get("prompt_tokens", 0) for r in inferred),
        "completion_tokens": sum(r.get("completion_tokens", 0) for r in inferred),
        "cost_usd": round(sum(r.get("cost_usd", 0.0) for r in inferred), 6),
        "reconstructed": {k: v for k, v in recon.items() if not k.startswith("reference_")},
        "reference_match": {k.removeprefix("reference_"): v for k, v in recon.items()
                            if k.startswith("reference_")},
        "wall_s": round(wall_s, 2),
        "storage": run.store.url_of(run.name),
    }
    if gated is not None:
        verdict = GateVerdict.of(gated)
        summary["gate"] = {"verdict": verdict.label, "why": list(verdict.why), **gated.counts}
        summary["gate_report"] = run.store.url_of(run.name, "gate", run.gate_fp, "report.md")
    conversations = conversation_outcome(run, inferred, gated)
    if conversations is not None:
        summary["conversations"] = conversations
    if any("spent_total_usd" in r for r in inferred):
        # Batch mode: a chunk's cost_usd is its last pass; spent_total_usd is everything its raw
        # log was charged (every batch, realtime fallback, earlier runs), with the projection
        # and the realtime price of the same answers beside it (client/batch.py).
        def total(name: str) -> float:
            return round(sum(float(r.get(name) or 0.0) for r in inferred), 6)

        summary["cost_usd"] = total("spent_total_usd")
        summary["projected_total_usd"] = total("projected_total_usd")
        summary["realtime_equivalent_usd"] = total("realtime_equivalent_total_usd")
        summary["savings_usd"] = total("savings_total_usd")
    if probe is not None:
        summary["probe"] = probe
        summary["cost_usd"] = round(summary["cost_usd"] + probe.get("cost_usd", 0.0), 6)
        if "projected_total_usd" in summary:
            summary["projected_total_usd"] = round(
                summary["projected_total_usd"] + probe.get("cost_usd", 0.0), 6)
    return summary


def conversation_outcome(run: DatasetRun, inferred: list[dict[str, Any]],
                         gated: StageManifest | None) -> dict[str, Any] | None:
    """How a `turns: all` dataset's conversations ended: how many, by stop reason, and by user
    turns reached (one sample each). The gate report's, read from its samples, when the gate
    ran; else what inference recorded (stop reasons only). None for single-turn datasets."""
    if gated is not None:
        try:
            report = json.loads(run.store.read_bytes(run.name, "gate", run.gate_fp,
                                                     "report.json"))
        except (StorageError, OSError, ValueError):
            report = {}
        conv = report.get("conversations") if isinstance(report, dict) else None
        if isinstance(conv, dict) and conv.get("conversations"):
            return {"count": conv["conversations"], "by_stop_reason": conv["by_stop_reason"],
                    "user_turns": conv["user_turns"], "samples": conv.get("samples", 0)}
    stops: Counter[str] = Counter()
    for chunk in inferred:
        stops.update(chunk.get("conversation_stops") or {})
    count = sum(int(chunk.get("conversations") or 0) for chunk in inferred)
    if not count:
        return None
    return {"count": count, "by_stop_reason": dict(stops)}


def summary_markdown(summary: dict[str, Any]) -> str:
    """The summary as the flow's artifact shows it: a title with the outcome, then a table."""
    if summary.get("outcome") == "refused":
        rows: list[tuple[str, object]] = [
            ("refused before paying", summary.get("refusal")),
            ("endpoint probe", "{status}, {requests} requests".format(**summary["probe"])
             if summary.get("probe") else "-"),
            ("cost (USD)", summary["cost_usd"]),
            ("wall time (s)", summary["wall_s"]),
        ]
        return _markdown(summary, rows)
    gate = summary.get("gate", {})
    rows = [
        ("prompts", summary["prompts"]),
        ("rows refused by the adapter", summary["rejected_rows"]),
        ("prompts not sent (over the context, not JSON)", summary.get("rejected_requests", 0)),
        ("requests sent", summary["requests_sent"]),
        ("permanently failed", summary["failed_requests"]),
        ("accepted", gate.get("accepted")),
        ("quarantined", gate.get("quarantined")),
        ("completion tokens", summary["completion_tokens"]),
        ("cost (USD)", summary["cost_usd"]),
        *([("projected total (USD)", summary["projected_total_usd"]),
           ("same answers realtime (USD)", summary["realtime_equivalent_usd"]),
           ("savings vs realtime (USD)", summary["savings_usd"])]
          if "projected_total_usd" in summary else []),
        *_conversation_rows(summary.get("conversations")),
        ("endpoint probe", "{status}, {requests} requests".format(**summary["probe"])
         if summary.get("probe") else "-"),
        ("reference match", summary["reference_match"] or "-"),
        ("wall time (s)", summary["wall_s"]),
        ("published", summary.get("published", {}).get("path", "-")),
        ("gate report", summary.get("gate_report", "-")),
    ]
    return _markdown(summary, rows)


def _markdown(summary: dict[str, Any], rows: list[tuple[str, object]]) -> str:
    lines = [f"# {summary['dataset']}: {summary.get('outcome', '')}", "", "| | |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in rows]
    return "\n".join(lines) + "\n"


def _conversation_rows(conv: dict[str, Any] | None) -> list[tuple[str, object]]:
    """A `turns: all` dataset: its conversations, how they stopped, how many user turns they
    reached (one sample per user turn)."""
    if not conv:
        return []
    count = f"{conv['count']}" + (f" ({conv['samples']} samples, one per user turn reached)"
                                  if conv.get("samples") else "")
    rows: list[tuple[str, object]] = [("conversations", count)]
    rows += [(f"conversations by stop reason: `{reason}`", n)
             for reason, n in conv.get("by_stop_reason", {}).items()]
    if conv.get("user_turns"):
        rows.append(("conversations by user turns reached", ", ".join(
            f"{turns} turns: {n}" for turns, n in conv["user_turns"].items())))
    return rows
