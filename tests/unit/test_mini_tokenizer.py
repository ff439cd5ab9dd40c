"""The bundled mini tokenizer: tiktoken layout, K2.5 added-token table, round trips, rebuild.

The encoder is built here from the files alone (not through specregen's loader), so these tests
pin down the asset itself. The expected facts are written out from SPEC sections 1.2 and 1.3
rather than imported from the training script, so a wrong table there cannot agree with itself.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import tiktoken
from tiktoken.load import load_tiktoken_bpe

REPO = Path(__file__).resolve().parents[2]
ASSET_DIR = REPO / "specregen" / "assets" / "mini_tokenizer"
TRAIN_SCRIPT = REPO / "scripts" / "train_mini_tokenizer.py"
ASSET_FILES = ("tiktoken.model", "tokenizer_config.json", "README.md")

BASE_RANKS = 4096
FIRST_ADDED_ID = 163_584
N_VOCAB = 163_840

# SPEC 1.2: the eight alternatives, joined with "|" in this order.
KIMI_PAT_STR = "|".join(
    [
        r"[\p{Han}]+",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
        r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
        r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)

# SPEC 1.3: id -> (content, HF "special" flag). Reserved ids have no entry.
K25_ADDED: dict[int, tuple[str, bool]] = {
    163584: ("[BOS]", True),
    163585: ("[EOS]", True),
    163586: ("<|im_end|>", True),
    163587: ("<|im_user|>", True),
    163588: ("<|im_assistant|>", True),
    163590: ("<|start_header_id|>", True),
    163591: ("<|end_header_id|>", True),
    163593: ("[EOT]", True),
    163594: ("<|im_system|>", True),
    163595: ("<|tool_calls_section_begin|>", False),
    163596: ("<|tool_calls_section_end|>", False),
    163597: ("<|tool_call_begin|>", False),
    163598: ("<|tool_call_argument_begin|>", False),
    163599: ("<|tool_call_end|>", False),
    163601: ("<|im_middle|>", True),
    163602: ("<|media_begin|>", True),
    163603: ("<|media_content|>", True),
    163604: ("<|media_end|>", True),
    163605: ("<|media_pad|>", True),
    163606: ("<think>", False),
    163607: ("</think>", False),
    163838: ("[UNK]", True),
    163839: ("[PAD]", True),
}
K25_ADDITIONAL_SPECIAL_TOKENS = [
    "<|im_end|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "[EOT]",
    "<|im_system|>",
    "<|im_middle|>",
    "<|media_begin|>",
    "<|media_content|>",
    "<|media_end|>",
    "<|media_pad|>",
]

ROUND_TRIP_TEXTS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "It's 3:45pm; we've shipped v2.10.3 (build #12345) - don't panic.",
    "数据管道把原始文本切分成小块，然后交给分词器处理。",
    "日本語のテキスト、ひらがな、カタカナ、そして漢字。",
    "emoji: 🙂🎉👍🏽 👩‍💻 🇫🇷 ☀️",
    "   leading spaces\t\ttabs\n\n\n   \r\n  trailing   ",
    "def f(x: int) -> int:\n    if x > 0:\n        return x * 2\n    return -x\n",
    'const obj = { "location": "Paris", "unit": "celsius" };\nconsole.log(`${obj.unit}`);',
    "#include <vector>\nint main() { std::vector<int> v{1, 2, 3}; return v.size(); }\n",
    "functions.get_weather:0",
    "Zürich naïve café Ångström Привет Καλημέρα ÷ × → ∑",
    "\x00\x01\x7f control bytes and \u200b zero width \ufeff",
    "Ünïcödé 12345678901234567890 1,000,000.5 -3.2e-4",
    "",
]


@pytest.fixture(scope="module")
def config() -> dict:
    return json.loads((ASSET_DIR / "tokenizer_config.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def ranks() -> dict[bytes, int]:
    path = ASSET_DIR / "tiktoken.model"
    # tiktoken caches local files by path; pinning the hash makes a stale cached copy re-read.
    return load_tiktoken_bpe(str(path), expected_hash=hashlib.sha256(path.read_bytes()).hexdigest())


@pytest.fixture(scope="module")
def enc(ranks: dict[bytes, int], config: dict) -> tiktoken.Encoding:
    """The encoder as SPEC section 6 describes it, with the added ids taken from the config."""
    decoder = config["added_tokens_decoder"]
    specials = {
        decoder[str(i)]["content"] if str(i) in decoder else f"<|reserved_token_{i}|>": i
        for i in range(FIRST_ADDED_ID, N_VOCAB)
    }
    return tiktoken.Encoding(
        "specregen-mini-test", pat_str=KIMI_PAT_STR, mergeable_ranks=ranks, special_tokens=specials
    )


def _load_train_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_mini_tokenizer", TRAIN_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # dataclasses resolve string annotations through sys.modules while the class is created.
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def test_model_file_has_4096_contiguous_ranks_bytes_first() -> None:
    lines = (ASSET_DIR / "tiktoken.model").read_bytes().splitlines()
    pairs = [line.split() for line in lines]
    parsed = [(base64.b64decode(tok, validate=True), int(rank)) for tok, rank in pairs]
    assert [rank for _, rank in parsed] == list(range(BASE_RANKS))
    assert len({tok for tok, _ in parsed}) == BASE_RANKS
    assert [tok for tok, _ in parsed[:256]] == [bytes([b]) for b in range(256)]


def test_every_merged_rank_splits_into_two_lower_ranks(ranks: dict[bytes, int]) -> None:
    """BPE can only reach a token through a merge of two tokens learned before it."""
    for tok, rank in ranks.items():
        if rank < 256:
            continue
        assert any(
            ranks.get(tok[:k], rank) < rank and ranks.get(tok[k:], rank) < rank
            for k in range(1, len(tok))
        ), tok


def test_added_tokens_decoder_is_the_k25_table(config: dict) -> None:
    decoder = config["added_tokens_decoder"]
    assert {int(k) for k in decoder} == set(K25_ADDED)
    for token_id, (content, special) in K25_ADDED.items():
        entry = decoder[str(token_id)]
        assert entry["content"] == content
        assert entry["special"] is special, content
        assert not any(entry[k] for k in ("lstrip", "rstrip", "normalized", "single_word"))
    for reserved in (163589, 163592, 163600, 163608, 163700, 163837):
        assert str(reserved) not in decoder


def test_config_fields_match_the_k25_layout(config: dict) -> None:
    assert config["additional_special_tokens"] == K25_ADDITIONAL_SPECIAL_TOKENS
    assert (config["bos_token"], config["eos_token"]) == ("[BOS]", "[EOS]")
    assert (config["pad_token"], config["unk_token"]) == ("[PAD]", "[UNK]")
    assert config["tokenizer_class"] == "TikTokenTokenizer"
    assert config["model_max_length"] == 262_144
    assert "NOT Kimi's real vocabulary" in config["specregen_note"]
    assert "chat_template" not in config


def test_n_vocab_matches_kimi(enc: tiktoken.Encoding) -> None:
    assert enc.n_vocab == N_VOCAB
    assert enc.max_token_value == N_VOCAB - 1


@pytest.mark.parametrize(
    ("name", "token_id"),
    [
        ("<|im_end|>", 163586),
        ("<|im_user|>", 163587),
        ("<|im_assistant|>", 163588),
        ("<|im_system|>", 163594),
        ("<|tool_calls_section_begin|>", 163595),
        ("<|tool_calls_section_end|>", 163596),
        ("<|tool_call_begin|>", 163597),
        ("<|tool_call_argument_begin|>", 163598),
        ("<|tool_call_end|>", 163599),
        ("<|im_middle|>", 163601),
        ("<|media_pad|>", 163605),
        ("<think>", 163606),
        ("</think>", 163607),
        ("[BOS]", 163584),
        ("[EOS]", 163585),
        ("[PAD]", 163839),
        ("<|reserved_token_163589|>", 163589),
    ],
)
def test_added_token_ids(enc: tiktoken.Encoding, name: str, token_id: int) -> None:
    assert enc.encode(name, allowed_special="all") == [token_id]
    assert enc.decode_single_token_bytes(token_id) == name.encode()


def test_default_system_block_uses_the_k25_ids(enc: tiktoken.Encoding) -> None:
    text = (
        "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI."
        "<|im_end|>"
    )
    ids = enc.encode(text, allowed_special="all")
    assert ids[0] == 163594 and ids[-1] == 163586
    assert ids.count(163601) == 1
    assert enc.decode(ids) == text


@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS)
def test_round_trip(enc: tiktoken.Encoding, text: str) -> None:
    ids = enc.encode_ordinary(text)
    assert all(i < BASE_RANKS for i in ids)
    assert enc.decode(ids) == text


def test_special_strings_in_plain_text_stay_text(enc: tiktoken.Encoding) -> None:
    think = enc.encode_ordinary("<think>")
    assert len(think) > 1 and 163606 not in think
    im_end = enc.encode_ordinary("<|im_end|>")
    assert im_end != [163586] and all(i < BASE_RANKS for i in im_end)
    assert enc.decode(im_end) == "<|im_end|>"


def test_no_token_crosses_a_kimi_pretoken_boundary(
    enc: tiktoken.Encoding, ranks: dict[bytes, int]
) -> None:
    """Training split text with Kimi's pat_str: each decodable token is one whole piece."""
    for tok, rank in ranks.items():
        try:
            text = tok.decode("utf-8")
        except UnicodeDecodeError:
            continue  # part of a multi-byte character; no piece boundary can fall inside it
        assert enc.encode_ordinary(text) == [rank], text


def test_training_script_uses_spec_facts() -> None:
    script = _load_train_script()
    assert script.KIMI_PAT_STR == KIMI_PAT_STR
    assert {i: (c, s) for i, c, s in script.K25_ADDED_TOKENS} == K25_ADDED


def test_retraining_reproduces_the_bundled_files(tmp_path: Path) -> None:
    out = tmp_path / "mini_tokenizer"
    result = subprocess.run(
        [sys.executable, str(TRAIN_SCRIPT), "--out", str(out), "--vocab", str(BASE_RANKS)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    for name in ASSET_FILES:
        assert (out / name).read_bytes() == (ASSET_DIR / name).read_bytes(), name
    model_sha = hashlib.sha256((ASSET_DIR / "tiktoken.model").read_bytes()).hexdigest()
    assert model_sha in result.stdout
