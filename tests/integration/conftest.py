"""One Prefect test server per session, started only by the tests that run flows (~15 s)."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ["PREFECT_HOME"] = str(tmp_path_factory.mktemp("prefect-home"))
    os.environ["PREFECT_LOCAL_STORAGE_PATH"] = str(tmp_path_factory.mktemp("prefect-results"))
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=90):
        yield
