"""Endpoint config validation, request bodies per dialect, and the request fingerprint."""

from __future__ import annotations

import pytest

from specregen.client.config import ConfigError, EndpointConfig
from specregen.client.request import build_request
from specregen.records import Prompt
from specregen.wire.request import request_fingerprint
from specregen.wire.response import reasoning_excluded, thinking_from_request
from tests.unit.test_client_support import make_cfg

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
PROMPT = Prompt(sample_id="a", messages=[{"role": "user", "content": "hi"}], tools=TOOLS)


def load_error(**data) -> str:
    with pytest.raises(ConfigError) as caught:
        EndpointConfig.load({"base_url": "https://openrouter.ai/api/v1", "model": "m", **data})
    return str(caught.value)


def test_defaults_and_derived_values():
    cfg = EndpointConfig.load(
        {"base_url": "https://openrouter.ai/api/v1/", "model": "m", "concurrency": 2000}
    )
    assert cfg.chat_url == "https://openrouter.ai/api/v1/chat/completions"
    assert (cfg.dialect, cfg.api_key_env, cfg.stream) == ("openrouter", "OPENROUTER_API_KEY", True)
    assert cfg.connections_per_shard == 25 and cfg.shards == 80


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"sampling": {"max_tokens": 0}}, "sampling.max_tokens: Input should be greater than 0"),
        ({"provider": {"order": ["a"], "onyl": ["b"]}},
         "provider.onyl: unknown field (did you mean 'only'?)"),
        ({"dialect": "bedrock"}, "dialect: Input should be"),
        ({"base_url": "openrouter.ai"}, "base_url: must be an http"),
        ({"reasoning": {"effort": "high", "max_tokens": 100}}, "either effort or max_tokens"),
        ({"dialect": "vllm", "provider": {"order": ["x"]}}, "provider: only the openrouter"),
        ({"thinking": True, "reasoning": {"effort": "none"}}, "thinking: contradicts"),
        ({"dialect": "vllm", "budget_usd": 5}, "budget_usd: needs prices"),
        ({"provider": {"quantizations": ["int3"]}}, "provider.quantizations[0]"),
        ({"timeouts": {"idle": -1}}, "timeouts.idle"),
        ({"retry": {"max_attempts": 0}}, "retry.max_attempts"),
    ],
)
def test_errors_name_the_field(data, words):
    assert words in load_error(**data)


def test_a_key_pasted_into_api_key_env_is_refused_and_not_echoed():
    key = "sk-or-v1-0123456789abcdef0123456789abcdef"
    message = load_error(api_key_env=key)
    assert "api_key_env: must be the NAME of an environment variable" in message
    assert key not in message


def test_openrouter_body():
    cfg = make_cfg(
        provider={
            "order": ["moonshotai", "fireworks"],
            "allow_fallbacks": False,
            "require_parameters": True,
            "quantizations": ["int4"],
            "enforce_distillable_text": True,
            "data_collection": "deny",
            "zdr": True,
            "sort": "throughput",
        },
        reasoning={"effort": "high", "exclude": False},
        sampling={"max_tokens": 1024, "temperature": 0.6, "top_p": 0.95, "seed": 7},
        stream=True,
    )
    body = build_request(PROMPT, cfg)
    assert body == {
        "model": "moonshotai/kimi-k2.5",
        "messages": PROMPT.messages,
        "tools": TOOLS,
        "max_tokens": 1024,
        "temperature": 0.6,
        "top_p": 0.95,
        "seed": 7,
        "reasoning": {"effort": "high", "exclude": False},
        "provider": {
            "order": ["moonshotai", "fireworks"],
            "allow_fallbacks": False,
            "require_parameters": True,
            "quantizations": ["int4"],
            "enforce_distillable_text": True,
            "data_collection": "deny",
            "zdr": True,
            "sort": "throughput",
        },
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    assert thinking_from_request(body) is True and not reasoning_excluded(body)


def test_tools_only_in_tools_mode():
    cfg = make_cfg()
    assert "tools" not in build_request(
        Prompt(sample_id="a", messages=PROMPT.messages, tools=TOOLS, tool_mode="system_prompt"), cfg
    )
    assert "tools" not in build_request(Prompt(sample_id="a", messages=PROMPT.messages), cfg)


@pytest.mark.parametrize("thinking", [True, False, None])
def test_thinking_per_dialect_reads_back_the_same(thinking):
    bodies = {
        "openrouter": build_request(PROMPT, make_cfg(thinking=thinking)),
        "vllm": build_request(PROMPT, make_cfg(dialect="vllm", thinking=thinking)),
        "sglang": build_request(PROMPT, make_cfg(dialect="sglang", thinking=thinking)),
        "moonshot": build_request(PROMPT, make_cfg(dialect="moonshot", thinking=thinking)),
    }
    for dialect, body in bodies.items():
        assert thinking_from_request(body) is thinking, dialect
    if thinking is not None:
        assert bodies["vllm"]["chat_template_kwargs"] == {"thinking": thinking}
        assert bodies["moonshot"]["thinking"] == {"type": "enabled" if thinking else "disabled"}
        assert bodies["openrouter"]["reasoning"] == {"enabled": thinking}


def test_token_ids_are_asked_for_in_any_dialect_when_configured():
    # The emulator speaks OpenRouter and returns reference ids, like vLLM.
    assert build_request(PROMPT, make_cfg(return_token_ids=True))["return_token_ids"] is True
    assert "return_token_ids" not in build_request(PROMPT, make_cfg())


def test_vllm_token_ids_and_moonshot_stream_options():
    vllm = build_request(PROMPT, make_cfg(dialect="vllm", return_token_ids=True, stream=True))
    assert vllm["return_token_ids"] is True
    assert vllm["stream_options"] == {"include_usage": True}
    assert "provider" not in vllm and "reasoning" not in vllm
    moonshot = build_request(PROMPT, make_cfg(dialect="moonshot", stream=True))
    assert moonshot["stream"] is True and "stream_options" not in moonshot


def test_fingerprint_ignores_transport_and_secrets_but_not_content():
    streamed = build_request(PROMPT, make_cfg(stream=True))
    plain = build_request(PROMPT, make_cfg(stream=False))
    assert streamed != plain
    assert request_fingerprint(streamed) == request_fingerprint(plain)
    assert request_fingerprint({**plain, "api_key": "x"}) == request_fingerprint(plain)
    reordered = dict(reversed(list(plain.items())))
    assert request_fingerprint(reordered) == request_fingerprint(plain)
    for change in (
        {"sampling": {"max_tokens": 5}},
        {"provider": {"order": ["a"]}},
        {"thinking": False},
        {"model": "other"},
    ):
        assert request_fingerprint(
            build_request(PROMPT, make_cfg(**change))
        ) != request_fingerprint(plain), change
    assert len(request_fingerprint(plain)) == 64
