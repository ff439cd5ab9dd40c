"""The bundled mini Qwen3 tokenizer: real added-token ids, loading through the tokenizer.json
path, markers matched inside text, and a byte-identical rebuild by the training script.

The expected table is written out here from Qwen3's public tokenizer_config.json rather than
imported from the package or the script, so a wrong table there cannot agree with itself.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
from tokenizers import Tokenizer as HFTokenizer

from specregen.models.qwen3 import ADDED_TOKENS, MINI_QWEN3_TOKENIZER_DIR, Qwen3, check_tokenizer
from specregen.models.tokenizer import TokenizerError, load_tokenizer

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "train_mini_qwen3_tokenizer.py"

EXPECTED = {
    151643: ("<|endoftext|>", True), 151644: ("<|im_start|>", True),
    151645: ("<|im_end|>", True), 151646: ("<|object_ref_start|>", True),
    151647: ("<|object_ref_end|>", True), 151648: ("<|box_start|>", True),
    151649: ("<|box_end|>", True), 151650: ("<|quad_start|>", True),
    151651: ("<|quad_end|>", True), 151652: ("<|vision_start|>", True),
    151653: ("<|vision_end|>", True), 151654: ("<|vision_pad|>", True),
    151655: ("<|image_pad|>", True), 151656: ("<|video_pad|>", True),
    151657: ("<tool_call>", False), 151658: ("</tool_call>", False),
    151659: ("<|fim_prefix|>", False), 151660: ("<|fim_middle|>", False),
    151661: ("<|fim_suffix|>", False), 151662: ("<|fim_pad|>", False),
    151663: ("<|repo_name|>", False), 151664: ("<|file_sep|>", False),
    151665: ("<tool_response>", False), 151666: ("</tool_response>", False),
    151667: ("<think>", False), 151668: ("</think>", False),
}


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(MINI_QWEN3_TOKENIZER_DIR)


def _script():
    spec = importlib.util.spec_from_file_location("train_mini_qwen3", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_asset_config_has_the_real_table():
    config = json.loads((MINI_QWEN3_TOKENIZER_DIR / "tokenizer_config.json").read_text())
    got = {int(k): (v["content"], v["special"]) for k, v in config["added_tokens_decoder"].items()}
    assert got == EXPECTED
    assert {i: (c, s) for i, c, s in ADDED_TOKENS} == EXPECTED
    assert {i: (c, s) for i, c, s in _script().QWEN3_ADDED_TOKENS} == EXPECTED


def test_loads_through_the_tokenizer_json_path(tok):
    assert tok.added_tokens == {c: i for i, (c, _) in EXPECTED.items()}
    assert tok.base_vocab_size == 151643
    assert check_tokenizer(tok)["<think>"] == 151667
    raw = HFTokenizer.from_file(str(MINI_QWEN3_TOKENIZER_DIR / "tokenizer.json"))
    model_vocab = json.loads(raw.to_str())["model"]["vocab"]
    # 4,096 trained ranks 0..4095, and the added tokens at their own ids (the gap).
    ranks = sorted(i for i in model_vocab.values() if i < 151643)
    assert ranks == list(range(4096))


def test_markers_are_matched_inside_model_text_but_specials_are_not(tok):
    text = "a<think>b</think>c<tool_call>d</tool_call><|im_end|>"
    ids = tok.encode_ordinary(text)
    for marker in ("<think>", "</think>", "<tool_call>", "</tool_call>"):
        assert ids.count(EXPECTED_ID[marker]) == 1
    assert 151645 not in ids  # special: plain text in model-written text
    assert tok.encode_with_specials("<|im_end|>") == [151645]
    assert tok.decode(ids) == text


EXPECTED_ID = {c: i for i, (c, _) in EXPECTED.items()}


def test_byte_level_round_trip_and_qwen_split(tok):
    text = "Ünïcödé 数据 tab\there  12345\r\n\n  x's"
    assert tok.decode(tok.encode_ordinary(text)) == text
    # The Qwen2 split puts every digit in its own piece: no merge spans two digits.
    assert len(tok.encode_ordinary("12345")) == 5


def test_script_rebuilds_the_asset_byte_for_byte(tmp_path):
    assert _script().main(["--out", str(tmp_path)]) == 0
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / name).read_bytes() == (MINI_QWEN3_TOKENIZER_DIR / name).read_bytes()


def test_a_tokenizer_without_think_is_refused_by_name(tmp_path):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(MINI_QWEN3_TOKENIZER_DIR / name, tmp_path / name)
    data = json.loads((tmp_path / "tokenizer.json").read_text())
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] != "<think>"]
    del data["model"]["vocab"]["<think>"]
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    del config["added_tokens_decoder"]["151667"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(TokenizerError, match="<think>"):
        Qwen3(load_tokenizer(tmp_path))
