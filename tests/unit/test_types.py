"""The type checker passes: mypy over the `specregen` package with pyproject.toml's [tool.mypy]
settings, as `python -m mypy` from the checkout runs it. Its cache lives in the temporary
directory and is reused between runs (mypy checks it against the sources)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support import REPO

pytestmark = pytest.mark.slow  # about 30 s of CPU from a cold cache, a few seconds warm


def test_mypy_passes():
    cache = Path(tempfile.gettempdir()) / "specregen-mypy-cache"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MYPY")}
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(cache), "--no-color-output"],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=600,
    )
    # (mypy is in the dev extra: `pip install -e '.[dev]'`, as scripts/setup.sh does)
    assert done.returncode == 0, f"mypy found problems:\n{done.stdout}\n{done.stderr}"
