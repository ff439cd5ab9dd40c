"""Qwen3's added-token table and the check that a loaded tokenizer has what the format needs.

Facts from Qwen3's public `tokenizer_config.json` (`added_tokens_decoder`): ids 151643-151668.
`<|im_start|>`, `<|im_end|>` and `<|endoftext|>` are special; `<think>`, `</think>`,
`<tool_call>`, `</tool_call>`, `<tool_response>`, `</tool_response>` are added but NOT special,
so they are matched inside any text (also model-written text) and survive
`skip_special_tokens` when a server detokenizes.
"""

from __future__ import annotations

from specregen.models.tokenizer import Tokenizer, TokenizerError

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ENDOFTEXT = "<|endoftext|>"
THINK = "<think>"
THINK_END = "</think>"
TOOL_CALL = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
TOOL_RESPONSE = "<tool_response>"
TOOL_RESPONSE_END = "</tool_response>"

# (id, content, special)
ADDED_TOKENS: tuple[tuple[int, str, bool], ...] = (
    (151643, ENDOFTEXT, True),
    (151644, IM_START, True),
    (151645, IM_END, True),
    (151646, "<|object_ref_start|>", True),
    (151647, "<|object_ref_end|>", True),
    (151648, "<|box_start|>", True),
    (151649, "<|box_end|>", True),
    (151650, "<|quad_start|>", True),
    (151651, "<|quad_end|>", True),
    (151652, "<|vision_start|>", True),
    (151653, "<|vision_end|>", True),
    (151654, "<|vision_pad|>", True),
    (151655, "<|image_pad|>", True),
    (151656, "<|video_pad|>", True),
    (151657, TOOL_CALL, False),
    (151658, TOOL_CALL_END, False),
    (151659, "<|fim_prefix|>", False),
    (151660, "<|fim_middle|>", False),
    (151661, "<|fim_suffix|>", False),
    (151662, "<|fim_pad|>", False),
    (151663, "<|repo_name|>", False),
    (151664, "<|file_sep|>", False),
    (151665, TOOL_RESPONSE, False),
    (151666, TOOL_RESPONSE_END, False),
    (151667, THINK, False),
    (151668, THINK_END, False),
)
ADDED_IDS: dict[str, int] = {name: token_id for token_id, name, _ in ADDED_TOKENS}

REQUIRED_TOKENS = (IM_START, IM_END, THINK, THINK_END, TOOL_CALL, TOOL_CALL_END, TOOL_RESPONSE,
                   TOOL_RESPONSE_END)
# Markers the model writes inside its own text; `encode_ordinary` must turn them into their id.
TEXT_MARKERS = (THINK, THINK_END, TOOL_CALL, TOOL_CALL_END, TOOL_RESPONSE, TOOL_RESPONSE_END)



def check_tokenizer(tok: Tokenizer) -> dict[str, int]:
    """The ids of the tokens Qwen3 needs, by name; a clear error naming the first one missing
    or encoding wrongly (a Qwen2.5 tokenizer has no `<think>`)."""
    ids: dict[str, int] = {}
    for name in REQUIRED_TOKENS:
        token_id = tok.added_tokens.get(name)
        if token_id is None:
            raise TokenizerError(
                f"tokenizer {tok.name!r} has no added token {name!r}, which Qwen3 needs "
                f"(from {tok.source})")
        if tok.encode_with_specials(name) != [token_id]:
            raise TokenizerError(
                f"tokenizer {tok.name!r}: {name!r} does not encode to its single id {token_id}")
        if name in TEXT_MARKERS and tok.encode_ordinary(name) != [token_id]:
            # Model-written markers are added tokens matched inside text, not special tokens.
            raise TokenizerError(
                f"tokenizer {tok.name!r}: {name!r} is not matched inside ordinary text "
                f"(is it marked special?)")
        ids[name] = token_id
    return ids
