"""The Kimi K2.5 wire format: prompt rendering, completion assembly, raw tool-call markers.

Facts come from ../shared/kimi/SPEC.md (sections 1-2 and 7). The prompt is rendered to text the
way the K2.5 chat template does and tokenized with special tokens allowed, as servers do. The
completion is assembled from the API's fields: model-written text is encoded with special tokens
disallowed and the markers are inserted as ids, so a literal `<|im_end|>` in code stays text.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from specregen.models.chat_format import (
    CallStructure,
    CompletionMarkers,
    FormatError,
    ParsedCalls,
    Reading,
    package_files,
)
from specregen.models.kimi_k25 import checks as kimi_checks
from specregen.models.kimi_k25 import readings as kimi_readings
from specregen.models.kimi_k25.common import (
    ARG_BEGIN,
    CALL_BEGIN,
    CALL_END,
    CANONICAL_ID,
    IM_ASSISTANT,
    IM_END,
    IM_MIDDLE,
    IM_SYSTEM,
    IM_USER,
    SECTION_BEGIN,
    SECTION_END,
    THINK,
    THINK_END,
    TOOL_MARKERS,
    Assembled,
    count_history_tool_calls,
    tojson,
)
from specregen.models.tokenizer import Tokenizer, TokenizerError
from specregen.records import Completion, ProviderTraits, ToolCall
from specregen.wire.response import thinking_from_request

MEDIA_IMAGE = "<|media_begin|>image<|media_content|><|media_pad|><|media_end|>\n"
REQUIRED_TOKENS = (IM_END, IM_USER, IM_ASSISTANT, IM_SYSTEM, IM_MIDDLE, *TOOL_MARKERS, THINK,
                   THINK_END)

DEFAULT_SYSTEM_PROMPT = "You are Kimi, an AI assistant created by Moonshot AI."
# The chat_template_kwargs key that turns thinking on/off where servers render the template
# (vLLM, SGLang): the K2.5 template reads `thinking`.
THINKING_SWITCH = "thinking"
# Reconstruction reads the endpoint probe's findings about the K2.5 parsers (ProviderTraits).
READS_PROVIDER_TRAITS = True

ToolsFormat = Literal["typescript", "json"]

_MARKER_SPLIT = re.compile("(" + "|".join(re.escape(m) for m in TOOL_MARKERS) + ")")


@dataclass(frozen=True)
class RawToolSection:
    """A tool-call section found as raw marker text inside a text field."""

    start: int  # index in the text where `<|tool_calls_section_begin|>` starts
    calls: list[ToolCall]
    complete: bool  # the section end marker was found


def check_tokenizer(tok: Tokenizer) -> dict[str, int]:
    """The ids of the tokens the format needs, by name; a clear error when one is missing."""
    ids: dict[str, int] = {}
    for name in REQUIRED_TOKENS:
        if name not in tok.added_tokens:
            raise TokenizerError(
                f"tokenizer {tok.name!r} has no added token {name!r}, which Kimi K2.5 needs "
                f"(a K2-Instruct tokenizer_config.json lacks <think>/</think>); from {tok.source}"
            )
        token_id = tok.added_tokens[name]
        if tok.encode_with_specials(name) != [token_id]:
            raise TokenizerError(
                f"tokenizer {tok.name!r}: {name!r} does not encode to its single id {token_id}"
            )
        if token_id < tok.base_vocab_size:
            raise TokenizerError(
                f"tokenizer {tok.name!r}: {name!r} has id {token_id}, inside the BPE ranks"
            )
        ids[name] = token_id
    if len(set(ids.values())) != len(ids):
        raise TokenizerError(f"tokenizer {tok.name!r}: two format tokens share one id")
    return ids


# ---------------------------------------------------------------------------------------------
# Prompt rendering (SPEC 2)


def tools_declaration(tools: Sequence[dict[str, Any]], tools_format: ToolsFormat) -> str:
    """The `tool_declare` block body: TypeScript-style, or compact JSON as the fallback."""
    from specregen.models.kimi_k25.tools_ts import (
        ToolDeclarationError,
        deep_sort,
        encode_tools_to_typescript,
    )

    sorted_tools = deep_sort(list(tools))
    if tools_format == "typescript":
        try:
            declaration = encode_tools_to_typescript(sorted_tools)
        except ToolDeclarationError:
            declaration = ""  # the wrapper swallows the error and the template falls back
        if declaration:
            return declaration
    return tojson(sorted_tools, separators=(",", ":"))


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in ("image", "image_url"):
                parts.append(MEDIA_IMAGE)
            elif kind == "text":
                parts.append(part.get("text") or "")
            else:
                raise FormatError(f"content part of type {kind!r} is not supported")
        return "".join(parts)
    raise FormatError(f"message content must be a string or a list, not {type(content).__name__}")


def _header(message: dict[str, Any]) -> str:
    role = message.get("role")
    if not isinstance(role, str):
        raise FormatError(f"message has no string 'role': {str(message)[:80]}")
    name = message.get("name") or role
    if role == "user":
        return f"{IM_USER}{name}{IM_MIDDLE}"
    if role == "assistant":
        return f"{IM_ASSISTANT}{name}{IM_MIDDLE}"
    return f"{IM_SYSTEM}{name}{IM_MIDDLE}"


def _tool_calls_text(calls: Sequence[dict[str, Any]]) -> str:
    out = [SECTION_BEGIN]
    for call in calls:
        fn = call.get("function") or {}
        args = fn.get("arguments")
        args_text = args if isinstance(args, str) else tojson(args)
        # An absent id renders as nothing (Jinja's undefined), not "None".
        call_id = call.get("id")
        out.append(f"{CALL_BEGIN}{'' if call_id is None else call_id}{ARG_BEGIN}{args_text}"
                   f"{CALL_END}")
    out.append(SECTION_END)
    return "".join(out)


def _reasoning_of(message: dict[str, Any]) -> str:
    # The K2.5-era template reads `reasoning`, then `reasoning_content`; None renders as empty
    # (a naive Jinja render would print "None", which no server sends on purpose).
    value = message.get("reasoning")
    if value is None:
        value = message.get("reasoning_content")
    return value or ""


def render_prompt_text(
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None = None,
    *,
    thinking: bool = True,
    tools_format: ToolsFormat = "typescript",
    inject_default_system: bool = True,
    add_generation_prompt: bool = True,
) -> str:
    """The prompt text the K2.5 chat template renders (SPEC 2.1-2.3)."""
    return "".join(
        render_prompt_blocks(
            messages,
            tools,
            thinking=thinking,
            tools_format=tools_format,
            inject_default_system=inject_default_system,
            add_generation_prompt=add_generation_prompt,
        )
    )


def render_prompt_blocks(
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None = None,
    *,
    thinking: bool = True,
    tools_format: ToolsFormat = "typescript",
    inject_default_system: bool = True,
    add_generation_prompt: bool = True,
    declaration: Callable[[Sequence[dict[str, Any]], ToolsFormat], str] | None = None,
) -> list[str]:
    """The prompt as blocks that each start with a role token and end with `<|im_end|>`.

    Special tokens split the text before BPE runs, so encoding block by block gives the ids of
    the whole text; blocks that repeat across a dataset (tools, system) can then be cached.
    """
    blocks: list[str] = []
    if tools:
        body = (declaration or tools_declaration)(tools, tools_format)
        blocks.append(f"{IM_SYSTEM}tool_declare{IM_MIDDLE}{body}{IM_END}")
    if inject_default_system and (not messages or messages[0].get("role") != "system"):
        blocks.append(f"{IM_SYSTEM}system{IM_MIDDLE}{DEFAULT_SYSTEM_PROMPT}{IM_END}")
    last_plain_assistant = -1
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "assistant" and not messages[i].get("tool_calls"):
            last_plain_assistant = i
            break
    for i, message in enumerate(messages):
        out = [_header(message)]
        role = message["role"]
        if role == "assistant":
            in_history = i <= last_plain_assistant
            reasoning = "" if in_history or not thinking else _reasoning_of(message)
            out.append(f"{THINK}{reasoning}{THINK_END}{_content_text(message.get('content'))}")
            if message.get("tool_calls"):
                out.append(_tool_calls_text(message["tool_calls"]))
        elif role == "tool":
            # Servers drop a null `tool_call_id` before rendering: undefined renders empty.
            call_id = message.get("tool_call_id")
            out.append(f"## Return of {'' if call_id is None else call_id}\n")
            out.append(_content_text(message.get("content")))
        elif message.get("content") is not None:
            out.append(_content_text(message.get("content")))
        out.append(IM_END)
        blocks.append("".join(out))
    if add_generation_prompt:
        prefill = THINK if thinking else THINK + THINK_END
        blocks.append(f"{IM_ASSISTANT}assistant{IM_MIDDLE}{prefill}")
    return blocks


# ---------------------------------------------------------------------------------------------
# Raw markers in text (SPEC 3.2, 4.5)


def name_from_tool_id(tool_id: str) -> str:
    """The Kimi docs' rule: the text between the first '.' and the ':' (`functions.NAME:IDX`)."""
    head = tool_id.strip().split(":", 1)[0]
    return head.split(".", 1)[1] if "." in head else head


def find_tool_section(text: str, *, allow_partial: bool = False) -> RawToolSection | None:
    """The first tool-call section in `text` that parses as one, tolerating whitespace.

    Returns None when no `<|tool_calls_section_begin|>` starts a well-formed section (with
    `allow_partial`, a section cut off by truncation also counts).
    """
    # Most text holds no `<` at all: one memchr scan rules a section out (faster than the search
    # for the 28-character marker, most of all in text that is not ASCII).
    start = text.find(SECTION_BEGIN) if "<" in text else -1
    while start != -1:
        section = _parse_section(text[start + len(SECTION_BEGIN) :], allow_partial)
        if section is not None:
            calls, complete = section
            return RawToolSection(start=start, calls=calls, complete=complete)
        start = text.find(SECTION_BEGIN, start + 1)
    return None


def _parse_section(tail: str, allow_partial: bool) -> tuple[list[ToolCall], bool] | None:
    # `parts` alternates text and marker; between calls only whitespace may stand.
    parts = _MARKER_SPLIT.split(tail)
    n = len(parts)
    calls: list[ToolCall] = []
    i = 0
    while True:
        if parts[i].strip():
            return None
        if i + 1 >= n:
            return (calls, False) if allow_partial else None
        marker = parts[i + 1]
        if marker == SECTION_END:
            return (calls, True) if calls else None
        if marker != CALL_BEGIN:
            return None
        got = parts[i + 2 : i + 6]  # id, ARG_BEGIN, arguments, CALL_END
        if len(got) == 4 and got[1] == ARG_BEGIN and got[3] == CALL_END:
            calls.append(_raw_call(got[0], got[2]))
            i += 6
            continue
        # An unfinished call is acceptable only as the very end of a truncated text.
        cut_in_id = len(got) == 1
        cut_in_args = len(got) == 3 and got[1] == ARG_BEGIN
        if allow_partial and (cut_in_id or cut_in_args):
            calls.append(_raw_call(got[0], got[2] if cut_in_args else ""))
            return calls, False
        return None


def _raw_call(raw_id: str, raw_args: str) -> ToolCall:
    # Parsers trim here; the ids keep the raw text, the comparable call is the trimmed one.
    return ToolCall(raw_id.strip(), name_from_tool_id(raw_id), raw_args.strip())


def has_marker_text(text: str | None) -> bool:
    # Every tool marker contains "<|tool_call": a scan for `<` (memchr), then for that substring,
    # rules out the common case.
    if not text:
        return False
    return "<" in text and "<|tool_call" in text and any(m in text for m in TOOL_MARKERS)


def resolve_tool_id(tool_id: str | None, name: str, index: int) -> tuple[str, bool]:
    """Verbatim when it has the `functions.NAME:IDX` form, else rebuilt (and say so)."""
    if tool_id and CANONICAL_ID.match(tool_id):
        return tool_id, False
    return f"functions.{name}:{index}", True


# ---------------------------------------------------------------------------------------------
# The format object: a tokenizer with the ids it needs, and the two encoders


_BLOCKWISE_MAX_CHARS = 25_000
# The generation prompt ends every prompt, one of two texts: its ids are cached with the
# system blocks instead of being split and encoded for each sample.
_GENERATION_PROMPTS = frozenset(
    f"{IM_ASSISTANT}assistant{IM_MIDDLE}{prefill}" for prefill in (THINK, THINK + THINK_END))
_CACHE_SIZE = 256
# The declaration cache's key: `json.dumps(tools, sort_keys=True, ensure_ascii=False)`, with the
# encoder built once instead of per call.
_TOOLS_KEY = json.JSONEncoder(ensure_ascii=False, sort_keys=True)


def _memo_encoder(
    encode: Callable[[str], list[int]], memo: dict[str, list[int]]
) -> Callable[[str], list[int]]:
    # Callers only extend from the returned list, so it is shared, not copied.
    def enc(text: str) -> list[int]:
        ids = memo.get(text)
        if ids is None:
            ids = memo[text] = encode(text)
        return ids

    return enc


def _lru(cache: OrderedDict, key: str, make: Callable[[], Any]) -> Any:
    value = cache.get(key)
    if value is None:
        value = make()
        cache[key] = value
        if len(cache) > _CACHE_SIZE:
            cache.popitem(last=False)
    else:
        cache.move_to_end(key)
    return value


class KimiK25:
    """Kimi K2.5 prompt and completion encoding over a loaded tokenizer (a `ChatFormat`)."""

    name = "kimi-k2.5"
    thinking_switch = THINKING_SWITCH
    default_system_prompt: str | None = DEFAULT_SYSTEM_PROMPT
    # `R </think> C <|tool_calls_section_begin|> (call-begin ID arg-begin ARGS call-end)*
    # <|tool_calls_section_end|> <|im_end|>`; markers and think tags written as text are flagged.
    markers = CompletionMarkers(
        reasoning_end=THINK_END, calls_begin=SECTION_BEGIN, call_begin=CALL_BEGIN,
        arguments_begin=ARG_BEGIN, call_end=CALL_END, calls_end=SECTION_END, end=IM_END,
        literals=(*TOOL_MARKERS, THINK, THINK_END))

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        tools_format: ToolsFormat = "typescript",
        inject_default_system: bool = True,
        use_hf_chat_template: bool = False,
    ) -> None:
        self.tok = tokenizer
        self.ids = check_tokenizer(tokenizer)
        self.tools_format = tools_format
        self.inject_default_system = inject_default_system
        self.use_hf_chat_template = use_hf_chat_template and tokenizer.chat_template is not None
        self._marker_ids = {m: self.ids[m] for m in TOOL_MARKERS}
        # A dataset repeats its tools and system prompt in every sample: render and encode
        # those blocks once. Bounded, so a dataset of all-different tools cannot grow them.
        self._declarations: OrderedDict[str, str] = OrderedDict()
        self._block_ids: OrderedDict[str, list[int]] = OrderedDict()

    # -- ChatFormat -----------------------------------------------------------------------

    @property
    def stop_id(self) -> int:
        return self.ids[IM_END]

    @property
    def source_files(self) -> tuple[Path, ...]:
        return source_files()

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "tools_format": self.tools_format,
                "hf_chat_template": self.use_hf_chat_template}

    def thinking_requested(self, request: dict[str, Any]) -> bool | None:
        return thinking_from_request(request, self.thinking_switch)

    def history_tool_calls(self, messages: Sequence[dict[str, Any]]) -> int:
        return count_history_tool_calls(messages)

    def undo_id_rewrites(self, calls: list[ToolCall], history: int, traits: ProviderTraits,
                         streamed: bool, flags: list[str]) -> list[ToolCall]:
        return kimi_readings.undo_id_rewrites(calls, history, traits, streamed, flags)

    def readings(self, request: dict[str, Any], completion: Completion, calls: list[ToolCall],
                 thinking: bool, truncated: bool, history: int,
                 traits: ProviderTraits) -> list[Reading]:
        return kimi_readings.readings(self, request, completion, calls, thinking, truncated,
                                      history, traits)

    def prompt_variants(self, messages: list[dict[str, Any]],
                        tools: list[dict[str, Any]] | None, thinking: bool,
                        traits: ProviderTraits, request: dict[str, Any] | None = None
                        ) -> list[list[int]]:
        return kimi_readings.prompt_variants(self, messages, tools, thinking, traits)

    def history_message(self, completion: Completion, *, thinking: bool) -> dict[str, Any]:
        """The answer as a history turn. With thinking on, K2.5 servers refuse an assistant
        tool-call turn without its `reasoning_content`, so it is always sent then (the template
        itself drops reasoning before the last plain answer). Calls a provider left as raw
        markers (in content, or in the reasoning when the model opened them before
        `</think>`) become structured calls with the ids the model wrote."""
        from specregen.models.chat_format import assistant_history_message

        content, reasoning, calls = completion.content, completion.reasoning, completion.tool_calls
        if not calls:
            for field_name in ("content", "reasoning"):
                text = content if field_name == "content" else reasoning
                section = find_tool_section(text or "")
                if section is not None:
                    calls = section.calls
                    if field_name == "content":
                        content = (content or "")[: section.start]
                    else:
                        reasoning = (reasoning or "")[: section.start]
                    break
        return assistant_history_message(content, reasoning, calls, thinking=thinking)

    def template_text(self) -> str:
        """Our K2.5 Jinja template (written from the format's spec)."""
        return (Path(__file__).resolve().parent / "chat_template.jinja").read_text(
            encoding="utf-8")

    def trainer_render(self, conversation: Sequence[dict[str, Any]],
                       tools: Sequence[dict[str, Any]] | None, *, thinking: bool,
                       template: str) -> str:
        """A whole conversation rendered through `template` the way a re-tokenizing trainer
        does (no generation prompt), with the K2.5 wrapper's kwargs."""
        from transformers.utils.chat_template_utils import render_jinja_template

        from specregen.models.kimi_k25.tools_ts import deep_sort

        # transformers annotates render_jinja_template `-> str`; it returns
        # (rendered, generation indices).
        rendered, _ = render_jinja_template(  # type: ignore[str-unpack]
            conversations=[list(conversation)],
            tools=deep_sort(list(tools)) if tools else None,
            chat_template=template,
            add_generation_prompt=False,
            thinking=thinking,
            tools_ts_str=tools_declaration(tools, "typescript") if tools else None,
        )
        return rendered[0]

    # -- ChatFormat: the gate's rules ------------------------------------------------------

    tool_id_in_tokens = True  # the model writes `functions.NAME:IDX` itself
    calls_open = SECTION_BEGIN

    def call_structure(self, ids: Sequence[int], *, n_calls: int, thinking: bool,
                       truncated: bool) -> CallStructure:
        return kimi_checks.call_structure(ids, self.ids, self.tok.base_vocab_size,
                                          n_calls=n_calls, thinking=thinking,
                                          truncated=truncated)

    def parse_tool_calls(self, text: str, *, truncated: bool) -> ParsedCalls | None:
        section = find_tool_section(text, allow_partial=truncated)
        return None if section is None else ParsedCalls(section.start, section.calls)

    def comparable_arguments(self, arguments: str) -> str:
        # The client parsers trim the argument text; the ids keep it whole.
        return arguments.strip()

    def tool_id_problems(self, calls: Sequence[ToolCall],
                         messages: list[dict[str, Any]] | None) -> list[str]:
        return kimi_checks.tool_id_problems(calls, messages)

    def find_marker_text(self, text: str | None) -> str | None:
        return kimi_checks.find_marker_text(text)

    # -- prompt ---------------------------------------------------------------------------

    def render_prompt(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None = None,
        *,
        thinking: bool = True,
    ) -> str:
        if self.use_hf_chat_template:
            return self._render_with_hf_template(messages, tools, thinking)
        return "".join(self._blocks(messages, tools, thinking))

    def encode_prompt(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None = None,
        *,
        thinking: bool = True,
    ) -> list[int]:
        if self.use_hf_chat_template:
            return self.tok.encode_with_specials(self._render_with_hf_template(messages, tools,
                                                                               thinking))
        return self._encode_blocks(self._blocks(messages, tools, thinking), None)

    def encode_prompts(
        self,
        candidates: Sequence[Sequence[dict[str, Any]]],
        tools: Sequence[dict[str, Any]] | None,
        *,
        thinking: bool,
    ) -> list[list[int]]:
        """`encode_prompt` of each message list, sharing the work: the candidates are one
        conversation rendered several ways, so most blocks repeat and are encoded once."""
        if self.use_hf_chat_template or len(candidates) == 1:
            return [self.encode_prompt(c, tools, thinking=thinking) for c in candidates]
        declared: dict[ToolsFormat, str] = {}

        def declaration(tools: Sequence[dict[str, Any]], tools_format: ToolsFormat) -> str:
            # One `tools` list for every candidate: its declaration is built once.
            if tools_format not in declared:
                declared[tools_format] = self._cached_declaration(tools, tools_format)
            return declared[tools_format]

        memo: dict[str, list[int]] = {}
        return [self._encode_blocks(self._blocks(c, tools, thinking, declaration), memo)
                for c in candidates]

    def _encode_blocks(self, blocks: list[str], memo: dict[str, list[int]] | None) -> list[int]:
        """The ids of the blocks' text; `memo` holds the ids of blocks already encoded (the
        same text always gives the same ids)."""
        if sum(map(len, blocks)) > _BLOCKWISE_MAX_CHARS:
            # Kimi's encode() cuts very long texts at positions of the whole text.
            text = "".join(blocks)
            if memo is None:
                return self.tok.encode_with_specials(text)
            if text not in memo:
                memo[text] = self.tok.encode_with_specials(text)
            return list(memo[text])
        ids: list[int] = []
        for block in blocks:
            if block.startswith(IM_SYSTEM) or (
                    block.startswith(IM_ASSISTANT) and block in _GENERATION_PROMPTS):
                ids.extend(self._cached_block_ids(block))
            elif memo is None:
                ids.extend(self.tok.encode_with_specials(block))
            else:
                block_ids = memo.get(block)
                if block_ids is None:
                    block_ids = memo[block] = self.tok.encode_with_specials(block)
                ids.extend(block_ids)
        return ids

    def _blocks(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None,
        thinking: bool,
        declaration: Callable[[Sequence[dict[str, Any]], ToolsFormat], str] | None = None,
    ) -> list[str]:
        return render_prompt_blocks(
            messages,
            tools,
            thinking=thinking,
            tools_format=self.tools_format,
            inject_default_system=self.inject_default_system,
            declaration=declaration or self._cached_declaration,
        )

    def _cached_declaration(
        self, tools: Sequence[dict[str, Any]], tools_format: ToolsFormat
    ) -> str:
        key = _TOOLS_KEY.encode(tools) + tools_format
        return _lru(self._declarations, key, lambda: tools_declaration(tools, tools_format))

    def _cached_block_ids(self, block: str) -> list[int]:
        ids = self._block_ids.get(block)
        if ids is None:  # (the common hit without building `_lru`'s closure)
            return _lru(self._block_ids, block, lambda: self.tok.encode_with_specials(block))
        self._block_ids.move_to_end(block)
        return ids

    def _render_with_hf_template(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None,
        thinking: bool,
    ) -> str:
        # The model folder's own template, rendered the way transformers' apply_chat_template
        # does (its sandboxed Jinja environment and tojson), with the K2.5 wrapper's kwargs.
        from transformers.utils.chat_template_utils import render_jinja_template

        from specregen.models.kimi_k25.tools_ts import deep_sort

        tools_ts = tools_declaration(tools, "typescript") if tools else None
        # transformers annotates render_jinja_template `-> str`; it returns
        # (rendered, generation indices).
        rendered, _ = render_jinja_template(  # type: ignore[str-unpack]
            conversations=[list(messages)],
            tools=deep_sort(list(tools)) if tools else None,
            chat_template=self.tok.chat_template,
            add_generation_prompt=True,
            thinking=thinking,
            tools_ts_str=tools_ts,
        )
        return rendered[0]

    # -- completion -----------------------------------------------------------------------

    def encode_raw_text(self, text: str,
                        enc: Callable[[str], list[int]] | None = None) -> list[int]:
        """Text in which tool-call marker strings are markers and all else is model text."""
        enc = enc or self.tok.encode_ordinary
        ids: list[int] = []
        for i, piece in enumerate(_MARKER_SPLIT.split(text)):
            if i % 2:
                ids.append(self._marker_ids[piece])
            elif piece:
                ids.extend(enc(piece))
        return ids

    def encode_tool_calls(self, calls: Sequence[ToolCall],
                          enc: Callable[[str], list[int]] | None = None) -> list[int]:
        ids = [self._marker_ids[SECTION_BEGIN]]
        enc = enc or self.tok.encode_ordinary
        for call in calls:
            ids.append(self._marker_ids[CALL_BEGIN])
            ids.extend(enc(call.id))
            ids.append(self._marker_ids[ARG_BEGIN])
            ids.extend(enc(call.arguments))
            ids.append(self._marker_ids[CALL_END])
        ids.append(self._marker_ids[SECTION_END])
        return ids

    def assemble(
        self,
        reasoning: str | None,
        content: str | None,
        tool_calls: Sequence[ToolCall],
        *,
        thinking: bool,
        truncated: bool,
        first_tool_index: int = 0,
        think_end: bool = True,
        verbatim_ids: bool = False,
        encoded: dict[str, list[int]] | None = None,
    ) -> Assembled:
        """Completion ids from API fields (SPEC 7.2): `R </think> C [section] <|im_end|>`.

        Raw marker text left in `content` (or in `reasoning`, when the model opened the tool
        section before closing its thinking) is parsed and kept verbatim, whitespace included.
        `think_end=False` is the reading in which the model never wrote `</think>` (it opened
        the tool section, or ended, while still reasoning) although the API split it off;
        `verbatim_ids=True` keeps structured ids as given (a reading of what the model wrote).
        `encoded` memoizes model text already encoded: the readings of one answer share most
        of their text (the same text always gives the same ids).
        """
        flags: list[str] = []
        enc = self.tok.encode_ordinary if encoded is None else _memo_encoder(
            self.tok.encode_ordinary, encoded)
        reasoning_text = reasoning or ""
        content_text = content or ""
        calls = list(tool_calls)
        raw_tail: str | None = None
        section_in_reasoning = False

        if not calls:
            section = find_tool_section(content_text, allow_partial=truncated)
            if section is not None:
                raw_tail = content_text[section.start :]
                content_text = content_text[: section.start]
                calls = section.calls
                flags.append("tool_calls_in_content")
            elif thinking:
                section = find_tool_section(reasoning_text, allow_partial=truncated)
                if section is not None:
                    raw_tail = reasoning_text[section.start :]
                    reasoning_text = reasoning_text[: section.start]
                    calls = section.calls
                    section_in_reasoning = True
                    flags.append("tool_calls_in_reasoning")
            if raw_tail is not None:
                calls = self._rename_raw_calls(calls, first_tool_index, flags)

        api_calls = list(calls)
        ids: list[int] = []
        if thinking:
            ids.extend(enc(reasoning_text))
            # A completion cut off while still reasoning never emitted `</think>`; neither did
            # one whose tool section sits inside the reasoning.
            cut_in_reasoning = truncated and not content_text and not calls and raw_tail is None
            if think_end and not (cut_in_reasoning or section_in_reasoning):
                ids.append(self.ids[THINK_END])
        ids.extend(enc(content_text))
        if raw_tail is not None:
            ids.extend(self.encode_raw_text(raw_tail, enc))
        elif calls and verbatim_ids:
            calls = self._rename_raw_calls(calls, first_tool_index, flags)
            ids.extend(self.encode_tool_calls(calls, enc))
        elif calls:
            calls = self._resolve_structured_ids(calls, first_tool_index, flags)
            ids.extend(self.encode_tool_calls(calls, enc))
        if not truncated:
            ids.append(self.ids[IM_END])

        if (
            has_marker_text(content_text)
            or has_marker_text(reasoning_text)
            or any(has_marker_text(c.arguments) or has_marker_text(c.id) for c in api_calls)
        ):
            flags.append("markers_in_text")
        if "<" in content_text and (THINK in content_text or THINK_END in content_text):
            flags.append("think_tag_in_text")
        return Assembled(
            ids=ids,
            reasoning=reasoning_text if reasoning is not None else None,
            content=content_text if content is not None else None,
            tool_calls=calls,
            api_tool_calls=api_calls,
            flags=flags,
        )

    @staticmethod
    def _resolve_structured_ids(
        calls: Sequence[ToolCall], first_index: int, flags: list[str]
    ) -> list[ToolCall]:
        out = []
        rewritten = False
        for k, call in enumerate(calls):
            new_id, changed = resolve_tool_id(call.id, call.name, first_index + k)
            rewritten |= changed
            # An id kept as it is keeps its (frozen) call: no copy equal to it in every field.
            out.append(call if not changed and type(call) is ToolCall
                       else ToolCall(new_id, call.name, call.arguments))
        if rewritten:
            flags.append("tool_id_rewritten")
        if any(name_from_tool_id(c.id) != c.name for c in out):
            # The id the model wrote names another function than the call the API parsed.
            flags.append("tool_id_name_mismatch")
        return out

    @staticmethod
    def _rename_raw_calls(
        calls: Sequence[ToolCall], first_index: int, flags: list[str]
    ) -> list[ToolCall]:
        # Raw ids are what the model wrote; they stay in the ids whatever their form, but a
        # non-canonical one is worth a flag for the gate.
        if any(not CANONICAL_ID.match(c.id) for c in calls):
            flags.append("tool_id_noncanonical")
        return list(calls)


def make_format(tokenizer: Tokenizer, **options: Any) -> KimiK25:
    """The registry's constructor (`specregen.models.registry`)."""
    return KimiK25(tokenizer, **options)


def source_files() -> tuple[Path, ...]:
    """The files whose text decides the ids this format builds (the reconstruct fingerprint)."""
    return package_files(Path(__file__).resolve().parent, exclude=NOT_RECONSTRUCTION)


# The emulator's served side, the fidelity corpus and the real-vLLM folder's files:
# reconstruction never imports them (test_format_fingerprint_files).
NOT_RECONSTRUCTION = frozenset({"served.py", "servers.py", "serverside.py", "corpus.py",
                                "realvllm.py", "hf_tokenizer.py"})
