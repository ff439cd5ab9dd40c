"""Qwen3 behind a real vLLM server (the real-server harness, `specregen.realserver`).

The model folder holds a Qwen3 tokenizer (`tokenizer.json` + `tokenizer_config.json`: the
bundled mini Qwen3 tokenizer unless a folder is given) and our chat template, which equals the
official hybrid template (tests/unit/test_qwen3_render.py) -- or the template file
`QWEN3_CHAT_TEMPLATE` names. vLLM serves it with its `hermes` tool parser and `qwen3`
reasoning parser.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from specregen.models.chat_format import RealVllmSpec
from specregen.models.qwen3.family import MINI_QWEN3_TOKENIZER_DIR
from specregen.models.qwen3.render import TEMPLATE_PATH
from specregen.models.qwen3.tokens import ADDED_IDS, IM_END

TEMPLATE_ENV = "QWEN3_CHAT_TEMPLATE"
SERVED_MODEL_NAME = "Qwen/Qwen3-8B"
VOCAB_SIZE = 151936  # Qwen3's embedding size (past its last added token)


def real_vllm_spec(tokenizer_dir: Path | None) -> RealVllmSpec:
    source = Path(tokenizer_dir) if tokenizer_dir is not None else MINI_QWEN3_TOKENIZER_DIR

    def build(dest: Path) -> None:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(source / name, dest / name)
        template = os.environ.get(TEMPLATE_ENV) or str(TEMPLATE_PATH)
        shutil.copyfile(template, dest / "chat_template.jinja")

    return RealVllmSpec(
        format_name="qwen3", served_model_name=SERVED_MODEL_NAME,
        tool_parser="hermes", reasoning_parser="qwen3", build_folder=build,
        stop_id=ADDED_IDS[IM_END], bos_id=None, vocab_size=VOCAB_SIZE,
        emulator_profile="vllm-hermes")
