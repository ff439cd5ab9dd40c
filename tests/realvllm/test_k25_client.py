"""specregen's probe against the real vLLM with K2.5, asked with the server's defaults and
the way the client asks. The requests are the probe's own; the scripting proxy
(specregen/realserver/proxy.py) scripts each as it comes with the ids the emulator's K2.5
model writes for it, and the answers are the real server's."""

from __future__ import annotations

SPACES = "spaces_around_added_tokens"  # the family's trait


def test_the_probe_names_the_inserted_spaces_at_the_server_defaults(k25, real_servers):
    profile = real_servers.profile("kimi-k2.5", "defaults")
    findings = profile.findings
    assert findings.family.get(SPACES) is True, findings.evidence
    assert profile.traits().get(SPACES) is True
    assert any(note.startswith("spaces_around_added_tokens: puts a space")
               for note in profile.notes), profile.notes


def test_the_client_turns_the_spaces_off_and_the_probe_sees_logprobs(k25, real_servers):
    profile = real_servers.profile("kimi-k2.5", "client")
    findings = profile.findings
    assert findings.family.get(SPACES) is False, findings.evidence
    # vLLM returns logprobs naming every token (`token_id:N`): the run will ask for them.
    assert findings.returns_logprobs is True, findings.evidence
    # 0.32's kimi_k2 parsers return the model's ids and keep `(no content)`.
    assert findings.renumbers_tool_ids is False, findings.evidence
