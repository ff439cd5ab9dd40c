"""The fast version of bench/fidelity.py: a few hundred random K2.5 answers (its corpus,
models/kimi_k25/corpus.py) through the five upstream profiles, plain and streamed, rebuilt blind
(no reference ids, no provider traits, as from OpenRouter). A sample called `ok` must carry the
ids the model saw and wrote."""

from __future__ import annotations

from collections import Counter

import pytest

from specregen.emulator import fidelity
from specregen.emulator.fidelity import corpus_of, describe_wrong, run, table
from specregen.models.kimi_k25 import KimiK25
from specregen.models.tokenizer import load_tokenizer

TOK = load_tokenizer("mini")
FMT = KimiK25(TOK)
CORPUS = corpus_of("kimi-k2.5")


@pytest.fixture(scope="module")
def cases():
    # The corpus' profiles: the restated upstream parsers.
    return list(fidelity.cases("kimi-k2.5", TOK, 60, seed=0))


def test_corpus_covers_the_behaviours(cases):
    # The corpus really exercises what the upstream parsers treat unevenly.
    assert len(cases) >= 300
    shapes = Counter(c.shape for c in cases)
    assert set(shapes) == set(CORPUS.shapes)
    with_history = [c for c in cases if any(m.get("tool_calls") for m in c.request["messages"])]
    instant = [c for c in cases if c.request.get("chat_template_kwargs")]
    calls = [c for c in cases if c.body["choices"][0].get("token_ids")
             and TOK.token_id("<|tool_calls_section_begin|>") in c.body["choices"][0]["token_ids"]]
    assert with_history and instant and len(calls) > len(cases) // 4


@pytest.mark.parametrize("how", ["blind", "traits"])
def test_no_headline_sample_is_ok_with_wrong_ids(cases, how):
    # Blind (as from OpenRouter) and with the traits a probe finds. The adversarial group
    # (count-invisible deviations, coincidences of two) is the documented known limit.
    headline = [c for c in cases if CORPUS.group(c.shape, c.profile, c.stream) == "headline"]
    tallies = run(CORPUS, headline, FMT, how)
    wrong = {key: describe_wrong(t) for key, t in tallies.items() if t.outcomes["wrong_ok"]}
    assert not wrong, table(tallies) + "\n" + "\n".join(
        f"{profile} {'stream' if stream else 'plain'}: {line}"
        for (profile, stream), lines in wrong.items() for line in lines)


def test_few_headline_false_alarms_with_the_probe_traits(cases):
    # Flagged although the ids are right: with what a probe finds, the headline group's
    # false alarms stay well under the 13% the issue started from (bench/fidelity.py
    # measures the larger corpus; 25% before the stream's content order was recorded and
    # before a rival needing two coincidences stopped counting as a doubt).
    headline = [c for c in cases if CORPUS.group(c.shape, c.profile, c.stream) == "headline"]
    total = Counter()
    for tally in run(CORPUS, headline, FMT, "traits").values():
        total.update(tally.outcomes)
    right = total["ok"] + total["ok_resplit"] + total["false_alarm"]
    assert total["false_alarm"] <= 0.1 * right, total
