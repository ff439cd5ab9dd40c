"""The built-in K2.5 renderer and a Jinja chat template written from the SPEC agree.

The template is rendered by transformers' own `render_jinja_template` (what
`apply_chat_template` uses), so this also exercises the path taken when a user supplies a real
model folder with its chat template.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers.utils.chat_template_utils import render_jinja_template

import specregen.models.kimi_k25 as kimi
from specregen.models.kimi_k25 import KimiK25, render_prompt_text, tools_declaration
from specregen.models.kimi_k25.readings import sglang_messages
from specregen.models.kimi_k25.tools_ts import deep_sort
from specregen.models.tokenizer import MINI_TOKENIZER_DIR, load_tokenizer

TEMPLATE = (Path(kimi.__file__).parent / "chat_template.jinja").read_text()

text = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30
)
tool_names = st.sampled_from(["get_weather", "lookup", "calc"])
arguments = st.one_of(
    st.sampled_from(['{"city": "Paris"}', '{"q": "日本"}', "{}", '{\n  "x": 1\n}']),
    st.fixed_dictionaries({"n": st.integers(0, 9)}),  # a non-string value goes through tojson
)


@st.composite
def tool_calls(draw):
    calls = []
    for _ in range(draw(st.integers(1, 2))):
        name = draw(tool_names)
        call = {
            "id": f"functions.{name}:{draw(st.integers(0, 5))}",
            "type": "function",
            "function": {"name": name, "arguments": draw(arguments)},
        }
        # Clients omit the id, or send it null: upstream renders nothing for either.
        gone = draw(st.sampled_from(["keep"] * 6 + ["missing", "null"]))
        if gone == "missing":
            del call["id"]
        elif gone == "null":
            call["id"] = None
        calls.append(call)
    return calls


@st.composite
def messages(draw):
    out = []
    if draw(st.booleans()):
        out.append({"role": "system", "content": draw(text)})
    for _ in range(draw(st.integers(1, 4))):
        user = {"role": "user", "content": draw(text)}
        if draw(st.integers(0, 5)) == 0:
            user["content"] = [
                {"type": "text", "text": draw(text)},
                {"type": "image_url", "image_url": {"url": "http://127.0.0.1/x.png"}},
            ]
        if draw(st.integers(0, 6)) == 0:
            user["name"] = "alice"
        out.append(user)
        if not draw(st.booleans()):
            continue
        assistant = {"role": "assistant", "content": draw(st.one_of(st.none(), text))}
        reasoning_key = draw(st.sampled_from(["reasoning", "reasoning_content", None]))
        if reasoning_key:
            # A null reasoning_content is dropped before rendering (vLLM; transformers 5).
            assistant[reasoning_key] = draw(st.one_of(text, st.none()))
        if draw(st.booleans()):
            assistant["tool_calls"] = draw(tool_calls())
            out.append(assistant)
            for call in assistant["tool_calls"]:
                result = {"role": "tool", "tool_call_id": call.get("id"), "content": draw(text)}
                if draw(st.integers(0, 5)) == 0:
                    del result["tool_call_id"]  # renders `## Return of ` and the newline
                out.append(result)
            if draw(st.booleans()):
                out.append({"role": "assistant", "content": draw(text)})
        else:
            out.append(assistant)
    return out


def tool_list(names):
    return [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": f"{name} tool",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "city": {"type": "string", "description": "City name"},
                        "days": {"type": "integer", "default": 1},
                    },
                    "required": ["city"],
                },
            },
        }
        for name in names
    ]


def without_nulls(msgs):
    out = []
    for m in msgs:
        m = {k: v for k, v in m.items()
             if not (v is None and k in ("tool_call_id", "reasoning_content", "reasoning"))}
        if m.get("tool_calls"):
            m["tool_calls"] = [{k: v for k, v in c.items() if not (k == "id" and v is None)}
                               for c in m["tool_calls"]]
        out.append(m)
    return out


def model_dump(msgs):
    """What SGLang's pydantic message model gives: every optional field present, None when
    absent; `reasoning` is not one of them."""
    out = []
    for m in msgs:
        m = {k: v for k, v in m.items() if k != "reasoning"}
        if m["role"] == "assistant":
            m.setdefault("reasoning_content", None)
            if m.get("tool_calls"):
                m["tool_calls"] = [{**c, "id": c.get("id")} for c in m["tool_calls"]]
        elif m["role"] == "tool":
            m.setdefault("tool_call_id", None)
        out.append(m)
    return out


def jinja_render(msgs, tools, thinking, tools_format="typescript"):
    ts = tools_declaration(tools, "typescript") if tools and tools_format == "typescript" else None
    rendered, _ = render_jinja_template(
        conversations=[msgs],
        tools=deep_sort(tools) if tools else None,
        chat_template=TEMPLATE,
        add_generation_prompt=True,
        thinking=thinking,
        tools_ts_str=ts,
    )
    return rendered[0]


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    msgs=messages(),
    names=st.lists(tool_names, unique=True, max_size=3),
    thinking=st.booleans(),
    tools_format=st.sampled_from(["typescript", "json"]),
)
def test_builtin_renderer_matches_jinja_template(mini_fmt, msgs, names, thinking, tools_format):
    tools = tool_list(names) or None
    ours = render_prompt_text(msgs, tools, thinking=thinking, tools_format=tools_format)
    # vLLM copies `tool_call_id`, `reasoning_content` and a call's `id` only when they are not
    # null before the template runs: the rendering our renderer gives by default.
    theirs = jinja_render(without_nulls(msgs), tools, thinking, tools_format)
    assert ours == theirs
    # SGLang dumps its message model: every absent field reaches the template as None, which
    # transformers 4 prints as "None" -- reconstruction's `sglang_messages(.., "None")` variant.
    raw = jinja_render(model_dump(msgs), tools, thinking, tools_format)
    assert render_prompt_text(sglang_messages(msgs, "None"), tools, thinking=thinking,
                              tools_format=tools_format) == raw
    tok = mini_fmt.tok
    assert tok.encode_with_specials(ours) == tok.encode_with_specials(theirs)
    if tools_format == "typescript":
        # Block-wise encoding with cached blocks gives the ids of the whole text.
        assert mini_fmt.encode_prompt(msgs, tools, thinking=thinking) == tok.encode_with_specials(
            theirs
        )


def test_model_folder_chat_template_is_used(tmp_path, mini_fmt):
    folder = tmp_path / "model"
    shutil.copytree(MINI_TOKENIZER_DIR, folder)
    (folder / "chat_template.jinja").write_text(TEMPLATE)
    fmt = KimiK25(load_tokenizer(folder), use_hf_chat_template=True)
    assert fmt.use_hf_chat_template
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    tools = tool_list(["get_weather"])
    assert fmt.encode_prompt(msgs, tools, thinking=True) == mini_fmt.encode_prompt(
        msgs, tools, thinking=True
    )
    # A template that differs must show: the folder's template really is the one rendered.
    (folder / "chat_template.jinja").write_text(TEMPLATE.replace("tool_declare", "tools"))
    changed = KimiK25(load_tokenizer(folder), use_hf_chat_template=True)
    assert "<|im_system|>tools<|im_middle|>" in changed.render_prompt(msgs, tools)
