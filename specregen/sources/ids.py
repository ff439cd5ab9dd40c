"""Sample ids: the row's own id where it has one, else a hash of the row's content.

Ids never depend on where a row sits in the file, so reordering, sharding or re-downloading a
source gives the same ids, and an identical row repeated in the file gets the same id (which is
how duplicates are found).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

HASH_CHARS = 16


def canonical_json(value: Any) -> str:
    """One fixed text per JSON value, so the same row always hashes the same."""
    # `default=str` only matters for parquet cells that are not JSON types (bytes, timestamps):
    # their str() is stable, which is all a content hash needs.
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


def content_id(dataset: str, value: Any) -> str:
    digest = hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()
    return f"{dataset}-{digest[:HASH_CHARS]}"


def raw_text_id(dataset: str, text: str) -> str:
    """Id of text that is not JSON at all (an undecodable line), so its reject has an id too."""
    digest = hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()
    return f"{dataset}-{digest[:HASH_CHARS]}"


def own_id(row: Any, fields: Sequence[str]) -> str | None:
    """The row's own id from the first of `fields` that holds a usable one."""
    if not isinstance(row, dict):
        return None
    for name in fields:
        value = row.get(name)
        # bool is an int subclass but never a real id.
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        if isinstance(value, str) and value.strip():
            return value
    return None


def row_id(dataset: str, row: Any, fields: Sequence[str] = ()) -> str:
    return own_id(row, fields) or content_id(dataset, row)
