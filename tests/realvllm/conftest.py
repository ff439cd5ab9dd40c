"""The real vLLM server for the tests of this folder: one at a time, started on first use.

The tests run the CPU build of vLLM from `.venv-vllm` (the test command builds it:
scripts/setup_vllm.sh). Where it could not be installed they FAIL with the installer's reason;
they never skip for that. K2.5 and K3 need the real Kimi vocabulary (KIMI_TOKENIZER_DIR, which
the test command sets from ../shared/kimi) and skip cleanly without it, like every test of the
reference data.

The families' servers load different models, so the session holds at most one: asking for
another family stops the first. The tests are run family by family (`FAMILY_ORDER`, whatever
their file: a test takes its family by the fixture `k25`, `qwen3`, `k3`, or `family` with the
family's name as its parameter), and the server stops when this folder is done. Each family's
tokenizer is read from the model folder its server serves.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from specregen.models.registry import get_format, real_vllm_spec
from specregen.models.tokenizer import Tokenizer, load_tokenizer
from specregen.probe.model import ProviderProfile
from specregen.realserver import conformance
from specregen.realserver.conformance import probe_profile
from specregen.realserver.server import DEFAULT_VENV, PYTHON_ENV, VllmServer
from tests.support import kimi_tokenizer_dir

RESULTS_REQUESTS = 16


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
        # What specregen's probe found against the current server, per way of asking, and
        # the current family's corpus results.
        self.profiles: dict[str, ProviderProfile] = {}
        self.corpus_results: list[conformance.Result] | None = None

    def profile(self, name: str, variant: str) -> ProviderProfile:
        family = self.get(name)
        if variant not in self.profiles:
            self.profiles[variant] = probe_profile(family.server, family.fmt, variant)
        return self.profiles[variant]

    def results(self, name: str) -> list[conformance.Result]:
        """The family's fidelity corpus (`RESULTS_REQUESTS` requests) through its server, plain
        and streamed, both ways of asking, rebuilt in every pass with the probe's traits:
        computed once, read by the conformance and fidelity tests alike."""
        family = self.get(name)
        if self.corpus_results is None:
            traits = {v: self.profile(name, v).traits() for v in conformance.VARIANTS}
            cases = conformance.real_cases(family.spec, family.tok, RESULTS_REQUESTS, seed=3)
            self.corpus_results = conformance.run(family.server, family.fmt, cases,
                                                  traits=traits)
        return self.corpus_results

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
        self.corpus_results = None
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


HERE = Path(__file__).parent
FAMILY_ORDER = ("kimi-k2.5", "qwen3", "kimi-k3")
_FIXTURE_FAMILY = {"k25": "kimi-k2.5", "qwen3": "qwen3", "k3": "kimi-k3"}


def family_of(item: pytest.Item) -> str | None:
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "family" in callspec.params:
        return str(callspec.params["family"])
    names = getattr(item, "fixturenames", ())
    return next((f for n, f in _FIXTURE_FAMILY.items() if n in names), None)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """One server start per family: this folder's tests sorted by family, in file order
    within one (a stable sort; tests of other folders keep their places)."""
    here = [i for i, item in enumerate(items) if Path(str(item.path)).parent == HERE]
    ours = [items[i] for i in here]
    rank = {name: n for n, name in enumerate(FAMILY_ORDER)}
    ours.sort(key=lambda item: rank.get(family_of(item) or "", len(rank)))
    for i, item in zip(here, ours, strict=True):
        items[i] = item


@pytest.fixture
def family(request: pytest.FixtureRequest, real_servers: Servers) -> Family:
    """The family named by the test's parameter
    (`@pytest.mark.parametrize("family", [...], indirect=True)`)."""
    return real_servers.get(request.param)


@pytest.fixture
def k25(real_servers: Servers) -> Family:
    return real_servers.get("kimi-k2.5")


@pytest.fixture
def qwen3(real_servers: Servers) -> Family:
    return real_servers.get("qwen3")


@pytest.fixture
def k3(real_servers: Servers) -> Family:
    return real_servers.get("kimi-k3")
