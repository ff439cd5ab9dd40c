"""Tokenizer loading: the Kimi layout, the bundled mini tokenizer, tokenizer.json folders."""

from __future__ import annotations

import json
import shutil

import pytest

from specregen.models.kimi_k25 import KimiK25, check_tokenizer
from specregen.models.tokenizer import (
    MINI_TOKENIZER_DIR,
    TokenizerError,
    kimi_encode_pieces,
    load_tokenizer,
)
from tests.support import SHARED, get_tokenizer, kimi_tokenizer_dir

K25_IDS = {
    "<|im_end|>": 163586,
    "<|im_user|>": 163587,
    "<|im_assistant|>": 163588,
    "<|im_system|>": 163594,
    "<|tool_calls_section_begin|>": 163595,
    "<|tool_calls_section_end|>": 163596,
    "<|tool_call_begin|>": 163597,
    "<|tool_call_argument_begin|>": 163598,
    "<|tool_call_end|>": 163599,
    "<|im_middle|>": 163601,
    "<think>": 163606,
    "</think>": 163607,
    "[BOS]": 163584,
    "[PAD]": 163839,
}


def test_real_vocabulary_facts(kimi_tok):
    """SPEC 1.3, checked on the real vocabulary."""
    assert kimi_tok.n_vocab == 163_840
    assert kimi_tok.base_vocab_size == 163_584
    assert kimi_tok.encode_ordinary("<think>") == [27, 39964, 29]
    assert kimi_tok.encode_ordinary("functions.get_weather:0") == [41937, 1150, 21055, 2800, 25, 15]
    assert kimi_tok.token_id("<|im_end|>") == 163586
    assert kimi_tok.decode([163533]) == "chas"
    assert not kimi_tok.is_added(163533)
    assert kimi_tok.encode_ordinary("(no content)") == [72433, 3646, 8]
    block = (
        "<|im_system|>system<|im_middle|>"
        "You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>"
    )
    ids = kimi_tok.encode_with_specials(block)
    assert len(ids) == 18 and ids[:3] == [163594, 14062, 163601] and ids[-1] == 163586
    for name, token_id in K25_IDS.items():
        assert kimi_tok.token_id(name) == token_id
    assert kimi_tok.added_name(163589) == "<|reserved_token_163589|>"


@pytest.mark.parametrize("which", ["mini", "kimi"])
def test_format_tokens_resolve_to_k25_ids(which):
    ids = check_tokenizer(get_tokenizer(which))
    for name, token_id in ids.items():
        assert K25_IDS[name] == token_id


def test_mini_tokenizer_is_small_and_structured():
    tok = load_tokenizer("mini")
    assert tok.base_vocab_size < 10_000
    assert tok.n_vocab == 163_840
    text = "def f(x):\n    return '日本語' + \"🚀\"  # <|im_end|>\n"
    assert tok.decode(tok.encode_ordinary(text)) == text
    assert 163586 not in tok.encode_ordinary(text)
    assert tok.encode_with_specials("a<|im_end|>")[-1] == 163586


def test_k2_instruct_config_is_refused_naming_the_missing_token(tmp_path):
    """The July-2025 K2-Instruct config has no <think>: loading it for K2.5 must say so."""
    if kimi_tokenizer_dir() is None:
        pytest.skip("KIMI_TOKENIZER_DIR is not set")
    (tmp_path / "tiktoken.model").symlink_to(kimi_tokenizer_dir() / "tiktoken.model")
    shutil.copy(SHARED / "kimi" / "k2-instruct-tokenizer_config.json",
                tmp_path / "tokenizer_config.json")
    tok = load_tokenizer(tmp_path)
    assert tok.encode_with_specials("<think>") == [27, 39964, 29]
    with pytest.raises(TokenizerError, match="<think>"):
        KimiK25(tok)


def test_misplaced_format_token_is_refused(tmp_path):
    shutil.copytree(MINI_TOKENIZER_DIR, tmp_path / "tok")
    config_path = tmp_path / "tok" / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    # Give <|im_end|>'s name to an id and drop it from its own: the lookup by name must follow.
    config["added_tokens_decoder"]["163586"]["content"] = "<|renamed|>"
    config_path.write_text(json.dumps(config))
    with pytest.raises(TokenizerError, match=r"<\|im_end\|>"):
        KimiK25(load_tokenizer(tmp_path / "tok"))


def test_bad_specs_give_clear_errors(tmp_path):
    with pytest.raises(TokenizerError, match="neither"):
        load_tokenizer(tmp_path)
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(TokenizerError, match="is a file"):
        load_tokenizer(tmp_path / "f.txt")
    with pytest.raises(TokenizerError, match="neither 'mini'"):
        load_tokenizer("no-such-thing")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "tiktoken.model").write_text("!!notbase64 0\n")
    (bad / "tokenizer_config.json").write_text("{}")
    with pytest.raises(TokenizerError, match=r"tiktoken\.model:1"):
        load_tokenizer(bad)


def test_kimi_long_run_splitting_matches_the_wrapper():
    """Runs longer than 25,000 characters are cut where Kimi's encode() cuts them."""
    text = "a" * 60_001 + " " * 30_000 + "b"
    pieces = list(kimi_encode_pieces(text))
    assert "".join(pieces) == text
    assert [len(p) for p in pieces] == [25_000, 25_000, 10_001 + 25_000, 5_000 + 1]
    assert list(kimi_encode_pieces("short text")) == ["short text"]


def test_hf_tokenizer_json_folder(tmp_path):
    """Any tokenizer.json folder loads through transformers, for other model families."""
    from tokenizers import Tokenizer as HFTok
    from tokenizers import decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = HFTok(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    core.train_from_iterator(["hello there, general kenobi"] * 20, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=core)
    fast.add_special_tokens({"additional_special_tokens": ["<|end|>"]})
    fast.save_pretrained(tmp_path)
    tok = load_tokenizer(tmp_path)
    end = tok.token_id("<|end|>")
    assert tok.encode_with_specials("hello<|end|>")[-1] == end
    assert end not in tok.encode_ordinary("hello<|end|>")
    assert tok.decode(tok.encode_ordinary("hi there 🚀")) == "hi there 🚀"


SPECIAL_PIECES = [
    "<|im_end|>", "<think>", "</think>", "[BOS]", "<|tool_call_begin|>",
    "<|reserved_token_163600|>",
    "<|im_end", "<|im end|>", "<|<|im_end|>", "<|a[EOS]b|>", "<div>", "[[PAD]]", "</thinking>",
    "<||>", "<|x|><|im_middle|>", "|>", "<", "[", " ", "\n", "hello", "日本", "🚀",
]


@pytest.mark.parametrize("which", ["mini", "kimi"])
def test_encode_with_specials_matches_tiktoken(which):
    """The fast special-token splitter gives tiktoken's encode(allowed_special='all') ids."""
    import random

    import tiktoken

    from specregen.models.tokenizer import KIMI_PAT_STR, read_tiktoken_ranks

    tok = get_tokenizer(which)
    folder = MINI_TOKENIZER_DIR if which == "mini" else kimi_tokenizer_dir()
    reference = tiktoken.Encoding(
        "reference", pat_str=KIMI_PAT_STR,
        mergeable_ranks=read_tiktoken_ranks(folder / "tiktoken.model"),
        special_tokens=tok.added_tokens,
    )
    rng = random.Random(7)
    for _ in range(3000):
        text = "".join(rng.choice(SPECIAL_PIECES) for _ in range(rng.randint(0, 8)))
        assert tok.encode_with_specials(text) == reference.encode(text, allowed_special="all"), text
