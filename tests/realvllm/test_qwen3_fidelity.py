"""Reconstruction of real vLLM answers (Qwen3, hermes + qwen3 parsers, a fast tokenizer)
against the ids the model was scripted to write: no answer `ok` with wrong ids, the prompt we
render is the server's, the ids the logprobs name are the server's. (A fast tokenizer puts no
spaces around added tokens: both ways of asking give the same text.)"""

from __future__ import annotations

import pytest

from specregen.realserver import conformance

REQUESTS = 16


@pytest.fixture(scope="module")
def results(real_servers):
    qwen3 = real_servers.get("qwen3")
    traits = {v: real_servers.profile("qwen3", v).traits() for v in conformance.VARIANTS}
    cases = conformance.real_cases(qwen3.spec, qwen3.tok, REQUESTS, seed=3)
    return conformance.run(qwen3.server, qwen3.fmt, cases, traits=traits)


def test_no_real_answer_is_ok_with_wrong_ids(results):
    wrong = [(r.case.sample_id, r.variant, r.stream, name, m.sample.flags)
             for r in results for name, m in r.measures.items() if m.outcome == "wrong_ok"
             and r.case.group(r.stream) != "erased"]
    assert not wrong, wrong


def test_the_prompt_we_render_is_the_servers(results):
    assert all(r.prompt_equal for r in results), [
        r.case.sample_id for r in results if not r.prompt_equal]


def test_logprobs_name_the_servers_ids(results):
    client = [r for r in results if r.variant == "client"]
    assert client and all(r.logprob_ids_equal is True for r in client), [
        (r.case.sample_id, r.logprob_ids_equal) for r in client]
