"""Kimi K3 behind a real vLLM 0.32 server (the real-server harness, `specregen.realserver`).

The model folder holds Kimi's real vocabulary (`tiktoken.model` from the tokenizer folder given:
K3 keeps K2's ranks, docs/kimi-k3.md §1) under K3's own added-token table (tokens.py), our
slow tokenizer class (`hf_tokenizer.py`, copied as `tokenization_kimi.py` and loaded through
`auto_map`, as the hub's K3 folder loads its own) and our encoder (`encoding.py`, copied as
`encoding_k3.py`, which the class renders prompts with). No chat template: vLLM's K3 renderer,
chosen by `--tokenizer-mode kimi_k3` (a real K3 checkpoint's architecture chooses it by
itself; the scripted model's does not), asks the tokenizer's `apply_chat_template` for ids.
vLLM serves it with its `kimi_k3` tool and reasoning parsers.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from specregen.models.chat_format import RealVllmSpec
from specregen.models.kimi_k3.encoding import END_OF_MSG
from specregen.models.kimi_k3.tokens import ADDED_IDS, BOS, VOCAB_SIZE, tokenizer_config
from specregen.models.tokenizer import KIMI_PAT_STR, TokenizerError

HERE = Path(__file__).resolve().parent
SERVED_MODEL_NAME = "moonshotai/kimi-k3"


def real_vllm_spec(tokenizer_dir: Path | None) -> RealVllmSpec:
    """The K3 folder over the real Kimi ranks in `tokenizer_dir` (a K2/K2.5 or K3 tokenizer
    folder: only its `tiktoken.model` is used); the bundled mini vocabulary cannot stand in
    (vLLM's slow detokenizer drops every id past the tokenizer's length, and its ids have
    gaps)."""
    if tokenizer_dir is None or not (Path(tokenizer_dir) / "tiktoken.model").is_file():
        raise TokenizerError(
            "the real vLLM K3 model needs the real Kimi vocabulary: set KIMI_TOKENIZER_DIR "
            "to a folder with tiktoken.model")
    ranks = Path(tokenizer_dir) / "tiktoken.model"

    def build(dest: Path) -> None:
        shutil.copyfile(ranks, dest / "tiktoken.model")
        config = {
            **tokenizer_config(),
            "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
            "pat_str": KIMI_PAT_STR,
        }
        (dest / "tokenizer_config.json").write_text(json.dumps(config, indent=1),
                                                    encoding="utf-8")
        shutil.copyfile(HERE / "hf_tokenizer.py", dest / "tokenization_kimi.py")
        shutil.copyfile(HERE / "encoding.py", dest / "encoding_k3.py")

    return RealVllmSpec(
        format_name="kimi-k3", served_model_name=SERVED_MODEL_NAME,
        tool_parser="kimi_k3", reasoning_parser="kimi_k3", build_folder=build,
        stop_id=ADDED_IDS[END_OF_MSG], bos_id=ADDED_IDS[BOS], vocab_size=VOCAB_SIZE,
        emulator_profile="vllm-k3", trust_remote_code=True,
        server_args=("--tokenizer-mode", "kimi_k3"))
