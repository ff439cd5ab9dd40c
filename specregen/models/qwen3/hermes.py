"""vLLM's hermes tool parser on Qwen3's `<tool_call>` blocks, the parts its two restatements
share (the earlier vLLM's, `vllm_legacy.py`, and 0.32's, `vllm.py`): the block pattern, the
stream's regions and its loop (`Hermes2ProToolParser.extract_tool_calls_streaming`). The two
differ in how the stream cuts a call's arguments out of its body (`HermesStream`'s
`arguments`) and in the non-streamed `hermes_extract`, each in its own module.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from specregen.models.qwen3.tokens import TOOL_CALL, TOOL_CALL_END
from specregen.models.serverkit.stream import ServerCall, is_complete_json, tag_overlap

# A closed block, or an open one to the end of the text (DOTALL).
CALL_BLOCK = re.compile(re.escape(TOOL_CALL) + "(.*?)" + re.escape(TOOL_CALL_END) + "|"
                        + re.escape(TOOL_CALL) + "(.*)", re.DOTALL)
NAME = re.compile(r'"name"\s*:\s*"([^"]+)"')
ARGS = re.compile(r'"arguments"\s*:\s*')


def call_regions(text: str) -> list[tuple[str, bool]]:
    """Each `<tool_call>` region's body, stripped, and whether it is complete (closed, or
    valid JSON as it stands); a partial `</tool_call>` at the end is left out."""
    regions = []
    pos = 0
    while (start := text.find(TOOL_CALL, pos)) != -1:
        body = start + len(TOOL_CALL)
        end = text.find(TOOL_CALL_END, body)
        if end != -1:
            regions.append((text[body:end].strip(), True))
            pos = end + len(TOOL_CALL_END)
            continue
        raw = text[body:]
        if overlap := tag_overlap(raw, TOOL_CALL_END):
            raw = raw[:-overlap]
        body_text = raw.strip()
        regions.append((body_text, is_complete_json(body_text) if body_text else False))
        break
    return regions


class HermesStream:
    """`Hermes2ProToolParser.extract_tool_calls_streaming`, re-run on the whole content text at
    every step and diffed against what was sent: content before the first `<tool_call>`
    (holding back an end that could start the tag; never sent if the stream ends there), a
    call's name once `"name": "..."` is complete (a later call cannot start before the earlier
    call has its name), and its arguments' growth (only growth: text that gets shorter is not
    re-sent). `arguments(body, complete)`: the version's cut of a call's arguments.

    `top_up`: vLLM 0.32's serving layer on the finishing step (`finalize_generation` ->
    `get_remaining_unstreamed_args`): when that step sent a call delta, the last call it sent
    gets what the parser holds as the last tracked call's arguments beyond what was streamed --
    `json.dumps({})`, "{}", for a call whose arguments never started (a stream cut right after
    a name), nothing otherwise (the parser holds the streamed text itself)."""

    def __init__(self, arguments: Callable[[str, bool], str | None], *,
                 top_up: bool = False) -> None:
        self.arguments = arguments
        self.top_up = top_up
        self.sent = 0
        self.content: list[str] = []
        self.names: list[str | None] = []
        self.streamed: list[str] = []  # what the parser last took as each call's arguments
        self.client: list[str] = []  # what the client added up, per call

    def step(self, text: str) -> int | None:
        """One step over the content so far; the index of the last call it sent a delta of."""
        last: int | None = None
        if TOOL_CALL in text:
            sendable = text.index(TOOL_CALL)
        else:
            sendable = len(text) - tag_overlap(text, TOOL_CALL)
        if sendable > self.sent:
            self.content.append(text[self.sent:sendable])
            self.sent = sendable
        for i, (body, complete) in enumerate(call_regions(text)):
            if i >= len(self.names):
                self.names.append(None)
                self.streamed.append("")
                self.client.append("")
            if self.names[i] is None:
                match = NAME.search(body)
                if match is None:
                    break
                self.names[i] = match.group(1)
                last = i
            args = self.arguments(body, complete)
            if args is not None and len(args) > len(self.streamed[i]):
                self.client[i] += args[len(self.streamed[i]):]
                self.streamed[i] = args
                last = i
        return last

    def run(self, pieces: Iterable[str]) -> tuple[str, tuple[ServerCall, ...]]:
        """The stream over the content's steps: (the content sent, the calls)."""
        text = ""
        last: int | None = None
        for piece in pieces:
            text += piece
            last = self.step(text)
        if self.top_up and last is not None and not self.streamed[-1]:
            self.client[last] += "{}"
        return "".join(self.content), self.calls()

    def calls(self) -> tuple[ServerCall, ...]:
        return tuple(ServerCall(name, args, i)
                     for i, (name, args) in enumerate(zip(self.names, self.client, strict=True))
                     if name is not None)
