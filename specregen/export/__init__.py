"""Trainer exports of a publication: exact token rows (`train.jsonl`) and lossy text
conversations (`messages.jsonl`), written shard by shard."""

from specregen.export.rows import ExportContext, RunMeta, messages_row, train_row
from specregen.export.writer import EXPORT_FILES, EXPORT_NOTES, ExportShard, write_exports

__all__ = ["EXPORT_FILES", "EXPORT_NOTES", "ExportContext", "ExportShard", "RunMeta",
           "messages_row", "train_row", "write_exports"]
