"""The fidelity harness: a family's corpus served through the emulator's profiles, rebuilt by
`reconstruct`, compared with the ids the emulated model really saw and wrote.

The corpus is the family's (`models/<family>/corpus.py`, found by family name:
`registry.fidelity_corpus`): random requests and the answers the model writes, each with its
shape. Each answer is served by the corpus' profiles, plain or streamed, through the emulator's
own response path: the ids the family wrote go through its served side's `answer_ids` (the
profile's restated parsers), or, for a served side that writes its ids itself
(`IdServedSide`), the emulator's model writes them with the shape's knobs (`EmulatorState`, as
the emulator's app does); then the profile's body or SSE frames (`response_body` /
`stream_frames`) and the client's SSE assembler. The truth is the emulator's
`prompt_token_ids` + `token_ids`; the blind pass removes them from the body first, as
OpenRouter never sends them, and only the reference pass hands them to `reconstruct`. Nothing
here names a family or a marker.

Outcomes: `ok` (ids equal the truth), `ok_resplit` (same text and specials, other BPE split),
`wrong_ok` (status ok, ids whose text or specials differ -- the number that must be zero),
`flagged_right` (flagged, and the ids are indeed wrong), `false_alarm` (flagged although the
ids equal the truth), `error`. Against a real server (specregen.realserver.conformance) a
`wrong_ok` becomes `unseen` when the server, scripted with our ids, gives the same answer: the
deviation is not in the answer at all, and no reader without the server's ids can see it.
"""

from __future__ import annotations

import copy
import random
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from specregen.emulator.app import EmulatorState
from specregen.emulator.config import EmulatorConfig, Profile
from specregen.emulator.generate import RequestError, request_keys
from specregen.emulator.profiles import (
    PROFILE_SPECS,
    Message,
    ResponseMeta,
    response_body,
    stream_frames,
)
from specregen.models.chat_format import ChatFormat, FormatError
from specregen.models.corpus import Drawn, FidelityCorpus, RealCase
from specregen.models.family import CompletionLike, GenerationLike, ServedSide
from specregen.models.registry import fidelity_corpus, get_server
from specregen.models.tokenizer import Tokenizer
from specregen.reconstruct import reconstruct
from specregen.records import TokenSample
from specregen.wire.stream import assemble_lines

Outcome = Literal["ok", "ok_resplit", "wrong_ok", "unseen", "flagged_right", "false_alarm",
                  "error"]
# The emulator corpus' table columns (`unseen` needs a real server to ask).
OUTCOMES: tuple[Outcome, ...] = ("ok", "ok_resplit", "wrong_ok", "flagged_right", "false_alarm",
                                 "error")
Pass = Literal["blind", "traits", "reference"]

@dataclass(frozen=True, slots=True)
class Case:
    sample_id: str
    profile: Profile
    stream: bool
    shape: str
    request: dict[str, Any]
    body: dict[str, Any]  # as the client assembles it, with the emulator's truth ids in it
    truth: tuple[int, ...]  # prompt + completion ids


@dataclass
class Tally:
    outcomes: Counter[Outcome] = field(default_factory=Counter)
    evidence: dict[Outcome, Counter[str]] = field(default_factory=dict)
    flags: Counter[str] = field(default_factory=Counter)  # flags on false alarms
    by_shape: dict[str, Counter[Outcome]] = field(default_factory=dict)
    wrong: list[tuple[Case, TokenSample, str]] = field(default_factory=list)

    def add(self, case: Case, sample: TokenSample, outcome: Outcome, where: str) -> None:
        self.outcomes[outcome] += 1
        self.by_shape.setdefault(case.shape, Counter())[outcome] += 1
        evidence = getattr(sample, "evidence", None) or "n/a"
        self.evidence.setdefault(outcome, Counter())[evidence] += 1
        if outcome == "false_alarm":
            self.flags.update(sample.flags)
        if outcome == "wrong_ok":
            self.wrong.append((case, sample, where))

    @property
    def total(self) -> int:
        return sum(self.outcomes.values())


# ---------------------------------------------------------------------------------------------
# Serving a corpus


def corpus_of(family: str) -> FidelityCorpus:
    """Family `family`'s corpus; ValueError when it has none."""
    corpus = fidelity_corpus(family)
    if corpus is None:
        raise ValueError(f"the {family} family has no fidelity corpus")
    return corpus


def frame(profile: Profile, message: Message, completion: CompletionLike, gen: GenerationLike,
          request: dict[str, Any], meta: ResponseMeta, stream: bool, rng: random.Random
          ) -> dict[str, Any]:
    """The body a client ends up with: `profile`'s plain body, or its stream assembled."""
    spec = PROFILE_SPECS[profile]
    if not stream:
        return response_body(spec, message, completion, gen, request, meta)
    frames = stream_frames(spec, message, completion, gen, request, meta, rng)
    body, done = assemble_lines((b"".join(frames).decode() + "data: [DONE]\n\n").splitlines())
    if not done:
        raise RuntimeError(f"the emulated stream for {profile} did not end with [DONE]")
    return body


def serve_ids(server: ServedSide, profile: Profile, request: dict[str, Any],
              ids: Sequence[int], max_tokens: int | None, stream: bool, index: int
              ) -> dict[str, Any]:
    """The body a client ends up with when the model wrote `ids` for `request`: the served
    side's `answer_ids` (`profile`'s parsers; call ids drawn from `index`), then the
    emulator's framing and the client's SSE assembly."""
    answer = server.answer_ids(PROFILE_SPECS[profile], request, ids, max_tokens, stream,
                               seed=index)
    meta = ResponseMeta(id=f"chatcmpl-{index:024x}", created=0, model=request["model"],
                        provider="emulator", price_prompt=0.0, price_completion=0.0)
    return frame(profile, answer.message, answer, answer, request, meta, stream,
                 random.Random(len(answer.ids)))


class Serving:
    """One family's answers served by the emulator: its served side, and the emulator states
    (per profile and knobs) of a served side that writes its ids itself."""

    def __init__(self, family: str, tok: Tokenizer, seed: int = 0) -> None:
        self.family = family
        self.tok = tok
        self.seed = seed
        self._server: ServedSide | None = None
        self._states: dict[tuple[str, tuple[tuple[str, float], ...]], EmulatorState] = {}

    @property
    def server(self) -> ServedSide:
        if self._server is None:
            server = get_server(self.family, self.tok)
            if server is None:
                raise ValueError(f"the {self.family} family has no served side")
            self._server = server
        return self._server

    def state(self, profile: Profile, drawn: Drawn) -> EmulatorState:
        """The emulator whose model writes `drawn`'s answer (its shape's knobs)."""
        key = (profile, tuple(sorted(drawn.knobs.items())))
        if key not in self._states:
            # The knobs are `EmulatorConfig` rates by name (it checks them).
            fields: dict[str, Any] = {"profile": profile, "seed": self.seed,
                                      "format": self.family, **drawn.knobs}
            self._states[key] = EmulatorState(EmulatorConfig(**fields), self.tok)
        return self._states[key]

    def written_ids(self, profile: Profile, drawn: Drawn, request: dict[str, Any]
                    ) -> tuple[int, ...]:
        """The ids the model writes for `drawn` (its own, or the emulator's model's)."""
        if drawn.ids is not None:
            return drawn.ids
        gen = self.state(profile, drawn).generation(request, request_keys(request))
        return tuple(gen.ids)

    def answer(self, profile: Profile, drawn: Drawn, request: dict[str, Any], stream: bool
               ) -> dict[str, Any]:
        """The body a client ends up with, plain or assembled from the stream."""
        if drawn.ids is not None:
            return serve_ids(self.server, profile, request, drawn.ids, drawn.max_tokens,
                             stream, drawn.index)
        state = self.state(profile, drawn)
        if state.id_server is None:
            raise TypeError(f"the {self.family} served side does not write its ids")
        keys = request_keys(request)
        gen = state.generation(request, keys)
        completion = state.id_server.view(gen, request.get("max_tokens"))
        message = state.id_server.message(state.spec, completion, gen, request, stream=stream)
        meta = ResponseMeta(id="chatcmpl-" + keys.distinct.hex()[:24], created=0,
                            model=request["model"], provider="emulator", price_prompt=0.0,
                            price_completion=0.0)
        return frame(profile, message, completion, gen, request, meta, stream,
                     random.Random(len(gen.ids)))


def cases(family: str, tok: Tokenizer, n: int, seed: int = 0,
          profiles: Sequence[Profile] | None = None, streams: Sequence[bool] = (False, True),
          shapes: Sequence[str] | None = None) -> Iterator[Case]:
    """`n` random answers of `family`'s corpus, each served by every profile (default: the
    corpus') plain and streamed; a request a server refuses (a 400) is left out."""
    corpus = corpus_of(family)
    serving = Serving(family, tok, seed)
    refused: tuple[type[Exception], ...] = (RequestError, FormatError, *corpus.refusals)
    for drawn in corpus.draw(tok, n, seed, shapes):
        for profile in profiles or corpus.profiles:
            base = corpus.request_for(drawn, profile)
            for stream in streams:
                # The client sends `stream: true` for a streamed answer; reconstruction
                # may read it (the emulator's model ignores it).
                sent = {**base, "stream": True} if stream else base
                try:
                    body = serving.answer(profile, drawn, sent, stream)
                except refused:
                    continue  # nothing to rebuild
                truth = tuple(body["prompt_token_ids"]) + tuple(body["choices"][0]["token_ids"])
                yield Case(f"{drawn.index}-{profile}-{'s' if stream else 'p'}", profile,
                           stream, drawn.shape, sent, body, truth)


# ---------------------------------------------------------------------------------------------
# Measuring


def blind_body(body: dict[str, Any]) -> dict[str, Any]:
    """The body without the ids only the emulator (and some vLLM builds) return."""
    out = copy.deepcopy(body)
    out.pop("prompt_token_ids", None)
    for choice in out.get("choices", []):
        choice.pop("token_ids", None)
    return out


def _specials(tok: Tokenizer, ids: Sequence[int]) -> list[int]:
    return [i for i in ids if tok.is_added(i)]


def compare(tok: Tokenizer, ours: Sequence[int], truth: Sequence[int], prompt_len: int,
            truth_prompt_len: int) -> tuple[str, str]:
    """(kind, where): kind is exact | resplit | text | specials; where is prompt | completion."""
    if list(ours) == list(truth):
        return "exact", ""
    where = "prompt" if list(ours[:prompt_len]) != list(truth[:truth_prompt_len]) else "completion"
    if _specials(tok, ours) != _specials(tok, truth):
        return "specials", where
    if tok.decode_bytes(list(ours)) != tok.decode_bytes(list(truth)):
        return "text", where
    return "resplit", where


def measure(corpus: FidelityCorpus, case: Case, fmt: ChatFormat, how: Pass
            ) -> tuple[TokenSample, Outcome, str]:
    """`case` rebuilt in pass `how` and its outcome, with where the ids differ."""
    truth = case.truth
    truth_prompt_len = len(case.body["prompt_token_ids"])
    if how == "reference":
        sample = reconstruct(case.sample_id, case.request, case.body, fmt,
                             reference_completion_ids=case.body["choices"][0]["token_ids"])
    else:
        traits = corpus.probed_traits(case.profile, case.stream) if how == "traits" else None
        sample = reconstruct(case.sample_id, case.request, blind_body(case.body), fmt,
                             traits=traits)
    if sample.status == "error":
        return sample, "error", sample.error or ""
    kind, where = compare(fmt.tok, sample.input_ids, truth, sample.prompt_len, truth_prompt_len)
    if sample.status == "ok":
        by_kind: dict[str, Outcome] = {"exact": "ok", "resplit": "ok_resplit"}
        outcome: Outcome = by_kind.get(kind, "wrong_ok")
    else:
        outcome = "false_alarm" if kind == "exact" else "flagged_right"
    return sample, outcome, f"{kind}:{where}" if where else kind


def run(corpus: FidelityCorpus, cases: Sequence[Case], fmt: ChatFormat, how: Pass
        ) -> dict[tuple[str, bool], Tally]:
    tallies: dict[tuple[str, bool], Tally] = {}
    for case in cases:
        sample, outcome, where = measure(corpus, case, fmt, how)
        tallies.setdefault((case.profile, case.stream), Tally()).add(case, sample, outcome,
                                                                      where)
    return tallies


def table(tallies: dict[tuple[str, bool], Tally]) -> str:
    head = f"{'profile':<15} {'mode':<6} {'n':>5} " + " ".join(f"{o:>13}" for o in OUTCOMES)
    lines = [head, "-" * len(head)]
    for (profile, stream), tally in sorted(tallies.items()):
        row = f"{profile:<15} {'stream' if stream else 'plain':<6} {tally.total:>5} "
        row += " ".join(f"{tally.outcomes[o]:>13}" for o in OUTCOMES)
        lines.append(row)
    return "\n".join(lines)


def describe_wrong(tally: Tally, limit: int = 5) -> list[str]:
    out = []
    for case, sample, where in tally.wrong[:limit]:
        out.append(f"{case.sample_id} shape={case.shape} diff={where} flags={sample.flags} "
                   f"evidence={getattr(sample, 'evidence', None)}")
    return out


# ---------------------------------------------------------------------------------------------
# The corpus for a real server (specregen.realserver): the same requests and answers, as the
# ids the model writes, for a real vLLM's scripted model to answer with.


def real_cases(family: str, tok: Tokenizer, n: int, seed: int, profile: Profile
               ) -> Iterator[RealCase]:
    """`n` random answers of `family`'s corpus, drawn as `cases` draws them, for the real
    server `profile` restates (a served side that writes its ids writes them as that
    profile's model)."""
    corpus = corpus_of(family)
    serving = Serving(family, tok, seed)
    for drawn in corpus.draw(tok, n, seed, None):
        try:
            ids = serving.written_ids(profile, drawn, corpus.request_for(drawn, profile))
        except (RequestError, FormatError):
            continue
        yield corpus.real_case(tok, drawn, ids, seed, profile)
