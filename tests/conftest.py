"""Shared fixtures: the bundled mini tokenizer always, the real Kimi vocabulary where it exists."""

from __future__ import annotations

import pytest

from specregen.models.kimi_k25 import KimiK25
from specregen.models.tokenizer import Tokenizer
from tests.support import get_tokenizer


@pytest.fixture(params=["mini", "kimi"], scope="session")
def fmt(request) -> KimiK25:
    """The K2.5 format over the mini tokenizer, and over the real vocabulary where it exists."""
    return KimiK25(get_tokenizer(request.param))


@pytest.fixture(scope="session")
def mini_fmt() -> KimiK25:
    return KimiK25(get_tokenizer("mini"))


@pytest.fixture(scope="session")
def kimi_tok() -> Tokenizer:
    return get_tokenizer("kimi")


@pytest.fixture(autouse=True)
def _no_debug_carried_over(monkeypatch):
    """`specregen --debug` turns tracebacks on for its process (SPECREGEN_DEBUG); under
    CliRunner that process is the test run's, so one test's --debug would show tracebacks in
    every later test's output. Each test starts without it, and it is put back after."""
    monkeypatch.delenv("SPECREGEN_DEBUG", raising=False)
