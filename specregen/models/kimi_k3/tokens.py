"""Kimi K3's added-token table, the check that a tokenizer has what the format needs, and the
tokenizer folders built from it.

K3 keeps Kimi's byte-level BPE (the K2/K2.5 `tiktoken.model`, 163,584 ranks) and its 256
reserved ids 163584-163839, but its added-token table is its own (docs/kimi-k3.md §1): the
ids 163586-163589 that K2.5 names `<|im_end|>`, `<|im_user|>`, `<|im_assistant|>` and a
reserved one are K3's `<|end_of_msg|>`, `<|open|>`, `<|close|>`, `<|sep|>`. A K2.5 table must
therefore never stand in for K3's: the format checks the names at load time.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from specregen.models.kimi_k3.encoding import CLOSE, END_OF_MSG, OPEN, SEP, Segment
from specregen.models.kimi_k3.family import MINI_K3_TOKENIZER_DIR
from specregen.models.tokenizer import (
    KIMI_PAT_STR,
    MINI_TOKENIZER_DIR,
    Tokenizer,
    TokenizerError,
)

BOS = "[BOS]"
EOS = "[EOS]"
UNK = "[UNK]"
PAD = "[PAD]"

# (id, content, special), from the model's tokenizer_config.json `added_tokens_decoder`
# (docs/kimi-k3.md §1); every other id of 163584-163839 is `<|reserved_token_{id}|>`.
ADDED_TOKENS: tuple[tuple[int, str, bool], ...] = (
    (163584, BOS, True),
    (163585, EOS, True),
    (163586, END_OF_MSG, True),
    (163587, OPEN, False),
    (163588, CLOSE, False),
    (163589, SEP, False),
    (163590, "[start_header_id]", True),
    (163591, "[end_header_id]", True),
    (163593, "[EOT]", True),
    (163602, "<|media_begin|>", True),
    (163603, "<|media_content|>", True),
    (163604, "<|media_end|>", True),
    (163605, "<|media_pad|>", True),
    (163649, "<osagent_mode>", True),
    (163838, UNK, True),
    (163839, PAD, True),
)
ADDED_IDS: dict[str, int] = {name: token_id for token_id, name, _ in ADDED_TOKENS}
# The tokens the format lays prompts and completions out with.
REQUIRED_TOKENS = (OPEN, CLOSE, SEP, END_OF_MSG)
VOCAB_SIZE = 163840  # the model's output size: ranks plus the 256 added ids


def check_tokenizer(tok: Tokenizer) -> dict[str, int]:
    """The ids of the four K3 markers, by name; a clear error naming the first one missing or
    encoding wrongly (a K2/K2.5 tokenizer has none of them: its table names those ids
    `<|im_end|>`, `<|im_user|>`, ...)."""
    ids: dict[str, int] = {}
    for name in REQUIRED_TOKENS:
        token_id = tok.added_tokens.get(name)
        if token_id is None:
            raise TokenizerError(
                f"tokenizer {tok.name!r} has no added token {name!r}, which Kimi K3 needs (a "
                f"K2/K2.5 tokenizer_config.json has the K2.5 table; build a K3 folder with "
                f"specregen.models.kimi_k3.tokens.write_tokenizer_folder); from {tok.source}")
        if tok.encode_with_specials(name) != [token_id]:
            raise TokenizerError(
                f"tokenizer {tok.name!r}: {name!r} does not encode to its single id {token_id}")
        if token_id < tok.base_vocab_size:
            raise TokenizerError(
                f"tokenizer {tok.name!r}: {name!r} has id {token_id}, inside the BPE ranks")
        ids[name] = token_id
    if len(set(ids.values())) != len(ids):
        raise TokenizerError(f"tokenizer {tok.name!r}: two K3 markers share one id")
    return ids


def encode_segments(tok: Tokenizer, segments: list[Segment],
                    cache: dict[str, list[int]] | None = None) -> list[int]:
    """The ids of rendered segments, each on its own: a marker as its one id (looked up by
    name), any other text as ordinary BPE in which special-token strings are plain text (with
    Kimi's cutting of very long text, `Tokenizer.encode_ordinary`). `cache` keeps the ids of
    short texts (tag names, attribute pieces) across calls."""
    ids: list[int] = []
    added = tok.added_tokens
    for piece, is_marker in segments:
        if is_marker:
            token_id = added.get(piece)
            if token_id is None:
                raise TokenizerError(f"tokenizer {tok.name!r} has no token {piece!r}")
            ids.append(token_id)
        elif cache is not None and len(piece) <= _CACHED_CHARS:
            found = cache.get(piece)
            if found is None:
                found = tok.encode_ordinary(piece)
                if len(cache) < _CACHE_ENTRIES:
                    cache[piece] = found
            ids.extend(found)
        else:
            ids.extend(tok.encode_ordinary(piece))
    return ids


_CACHED_CHARS = 32
_CACHE_ENTRIES = 8192


def tokenizer_config(note: str | None = None) -> dict[str, Any]:
    """K3's `tokenizer_config.json`: the added-token table and the named tokens (no chat
    template: K3 renders prompts in Python)."""
    decoder = {str(i): {"content": name, "lstrip": False, "normalized": False, "rstrip": False,
                        "single_word": False, "special": special}
               for i, name, special in ADDED_TOKENS}
    config: dict[str, Any] = {
        "added_tokens_decoder": decoder,
        "additional_special_tokens": [name for _, name, special in ADDED_TOKENS
                                      if special and name not in (BOS, EOS, UNK, PAD)],
        "bos_token": BOS, "eos_token": EOS, "unk_token": UNK, "pad_token": PAD,
        "clean_up_tokenization_spaces": False,
        "tokenizer_class": "TikTokenTokenizer",
    }
    if note:
        config["specregen_note"] = note
    return config


def write_tokenizer_folder(dest: Path, ranks: Path, *, link: bool = False,
                           extra: dict[str, Any] | None = None, note: str | None = None) -> Path:
    """A K3 tokenizer folder at `dest`: Kimi's `tiktoken.model` (the file `ranks`, copied or
    symlinked) and K3's `tokenizer_config.json` (plus `extra` keys). `load_tokenizer(dest)`
    reads it as the Kimi layout."""
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / "tiktoken.model"
    if target.exists() or target.is_symlink():
        target.unlink()
    if link:
        target.symlink_to(Path(ranks).resolve())
    else:
        shutil.copyfile(ranks, target)
    config = {**tokenizer_config(note), **(extra or {})}
    (dest / "tokenizer_config.json").write_text(json.dumps(config, indent=1, ensure_ascii=False)
                                                + "\n", encoding="utf-8")
    return dest



MINI_NOTE = (
    "specregen mini K3 tokenizer: NOT Kimi's real vocabulary. The 4096-rank BPE of the bundled "
    "`mini` tokenizer (specregen/assets/mini_tokenizer) under Kimi K3's added-token table "
    "(ids 163584-163839, docs/kimi-k3.md section 1). Written by "
    "specregen.models.kimi_k3.tokens.write_mini().")


def write_mini(dest: Path = MINI_K3_TOKENIZER_DIR) -> Path:
    """The bundled `mini-k3` tokenizer: the mini ranks with K3's table (byte-identical on
    every run)."""
    return write_tokenizer_folder(dest, MINI_TOKENIZER_DIR / "tiktoken.model", note=MINI_NOTE,
                                  extra={"pat_str": KIMI_PAT_STR})


def real_tokenizer_folder(kimi_dir: Path, dest: Path) -> Path:
    """A K3 tokenizer folder over the real Kimi vocabulary in `kimi_dir` (its `tiktoken.model`
    linked, not copied)."""
    ranks = Path(kimi_dir) / "tiktoken.model"
    if not ranks.is_file():
        raise TokenizerError(f"{str(kimi_dir)!r} has no tiktoken.model (Kimi's ranks)")
    return write_tokenizer_folder(dest, ranks, link=True)
