"""Request bodies and their fingerprints, pinned: the fingerprint keys the raw log (a changed one
re-pays for every answer) and the body is what was sent and stored. The values were computed
from the code before the wire layer (specregen/wire/) took over building requests."""

import hashlib
import json

import pytest

from specregen.client.config import EndpointConfig
from specregen.client.request import build_request
from specregen.records import Prompt
from specregen.wire.request import request_fingerprint

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
MESSAGES = [{"role": "system", "content": "Be brief. é ü 中文"},
            {"role": "user", "content": "Weather in Paris?"}]
CONVERSATION = [*MESSAGES,
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "functions.get_weather:0", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "sunny"},
                {"role": "assistant", "content": "Sunny."},
                {"role": "user", "content": "And Rome?"}]
K25 = "moonshotai/Kimi-K2.5"
QWEN3 = "Qwen/Qwen3-8B"
ENDPOINTS = {
    "openrouter": dict(base_url="https://openrouter.ai/api/v1", model=K25, dialect="openrouter",
                       reasoning={"effort": "high", "exclude": False},
                       provider={"only": ["moonshotai"], "allow_fallbacks": False},
                       thinking=True,
                       sampling={"max_tokens": 512, "temperature": 0.6, "seed": 7}),
    "openrouter_plain": dict(base_url="https://openrouter.ai/api/v1", model=K25),
    "vllm": dict(base_url="http://127.0.0.1:8000/v1", model=K25, dialect="vllm",
                 api_key_env="VLLM_KEY", thinking=False, return_token_ids=True, logprobs=True,
                 sampling={"max_tokens": 64, "top_p": 0.9}),
    "vllm_qwen3": dict(base_url="http://127.0.0.1:8000/v1", model=QWEN3, dialect="vllm",
                       api_key_env="VLLM_KEY", thinking=True, text_as_written=False),
    "sglang": dict(base_url="http://127.0.0.1:30000/v1", model=QWEN3, dialect="sglang",
                   api_key_env="SGL_KEY", thinking=False, logprobs=True, return_token_ids=True),
    "moonshot": dict(base_url="https://api.moonshot.ai/v1", model=K25, dialect="moonshot",
                     api_key_env="MOONSHOT_API_KEY", thinking=False,
                     sampling={"max_tokens": 256}),
    "moonshot_default": dict(base_url="https://api.moonshot.ai/v1", model=K25,
                             dialect="moonshot", api_key_env="MOONSHOT_API_KEY"),
}
# endpoint/stream|plain -> (request_fingerprint, sha256 of the body as sent, first 16 hex)
PINNED = {
    "openrouter/stream": ("174c51d2a6e3dd9a4908bee183a9f2e406814a1127956da55bdcf850f403ef7c",
                          "07add32b816a8f03"),
    "openrouter/plain": ("174c51d2a6e3dd9a4908bee183a9f2e406814a1127956da55bdcf850f403ef7c",
                         "bda4f578d63fb46c"),
    "openrouter_plain/stream": ("21f4be874990ace8405f9a23af403c472033da7d39e363f69b18c5219f0c3d17",
                                "722e807a357e8ced"),
    "openrouter_plain/plain": ("21f4be874990ace8405f9a23af403c472033da7d39e363f69b18c5219f0c3d17",
                               "60e24b08c3645a93"),
    "vllm/stream": ("492b990beccc1a50b2aaaee01ad845cc87df5748ff0e424bfc34658880046725",
                    "a9b1eb6e40aefad5"),
    "vllm/plain": ("492b990beccc1a50b2aaaee01ad845cc87df5748ff0e424bfc34658880046725",
                   "1a4fea1c3c926532"),
    "vllm_qwen3/stream": ("e4b70b4a74c3291fa8d26990b1c021ddad31a4487d946732d96299eed0aaacf8",
                          "67718ef16934e208"),
    "vllm_qwen3/plain": ("e4b70b4a74c3291fa8d26990b1c021ddad31a4487d946732d96299eed0aaacf8",
                         "993e22439be97b60"),
    "sglang/stream": ("8006c35fcae0263500ac212f5e2dde7ec6e637120ce934a669949ea4a02ec2d6",
                      "6aa8e26712d1f85b"),
    "sglang/plain": ("8006c35fcae0263500ac212f5e2dde7ec6e637120ce934a669949ea4a02ec2d6",
                     "1822815ea71ddc25"),
    "moonshot/stream": ("7df959f180c55fb56cddf16c9fe3c04d72a151c2ab0078f3ea166d70e52f36ee",
                        "077e00a7a63565ad"),
    "moonshot/plain": ("7df959f180c55fb56cddf16c9fe3c04d72a151c2ab0078f3ea166d70e52f36ee",
                       "3d02a52b58c8b556"),
    "moonshot_default/stream": ("21f4be874990ace8405f9a23af403c472033da7d39e363f69b18c5219f0c3d17",
                                "78eaec0fe5f667db"),
    "moonshot_default/plain": ("21f4be874990ace8405f9a23af403c472033da7d39e363f69b18c5219f0c3d17",
                               "60e24b08c3645a93"),
}


def _sent(body: dict) -> str:
    # Key order included: the body is sent and stored as built.
    return hashlib.sha256(json.dumps(body, ensure_ascii=False).encode()).hexdigest()[:16]


@pytest.mark.parametrize("key", sorted(PINNED))
def test_bodies_and_fingerprints_are_pinned(key):
    name, mode = key.split("/")
    cfg = EndpointConfig(**ENDPOINTS[name], stream=mode == "stream")
    body = build_request(Prompt("s1", MESSAGES, TOOLS), cfg)
    assert (request_fingerprint(body), _sent(body)) == PINNED[key]
    # A conversation's first request is the same body; tools declared in the system prompt
    # (or none) send no `tools`.
    assert build_request(Prompt("s4", CONVERSATION, TOOLS, turns="all"), cfg) == body
    plain = build_request(Prompt("s2", MESSAGES), cfg)
    assert "tools" not in plain
    assert build_request(Prompt("s3", MESSAGES, TOOLS, tool_mode="system"), cfg) == plain
