"""vLLM's token-id arrays in a body: read as evidence (non-empty lists of ints only) and lifted
out of a stored body (whatever their length)."""

import pytest

from specregen.wire.request import WireOptions, build_body
from specregen.wire.token_ids import lift_token_ids, server_completion_ids, server_prompt_ids

BODY = {"id": "x", "prompt_token_ids": [1, 2],
        "choices": [{"index": 0, "message": {"content": "hi"}, "token_ids": [3, 4]},
                    {"index": 1, "message": {"content": "yo"}, "token_ids": [5]}]}


def test_lifted_ids_leave_the_first_choice_and_the_top_level():
    stored, reference, prompt = lift_token_ids(BODY)
    assert (reference, prompt) == ([3, 4], [1, 2])
    assert "prompt_token_ids" not in stored and "token_ids" not in stored["choices"][0]
    assert stored["choices"][1] == BODY["choices"][1]  # only the first choice is read
    assert BODY["prompt_token_ids"] == [1, 2]  # the body itself is left as it was
    plain = {"choices": [{"message": {}}]}
    assert lift_token_ids(plain) == (plain, None, None)
    empty = {"prompt_token_ids": [], "choices": [{"token_ids": []}]}
    assert lift_token_ids(empty) == ({"choices": [{}]}, [], [])


def test_only_a_non_empty_list_of_ints_is_evidence():
    assert server_prompt_ids(BODY) == [1, 2] and server_completion_ids(BODY) == [3, 4]
    for bad in ({"prompt_token_ids": [], "choices": [{"token_ids": []}]},
                {"prompt_token_ids": [1, "2"], "choices": [{"token_ids": [True]}]},
                {"choices": []}, {"choices": "x"}, None, []):
        assert server_prompt_ids(bad) is None and server_completion_ids(bad) is None


def test_a_template_dialect_needs_the_switch_to_switch_thinking():
    options = WireOptions(model="m", dialect="vllm", thinking=True, stream=False)
    with pytest.raises(ValueError, match="thinking switch"):
        build_body([{"role": "user", "content": "hi"}], None, options)
    body = build_body([{"role": "user", "content": "hi"}], None, options,
                      thinking_switch="enable_thinking")
    assert body["chat_template_kwargs"] == {"enable_thinking": True}
