"""What every task needs: the dataset's run object, and a stable cache key."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
from collections.abc import Callable
from dataclasses import replace
from functools import lru_cache
from typing import Any

from specregen.config import load_config
from specregen.errors import SpecregenError
from specregen.pipeline.layout import DatasetRun
from specregen.pipeline.probing import stored_traits
from specregen.progress import ProgressState, format_line
from specregen.records import ProviderTraits
from specregen.store.manifest import fingerprint, read_manifest

log = logging.getLogger(__name__)


def dataset_run(config_path: str, dataset: str) -> DatasetRun:
    # Cached while the file is unchanged: a long-lived worker must see an edited config.
    stat = os.stat(config_path)
    key = (config_path, dataset, stat.st_mtime_ns, stat.st_size)
    # The endpoint's probe traits are read each time: the probe stage may have just stored
    # them, and reconstruction's fingerprint depends on them.
    return _with_traits(*key, stored_traits(_dataset_run(*key)))


@lru_cache(maxsize=32)
def _with_traits(
    config_path: str, dataset: str, mtime: int, size: int, traits: ProviderTraits | None
) -> DatasetRun:
    return replace(_dataset_run(config_path, dataset, mtime, size), traits=traits)


@lru_cache(maxsize=32)
def _dataset_run(config_path: str, dataset: str, _mtime: int, _size: int) -> DatasetRun:
    config = load_config(config_path)
    return DatasetRun(config, config.dataset(dataset))


def stage_key(stage: str, *, finished: Callable[[DatasetRun, dict[str, Any]], bool] | None = None):
    """A cache key fn: dataset, stage, chunk and the stage's fingerprint, never the run id.

    With `finished`, only a task whose work is already finished when it starts gets a key; any
    other run is not cached (Prefect caches nothing under a None key), so an outcome that is not
    final (a chunk stopped by the budget) is returned to the flow and asked again next time."""

    def key(_context: Any, parameters: dict[str, Any]) -> str | None:
        # The storage root is part of the key: the same dataset run into another store must
        # write there, not take the cached result of the first store.
        run = dataset_run(parameters["config_path"], parameters["dataset"])
        if finished is not None and not finished(run, parameters):
            return None
        where = fingerprint(run.config.storage, storage_epoch(run))
        chunk = parameters.get("chunk", "all")
        return f"{where}:{parameters['dataset']}:{stage}:{chunk}:{parameters['fingerprint']}"

    return key


def storage_epoch(run: Any) -> str:
    """A random id kept in the dataset's storage: deleting the storage starts a new epoch, so
    Prefect's cached task results (kept by the server's side, not in the storage) of the old
    files are not taken for the new ones."""
    parts = (run.name, ".specregen-epoch")
    try:
        return run.store.read_bytes(*parts).decode()
    except FileNotFoundError:
        epoch = secrets.token_hex(8)
        # Two first tasks racing may each write one: the loser's key only misses the cache,
        # and every stage skips finished work by its own manifests anyway.
        run.store.write_bytes(epoch.encode(), *parts)
        return epoch


def retry_unless_user_error(_task: Any, _task_run: Any, state: Any) -> bool:
    """A task retry condition: crashes and outages retry; a failure the user must fix (a
    missing source, a bad key, a busy or unwritable output) fails at once."""
    # Called from the engine's event loop: ask for the synchronous result explicitly, or
    # `result()` hands back a coroutine and nothing would ever be retried.
    error = state.result(raise_on_failure=False, _sync=True)
    return isinstance(error, Exception) and not isinstance(error, SpecregenError)


def chunk_rows(run: DatasetRun, chunk: int) -> int | None:
    """Prompts in one chunk, from the prompts stage's manifest (None when it is not there)."""
    from specregen.pipeline.prompts import STAGE

    manifest = read_manifest(run.store, run.name, STAGE, run.prompts_fp)
    if manifest is None or not 0 <= chunk < len(manifest.shards):
        return None
    return manifest.shards[chunk].rows


class ProgressArtifacts:
    """A Prefect progress artifact fed by a `Progress` observer in an async task: the percent
    done, and in its description the live view's line (done / in flight / failed, rates,
    spend, projected total, time left).

    Observers are plain callables, called on the task's event loop; the API calls are async
    (`acreate_progress_artifact` / `aupdate_progress_artifact`), so a call only records the
    newest state and one writer task sends it: a slow server never delays the work, and
    states that arrive while a write is on its way collapse into the next write. `aclose()`
    sends the last state and waits for it."""

    def __init__(self, key: str, title: str) -> None:
        self.key, self.title = key, title
        self.artifact_id: Any = None
        self.written: list[str] = []  # descriptions sent, in order (what the UI showed)
        self._latest: ProgressState | None = None
        self._writer: asyncio.Task[None] | None = None
        self._failed = False

    def __call__(self, state: ProgressState) -> None:
        if self._failed:
            return
        self._latest = state
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write())

    async def _write(self) -> None:
        from prefect.artifacts import acreate_progress_artifact, aupdate_progress_artifact

        try:
            while self._latest is not None:
                state, self._latest = self._latest, None
                percent = 100.0 * (state.fraction if state.fraction is not None else 0.0)
                text = f"{self.title}: {format_line(state)}"
                if self.artifact_id is None:
                    self.artifact_id = await acreate_progress_artifact(
                        percent, key=self.key, description=text)
                else:
                    await aupdate_progress_artifact(self.artifact_id, percent,
                                                    description=text)
                self.written.append(text)
        except Exception:
            # The stage's work goes on without its display: said once, never raised.
            self._failed = True
            log.warning("progress artifact %s could not be written; no more updates",
                        self.key, exc_info=True)

    async def aclose(self) -> None:
        """Send the last state and wait until it is written."""
        if self._latest is not None and (self._writer is None or self._writer.done()):
            self._writer = asyncio.get_running_loop().create_task(self._write())
        if self._writer is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
