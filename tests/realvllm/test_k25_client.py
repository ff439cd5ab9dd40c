"""specregen's own client, probe and reconstruction against the real vLLM with K2.5.

The requests are the client's; the scripting proxy (specregen/realserver/proxy.py) scripts each
one as it comes with the ids the emulator's K2.5 model writes for it, and the answers are the
real server's."""

from __future__ import annotations

import pytest

from specregen.client.config import EndpointConfig
from specregen.probe.run import probe_endpoint
from specregen.probe.scenarios import build_scenarios
from specregen.realserver.proxy import ScriptingProxy


@pytest.fixture
def proxy(k25):
    front = ScriptingProxy.for_server(k25.server, k25.tok, tool_call_rate=1.0)
    running = front.serve()
    yield front, running
    running.stop()


def _probe(k25, url, **endpoint):
    cfg = EndpointConfig.load({"base_url": url, "model": k25.spec.served_model_name,
                               "dialect": "vllm", "format": "kimi-k2.5", "stream": False,
                               **endpoint})
    return probe_endpoint(cfg, None, build_scenarios(2), fmt=k25.fmt,
                          tokenizer=str(k25.tok.source))


def test_the_probe_names_the_inserted_spaces_at_the_server_defaults(k25, proxy):
    _, running = proxy
    profile = _probe(k25, running.url, text_as_written=False)
    findings = profile.findings
    assert findings.spaces_around_added_tokens is True, findings.evidence
    assert profile.traits().spaces_around_added_tokens is True
    assert any("spaces_around_added_tokens: puts a space" in note for note in profile.notes), \
        profile.notes


def test_the_client_turns_the_spaces_off_and_the_probe_sees_logprobs(k25, proxy):
    _, running = proxy
    profile = _probe(k25, running.url)
    findings = profile.findings
    assert findings.spaces_around_added_tokens is False, findings.evidence
    # vLLM returns logprobs naming every token (`token_id:N`): the run will ask for them.
    assert findings.returns_logprobs is True, findings.evidence
