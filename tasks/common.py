"""What every task needs: the dataset's run object, and a stable cache key."""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Any

from specregen.config import load_config
from specregen.pipeline.layout import DatasetRun
from specregen.store.manifest import fingerprint


def dataset_run(config_path: str, dataset: str) -> DatasetRun:
    # Cached while the file is unchanged: a long-lived worker must see an edited config.
    stat = os.stat(config_path)
    return _dataset_run(config_path, dataset, stat.st_mtime_ns, stat.st_size)


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
        where = fingerprint(run.config.storage)
        chunk = parameters.get("chunk", "all")
        return f"{where}:{parameters['dataset']}:{stage}:{chunk}:{parameters['fingerprint']}"

    return key
