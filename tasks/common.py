"""What every task needs: the dataset's run object, and a stable cache key."""

from __future__ import annotations

import os
import secrets
from dataclasses import replace
from functools import lru_cache
from typing import Any

from specregen.config import load_config
from specregen.errors import SpecregenError
from specregen.pipeline.layout import DatasetRun
from specregen.pipeline.probing import stored_traits
from specregen.records import ProviderTraits
from specregen.store.manifest import fingerprint


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


def stage_key(stage: str):
    """A cache key fn: dataset, stage, chunk and the stage's fingerprint, never the run id."""

    def key(_context: Any, parameters: dict[str, Any]) -> str:
        # The storage root is part of the key: the same dataset run into another store must
        # write there, not take the cached result of the first store.
        run = dataset_run(parameters["config_path"], parameters["dataset"])
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
