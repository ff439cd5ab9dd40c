"""The pipeline's checks before paying, its lease, and its one-line failures (no Prefect run)."""

from __future__ import annotations

import asyncio
import logging
import os
import sys

import pytest
import yaml

from flows.command import _OneLine, owner_alive, owner_tag
from flows.pipeline import DatasetsFailedError, failure_of
from specregen.config import load_config
from specregen.errors import (
    EXIT_AUTH,
    EXIT_BUSY,
    EXIT_PARTIAL,
    EXIT_USAGE,
    AuthError,
    OutputBusyError,
    UsageError,
)
from specregen.pipeline.apikey import MissingKeyError
from specregen.pipeline.layout import DatasetRun
from specregen.pipeline.publish import GateFailedError
from specregen.pipeline.run import check_before_paying, run_dataset
from tests.support import REPO


def make_run(tmp_path, *, source: str = "bundled:B3_magicoder",
             base_url: str = "http://127.0.0.1:9/api/v1") -> DatasetRun:
    config = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())
    config["storage"] = str(tmp_path / "store")
    config["endpoint"]["base_url"] = base_url
    config["endpoint"]["api_key_env"] = "H5_TEST_KEY_THAT_IS_NOT_SET"
    config["datasets"] = [{"name": "M", "adapter": "magicoder", "source": source}]
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    loaded = load_config(path)
    return DatasetRun(loaded, loaded.datasets[0])


def test_a_missing_source_fails_before_paying_naming_dataset_and_path(tmp_path):
    missing = tmp_path / "nowhere" / "rows.jsonl"
    run = make_run(tmp_path, source=str(missing))
    with pytest.raises(UsageError) as info:
        check_before_paying(run, api_key_found=True)
    line = info.value.one_line()
    assert "M: source" in line and str(missing) in line and "does not exist" in line
    assert info.value.exit_code == EXIT_USAGE


def test_a_missing_key_for_a_remote_endpoint_fails_before_paying(tmp_path, monkeypatch):
    monkeypatch.delenv("H5_TEST_KEY_THAT_IS_NOT_SET", raising=False)
    run = make_run(tmp_path, base_url="https://openrouter.example/api/v1")
    with pytest.raises(MissingKeyError) as info:
        check_before_paying(run, api_key_found=False)
    assert isinstance(info.value, AuthError) and info.value.exit_code == EXIT_AUTH
    assert "H5_TEST_KEY_THAT_IS_NOT_SET" in str(info.value)
    check_before_paying(run, api_key_found=True)  # a key from a Prefect Secret is enough


def test_the_key_comes_from_the_secret_else_the_environment_and_is_never_shown(tmp_path,
                                                                              monkeypatch):
    """load_api_key, the one loader every stage calls: the config's Secret (read by the
    runner's reader), else the variable; a missing Secret or key names where, never a value."""
    from specregen.pipeline.apikey import MissingSecretError, load_api_key

    secret = "sk-or-v1-" + "5f3a9c1e7b2d4f6a8c0e1b3d5f7a9c1e"
    remote = make_run(tmp_path, base_url="https://openrouter.example/api/v1").config
    named = remote.model_copy(update={"api_key_secret": "openrouter-api-key"})
    asked: list[str] = []

    async def store(name: str) -> str | None:
        asked.append(name)
        return {"openrouter-api-key": secret}.get(name)

    async def empty(name: str) -> str | None:
        return None

    key = asyncio.run(load_api_key(named, store))
    assert asked == ["openrouter-api-key"] and key is not None and key.reveal() == secret
    assert secret not in f"{key} {key!r}"
    monkeypatch.setenv("H5_TEST_KEY_THAT_IS_NOT_SET", "from-the-environment")
    assert asyncio.run(load_api_key(remote, store)).reveal() == "from-the-environment"
    assert asyncio.run(load_api_key(named)).reveal() == "from-the-environment"  # no reader
    with pytest.raises(MissingSecretError) as missing:
        asyncio.run(load_api_key(named, empty))  # the config asked for that Secret
    assert "openrouter-api-key" in missing.value.one_line()
    assert missing.value.exit_code == EXIT_AUTH
    monkeypatch.delenv("H5_TEST_KEY_THAT_IS_NOT_SET")
    with pytest.raises(MissingKeyError) as none:
        asyncio.run(load_api_key(remote, store))
    assert "H5_TEST_KEY_THAT_IS_NOT_SET" in str(none.value)
    assert asyncio.run(load_api_key(remote, store, required=False)) is None
    loopback = make_run(tmp_path).config  # the emulator needs no key
    assert asyncio.run(load_api_key(loopback, store)) is None


def test_a_second_run_of_one_dataset_stops_naming_the_first_and_pays_nothing(tmp_path):
    """The library path: the lease is taken before anything else, storage proven with it."""
    run = make_run(tmp_path)
    from specregen.pipeline.run import dataset_lease

    with dataset_lease(run), pytest.raises(OutputBusyError) as info:
        asyncio.run(run_dataset(make_run(tmp_path), None))
    assert f"pid {os.getpid()}" in str(info.value) and "specregen run of M" in str(info.value)
    assert info.value.exit_code == EXIT_BUSY
    assert not (tmp_path / "store" / "M" / "prompts").exists()  # nothing started


def test_storage_under_a_regular_file_fails_before_anything(tmp_path):
    (tmp_path / "file").write_text("x")
    config = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())
    config["storage"] = str(tmp_path / "file" / "store")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    loaded = load_config(path)
    run = DatasetRun(loaded, loaded.datasets[0])
    from specregen.errors import EXIT_STORAGE, StorageError

    with pytest.raises(StorageError) as info:
        asyncio.run(run_dataset(run, None))
    assert info.value.exit_code == EXIT_STORAGE and "regular file" in info.value.one_line()


def test_failed_datasets_are_named_with_their_causes_and_a_shared_exit_code():
    busy = OutputBusyError("s/B1 is in use by specregen run pid 7", hint="let it finish")
    cause, code = failure_of(busy, None)
    assert cause == "s/B1 is in use by specregen run pid 7 -- let it finish"
    assert code == EXIT_BUSY
    gate, gate_code = failure_of(GateFailedError("B2: gate failed: share 0.4 > 0.02"), None)
    assert gate == "B2: gate failed: share 0.4 > 0.02" and gate_code == EXIT_PARTIAL
    # Only a message (a deployment run): Prefect's prefix goes.
    text, _ = failure_of(None, "Flow run encountered an exception: ValueError: bad\nrow")
    assert text == "ValueError: bad row"
    ok = {"dataset": "B3", "outcome": "published"}
    one = [{"dataset": "B1", "outcome": "failed", "error": cause, "exit_code": code}]
    error = DatasetsFailedError(one, [*one, ok])
    assert str(error) == f"datasets failed: B1 ({cause}); the other 1 finished"
    assert error.exit_code == EXIT_BUSY  # one kind of cause: its code
    two = [*one, {"dataset": "B2", "outcome": "failed", "error": gate, "exit_code": gate_code}]
    assert DatasetsFailedError(two, two).exit_code == EXIT_PARTIAL
    import pickle

    again = pickle.loads(pickle.dumps(error))  # Prefect stores a failed flow's exception
    assert str(again) == str(error) and again.results == error.results


def test_console_lines_carry_no_traceback_while_other_handlers_keep_it():
    try:
        raise ValueError("deep inside")
    except ValueError:
        record = logging.LogRecord("prefect.task_runs", logging.ERROR, __file__, 1,
                                   "Task run failed: %s", ("ValueError",), sys.exc_info())
    line = _OneLine(logging.Formatter("%(levelname)s %(message)s")).format(record)
    assert line == "ERROR Task run failed: ValueError"
    full = logging.Formatter("%(message)s").format(record)
    assert "Traceback" in full and "deep inside" in full


def test_owner_tags_tell_a_live_process_from_a_dead_one():
    import subprocess

    assert owner_alive(owner_tag())
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    host, _, start = owner_tag().removeprefix("specregen-pid:").rsplit(":", 2)
    assert not owner_alive(f"specregen-pid:{host}:{proc.pid}:{start}")
    # Our pid with another start time: a reused pid, not the process that ran the flow.
    assert not owner_alive(f"specregen-pid:{host}:{os.getpid()}:1")
    assert owner_alive(f"specregen-pid:another-host:{proc.pid}:{start}")


def test_tasks_retry_outages_but_not_what_the_user_must_fix():
    from prefect.states import exception_to_failed_state

    from tasks.common import retry_unless_user_error

    def retried(exc: BaseException) -> bool:
        state = asyncio.run(exception_to_failed_state(exc))
        return retry_unless_user_error(None, None, state)

    assert not retried(UsageError("M: source /x does not exist"))
    assert not retried(OutputBusyError("s/M is in use"))
    assert retried(ConnectionError("the network went away for a moment"))


def test_a_config_error_names_the_dataset_and_the_nearest_field(tmp_path):
    """Issue 21: `datasets[NAME]`, not `datasets.2`, and a typo gets "did you mean"."""
    import yaml

    from specregen.config import ConfigError, load_config
    from tests.support import REPO

    config = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())
    magicoder = next(d for d in config["datasets"] if d["name"] == "B3_magicoder")
    magicoder["adaptr"] = magicoder.pop("adapter")
    config["endpoint"]["concurency"] = config["endpoint"].pop("concurrency")
    config["datasets"].append({"adapter": "glaive", "source": "bundled:B1_glaive"})  # no name
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    said = str(caught.value)
    assert "datasets[B3_magicoder].adaptr: unknown field (did you mean 'adapter'?)" in said
    assert "datasets[B3_magicoder].adapter: required field missing" in said
    assert "endpoint.concurency: unknown field (did you mean 'concurrency'?)" in said
    assert "datasets[4].name: required field missing" in said  # no name: its position
    assert "datasets.2" not in said
