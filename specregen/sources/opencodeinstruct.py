"""nvidia/OpenCodeInstruct: parquet (or JSONL) rows `id, input, output, domain, ...`.

The user turn is `input` verbatim; the dataset has no system text, so the default is used.
`output` is kept as the reference answer.
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

META_FIELDS = ("domain", "generation_algorithm")


def convert(row: Any, *, dataset: str, row_label: str) -> Prompt | SourceReject:
    sample_id = row_id(dataset, row, ("id",))
    try:
        fields = require_object(row)
        user = require_user_text(require_str(fields, "input"), "field 'input'")
    except RowError as err:
        return reject(sample_id, row_label, str(err))
    output = fields.get("output")
    meta: dict[str, Any] = {
        "source_row": row_label,
        "reference_first_turn": text_reference(output) if isinstance(output, str) else None,
    }
    meta.update({name: fields[name] for name in META_FIELDS if name in fields})
    return make_prompt(sample_id, DEFAULT_SYSTEM_PROMPT, user, meta=meta)
