"""The probe's findings in words: how calls came back, and what a run should know."""

from __future__ import annotations

from collections.abc import Sequence

from specregen.models.probe_rules import ProbeRules
from specregen.probe.classify import RAW_WHERE, mode_scenarios
from specregen.probe.model import ParserFindings, ScenarioResult

# What an id not in the form the model writes means, unless the format's probe rules say
# otherwise (their optional `other_id_meaning`): a format whose model writes its ids.
OTHER_ID_MEANING = "reconstruction rewrites them to the canonical form and flags tool_id_rewritten"


def describe_calls(scenario: ScenarioResult) -> str:
    """How a scenario's calls came back, in words (used in notes and refusals)."""
    counts = scenario.where_counts
    total = sum(counts.values())

    def share(where: str) -> str:
        return f"{counts.get(where, 0)} of {total} answers"

    if scenario.calls_where is None:
        first = scenario.errors[0] if scenario.errors else "no answer"
        return f"not at all: every probe request failed ({first})"
    where = scenario.calls_where
    if where == "stripped":
        return (f"with the markers stripped ({share('stripped')}: a tool_calls finish or"
                " call-like text, but no structured calls and no markers)")
    if where in RAW_WHERE and scenario.recoverable is False:
        return f"as raw marker text that does not parse as a tool-call section ({share(where)})"
    if where == "raw_reasoning":
        return f"as raw markers inside the reasoning ({share(where)})"
    if where == "raw_content":
        return f"as raw markers in content ({share(where)})"
    if where == "structured":
        return f"structured ({share(where)})"
    return f"not at all: no tool call in {total} answers (inconclusive)"


WHERE_MEANING = {
    "raw_content": "raw_content: the markers stay in content (no tool parsing without `tools`,"
                   " or none at all); reconstruction rebuilds the calls from that text",
    "raw_reasoning": "raw_reasoning: calls inside the reasoning make reconstruction flag the"
                     " samples (tool_calls_in_reasoning: whether the reasoning's end was written is"
                     " unknown)",
    "stripped": "stripped: a tool_calls finish or call-like text, but no structured calls and no"
                " markers; those calls cannot be rebuilt",
    "none": "none: some answers made no tool call although the prompt asked for one",
}


def _short(s: ScenarioResult) -> str:
    if s.calls_where is None:
        return "every request failed"
    total = sum(s.where_counts.values())
    return f"{s.calls_where} {s.where_counts.get(s.calls_where, 0)}/{total}"


def profile_notes(
    scenarios: Sequence[ScenarioResult],
    by_mode: dict[str, bool],
    *,
    thinking: bool | None,
    tokenizer: str | None,
    findings: ParserFindings | None = None,
    rules: ProbeRules | None = None,
) -> list[str]:
    """Human-readable findings, the most important first (`rules`: the format's probe rules,
    for what its ids mean)."""
    notes: list[str] = []
    by_name = {s.name: s for s in scenarios}
    for mode, names in mode_scenarios(thinking).items():
        present = [by_name[n] for n in names if n in by_name]
        verdict = "recoverable" if by_mode[mode] else "NOT recoverable"
        how = "; ".join(f"{s.name}: {_short(s)}" for s in present) or "no scenario ran"
        notes.append(f"tools as {mode}: {verdict} ({how})")
    wheres = {s.calls_where for s in scenarios}
    for where, meaning in WHERE_MEANING.items():
        if where in wheres:
            notes.append(meaning)
    off, on = by_name.get("thinking_off"), by_name.get("thinking_on")
    if off is not None and off.reasoning_field != "none":
        notes.append(f"thinking off was ignored: reasoning still came back in"
                     f" '{off.reasoning_field}'")
    if on is not None and on.calls_where is not None and on.reasoning_field == "none":
        notes.append("thinking on returned no reasoning (excluded, or the switch is ignored):"
                     " reconstruction will flag reasoning_missing")
    if findings is not None:
        notes.extend(finding_notes(findings, rules))
    _id_notes(scenarios, notes, getattr(rules, "other_id_meaning", OTHER_ID_MEANING))
    _argument_notes(scenarios, notes)
    _count_notes(scenarios, notes, tokenizer)
    providers = sorted({p for s in scenarios for p in s.providers})
    if len(providers) > 1:
        notes.append(f"served by several providers ({', '.join(providers)}): pin one"
                     " (--provider-only, --no-allow-fallbacks) so a run sees one behaviour")
    for s in scenarios:
        failed = [o for o in s.observations if not o.ok]
        if failed:
            notes.append(f"{s.name}: {len(failed)} of {len(s.observations)} requests failed"
                         f" ({failed[0].error})")
        if any(o.finish_reason == "length" for o in s.observations):
            notes.append(f"{s.name}: max_tokens cut some answers (finish_reason length)")
    return notes


def _id_notes(scenarios: Sequence[ScenarioResult], notes: list[str], meaning: str) -> None:
    for s in scenarios:
        if s.id_form == "other":
            notes.append(f"{s.name}: tool-call ids are not in the form the model writes (e.g."
                         f" {s.id_example!r}); {meaning}")


def _argument_notes(scenarios: Sequence[ScenarioResult], notes: list[str]) -> None:
    for s in scenarios:
        if s.arguments_json == "invalid":
            notes.append(f"{s.name}: some tool-call arguments are not valid JSON")
        if s.arguments == "trimmed":
            notes.append(f"{s.name}: the server trims whitespace around arguments (SPEC 7.3b)")
        elif s.arguments in ("reserialized", "changed"):
            notes.append(f"{s.name}: the server {s.arguments} the arguments: they are not the"
                         " text the model wrote")
    if any(s.calls_where == "structured" and s.arguments == "unknown" for s in scenarios):
        notes.append("structured calls without the model's token ids: whether the arguments"
                     " and their whitespace are verbatim cannot be told (reported unknown);"
                     " --return-token-ids on a vLLM endpoint allows the comparison")


def _count_notes(
    scenarios: Sequence[ScenarioResult], notes: list[str], tokenizer: str | None
) -> None:
    if tokenizer is None:
        notes.append("no --tokenizer: usage token counts were not compared with ours")
        return
    for s in scenarios:
        if any(s.prompt_offsets):
            notes.append(f"{s.name}: usage.prompt_tokens - our prompt = {_join(s.prompt_offsets)}"
                         f" with tokenizer {tokenizer}: another tokenizer or template (tools"
                         " as JSON, an injected system prompt)")
        if any(s.completion_offsets) and s.recoverable is not False:
            notes.append(f"{s.name}: usage.completion_tokens - rebuilt completion ="
                         f" {_join(s.completion_offsets)}")


def _join(values: Sequence[int]) -> str:
    return ", ".join(f"{v:+d}" for v in values)


# The probe's own findings, in the order of their lines; the traits a family declares
# (`ProbeRules.traits`) bring their own words.
FINDING_WORDS = {
    "renumbers_tool_ids": ("rebuilds tool-call ids with the running count of earlier calls",
                           "returns tool-call ids as the model wrote them"),
    "deletes_no_content": ("deletes the placeholder content beside tool calls",
                           "keeps the placeholder content"),
    "splits_reasoning": ("returns reasoning in its own field",
                         "returns the output unsplit: reasoning and its end stay in content"),
    "counts_stop_token": ("counts the stop token in usage.completion_tokens",
                          "does not count the stop token in usage.completion_tokens"),
    "ends_reasoning_at_tools": ("ends the reasoning where a tool section opens inside it, and"
                                " parses the calls",
                                "leaves a tool section opened inside the thinking in the"
                                " reasoning text"),
    "forces_reasoning": ("treats the output as reasoning even with thinking off",
                         "honours thinking off"),
    "returns_logprobs": ("returns logprobs naming every generated token (the run asks for them:"
                         " evidence `logprobs`)",
                         "returns no logprobs (or refuses them)"),
}


def finding_words(rules: ProbeRules | None) -> dict[str, tuple[str, str]]:
    """`FINDING_WORDS` in the format's terms (`rules`: its probe rules; None: no format's): its
    id form, its placeholder, its reasoning end, its stop token."""
    if rules is None:
        return FINDING_WORDS
    words = dict(FINDING_WORDS)
    form = rules.id_form
    renumbered = (form.replace("IDX", "{earlier calls + index}") if "IDX" in form
                  else "the running count of earlier calls")
    words["renumbers_tool_ids"] = (f"rebuilds tool-call ids as {renumbered}",
                                   words["renumbers_tool_ids"][1])
    if rules.placeholder is not None:
        words["deletes_no_content"] = (
            f"deletes the placeholder content `{rules.placeholder}` beside tool calls",
            f"keeps the placeholder content `{rules.placeholder}`")
    words["splits_reasoning"] = (words["splits_reasoning"][0],
                                 "returns the output unsplit: reasoning and"
                                 f" `{rules.reasoning_end}` stay in content")
    stop = rules.stop_token
    words["counts_stop_token"] = (f"counts {stop} in usage.completion_tokens",
                                  f"does not count {stop} in usage.completion_tokens")
    return words


def finding_notes(findings: ParserFindings, rules: ProbeRules | None = None) -> list[str]:
    """One line per parser finding: what it is, and what the answers showed (`rules`: the
    format's probe rules, for its words and its family's traits). A family trait's line
    follows the parsers' findings; one that changes the counts (`recount`: what the server
    adds to the text, not how it parses it) comes after the logprobs'."""
    declared = rules.traits if rules is not None else ()
    parsers = [(t.name, t.when_true, t.when_false) for t in declared if t.recount is None]
    added = [(t.name, t.when_true, t.when_false) for t in declared if t.recount is not None]
    lines: list[tuple[str, str, str, bool | None]] = []
    for name, (yes, no) in finding_words(rules).items():
        if name == "returns_logprobs":
            lines += [(n, y, f, findings.family.get(n)) for n, y, f in parsers]
        lines.append((name, yes, no, getattr(findings, name)))
    lines += [(n, y, f, findings.family.get(n)) for n, y, f in added]
    out = []
    for name, yes, no, value in lines:
        what = yes if value is True else no if value is False else "unknown"
        out.append(f"{name}: {what} ({findings.evidence.get(name, 'no evidence')})")
    return out
