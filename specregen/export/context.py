"""The dataset-wide fields of export rows: from the shard's parquet metadata, else a fallback."""

from __future__ import annotations

from dataclasses import replace

from specregen.export.rows import ExportContext

# The format of every publication made before token parquets named theirs.
LEGACY_FORMAT = "kimi_k25"

# Reconstruction records these in the token parquet's schema metadata; older shards lack them
# and the publication's manifest or config fills in what it knows.
_KEYS = {
    "format": ("format", "specregen.format"),
    "tokenizer": ("tokenizer", "tokenizer_name", "specregen.tokenizer"),
    "tokenizer_fingerprint": ("tokenizer_fingerprint", "specregen.tokenizer_fingerprint"),
}


def context_from_metadata(metadata: dict[str, str], fallback: ExportContext) -> ExportContext:
    found: dict[str, str] = {}
    for field, names in _KEYS.items():
        for name in names:
            if metadata.get(name):
                found[field] = metadata[name]
                break
    # Token files record their format in the `specregen` metadata (`TokenFileMeta`, whose
    # `format` is the format's `describe()`): its name is the rows' format.
    recorded = _recorded_format(metadata.get("specregen"))
    if recorded and "format" not in found:
        found["format"] = recorded
    return replace(fallback, **found)


def _recorded_format(raw: str | None) -> str | None:
    import json

    try:
        meta = json.loads(raw) if raw else None
    except ValueError:
        return None
    described = meta.get("format") if isinstance(meta, dict) else None
    name = described.get("name") if isinstance(described, dict) else None
    return name if isinstance(name, str) and name else None
