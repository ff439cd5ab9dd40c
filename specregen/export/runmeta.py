"""Usage, provider and model of each sample's final answer, from one chunk's raw log.

Read per chunk while its shard is exported, so memory holds one chunk's small records only.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from specregen.export.rows import RunMeta
from specregen.store.rawlog import FINAL_ANSWER, RawLog


def chunk_run_meta(
    rawlog_url: str,
    sample_ids: Collection[str],
    fingerprints: Mapping[str, str] | None = None,
) -> dict[str, RunMeta]:
    """sample_id -> the last final answer's metadata, for the given samples.

    With `fingerprints` (sample_id -> today's request fingerprint) only the answer the
    reconstruction used counts; without (a publication read back without its config) the
    last final answer of the sample does.
    """
    wanted = set(sample_ids)
    found: dict[str, RunMeta] = {}
    for record in RawLog(rawlog_url).iter_records():
        sample_id = record.get("sample_id")
        if sample_id not in wanted:
            continue
        if not record.get("final") or record.get("status") not in FINAL_ANSWER:
            continue
        if fingerprints is not None and fingerprints.get(sample_id) != record.get("fingerprint"):
            continue
        usage = record.get("usage")
        if not isinstance(usage, dict):
            response = record.get("response")
            usage = response.get("usage") if isinstance(response, dict) else None
        found[sample_id] = RunMeta(
            usage=usage if isinstance(usage, dict) else None,
            provider=_text(record.get("provider")),
            model=_text(record.get("model")),
        )
    return found


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None
