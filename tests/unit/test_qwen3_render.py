"""The Qwen3 prompt: hand-checked renders, then the Python renderer against our own Jinja
reproduction rendered by transformers (as vLLM and SGLang render), text and ids, on generated
conversations. With QWEN3_TEMPLATE_PATH pointing at the real Qwen3 chat template (kept outside
the repo), the same conversations, and hand-written ones for the branches the generator does not
reach, are also checked against it.
"""

from __future__ import annotations

import os
from pathlib import Path

import jinja2
import pytest

from specregen.models.qwen3 import (
    MINI_QWEN3_TOKENIZER_DIR,
    FormatError,
    Qwen3,
    last_query_index,
    render_prompt_text,
    render_with_template,
    template_text,
)
from specregen.models.tokenizer import load_tokenizer
from tests.unit.qwen3_cases import EDGE_CASES, all_cases, conversation

N_CASES = 240

TOOL = {"type": "function", "function": {"name": "f", "parameters": {}}}
TOOLS_SYSTEM = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    '{"type": "function", "function": {"name": "f", "parameters": {}}}\n</tools>\n\n'
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


@pytest.fixture(scope="module")
def fmt():
    return Qwen3(load_tokenizer(MINI_QWEN3_TOKENIZER_DIR))


def test_system_and_tools_share_one_turn():
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert render_prompt_text(messages, [TOOL]) == (
        f"<|im_start|>system\nBe brief.\n\n{TOOLS_SYSTEM}<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_history_rule_tool_results_and_thinking_off():
    messages = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1", "reasoning_content": "r1"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": None, "reasoning_content": "r2", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
        {"role": "tool", "tool_call_id": "call_1", "content": "rain"},
    ]
    assert last_query_index(messages) == 2
    assert render_prompt_text(messages, enable_thinking=False) == (
        "<|im_start|>user\nq1<|im_end|>\n"
        "<|im_start|>assistant\na1<|im_end|>\n"  # before the last query: reasoning dropped
        "<|im_start|>user\nq2<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nr2\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        "<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n18C\n</tool_response>"
        "\n<tool_response>\nrain\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def test_final_assistant_turn_always_gets_a_think_block():
    said = [{"role": "user", "content": "q"},
            {"role": "assistant", "content": "<think>\nplan\n</think>\n\nanswer"}]
    assert render_prompt_text(said, add_generation_prompt=False) == (
        "<|im_start|>user\nq<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nplan\n</think>\n\nanswer<|im_end|>\n")
    plain = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "hello"}]
    assert render_prompt_text(plain, add_generation_prompt=False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\nhello<|im_end|>\n")


def test_a_tool_response_user_turn_is_not_the_last_query():
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "x",
                                                  "reasoning_content": "r"},
                {"role": "user", "content": "<tool_response>\nok\n</tool_response>"}]
    assert last_query_index(messages) == 0
    assert "<think>\nr\n</think>\n\nx" in render_prompt_text(messages)


def test_a_leading_system_message_must_be_text():
    with pytest.raises(FormatError, match="messages\\[0\\]"):
        render_prompt_text([{"role": "system", "content": None}, {"role": "user", "content": "q"}])


def _kwargs(case, agp=True):
    return {"enable_thinking": case["enable_thinking"], "add_generation_prompt": agp}


def test_python_renderer_equals_our_jinja_rendered_by_transformers():
    ours = template_text()
    checked = 0
    for k, case in enumerate(all_cases(N_CASES)):
        for agp in (True, False):
            expected = render_with_template(ours, case["messages"], case["tools"],
                                            **_kwargs(case, agp))
            assert render_prompt_text(case["messages"], case["tools"],
                                      **_kwargs(case, agp)) == expected, k
            checked += 1
    assert checked == 2 * (N_CASES + len(EDGE_CASES))


def test_prompt_ids_equal_the_jinja_render_encoded_as_servers_do(fmt):
    ours = template_text()
    for k, case in enumerate(all_cases(N_CASES)):
        rendered = render_with_template(ours, case["messages"], case["tools"], **_kwargs(case))
        thinking = case["enable_thinking"] is not False
        assert fmt.encode_prompt(case["messages"], case["tools"], thinking=thinking) == \
            fmt.tok.encode_with_specials(rendered), k


REAL_TEMPLATE = os.environ.get("QWEN3_TEMPLATE_PATH")


@pytest.mark.skipif(not REAL_TEMPLATE, reason="QWEN3_TEMPLATE_PATH not set (the real Qwen3 "
                                              "chat template is not shipped)")
def test_python_renderer_and_our_jinja_equal_the_real_template():
    """We follow the current revision of the Qwen3 hybrid template (the `... is string` checks,
    as Qwen/Qwen3-8B ships it since mid-2025). Where the template given raises (the April-2025
    revision cannot render null or list content), a server using it refuses the request and
    there is nothing to equal, so those inputs are counted, not compared."""
    real = Path(REAL_TEMPLATE).read_text(encoding="utf-8")
    ours = template_text()
    compared = refused = 0
    for k, case in enumerate(all_cases(N_CASES)):
        for agp in (True, False):
            try:
                want = render_with_template(real, case["messages"], case["tools"],
                                            **_kwargs(case, agp))
            except (TypeError, jinja2.exceptions.UndefinedError):
                refused += 1
                continue
            where = (f"case {k}, add_generation_prompt={agp} (we follow the current Qwen3 "
                     "hybrid revision; specregen/models/qwen3/render.py says where the "
                     "April-2025 one differs)")
            assert render_with_template(ours, case["messages"], case["tools"],
                                        **_kwargs(case, agp)) == want, where
            assert render_prompt_text(case["messages"], case["tools"],
                                      **_kwargs(case, agp)) == want, where
            compared += 1
    # Guard against a vacuous pass: the current revision renders every case, the April-2025 one
    # about three in four; a template refusing most of them is not one worth matching.
    assert compared >= N_CASES, (compared, refused)


def test_server_view_prompt_ids_equal_the_vllm_render(fmt):
    """Reconstruction renders what vLLM renders once it applies vLLM's message preprocessing
    (history arguments re-dumped, text parts joined, `reasoning` as `reasoning_content`)."""
    from specregen.models.qwen3 import servers, vllm_legacy

    redumped = 0
    for seed in range(N_CASES):
        case = conversation(seed)
        request = {"messages": case["messages"], "tools": case["tools"]}
        if case["enable_thinking"] is not None:
            request["chat_template_kwargs"] = {"enable_thinking": case["enable_thinking"]}
        view = servers.server_messages(case["messages"])
        thinking = case["enable_thinking"] is not False
        ours = fmt.encode_prompt(view, case["tools"], thinking=thinking)
        assert ours == vllm_legacy.encode_prompt(request, fmt.tok), seed
        redumped += ours != fmt.encode_prompt(case["messages"], case["tools"], thinking=thinking)
    assert redumped > 0  # the compact argument strings in the cases do change the prompt
