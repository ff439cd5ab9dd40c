"""`partial_json_parser.loads` as SGLang's tool-call detectors call it (`_partial_json_loads`,
sglang `function_call/utils.py`): the first JSON value of a text that may be cut anywhere,
completed as `partial_json_parser` completes it. Restated from partial-json-parser
0.2.1.1.post7; no family's format in it.
"""

from __future__ import annotations

import json
from typing import Any


class PartialJSONError(ValueError):
    """`partial_json_parser` found nothing it can complete (upstream: MalformedJSON or a
    JSONDecodeError other than "Extra data"; the detector returns an empty result)."""


def _skip_blank(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def _complete_str(text: str, allow_str: bool) -> tuple[int, str | bool] | bool:
    """`partial_json_parser.core.complete.complete_str`: (end, True) for a whole string, else
    (cut, '"') -- a partial escape cut off -- when partial strings are allowed."""
    i = 1
    last_escaped = -1
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            last_escaped = i + 1
            if last_escaped == len(text):
                break
            i += 2
            continue
        if ch == '"':
            return i + 1, True
        i += 1
    if not allow_str:
        return False
    i = min(i, len(text))
    for esc, width in (("\\u", 5), ("\\U", 9), ("\\x", 3)):
        at = text.rfind(esc, max(0, i - width), i)
        if at != -1 and at != last_escaped:
            return at, '"'
    return i, '"'


def _complete_any(text: str, allow_str: bool, top: bool = False
                  ) -> tuple[int, str | bool] | bool:
    """`complete_any` with every partial kind allowed but (maybe) strings."""
    i = _skip_blank(text, 0)
    if i >= len(text):
        raise IndexError
    ch = text[i]
    if ch == '"':
        return _complete_str(text, allow_str)
    if ch == "-" and len(text) == 1:
        return False
    if ch in "0123456789" or (ch == "-" and text[1] != "I"):
        return _complete_num(text, top)
    if ch == "[":
        return _complete_container(text, allow_str, "]")
    if ch == "{":
        return _complete_container(text, allow_str, "}")
    for word in ("null", "true", "false", "Infinity", "-Infinity", "NaN"):
        if text.startswith(word):
            return len(word), True
        if word.startswith(text):
            return 0, word
    raise PartialJSONError(f"unexpected character {ch!r}")


def _complete_num(text: str, top: bool) -> tuple[int, str | bool]:
    i = 1
    while i < len(text) and text[i] in "1234567890.-+eE":
        i += 1
    modified = False
    while text[i - 1] in ".-+eE":
        modified = True
        i -= 1
    if modified or (i == len(text) and not top):
        return i, ""
    return i, True


def _complete_container(text: str, allow_str: bool, close: str
                        ) -> tuple[int, str | bool]:
    """`complete_obj` / `complete_arr`: the members up to the last complete one, closed."""
    i = j = 1
    try:
        while True:
            j = _skip_blank(text, j)
            if text[j] == close:
                return j + 1, True
            if close == "}":
                if text[j] != '"':
                    raise PartialJSONError("expected a key")
                key = _complete_str(text[j:], allow_str)
                if not (key and key[1] is True):  # type: ignore[index]
                    return i, close
                j += key[0]  # type: ignore[index]
                j = _skip_blank(text, j)
                if text[j] != ":":
                    raise PartialJSONError("expected ':'")
                j = _skip_blank(text, j + 1)
            value = _complete_any(text[j:], allow_str)
            if value is False:
                return i, close
            if value[1] is True:  # type: ignore[index]
                i = j = j + value[0]  # type: ignore[index]
            else:
                # value is (end, closing text) here: _complete_any's False and (end, True)
                # were handled above, which its union return type cannot say.
                return j + value[0], value[1] + close  # type: ignore[index,operator,return-value]
            j = _skip_blank(text, j)
            if text[j] == ",":
                j += 1
            elif text[j] == close:
                return j + 1, True
            else:
                raise PartialJSONError(f"expected ',' or {close!r}")
    except IndexError:
        return i, close


def partial_loads(text: str, allow_str: bool) -> tuple[Any, int]:
    """`_partial_json_loads` (sglang `function_call/utils.py`) over `partial_json_parser.loads`:
    (value, characters consumed). Balanced brackets: `json.loads` of the whole text, and on
    "Extra data" the first value by `raw_decode`; otherwise the text is completed as `fix`
    does (a partial string dropped with its key when strings are not allowed). Checked equal
    to partial-json-parser 0.2.1.1.post7 (`fix_fast`) on every prefix of 300 call bodies
    during development (docs/qwen3.md)."""
    depth = 0
    in_str = esc = False
    for ch in text:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
    if depth <= 0:
        try:
            return json.loads(text), len(text)
        except json.JSONDecodeError as exc:
            if "Extra data" in exc.msg:
                return json.JSONDecoder().raw_decode(text)
            raise PartialJSONError(str(exc)) from None
    try:
        stripped = text.strip()
        result = _complete_any(stripped, allow_str, top=True)
    except IndexError:
        raise PartialJSONError("nothing to complete") from None
    if result is False:
        raise PartialJSONError("partial value not allowed")
    end, tail = result  # type: ignore[misc]
    if tail is True:
        # A whole first value with more after it (`fix_fast` completes the rest, and
        # `json.loads` then fails on "Extra data": `raw_decode` gives the first value).
        return json.loads(text[:end]), end
    completed = text[:end] + tail  # type: ignore[operator]  # a str: True returned above
    try:
        value = json.loads(completed)
    except json.JSONDecodeError as exc:
        if "Extra data" in exc.msg:
            return json.JSONDecoder().raw_decode(completed)[0], len(text)
        raise PartialJSONError(str(exc)) from None
    return value, len(text)
