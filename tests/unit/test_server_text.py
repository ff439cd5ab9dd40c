"""What a server does to the model's text besides parsing it, read back by reconstruction:
spaces its detokenizer puts around added tokens, and logprobs that name the ids.

The answers here are those a real vLLM 0.32 returned for these ids (tests/realvllm runs the
server itself): with its default `spaces_between_special_tokens`, K2.5's reasoning `R` comes
back ` R`, the content `C` before a tool section ` C `, streamed arguments `A` ` A `, and plain
arguments trimmed (docs/vllm-0.32.md, section 1.2).
"""

from __future__ import annotations

import pytest

from specregen.client.config import EndpointConfig
from specregen.client.request import build_request
from specregen.gate import GateConfig, run_gate
from specregen.logprobs import ids_from_logprobs
from specregen.models.kimi_k25.probe import SPACES_TRAIT
from specregen.models.probe_answer import Observation
from specregen.models.probe_rules import TraitVotes
from specregen.models.tokenizer import load_tokenizer
from specregen.reconstruct import reconstruct
from specregen.records import Prompt, ProviderTraits, TraitMap
from specregen.wire.request import request_fingerprint
from tests.unit.test_reconstruct_upstream import ARGS, REQUEST, TOOLS, true_ids

SPACES = "spaces_around_added_tokens"  # the family's trait

CALL = "functions.get_weather:0"


def answer(fmt, ids, *, reasoning, content, arguments, stream=False, finish="tool_calls"):
    message = {"role": "assistant", "reasoning": reasoning, "content": content}
    if arguments is not None:
        message["tool_calls"] = [{"id": CALL, "type": "function",
                                  "function": {"name": "get_weather",
                                               "arguments": arguments}}]
    prompt = fmt.encode_prompt(REQUEST["messages"], TOOLS, thinking=True)
    return {"choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids)}}


def spaced(fmt, stream):
    """What vLLM 0.32 returns with its defaults for `R </think> C [call] <|im_end|>`."""
    reasoning, content = "The user wants the weather.", "Let me check."
    ids = true_ids(fmt, reasoning=reasoning, content=content, calls=[(CALL, ARGS)])
    body = answer(fmt, ids, reasoning=" " + reasoning, content=" " + content + " ",
                  arguments=" " + ARGS + " " if stream else ARGS)
    if stream:
        # The client's stream assembler records that all the content came before the call's
        # deltas (wire/stream.py).
        body["choices"][0]["specregen_stream"] = {"content_at_calls": [len(content) + 2],
                                                  "call_fragments": [7]}
    return ids, body


@pytest.mark.parametrize("stream", [False, True])
def test_spaces_the_probe_found_are_taken_out(fmt, stream):
    ids, body = spaced(fmt, stream)
    request = {**REQUEST, "stream": True} if stream else REQUEST
    traits = ProviderTraits(family=TraitMap({SPACES: True}), renumbers_tool_ids=False)
    sample = reconstruct("s", request, body, fmt, traits=traits)
    assert sample.input_ids[sample.prompt_len:] == ids
    assert sample.status == "ok" and "spaces_removed" in sample.flags, sample.flags


@pytest.mark.parametrize("stream", [False, True])
def test_unknown_spaces_are_never_taken_for_the_models_text(fmt, stream):
    # A leading space joins the next token (" The" is one token): the count cannot tell the
    # two readings apart, so the answer is flagged, whichever ids it carries.
    _ids, body = spaced(fmt, stream)
    request = {**REQUEST, "stream": True} if stream else REQUEST
    sample = reconstruct("s", request, body, fmt)
    assert sample.status == "flagged", sample.flags
    assert "reading_ambiguous" in sample.flags


def test_a_request_that_turned_the_spaces_off_is_read_as_returned(fmt):
    # The model itself began its reasoning and content with a space; the server was asked for
    # the text as written (`spaces_between_special_tokens: false`) and honours it.
    reasoning, content = " The user wants the weather.", " Let me check."
    ids = true_ids(fmt, reasoning=reasoning, content=content, calls=[(CALL, ARGS)])
    body = answer(fmt, ids, reasoning=reasoning, content=content, arguments=ARGS)
    request = {**REQUEST, "spaces_between_special_tokens": False}
    sample = reconstruct("s", request, body, fmt)
    assert sample.input_ids[sample.prompt_len:] == ids
    assert sample.status == "ok" and not any(f.startswith("spaces_") for f in sample.flags)


def test_spaces_the_probe_found_but_the_fields_cannot_carry_are_named(fmt):
    ids = true_ids(fmt, reasoning="Plan.", content="Done.")
    body = answer(fmt, ids, reasoning="Plan.", content="Done.", arguments=None,
                  finish="stop")
    sample = reconstruct("s", REQUEST, body, fmt,
                         traits=ProviderTraits(family=TraitMap({SPACES: True})))
    assert sample.input_ids[sample.prompt_len:] == ids
    assert "spaces_not_found" in sample.flags


def _spaces(answered: list[Observation]) -> tuple[bool | None, str]:
    return SPACES_TRAIT.vote(TraitVotes(answered, counts_stop_token=None))


def test_the_probe_votes_on_spaces():
    spaced_obs = Observation(index=0, ok=True, leading_spaces="all")
    plain_obs = Observation(index=1, ok=True, leading_spaces="not_all")
    assert _spaces([spaced_obs, spaced_obs])[0] is True
    assert _spaces([spaced_obs])[0] is None  # one could be the model's own spaces
    assert _spaces([plain_obs])[0] is False
    assert _spaces([spaced_obs, spaced_obs, plain_obs])[0] is None
    by_ids = Observation(index=2, ok=True, leading_spaces="not_all", spaces_by_ids=True)
    assert _spaces([by_ids])[0] is True  # the model's ids settle it


def test_the_gate_report_names_the_transformation(fmt):
    _ids, body = spaced(fmt, False)
    traits = ProviderTraits(family=TraitMap({SPACES: True}), renumbers_tool_ids=False)
    sample = reconstruct("s", REQUEST, body, fmt, traits=traits)
    report = run_gate([sample], fmt, GateConfig(), dataset="d",
                      provider={SPACES: True})
    text = report.to_markdown()
    assert "## Server text transformations" in text
    assert "| spaces around added tokens | yes | 1 |" in text
    assert "| `spaces_removed` | 1 | spaces the server put around added tokens were taken out |" \
        in text  # the flag's meaning: K2.5's words, from its trait
    assert report.to_dict()["provider"] == {SPACES: True}


def test_a_family_without_the_trait_reports_no_transformation():
    from specregen.models.qwen3 import Qwen3

    qwen = Qwen3(load_tokenizer("mini-qwen3"))
    body = {"choices": [{"message": {"content": "Hi."}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1}}
    sample = reconstruct("s", REQUEST, body, qwen, traits=ProviderTraits())
    # The run passes every trait it has; the report keeps the family's own (Qwen3: none).
    report = run_gate([sample], qwen, GateConfig(), dataset="d",
                      provider={SPACES: True, "counts_stop_token": True})
    assert report.to_dict()["provider"] == {}
    assert "Server text transformations" not in report.to_markdown()


# -- logprobs


def test_logprobs_name_ids_by_token_id_or_by_bytes(fmt):
    ids = true_ids(fmt, reasoning="Plan é.", content="Done.")
    by_id = [{"token": f"token_id:{i}"} for i in ids]
    assert ids_from_logprobs(by_id, fmt.tok, len(ids)).ids == ids
    by_bytes = []
    for i in ids:
        name = fmt.tok.added_name(i)
        raw = name.encode() if name else fmt.tok.decode_bytes([i])
        by_bytes.append({"token": raw.decode("utf-8", "replace"), "bytes": list(raw)})
    assert ids_from_logprobs(by_bytes, fmt.tok, len(ids)).ids == ids


def test_logprobs_that_cannot_name_every_token_decide_nothing(fmt):
    ids = true_ids(fmt, reasoning="Plan.", content="Done.")
    entries = [{"token": f"token_id:{i}"} for i in ids]
    # A provider that leaves the special tokens out: fewer entries than tokens.
    specials = [e for e, i in zip(entries, ids, strict=True) if not fmt.tok.is_added(i)]
    short = ids_from_logprobs(specials, fmt.tok, len(ids))
    assert short.ids is None and "cover" in short.why
    # A token cut inside a character comes back as U+FFFD.
    broken = ids_from_logprobs([{"token": "\ufffd"}], fmt.tok, 1)
    assert broken.ids is None and "UTF-8" in broken.why


def test_logprobs_prove_a_reconstruction(fmt):
    reasoning, content = "The user wants the weather.", "Let me check."
    ids = true_ids(fmt, reasoning=reasoning, content=content, calls=[(CALL, ARGS)])
    body = answer(fmt, ids, reasoning=reasoning, content=content, arguments=ARGS)
    body["choices"][0]["logprobs"] = {"content": [{"token": f"token_id:{i}", "logprob": 0.0}
                                                  for i in ids]}
    sample = reconstruct("s", REQUEST, body, fmt)
    assert sample.input_ids[sample.prompt_len:] == ids
    assert sample.evidence == "logprobs" and sample.status == "ok"
    # Ids the logprobs contradict are flagged, never passed off.
    other = [*ids[:2], ids[2] + 1, *ids[3:]]
    body["choices"][0]["logprobs"]["content"] = [{"token": f"token_id:{i}"} for i in other]
    assert reconstruct("s", REQUEST, body, fmt).status == "flagged"


# -- the request


def _cfg(**fields):
    return EndpointConfig.load({"base_url": "http://127.0.0.1:1/v1", "model": "kimi-k2.5",
                                **fields})


def test_self_hosted_servers_are_asked_for_the_text_as_written():
    prompt = Prompt(sample_id="p", messages=[{"role": "user", "content": "hi"}])
    vllm = build_request(prompt, _cfg(dialect="vllm"))
    assert vllm["spaces_between_special_tokens"] is False
    assert build_request(prompt, _cfg(dialect="sglang"))["spaces_between_special_tokens"] is False
    assert "spaces_between_special_tokens" not in build_request(prompt, _cfg())
    defaults = build_request(prompt, _cfg(dialect="vllm", text_as_written=False))
    assert "spaces_between_special_tokens" not in defaults
    logprobs = build_request(prompt, _cfg(dialect="vllm", logprobs=True))
    assert logprobs["logprobs"] is True and logprobs["return_tokens_as_token_ids"] is True
    # They change how the answer comes back, not what the model is asked: an answer logged
    # before they were sent is not paid for again.
    assert request_fingerprint(vllm) == request_fingerprint(defaults) == \
        request_fingerprint(logprobs)
