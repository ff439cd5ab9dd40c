"""The emulator's Qwen3 vLLM profile (`vllm-hermes`, `models/qwen3/vllm.py`) against the real
vLLM 0.32: the same ids and requests, plain and streamed, with the server's defaults and with
the options specregen's client sends, read the way the client reads both
(`specregen.realserver.conformance`). Every field must agree, except the differences
docs/vllm-0.32.md lists under "Emulator differences left (Qwen3)" (`allowed`)."""

from __future__ import annotations

from specregen.models.qwen3 import vllm
from specregen.realserver import conformance
from specregen.realserver.conformance import Result, face
from tests.realvllm.conftest import RESULTS_REQUESTS


def allowed(result: Result, field: str, tok) -> bool:
    """A difference docs/vllm-0.32.md, "Emulator differences left (Qwen3)", explains.

    Streamed `reasoning_tokens`: the server counts every id of a step, and a step whose text
    the detokenizer held (an unfinished character) counts nothing, unless the server's output
    collector merged it with the next step because the reader had not taken it yet -- a
    matter of timing. The emulator counts as if no step were merged (the lowest count); the
    real count lies between that and the text tokens of the reasoning (every step merged)."""
    if field != "reasoning_tokens" or not result.stream:
        return False
    case = result.case
    ids = list(case.ids[:case.max_tokens] if case.max_tokens else case.ids)
    vocab = vllm.Vocabulary.of(tok)
    most = 0
    for token_id in ids:
        if token_id in (vocab.think_end, vocab.tool_call):
            break
        most += token_id not in vocab.terminal_ids()
    real, emulated = face(result.real)[field], face(result.emulated)[field]
    return emulated <= real <= most


def test_the_qwen3_profile_answers_as_the_real_vllm(qwen3, real_servers):
    # The corpus run the fidelity tests read too (bench/real_vllm.py runs larger ones).
    results = real_servers.results("qwen3")
    assert len(results) == 4 * RESULTS_REQUESTS
    unexpected = []
    for r in results:
        fields = [d for d in r.diffs if not allowed(r, d, qwen3.tok)]
        if fields:
            unexpected.append({"case": r.case.sample_id, "shape": r.case.shape,
                               "variant": r.variant, "stream": r.stream,
                               "fields": {d: [face(r.real).get(d), face(r.emulated).get(d)]
                                          for d in fields}})
    assert not unexpected, (
        "the emulator differs from the real vLLM 0.32 (real, emulated):\n"
        + conformance.conformance_table(results) + "\n"
        + "\n".join(str(u) for u in unexpected[:10]))


TOOL = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}}}}}  # no description: 0.32 dumps `"description": null`


def _loop(arguments, **reasoning):
    return [{"role": "user", "content": "Weather in Oslo? (prompt check)"},
            {"role": "assistant", "content": "", **reasoning, "tool_calls": [
                {"id": "c0", "type": "function",
                 "function": {"name": "get_weather", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": "c0", "content": "sunny"}]


def test_the_prompt_ids_are_the_real_servers(qwen3):
    """The request side: history `reasoning_content`, history arguments that are not a JSON
    object, a tool without `description`, `reasoning_effort` as the thinking switch."""
    model = qwen3.spec.served_model_name
    requests = [
        {"messages": _loop('{"city": "Oslo"}', reasoning_content="I should call it."),
         "tools": [TOOL]},
        {"messages": _loop("{not json", reasoning="Call."), "tools": [TOOL]},
        {"messages": _loop("[1, 2]"), "tools": [TOOL], "reasoning_effort": "none"},
        {"messages": _loop(""), "tools": [TOOL], "reasoning_effort": "low",
         "chat_template_kwargs": {"enable_thinking": False}},
    ]
    for request in requests:
        body = {"model": model, **request}
        assert qwen3.server.prompt_ids(body) == vllm.encode_prompt(body, qwen3.tok), request
