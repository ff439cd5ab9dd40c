"""The real vLLM server for the tests of this folder: one at a time, started on first use.

The tests run the CPU build of vLLM from `.venv-vllm` (the test command builds it:
scripts/setup_vllm.sh). Where it could not be installed they FAIL with the installer's reason;
they never skip for that. K2.5 and K3 need the real Kimi vocabulary (KIMI_TOKENIZER_DIR, which
the test command sets from ../shared/kimi) and skip cleanly without it, like every test of the
reference data.

The families' servers load different models, so the session holds at most one: asking for
another family stops the first. The test files are named so that each family's tests run
together (test_k25_*, then test_qwen3_*, then test_x_k3_*), and the server stops when this
folder is done. Each family's tokenizer is read from the model folder its server serves.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from specregen.models.registry import get_format, real_vllm_spec
from specregen.models.tokenizer import Tokenizer, load_tokenizer
from specregen.probe.model import ProviderProfile
from specregen.realserver.conformance import probe_profile
from specregen.realserver.server import DEFAULT_VENV, PYTHON_ENV, VllmServer
from tests.support import kimi_tokenizer_dir


class Family:
    """A family's running server with its tokenizer and format."""

    def __init__(self, name: str, server: VllmServer, tok: Tokenizer) -> None:
        self.name = name
        self.server = server
        self.tok = tok
        self.fmt = get_format(name, tok)
        self.spec = server.spec


class Servers:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.current: Family | None = None
        # What specregen's probe found against the current server, per way of asking.
        self.profiles: dict[str, ProviderProfile] = {}

    def profile(self, name: str, variant: str) -> ProviderProfile:
        family = self.get(name)
        if variant not in self.profiles:
            self.profiles[variant] = probe_profile(family.server, family.fmt, variant)
        return self.profiles[variant]

    def get(self, name: str) -> Family:
        if self.current is not None and self.current.name == name:
            return self.current
        self.stop()
        tokenizer_dir = None
        if name.startswith("kimi"):
            tokenizer_dir = kimi_tokenizer_dir()
            if tokenizer_dir is None:
                pytest.skip("KIMI_TOKENIZER_DIR is not set to the real Kimi vocabulary")
        _require_environment()
        spec = real_vllm_spec(name, tokenizer_dir)
        assert spec is not None
        server = VllmServer.start(spec, self.workdir / name)
        # The vocabulary and added-token table the server runs: its model folder's.
        self.current = Family(name, server, load_tokenizer(server.folder))
        return self.current

    def stop(self) -> None:
        self.profiles = {}
        if self.current is not None:
            self.current.server.stop()
            self.current = None


def _require_environment() -> None:
    """Fail (never skip) with the reason the vLLM environment is missing."""
    named = os.environ.get(PYTHON_ENV)
    python = Path(named) if named else DEFAULT_VENV / "bin" / "python"
    if python.is_file():
        return
    failed = Path(str(python.parents[1]) + ".failed")
    reason = failed.read_text(encoding="utf-8") if failed.is_file() else (
        "no .venv-vllm: run the tests with `bash scripts/test.sh` (it builds it), or "
        "`bash scripts/setup_vllm.sh` first")
    pytest.fail(f"the real vLLM server cannot run here: {reason}", pytrace=False)


@pytest.fixture(scope="package")
def real_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    servers = Servers(tmp_path_factory.mktemp("real-vllm"))
    yield servers
    servers.stop()


@pytest.fixture
def k25(real_servers: Servers) -> Family:
    return real_servers.get("kimi-k2.5")


@pytest.fixture
def qwen3(real_servers: Servers) -> Family:
    return real_servers.get("qwen3")


@pytest.fixture
def k3(real_servers: Servers) -> Family:
    return real_servers.get("kimi-k3")
