"""Kimi K2.5 behind a real vLLM server (the real-server harness, `specregen.realserver`).

The model folder holds the real Kimi vocabulary (`tiktoken.model` and the K2.5 added-token
table from the tokenizer folder given), our slow tokenizer class (`hf_tokenizer.py`, copied as
`tokenization_kimi.py` and loaded through `auto_map`, as the hub's K2.5 folder loads its own),
our TypeScript tool declaration (`tools_ts.py`) and our chat
template -- or the template file `KIMI_CHAT_TEMPLATE` names (e.g. the hub's K2.5 template,
kept outside the repository). vLLM serves it with its `kimi_k2` tool and reasoning parsers.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from specregen.models.chat_format import RealVllmSpec
from specregen.models.kimi_k25.common import IM_END
from specregen.models.tokenizer import KIMI_PAT_STR, TokenizerError

HERE = Path(__file__).resolve().parent
TEMPLATE_ENV = "KIMI_CHAT_TEMPLATE"
SERVED_MODEL_NAME = "moonshotai/kimi-k2.5"
VOCAB_SIZE = 163840


def real_vllm_spec(tokenizer_dir: Path | None) -> RealVllmSpec:
    """The K2.5 folder over the real Kimi vocabulary in `tokenizer_dir` (`tiktoken.model` and
    `tokenizer_config.json`); the bundled mini vocabulary cannot stand in (vLLM's slow
    detokenizer drops every id past the tokenizer's length, and its ids have gaps)."""
    if tokenizer_dir is None or not (Path(tokenizer_dir) / "tiktoken.model").is_file():
        raise TokenizerError(
            "the real vLLM K2.5 model needs the real Kimi vocabulary: set KIMI_TOKENIZER_DIR "
            "to a folder with tiktoken.model and tokenizer_config.json")
    source = Path(tokenizer_dir)
    config = json.loads((source / "tokenizer_config.json").read_text(encoding="utf-8"))
    stop_id = next(int(i) for i, t in config["added_tokens_decoder"].items()
                   if t["content"] == IM_END)
    bos_id = next((int(i) for i, t in config["added_tokens_decoder"].items()
                   if t["content"] == config.get("bos_token")), None)

    def build(dest: Path) -> None:
        shutil.copyfile(source / "tiktoken.model", dest / "tiktoken.model")
        folder_config = {
            **config,
            "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
            "pat_str": KIMI_PAT_STR,
        }
        folder_config.pop("chat_template", None)
        (dest / "tokenizer_config.json").write_text(json.dumps(folder_config, indent=1),
                                                    encoding="utf-8")
        shutil.copyfile(HERE / "hf_tokenizer.py", dest / "tokenization_kimi.py")
        shutil.copyfile(HERE / "tools_ts.py", dest / "tools_ts.py")
        template = os.environ.get(TEMPLATE_ENV) or str(HERE / "chat_template.jinja")
        shutil.copyfile(template, dest / "chat_template.jinja")

    return RealVllmSpec(
        format_name="kimi-k2.5", served_model_name=SERVED_MODEL_NAME,
        tool_parser="kimi_k2", reasoning_parser="kimi_k2", build_folder=build,
        stop_id=stop_id, bos_id=bos_id, vocab_size=VOCAB_SIZE,
        emulator_profile="vllm", trust_remote_code=True)
