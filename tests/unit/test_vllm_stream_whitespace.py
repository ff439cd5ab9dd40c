"""vLLM's kimi_k2 reasoning parser drops whitespace-only content deltas of a stream without
tools; its detokenizer holds a whole step back while it ends in an unfinished character.

Real code (docs/upstream-parsers.md): `KimiK2ReasoningParser.extract_reasoning_streaming` runs
`_clean_content` on every delta's content (`if not cleaned.strip(): return None`), and without a
tool parser `chat_completion_stream_generator` calls it for every delta, also after `</think>`
(`BaseThinkingReasoningParser` then returns `DeltaMessage(content=delta_text)`). The
detokenizer (`detokenize_incrementally`) returns "" for a step while `new_text.endswith("�")`,
and the held text comes with the next step. So a lone `\\n\\n` token is lost, a space that
shares a token with the head of an emoji is not.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from specregen.emulator.config import EmulatorConfig
from specregen.emulator.server import serve_in_thread
from specregen.models.kimi_k25 import THINK_END, KimiK25
from specregen.models.kimi_k25 import servers as upstream
from specregen.models.kimi_k25.servers import MarkerIds
from specregen.models.tokenizer import load_tokenizer
from specregen.reconstruct import reconstruct
from specregen.records import Prompt, ProviderTraits
from specregen.sources import SAMPLES_DIR, read_source
from specregen.wire.stream import assemble_lines
from tests.support import get_tokenizer

TOK = load_tokenizer("mini")
IDS = MarkerIds.of(TOK)
NO_TOOLS: dict[str, Any] = {"messages": [{"role": "user", "content": "Hi"}]}


def _space_and_emoji_head(tok: Any) -> tuple[int, int]:
    """A vocabulary token made of a space and the first bytes of a character, and a token
    that completes the character."""
    for head in range(tok.base_vocab_size):
        try:
            data = tok.decode_bytes([head])
        except (KeyError, ValueError, IndexError):
            continue
        text = data.decode("utf-8", errors="replace")
        if text[:1] == " " and text[1:] == "\ufffd" and len(data) > 2:
            for tail in range(256, tok.base_vocab_size):
                try:
                    (data + tok.decode_bytes([tail])).decode("utf-8")
                except (UnicodeDecodeError, KeyError, ValueError, IndexError):
                    continue
                return head, tail
    raise AssertionError("the vocabulary has no space + unfinished character token")


@pytest.mark.parametrize("which", ["mini", "kimi"])
def test_detokenizer_holds_the_whole_step_and_the_space_survives_the_filter(which):
    tok = get_tokenizer(which)
    ids_of = MarkerIds.of(tok)
    head, tail = _space_and_emoji_head(tok)
    ids = [*tok.encode_ordinary("Reason."), ids_of.think_end, *tok.encode_ordinary("Look"),
           head, tail, *tok.encode_ordinary("\n\nDone."), ids_of.stop]
    out = upstream.decode_output(ids, tok, truncated=False)
    char = (tok.decode_bytes([head, tail])).decode()  # " " + the character
    steps = [d.text for d in out.deltas]
    at = ids.index(head)
    # vLLM: "" for the step that ends in an unfinished character, then all of it at once.
    assert steps[at:at + 2] == ["", char]
    parsed = upstream.parse("vllm-legacy", out, NO_TOOLS, ids_of, stream=True)
    # The space came in a step that is not whitespace-only, so the filter keeps it; the lone
    # `\n\n` step is dropped (one token in this vocabulary).
    assert len(tok.encode_ordinary("\n\n")) == 1
    assert parsed.content == "Look" + char + "Done."
    assert parsed.content != out.text.split(THINK_END, 1)[1]
    assert upstream.parse("vllm-legacy", out, NO_TOOLS, ids_of, stream=False).content == (
        "Look" + char + "\n\nDone.")
    # At a cut the held step is lost whole, the space with it.
    cut = upstream.decode_output(ids[:at + 1], tok, truncated=True)
    assert cut.text.endswith("Look")


def _code_prompts(n: int) -> list[Prompt]:
    prompts = [p for p in read_source("magicoder", SAMPLES_DIR / "B3_magicoder.jsonl",
                                      dataset="B3_magicoder", instruction_prefix=True)
               if isinstance(p, Prompt)]
    return prompts[:n]


def test_streamed_vllm_answers_that_lost_whitespace_are_never_ok():
    """Plain code answers, no tools, streamed through the `vllm-legacy` profile: the whitespace the
    parser dropped is all that differs, and reconstruction never calls such a sample `ok` --
    with the server's ids (reference_text_diff), blind, or with a probe's traits."""
    fmt = KimiK25(TOK)
    lost = 0
    traits = ProviderTraits(counts_stop_token=True, renumbers_tool_ids=False)
    with serve_in_thread(EmulatorConfig(profile="vllm-legacy", seed=0), TOK) as emu:
        for prompt in _code_prompts(10):
            # As the client asks: no spaces around added tokens (those are read elsewhere).
            request = {"messages": prompt.messages, "max_tokens": 2048, "stream": True,
                       "stream_options": {"include_usage": True}, "return_token_ids": True,
                       "spaces_between_special_tokens": False}
            text = httpx.post(emu.url + "/chat/completions", json=request, timeout=20).text
            body, done = assemble_lines(text.splitlines())
            assert done
            choice = body["choices"][0]
            truth = choice.pop("token_ids")
            prompt_ids = body.pop("prompt_token_ids")
            written = TOK.decode_bytes(truth[:-1]).decode()
            sent = (choice["message"].get("reasoning") or "") + THINK_END + (
                choice["message"]["content"] or "")
            if sent == written:
                continue
            lost += 1
            # Only whitespace is missing.
            assert re.sub(r"\s", "", sent) == re.sub(r"\s", "", written)
            checked = reconstruct(prompt.sample_id, request, body, fmt,
                                  reference_completion_ids=truth,
                                  reference_prompt_ids=prompt_ids)
            assert checked.status == "flagged" and "reference_text_diff" in checked.flags
            for kwargs in ({}, {"traits": traits}):
                sample = reconstruct(prompt.sample_id, request, body, fmt, **kwargs)
                ours = sample.input_ids[sample.prompt_len:]
                assert ours != truth
                assert sample.status == "flagged", (prompt.sample_id, sample.flags)
                assert sample.evidence != "usage_exact"
                assert {"completion_count_mismatch", "completion_count_inexact"} & set(
                    sample.flags)
    assert lost >= 3  # the profile really drops whitespace on these answers
