"""The scripted model: a vLLM plugin that makes a real vLLM server answer with chosen token ids.

This file runs inside the vLLM environment (`.venv-vllm`), not specregen's: the harness copies
it next to an entry point of the group `vllm.general_plugins` (`server.py`), and vLLM calls
`register()` in each of its processes. It imports only the standard library at the top, so the
harness can use `script_key` and the table format without torch or vLLM.

The model is a Qwen3-shaped network (random weights, `--load-format dummy`) whose real forward
pass runs on every step. Its logits are then replaced so that the next id of a script wins by a
margin no sampling setting can overturn; the other logits keep their values, so logprobs and
top-logprobs come out of vLLM's own sampler as usual. The script is chosen by a hash of the
prompt ids, looked up in a JSON table that the harness rewrites while the server runs:

    {"scripts": {"<script_key(prompt ids)>": [id, ...]}, "fallback": [id, ...]}

The table is re-read whenever the file changes (its mtime and size), so a test scripts its next
answers without restarting the server. After the last id of a script the last id repeats (a
script ends with the stop id, which ends the request; a cut script is cut by `max_tokens`). A
prompt without a script gets `fallback` and its key is appended to `<table>.misses`, which the
harness reads to say which request was not scripted.

The server must run whole prefills with prefix caching off (`--no-enable-prefix-caching`,
`--max-num-batched-tokens` at least the model length): the model tells a new request by its
tokens starting at position 0 in a pass, and the prompt by those ids; several requests may share
a pass (`_batch_layout` tells them apart).
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

ARCHITECTURE = "SpecregenScriptedForCausalLM"
TABLE_ENV = "SPECREGEN_VLLM_SCRIPTS"
# Added to the largest logit: e^-100 per rival id is far below one in the vocabulary's size, at
# any temperature the client sends (<= 2).
MARGIN = 100.0


def script_key(prompt_ids: Any) -> str:
    """The table key of a prompt: a hash of its ids."""
    text = ",".join(str(int(i)) for i in prompt_ids)
    return hashlib.sha256(text.encode("ascii")).hexdigest()[:32]


class ScriptTable:
    """The table file, re-read when it changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self.scripts: dict[str, list[int]] = {}
        self.fallback: list[int] = []

    def refresh(self) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._stamp, self.scripts, self.fallback = None, {}, []
            return
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return
        with open(self.path, encoding="utf-8") as f:
            data = json.load(f)
        self.scripts = {k: [int(i) for i in v] for k, v in data.get("scripts", {}).items()}
        self.fallback = [int(i) for i in data.get("fallback", [])]
        self._stamp = stamp

    def lookup(self, prompt_ids: list[int]) -> list[int]:
        self.refresh()
        key = script_key(prompt_ids)
        script = self.scripts.get(key)
        if script is None:
            with open(self.path + ".misses", "a", encoding="utf-8") as f:
                f.write(json.dumps({"key": key, "prompt_len": len(prompt_ids)}) + "\n")
            script = self.fallback
        return script


def _batch_layout(input_ids: Any, positions: Any) -> list[tuple[int, int, int]]:
    """The requests of this forward pass as (identity, first token, end token) slices.

    vLLM batches several requests into one pass; its attention metadata says where each one's
    tokens start (`query_start_loc`) and which KV-cache blocks it holds (`block_table`). A
    request keeps its first block from its prefill to its end, so that block's number is the
    request's identity across steps (prefix caching is off, so no two requests share it)."""
    from vllm.forward_context import get_forward_context, is_forward_context_available

    metadata = None
    if is_forward_context_available():
        found = get_forward_context().attn_metadata
        if isinstance(found, list):
            found = found[0] if found else None
        if isinstance(found, dict) and found:
            metadata = next(iter(found.values()))
    if metadata is None or getattr(metadata, "query_start_loc", None) is None:
        return [(0, 0, int(positions.numel()))]
    starts = [int(i) for i in metadata.query_start_loc.tolist()]
    blocks = metadata.block_table[:, 0].tolist()
    return [(int(blocks[r]), starts[r], starts[r + 1]) for r in range(len(starts) - 1)]


def _build_class() -> type:
    from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM

    class ScriptedForCausalLM(Qwen3ForCausalLM):
        """Qwen3's network; the logits of each step are the script's next id plus a margin."""

        def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
            super().__init__(vllm_config=vllm_config, prefix=prefix)
            self._table = ScriptTable(os.environ.get(TABLE_ENV, ""))
            # Per request (its identity, see `_batch_layout`): the script, the prompt's length.
            self._requests: dict[int, tuple[list[int], int]] = {}
            # Per row of the coming logits: (script, index of the id to choose).
            self._rows: list[tuple[list[int], int]] = []

        def forward(self, input_ids: Any, positions: Any, *args: Any, **kwargs: Any) -> Any:
            hidden = super().forward(input_ids, positions, *args, **kwargs)
            self._rows = []
            if input_ids is None or positions.numel() == 0:
                return hidden
            ids = input_ids.tolist()
            where = positions.tolist()
            for identity, start, end in _batch_layout(input_ids, positions):
                if start >= end:
                    continue
                if where[start] == 0:  # a new request: its whole prompt in this pass
                    prompt = [int(i) for i in ids[start:end]]
                    script = self._table.lookup(prompt) if self._table.path else []
                    self._requests[identity] = (script, len(prompt))
                script, prompt_len = self._requests.get(identity, ([], 0))
                # The id these logits choose: the token after the pass's last position.
                self._rows.append((script, int(where[end - 1]) + 1 - prompt_len))
            return hidden

        def compute_logits(self, hidden_states: Any) -> Any:
            logits = super().compute_logits(hidden_states)
            if logits is None:
                return logits
            for row, (script, index) in enumerate(self._rows[: logits.shape[0]]):
                if script:
                    chosen = script[min(max(index, 0), len(script) - 1)]
                    logits[row, chosen] = logits[row].max() + MARGIN
            return logits

    ScriptedForCausalLM.__name__ = ARCHITECTURE
    return ScriptedForCausalLM


def __getattr__(name: str) -> Any:
    # vLLM imports the class by name (`register_model(..., "module:ScriptedForCausalLM")`);
    # building it lazily keeps torch and vLLM out of the harness's imports of this file.
    if name == "ScriptedForCausalLM":
        cls = _build_class()
        globals()[name] = cls
        return cls
    raise AttributeError(name)


def register() -> None:
    """The `vllm.general_plugins` entry point."""
    from vllm import ModelRegistry

    ModelRegistry.register_model(ARCHITECTURE, f"{__name__}:ScriptedForCausalLM")
