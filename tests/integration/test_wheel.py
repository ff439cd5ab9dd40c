"""The wheel, installed as a user installs it (not editable): built from this checkout, it holds
every file the package reads at run time and only `specregen` (the Prefect side runs from the
checkout), and an installed copy renders K2.5 and Qwen3 prompts through the bundled tokenizers
and chat templates and runs the CLI; its Prefect commands find a checkout or say to run there.

The wheel is built offline from the project's environment (`--no-build-isolation`: its
setuptools, from the dev extra) and installed with `--no-deps` into a fresh venv of the same
interpreter. That venv sees the project environment's site-packages for the dependencies through
a `.pth` line, which adds the directory to sys.path without running its own `.pth` files, so the
project's editable install of specregen (an import hook started from such a file) stays out: the
checks run with the working directory outside the checkout and assert that `specregen` is the
copy inside the new venv.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.support import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# The one top-level package the wheel installs: the Prefect layer's generic `flows`, `tasks`
# and `deployments` stay in the checkout (pyproject.toml says why), though the source tree the
# wheel is built from holds them.
TOP_LEVEL = {"specregen"}
PREFECT_SIDE = ("flows", "tasks", "deployments")
# The commands that run the Prefect side, with arguments that would get past option parsing.
PREFECT_COMMANDS = (["run", "--config", "pipeline.yaml"], ["demo"],
                    ["deploy", "--config", "pipeline.yaml"], ["retry", "B1_glaive"])


def _package_data() -> set[str]:
    """Every non-Python file under specregen/ in the checkout, as a wheel path."""
    root = REPO / "specregen"
    return {
        p.relative_to(REPO).as_posix()
        for p in root.rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts
    }


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A copy of the checkout's sources, as a fresh clone holds them (the Prefect side too)."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    for name in ("specregen", *PREFECT_SIDE):
        shutil.copytree(REPO / name, src / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return src


@pytest.fixture(scope="module")
def wheel(source, tmp_path_factory) -> Path:
    """The wheel built from the copy: setuptools writes build/ and *.egg-info beside
    pyproject.toml and reads them back in later builds (a stale SOURCES.txt or build/lib would
    hide a file that package-data no longer names), so the build starts clean, as from a fresh
    clone, and leaves nothing in the checkout."""
    src = source
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "--no-cache-dir", "-w", str(out), str(src)],
        capture_output=True, text=True, timeout=300, cwd=src,
    )
    assert done.returncode == 0, f"pip wheel failed:\n{done.stdout}\n{done.stderr}"
    wheels = list(out.glob("specregen-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh venv holding the wheel (its own pip installs it, console script and all); its
    python."""
    env_dir = tmp_path_factory.mktemp("venv") / "env"
    venv.EnvBuilder(with_pip=True, symlinks=True).create(env_dir)
    python = env_dir / "bin" / "python"
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "--no-deps", "--no-index",
         "--disable-pip-version-check", "--no-cache-dir", str(wheel)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, f"pip install failed:\n{done.stdout}\n{done.stderr}"
    site = Path(_run(python, "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                     cwd=env_dir).stdout.strip())
    # Then the project environment's packages for the dependencies, after the venv's own (a
    # plain path line: that directory's .pth files, the editable specregen's hook among them,
    # are not run).
    (site / "project-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def _run(python: Path, code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=300)


def test_wheel_holds_the_package_data_and_only_the_project_packages(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    data = _package_data()
    assert "specregen/py.typed" in data
    assert {"specregen/models/kimi_k25/chat_template.jinja",
            "specregen/models/qwen3/chat_template.jinja",
            "specregen/assets/mini_tokenizer/tiktoken.model",
            "specregen/models/qwen3/assets/mini_tokenizer/tokenizer.json",
            "specregen/assets/samples/B2_opencodeinstruct.parquet"} <= data
    assert data <= names, f"missing from the wheel: {sorted(data - names)}"
    # The modules that real-vLLM model folders copy by path.
    assert {"specregen/models/kimi_k25/hf_tokenizer.py", "specregen/models/kimi_k25/tools_ts.py",
            "specregen/models/kimi_k3/hf_tokenizer.py",
            "specregen/models/kimi_k3/encoding.py"} <= names
    top = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert top == TOP_LEVEL, f"not only specregen at the top: {sorted(top - TOP_LEVEL)}"
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)


CHECK = r"""
import importlib.util, json, sys
import specregen
from specregen.models.registry import get_format
from specregen.models.tokenizer import load_tokenizer
from specregen.models.kimi_k25 import serverside
from specregen.models.qwen3 import render

messages = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What is 2 + 2?"}]
k25 = get_format("kimi-k2.5", load_tokenizer("mini"))
# The bundled Jinja template (the file the wheel must hold), as vLLM renders it.
k25_jinja = serverside.encode_prompt("vllm", {"messages": messages}, k25.tok, True)
qwen3 = get_format("qwen3", load_tokenizer("mini-qwen3"))
qwen3_text = render.render_with_template(render.template_text(), messages)
# K3 has no template: its prompt is our Python encoder's, over the bundled mini-k3 table.
k3 = get_format("kimi-k3", load_tokenizer("mini-k3"))
k3_ids = k3.encode_prompt(messages)
print(json.dumps({
    "specregen": specregen.__file__,
    "prefect_side": [n for n in ("flows", "tasks", "deployments") if importlib.util.find_spec(n)],
    "k25_ids": k25.encode_prompt(messages), "k25_jinja_ids": k25_jinja,
    "k25_text": k25.tok.decode(k25_jinja),
    "qwen3_ids": qwen3.encode_prompt(messages),
    "qwen3_jinja_ids": qwen3.tok.encode_with_specials(qwen3_text), "qwen3_text": qwen3_text,
    "k3_ids": k3_ids, "k3_text": k3.tok.decode(k3_ids),
}))
"""


def test_installed_copy_renders_prompts_with_bundled_files(installed, tmp_path):
    done = _run(installed, CHECK, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    env_dir = installed.parent.parent
    assert Path(out["specregen"]).is_relative_to(env_dir), out["specregen"]
    assert not Path(out["specregen"]).is_relative_to(REPO), out["specregen"]
    assert out["prefect_side"] == [], "the Prefect side must not be installed"
    assert out["k25_ids"] and out["k25_ids"] == out["k25_jinja_ids"]
    assert "What is 2 + 2?" in out["k25_text"]
    assert out["qwen3_ids"] and out["qwen3_ids"] == out["qwen3_jinja_ids"]
    assert out["qwen3_text"].startswith("<|im_start|>system\nYou are terse.")
    assert out["k3_ids"] and "What is 2 + 2?" in out["k3_text"]
    assert "You are terse." in out["k3_text"]


def _specregen(installed: Path, args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "SPECREGEN_ROOT", "PREFECT_API_URL")}
    return subprocess.run([str(installed.parent / "specregen"), *args], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=300)


def test_installed_cli_runs(installed, tmp_path):
    for args in (["--help"], ["run", "--help"], ["deploy", "--help"]):
        done = _specregen(installed, args, tmp_path)
        assert done.returncode == 0, f"specregen {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
        assert "Usage" in done.stdout


def test_installed_prefect_commands_outside_a_checkout_say_where_to_run(installed, tmp_path):
    """No checkout anywhere: at once, one line, exit 2 (usage: docs/exit-codes.md), saying the
    command runs from the project checkout and how; no traceback, nothing started."""
    (tmp_path / "pipeline.yaml").write_text("storage: out\n")
    for args in PREFECT_COMMANDS:
        done = _specregen(installed, args, tmp_path)
        said = f"specregen {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
        assert done.returncode == 2, said
        assert f"`specregen {args[0]}` runs the project's Prefect flows" in done.stderr, said
        assert "project checkout" in done.stderr and "cd into" in done.stderr, said
        assert "Traceback" not in done.stderr, said
    assert not (tmp_path / "out").exists()


def test_installed_prefect_commands_find_the_checkout_they_run_in(installed, source):
    """A console script has no working directory on sys.path: run from a checkout (or a folder
    inside one), the command still finds its flows -- here it gets as far as the config."""
    for cwd in (source, source / "flows"):
        done = _specregen(installed, ["run", "--config", str(source / "missing.yaml")], cwd)
        said = f"from {cwd}:\n{done.stdout}\n{done.stderr}"
        assert done.returncode == 2, said
        assert "missing.yaml" in done.stderr and "project checkout" not in done.stderr, said


@pytest.mark.parametrize(("model", "tokenizer"), [("moonshotai/kimi-k2.5", "mini"),
                                                  ("Qwen/Qwen3-8B", "mini-qwen3"),
                                                  ("moonshotai/kimi-k3", "mini-k3")])
def test_installed_cli_reconstructs_a_sample_of_each_family(installed, tmp_path, model,
                                                            tokenizer):
    # The format comes from the request's model, the tokenizer from the installed package.
    record = {"sample_id": "s1",
              "request": {"model": model, "messages": [{"role": "user",
                                                        "content": "What is 2 + 2?"}]},
              "response": {"choices": [{"index": 0, "finish_reason": "stop", "message": {
                  "role": "assistant", "reasoning": "Add them.", "content": "Four."}}],
                  "usage": {}}}
    (tmp_path / "in.jsonl").write_text(json.dumps(record) + "\n")
    done = _specregen(installed, ["reconstruct", "in.jsonl", "--tokenizer", tokenizer,
                                  "--out", "out.parquet"], tmp_path)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.num_rows == 1 and table.column("sample_id").to_pylist() == ["s1"]
    assert table.column("completion_len").to_pylist()[0] > 0
