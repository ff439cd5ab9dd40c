"""The API key: held in one small object that never prints itself, and scrubbed from stored text.

The key goes into exactly one place, the `Authorization` header, set by `BearerAuth` when httpx
sends the request (httpx itself shows that header as `[secure]` in reprs). Everything the client
stores or raises (error messages, response bodies, log records) passes through `scrub` first, in
case a server echoes the key back.
"""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from collections.abc import Generator
from typing import Any

import httpx

REDACTED = "[redacted]"

# Scrubbing replaces every occurrence of the key in model text. A real key is long and random;
# a short placeholder like "EMPTY" (the vLLM convention) is no secret, and replacing it would
# corrupt answers that happen to contain the word.
MIN_SCRUB_LENGTH = 12


# Prefixes of real credentials (OpenAI, OpenRouter, Anthropic, Hugging Face, AWS access keys,
# GitHub, GitLab, Slack, Google API keys) and an HTTP auth scheme.
_KEY_PREFIX = re.compile(
    r"^(?:sk-|sk_|rk-|hf_[A-Za-z0-9]{8}|AKIA[0-9A-Z]{12}|ASIA[0-9A-Z]{12}|ghp_|gho_|ghs_|"
    r"github_pat_|glpat-|xox[abpr]-|AIza[0-9A-Za-z_-]{8}|Bearer\s|Basic\s)",
    re.IGNORECASE,
)
# A random token: one run of at least this many characters without a separator ...
_RANDOM_RUN = 16
# ... whose characters carry at least this many bits each (names of variables and blocks are
# words: "OPENROUTER_API_KEY" segments are short and low in entropy).
_RANDOM_BITS = 3.0


def _entropy_bits(text: str) -> float:
    counts = Counter(text)
    n = len(text)
    return -sum(c / n * math.log2(c / n) for c in counts.values())


def looks_like_secret(value: str) -> bool:
    """True when `value`, given where a NAME belongs, looks like a key rather than a name.

    Known key prefixes, or a long run of mixed letters and digits with high entropy (a random
    token). Callers refuse such a value WITHOUT echoing it.
    """
    text = value.strip()
    if _KEY_PREFIX.match(text):
        return True
    for run in re.split(r"[_\-.:/\s]+", text):
        if len(run) < _RANDOM_RUN:
            continue
        classes = sum(
            bool(re.search(pattern, run)) for pattern in ("[a-z]", "[A-Z]", "[0-9]")
        )
        if classes >= 2 and _entropy_bits(run) >= _RANDOM_BITS:
            return True
    return len(text) >= 40 and _entropy_bits(text) >= 4.0


class ApiKey:
    """An API key whose repr, str and pickle never reveal it; `reveal()` is the only way out."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        if not isinstance(value, str) or not value:
            raise ValueError("an API key must be a non-empty string")
        self._value = value

    @classmethod
    def from_env(cls, variable: str) -> ApiKey | None:
        """The key in environment variable `variable`, or None when it is unset or empty."""
        value = os.environ.get(variable, "").strip()
        return cls(value) if value else None

    def reveal(self) -> str:
        return self._value

    def scrub(self, text: str) -> str:
        return scrub_text(text, self)

    def __repr__(self) -> str:
        return f"ApiKey({REDACTED})"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return repr(self)

    def __reduce__(self) -> Any:
        raise TypeError("an ApiKey cannot be pickled")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ApiKey) and other._value == self._value

    def __hash__(self) -> int:
        return hash((ApiKey, self._value))


def as_api_key(key: ApiKey | str | None) -> ApiKey | None:
    if key is None or isinstance(key, ApiKey):
        return key
    return ApiKey(key) if key else None


def scrub_text(text: str, key: ApiKey | None) -> str:
    if key is None or len(key.reveal()) < MIN_SCRUB_LENGTH:
        return text
    return text.replace(key.reveal(), REDACTED)


def scrub_obj(obj: Any, key: ApiKey | None) -> Any:
    """A copy of a JSON-like value with the key replaced in every string (keys included)."""
    if key is None or len(key.reveal()) < MIN_SCRUB_LENGTH:
        return obj
    secret = key.reveal()

    def walk(value: Any) -> Any:
        if isinstance(value, str):
            return value.replace(secret, REDACTED) if secret in value else value
        if isinstance(value, dict):
            return {walk(k): walk(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [walk(v) for v in value]
        return value

    return walk(obj)


class BearerAuth(httpx.Auth):
    """Sets `Authorization: Bearer <key>` on the way out; nothing else ever sees the key."""

    def __init__(self, key: ApiKey) -> None:
        self._key = key

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["Authorization"] = "Bearer " + self._key.reveal()
        yield request

    def __repr__(self) -> str:
        return f"BearerAuth({REDACTED})"
