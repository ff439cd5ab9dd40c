"""Kimi K3's prompt encoder (models/kimi_k3/encoding.py) against ids derived by hand from
docs/kimi-k3.md: the grammar (§2.1), the order of a prompt (§2.2), an assistant turn (§2.3),
the tool-result order (§2.4), and vLLM 0.32's handling before the encoder (§2.5)."""

from __future__ import annotations

import json

import pytest

from specregen.models.chat_format import FormatError
from specregen.models.kimi_k3 import KimiK3, servers
from specregen.models.kimi_k3 import encoding as enc
from specregen.models.kimi_k3.tokens import check_tokenizer, real_tokenizer_folder
from specregen.models.tokenizer import TokenizerError, load_tokenizer
from tests.support import get_tokenizer, kimi_tokenizer_dir

OPEN, CLOSE, SEP, EOM = 163587, 163588, 163589, 163586
# Tag names and attribute pieces in Kimi's real vocabulary (the note's `think` 39964,
# `response` 12092, `message` 2778 [vocab]; the others read off the same ranks).
MESSAGE, THINK, RESPONSE, ROLE, EQ_QUOTE, QUOTE = 2778, 39964, 12092, 6244, 878, 1
USER, ASSISTANT, HI = 2482, 69702, 18699


@pytest.fixture(scope="module")
def k3_real(tmp_path_factory: pytest.TempPathFactory) -> KimiK3:
    folder = kimi_tokenizer_dir()
    if folder is None:
        pytest.skip("KIMI_TOKENIZER_DIR is not set to the real Kimi vocabulary")
    return KimiK3(load_tokenizer(real_tokenizer_folder(folder, tmp_path_factory.mktemp("k3"))))


@pytest.fixture(scope="module")
def k3() -> KimiK3:
    return KimiK3(load_tokenizer("mini-k3"))


def test_a_user_turn_by_hand(k3_real: KimiK3) -> None:
    """`message([role=user], "Hi")` and the instant generation prompt, id by id."""
    ids = k3_real.encode_prompt([{"role": "user", "content": "Hi"}], thinking=False)
    open_message = [OPEN, MESSAGE, ROLE, EQ_QUOTE]
    assert ids == [*open_message, USER, QUOTE, SEP, HI, CLOSE, MESSAGE, SEP, EOM,
                   *open_message, ASSISTANT, QUOTE, SEP, OPEN, RESPONSE, SEP]


def test_thinking_opens_the_think_channel_after_the_effort_message(k3_real: KimiK3) -> None:
    ids = k3_real.encode_prompt([{"role": "user", "content": "Hi"}], thinking=True)
    assert ids[-3:] == [OPEN, THINK, SEP]
    text = k3_real.tok.decode(ids)
    assert text.startswith('<|open|>message role="system" type="thinking-effort"<|sep|>'
                           "`thinking_effort` guides on how much to think")
    assert "Now the system is invoked with `thinking_effort=max`.<|close|>message" in text


def test_attribute_values_are_their_own_segment(k3_real: KimiK3) -> None:
    """§5 #2: ` key`, `="`, the value and `"` are four pieces; written as one piece,
    `key="_private"` tokenizes otherwise (`="_` merges)."""
    tok = k3_real.tok
    segments = enc.open_tag("argument", (("key", "_private"),))
    ids = k3_real.encode_segments(segments)
    assert ids == [OPEN, *tok.encode_ordinary("argument"), 2355, EQ_QUOTE, 29552, QUOTE, SEP]
    assert tok.encode_ordinary(' key="_private"') == [2355, 14151, 12443, QUOTE]


def test_markers_typed_in_content_are_text(k3_real: KimiK3) -> None:
    ids = k3_real.encode_prompt([{"role": "user", "content": "say <|open|> and <|end_of_msg|>"}],
                                thinking=False)
    # The user turn, the assistant turn and its response channel open; one message ends.
    assert ids.count(OPEN) == 3 and ids.count(EOM) == 1


def test_grammar_pieces() -> None:
    assert enc.open_tag("call", (("tool", 'a"b&c'), ("index", 1))) == [
        ("<|open|>", True), ("call", False), (" tool", False), ('="', False),
        ("a&quot;b&amp;c", False), ('"', False), (" index", False), ('="', False),
        ("1", False), ('"', False), ("<|sep|>", True)]
    # An empty value is no segment; `<` and `>` are not escaped.
    assert enc.open_tag("x", (("k", ""),)) == [("<|open|>", True), ("x", False), (" k", False),
                                              ('="', False), ('"', False), ("<|sep|>", True)]
    assert enc.escape("<a>") == "<a>"
    assert [enc.argument_type(v) for v in (True, None, 1, 2.5, "s", {}, [])] == [
        "boolean", "null", "number", "number", "string", "object", "array"]
    assert enc.argument_text({"a": 1}) == '{"a": 1}' and enc.argument_text("raw") == "raw"


def test_prompt_order_and_internal_messages() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"b": 1, "a": 2}}}]
    text = enc.joined(enc.render_segments(
        [{"role": "user", "content": "q"}], tools, thinking=True, thinking_effort="low",
        tool_choice="required", response_format={"type": "json_schema",
                                                  "json_schema": {"schema": {"z": 1, "a": 2}}}))
    declare = text.index('type="tool-declare"')
    effort = text.index('type="thinking-effort"')
    user = text.index('role="user"')
    choice = text.index('type="tool-choice"')
    fmt_at = text.index('type="response-format"')
    assert declare < effort < user < choice < fmt_at
    assert ('# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n'
            '[{"function":{"name":"f","parameters":{"a":2,"b":1}},"type":"function"}]\n```'
            ) in text
    assert "You MUST call tools in the next message." in text
    assert 'The JSON data must match the following schema:\n```json\n{"a":2,"z":1}\n```' in text
    assert text.endswith('<|open|>message role="assistant"<|sep|><|open|>think<|sep|>')


def test_assistant_turns_keep_reasoning_and_channels() -> None:
    history = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "reasoning": "r1", "tool_calls": [
            {"id": "x", "type": "function",
             "function": {"name": "f", "arguments": {"s": "v", "n": 2, "o": {"a": [1]}}}}]},
        {"role": "tool", "tool_call_id": "x", "content": "out"},
        {"role": "assistant", "content": "done"},
    ]
    text = enc.joined(enc.render_segments(history, thinking=True, thinking_effort=None,
                                          add_generation_prompt=False))
    assert ('<|open|>message role="assistant"<|sep|><|open|>think<|sep|>r1<|close|>think<|sep|>'
            '<|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|>'
            '<|open|>call tool="f" index="1"<|sep|>'
            '<|open|>argument key="s" type="string"<|sep|>v<|close|>argument<|sep|>'
            '<|open|>argument key="n" type="number"<|sep|>2<|close|>argument<|sep|>'
            '<|open|>argument key="o" type="object"<|sep|>{"a": [1]}<|close|>argument<|sep|>'
            '<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>'
            ) in text
    assert ('<|open|>message role="tool" tool="f" index="1"<|sep|>out<|close|>message<|sep|>'
            ) in text
    # Every turn keeps its think channel, empty when it has no reasoning.
    assert ('role="assistant"<|sep|><|open|>think<|sep|><|close|>think<|sep|><|open|>response'
            '<|sep|>done<|close|>response<|sep|>') in text
    off = enc.joined(enc.render_segments(history, thinking=False, add_generation_prompt=False))
    assert "think" not in off.replace("thinking", "") and "r1" not in off


def test_tool_results_sorted_by_call_id_and_named() -> None:
    calls = [{"id": "a", "function": {"name": "f", "arguments": {}}},
             {"id": "b", "function": {"name": "g", "arguments": {}}}]
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": calls},
                {"role": "tool", "tool_call_id": "b", "content": "B"},
                {"role": "tool", "tool_call_id": "a", "content": "A"}]
    text = enc.joined(enc.render_segments(messages, thinking=False))
    assert text.index('tool="f" index="1"<|sep|>A') < text.index('tool="g" index="2"<|sep|>B')
    # One unmatched id: the run stays as sent; names then by position.
    messages[2] = {"role": "tool", "tool_call_id": "zz", "content": "B"}
    text = enc.joined(enc.render_segments(messages, thinking=False))
    assert text.index('tool="f" index="1"<|sep|>B') < text.index('tool="g" index="2"<|sep|>A')


def test_revisions_differ_on_blank_reasoning_and_unknown_roles() -> None:
    history = [{"role": "user", "content": "q"},
               {"role": "assistant", "content": "c", "reasoning": "  "}]
    r3 = enc.joined(enc.render_segments(history, revision="r3"))
    r2 = enc.joined(enc.render_segments(history, revision="r2"))
    assert "<|open|>think<|sep|>  <|close|>think" in r3
    assert "<|open|>think<|sep|><|close|>think" in r2
    developer = [{"role": "developer", "content": "d"}, {"role": "user", "content": "q"}]
    with pytest.raises(enc.EncodingError, match="developer"):
        enc.render_segments(developer, revision="r3")
    assert "developer" not in enc.joined(enc.render_segments(developer, revision="r2"))


def test_effort_options() -> None:
    assert enc.resolve_options() == (True, "max")
    assert enc.resolve_options(reasoning_effort="none") == (False, "max")
    assert enc.resolve_options(enable_thinking=False, reasoning_effort="low") == (False, "low")
    with pytest.raises(enc.EncodingError):
        enc.resolve_options(thinking_effort="medium")


def test_vllm_prepares_the_messages(k3: KimiK3) -> None:
    """§2.5: text parts joined with newlines, invalid history arguments become `{}`, results
    matched by the `name:position` alias, missing tool fields null, efforts."""
    request = {"messages": [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{bad"}},
            {"id": "c2", "type": "function", "function": {"name": "g", "arguments": '{"x":1}'}}]},
        {"role": "tool", "tool_call_id": "g:1", "content": "G"},
        {"role": "tool", "tool_call_id": "c1", "content": "F"}],
        "tools": [{"type": "function", "function": {"name": "f"}}], "reasoning_effort": "high"}
    text = enc.joined(servers.render_request(request))
    assert "<|sep|>a\nb<|close|>" in text
    assert '<|open|>call tool="f" index="1"<|sep|><|close|>call' in text
    assert '<|open|>argument key="x" type="number"<|sep|>1<|close|>' in text
    assert text.index('tool="f" index="1"<|sep|>F') < text.index('tool="g" index="2"<|sep|>G')
    assert '"description":null' in text and '"parameters":null' in text
    assert "thinking_effort=high" in text
    assert "thinking_effort" not in enc.joined(servers.render_request(
        {**request, "reasoning_effort": "none"}))
    for bad in ("medium", "xhigh"):
        with pytest.raises(servers.RequestError):
            servers.render_request({**request, "reasoning_effort": bad})
    # tool_choice only with tools, and not for auto.
    assert "tool-choice" not in enc.joined(servers.render_request({**request,
                                                                    "tool_choice": "auto"}))
    assert "MUST NOT call" in enc.joined(servers.render_request({**request, "tool_choice": "none"}))


def test_prompt_variants_follow_vllm(k3: KimiK3) -> None:
    messages = [{"role": "user", "content": "q"}]
    request = {"messages": messages, "chat_template_kwargs": {"thinking_effort": "low"}}
    [ids] = k3.prompt_variants(messages, None, True, None, request=request)  # type: ignore[arg-type]
    assert "thinking_effort=low" in k3.tok.decode(ids)
    history = [{"role": "user", "content": "q"},
               {"role": "assistant", "content": "c", "reasoning": " "}, messages[0]]
    variants = k3.prompt_variants(history, None, True, None, request={"messages": history})  # type: ignore[arg-type]
    assert len(variants) == 2  # the two revisions differ on blank history reasoning


def test_tokenizer_check_names_the_missing_marker() -> None:
    with pytest.raises(TokenizerError, match=r"<\|open\|>.*Kimi K3"):
        check_tokenizer(get_tokenizer("mini"))  # the K2.5 table
    assert check_tokenizer(load_tokenizer("mini-k3"))["<|end_of_msg|>"] == EOM


def test_format_errors_are_format_errors(k3: KimiK3) -> None:
    with pytest.raises(FormatError):
        k3.encode_prompt([{"role": "user", "content": [{"type": "image_url"}]}])
    with pytest.raises(FormatError):
        k3.encode_prompt([{"role": "tool", "content": "x"}])  # no name, no call to take it from


def test_hf_tokenizer_class_renders_like_the_encoder(k3_real: KimiK3, tmp_path) -> None:
    """The real-vLLM folder's tokenizer class (our own) gives the ids our encoder gives."""
    pytest.importorskip("transformers")
    from specregen.models.kimi_k3.realvllm import real_vllm_spec

    folder = kimi_tokenizer_dir()
    real_vllm_spec(folder).build_folder(tmp_path)
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(tmp_path), trust_remote_code=True)
    request = {"messages": [{"role": "user", "content": "Hi <|open|>"}],
               "tools": [{"type": "function", "function": {"name": "f"}}]}
    conversation = servers.server_conversation(request["messages"])
    ids = hf.apply_chat_template(conversation, tools=servers.server_tools(request["tools"]),
                                 tokenize=True, return_dict=False, thinking=True)
    assert ids == servers.encode_prompt(request, k3_real.tok)
    assert hf.encode("<|close|>think<|sep|>", add_special_tokens=False) == [CLOSE, THINK, SEP]
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["added_tokens_decoder"][
        "163587"]["content"] == "<|open|>"
