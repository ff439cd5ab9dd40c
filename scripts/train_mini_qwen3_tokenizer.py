#!/usr/bin/env python3
"""Train specregen's bundled mini Qwen3-style tokenizer with the `tokenizers` library.

Not Qwen3's vocabulary: a 4,096-rank byte-level BPE built the way Qwen2/Qwen3's `tokenizer.json`
is (NFC normalizer, the Qwen2 split regex, byte-level alphabet, no prefix space), with Qwen3's
real added-token table at its real ids 151643-151668 (facts from Qwen3's public
tokenizer_config.json; `<think>`, `<tool_call>` ... are added tokens matched inside text but not
special).

The gap: `tokenizers` renumbers an added token whose id is not in the model vocabulary (it
appends it after the last id), so each added token is also written into the BPE vocabulary at its
real id. No merge produces those entries, so ordinary text never encodes to them; ids
4096..151642 simply do not exist (`len(tokenizer)` is 4,122, the largest id 151668).

The corpus is the bundled sample datasets plus text written in this script, both in the repo, so
the output is byte-identical on every run and needs no network.

Usage:
    python scripts/train_mini_qwen3_tokenizer.py [--out DIR]  (default: the bundled mini-qwen3,
        specregen/models/qwen3/assets/mini_tokenizer)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from specregen.models.qwen3.tokens import ADDED_TOKENS as QWEN3_ADDED_TOKENS

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "specregen" / "assets" / "samples"
DEFAULT_OUT = ROOT / "specregen" / "models" / "qwen3" / "assets" / "mini_tokenizer"
VOCAB_SIZE = 4096

# The Qwen2/Qwen3 pre-tokenizer split (one digit per piece, contractions case-insensitive).
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen3's added-token table (id, content, special), kept once in the format's package.
SPECIAL_NAMES = [name for _, name, special in QWEN3_ADDED_TOKENS
                 if special and name != "<|endoftext|>"]

# Text in the shape Qwen3 conversations have, so common pieces ("\n\n", `{"name": "`) merge.
_WRITTEN = [
    "Okay, let me think about this step by step. The user wants to know how the function works.",
    "First, I should check the input. Then I will call the tool with the right arguments.",
    '{"name": "get_weather", "arguments": {"location": "Paris", "unit": "celsius"}}',
    '{"name": "search_files", "arguments": {"query": "def main", "path": "src/", "limit": 10}}',
    '{"type": "function", "function": {"name": "lookup", "description": "Look up a word.", '
    '"parameters": {"type": "object", "properties": {"word": {"type": "string"}}, '
    '"required": ["word"]}}}',
    "You are a helpful assistant. Answer briefly and cite the tool results you used.",
    "Here is the result:\n\n```python\nimport json\n\n\ndef load(path):\n"
    "    with open(path) as f:\n"
    "        return json.load(f)\n```\n",
    "The temperature in Paris is 18 degrees. It will rain tomorrow, so take an umbrella.",
    "Wait, that is not right. Let me reconsider: 12 * 7 = 84, and 84 + 16 = 100.",
    "Schreibe eine kurze Antwort. Écris une réponse courte. 简短地回答这个问题。",
]


def _split_words(text: str) -> list[str]:
    return text.split()


def build_corpus() -> list[str]:
    texts: list[str] = []
    for path in sorted(SAMPLES.glob("*.json*")):
        texts.extend(line for line in path.read_text(encoding="utf-8").splitlines() if line)
    texts.extend(_WRITTEN * 40)
    texts.extend(_generated())
    return texts


_WORDS = _split_words(
    "the a of to and in is it that for on with as was by this be are from or at an not have "
    "value list string number object array function return result error file path name type "
    "query tool call user model answer reason check test data time date city price weather "
    "table row column index key map set sort filter count total first last next previous "
    "Python JSON HTTP server client request response token text line code class method"
)


def _generated(n: int = 6000) -> list[str]:
    # A fixed linear-congruential walk over the word list: varied, and the same on every run.
    state = 12345
    out = []
    for i in range(n):
        words = []
        for _ in range(8 + i % 9):
            state = (state * 1103515245 + 12345) % 2**31
            words.append(_WORDS[state % len(_WORDS)])
        sep = ", " if i % 3 else " "
        out.append(sep.join(words) + (f" {state % 1000}." if i % 4 == 0 else "."))
        out.append(f'{{"{words[0]}": "{words[1]}", "{words[2]}": {state % 97}}}')
        # Made-up identifiers from syllables, for sub-word merges beyond the word list.
        state = (state * 1103515245 + 12345) % 2**31
        made = "".join(_SYLLABLES[(state >> k) % len(_SYLLABLES)] for k in range(0, 3 + i % 4))
        out.append(f"def {made}_{words[0]}(self, {words[1]}):\n    return {made.title()}")
    return out


_SYLLABLES = _split_words("ka ri to ne mo sa lu vi de po an el is or um ex ta qu zi bo fe ga hi jo "
              "st pr tr ch sh th ng ck")


def train(vocab_size: int = VOCAB_SIZE) -> dict:
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
        special_tokens=[],
    )
    tok.train_from_iterator(build_corpus(), trainer=trainer)
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    if len(vocab) != vocab_size:
        raise SystemExit(f"trained {len(vocab)} ranks, wanted {vocab_size}: corpus too small")
    for token_id, content, _ in QWEN3_ADDED_TOKENS:
        vocab[content] = token_id  # see the module docstring: keeps the real id on load
    data["added_tokens"] = [
        {"id": token_id, "content": content, "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": False, "special": special}
        for token_id, content, special in QWEN3_ADDED_TOKENS
    ]
    return data


def tokenizer_config() -> dict:
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(token_id): {"content": content, "lstrip": False, "normalized": False,
                            "rstrip": False, "single_word": False, "special": special}
            for token_id, content, special in QWEN3_ADDED_TOKENS
        },
        "additional_special_tokens": SPECIAL_NAMES,
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def check(out: Path) -> None:
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    for token_id, content, _ in QWEN3_ADDED_TOKENS:
        got = tok.encode(f"a{content}b", add_special_tokens=False).ids
        if token_id not in got:
            raise SystemExit(f"{content!r} does not encode to {token_id}: {got}")
    text = "".join(_WRITTEN)
    if tok.decode(tok.encode(text).ids) != text:
        raise SystemExit("round trip failed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--vocab", type=int, default=VOCAB_SIZE)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    data = train(args.vocab)
    # Sorted keys and a fixed indent: the same bytes on every run.
    (args.out / "tokenizer.json").write_text(
        json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    (args.out / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(), ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    check(args.out)
    digest = hashlib.sha256((args.out / "tokenizer.json").read_bytes()).hexdigest()[:16]
    print(f"wrote {args.out} ({args.vocab} ranks + {len(QWEN3_ADDED_TOKENS)} added), "
          f"tokenizer.json sha256 {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
