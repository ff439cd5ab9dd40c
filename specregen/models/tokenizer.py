"""Tokenizer loading: Kimi's tiktoken layout, a Hugging Face hub id, any `tokenizer.json` folder,
the bundled `mini`, and each family's bundled test tokenizers by alias (`mini-qwen3`, `mini-k3`:
declared by the family's descriptor, `models/<family>/family.py`, found through the registry).

The tokenizer type and the loaders are `tokenizer_base`'s (below the registry); this module adds
the aliases, so that a family's bundled tokenizer needs no line here.
"""

from __future__ import annotations

from pathlib import Path

from specregen.models.registry import bundled_tokenizer_folders
from specregen.models.tokenizer_base import (
    ASSETS_DIR,
    KIMI_NUM_RESERVED_SPECIAL_TOKENS,
    KIMI_PAT_STR,
    MINI_TOKENIZER_DIR,
    TOKENIZER_FILES,
    Tokenizer,
    TokenizerError,
    is_whole_piece,
    kimi_encode_pieces,
    load_folder,
    load_hf_tokenizer,
    load_kimi_tiktoken,
    load_tokenizer_spec,
    read_tiktoken_ranks,
    special_finder,
)


def load_tokenizer(spec: str | Path) -> Tokenizer:
    """Load a tokenizer from `mini` or a family's bundled alias (`mini-qwen3`, `mini-k3`, ...:
    `registry.bundled_tokenizer_folders`), a local folder, or a hub id.

    A folder with `tiktoken.model` + `tokenizer_config.json` is read as the Kimi layout; a folder
    with `tokenizer.json` goes through `transformers.AutoTokenizer`. Anything else that is not an
    existing path is taken as a hub id, and only the tokenizer files are downloaded.
    """
    bundled = bundled_tokenizer_folders() if str(spec) != "mini" else None
    return load_tokenizer_spec(spec, bundled)


__all__ = [
    "ASSETS_DIR",
    "KIMI_NUM_RESERVED_SPECIAL_TOKENS",
    "KIMI_PAT_STR",
    "MINI_TOKENIZER_DIR",
    "TOKENIZER_FILES",
    "Tokenizer",
    "TokenizerError",
    "is_whole_piece",
    "kimi_encode_pieces",
    "load_folder",
    "load_hf_tokenizer",
    "load_kimi_tiktoken",
    "load_tokenizer",
    "read_tiktoken_ranks",
    "special_finder",
]
