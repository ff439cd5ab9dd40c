"""Completion ids from logprobs: the tokens a provider says the model sampled.

Where a provider returns `logprobs` (one entry per generated token), the entries name the ids
themselves, so they prove a rebuilt completion the way a server's own ids do (evidence
`logprobs`, docs/evidence.md). An entry names its id exactly when it is vLLM's
`token_id:N` (`return_tokens_as_token_ids`); otherwise by its bytes (`bytes`, else the token
text), which must be one token of the vocabulary.

Where they cannot decide, they prove nothing and say why:
- a token that ends inside a UTF-8 character comes back as U+FFFD or as "" (vLLM merges a
  character's pieces into the token that completes it), so its bytes are not the token's;
- a provider may leave special tokens out: then the entries are fewer than the completion's
  tokens (`usage.completion_tokens`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specregen.models.tokenizer import Tokenizer

_TOKEN_ID = re.compile(r"token_id:(\d+)")


@dataclass(frozen=True)
class LogprobIds:
    """The ids the logprobs name, or None with the reason they cannot decide."""

    ids: list[int] | None
    why: str | None = None


def ids_from_logprobs(entries: Sequence[Any], tok: Tokenizer,
                      completion_tokens: int | None) -> LogprobIds:
    ids: list[int] = []
    for k, entry in enumerate(entries):
        token = entry.get("token") if isinstance(entry, dict) else None
        if not isinstance(token, str):
            return LogprobIds(None, f"entry {k} has no token")
        named = _TOKEN_ID.fullmatch(token)
        if named is not None:
            ids.append(int(named.group(1)))
            continue
        if token == "" or "\ufffd" in token:
            return LogprobIds(None, f"entry {k} is part of a UTF-8 character (came back as "
                                    f"{token!r}): its bytes are not the token's")
        added = tok.added_tokens.get(token)
        if added is not None:
            ids.append(added)
            continue
        raw = entry.get("bytes")
        data = bytes(raw) if isinstance(raw, list) and all(
            isinstance(b, int) and 0 <= b < 256 for b in raw) else token.encode("utf-8")
        token_id = tok.token_of_bytes(data) if tok.token_of_bytes is not None else None
        if token_id is None:
            return LogprobIds(None, f"entry {k} ({token!r}) is not one token of "
                                    f"{tok.name}")
        ids.append(token_id)
    if completion_tokens is not None and len(ids) != completion_tokens:
        return LogprobIds(None, f"the logprobs cover {len(ids)} of {completion_tokens} tokens "
                                "(the provider leaves some out, e.g. special tokens)")
    return LogprobIds(ids)
