"""Each family's fidelity corpus, drawn and served for a fixed seed, is what it was: the same
requests, the same ids, the same answers from every profile, the same real-server cases.

The hashes were taken from the corpora as they were before they moved from the emulator into
their families (emulator/fidelity.py, fidelity_qwen3.py, fidelity_k3.py), so the benches'
numbers stay comparable across the move. A change that means to alter what a corpus writes, or
how the emulator serves it, updates the hash here and says why in its commit.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable

import pytest

from specregen.emulator.fidelity import Case, cases, real_cases
from specregen.models.corpus import RealCase
from specregen.models.registry import bundled_tokenizer
from specregen.models.tokenizer import load_tokenizer

N, SEED = 12, 5
# family -> ((served cases, hash), (real cases, hash))
EXPECTED = {
    "kimi-k2.5": ((120, "ac7769d70119a660"), (12, "f33a8df9bcf14c47")),
    "qwen3": ((72, "4c3029991ee0fc92"), (12, "d858b2fe945911bf")),
    "kimi-k3": ((48, "9ab72f8a50d74eae"), (12, "538de02af6649cb2")),
}
# The profile each family's real server is restated by (its `RealVllmSpec.emulator_profile`).
REAL_PROFILES = {"kimi-k2.5": "vllm", "qwen3": "vllm-hermes", "kimi-k3": "vllm-k3"}


def _case(c: Case) -> list[object]:
    return [c.sample_id, c.profile, c.stream, c.shape, c.request, c.body, list(c.truth)]


def _real(c: RealCase) -> list[object]:
    return [c.sample_id, c.shape, list(c.groups), c.template_shaped, c.request, list(c.ids),
            c.max_tokens]


def _digest(rows: Iterable[list[object]]) -> tuple[int, str]:
    # Key order counts (json.dumps keeps it): the requests are the same dicts, not just equal.
    digest = hashlib.sha256()
    n = 0
    for row in rows:
        digest.update(json.dumps(row, ensure_ascii=False).encode() + b"\n")
        n += 1
    return n, digest.hexdigest()[:16]


@pytest.mark.parametrize("family", sorted(EXPECTED))
def test_the_corpus_is_what_it_was(family: str) -> None:
    alias = bundled_tokenizer(family)
    assert alias is not None
    tok = load_tokenizer(alias)
    served, real = EXPECTED[family]
    assert _digest(map(_case, cases(family, tok, N, SEED))) == served
    assert _digest(map(_real, real_cases(family, tok, N, SEED, REAL_PROFILES[family]))) == real

