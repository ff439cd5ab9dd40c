"""vLLM's token-id arrays in a response body: the prompt's (`prompt_token_ids`, top level) and
the completion's (`choices[0].token_ids`), sent when the request asked `return_token_ids`.

Two uses: reading them as evidence (`server_prompt_ids`, `server_completion_ids`: only a
non-empty list of ints counts), and lifting them out of a body before it is stored
(`lift_token_ids`: the raw log keeps them once, at the record's top level, and the stored
response without them).
"""

from __future__ import annotations

from typing import Any

PROMPT_IDS = "prompt_token_ids"
COMPLETION_IDS = "token_ids"


def id_list(value: Any) -> list[int] | None:
    """`value` as token ids when it is a non-empty list (or tuple) of ints, else None."""
    if isinstance(value, list | tuple) and value and all(type(t) is int for t in value):
        return list(value)
    return None


def server_prompt_ids(body: Any) -> list[int] | None:
    """The prompt ids the server says it rendered, when the body carries them."""
    return id_list(body.get(PROMPT_IDS)) if isinstance(body, dict) else None


def server_completion_ids(body: Any) -> list[int] | None:
    """The ids the server says the model wrote (the first choice's), when the body carries
    them."""
    first = _first_choice(body)
    return id_list(first.get(COMPLETION_IDS)) if first is not None else None


def lift_token_ids(
    response: dict[str, Any],
) -> tuple[dict[str, Any], list[int] | None, list[int] | None]:
    """The response without vLLM's token-id arrays, and those arrays (completion's, prompt's).

    An empty array is lifted too: the stored response never holds one, whatever its length."""
    prompt = _any_ints(response.get(PROMPT_IDS))
    first = _first_choice(response)
    reference = _any_ints(first.get(COMPLETION_IDS)) if first is not None else None
    if prompt is None and reference is None:
        return response, None, None
    stored = dict(response)
    if prompt is not None:
        stored.pop(PROMPT_IDS)
    if reference is not None:
        assert first is not None
        choices = response["choices"]
        stored["choices"] = [{k: v for k, v in first.items() if k != COMPLETION_IDS},
                             *choices[1:]]
    return stored, reference, prompt


def _first_choice(body: Any) -> dict[str, Any] | None:
    choices = body.get("choices") if isinstance(body, dict) else None
    first = choices[0] if isinstance(choices, list) and choices else None
    return first if isinstance(first, dict) else None


def _any_ints(value: Any) -> list[int] | None:
    # The stored form is the list as it came (no copy), empty or not.
    if isinstance(value, list) and all(type(v) is int for v in value):
        return value
    return None
