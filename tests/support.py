"""Helpers shared by the tests: where the reference data is, and cached tokenizers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from specregen.models.tokenizer import Tokenizer, load_tokenizer

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"

_CACHE: dict[str, Tokenizer] = {}


def kimi_tokenizer_dir() -> Path | None:
    """The real Kimi vocabulary folder named by KIMI_TOKENIZER_DIR, if it is there."""
    value = os.environ.get("KIMI_TOKENIZER_DIR")
    if not value:
        return None
    path = Path(value)
    return path if (path / "tiktoken.model").is_file() else None


def get_tokenizer(which: str) -> Tokenizer:
    """'mini' (bundled) or 'kimi' (the real vocabulary; skips the test where it is absent)."""
    if which not in _CACHE:
        if which == "mini":
            _CACHE[which] = load_tokenizer("mini")
        else:
            folder = kimi_tokenizer_dir()
            if folder is None:
                pytest.skip("KIMI_TOKENIZER_DIR is not set to a folder with tiktoken.model")
            _CACHE[which] = load_tokenizer(folder)
    return _CACHE[which]
