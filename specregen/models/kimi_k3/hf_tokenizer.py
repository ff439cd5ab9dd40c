"""A Kimi-style slow tokenizer for the real-vLLM harness's K3 model folder.

The harness copies this file into the folder as `tokenization_kimi.py` (with `auto_map` in
`tokenizer_config.json`), next to our encoder (`encoding.py`, copied as `encoding_k3.py`);
vLLM loads it with `--trust-remote-code` in the vLLM environment, so it imports nothing from
specregen when it runs there.

It behaves like K3's `TikTokenTokenizer` (docs/kimi-k3.md §1, §2.5) where a server's output
depends on it -- written from that behaviour, not from its code:
- a slow `PreTrainedTokenizer` over Kimi's ranks and `pat_str`; every id after the ranks (256
  of them) is an added token, named by `added_tokens_decoder` or `<|reserved_token_{id}|>`;
- tokens are the ids' bytes through GPT-2's byte-to-unicode table; decoding uses
  `errors="replace"`;
- `encode` turns special strings into their ids (`allowed_special="all"`);
- `apply_chat_template` renders with the Python encoder (no Jinja): segments, each tokenized
  on its own -- a marker as its id, any other text as ordinary BPE with special strings as
  text, long texts cut the way Kimi's `encode` cuts them -- and returns the ids when
  `tokenize` (as vLLM's K3 renderer asks), else the text. No BOS.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import tiktoken
from tiktoken.load import load_tiktoken_bpe
from transformers import PreTrainedTokenizer
from transformers.convert_slow_tokenizer import bytes_to_unicode

try:  # in the model folder (transformers loads it as a package module)
    from .encoding_k3 import joined, render_with_options
except ImportError:
    try:  # loaded as a top-level module next to it
        from encoding_k3 import joined, render_with_options
    except ImportError:  # in specregen itself (the tests)
        from specregen.models.kimi_k3.encoding import (
            joined,
            render_with_options,
        )

RESERVED = 256
# Kimi's `encode` hands tiktoken at most this many characters at once, and no run of
# whitespace or of non-whitespace longer than the second number.
MAX_CHARS = 400_000
MAX_RUN = 25_000


def _pieces(text: str) -> Iterator[str]:
    for start in range(0, len(text), MAX_CHARS):
        chunk = text[start:start + MAX_CHARS]
        begin, run, spaces = 0, 0, chunk[:1].isspace()
        for i, ch in enumerate(chunk):
            if ch.isspace() != spaces:
                spaces, run = ch.isspace(), 1
            else:
                run += 1
                if run > MAX_RUN:
                    yield chunk[begin:i]
                    begin, run = i, 1
        yield chunk[begin:]


class TikTokenTokenizer(PreTrainedTokenizer):
    vocab_files_names = {"vocab_file": "tiktoken.model"}  # noqa: RUF012 (HF's class attribute)
    model_input_names = ["input_ids", "attention_mask"]  # noqa: RUF012

    def __init__(self, vocab_file: str, pat_str: str, bos_token: str = "[BOS]",
                 eos_token: str = "[EOS]", unk_token: str | None = None,
                 pad_token: str | None = None, added_tokens_decoder: dict | None = None,
                 **kwargs: Any) -> None:
        self.vocab_file = vocab_file
        ranks = load_tiktoken_bpe(vocab_file)
        names = {int(i): getattr(tok, "content", tok) for i, tok in
                 (added_tokens_decoder or {}).items()}
        first = min(names, default=len(ranks))
        self.special_tokens = {names.get(i, f"<|reserved_token_{i}|>"): i
                               for i in range(first, first + RESERVED)}
        self.model = tiktoken.Encoding(name=os.path.basename(vocab_file), pat_str=pat_str,
                                       mergeable_ranks=ranks, special_tokens=self.special_tokens)
        byte_encoder = bytes_to_unicode()
        self.byte_decoder = {v: k for k, v in byte_encoder.items()}
        self.n_words = first + RESERVED
        self.decoder: dict[int, str] = {}
        for i in range(self.n_words):
            try:
                raw = self.model.decode_single_token_bytes(i)
            except KeyError:  # a gap in a stand-in vocabulary
                continue
            self.decoder[i] = "".join(byte_encoder[b] for b in raw)
        self.encoder = {v: k for k, v in self.decoder.items()}
        super().__init__(bos_token=bos_token, eos_token=eos_token, unk_token=unk_token,
                         pad_token=pad_token, added_tokens_decoder=added_tokens_decoder,
                         pat_str=pat_str, **kwargs)

    # -- encoding and decoding

    def encode(self, text: str, allow_special_tokens: bool = True,
               **kwargs: Any) -> list[int]:
        if kwargs:  # any other argument: the base class (it splits at the added tokens)
            return super().encode(text, **kwargs)
        if allow_special_tokens:
            return self.model.encode(text, allowed_special="all")
        return self.model.encode(text, disallowed_special=())

    def encode_text(self, text: str) -> list[int]:
        """Ordinary text: special strings are characters, long text cut as Kimi cuts it."""
        if len(text) <= MAX_RUN:
            return self.model.encode(text, disallowed_special=())
        return [t for piece in _pieces(text)
                for t in self.model.encode(piece, disallowed_special=())]

    def decode(self, token_ids: Any, **kwargs: Any) -> str:  # type: ignore[override]
        if kwargs:
            # transformers types decode for a batch too (list[str]); a sequence is a str.
            return super().decode(token_ids, **kwargs)  # type: ignore[return-value]
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        return self.model.decode(list(token_ids))

    @property
    def vocab_size(self) -> int:
        return self.n_words

    def get_vocab(self) -> dict[str, int]:
        return dict(self.encoder)

    def _tokenize(self, text: str, **kwargs: Any) -> list[str]:
        return [self.decoder[t] for t in self.encode(text)]

    def _convert_token_to_id(self, token: str) -> int:
        return self.encoder.get(token, self.special_tokens.get(str(self.unk_token), 0))

    # As upstream's tokenization_kimi.py: an id outside the vocabulary is None, where
    # transformers' base class declares str.
    def _convert_id_to_token(self, index: int) -> str | None:  # type: ignore[override]
        return self.decoder.get(index)

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        text = "".join(tokens)
        return bytearray(self.byte_decoder[c] for c in text).decode("utf-8", "replace")

    @staticmethod
    def clean_up_tokenization(out_string: str) -> str:
        return out_string

    def save_vocabulary(self, save_directory: str,
                        filename_prefix: str | None = None) -> tuple[str]:
        return (self.vocab_file,)

    # -- the chat rendering

    def encode_segments(self, segments: list[tuple[str, bool]]) -> list[int]:
        ids: list[int] = []
        for piece, is_marker in segments:
            if is_marker:
                ids.append(self.special_tokens[piece])
            else:
                ids.extend(self.encode_text(piece))
        return ids

    # Upstream's signature (vLLM calls it so), narrower than transformers' own.
    def apply_chat_template(  # type: ignore[override]
            self, conversation: Any, tools: list[dict] | None = None,
            tokenize: bool = False, add_generation_prompt: bool = True,
            **kwargs: Any) -> Any:
        if conversation and isinstance(conversation[0], list):  # a batch
            return [self.apply_chat_template(c, tools, tokenize, add_generation_prompt,
                                             **kwargs) for c in conversation]
        segments = render_with_options(list(conversation), tools,
                                       add_generation_prompt=add_generation_prompt, **kwargs)
        if not tokenize:
            return joined(segments)
        ids = self.encode_segments(segments)
        if kwargs.get("return_dict"):
            return {"input_ids": ids, "attention_mask": [1] * len(ids)}
        return ids
