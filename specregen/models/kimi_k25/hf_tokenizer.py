"""A Kimi-style slow tokenizer for the real-vLLM harness's K2.5 model folder.

The harness copies this file into the folder as `tokenization_kimi.py` (with `auto_map` in
`tokenizer_config.json`), next to `tools_ts.py` (our TypeScript tool declaration);
vLLM loads it with `--trust-remote-code`, in the vLLM environment, so it imports nothing from
specregen.

It behaves like the K2.5-era `TikTokenTokenizer` (moonshotai/Kimi-K2.5 `tokenization_kimi.py`)
where a server's output depends on it -- we wrote it from that behaviour, not from its code:
- a slow `PreTrainedTokenizer` (vLLM then detokenizes with its slow incremental path, which
  joins added tokens and the text beside them with a space unless the request says
  `spaces_between_special_tokens: false`);
- every id after the BPE ranks (256 of them) is an added token, named by `added_tokens_decoder`
  or `<|reserved_token_{id}|>`; the `special` flag of each entry decides what
  `skip_special_tokens` drops;
- tokens are the ids' bytes through GPT-2's byte-to-unicode table; strings are decoded with
  `errors="replace"`;
- `encode` turns special strings into their ids (`allowed_special="all"`);
- `apply_chat_template` deep-sorts `tools`, passes their TypeScript declaration as
  `tools_ts_str`, and defaults `thinking=True`, `preserve_thinking=False`.
`pat_str` comes from `tokenizer_config.json` (the harness writes specregen's own).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import tiktoken
from tiktoken.load import load_tiktoken_bpe
from transformers import PreTrainedTokenizer
from transformers.convert_slow_tokenizer import bytes_to_unicode

try:  # in the model folder (transformers loads it as a package module), and in specregen
    from .tools_ts import encode_tools_to_typescript
except ImportError:  # loaded as a top-level module
    from tools_ts import encode_tools_to_typescript  # type: ignore[no-redef]

RESERVED = 256


def _sorted(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _sorted(v) for k, v in sorted(obj.items())}
    if isinstance(obj, list):
        return [_sorted(v) for v in obj]
    return obj


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
        # Upstream numbers the added block right after the ranks; a smaller stand-in vocabulary
        # keeps Kimi's ids, so the block starts at the first added id.
        first = min(names, default=len(ranks))
        self.special_tokens = {names.get(i, f"<|reserved_token_{i}|>"): i
                               for i in range(first, first + RESERVED)}
        self.model = tiktoken.Encoding(name=os.path.basename(vocab_file), pat_str=pat_str,
                                       mergeable_ranks=ranks, special_tokens=self.special_tokens)
        byte_encoder = bytes_to_unicode()
        self.byte_decoder = {v: k for k, v in byte_encoder.items()}
        # Every id has a byte-level string, the added ones too (their text's bytes): the
        # vocabulary's size, which vLLM's detokenizer compares ids with, counts them.
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

    # -- encoding and decoding, as the upstream wrapper does them

    def encode(self, text: str, allow_special_tokens: bool = True,
               **kwargs: Any) -> list[int]:
        if kwargs:  # upstream hands any other argument to the base class
            return super().encode(text, **kwargs)
        if allow_special_tokens:
            return self.model.encode(text, allowed_special="all")
        return self.model.encode(text, disallowed_special=())

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

    # Upstream's signature (vLLM calls it so), narrower than transformers' own.
    def apply_chat_template(  # type: ignore[override]
            self, conversation: Any, tools: list[dict] | None = None,
            tokenize: bool = False, add_generation_prompt: bool = True,
            thinking: bool = True, preserve_thinking: bool = False,
            **kwargs: Any) -> Any:
        sorted_tools = _sorted(tools)
        if sorted_tools:
            # Upstream falls back to no declaration string when the encoder raises.
            with contextlib.suppress(Exception):
                kwargs["tools_ts_str"] = encode_tools_to_typescript(sorted_tools)
        return super().apply_chat_template(
            conversation, tools=sorted_tools, tokenize=tokenize,
            add_generation_prompt=add_generation_prompt, thinking=thinking,
            preserve_thinking=preserve_thinking, **kwargs)
