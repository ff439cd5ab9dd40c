"""A family's fidelity corpus as the harnesses read it: answers written the way the model can
write them (its template's layout and the ways a sampled model leaves it), each with its
request.

A family's writer lives in its package (`models/<family>/corpus.py`, declared on its descriptor:
`Family.make_corpus`, found by name with `registry.fidelity_corpus`) and names its markers.
The harnesses name none: the emulator's (`emulator/fidelity.py`) serves each answer through a
profile's parsers and framing, rebuilds it and classifies the outcome; the real server's
(`realserver/conformance.py`) scripts the ids into a real vLLM (`RealCase`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

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


class FidelityCorpus(Protocol):
    """What a family's corpus tells the harnesses."""

    @property
    def profiles(self) -> tuple[str, ...]:
        """The emulator profiles its answers are served by (the family's restated servers)."""
        ...

    @property
    def shapes(self) -> Sequence[str]:
        """Its answer shapes' names (what `draw(shapes=...)` may pick from)."""
        ...

    @property
    def gated_groups(self) -> tuple[str, ...]:
        """The groups in which an `ok` with wrong ids fails the bench (the others hold what
        the server's answer does not carry: reported, not gated)."""
        ...

    @property
    def refusals(self) -> tuple[type[Exception], ...]:
        """What its servers raise for a request they refuse (a 400): nothing to rebuild."""
        ...

    def group(self, shape: str, profile: str | None = None, stream: bool | None = None
              ) -> str:
        """`headline`, `adversarial` or `erased` for an answer of `shape` served by
        `profile`, plain or streamed."""
        ...

    def probed_traits(self, profile: str, stream: bool) -> ProviderTraits:
        """What the endpoint probe learns of `profile` (the bench's `traits` pass)."""
        ...

    def draw(self, tok: Tokenizer, n: int, seed: int = 0,
             shapes: Sequence[str] | None = None) -> Iterator[Drawn]:
        """`n` random answers and their requests, the same for the same seed."""
        ...

    def request_for(self, drawn: Drawn, profile: str) -> dict[str, Any]:
        """The request a client sends `profile` for `drawn` (its thinking switch in the
        profile's dialect, `max_tokens` when cut)."""
        ...

    def real_case(self, tok: Tokenizer, drawn: Drawn, ids: Sequence[int], seed: int,
                  profile: str) -> RealCase:
        """`drawn` as the real server `profile` restates is asked it, with the ids the model
        wrote (`drawn.ids`, or those its served side wrote from the knobs)."""
        ...
