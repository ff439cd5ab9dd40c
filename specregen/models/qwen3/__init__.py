"""Qwen3 (hybrid thinking/instruct) as a model format: tokens, prompt, completion, servers.

Self-contained: nothing here imports the Kimi modules or the emulator. `vllm`, `vllm_legacy` and
`sglang` restate what vLLM's (qwen3 + hermes) and SGLang's (qwen3 + qwen25) parsers return
(docs/qwen3.md), on the family-neutral `models/serverkit`; `servers` is their request side.
`corpus`: the fidelity corpus (the answers Qwen3 can write, for the benches).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specregen.models.family import lazy_exports

if TYPE_CHECKING:
    from specregen.models.qwen3.family import MINI_QWEN3_TOKENIZER_DIR
    from specregen.models.qwen3.format import (
        SERVER_TOOL_ID,
        THINKING_SWITCH,
        TOOL_ID_IN_TOKENS,
        Assembled,
        Qwen3,
        RawToolCalls,
        canonical_arguments,
        find_tool_calls,
        is_server_tool_id,
        make_format,
        source_files,
        structure_problems,
    )
    from specregen.models.qwen3.probe import make_probe_rules
    from specregen.models.qwen3.render import (
        TEMPLATE_PATH,
        FormatError,
        last_query_index,
        render_blocks,
        render_prompt_text,
        render_with_template,
        template_text,
        tool_call_text,
        tools_system_text,
    )
    from specregen.models.qwen3.tokens import (
        ADDED_IDS,
        ADDED_TOKENS,
        REQUIRED_TOKENS,
        check_tokenizer,
    )

# Reconstruction reads provider traits: whether the provider counts `<|im_end|>` (reconstruct.py,
# any format) and whether it strips the content beside calls (SGLang does, vLLM does not:
# docs/qwen3.md), both learned by the endpoint probe (`probe.py`), which also refuses a
# tool-call dataset whose calls come back unrecoverable before anything is paid.
READS_PROVIDER_TRAITS = True

# Where each name lives: loading the package (the registry reads its `family` descriptor)
# imports none of the family's code until a name is asked for.
_WHERE = {
    "SERVER_TOOL_ID": "format",
    "THINKING_SWITCH": "format",
    "TOOL_ID_IN_TOKENS": "format",
    "Assembled": "format",
    "Qwen3": "format",
    "RawToolCalls": "format",
    "canonical_arguments": "format",
    "find_tool_calls": "format",
    "is_server_tool_id": "format",
    "make_format": "format",
    "source_files": "format",
    "structure_problems": "format",
    "make_probe_rules": "probe",
    "TEMPLATE_PATH": "render",
    "FormatError": "render",
    "last_query_index": "render",
    "render_blocks": "render",
    "render_prompt_text": "render",
    "render_with_template": "render",
    "template_text": "render",
    "tool_call_text": "render",
    "tools_system_text": "render",
    "ADDED_IDS": "tokens",
    "ADDED_TOKENS": "tokens",
    "MINI_QWEN3_TOKENIZER_DIR": "family",
    "REQUIRED_TOKENS": "tokens",
    "check_tokenizer": "tokens",
}


__getattr__ = lazy_exports(__name__, _WHERE)

__all__ = [
    "ADDED_IDS",
    "ADDED_TOKENS",
    "MINI_QWEN3_TOKENIZER_DIR",
    "READS_PROVIDER_TRAITS",
    "REQUIRED_TOKENS",
    "SERVER_TOOL_ID",
    "TEMPLATE_PATH",
    "THINKING_SWITCH",
    "TOOL_ID_IN_TOKENS",
    "Assembled",
    "FormatError",
    "Qwen3",
    "RawToolCalls",
    "canonical_arguments",
    "check_tokenizer",
    "find_tool_calls",
    "is_server_tool_id",
    "last_query_index",
    "make_format",
    "make_probe_rules",
    "render_blocks",
    "render_prompt_text",
    "render_with_template",
    "source_files",
    "structure_problems",
    "template_text",
    "tool_call_text",
    "tools_system_text",
]
