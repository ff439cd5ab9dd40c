"""Running the gate over a dataset, and its report (JSON and Markdown).

The run streams: per sample it keeps counters and, per check, the K shortest failing examples in
a bounded heap, so a report on 100,000 samples costs the same memory as one on 1,000.
"""

from __future__ import annotations

import heapq
import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from specregen.gate.checks import (
    CHECKS,
    GateDecision,
    check_sample,
    parse_arguments,
    turn_history_answers,
)
from specregen.gate.config import GateConfig
from specregen.gate.declared import DeclarationOf
from specregen.models.chat_format import ChatFormat
from specregen.records import EVIDENCE_LEVELS, TokenSample

Callback = Callable[[TokenSample, GateDecision], None]
Verdict = Literal["pass", "fail"]

# Past this many distinct names (a model inventing a name per sample), calls count as "other".
MAX_TRACKED_TOOLS = 10_000
_NAME_CHARS = 80

CHECK_MEANINGS = {
    "reconstruction": "status not `ok`: the ids cannot be trusted (flags) or were not built",
    "round_trip": "the ids do not decode and parse back to the calls the API returned",
    "arguments_json": "arguments are not a JSON object",
    "arguments_schema": "arguments violate the declared tool's parameters",
    "schema_invalid": "the declared tool's parameters are not a usable schema",
    "name_declared": "the called function is not declared",
    # The format's own words replace this (`Family.tool_id_rule`, set by `run_gate`).
    "tool_id_form": "a call id breaks the format's id rule (`ChatFormat.tool_id_problems`)",
    "marker_text": "the format's marker strings written as text inside model text",
    "finish_reason": "`finish_reason` disagrees with the calls present",
    "usage_lengths": "token counts differ from `usage` beyond the tolerance",
    "evidence": "the ids are proven less strongly than the dataset's `min_evidence`",
}


@dataclass
class GateReport:
    """Everything the gate found on one dataset; plain data, JSON-serialisable."""

    dataset: str
    verdict: Verdict
    why: list[str]
    totals: dict[str, Any]
    by_check: dict[str, int]
    reconstruction_flags: dict[str, int]
    schema_quirks: dict[str, int]
    by_tool: list[dict[str, Any]]
    tools_not_listed: dict[str, int]
    trigger_agreement: dict[str, Any] | None
    examples: dict[str, list[dict[str, Any]]]
    hard_invariant_examples: list[dict[str, Any]]
    config: dict[str, Any]
    # Whole conversations (samples with a conversation_id): how their regeneration ended and
    # how many user turns each reached; None when the dataset has none.
    conversations: dict[str, Any] | None = None
    # What the endpoint probe found about the server's text transformations (the provider
    # traits reconstruction used; None: no probe), named in the report with the samples each
    # touched.
    provider: dict[str, bool | None] | None = None
    # What the format's `tool_id_form` check asks of an id, in words (its family's
    # `tool_id_rule`): the Markdown's line for the check; not in the JSON.
    tool_id_rule: str | None = field(default=None, repr=False, compare=False)

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        del out["tool_id_rule"]
        return out

    def check_meaning(self, check: str) -> str:
        if check == "tool_id_form" and self.tool_id_rule:
            return self.tool_id_rule
        return CHECK_MEANINGS[check]

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, indent=1)

    def to_markdown(self) -> str:
        return render_markdown(self)


def run_gate(
    samples: Iterable[TokenSample],
    fmt: ChatFormat,
    config: GateConfig,
    *,
    dataset: str,
    reference: Mapping[str, dict[str, Any] | None] | None = None,
    on_accept: Callback | None = None,
    on_quarantine: Callback | None = None,
    provider: Mapping[str, bool | None] | None = None,
    declarations: DeclarationOf | None = None,
) -> GateReport:
    """Check every sample, hand each to its callback with the decision, and report.
    `provider`: the probe's findings the reconstruction used (the report names them).
    `declarations`: each sample's prompt's declaration (`declared.by_prompt`); without one a
    sample declares the tools its request sent."""
    tally = Tally(config, reference)
    for sample in samples:
        declaration = declarations(sample) if declarations is not None else None
        decision = check_sample(sample, fmt, config, declaration)
        tally.add(sample, decision)
        callback = on_accept if decision.accepted else on_quarantine
        if callback is not None:
            callback(sample, decision)
    report = tally.report(dataset)
    report.provider = None if provider is None else _reported(provider, fmt)
    report.tool_id_rule = _tool_id_rule(fmt)
    return report


def _reported(provider: Mapping[str, bool | None], fmt: ChatFormat) -> dict[str, bool | None]:
    """The probe's findings the report names: the format's family traits that change the
    server's text (none for a format the registry does not know)."""
    from specregen.models.registry import UnknownFormatError, trait_reports

    try:
        names = trait_reports(fmt.name)
    except UnknownFormatError:
        return {}
    return {name: provider.get(name) for name in names}


def _tool_id_rule(fmt: ChatFormat) -> str | None:
    """The family's words for its id rule (None: a format the registry does not know)."""
    from specregen.models.registry import UnknownFormatError, tool_id_rule

    try:
        return tool_id_rule(fmt.name)
    except UnknownFormatError:
        return None


# --- the tally --------------------------------------------------------------------------------


@dataclass
class Trigger:
    """Did the model call a tool where the dataset's own answer did, and the same one?"""

    dataset_called: int = 0
    model_called: int = 0
    same_tool: int = 0
    same_arguments: int = 0
    dataset_text: int = 0
    model_text: int = 0
    no_reference: int = 0
    other_kind: int = 0

    def add(self, sample: TokenSample, ref: Any) -> None:
        kind = ref.get("kind") if isinstance(ref, dict) else None
        names = [c.name for c in sample.tool_calls]
        if kind in ("tool_call", "tool_calls"):
            wanted = _reference_calls(ref)
            self.dataset_called += 1
            if names:
                self.model_called += 1
            if names and set(names) == {name for name, _ in wanted}:
                self.same_tool += 1
                if len(wanted) == 1 == len(names) and _same_arguments(
                    sample.tool_calls[0].arguments, wanted[0][1]
                ):
                    self.same_arguments += 1
        elif kind == "text":
            self.dataset_text += 1
            if not names:
                self.model_text += 1
        elif ref is None:
            self.no_reference += 1
        else:
            self.other_kind += 1


def _reference_calls(ref: dict[str, Any]) -> list[tuple[str, Any]]:
    if ref.get("kind") == "tool_call":
        return [(str(ref.get("name")), ref.get("arguments"))]
    raw_calls = ref.get("calls")
    calls = raw_calls if isinstance(raw_calls, list) else []
    return [(str(c.get("name")), c.get("arguments")) for c in calls if isinstance(c, dict)]


def _same_arguments(ours: str, reference: Any) -> bool:
    mine, problem = parse_arguments(ours)
    if problem is not None:
        return False
    if isinstance(reference, str):
        reference, problem = parse_arguments(reference)
        if problem is not None:
            return False
    return mine == reference


@dataclass
class Tally:
    """Counters and bounded example heaps, filled one sample at a time."""

    config: GateConfig
    reference: Mapping[str, Any] | None = None
    total: int = 0
    accepted: int = 0
    hard: int = 0
    with_calls: int = 0
    calls: int = 0
    truncated: int = 0
    no_usage: int = 0
    by_status: Counter[str] = field(default_factory=Counter)
    accepted_by_evidence: Counter[str] = field(default_factory=Counter)
    by_check: Counter[str] = field(default_factory=Counter)
    flags: Counter[str] = field(default_factory=Counter)
    quirks: Counter[str] = field(default_factory=Counter)
    tools: dict[str, list[int]] = field(default_factory=dict)
    other_tools: list[int] = field(default_factory=lambda: [0, 0])
    trigger: Trigger = field(default_factory=Trigger)
    history_calls: int = 0
    # conversation id -> [stop reason, user turns with a sample, samples, accepted samples]
    conversations: dict[str, list[Any]] = field(default_factory=dict)
    # check -> heap of (-tokens, -seq, example): the root is the longest kept, replaced first.
    heaps: dict[str, list[tuple[int, int, dict[str, Any]]]] = field(default_factory=dict)

    def add(self, sample: TokenSample, decision: GateDecision) -> None:
        self.total += 1
        self.accepted += decision.accepted
        if decision.accepted:
            self.accepted_by_evidence[sample.evidence or "none"] += 1
        self.hard += decision.hard
        self.by_status[sample.status] += 1
        if sample.flags:
            self.flags.update(sample.flags)
        if decision.schema_quirks:
            self.quirks.update(decision.schema_quirks)
        self.truncated += sample.finish_reason == "length"
        self.no_usage += sample.status != "error" and sample.usage_completion_delta is None
        self._add_tools(sample, decision.accepted)
        if sample.conversation_id is not None:
            self._add_conversation(sample, decision.accepted)
        if self.reference is not None and sample.status != "error":
            if sample.sample_id in self.reference:
                self.trigger.add(sample, self.reference[sample.sample_id])
            else:
                self.trigger.no_reference += 1
        seen = set()
        for reason in decision.reasons:
            if reason.check not in seen:
                seen.add(reason.check)
                self.by_check[reason.check] += 1
                self._keep_example(reason.check, sample, reason.detail, reason.excerpt)
        if decision.hard:
            trip = next(r for r in decision.reasons if r.check == "round_trip")
            self._keep_example("__hard__", sample, trip.detail, trip.excerpt)

    def _add_conversation(self, sample: TokenSample, accepted: bool) -> None:
        entry = self.conversations.setdefault(str(sample.conversation_id),
                                              [sample.stop_reason, 0, 0, 0])
        entry[1] = max(entry[1], (sample.user_turn or 0) + 1)
        entry[2] += 1
        entry[3] += accepted

    def _add_tools(self, sample: TokenSample, accepted: bool) -> None:
        # A conversation sample also trains on the calls of its turn's earlier answers.
        history = [c for _, calls in turn_history_answers(sample) for c in calls]
        self.history_calls += len(history)
        calls = [*history, *sample.tool_calls]
        if not calls:
            return
        self.with_calls += 1
        self.calls += len(calls)
        for call in calls:
            name = call.name[:_NAME_CHARS]
            counts = self.tools.get(name)
            if counts is None:
                counts = self.other_tools
                if len(self.tools) < MAX_TRACKED_TOOLS:
                    counts = self.tools[name] = [0, 0]
            counts[0] += 1
            counts[1] += not accepted

    def _keep_example(self, check: str, sample: TokenSample, detail: str, excerpt: str) -> None:
        limit = self.config.examples_per_check
        if limit == 0:
            return
        heap = self.heaps.setdefault(check, [])
        key = (-sample.completion_len, -self.total)
        if len(heap) >= limit and key <= heap[0][:2]:
            return
        example = {"sample_id": sample.sample_id, "tokens": sample.completion_len,
                   "detail": detail, "excerpt": excerpt}
        if len(heap) < limit:
            heapq.heappush(heap, (*key, example))
        else:
            heapq.heapreplace(heap, (*key, example))

    def _examples(self, check: str) -> list[dict[str, Any]]:
        return [e for *_, e in sorted(self.heaps.get(check, []), reverse=True)]

    def report(self, dataset: str) -> GateReport:
        quarantined = self.total - self.accepted
        share = quarantined / self.total if self.total else 0.0
        verdict, why = _verdict(self.total, quarantined, share, self.hard, self.config)
        ranked = sorted(self.tools.items(), key=lambda kv: (-kv[1][0], kv[0]))
        listed, rest = ranked[: self.config.tools_in_report], ranked[self.config.tools_in_report :]
        return GateReport(
            dataset=dataset,
            verdict=verdict,
            why=why,
            totals={
                "samples": self.total,
                "accepted": self.accepted,
                "quarantined": quarantined,
                "quarantined_share": round(share, 6),
                "hard_invariant_breaks": self.hard,
                "samples_with_calls": self.with_calls,
                "tool_calls": self.calls,
                "history_tool_calls": self.history_calls,
                "truncated": self.truncated,
                "without_usage": self.no_usage,
                "by_status": dict(sorted(self.by_status.items())),
                "accepted_by_evidence": {
                    level: self.accepted_by_evidence.get(level, 0) for level in EVIDENCE_LEVELS
                },
            },
            by_check={check: self.by_check.get(check, 0) for check in CHECKS},
            reconstruction_flags=dict(self.flags.most_common()),
            schema_quirks=dict(self.quirks.most_common()),
            by_tool=[{"name": n, "calls": c, "quarantined": q} for n, (c, q) in listed],
            tools_not_listed={
                "tools": len(rest) + (1 if self.other_tools[0] else 0),
                "calls": sum(c for _, (c, _q) in rest) + self.other_tools[0],
                "quarantined": sum(q for _, (_c, q) in rest) + self.other_tools[1],
            },
            trigger_agreement=asdict(self.trigger) if self.reference is not None else None,
            examples={c: self._examples(c) for c in CHECKS if c in self.heaps},
            hard_invariant_examples=self._examples("__hard__"),
            config=self.config.to_dict(),
            conversations=self._conversations(),
        )

    def _conversations(self) -> dict[str, Any] | None:
        if not self.conversations:
            return None
        from specregen.conversation.plan import STOP_REASONS

        reasons = Counter(str(e[0]) if e[0] is not None else "unfinished"
                          for e in self.conversations.values())
        turns = Counter(e[1] for e in self.conversations.values())
        return {
            "conversations": len(self.conversations),
            "ended": reasons.get("end", 0),
            "stopped": sum(k for r, k in reasons.items() if r not in ("end", "unfinished")),
            # A request of the conversation still has no final answer (a stopped run).
            "unfinished": reasons.get("unfinished", 0),
            "by_stop_reason": {r: reasons[r] for r in (*STOP_REASONS, "unfinished")
                               if reasons.get(r)} | {r: k for r, k in sorted(reasons.items())
                                                      if r not in STOP_REASONS
                                                      and r != "unfinished"},
            "user_turns": {str(t): turns[t] for t in sorted(turns)},
            "samples": sum(e[2] for e in self.conversations.values()),
            "accepted": sum(e[3] for e in self.conversations.values()),
            "wholly_accepted": sum(e[2] == e[3] for e in self.conversations.values()),
        }


def _verdict(
    total: int, quarantined: int, share: float, hard: int, config: GateConfig
) -> tuple[Verdict, list[str]]:
    limit = config.max_quarantine_share
    why = []
    if total == 0:
        why.append("the dataset has no samples: there is nothing the gate could vouch for")
    if hard:
        why.append(
            f"hard invariant broken: {hard:,} sample(s) with status `ok` do not round-trip "
            "(their ids do not parse back to the calls the API returned: a reconstruction bug, "
            "or ids built with another tokenizer); this fails the dataset whatever the threshold"
        )
    if share > limit:
        why.append(f"quarantined share {share:.2%} ({quarantined:,} of {total:,}) exceeds the "
                   f"threshold {limit:.2%}")
    if why:
        return "fail", why
    return "pass", [
        f"quarantined share {share:.2%} ({quarantined:,} of {total:,}) is within the threshold "
        f"{limit:.2%}, and every `ok` sample round-trips"
    ]


# --- Markdown ---------------------------------------------------------------------------------


def render_markdown(report: GateReport) -> str:
    t = report.totals
    n = t["samples"]
    lines = [
        f"# Tool-call gate: {_text(report.dataset)} — {report.verdict.upper()}",
        "",
        "**Verdict: PASS**: the accepted samples may be published." if report.passed else
        "**Verdict: FAIL**: nothing of this dataset may be published.",
        "",
        *(f"- {reason}" for reason in report.why),
        "",
        "## Totals",
        "",
        "| | samples | share |",
        "|---|---:|---:|",
        f"| checked | {n:,} | |",
        f"| accepted | {t['accepted']:,} | {_share(t['accepted'], n)} |",
        f"| quarantined | {t['quarantined']:,} | {_share(t['quarantined'], n)} |",
        f"| hard invariant breaks | {t['hard_invariant_breaks']:,} | "
        f"{_share(t['hard_invariant_breaks'], n)} |",
        f"| with tool calls ({t['tool_calls']:,} calls) | {t['samples_with_calls']:,} | "
        f"{_share(t['samples_with_calls'], n)} |",
        f"| truncated (`length`) | {t['truncated']:,} | {_share(t['truncated'], n)} |",
        f"| without `usage` counts | {t['without_usage']:,} | {_share(t['without_usage'], n)} |",
        "",
        "Reconstruction status: "
        + (", ".join(f"`{s}` {c:,}" for s, c in t["by_status"].items()) or "none"),
        *_conversations_section(report.conversations, t.get("history_tool_calls", 0)),
        "",
        "## Accepted samples by evidence",
        "",
        "What proves their ids (docs/evidence.md); the dataset accepts "
        f"`{report.config.get('min_evidence', 'usage_tolerated')}` or stronger.",
        "",
        "| evidence | samples | share of accepted |",
        "|---|---:|---:|",
        *(f"| `{level}` | {k:,} | {_share(k, t['accepted'])} |"
          for level, k in t.get("accepted_by_evidence", {}).items()),
        "",
        "## Quarantine reasons by check",
        "",
        "A sample can fail several checks; each counts once per check.",
        "",
        "| check | samples | share | fails when |",
        "|---|---:|---:|---|",
        *(f"| `{c}` | {k:,} | {_share(k, n)} | {report.check_meaning(c)} |"
          for c, k in report.by_check.items()),
    ]
    lines += _transformations_section(report)
    lines += _flags_table(report.reconstruction_flags)
    lines += _counter_table("Schema quirks normalised", "quirk", "calls validated",
                            report.schema_quirks)
    lines += _tools_table(report)
    lines += _trigger_table(report.trigger_agreement)
    lines += _examples_section(report)
    lines += ["", "## Settings", "", "| setting | value |", "|---|---|",
              *(f"| `{k}` | {v} |" for k, v in report.config.items()), ""]
    return "\n".join(lines)


# The reconstruction flags every format may raise; a family's own are in its traits' reports
# (`models/probe_rules.py TraitReport`, `flag_meanings`).
FLAG_MEANINGS = {
    "logprobs_undecidable": "logprobs came back but cannot name every token (left-out special"
                            " tokens, a token cut inside a character)",
}


def transformation_rows(provider: Mapping[str, bool | None] | None,
                        flags: Mapping[str, int]) -> list[tuple[str, str, int, str]]:
    """The server text transformations a report names: (label, what the probe found, samples
    touched, meaning), for each family trait with a report (`registry.trait_reports`) that
    the probe examined (`provider`: the family's, in the report) or whose flags are raised."""
    from specregen.models.registry import trait_reports

    rows = []
    for name, words in trait_reports().items():
        touched = sum(flags.get(f, 0) for f, _ in words.flags)
        if name not in (provider or {}) and not touched:
            continue
        verdict = {True: "yes", False: "no", None: "unknown"}[(provider or {}).get(name)]
        rows.append((words.label, verdict, touched, words.meaning))
    return rows


def flag_meanings() -> dict[str, str]:
    """What each reconstruction flag means, in the report's words: the generic ones and those
    of every family's traits."""
    from specregen.models.registry import trait_reports

    meanings = dict(FLAG_MEANINGS)
    for words in trait_reports().values():
        meanings.update(words.flags)
    return meanings


def _transformations_section(report: GateReport) -> list[str]:
    rows = [f"| {label} | {verdict} | {touched:,} | {meaning} |" for label, verdict, touched,
            meaning in transformation_rows(report.provider, report.reconstruction_flags)]
    if not rows:
        return []
    return ["", "## Server text transformations", "",
            "What the endpoint probe found the server does to the model's text, and the samples"
            " whose reading it touched (flags).", "",
            "| transformation | probe found | samples | what it means |",
            "|---|---|---:|---|", *rows]


def _conversations_section(conv: dict[str, Any] | None, history_calls: int) -> list[str]:
    if not conv:
        return []
    n = conv["conversations"]
    lines = [
        "",
        "## Conversations",
        "",
        "Whole conversations regenerated turn by turn: one sample per user turn reached; a "
        "sample's loss mask covers every answer of its turn's tool loop.",
        "",
        "| | conversations | share |",
        "|---|---:|---:|",
        f"| regenerated to the end | {conv['ended']:,} | {_share(conv['ended'], n)} |",
        f"| stopped early | {conv['stopped']:,} | {_share(conv['stopped'], n)} |",
    ]
    if conv.get("unfinished"):
        lines.append(f"| unfinished (a request without a final answer) | {conv['unfinished']:,}"
                     f" | {_share(conv['unfinished'], n)} |")
    lines += [
        f"| every sample accepted | {conv['wholly_accepted']:,} | "
        f"{_share(conv['wholly_accepted'], n)} |",
        f"| all | {n:,} | |",
        "",
        "| stop reason | conversations | share |",
        "|---|---:|---:|",
        *(f"| `{_text(r)}` | {k:,} | {_share(k, n)} |" for r, k in conv["by_stop_reason"].items()),
        "",
        "| user turns reached | conversations | share |",
        "|---:|---:|---:|",
        *(f"| {t} | {k:,} | {_share(k, n)} |" for t, k in conv["user_turns"].items()),
        "",
        f"Samples: {conv['samples']:,} ({conv['accepted']:,} accepted); tool calls in earlier "
        f"answers of a turn (checked like the completion's): {history_calls:,}.",
    ]
    return lines


def _flags_table(counts: dict[str, int]) -> list[str]:
    if not counts:
        return []
    meanings = flag_meanings()  # once: each family's probe rules are built to find them
    return ["", "## Reconstruction flags (all samples)", "", "| flag | samples | means |",
            "|---|---:|---|",
            *(f"| {_code(k)} | {v:,} | {meanings.get(k, '')} |" for k, v in counts.items())]


def _counter_table(title: str, key: str, unit: str, counts: dict[str, int]) -> list[str]:
    if not counts:
        return []
    return ["", f"## {title}", "", f"| {key} | {unit} |", "|---|---:|",
            *(f"| {_code(k)} | {v:,} |" for k, v in counts.items())]


def _tools_table(report: GateReport) -> list[str]:
    if not report.by_tool:
        return ["", "## Tools", "", "No tool calls."]
    lines = ["", "## Tools", "", "| tool | calls | in quarantined samples | share |",
             "|---|---:|---:|---:|"]
    for row in report.by_tool:
        lines.append(f"| {_code(row['name'])} | {row['calls']:,} | {row['quarantined']:,} | "
                     f"{_share(row['quarantined'], row['calls'])} |")
    rest = report.tools_not_listed
    if rest["calls"]:
        lines.append(f"| … {rest['tools']:,} more tools | {rest['calls']:,} | "
                     f"{rest['quarantined']:,} | {_share(rest['quarantined'], rest['calls'])} |")
    return lines


def _trigger_table(trigger: dict[str, Any] | None) -> list[str]:
    if trigger is None:
        return []
    called, text = trigger["dataset_called"], trigger["dataset_text"]
    return [
        "",
        "## Tool-trigger agreement with the dataset's own answers",
        "",
        "Over reconstructed samples that have a reference first turn.",
        "",
        "| | samples | share |",
        "|---|---:|---:|",
        f"| dataset called a tool | {called:,} | |",
        f"| … the model called a tool too | {trigger['model_called']:,} | "
        f"{_share(trigger['model_called'], called)} |",
        f"| … the same tool(s) | {trigger['same_tool']:,} | "
        f"{_share(trigger['same_tool'], called)} |",
        f"| … with equal arguments (as JSON values) | {trigger['same_arguments']:,} | "
        f"{_share(trigger['same_arguments'], called)} |",
        f"| dataset answered in text | {text:,} | |",
        f"| … the model answered in text too | {trigger['model_text']:,} | "
        f"{_share(trigger['model_text'], text)} |",
        f"| … the model called a tool instead | {text - trigger['model_text']:,} | "
        f"{_share(text - trigger['model_text'], text)} |",
        f"| no reference answer | {trigger['no_reference']:,} | |",
    ]


def _examples_section(report: GateReport) -> list[str]:
    groups = list(report.examples.items())
    if report.hard_invariant_examples:
        groups.insert(0, ("hard invariant (round_trip on an `ok` sample)",
                          report.hard_invariant_examples))
    if not groups:
        return []
    lines = ["", f"## Examples (shortest first, up to {report.config['examples_per_check']} "
             "per check)"]
    for check, examples in groups:
        title = check if check.startswith("hard") else f"`{check}`"
        lines += ["", f"### {title}", "", "| sample | tokens | detail | excerpt |",
                  "|---|---:|---|---|"]
        lines += [f"| {_code(e['sample_id'])} | {e['tokens']:,} | {_text(e['detail'])} | "
                  f"{_code(e['excerpt'])} |" for e in examples]
    return lines


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.2%}" if whole else "–"


def _text(text: str) -> str:
    """Plain text safe in a table cell: no HTML, no row breaks, no column breaks."""
    flat = " ".join(str(text).split())
    return (flat.replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;")
            .replace(">", "&gt;").replace("`", "\\`"))


def _code(text: str) -> str:
    """Text as an inline code span in a table cell (markers and tags stay visible)."""
    if not text:
        return ""
    flat = str(text).replace("\r", "").replace("\n", "⏎").replace("|", "\\|")
    fence = "`"
    while fence in flat:  # longer than any backtick run inside
        fence += "`"
    if flat.startswith("`") or flat.endswith("`"):
        flat = f" {flat} "
    return f"{fence}{flat}{fence}"
