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


def strip_server_ids(raw: Path, dest: Path, *, keep_logprobs: bool = False) -> Path:
    """A copy of raw log folder `raw` in `dest` without the server's ids (the reference
    completion and prompt ids, in the record and in the body) and, unless `keep_logprobs`,
    its logprobs: the raw log of a provider that returns none."""
    import json

    dest.mkdir(parents=True, exist_ok=True)
    for part in raw.glob("part-*.jsonl"):
        records = [json.loads(line) for line in part.read_text().splitlines() if line.strip()]
        for record in records:
            record.pop("reference_completion_ids", None)
            record.pop("prompt_token_ids", None)
            response = record.get("response") or {}
            response.pop("prompt_token_ids", None)
            for choice in response.get("choices") or ():
                choice.pop("token_ids", None)
                if not keep_logprobs:
                    choice.pop("logprobs", None)
        (dest / part.name).write_text("".join(json.dumps(r) + "\n" for r in records))
    return dest
