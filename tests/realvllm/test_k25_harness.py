"""The harness itself, against the real vLLM with K2.5: a scripted answer comes back as
scripted, the script table is re-read while the server runs, and an unscripted prompt is
recorded as a miss."""

from __future__ import annotations

import httpx

from specregen.models.kimi_k25 import IM_END, THINK_END


def _chat(family, request):
    response = httpx.post(family.server.base_url + "/v1/chat/completions", json=request,
                          timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def test_a_scripted_answer_comes_back_with_its_ids_and_our_prompt(k25):
    tok = k25.tok
    request = {"model": k25.spec.served_model_name,
               "messages": [{"role": "user", "content": "Say hello. (harness 1)"}]}
    ids = [*tok.encode_ordinary("The user greets."), tok.token_id(THINK_END),
           *tok.encode_ordinary("Hello!"), tok.token_id(IM_END)]
    prompt = k25.server.script_request(request, ids)
    body = _chat(k25, {**request, "return_token_ids": True,
                       "spaces_between_special_tokens": False})
    choice = body["choices"][0]
    assert choice["token_ids"] == ids
    assert body["prompt_token_ids"] == prompt
    assert choice["message"]["reasoning"] == "The user greets."
    assert choice["message"]["content"] == "Hello!"
    # The prompt the server rendered is the one specregen renders (template and tokenizer).
    assert k25.fmt.encode_prompt(request["messages"], None, thinking=True) == prompt


def test_the_script_table_is_reread_while_the_server_runs(k25):
    tok = k25.tok
    request = {"model": k25.spec.served_model_name,
               "messages": [{"role": "user", "content": "Count. (harness 2)"}]}
    for word in ("one", "two"):
        ids = [tok.token_id(THINK_END), *tok.encode_ordinary(word), tok.token_id(IM_END)]
        k25.server.script_request(request, ids)
        body = _chat(k25, {**request, "return_token_ids": True})
        assert body["choices"][0]["token_ids"] == ids


def test_an_unscripted_prompt_is_recorded_as_a_miss(k25):
    request = {"model": k25.spec.served_model_name,
               "messages": [{"role": "user", "content": "Nobody scripted this. (harness 3)"}]}
    body = _chat(k25, {**request, "return_token_ids": True})
    assert body["choices"][0]["token_ids"] == [k25.spec.stop_id]
    assert any(m["prompt_len"] == len(body["prompt_token_ids"]) for m in k25.server.misses())
