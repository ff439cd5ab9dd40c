"""Kimi K3 fidelity: the emulator serving K3 (profiles vllm-k3 and openrouter) and the answer-
shape corpus (models/kimi_k3/corpus.py, bench/fidelity_corpus.py --format kimi-k3) rebuild
to the model's true ids, never `ok` with wrong ones.

The emulator's ids come from the encoder's history rendering (`served.model_ids`), reconstruction
assembles from the fields (`format.completion_segments`): independent paths, so agreement is
evidence.
"""

from __future__ import annotations

from collections import Counter

import httpx
import pytest

from specregen.emulator.config import EmulatorConfig
from specregen.emulator.fidelity import blind_body, cases, compare, real_cases
from specregen.emulator.server import serve_in_thread
from specregen.models.kimi_k3 import KimiK3
from specregen.models.registry import fidelity_corpus
from specregen.models.tokenizer import load_tokenizer
from specregen.reconstruct import reconstruct
from tests.unit.test_emulator import assemble_sse

MODEL = "moonshotai/kimi-k3"
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "days": {"type": "integer"}}}}}]


@pytest.fixture(scope="module")
def k3() -> KimiK3:
    return KimiK3(load_tokenizer("mini-k3"))


@pytest.fixture(scope="module")
def conversations(tmp_path_factory: pytest.TempPathFactory):
    """The conversation test_emulator_conversations.py walks, as a prompt file."""
    import json

    from tests.unit.test_emulator_conversations import CONVERSATION

    path = tmp_path_factory.mktemp("conv") / "conversations.jsonl"
    path.write_text(json.dumps(CONVERSATION) + "\n", encoding="utf-8")
    return path


def _request(k: int, profile: str) -> dict:
    request: dict = {"model": MODEL, "return_token_ids": True,
                     "messages": [{"role": "user", "content": f"What is the weather, case {k}?"}]}
    if k % 3:
        request["tools"] = TOOLS
    if k % 4 == 1:
        if profile == "openrouter":
            request["reasoning"] = {"enabled": False}
        else:
            request["chat_template_kwargs"] = {"thinking": False}
    if k % 5 == 2:
        request["max_tokens"] = 40
    return request


@pytest.mark.parametrize("profile", ["vllm-k3", "openrouter"])
def test_emulated_k3_answers_rebuild_to_the_true_ids(k3: KimiK3, profile: str) -> None:
    config = EmulatorConfig(profile=profile, model=MODEL, seed=3, reasoning_tokens_mean=40,
                            content_tokens_mean=30)
    with_calls = truncated = 0
    with serve_in_thread(config, k3.tok) as emu:
        base = emu.openrouter_url if profile == "openrouter" else emu.url
        for k in range(16):
            request = _request(k, profile)
            plain = httpx.post(base + "/chat/completions", json=request, timeout=30).json()
            streamed, _ = assemble_sse(httpx.post(base + "/chat/completions",
                                                  json={**request, "stream": True},
                                                  timeout=30).text)
            for body, stream in ((plain, False), (streamed, True)):
                choice = body["choices"][0]
                truth = choice["token_ids"]
                prompt = body["prompt_token_ids"]
                with_calls += bool(choice["message"].get("tool_calls"))
                truncated += choice["finish_reason"] == "length"
                sent = {**request, "stream": stream}
                sample = reconstruct(f"s{k}", sent, body, k3, reference_completion_ids=truth)
                assert sample.reference_match == "exact", (k, stream, sample.flags)
                alone = reconstruct(f"s{k}", sent, blind_body(body), k3)
                assert alone.input_ids[:alone.prompt_len] == prompt, (k, stream)
                if alone.status == "ok":
                    assert alone.input_ids[alone.prompt_len:] == truth, (k, stream, alone.flags)
    assert with_calls >= 4 and truncated >= 2


def test_the_emulator_serves_k3_with_its_profiles_only(k3: KimiK3) -> None:
    from specregen.emulator.app import create_app

    with pytest.raises(ValueError, match="vllm-k3, openrouter"):
        create_app(EmulatorConfig(profile="vllm-hermes", model=MODEL), k3.tok)
    create_app(EmulatorConfig(model=MODEL), k3.tok)  # openrouter, the default profile


def test_the_corpus_is_never_ok_with_wrong_ids(k3: KimiK3) -> None:
    """bench/fidelity_corpus.py's measure on a small K3 corpus: no headline or adversarial
    answer is `ok` with ids other than the truth, blind or with the probe's traits; nor any with the
    server's ids."""
    corpus = fidelity_corpus("kimi-k3")
    assert corpus is not None
    outcomes: Counter[str] = Counter()
    for case in cases("kimi-k3", k3.tok, 60, seed=11):
        for how in ("blind", "traits"):
            sample = reconstruct(case.sample_id, case.request, blind_body(case.body), k3,
                                 traits=corpus.probed_traits(case.profile, case.stream)
                                 if how == "traits" else None)
            kind, _ = compare(k3.tok, sample.input_ids, case.truth, sample.prompt_len,
                              len(case.body["prompt_token_ids"]))
            name = corpus.group(case.shape, case.profile, case.stream)
            if sample.status == "ok" and kind not in ("exact", "resplit"):
                outcomes[f"wrong_ok/{name}"] += 1
            outcomes[f"{sample.status}/{name}"] += 1
        reference = reconstruct(case.sample_id, case.request, case.body, k3,
                                reference_completion_ids=case.body["choices"][0]["token_ids"])
        if reference.status == "ok":
            assert reference.input_ids == list(case.truth), case.sample_id
        outcomes[f"reference/{reference.status}"] += 1
    assert outcomes["wrong_ok/headline"] == outcomes["wrong_ok/adversarial"] == 0, outcomes
    assert outcomes["ok/headline"] > outcomes["flagged/headline"]


def test_real_cases_are_the_corpus_in_vllms_dialect(k3: KimiK3) -> None:
    drawn = list(real_cases("kimi-k3", k3.tok, 20, 2, "vllm-k3"))
    assert len(drawn) == 20
    for case in drawn:
        assert "return_token_ids" not in case.request and "reasoning" not in case.request
        assert case.ids[-1] == k3.stop_id
        if case.max_tokens is not None:
            assert case.request["max_tokens"] == case.max_tokens < len(case.ids)


@pytest.mark.parametrize("profile", ["vllm-k3", "openrouter"])
def test_a_k3_conversation_follows_the_dataset_and_keeps_its_history(k3: KimiK3,
                                                                   conversations,
                                                                   profile: str) -> None:
    """Conversation mode (emulator/conversations.py) through K3's served side: the dataset's
    steps come back, and each later prompt holds the earlier answers exactly as the model
    wrote them (K3 renders a history turn as the completion it was: every turn keeps its
    think channel)."""
    from tests.unit.test_emulator_conversations import (
        DATASET_STEPS,
        _base,
        _calls_of,
        _emulator,
        _sorted,
        _walk,
    )

    with _emulator(conversations, profile, model=MODEL, tok=k3.tok) as emu:
        walk = _walk(_base(emu, profile), MODEL, "reasoning")
    previous: list[int] = []
    for position, request, body in walk:
        message = body["choices"][0]["message"]
        expected = DATASET_STEPS[position]
        if isinstance(expected, str):
            assert message["content"] == expected, (profile, position)
        else:
            assert _sorted(_calls_of(message)) == _sorted(expected), (profile, position)
        sample = reconstruct("s", request, body, k3,
                             reference_completion_ids=body["choices"][0]["token_ids"])
        assert sample.reference_match == "exact", (profile, position, sample.flags)
        prompt = body["prompt_token_ids"]
        # The earlier request's prompt and answer, as the model wrote them, open this prompt.
        assert prompt[: len(previous)] == previous, (profile, position)
        previous = prompt + body["choices"][0]["token_ids"]


def test_no_ok_sample_of_the_corpus_fails_the_gates_round_trip(k3: KimiK3) -> None:
    """A round-trip mismatch on an `ok` sample fails a whole dataset: the gate's K3 rules
    (structure, raw parser, arguments' normal form) must read back every `ok` answer."""
    from specregen.gate.checks import check_sample
    from specregen.gate.config import GateConfig

    config = GateConfig()
    checked = 0
    for case in cases("kimi-k3", k3.tok, 60, seed=4):
        sample = reconstruct(case.sample_id, case.request, blind_body(case.body), k3)
        decision = check_sample(sample, k3, config)
        assert not decision.hard, (case.sample_id, case.shape, decision.reasons)
        checked += sample.status == "ok"
    assert checked > 100
