"""The emulator serving Qwen3 (profiles vllm-hermes, openrouter and sglang): its answers, plain and
streamed, reconstruct to exactly the ids it says the model saw and wrote.

The emulator's truth comes from `servers.model_ids` (segment by segment) and its prompt from the
Jinja template rendered by transformers; reconstruction uses the format's own Python renderer
and one-text assembly -- independent paths, so agreement is evidence.
"""

from __future__ import annotations

import httpx
import pytest

from specregen.emulator.config import EmulatorConfig
from specregen.emulator.server import serve_in_thread
from specregen.models.registry import get_format
from specregen.models.tokenizer import load_tokenizer
from specregen.reconstruct import reconstruct
from tests.unit.test_emulator import assemble_sse

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "days": {"type": "integer"}}}}},
    {"type": "function", "function": {
        "name": "search_files", "description": "Find files",
        "parameters": {"type": "object", "properties": {"pattern": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def qwen():
    return get_format("qwen3", load_tokenizer("mini-qwen3"))


def _request(k: int, profile: str) -> dict:
    request: dict = {"model": "Qwen/Qwen3-8B", "return_token_ids": True,
                     "messages": [{"role": "user", "content": f"What is the weather, case {k}?"}]}
    if k % 3:
        request["tools"] = TOOLS
    if k % 4 == 1:
        if profile == "openrouter":
            request["reasoning"] = {"enabled": False}
        else:
            request["chat_template_kwargs"] = {"enable_thinking": False}
    if k % 5 == 2:
        request["max_tokens"] = 40
    return request


@pytest.mark.parametrize("profile", ["vllm-hermes", "openrouter", "sglang"])
def test_qwen3_answers_reconstruct_to_the_emulators_true_ids(qwen, profile):
    config = EmulatorConfig(profile=profile, model="Qwen/Qwen3-8B", seed=7,
                            reasoning_tokens_mean=40, content_tokens_mean=30)
    with_calls = truncated = 0
    with serve_in_thread(config, qwen.tok) as emu:
        base = emu.openrouter_url if profile == "openrouter" else emu.url
        for k in range(24):
            request = _request(k, profile)
            plain = httpx.post(base + "/chat/completions", json=request, timeout=30).json()
            streamed, _ = assemble_sse(httpx.post(base + "/chat/completions",
                                                  json={**request, "stream": True},
                                                  timeout=30).text)
            for body, stream in ((plain, False), (streamed, True)):
                choice = body["choices"][0]
                truth = choice["token_ids"]
                prompt = body["prompt_token_ids"]
                assert body["usage"]["completion_tokens"] == len(truth)
                with_calls += bool(choice["message"].get("tool_calls"))
                truncated += choice["finish_reason"] == "length"
                sample = reconstruct(f"s{k}", {**request, "stream": stream}, body, qwen,
                                     reference_completion_ids=truth)
                assert sample.reference_match == "exact", (k, stream, sample.flags)
                assert sample.input_ids == prompt + truth
                # Without the server's ids: the prompt from our own renderer, the completion
                # from the fields alone.
                bare = {**body, "prompt_token_ids": None}
                alone = reconstruct(f"s{k}", {**request, "stream": stream}, bare, qwen)
                assert alone.input_ids[:alone.prompt_len] == prompt, (k, stream)
                assert alone.input_ids[alone.prompt_len:] == truth, (k, stream, alone.flags)
    assert with_calls >= 6 and truncated >= 2


def test_a_kimi_profile_is_refused_for_qwen3_and_vllm_hermes_for_kimi(qwen):
    from specregen.emulator.app import create_app

    with pytest.raises(ValueError, match="vllm-hermes, openrouter, sglang"):
        create_app(EmulatorConfig(profile="vllm", model="Qwen/Qwen3-8B"), qwen.tok)
    with pytest.raises(ValueError, match=r"the kimi-k2\.5 model is served with the profiles "
                       r"openrouter, vllm, .*stripped, not 'vllm-hermes'"):
        create_app(EmulatorConfig(profile="vllm-hermes"), load_tokenizer("mini"))
