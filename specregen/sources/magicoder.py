"""ise-uiuc Magicoder: OSS-Instruct rows (`problem`, `solution`, ...) or Evol-Instruct rows
(`instruction`, `response`). The variant is detected per row from the fields present.

Magicoder's own SFT wraps OSS problems as "Write a solution to the following coding problem:\\n"
+ problem (magicoder `src/magicoder/prompt_template.py`); `instruction_prefix=True` does the
same. Evol instructions are already phrased as requests, so the prefix never applies to them.
"""

from __future__ import annotations

from typing import Any

from specregen.records import Prompt, SourceReject
from specregen.sources._common import (
    DEFAULT_SYSTEM_PROMPT,
    RowError,
    make_prompt,
    reject,
    require_object,
    require_str,
    require_user_text,
    text_reference,
)
from specregen.sources.ids import row_id

OSS_INSTRUCTION_PREFIX = "Write a solution to the following coding problem:\n"
OSS_META_FIELDS = ("lang", "raw_index", "index")


def convert(
    row: Any, *, dataset: str, row_label: str, instruction_prefix: bool = False
) -> Prompt | SourceReject:
    # Magicoder rows carry no id; OSS `index` is a position in a processing step, not an id.
    sample_id = row_id(dataset, row)
    try:
        fields = require_object(row)
        if "problem" in fields:
            variant, prompt_field, answer_field = "oss", "problem", "solution"
        elif "instruction" in fields:
            variant, prompt_field, answer_field = "evol", "instruction", "response"
        else:
            raise RowError("row has neither 'problem' (OSS-Instruct) nor 'instruction' (Evol)")
        user = require_user_text(require_str(fields, prompt_field), f"field {prompt_field!r}")
    except RowError as err:
        return reject(sample_id, row_label, str(err))
    if variant == "oss" and instruction_prefix:
        user = OSS_INSTRUCTION_PREFIX + user
    answer = fields.get(answer_field)
    meta: dict[str, Any] = {
        "source_row": row_label,
        "variant": variant,
        "reference_first_turn": text_reference(answer) if isinstance(answer, str) else None,
    }
    if variant == "oss":
        meta.update({name: fields[name] for name in OSS_META_FIELDS if name in fields})
    return make_prompt(sample_id, DEFAULT_SYSTEM_PROMPT, user, meta=meta)
