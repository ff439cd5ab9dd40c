"""Where a dataset's stages write, and the fingerprints that name their outputs."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path

import specregen
from specregen.config import DatasetConfig, PipelineConfig
from specregen.models.registry import format_source_files
from specregen.records import ProviderTraits
from specregen.store.fs import Store
from specregen.store.manifest import files_fingerprint, fingerprint

CHUNK = "chunk-{:05d}"

# What reconstruction's output depends on besides the tokenizer and the chosen chat format's
# own files (only that format's: editing another family's code reruns nothing). Not the
# registry nor the families' descriptors: they name formats, and a new family's line in the
# registry must not rerun every dataset of the others.
_RECONSTRUCTION_CODE = ("reconstruct.py", "wire/response.py", "wire/token_ids.py", "logprobs.py",
                        "models/tokenizer.py", "models/tokenizer_base.py",
                        "models/chat_format.py")
# Whole-conversation datasets (`turns: all`) are also built by these; single-turn ones are not,
# so their fingerprints do not move when conversation code changes.
_CONVERSATION_CODE = ("conversation/plan.py", "conversation/replay.py",
                      "conversation/samples.py")


def chunk_name(index: int) -> str:
    return CHUNK.format(index)


def reconstruction_code_fingerprint(format_name: str, *, conversations: bool = False) -> str:
    root = Path(specregen.__file__).parent
    names = _RECONSTRUCTION_CODE + (_CONVERSATION_CODE if conversations else ())
    files = [root / name for name in names]
    files.extend(format_source_files(format_name))
    return files_fingerprint(files)


def tokenizer_fingerprint(spec: str) -> str:
    """The hash of the tokenizer's files: a folder's, or a bundled tokenizer's (`mini` and every
    family's aliases, `registry.bundled_tokenizer_folders`), else the hub id's name."""
    from specregen.models.registry import bundled_tokenizer_folders
    from specregen.models.tokenizer import MINI_TOKENIZER_DIR, TOKENIZER_FILES

    bundled = {"mini": MINI_TOKENIZER_DIR, **bundled_tokenizer_folders()}
    folder = bundled.get(spec) or Path(spec).expanduser()
    if folder.is_dir():
        return files_fingerprint([folder / f for f in TOKENIZER_FILES if (folder / f).is_file()])
    return fingerprint("hub", spec)  # a hub id: the files behind it are pinned by the hub


@dataclass(frozen=True)
class DatasetRun:
    """One dataset of one pipeline config: its storage and the fingerprints of its stages."""

    config: PipelineConfig
    dataset: DatasetConfig
    # What the endpoint's probe found about its parsers (pipeline/probing.py attaches the
    # stored profile's); reconstruction depends on them, so they are in its fingerprint.
    traits: ProviderTraits | None = None

    @property
    def name(self) -> str:
        return self.dataset.name

    @cached_property
    def store(self) -> Store:
        return Store(self.config.storage)

    @cached_property
    def prompts_fp(self) -> str:
        d = self.dataset
        return fingerprint("prompts", d.adapter, d.source, d.adapter_options, d.limit,
                           self.config.chunk_size, _source_identity(self.store, d.source))

    @cached_property
    def endpoint_fp(self) -> str:
        # What shapes the requests (and so their fingerprints in the raw log); not limits.
        e = self.config.endpoint
        return fingerprint("endpoint", e.model, e.dialect, e.provider and e.provider.as_body(),
                           e.reasoning and e.reasoning.as_body(), e.thinking,
                           e.sampling.model_dump(), e.return_token_ids)

    @cached_property
    def reconstruct_fp(self) -> str:
        return fingerprint("reconstruct", self.prompts_fp, self.endpoint_fp,
                           self.config.format_name,
                           reconstruction_code_fingerprint(
                               self.config.format_name,
                               conversations=self.dataset.turns == "all"),
                           tokenizer_fingerprint(self.config.tokenizer),
                           self.traits.to_dict() if self.traits is not None else None,
                           asdict(self.dataset.gate_config().tolerance))

    @cached_property
    def gate_fp(self) -> str:
        return fingerprint("gate", self.reconstruct_fp, self.dataset.gate_config().to_dict())

    def rawlog_url(self, chunk: int) -> str:
        # Per chunk position, not per prompts fingerprint: a larger `limit` keeps the first
        # chunks' samples, and their paid results, where they were.
        return self.store.url_of(self.name, "rawlog", chunk_name(chunk))


def _source_identity(store: Store, source: str) -> str:
    """Size and modification stamp of the source, so an edited file is read again."""
    import fsspec

    try:
        fs, path = fsspec.core.url_to_fs(source)
        info = fs.info(path)
    except (OSError, ValueError):
        return "unknown"
    stamp = info.get("mtime") or info.get("LastModified") or info.get("ETag") or ""
    return f"{info.get('size')}:{stamp}"
