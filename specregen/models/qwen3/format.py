"""Qwen3 prompt encoding, completion assembly, the raw tool-call parser and the id policy.

A Qwen3 completion, as the model writes it (hybrid Qwen3, thinking on):

    <think>\\nREASONING\\n</think>\\n\\nCONTENT\\n
    <tool_call>\\n{"name": "N", "arguments": A}\\n</tool_call><|im_end|>      (one line)

With `enable_thinking: false` the prompt already ends in an empty think block and the model
starts with CONTENT. Every marker is an added token matched inside text, so model-written text
(markers included) is encoded with `encode_ordinary` in one go and only `<|im_end|>` is appended
as an id; a literal `<|im_end|>` in the text stays text (it is special).

Tool-call ids: Qwen3 never writes one. Servers make them up (vLLM `chatcmpl-tool-<32 hex>`,
OpenAI-style `call_...`), so they are not in the token stream and reconstruction ignores them;
history `tool_call_id`s are not rendered by the template either.

Arguments: vLLM's hermes parser (non-streaming) returns `json.dumps(arguments,
ensure_ascii=False)` of the parsed call, so the model's own spacing is lost. The template shows
the model `tojson` output (the same `json.dumps` defaults), so that is what the model writes in
the common case and what reconstruction rebuilds; `arguments_canonical_assumed` says so on every
re-serialised call. A streamed call's arguments are the model's own text (vLLM), kept
verbatim -- unless they are `json.dumps` with ASCII escapes of non-ASCII text (SGLang's stream):
then the canonical form is assumed as for a re-dumped call.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specregen.models.chat_format import (
    CallStructure,
    CompletionMarkers,
    FormatError,
    ParsedCalls,
    Reading,
    package_files,
    whole_calls,
)
from specregen.models.qwen3.render import (
    render_blocks,
    render_with_template,
    template_text,
    tool_call_text,
)
from specregen.models.qwen3.servers import RequestError, server_messages
from specregen.models.qwen3.tokens import (
    IM_END,
    IM_START,
    TEXT_MARKERS,
    THINK,
    THINK_END,
    TOOL_CALL,
    TOOL_CALL_END,
    TOOL_RESPONSE,
    TOOL_RESPONSE_END,
    check_tokenizer,
)
from specregen.models.tokenizer import Tokenizer
from specregen.records import Completion, ProviderTraits, ToolCall
from specregen.wire.response import reasoning_excluded, thinking_from_request

# Qwen3's provider trait (`ProviderTraits.get`; its vote rule: probe.py): the text before the
# tool calls comes back stripped of its whitespace (SGLang's qwen25 detector, non-streamed);
# False: returned as written (vLLM's hermes).
STRIPS_CONTENT_BESIDE_CALLS = "strips_content_beside_calls"

# What servers put in `id`; never model-written. vLLM: `chatcmpl-tool-` + hex (0.32: the low 64
# bits of a uuid4, 16 digits; earlier: the whole uuid4, 32); OpenAI-compatible routers: `call_` +
# alphanumerics.
SERVER_TOOL_ID = re.compile(r"^(?:chatcmpl-tool-[0-9a-f]{16,32}|call_[0-9A-Za-z_-]+)$")
TOOL_ID_IN_TOKENS = False
# The chat_template_kwargs key that turns thinking on/off (vLLM, SGLang): `enable_thinking`.
THINKING_SWITCH = "enable_thinking"

# vLLM hermes: each call is the JSON between the tags, or from an unclosed tag to the end.
_CALL_BLOCK = re.compile(re.escape(TOOL_CALL) + "(.*?)" + re.escape(TOOL_CALL_END) + "|"
                         + re.escape(TOOL_CALL) + "(.*)", re.DOTALL)


@dataclass(frozen=True)
class RawToolCalls:
    """Tool calls found as raw `<tool_call>` text inside a text field."""

    start: int  # index of the first `<tool_call>`
    calls: list[ToolCall]  # id "" (the model writes none), arguments re-dumped like vLLM
    complete: bool  # every block was closed and parsed


@dataclass
class Assembled:
    """A completion rebuilt as ids, with what it was built from and what was noticed (the same
    shape as the Kimi format's)."""

    ids: list[int]
    reasoning: str | None
    content: str | None
    tool_calls: list[ToolCall]
    api_tool_calls: list[ToolCall]
    flags: list[str] = field(default_factory=list)
    text: str = ""  # the model-written text the ids encode (without `<|im_end|>`)


def _call_json(block: str) -> tuple[str, Any] | None:
    try:
        value = json.loads(block)
        return value["name"], value["arguments"]
    except (ValueError, KeyError, TypeError):
        return None


def find_tool_calls(text: str, *, allow_partial: bool = False) -> RawToolCalls | None:
    """The `<tool_call>` blocks in `text`, parsed the way vLLM's hermes parser does (all of
    them must parse, else none count). With `allow_partial`, an unclosed last block that does
    not parse (a truncated answer) is left out and the result is marked incomplete."""
    start = text.find(TOOL_CALL)
    if start == -1:
        return None
    matches = list(_CALL_BLOCK.finditer(text))
    calls: list[ToolCall] = []
    complete = True
    for k, match in enumerate(matches):
        closed = match.group(1) is not None
        parsed = _call_json(match.group(1) if closed else match.group(2))
        if parsed is None:
            if allow_partial and not closed and k == len(matches) - 1:
                complete = False
                break
            return None
        if not closed:
            complete = False
        name, args = parsed
        calls.append(ToolCall("", str(name), json.dumps(args, ensure_ascii=False)))
    return RawToolCalls(start, calls, complete)


def canonical_arguments(arguments: str) -> tuple[str, bool]:
    """(the arguments text the model most likely wrote, whether `arguments` already is the
    `json.dumps` form). Non-JSON text is returned as it is."""
    try:
        canonical = json.dumps(json.loads(arguments), ensure_ascii=False)
    except ValueError:
        return arguments, False
    return canonical, canonical == arguments


def ascii_escaped_dump(arguments: str) -> bool:
    """Whether `arguments` is `json.dumps` with its default ASCII escapes of a value that has
    non-ASCII characters (what SGLang's stream sends), i.e. not what Qwen3 writes."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return False
    return arguments == json.dumps(value) != json.dumps(value, ensure_ascii=False)


def is_server_tool_id(tool_id: str | None) -> bool:
    if not tool_id:
        return False
    return SERVER_TOOL_ID.match(tool_id) is not None


_CACHE_SIZE = 256


class Qwen3:
    """Qwen3 prompt and completion encoding over a loaded Hugging Face tokenizer (a
    `ChatFormat`)."""

    name = "qwen3"
    thinking_switch = THINKING_SWITCH
    default_system_prompt = None  # the template injects none
    # `<think>\nR\n</think>\n\nC (<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>)*
    # <|im_end|>`: no section and no ids, a call's body is one JSON object.
    markers = CompletionMarkers(
        reasoning_end=THINK_END, calls_begin=TOOL_CALL, call_begin=TOOL_CALL,
        call_end=TOOL_CALL_END, end=IM_END, literals=TEXT_MARKERS)
    # Every server docs/qwen3.md restates streams a call as hermes reads it (name, then
    # argument pieces) and sends content only before the first `<tool_call>` (vLLM's
    # `extract_tool_calls_streaming`); there is no probe to say it per provider, so the format
    # says it (`chat_format.streams_calls_as_parsed`): the client's record of the stream's order
    # places the content. SGLang's qwen25 detector streams the same way (older versions also
    # send a "\n" after a call as content: read back in `_layout`). A call sent whole (SGLang
    # versions that stream whole blocks) leaves no record (wire/response.py), so that order still
    # proves nothing.
    calls_streamed_as_parsed = True

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tok = tokenizer
        self.ids = check_tokenizer(tokenizer)
        self.im_end = self.ids[IM_END]
        # The system turn (tools + system prompt) repeats across a dataset: encode it once.
        self._block_ids: OrderedDict[str, list[int]] = OrderedDict()

    # -- ChatFormat -----------------------------------------------------------------------

    @property
    def stop_id(self) -> int:
        return self.im_end

    @property
    def source_files(self) -> tuple[Path, ...]:
        return source_files()

    def describe(self) -> dict[str, Any]:
        return {"name": self.name}

    def thinking_requested(self, request: dict[str, Any]) -> bool | None:
        return thinking_from_request(request, self.thinking_switch)

    def history_tool_calls(self, messages: Sequence[dict[str, Any]]) -> int:
        return sum(len(m.get("tool_calls") or []) for m in messages
                   if isinstance(m, dict) and m.get("role") == "assistant")

    def undo_id_rewrites(self, calls: list[ToolCall], history: int, traits: ProviderTraits,
                         streamed: bool, flags: list[str]) -> list[ToolCall]:
        # Ids are the server's invention, never in the tokens: nothing to undo.
        return calls

    def readings(self, request: dict[str, Any], completion: Completion, calls: list[ToolCall],
                 thinking: bool, truncated: bool, history: int,
                 traits: ProviderTraits) -> list[Reading]:
        """One reading: vLLM's qwen3 + hermes parsers keep all text but the separators the
        assembly restores (flagged), and re-dump non-streamed arguments (canonical assumed).
        A non-streamed answer with thinking off and no calls gets a second one, so that a
        count it does not fit is ambiguous (a head dropped before a `<think>`, see below).

        A think block returned inside the content (vLLM's stream after a prompt whose last
        think block is closed -- every later answer of a tool loop -- or a server without a
        reasoning parser) is read as the reasoning (`reasoning_unsplit`) when that gives the
        same text: the ids are the same either way, but the fields and flags then say what the
        model wrote (a reasoning block, not a missing reasoning and literal think tags)."""
        verbatim = request.get("stream") is True
        reasoning = completion.reasoning if thinking else None
        # The probe's finding: whether the provider strips the text beside calls (SGLang's
        # qwen25, non-streamed) or returns it as written (vLLM's hermes).
        stripped = traits.get(STRIPS_CONTENT_BESIDE_CALLS)
        if stripped is None and calls and all(
                (c.id or "").startswith("chatcmpl-tool-") for c in calls):
            # Ids only vLLM makes (`make_tool_call_id`; SGLang's are `call_...`): its hermes
            # parser returns the text before the calls as the model wrote it, never stripped.
            stripped = False
        # Content the stream sent after a call's first delta (the client's note): only that
        # can be the newlines an older SGLang detector leaks (`_layout`).
        at = completion.content_at_calls
        leaks = not (at and at[0] >= len(completion.content or ""))
        layout = self._layout(reasoning, completion.content, calls, thinking=thinking,
                              truncated=truncated, arguments_verbatim=verbatim,
                              content_stripped=stripped, leaks_possible=leaks)
        flags: list[str] = []
        found = (_think_block_in_content(completion.content)
                 if thinking and completion.reasoning is None else None)
        if found is not None:
            split = self._layout(*found, calls, thinking=thinking, truncated=truncated,
                                 arguments_verbatim=verbatim, content_stripped=stripped,
                                 leaks_possible=leaks)
            if split.text == layout.text:
                layout = split
                flags.append("reasoning_unsplit")
        assembled = self._encode(layout, truncated)
        if thinking and (assembled.reasoning is None
                         or (reasoning_excluded(request) and not found)):
            flags.append("reasoning_missing")
        if not thinking and completion.reasoning:
            # The server thought although the request said not to: not what the ids show.
            flags.append("thinking_mode_mismatch")
        if truncated and (completion.content or completion.reasoning or "").endswith("\ufffd"):
            # SGLang's detokenizer sends a character cut by `max_tokens` as U+FFFD at the end
            # (the finishing step is not held back): the bytes the model wrote are unknown.
            flags.append("truncated_tail_unknown")
        if completion.finish_reason == "tool_calls" and not assembled.tool_calls:
            flags.append("finish_reason_mismatch")
        elif completion.finish_reason == "content_filter":
            flags.append("content_filter")
        if "tool_call_in_reasoning" in assembled.flags:
            flags.append("tool_calls_in_reasoning")
        content = completion.content or ""
        if (reasoning is not None and not calls and content.startswith(TOOL_CALL)
                and THINK_END not in content):
            # Text after the reasoning that opens with an unparsed `<tool_call>`: the model
            # wrote `</think>` right before the tag, or the tag inside its reasoning and the
            # server ended the reasoning there -- vLLM 0.32's engine on both paths, then
            # dropping the `</think>` the model wrote later (docs/vllm-0.32.md 2.3); SGLang's
            # stream, then dropping a `</tool_call>` (the qwen25 detector deletes it from
            # normal text) -- at a place no field shows. The count cannot tell them apart.
            flags.append("reading_ambiguous")
        first = Reading(thinking=thinking, assembled=assembled, flags=[*assembled.flags, *flags])
        out = [first]
        if not thinking and not verbatim and not calls:
            # vLLM's qwen3 reasoning parser drops everything up to a `<think>` even with
            # thinking off (`extract_reasoning`, no `</think>` after it): the text may have
            # lost a head no field shows. A reading with a head in front (`<think>\n`, two
            # tokens: never a rival when ours fits, even with the stop token's counting
            # unknown) makes any count ours does not fit ambiguous, not a tolerated resplit.
            alt = self._respelled(assembled, THINK + "\n" + assembled.text,
                                  assembled.tool_calls, truncated)
            out.append(Reading(thinking=thinking, assembled=alt,
                               flags=[*first.flags, "reading_ambiguous"]))
        return out

    def _respelled(self, base: Assembled, text: str, calls: Sequence[ToolCall],
                   truncated: bool) -> Assembled:
        """`base` with another model-written text (a second reading of the same fields)."""
        alt = Assembled(ids=[], reasoning=base.reasoning, content=base.content,
                        tool_calls=list(calls), api_tool_calls=base.api_tool_calls,
                        flags=list(base.flags), text=text)
        return self._encode(alt, truncated)

    def prompt_variants(self, messages: list[dict[str, Any]],
                        tools: list[dict[str, Any]] | None, thinking: bool,
                        traits: ProviderTraits, request: dict[str, Any] | None = None
                        ) -> list[list[int]]:
        """The server's view first (vLLM re-dumps history arguments and joins text parts),
        then the messages as sent; `usage` picks."""
        try:
            served = server_messages(messages)
        except RequestError as exc:
            raise FormatError(str(exc)) from exc
        variants: list[list[int]] = []
        for candidate in (served, messages):
            ids = self.encode_prompt(candidate, tools, thinking=thinking)
            if ids not in variants:
                variants.append(ids)
        return variants

    def history_message(self, completion: Completion, *, thinking: bool) -> dict[str, Any]:
        """The answer as a history turn: `reasoning_content` when thinking (the template keeps
        reasoning only after the last user query and drops it before). Calls left as raw
        `<tool_call>` text in content become structured calls; the model writes no ids, so a
        call without one gets `call_{i}` (the template renders no ids; results need one).

        With calls, the content loses its newlines at both ends: vLLM returns the separators
        the model wrote around it ("\n\nLet me check.\n"), and the template writes them back
        itself (after `</think>`, before `<tool_call>`); kept, they would render twice."""
        from specregen.models.chat_format import assistant_history_message

        content, calls = completion.content, completion.tool_calls
        if not calls and content:
            raw = find_tool_calls(content)
            if raw is not None and raw.complete:
                calls, content = raw.calls, content[: raw.start]
        if calls and content:
            content = content.strip("\n")
        calls = [c if c.id else ToolCall(f"call_{i}", c.name, c.arguments)
                 for i, c in enumerate(calls)]
        return assistant_history_message(content, completion.reasoning, calls,
                                         thinking=thinking)

    # -- prompt ---------------------------------------------------------------------------

    def render_prompt(self, messages: Sequence[dict[str, Any]],
                      tools: Sequence[Any] | None = None, *, thinking: bool = True) -> str:
        return "".join(render_blocks(messages, tools, enable_thinking=thinking))

    def encode_prompt(self, messages: Sequence[dict[str, Any]],
                      tools: Sequence[Any] | None = None, *, thinking: bool = True) -> list[int]:
        # Every block starts with `<|im_start|>`, an added token: the tokenizer splits there
        # before BPE, so block-wise ids equal whole-text ids.
        ids: list[int] = []
        for block in render_blocks(messages, tools, enable_thinking=thinking):
            if block.startswith(f"{IM_START}system\n"):
                ids.extend(self._cached(block))
            else:
                ids.extend(self.tok.encode_with_specials(block))
        return ids

    def _cached(self, block: str) -> list[int]:
        ids = self._block_ids.get(block)
        if ids is None:
            ids = self._block_ids[block] = self.tok.encode_with_specials(block)
            if len(self._block_ids) > _CACHE_SIZE:
                self._block_ids.popitem(last=False)
        else:
            self._block_ids.move_to_end(block)
        return ids

    # -- completion -----------------------------------------------------------------------

    def encode_raw_text(self, text: str) -> list[int]:
        """Model-written text: markers become their ids, everything else is BPE text."""
        return self.tok.encode_ordinary(text)

    def tool_calls_text(self, calls: Sequence[ToolCall]) -> str:
        return "\n".join(tool_call_text(c.name, c.arguments) for c in calls)

    def encode_tool_calls(self, calls: Sequence[ToolCall]) -> list[int]:
        return self.tok.encode_ordinary(self.tool_calls_text(calls))

    def structure_problems(self, ids: Sequence[int], *, n_calls: int, thinking: bool,
                           truncated: bool) -> list[str]:
        return structure_problems(ids, self.ids, n_calls=n_calls, thinking=thinking,
                                  truncated=truncated)

    def template_text(self) -> str:
        """Our Qwen3 Jinja template (our own wording of the template's behaviour)."""
        return template_text()

    def trainer_render(self, conversation: Sequence[dict[str, Any]],
                       tools: Sequence[Any] | None, *, thinking: bool, template: str) -> str:
        """A whole conversation rendered through `template` the way a re-tokenizing trainer
        does (no generation prompt)."""
        return render_with_template(template, conversation, tools, enable_thinking=thinking,
                                    add_generation_prompt=False)

    # -- ChatFormat: the gate's rules ------------------------------------------------------

    tool_id_in_tokens = TOOL_ID_IN_TOKENS  # servers make the ids up
    calls_open = TOOL_CALL

    def call_structure(self, ids: Sequence[int], *, n_calls: int, thinking: bool,
                       truncated: bool) -> CallStructure:
        ids = list(ids)
        problems = structure_problems(ids, self.ids, n_calls=n_calls, thinking=thinking,
                                      truncated=truncated)
        # A cut inside the last call's JSON leaves its name and arguments both in doubt.
        whole = whole_calls(n_calls, ids.count(self.ids[TOOL_CALL_END]), truncated)
        return CallStructure(problems, whole, whole)

    def parse_tool_calls(self, text: str, *, truncated: bool) -> ParsedCalls | None:
        found = find_tool_calls(text, allow_partial=truncated)
        return None if found is None else ParsedCalls(found.start, found.calls)

    def comparable_arguments(self, arguments: str) -> str:
        # The hermes parser re-dumps arguments: compare the JSON values' canonical text.
        return canonical_arguments(arguments)[0]

    def tool_id_problems(self, calls: Sequence[ToolCall],
                         messages: list[dict[str, Any]] | None) -> list[str]:
        return []  # no id is in the tokens: nothing the ids could get wrong

    def find_marker_text(self, text: str | None) -> str | None:
        if not text or "<" not in text:
            return None
        return next((m for m in TEXT_MARKERS if m in text), None)

    def calls_from_ids(self, ids: Sequence[int], *, truncated: bool) -> RawToolCalls | None:
        """The calls a client would read back from the completion ids (the gate's round
        trip): decode, then `find_tool_calls`."""
        return find_tool_calls(self.tok.decode(list(ids)), allow_partial=truncated)

    def assemble(
        self,
        reasoning: str | None,
        content: str | None,
        tool_calls: Sequence[ToolCall],
        *,
        thinking: bool,
        truncated: bool,
        arguments_verbatim: bool = False,
        content_stripped: bool | None = None,
    ) -> Assembled:
        """Completion ids from the API's fields, as vLLM's qwen3 + hermes parsers return them:
        `<think>` R `</think>` C [calls] `<|im_end|>`.

        `reasoning` and `content` are used verbatim (vLLM does not trim: reasoning is usually
        "\\n...\\n" and content starts with "\\n\\n"). Content that a server dropped for being
        whitespace next to calls (vLLM: null, SGLang: "") or stripped (SGLang) is restored with
        the template's separators (flagged). Raw
        `<tool_call>` text left in the content (a call the parser could not read) is kept as
        the model wrote it. `arguments_verbatim` says the arguments are the model's own text
        (a streamed call); otherwise they were re-dumped and the canonical form is assumed.
        """
        layout = self._layout(reasoning, content, tool_calls, thinking=thinking,
                              truncated=truncated, arguments_verbatim=arguments_verbatim,
                              content_stripped=content_stripped)
        return self._encode(layout, truncated)

    def _encode(self, layout: Assembled, truncated: bool) -> Assembled:
        # The text is model-written, markers included: encoded in one go, `<|im_end|>` as an id.
        layout.ids = self.tok.encode_ordinary(layout.text)
        if not truncated:
            layout.ids.append(self.im_end)
        return layout

    def _layout(self, reasoning: str | None, content: str | None,
                tool_calls: Sequence[ToolCall], *, thinking: bool, truncated: bool,
                arguments_verbatim: bool, content_stripped: bool | None = None,
                leaks_possible: bool = True) -> Assembled:
        """`assemble` up to the text (ids not yet encoded)."""
        flags: list[str] = []
        calls = list(tool_calls)
        api_calls = list(calls)
        parts: list[str] = []
        # SGLang's streamed reasoning parser ends the reasoning at a `<tool_call>` inside it
        # (docs/qwen3.md, "Stream"): the content then starts with the tag, and the model's own
        # `</think>` comes later in it. Inserting one more would write a second `</think>`
        # (vLLM's parsers split at the first one, so they never return this shape unless the
        # model wrote `</think>` twice, the first glued to a `<tool_call>`).
        implicit_end = (thinking and reasoning is not None and content is not None
                        and content.startswith(TOOL_CALL) and THINK_END in content)
        if thinking and reasoning is not None:
            parts.append(THINK + reasoning)
            # SGLang sends content "" where vLLM sends none: a cut with no content is a cut
            # inside the reasoning either way (`usage` tells the rare cut right after it).
            cut_in_reasoning = truncated and not content and not calls
            if not cut_in_reasoning and not implicit_end:
                parts.append(THINK_END)
        elif thinking:
            flags.append("no_reasoning_block")
        # The template's layout around content that precedes calls: "</think>\n\n" before
        # it (nothing after an empty-think prompt) and "\n" between it and the first call.
        lead = "\n\n" if thinking and reasoning is not None else ""
        if arguments_verbatim and content is not None and calls and leaks_possible:
            # SGLang's stream with an older base detector (docs/qwen3.md, "Stream") also sends
            # as content a "\n" that ends a call's JSON when it arrives on a step of its own,
            # and the "\n" between calls: newlines beyond the template's one after the text
            # before the calls. Read as the layout the template gives (vLLM's stream never adds
            # them: then nothing changes; nor is a think block sent as content -- vLLM after a
            # tool loop -- touched). Only when the content may have come after a call: a client
            # note showing all of it before the first call's delta rules leaks out (a "\n\n"
            # the model wrote before `<tool_call>` stays).
            trimmed = content if THINK_END in content else lead if not content.strip() else (
                content.rstrip("\n") + "\n" if content.endswith("\n\n") else content)
            if trimmed != content:
                content = trimmed
                flags.append("content_whitespace_guessed")
        if (content is not None and calls and content == content.strip() and not implicit_end
                and (not content or (not arguments_verbatim and content_stripped is not False))):
            # SGLang's qwen25 parser strips the text before the calls ("" when only
            # whitespace): the model's separators are restored as the template lays them out.
            # Not in a stream (both restated streams send the text as written), nor for a bare
            # text from a provider the probe found returns it as written (vLLM's hermes:
            # `strips_content_beside_calls` false): the model wrote it glued to the call.
            # Whitespace-only text is dropped by every parser, so an empty one still gets it.
            parts.append(lead + content + ("\n" if content else ""))
            flags.append("content_whitespace_guessed")
        elif content is not None:
            parts.append(content)
        elif calls:
            # vLLM nulls whitespace-only content next to calls.
            parts.append(lead)
            flags.append("content_whitespace_guessed")
        if calls:
            rebuilt = []
            for call in calls:
                args, canonical = canonical_arguments(call.arguments)
                if arguments_verbatim and not call.arguments:
                    # SGLang's stream never sends falsy arguments: the model wrote `{}`.
                    args = "{}"
                    flags.append("arguments_canonical_assumed")
                elif arguments_verbatim and ascii_escaped_dump(call.arguments):
                    # SGLang streams `json.dumps(arguments)` (ASCII escapes), not the model's
                    # text: the model wrote the characters (the template's `tojson` form).
                    flags.append("arguments_canonical_assumed")
                elif arguments_verbatim:
                    args = call.arguments
                elif not canonical:
                    flags.append("arguments_not_canonical")
                rebuilt.append(ToolCall("", call.name, args))
            if not arguments_verbatim:
                flags.append("arguments_canonical_assumed")
            if any(c.id and not is_server_tool_id(c.id) for c in calls):
                flags.append("tool_id_unexpected")
            calls = rebuilt
            parts.append(self.tool_calls_text(calls))
        elif content and find_tool_calls(content, allow_partial=True) is not None:
            flags.append("tool_calls_in_content")
        if reasoning and TOOL_CALL in reasoning:
            flags.append("tool_call_in_reasoning")
        if content and (THINK in content or THINK_END in content):
            flags.append("think_tag_in_text")
        return Assembled(ids=[], reasoning=reasoning, content=content, tool_calls=calls,
                         api_tool_calls=api_calls, flags=list(dict.fromkeys(flags)),
                         text="".join(parts))


def _think_block_in_content(content: str | None) -> tuple[str, str | None] | None:
    """(reasoning, content after `</think>`) of a content that opens with the model's think
    block; without `</think>` all of it is reasoning (a cut answer). None otherwise."""
    if not content or not content.startswith(THINK):
        return None
    reasoning, found, rest = content[len(THINK):].partition(THINK_END)
    return (reasoning, rest) if found else (reasoning, None)


def structure_problems(ids: Sequence[int], marker_ids: dict[str, int], *, n_calls: int,
                       thinking: bool, truncated: bool) -> list[str]:
    """Marker ids where a Qwen3 answer puts them, and nowhere else (for the gate): `<think>`
    first and once when thinking (never otherwise), at most one `</think>`, one
    `<tool_call>`/`</tool_call>` pair per call, no turn or tool-result markers, and
    `<|im_end|>` once at the very end unless the answer was cut off. `marker_ids` is
    `Qwen3.ids` (`check_tokenizer`)."""
    counts = {name: 0 for name in marker_ids}
    by_id = {token_id: name for name, token_id in marker_ids.items()}
    for token_id in ids:
        name = by_id.get(token_id)
        if name is not None:
            counts[name] += 1
    problems = []
    for name in (IM_START, TOOL_RESPONSE, TOOL_RESPONSE_END):
        if counts[name]:
            problems.append(f"{counts[name]} {name} id(s) inside the completion")
    if thinking:
        if counts[THINK] != 1 or ids[:1] != [marker_ids[THINK]]:
            problems.append(f"{THINK} is not the one first id ({counts[THINK]} found)")
        if counts[THINK_END] > 1 or (counts[THINK_END] == 0 and not truncated):
            problems.append(f"{counts[THINK_END]} {THINK_END} id(s) with thinking on")
    elif counts[THINK] or counts[THINK_END]:
        problems.append(f"think marker ids with thinking off ({counts[THINK]}/"
                        f"{counts[THINK_END]})")
    if truncated and counts[IM_END]:
        problems.append(f"a truncated completion holds {IM_END}")
    if not truncated and (counts[IM_END] != 1 or ids[-1:] != [marker_ids[IM_END]]):
        problems.append(f"{IM_END} is not the one last id ({counts[IM_END]} found)")
    opened, closed = counts[TOOL_CALL], counts[TOOL_CALL_END]
    fits = (opened == closed == n_calls) if not truncated else (
        closed <= opened and n_calls <= opened <= closed + 1)
    if not fits:
        problems.append(f"{TOOL_CALL}/{TOOL_CALL_END} ids ({opened}/{closed}) do not fit "
                        f"{n_calls} call(s)")
    return problems


def source_files() -> tuple[Path, ...]:
    """The files whose text decides the ids this format builds (the reconstruct fingerprint)."""
    # servers.py stays in: the readings render prompts with its message preprocessing (see
    # format.py imports). The emulator's served side (served.py and the restated servers
    # behind it), corpus.py (the fidelity bench's answers) and realvllm.py (the real-vLLM
    # harness's model folder) are never imported by reconstruction: editing them reruns
    # nothing (test_format_fingerprint_files).
    return package_files(Path(__file__).resolve().parent, exclude=NOT_RECONSTRUCTION)


NOT_RECONSTRUCTION = frozenset({"served.py", "vllm.py", "vllm_legacy.py", "hermes.py",
                                "sglang.py", "corpus.py", "realvllm.py"})


def make_format(tokenizer: Tokenizer, **options: Any) -> Qwen3:
    """The registry's constructor (`specregen.models.registry`); Qwen3 takes no options."""
    if options:
        raise FormatError(f"the qwen3 format takes no options (got {', '.join(options)})")
    return Qwen3(tokenizer)
