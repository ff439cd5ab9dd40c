"""The API key: held in one small object that never prints itself, and scrubbed from stored text.

The key goes into exactly one place, the `Authorization` header, set by `BearerAuth` when httpx
sends the request (httpx itself shows that header as `[secure]` in reprs). Everything the client
stores or raises (error messages, response bodies, log records) passes through `scrub` first, in
case a server echoes the key back.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import Any

import httpx

REDACTED = "[redacted]"

# Scrubbing replaces every occurrence of the key in model text. A real key is long and random;
# a short placeholder like "EMPTY" (the vLLM convention) is no secret, and replacing it would
# corrupt answers that happen to contain the word.
MIN_SCRUB_LENGTH = 12


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
