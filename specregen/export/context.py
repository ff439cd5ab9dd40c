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
    return replace(fallback, **found)
