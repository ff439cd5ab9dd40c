"""A family's fidelity corpus as the harnesses read it: answers written the way the model can
write them (its template's layout and the ways a sampled model leaves it), each with its
request.

A family's writer lives in its package (`models/<family>/corpus.py`, declared on its descriptor:
`Family.make_corpus`, found by name with `registry.fidelity_corpus`) and names its markers; its
`make_corpus` fills a `FidelityCorpus` (plain values and the module's functions).
The harnesses name none: the emulator's (`emulator/fidelity.py`) serves each answer through a
profile's parsers and framing, rebuilds it and classifies the outcome; the real server's
(`realserver/conformance.py`) scripts the ids into a real vLLM (`RealCase`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specregen.models.tokenizer_base import Tokenizer
from specregen.records import ProviderTraits


@dataclass(frozen=True, slots=True)
class Drawn:
    """One answer of a corpus, before a profile serves it."""

    index: int
    shape: str  # its label, as the corpus groups it (e.g. with "+cut" when cut)
    # The request as drawn; `FidelityCorpus.request_for` puts it in a profile's dialect.
    request: dict[str, Any]
    # The ids the model writes, its stop id at the end. None: the family's served side writes
    # its ids itself (`IdServedSide`), asked with the emulator's model knobs `knobs`.
    ids: tuple[int, ...] | None
    max_tokens: int | None  # where the answer is cut
    template_shaped: bool  # the model wrote what its template expects (the real yield's base)
    # The thinking switch and effort, not yet in any dialect (None: left to the default).
    thinking: bool | None = None
    effort: str | None = None
    knobs: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class RealCase:
    """One answer of a family's fidelity corpus, to be scripted into a real server: the
    request as the model is asked (no stream or client flags), the ids the model writes (its
    stop id at the end), and where `max_tokens` cuts them."""

    sample_id: str
    shape: str
    # "headline", "adversarial" or "erased" (the corpus' own grouping), plain and streamed.
    groups: tuple[str, str]
    template_shaped: bool  # the model wrote what its template expects (the yield's base)
    request: dict[str, Any]
    ids: tuple[int, ...]
    max_tokens: int | None = None

    def group(self, stream: bool) -> str:
        return self.groups[stream]


@dataclass(frozen=True, slots=True)
class FidelityCorpus:
    """What a family's corpus tells the harnesses: its values, and the functions that draw its
    answers and put them to a profile (the family's `make_corpus` fills it from its module)."""

    # The emulator profiles its answers are served by (the family's restated servers).
    profiles: tuple[str, ...]
    # Its answer shapes' names (what `draw`'s `shapes` may pick from).
    shapes: tuple[str, ...]
    # The groups in which an `ok` with wrong ids fails the bench (the others hold what the
    # server's answer does not carry: reported, not gated).
    gated_groups: tuple[str, ...]
    # What its servers raise for a request they refuse (a 400): nothing to rebuild.
    refusals: tuple[type[Exception], ...]
    # (shape, profile, stream): `headline`, `adversarial` or `erased` for an answer of `shape`
    # served by `profile`, plain or streamed.
    group: Callable[[str, str, bool], str]
    # (profile, stream): what the endpoint probe learns of `profile` (the bench's `traits`
    # pass).
    probed_traits: Callable[[str, bool], ProviderTraits]
    # (tok, n, seed, shapes): `n` random answers and their requests, the same for the same
    # seed (shapes None: any of `shapes`).
    draw: Callable[[Tokenizer, int, int, Sequence[str] | None], Iterator[Drawn]]
    # (drawn, profile): the request a client sends `profile` for `drawn` (its thinking switch
    # in the profile's dialect, `max_tokens` when cut).
    request_for: Callable[[Drawn, str], dict[str, Any]]
    # (tok, drawn, ids, seed, profile): `drawn` as the real server `profile` restates is asked
    # it, with the ids the model wrote (`drawn.ids`, or those its served side wrote from the
    # knobs).
    real_case: Callable[[Tokenizer, Drawn, Sequence[int], int, str], RealCase]
