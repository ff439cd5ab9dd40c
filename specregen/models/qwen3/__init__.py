"""Qwen3 (hybrid thinking/instruct) as a model format: tokens, prompt, completion, servers.

Self-contained: nothing here imports the Kimi modules or the emulator. `vllm`, `vllm_legacy` and
`sglang` restate what vLLM's (qwen3 + hermes) and SGLang's (qwen3 + qwen25) parsers return
(docs/qwen3.md), on the family-neutral `models/serverkit`; `servers` is their request side.
"""

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
    MINI_QWEN3_TOKENIZER_DIR,
    REQUIRED_TOKENS,
    check_tokenizer,
)

# Reconstruction reads provider traits: whether the provider counts `<|im_end|>` (reconstruct.py,
# any format) and whether it strips the content beside calls (SGLang does, vLLM does not:
# docs/qwen3.md), both learned by the endpoint probe (`probe.py`), which also refuses a
# tool-call dataset whose calls come back unrecoverable before anything is paid.
READS_PROVIDER_TRAITS = True

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
