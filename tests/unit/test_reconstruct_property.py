"""Property tests: reconstructed ids equal the true ids, across every API dialect.

The true completion ids are built here, by a path independent of the reconstruction code:
segment texts are encoded one by one and the special ids are read from the tokenizer's table.
The provider response is then rendered from the same texts the way each API dialect returns
them, and `reconstruct` must give the true ids back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specregen.reconstruct import reconstruct

LITERAL_SNIPPETS = [
    'print("<|im_end|>")',
    'tag = "<think>"',
    "# the model closes with </think> here",
    'if s.startswith("<|tool_call_begin|>"):',
    'END = "<|tool_calls_section_end|>"  # literal',
    "x = '<|tool_call_argument_begin|>' + y",
]
TOOL_MARKER_STRINGS = (
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
)
NAMES = ["get_weather", "search_web", "run_python", "book.flight", "send_email"]

text_alphabet = st.characters(
    codec="utf-8", exclude_categories=("Cs",), exclude_characters="\x00"
)
plain_text = st.text(alphabet=text_alphabet, max_size=60)
cjk = st.text(alphabet=st.characters(min_codepoint=0x4E00, max_codepoint=0x4FFF), max_size=12)
emoji = st.sampled_from(["😀", "🚀🔥", "👩‍💻", "🇫🇷", "✅"])
spaces = st.sampled_from([" ", "  ", "\n", "\n\n", "\t", "    ", " \n ", "\r\n"])
code = st.sampled_from(
    [
        "def f(x):\n    return x + 1\n",
        "```python\nfor i in range(3):\n    print(i)\n```",
        "int main() { return 0; }",
        '{"a": [1, 2, {"b": null}]}',
    ]
)
piece = st.one_of(plain_text, cjk, emoji, spaces, code, st.sampled_from(LITERAL_SNIPPETS))
model_text = st.lists(piece, max_size=6).map("".join)

json_value = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(-10**6, 10**6),
        st.floats(allow_nan=False, allow_infinity=False, width=32),
        st.text(alphabet=text_alphabet, max_size=20),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(st.text(alphabet=text_alphabet, max_size=8), children, max_size=3),
    ),
    max_leaves=8,
)
arguments = st.builds(
    lambda obj, indent, ascii_: json.dumps(obj, indent=indent, ensure_ascii=ascii_),
    st.dictionaries(st.text(alphabet=text_alphabet, min_size=1, max_size=8), json_value,
                    max_size=4),
    st.sampled_from([None, 2]),
    st.booleans(),
)


@dataclass
class Truth:
    reasoning: str
    content: str
    calls: list[tuple[str, str, str]]  # (id, name, arguments)
    thinking: bool
    truncated_in: str | None  # None, "reasoning", "content" or "arguments"


@st.composite
def truths(draw) -> Truth:
    thinking = draw(st.booleans())
    reasoning = draw(model_text) if thinking else ""
    content = draw(model_text)
    n_calls = draw(st.integers(0, 3))
    calls = []
    for k in range(n_calls):
        name = draw(st.sampled_from(NAMES))
        calls.append((f"functions.{name}:{k}", name, draw(arguments)))
    truncated_in = draw(st.sampled_from([None, None, None, "reasoning", "content", "arguments"]))
    if truncated_in == "reasoning" and not (thinking and reasoning):
        truncated_in = None
    if truncated_in == "content" and not content:
        truncated_in = None
    if truncated_in == "arguments" and not calls:
        truncated_in = None
    if truncated_in == "reasoning":
        reasoning = reasoning[: draw(st.integers(1, len(reasoning)))]
        content, calls = "", []
    elif truncated_in == "content":
        content = content[: draw(st.integers(1, len(content)))]
        calls = []
    elif truncated_in == "arguments":
        cid, name, args = calls[-1]
        calls[-1] = (cid, name, args[: draw(st.integers(1, len(args)))])
    return Truth(reasoning, content, calls, thinking, truncated_in)


def true_completion_ids(tok, truth: Truth) -> list[int]:
    special = tok.added_tokens
    enc = tok.encode_ordinary
    ids: list[int] = []
    if truth.thinking:
        ids += enc(truth.reasoning)
        if truth.truncated_in != "reasoning":
            ids.append(special["</think>"])
    ids += enc(truth.content)
    if truth.calls:
        ids.append(special["<|tool_calls_section_begin|>"])
        for i, (cid, _, args) in enumerate(truth.calls):
            ids.append(special["<|tool_call_begin|>"])
            ids += enc(cid)
            ids.append(special["<|tool_call_argument_begin|>"])
            ids += enc(args)
            last_cut = truth.truncated_in == "arguments" and i == len(truth.calls) - 1
            if not last_cut:
                ids.append(special["<|tool_call_end|>"])
        if truth.truncated_in != "arguments":
            ids.append(special["<|tool_calls_section_end|>"])
    if truth.truncated_in is None:
        ids.append(special["<|im_end|>"])
    return ids


def raw_section(truth: Truth) -> str:
    if not truth.calls:
        return ""
    out = "<|tool_calls_section_begin|>"
    for i, (cid, _, args) in enumerate(truth.calls):
        out += f"<|tool_call_begin|>{cid}<|tool_call_argument_begin|>{args}"
        if not (truth.truncated_in == "arguments" and i == len(truth.calls) - 1):
            out += "<|tool_call_end|>"
    if truth.truncated_in != "arguments":
        out += "<|tool_calls_section_end|>"
    return out


DIALECTS = ["openrouter", "vllm", "vllm_old", "sglang", "moonshot", "raw", "stream_assembled"]


def render_response(truth: Truth, dialect: str, usage: dict) -> dict:
    """The response body a provider of this dialect returns for the true completion."""
    truncated = truth.truncated_in is not None
    structured = dialect != "raw" and truth.truncated_in != "arguments"
    calls = truth.calls if structured else []
    finish = "length" if truncated else ("tool_calls" if calls else "stop")
    content: str | None = truth.content
    if dialect == "raw" or (truth.truncated_in == "arguments"):
        content = truth.content + raw_section(truth)  # a parser that did not (or could not) parse
    message: dict = {"role": "assistant"}
    if dialect == "stream_assembled":
        message["content"] = content or ""
    else:
        message["content"] = content or None
    reasoning = truth.reasoning if truth.thinking else None
    field = {
        "openrouter": "reasoning", "vllm": "reasoning", "vllm_old": "reasoning_content",
        "sglang": "reasoning_content", "moonshot": "reasoning_content", "raw": "reasoning",
        "stream_assembled": "reasoning",
    }[dialect]
    if reasoning is not None:
        message[field] = reasoning
        if dialect == "openrouter":
            message["reasoning_details"] = [
                {"type": "reasoning.text", "text": reasoning, "format": "unknown", "index": 0}
            ]
    if calls:
        message["tool_calls"] = [
            {
                "id": cid.strip(),
                "type": "function",
                "function": {"name": name, "arguments": args.strip()},
                **({"index": i} if dialect == "stream_assembled" else {}),
            }
            for i, (cid, name, args) in enumerate(calls)
        ]
    body = {
        "id": "gen-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": usage,
    }
    if dialect == "openrouter":
        body["provider"] = "Test"
        body["choices"][0]["native_finish_reason"] = finish
    return body


def render_request(truth: Truth, dialect: str, tools: list | None) -> dict:
    request: dict = {
        "model": "moonshotai/kimi-k2.5",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Please help. 请帮忙 🚀"},
        ],
    }
    if tools:
        request["tools"] = tools
    if dialect in ("openrouter", "raw", "stream_assembled"):
        request["reasoning"] = {"enabled": truth.thinking}
    elif dialect == "moonshot":
        request["thinking"] = {"type": "enabled" if truth.thinking else "disabled"}
    else:
        request["chat_template_kwargs"] = {"thinking": truth.thinking}
    return request


def tools_for(truth: Truth) -> list | None:
    names = sorted({name for _, name, _ in truth.calls})
    return [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": f"Call {name}.",
                "parameters": {"type": "object", "properties": {}},
            },
        }
        for name in names
    ] or None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(truth=truths(), dialect=st.sampled_from(DIALECTS), pad=st.sampled_from(["", " ", "\n "]))
def test_reconstructed_ids_equal_true_ids(fmt, truth: Truth, dialect: str, pad: str) -> None:
    tok = fmt.tok
    if dialect == "raw" and pad:
        # Raw markers keep the whitespace the model wrote around ids and arguments; parsers
        # that build structured calls trim it, so only the raw dialect can carry it.
        truth.calls = [(pad + cid, name, pad + args + pad) for cid, name, args in truth.calls]
    tools = tools_for(truth)
    request = render_request(truth, dialect, tools)
    prompt_ids = fmt.encode_prompt(request["messages"], tools, thinking=truth.thinking)
    completion_ids = true_completion_ids(tok, truth)
    usage = {
        "prompt_tokens": len(prompt_ids),
        "completion_tokens": len(completion_ids),
        "completion_tokens_details": {
            "reasoning_tokens": len(tok.encode_ordinary(truth.reasoning))
        },
    }
    response = render_response(truth, dialect, usage)
    # Round trip through JSON, as every response does.
    response = json.loads(json.dumps(response))

    sample = reconstruct("s1", request, response, fmt, reference_completion_ids=completion_ids)

    assert sample.error is None
    assert sample.input_ids[sample.prompt_len :] == completion_ids
    assert sample.input_ids[: sample.prompt_len] == prompt_ids
    assert sample.loss_mask == [0] * len(prompt_ids) + [1] * len(completion_ids)
    assert sample.reference_match == "exact"
    assert sample.usage_completion_delta == 0
    literal_markers = any(m in truth.content or m in truth.reasoning for m in TOOL_MARKER_STRINGS)
    # The server's ids matched ours: literal marker text is proven text, not a doubt.
    assert ("markers_in_text" in sample.flags) == literal_markers
    assert sample.status == "ok", sample.flags
    assert sample.evidence == "reference"
    assert ("truncated" in sample.flags) == (truth.truncated_in is not None)
    expected_calls = [(c.id, c.name, c.arguments) for c in sample.tool_calls]
    assert expected_calls == [
        (cid.strip(), name, args.strip()) for cid, name, args in truth.calls
    ]
