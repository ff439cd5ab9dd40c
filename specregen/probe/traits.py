"""What the provider's parsers do, read off the probe's answers: the `ParserFindings`.

The findings are the `ProviderTraits` reconstruction reads (records.py); which upstream parser
shows which trait is docs/upstream-parsers.md. Format facts (marker text, id form, placeholder)
were applied when the answers were observed (`classify.observe` with the format's probe rules).

Each finding collects votes from single answers; an answer votes only when it can tell. The
model's own token ids (a server that returns them) settle a vote exactly; without them, counts
and the shape of the returned fields do, where only one reading explains them.

* `counts_stop_token`: on answers that are a clean base for counting (`Observation.countable`:
  not truncated, nothing lost or moved that we can see, prompt counted as we count it), usage
  minus the returned fields assembled with the stop token is 0 when the provider counts the stop
  token and -1 when it does not. Losses only ever add (text the parser deleted, non-canonical
  splits), so the smallest offset decides: 0 -> true, -1 -> false, anything else -> unknown.
* `deletes_no_content`: returned content exactly the format's placeholder beside calls votes
  false; a
  countable answer with calls, empty content and usage exceeding our count by exactly the
  placeholder's tokens (after the stop token rule) votes true; so does the model's own text
  showing it wrote the placeholder the content lacks. (Text moved into the reasoning, as a
  forced reasoning parser does with thinking off, is not countable, so it cannot pass for a
  deletion.)
* `renumbers_tool_ids`: in the `history` scenario (two earlier calls), a model whose ids carry
  the running count writes `functions.get_weather:2`. A server that rebuilds ids as
  `{history + index written}` returns `:4`: returned IDX = 2 x history + i votes true,
  = history + i votes false; with the model's ids, returned = written + history votes true and
  returned = written votes false. One true vote wins: a false vote can also come from a
  renumbering server whose model happened to write a local index, a true vote has no other
  reading.
* `splits_reasoning`: thinking on, reasoning in its own field votes true; no reasoning and a
  literal `</think>` in content (the parser passed the output through, SGLang without forced
  reasoning) votes false. Disagreeing votes leave it unknown.
* `ends_reasoning_at_tools`: when the model opens its tool section before `</think>` (some
  models do, now and then), a forced reasoning parser ends the reasoning there and parses the
  calls; an unforced one leaves the section in the reasoning.
  With `tools` sent and thinking on: calls left as raw markers in the reasoning vote false;
  parsed calls that the model's ids show were opened inside its thinking vote true, and so do
  parsed calls after a reasoning with empty content whose usage is one token short of our
  count (we insert a `</think>` the model never wrote). The model may never do it in a probe:
  then it stays unknown.
* `forces_reasoning`: thinking off, reasoning text returned votes true (a parser that treats
  the output as reasoning whatever the request said); content without reasoning votes false.
* `returns_logprobs` (not a trait: it tells the run to ask for them): the `logprobs` scenario's
  answers carry logprobs that name every generated token (read with the format's tokenizer,
  specregen/logprobs.py) votes true; none returned, or the request refused, votes false;
  logprobs that leave tokens out or cannot name some (a provider that drops special tokens, a
  token cut inside a character sent as U+FFFD) leave it unknown, saying which.
* the traits the format's family declares (`ProbeRules.traits`, models/probe_rules.py
  `FamilyTrait`; K2.5's `spaces_around_added_tokens`, Qwen3's `strips_content_beside_calls`:
  their rules are in their families' probe.py) are voted with the family's own rules: one that
  changes what the answers' counts are (`recount`) first, and where found true the count
  findings above read each answer's `recount`; the others last, with `counts_stop_token` known.

A format whose call ids carry no running count (`ProbeRules.id_index` is always None: ids the
server makes) gives `renumbers_tool_ids` no vote, and says so; a format without a placeholder
gives `deletes_no_content` none either.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from specregen.models.probe_answer import Observation
from specregen.models.probe_rules import ProbeRules, TraitVotes, Verdict, vote
from specregen.probe.model import ParserFindings, ScenarioResult

HISTORY_SCENARIO = "history"
LOGPROBS_SCENARIO = "logprobs"


def infer_findings(
    scenarios: Sequence[ScenarioResult], rules: ProbeRules | None = None
) -> ParserFindings:
    """The findings from the scenarios' answers; `rules` (the format's probe rules) add the
    traits its family declares."""
    answered = [o for s in scenarios for o in s.observations if o.ok]
    findings = ParserFindings()
    evidence = findings.evidence
    declared = rules.traits if rules is not None else ()
    for trait in declared:
        if trait.recount is None:
            continue
        found, evidence[trait.name] = trait.vote(TraitVotes(answered, counts_stop_token=None))
        findings.family[trait.name] = found
        if found:
            # The counts are the model's text without what the server added.
            recount = trait.recount
            answered = [replace(o, raw_completion_offset=count)
                        if (count := recount(o)) is not None else o for o in answered]
    findings.counts_stop_token, evidence["counts_stop_token"] = _stop_token(answered)
    if rules is not None and not rules.placeholder:
        findings.deletes_no_content, evidence["deletes_no_content"] = None, (
            "the format has no placeholder content that a parser deletes")
    else:
        findings.deletes_no_content, evidence["deletes_no_content"] = _placeholder(
            answered, findings.counts_stop_token)
    history = [o for s in scenarios if s.name == HISTORY_SCENARIO for o in s.observations
               if o.ok]
    findings.renumbers_tool_ids, evidence["renumbers_tool_ids"] = _renumbering(history)
    end = rules.reasoning_end if rules is not None else "reasoning end"
    findings.splits_reasoning, evidence["splits_reasoning"] = _split(answered, end)
    findings.ends_reasoning_at_tools, evidence["ends_reasoning_at_tools"] = _ends_at_tools(
        answered, findings.counts_stop_token)
    findings.forces_reasoning, evidence["forces_reasoning"] = _forced(answered)
    for trait in declared:
        if trait.recount is None:
            findings.family[trait.name], evidence[trait.name] = trait.vote(
                TraitVotes(answered, findings.counts_stop_token))
    findings.returns_logprobs, evidence["returns_logprobs"] = _logprobs(scenarios)
    return findings


def _logprobs(scenarios: Sequence[ScenarioResult]) -> Verdict:
    asked = [o for s in scenarios for o in s.observations
             if o.logprobs_coverage is not None or (s.name == LOGPROBS_SCENARIO and not o.ok)]
    if not asked:
        return None, "not asked for (or no tokenizer to read them with)"
    whole = sum(1 for o in asked if o.logprobs_coverage == "all")
    partial = [o for o in asked if o.logprobs_coverage == "partial"]
    refused = sum(1 for o in asked if o.logprobs_coverage == "none" or not o.ok)
    seen = (f"asked {len(asked)} times: every token named {whole}, partly {len(partial)},"
            f" not returned or refused {refused}")
    if partial:
        return None, f"{seen} ({partial[0].logprobs_why})"
    return vote(whole, refused, seen, "")


def _stop_token(answered: Iterable[Observation]) -> Verdict:
    # Calls beside empty content are left out: a deleted placeholder (+n) or a section opened
    # inside the thinking (-1, our `</think>`) moves their count.
    offsets = [o.raw_completion_offset for o in answered
               if o.countable and o.raw_completion_offset is not None
               and not (o.tool_calls and o.content_kind in ("none", "empty"))]
    if not offsets:
        return None, "no answer was a clean base for counting (or no tokenizer was given)"
    low = min(offsets)
    seen = (f"usage - our count (with the stop token) on {len(offsets)} clean answers:"
            f" min {low:+d}")
    if low == 0:
        return True, seen
    if low == -1:
        return False, seen
    return None, seen + " (neither 0 nor -1: another tokenizer, or text we cannot see)"


def _placeholder(
    answered: Sequence[Observation], counts_stop_token: bool | None
) -> Verdict:
    kept = sum(1 for o in answered if o.tool_calls and o.content_kind == "placeholder")
    by_ids = sum(1 for o in answered
                 if o.tool_calls and o.wrote_placeholder and o.content_kind != "placeholder")
    by_count = 0
    if counts_stop_token is not None:
        base = 0 if counts_stop_token else -1
        by_count = sum(
            1 for o in answered
            if o.countable and o.tool_calls and o.content_kind in ("none", "empty")
            and o.wrote_placeholder is None
            and o.raw_completion_offset is not None and o.placeholder_tokens
            and o.raw_completion_offset - base == o.placeholder_tokens
            and o.calls_where == "structured"
        )
    deleted = by_ids + by_count
    seen = (f"placeholder returned beside calls: {kept}; deleted, by the model's ids: {by_ids},"
            f" by usage exceeding our count by its tokens: {by_count}")
    return vote(deleted, kept, seen, "the model never wrote it, or nothing could tell")


def _renumbering(history: Sequence[Observation]) -> Verdict:
    true = false = 0
    for o in history:
        h = o.history_tool_calls
        if not h or not o.returned_indices:
            continue
        written = o.written_indices
        for i, returned in enumerate(o.returned_indices):
            if returned is None:
                continue
            if written is not None and len(written) == len(o.returned_indices):
                w = written[i]
                if w is None:
                    continue
                true += returned == w + h
                false += returned == w
            else:
                true += returned == 2 * h + i
                false += returned == h + i
    seen = (f"history of {history[0].history_tool_calls if history else 0} calls: returned"
            f" ids explained by renumbering {true}, by the model's running count {false}")
    if true:
        return True, seen
    if false:
        return False, seen
    if any(o.returned_indices for o in history):
        # Calls came back, but no id carried an index: the format's ids are the server's own.
        return None, seen + " (no returned id carries a running count: nothing to renumber)"
    return None, seen + " (no call came back in the history scenario)"


def _split(answered: Iterable[Observation], end: str) -> Verdict:
    on = [o for o in answered if o.thinking is not False]
    split = sum(1 for o in on if o.reasoning_chars > 0)
    unsplit = sum(1 for o in on if o.reasoning_chars == 0 and o.think_end_in_content)
    seen = (f"thinking on: reasoning in its own field {split}, whole output in content with"
            f" a literal {end} {unsplit}")
    return vote(split, unsplit, seen, "no reasoning came back at all")


def _ends_at_tools(
    answered: Sequence[Observation], counts_stop_token: bool | None
) -> Verdict:
    on = [o for o in answered if o.tools_sent and o.thinking is not False]
    kept = sum(1 for o in on if o.calls_where == "raw_reasoning")
    by_ids = sum(1 for o in on if o.calls_where == "structured" and o.section_in_think)
    by_count = 0
    if counts_stop_token is not None:
        base = 0 if counts_stop_token else -1
        by_count = sum(
            1 for o in on
            if o.countable and o.calls_where == "structured" and o.section_in_think is None
            and o.reasoning_chars > 0 and o.content_kind in ("none", "empty")
            and o.raw_completion_offset is not None and o.raw_completion_offset - base == -1
        )
    ended = by_ids + by_count
    seen = (f"tool section opened inside the thinking: left in the reasoning {kept}; ended it"
            f" and parsed, by the model's ids {by_ids}, by a count one short {by_count}")
    return vote(ended, kept, seen, "the model closed its thinking first every time")


def _forced(answered: Iterable[Observation]) -> Verdict:
    off = [o for o in answered if o.thinking is False]
    forced = sum(1 for o in off if o.reasoning_chars > 0)
    plain = sum(1 for o in off if o.reasoning_chars == 0
                and (o.content_kind != "none" or o.tool_calls))
    seen = f"thinking off: reasoning returned {forced}, content or calls only {plain}"
    if forced:
        return True, seen
    if plain:
        return False, seen
    return None, seen + " (no thinking-off answer)"
