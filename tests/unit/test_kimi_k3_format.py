"""The kimi-k3 chat format: registry entry, completion assembly, the readings of what vLLM
0.32's kimi_k3 parsers return (docs/kimi-k3.md §4.5), the gate's rules, the id policy."""

from __future__ import annotations

import json

import pytest

from specregen.models import registry
from specregen.models.chat_format import ChatFormat
from specregen.models.kimi_k3 import KimiK3, make_probe_rules
from specregen.models.kimi_k3 import servers as sv
from specregen.models.kimi_k3.encoding import close_tag, open_tag, text
from specregen.models.kimi_k3.format import completion_segments
from specregen.models.tokenizer import load_tokenizer
from specregen.reconstruct import reconstruct
from specregen.records import ToolCall

FMT = KimiK3(load_tokenizer("mini-k3"))
TOK = FMT.tok
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]
MODEL = "moonshotai/kimi-k3"

def _stopped(fmt, segments) -> list[int]:
    """The ids of a completion's segments, with the stop id."""
    return [*fmt.encode_segments(segments), fmt.stop_id]



def _request(stream: bool = False, **extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Weather in Oslo?"}],
            "tools": TOOLS, **({"stream": True} if stream else {}), **extra}


def _serve(ids: list[int], request: dict, max_tokens: int | None = None) -> tuple[dict, list]:
    """The body vLLM 0.32 (restated) returns for `ids`, and the true prompt + completion."""
    cut = ids[:max_tokens] if max_tokens else ids
    truncated = len(cut) < len(ids)
    prompt = sv.encode_prompt(request, TOK)
    out = sv.decode_output(cut, TOK, truncated)
    parsed = sv.parse(out, request, stream=request.get("stream") is True,
                      marker_ids=FMT.marker_ids, prompt_ids=prompt)
    message = {"role": "assistant", "content": parsed.content, "reasoning": parsed.reasoning}
    if request.get("stream") and parsed.content is None:
        message["content"] = ""  # vLLM 0.32's role chunk: a stream's content is never null
    if parsed.calls:
        message["tool_calls"] = [{"id": f"chatcmpl-tool-{k:016x}", "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}}
                                 for k, c in enumerate(parsed.calls)]
    body = {"choices": [{"message": message, "finish_reason": parsed.finish_reason}],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(cut)}}
    return body, prompt + cut


def test_registry_entry() -> None:
    assert registry.format_for_model("moonshotai/Kimi-K3") == "kimi-k3"
    assert registry.format_for_model("moonshotai/kimi-k2.5") == "kimi-k2.5"
    assert registry.bundled_tokenizer("kimi-k3") == "mini-k3"
    assert registry.tokenizer_env("kimi-k3") == "KIMI_K3_TOKENIZER_DIR"
    assert registry.thinking_switch("kimi-k3") == "thinking"
    assert registry.reads_provider_traits("kimi-k3")
    assert registry.probe_rules("kimi-k3") is make_probe_rules()
    fmt = registry.get_format("kimi-k3", TOK)
    assert isinstance(fmt, ChatFormat)
    assert fmt.describe() == {"name": "kimi-k3", "encoder_revision": "r3"}
    assert registry.get_format("kimi-k3", TOK, revision="r2").describe()["encoder_revision"] == "r2"
    names = {p.name for p in registry.format_source_files("kimi-k3")}
    assert {"completion.py", "format.py", "readings.py", "servers.py", "encoding.py",
            "tokens.py"} <= names
    assert not names & {"served.py", "corpus.py", "realvllm.py", "hf_tokenizer.py"}


def test_assembly_layout() -> None:
    calls = [ToolCall("chatcmpl-tool-1", "get_weather", '{"city": "Oslo", "days": 2}')]
    built = FMT.assemble("R", None, calls, thinking=True, truncated=False)
    assert TOK.decode(built.ids) == (
        'R<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|>'
        '<|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|>'
        '<|open|>argument key="city" type="string"<|sep|>Oslo<|close|>argument<|sep|>'
        '<|open|>argument key="days" type="number"<|sep|>2<|close|>argument<|sep|>'
        '<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>')
    assert built.tool_calls[0].id == ""  # K3 writes no ids
    assert "arguments_canonical_assumed" in built.flags
    instant = FMT.assemble(None, "Hi", [], thinking=False, truncated=True)
    assert TOK.decode(instant.ids) == "Hi<|close|>response<|sep|><|close|>message<|sep|>"


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("content", ["Let me check.", ""])
def test_layout_answers_rebuild_exactly(stream: bool, content: str) -> None:
    calls = [("get_weather", {"city": "Oslo", "days": 3})]
    ids = _stopped(FMT, completion_segments("I should call it.", content, calls, thinking=True))
    request = _request(stream)
    body, truth = _serve(ids, request)
    sample = reconstruct("s", request, body, FMT)
    assert sample.status == "ok", sample.flags
    assert sample.input_ids == truth and sample.evidence == "usage_exact"


def test_an_instant_answer_rebuilds_exactly_only_with_its_count() -> None:
    ids = _stopped(FMT, text("Hello there") + close_tag("response") + close_tag("message"))
    request = _request(chat_template_kwargs={"thinking": False})
    body, truth = _serve(ids, request)
    assert reconstruct("s", request, body, FMT).input_ids == truth
    # One token off: the parsers may have dropped text (K3's `parsers_drop_text`), so the
    # tolerance a verbatim path has is not granted.
    body["usage"]["completion_tokens"] += 1
    assert "completion_count_inexact" in reconstruct("s", request, body, FMT).flags


@pytest.mark.parametrize("stream", [False, True])
def test_a_cut_answer_gets_its_ending_from_the_count(stream: bool) -> None:
    full = FMT.encode_segments(completion_segments("Thinking hard.", "Answer.", [],
                                                   thinking=True))
    reasoning_len = len(TOK.encode_ordinary("Thinking hard."))
    for extra in range(0, 7):  # inside the think close and the response opener
        request = _request(stream, max_tokens=reasoning_len + extra)
        body, truth = _serve(full, request, reasoning_len + extra)
        sample = reconstruct("s", request, body, FMT)
        assert sample.input_ids == truth, extra
        if extra and stream:
            # A held-back literal prefix of a marker would read the same.
            assert sample.status == "flagged" and "reading_ambiguous" in sample.flags
        elif not stream:
            assert sample.status == "ok", (extra, sample.flags)


def test_a_stream_that_never_closed_its_think_channel_is_read_raw() -> None:
    ids = _stopped(FMT, text("R") + open_tag("response") + text("Hi") + close_tag("response")
                   + close_tag("message"))
    request = _request(True)
    body, truth = _serve(ids, request)
    assert not body["choices"][0]["message"]["content"]
    sample = reconstruct("s", request, body, FMT)
    assert sample.status == "ok" and sample.input_ids == truth
    assert "think_channel_unclosed" in sample.flags


def test_a_typed_value_the_parser_could_not_load_is_ambiguous() -> None:
    call = (open_tag("call", (("tool", "get_weather"), ("index", 1)))
            + open_tag("argument", (("key", "days"), ("type", "number"))) + text("three")
            + close_tag("argument") + close_tag("call"))
    segments = (completion_segments("R", "", [], thinking=True)[:-3] + open_tag("tools") + call
                + close_tag("tools") + close_tag("message"))
    request = _request()
    body, _ = _serve(_stopped(FMT, segments), request)
    assert body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == \
        '{"days": "three"}'
    sample = reconstruct("s", request, body, FMT)
    assert sample.status == "flagged" and "reading_ambiguous" in sample.flags
    # A string that is JSON would have been loaded: the model wrote a string.
    quoted = [s if s != ("three", False) else ("3", False) for s in segments]
    quoted = [s if s != ("number", False) else ("string", False) for s in quoted]
    body, truth = _serve(_stopped(FMT, quoted), request)
    sample = reconstruct("s", request, body, FMT)
    assert sample.status == "ok" and sample.input_ids == truth


def test_gate_rules() -> None:
    calls = [("get_weather", {"city": "Oslo"}), ("get_weather", {})]
    ids = _stopped(FMT, completion_segments("R", "C", calls, thinking=True))
    structure = FMT.call_structure(ids, n_calls=2, thinking=True, truncated=False)
    assert structure.problems == [] and structure.whole_ids == 2
    assert FMT.call_structure(ids, n_calls=1, thinking=True, truncated=False).problems
    assert FMT.call_structure(ids[:-1], n_calls=2, thinking=True, truncated=False).problems
    parsed = FMT.parse_tool_calls(TOK.decode(ids), truncated=False)
    assert parsed is not None and [(c.name, c.arguments) for c in parsed.calls] == [
        ("get_weather", '{"city": "Oslo"}'), ("get_weather", "{}")]
    assert FMT.comparable_arguments('{"a":1}') == '{"a": 1}'
    assert FMT.tool_id_problems([ToolCall("anything", "f", "{}")], None) == []
    assert not FMT.tool_id_in_tokens
    assert FMT.find_marker_text("use <|sep|> here") == "<|sep|>"
    assert FMT.find_marker_text("a <| b") is None


def test_history_message_and_thinking() -> None:
    from specregen.records import Completion

    completion = Completion(reasoning="R", content="C", tool_calls=[
        ToolCall("chatcmpl-tool-9", "get_weather", '{"city": "Oslo"}')], finish_reason="tool_calls",
        usage={})
    message = FMT.history_message(completion, thinking=True)
    assert message["reasoning"] == message["reasoning_content"] == "R"
    assert message["content"] == "C" and message["tool_calls"][0]["id"] == "chatcmpl-tool-9"
    assert FMT.thinking_requested({"chat_template_kwargs": {"thinking": False}}) is False
    assert FMT.thinking_requested({"chat_template_kwargs": {"enable_thinking": False}}) is False
    assert FMT.thinking_requested({"reasoning_effort": "none"}) is False
    assert FMT.thinking_requested({"reasoning": {"enabled": True}}) is True
    assert FMT.thinking_requested({}) is None


def test_probe_rules_read_raw_calls() -> None:
    rules = make_probe_rules()
    raw = TOK.decode(FMT.encode_segments(completion_segments(
        "", "C", [("get_weather", {"city": "Oslo"})], thinking=False)))
    found = rules.raw_calls(raw, truncated=False)
    assert found is not None and found.parsed and found.calls[0].name == "get_weather"
    assert rules.written_calls(raw) == [("", '{"city": "Oslo"}')]
    assert rules.id_is_canonical("chatcmpl-tool-0123456789abcdef", "f", 0)
    assert rules.id_index("chatcmpl-tool-1") is None
    assert json.loads(found.calls[0].arguments) == {"city": "Oslo"}


def test_files_left_out_of_the_fingerprint_are_never_imported_by_reconstruction() -> None:
    from tests.unit.test_format_fingerprint_files import _imported

    package = "specregen.models.kimi_k3"
    files = {p.stem for p in registry.format_source_files("kimi-k3")}
    used = {m.rsplit(".", 1)[1] for m in _imported("kimi-k3", "mini-k3")
            if m.startswith(package + ".")} - {"family"}  # the registry's descriptor
    assert used <= files, used - files
