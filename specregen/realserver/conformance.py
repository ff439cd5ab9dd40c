"""The emulator held against the real vLLM, and reconstruction measured against it.

Each `RealCase` (a family's fidelity corpus: a request and the ids the model writes) is
scripted into the real server and sent to it, plain and streamed, once with the server's
defaults and once with the options specregen's client sends (`client_options`). The same ids
and request go through the emulator's profile for that server (the family's served side,
`answer_ids`, then the emulator's body and stream framing). Both answers are read the way the
client reads them (a body, or the stream assembled by `wire.stream`), and compared field by
field (`face`): message fields, tool calls, finish reason, usage, token ids, and where the
stream's content stood relative to each call.

The real answers are also rebuilt blind (no server ids, as a hosted API answers) by
`reconstruct` and compared with the scripted ids, and the prompt we render with the server's
`prompt_token_ids`.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

from specregen.emulator import fidelity
from specregen.emulator.fidelity import Outcome, blind_body, compare
from specregen.logprobs import ids_from_logprobs
from specregen.models.chat_format import ChatFormat, RealVllmSpec
from specregen.models.corpus import RealCase
from specregen.models.registry import get_server
from specregen.models.tokenizer import Tokenizer
from specregen.probe.model import ProviderProfile
from specregen.realserver.server import MAX_NUM_SEQS, RealServerError, VllmServer
from specregen.reconstruct import reconstruct
from specregen.records import ProviderTraits, TokenSample
from specregen.wire.request import SERVER_TEXT_OPTIONS
from specregen.wire.response import STREAM_KEY
from specregen.wire.stream import assemble_lines

VARIANTS = ("defaults", "client")
# Random parts of a server's answer that no two servers share: its tool-call ids'
# hex (vLLM's `chatcmpl-tool-<hex>`), compared by form.
_RANDOM_HEX = re.compile(r"[0-9a-f]{16,}")


def client_options(dialect: str = "vllm") -> dict[str, Any]:
    """What specregen's client adds to a request for a self-hosted server of `dialect`."""
    return dict(SERVER_TEXT_OPTIONS.get(dialect, {}))


def real_cases(spec: RealVllmSpec, tok: Tokenizer, n: int, seed: int = 0) -> list[RealCase]:
    """The family's fidelity corpus (found by its name), drawn for the profile that restates
    this server."""
    return list(fidelity.real_cases(spec.format_name, tok, n, seed, spec.emulator_profile))


def sent_request(case: RealCase, variant: str, stream: bool, *, token_ids: bool = True
                 ) -> dict[str, Any]:
    """The body sent for `case` in `variant`, plain or streamed. The true ids come back
    (`return_token_ids`) for the comparison; the blind reading drops them."""
    body = dict(case.request)
    if variant == "client":
        # What the client sends to a vLLM whose probe found logprobs (it does: they name every
        # token as `token_id:N`).
        body.update(client_options(), logprobs=True, return_tokens_as_token_ids=True)
    if token_ids:
        body["return_token_ids"] = True
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


# ---------------------------------------------------------------------------------------------
# Asking


def ask_real(server: VllmServer, body: dict[str, Any], timeout_s: float = 300.0
             ) -> dict[str, Any]:
    """The answer as the client ends up with it: the body, or the stream assembled."""
    url = server.base_url + "/v1/chat/completions"
    if not body.get("stream"):
        response = httpx.post(url, json=body, timeout=timeout_s)
        if response.status_code != 200:
            return {"error": {"status": response.status_code, "text": response.text[:500]}}
        return response.json()
    lines: list[str] = []
    with httpx.stream("POST", url, json=body, timeout=timeout_s) as response:
        if response.status_code != 200:
            return {"error": {"status": response.status_code,
                              "text": response.read().decode(errors="replace")[:500]}}
        lines.extend(response.iter_lines())
    assembled, done = assemble_lines(lines)
    if not done:
        raise RealServerError(f"the real server's stream for {body.get('model')} ended "
                              "without [DONE]")
    return assembled


def ask_emulator(spec: RealVllmSpec, tok: Tokenizer, case: RealCase, body: dict[str, Any],
                 index: int = 0) -> dict[str, Any]:
    """What the emulator's profile for this server answers to the same ids and request."""
    server = get_server(spec.format_name, tok)
    if server is None:  # every real-vLLM spec names a format with a served side
        raise ValueError(f"the {spec.format_name} format has no served side to emulate")
    return fidelity.serve_ids(server, spec.emulator_profile, body, case.ids, case.max_tokens,
                              body.get("stream") is True, index)


# ---------------------------------------------------------------------------------------------
# Comparing


def face(body: dict[str, Any]) -> dict[str, Any]:
    """What a client can see of an answer, in a form two servers can be compared on."""
    if "error" in body and "choices" not in body:
        return {"error": body["error"].get("status")}
    choice = body["choices"][0]
    message = choice.get("message") or {}
    reasoning_field = next((k for k in ("reasoning", "reasoning_content")
                            if message.get(k) is not None), None)
    usage = body.get("usage") or {}
    details = usage.get("completion_tokens_details") or {}
    stream = choice.get(STREAM_KEY) or {}
    return {
        "reasoning": message.get(reasoning_field) if reasoning_field else None,
        "reasoning_field": reasoning_field,
        "content": message.get("content"),
        "tool_calls": [
            (_RANDOM_HEX.sub("#", str(c.get("id"))), c["function"]["name"],
             c["function"]["arguments"])
            for c in message.get("tool_calls") or ()
        ],
        "finish_reason": choice.get("finish_reason"),
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
        "reasoning_tokens": details.get("reasoning_tokens"),
        "token_ids": choice.get("token_ids"),
        "prompt_token_ids": body.get("prompt_token_ids"),
        "content_at_calls": stream.get("content_at_calls"),
    }


def differences(real: dict[str, Any], emulated: dict[str, Any]) -> list[str]:
    """The fields on which the two answers differ."""
    a, b = face(real), face(emulated)
    return [name for name in a if a[name] != b.get(name)]


# ---------------------------------------------------------------------------------------------
# Measuring


Pass = str  # "blind" (no provider traits), "probed" (the probe's traits), "logprobs"


@dataclass
class Row:
    """One family x mode x variant of the run."""

    answers: int = 0
    equal: int = 0
    differs: Counter[str] = field(default_factory=Counter)  # field -> answers differing
    by_shape: dict[str, Counter[str]] = field(default_factory=dict)  # shape -> equal/differs
    outcomes: dict[Pass, Counter[Outcome]] = field(default_factory=dict)
    by_group: dict[Pass, dict[str, Counter[Outcome]]] = field(default_factory=dict)
    template: dict[Pass, Counter[Outcome]] = field(default_factory=dict)
    not_exact: dict[Pass, Counter[str]] = field(default_factory=dict)  # template, by reason
    prompt_equal: int = 0
    evidence: dict[Pass, Counter[str]] = field(default_factory=dict)
    logprob_ids: Counter[str] = field(default_factory=Counter)  # equal / differ / undecided
    examples: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Measure:
    """One reconstruction of a real answer, compared with the scripted ids."""

    sample: TokenSample
    outcome: Outcome


@dataclass
class Result:
    case: RealCase
    variant: str
    stream: bool
    real: dict[str, Any]
    emulated: dict[str, Any]
    diffs: list[str]
    measures: dict[Pass, Measure] = field(default_factory=dict)
    prompt_equal: bool | None = None
    # The ids the logprobs name equal the server's token ids (None: they cannot decide).
    logprob_ids_equal: bool | None = None

    @property
    def outcome(self) -> Outcome | None:
        blind = self.measures.get("blind")
        return blind.outcome if blind is not None else None


def measure(fmt: ChatFormat, case: RealCase, body: dict[str, Any], answer: dict[str, Any],
            truth_prompt: list[int], completion: list[int],
            traits: ProviderTraits | None) -> Measure:
    sample = reconstruct(case.sample_id, body, answer, fmt, traits=traits)
    if sample.status == "error":
        return Measure(sample, "error")
    truth = list(truth_prompt) + list(completion)
    kind, _ = compare(fmt.tok, sample.input_ids, truth, sample.prompt_len, len(truth_prompt))
    if sample.status == "ok":
        by_kind: dict[str, Outcome] = {"exact": "ok", "resplit": "ok_resplit"}
        outcome: Outcome = by_kind.get(kind, "wrong_ok")
    else:
        outcome = "false_alarm" if kind == "exact" else "flagged_right"
    return Measure(sample, outcome)


def run_case(server: VllmServer, fmt: ChatFormat, case: RealCase, variant: str, stream: bool,
             index: int, traits: dict[str, ProviderTraits | None] | None,
             real: dict[str, Any]) -> Result:
    """One case's real answer (`real`, to `sent_request`) beside the emulator's; the real
    answer rebuilt without server ids (`blind`), with the probe's traits for the variant
    (`probed`, when given), and from its logprobs alone (`logprobs`, when they came back)."""
    body = sent_request(case, variant, stream)
    emulated = ask_emulator(server.spec, fmt.tok, case, body, index)
    result = Result(case, variant, stream, real, emulated, differences(real, emulated))
    if "choices" not in real:
        return result
    truth_prompt = real.get("prompt_token_ids") or []
    completion = real["choices"][0].get("token_ids") or []
    expected = list(case.ids[:case.max_tokens] if case.max_tokens else case.ids)
    if completion != expected:
        raise RealServerError(f"{case.sample_id}: the server answered other ids than scripted "
                              f"({len(completion)} vs {len(expected)}); misses: "
                              f"{server.misses()[-3:]}")
    blind = blind_body(real)
    blind.get("choices", [{}])[0].pop("logprobs", None)
    result.measures["blind"] = measure(fmt, case, body, blind, truth_prompt, completion, None)
    probed = (traits or {}).get(variant)
    if probed is not None:
        result.measures["probed"] = measure(fmt, case, body, blind, truth_prompt, completion,
                                            probed)
    logprobs = real["choices"][0].get("logprobs")
    if logprobs:
        named = ids_from_logprobs(logprobs.get("content") or [], fmt.tok,
                                  (real.get("usage") or {}).get("completion_tokens"))
        result.logprob_ids_equal = None if named.ids is None else named.ids == completion
        result.measures["logprobs"] = measure(fmt, case, body, blind_body(real), truth_prompt,
                                              completion, probed)
    sample = result.measures["blind"].sample
    result.prompt_equal = list(sample.input_ids[:sample.prompt_len]) == list(truth_prompt)
    return result


def run(server: VllmServer, fmt: ChatFormat, cases: Sequence[RealCase],
        variants: Sequence[str] = VARIANTS, streams: Sequence[bool] = (False, True),
        traits: dict[str, ProviderTraits | None] | None = None, progress: Any = None,
        concurrency: int = MAX_NUM_SEQS) -> list[Result]:
    """Every case in every variant and mode, `concurrency` requests at a time (the server runs
    as many sequences at once); the scripts are written once, up front. `traits`: per variant,
    what the probe found (the `probed` pass). Only the requests run in threads: the emulator
    and reconstruction run here, one answer after the other, as they do in a run."""
    jobs = [(case, variant, stream) for case in cases for variant in variants
            for stream in streams]
    results: list[Result] = []
    with ThreadPoolExecutor(concurrency) as pool:
        prompts = list(pool.map(lambda c: server.prompt_ids(c.request), cases))
        server.script(zip(prompts, (c.ids for c in cases), strict=True))
        answers = pool.map(lambda job: ask_real(server, sent_request(*job)), jobs)
        for index, ((case, variant, stream), real) in enumerate(zip(jobs, answers,
                                                                    strict=True)):
            results.append(run_case(server, fmt, case, variant, stream, index, traits, real))
            if progress is not None:
                progress(len(results))
    replay_wrong(server, results, prompts=dict(zip((c.sample_id for c in cases), prompts,
                                                   strict=True)))
    return results


# What two answers of one server to one request may differ in without a reader seeing it: the
# completion ids (the point of the replay), and in a stream the reasoning count, which vLLM
# takes at whatever step the reasoning end reached the stream (timing, docs/vllm-0.32.md 10.1).
_UNSEEN_FIELDS = {False: ("token_ids",), True: ("token_ids", "reasoning_tokens")}


def replay_wrong(server: VllmServer, results: Sequence[Result],
                 prompts: dict[str, list[int]]) -> None:
    """Ask again, with our ids scripted as the model's, for every answer rebuilt `ok` with
    wrong ids. When the server gives the same answer (every field a client sees), the model's
    deviation is not in the answer at all: no reader without the server's ids could tell our
    reading from the truth, and the outcome is `unseen`. An answer that differs keeps
    `wrong_ok`: something in it could have told. The truth's script is restored after."""
    touched: set[str] = set()
    for r in results:
        for name, m in list(r.measures.items()):
            if m.outcome != "wrong_ok" or name == "logprobs":  # logprobs name every token
                continue
            ours = list(m.sample.input_ids[m.sample.prompt_len:])
            prompt = prompts[r.case.sample_id]
            server.script([(prompt, ours)])
            touched.add(r.case.sample_id)
            again = ask_real(server, sent_request(r.case, r.variant, r.stream))
            seen = [f for f in differences(r.real, again) if f not in _UNSEEN_FIELDS[r.stream]]
            if not seen and "choices" in again:
                r.measures[name] = Measure(m.sample, "unseen")
    by_id = {r.case.sample_id: r.case for r in results}
    server.script((prompts[i], by_id[i].ids) for i in sorted(touched))


def tally(results: Sequence[Result]) -> dict[tuple[str, str], Row]:
    rows: dict[tuple[str, str], Row] = {}
    for r in results:
        row = rows.setdefault(("stream" if r.stream else "plain", r.variant), Row())
        row.answers += 1
        shape = row.by_shape.setdefault(r.case.shape, Counter())
        if r.diffs:
            row.differs.update(r.diffs)
            shape["differs"] += 1
            if len(row.examples) < 5:
                row.examples.append({"case": r.case.sample_id, "shape": r.case.shape,
                                     "fields": {d: [face(r.real).get(d), face(r.emulated).get(d)]
                                                for d in r.diffs}})
        else:
            row.equal += 1
            shape["equal"] += 1
        for name, m in r.measures.items():
            row.outcomes.setdefault(name, Counter())[m.outcome] += 1
            row.by_group.setdefault(name, {}).setdefault(r.case.group(r.stream),
                                                         Counter())[m.outcome] += 1
            row.evidence.setdefault(name, Counter())[m.sample.evidence or "n/a"] += 1
            if r.case.template_shaped:
                row.template.setdefault(name, Counter())[m.outcome] += 1
                if m.outcome != "ok":
                    reason = ",".join(sorted(m.sample.flags)) or m.outcome
                    row.not_exact.setdefault(name, Counter())[reason] += 1
        if r.logprob_ids_equal is not None:
            row.logprob_ids["equal" if r.logprob_ids_equal else "differ"] += 1
        elif "logprobs" in r.measures:
            row.logprob_ids["undecided"] += 1
        if r.prompt_equal:
            row.prompt_equal += 1
    return rows


def conformance_table(results: Sequence[Result]) -> str:
    """shape x {plain, stream} x {equal, differs}, per variant."""
    cells: dict[tuple[str, str, str], Counter[str]] = {}
    for r in results:
        key = (r.case.shape, "stream" if r.stream else "plain", r.variant)
        cells.setdefault(key, Counter())["differs" if r.diffs else "equal"] += 1
    shapes = sorted({k[0] for k in cells})
    cols = [(m, v) for v in VARIANTS for m in ("plain", "stream")]
    head = f"{'shape':<14}" + "".join(f"{m + '/' + v:>22}" for m, v in cols)
    lines = [head, "-" * len(head)]
    for shape in shapes:
        row = f"{shape:<14}"
        for m, v in cols:
            c = cells.get((shape, m, v), Counter())
            row += f"{str(c['equal']) + ' eq / ' + str(c['differs']) + ' diff':>22}"
        lines.append(row)
    return "\n".join(lines)


def dump(results: Sequence[Result]) -> Iterator[str]:
    """One JSON line per answer that differs or is not exactly rebuilt (for reading later)."""
    for r in results:
        if not r.diffs and all(m.outcome == "ok" for m in r.measures.values()):
            continue
        yield json.dumps({
            "case": r.case.sample_id, "shape": r.case.shape, "variant": r.variant,
            "stream": r.stream, "diffs": {d: [face(r.real).get(d), face(r.emulated).get(d)]
                                          for d in r.diffs},
            "outcomes": {k: m.outcome for k, m in r.measures.items()},
            "flags": {k: list(m.sample.flags) for k, m in r.measures.items()},
            "request": r.case.request, "ids": list(r.case.ids),
            "max_tokens": r.case.max_tokens,
        }, ensure_ascii=False)


def probe_profile(server: VllmServer, fmt: ChatFormat, variant: str, requests: int = 2
                  ) -> ProviderProfile:
    """What specregen's endpoint probe finds about the real server, asked the way `variant`
    asks (the server's defaults, or the client's options), through the scripting proxy (the
    emulator's model decides what it writes)."""
    from specregen.client.config import EndpointConfig
    from specregen.probe.run import probe_endpoint
    from specregen.probe.scenarios import build_scenarios, rules_of
    from specregen.realserver.proxy import ScriptingProxy

    front = ScriptingProxy.for_server(server, fmt.tok, tool_call_rate=1.0)
    running = front.serve()
    try:
        cfg = EndpointConfig.load({
            "base_url": running.url, "model": server.spec.served_model_name,
            "dialect": "vllm", "format": server.spec.format_name, "stream": False,
            "text_as_written": variant == "client"})
        scenarios = build_scenarios(requests, rules=rules_of(cfg.format_name))
        profile = probe_endpoint(cfg, None, scenarios, fmt=fmt,
                                 tokenizer=fmt.tok.source)
    finally:
        running.stop()
    return profile
