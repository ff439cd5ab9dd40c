"""Content fingerprints: sha256 over canonical JSON, so equal data always hashes equal.

Canonical means sorted keys, no insignificant whitespace, UTF-8 without `\\u` escapes, and no
NaN/Infinity (they are not JSON, and two runs could disagree on how to spell them).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(obj: Any) -> bytes:
    """The one byte string that `obj` serialises to, whatever its dict ordering."""
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fingerprint(obj: Any) -> str:
    """sha256 (hex) of the canonical JSON of `obj`."""
    return sha256_hex(canonical_json(obj))
