"""What a user sees of whole conversations (issue 10) outside the engine: `specregen inspect` on
a user turn's sample, the report's spend from a raw log with a context refusal, and the
reconstruction progress of a `turns: all` chunk in the unit of its total."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from flows.chunks import prompts_rebuilt
from specregen.conversation.plan import plan_conversation
from specregen.conversation.samples import conversation_samples
from specregen.inspect.html import render_page
from specregen.inspect.terminal import render_sample
from specregen.inspect.view import build_view, prompt_runs
from specregen.models.kimi_k25 import KimiK25
from specregen.report.build import rawlog_spend
from specregen.store.rawlog import RawLog
from tests.support import get_tokenizer
from tests.unit.test_conversation_engine import conversation, model_server, run
from tests.unit.test_conversation_samples import (
    K25_ANSWERS,
    masked_runs,
    walk,
    weather_conversation,
)


@pytest.fixture(scope="module")
def turn1():
    """User turn 1 of a two-turn weather conversation: its call answer (loss mask 1) sits in
    the prompt, between turn 0's history and the tool result (mask 0)."""
    k25 = KimiK25(get_tokenizer("mini"))
    plan = plan_conversation(weather_conversation())
    samples = conversation_samples(plan, walk(plan, k25, lambda b, k, j: K25_ANSWERS[(k, j)]),
                                   k25)
    return k25, samples[1]


def test_inspect_shows_the_conversation_and_the_masked_earlier_answers(turn1):
    k25, sample = turn1
    earlier = masked_runs(sample, k25.tok)[0]  # the turn's call answer, inside the prompt
    assert earlier.startswith("Now Rome.</think>")
    view = build_view(sample, k25.tok, markers=k25.markers)
    console = Console(record=True, width=400, file=io.StringIO())
    console.print(render_sample(view, k25.tok, prompt_tokens=8))
    text = console.export_text()
    assert "c1 · user turn 1 · the conversation stopped: end" in text
    generated = sum(sample.loss_mask[: sample.prompt_len])
    assert generated == len(k25.tok.encode_with_specials(earlier))
    assert f"{generated:,} prompt tokens the model generated earlier" in text
    # The earlier answer is shown although it is not among the last 8 prompt tokens; the
    # mask-0 stretch before it (turn 0 and the user's question) is elided and counted.
    assert "Now Rome." in text and "Weather in Paris?" not in text
    assert "prompt tokens, loss mask 0 (--full shows them)" in text
    assert "Weather in Paris?" in _printed(render_sample(view, k25.tok, prompt_tokens=0))

    # The runs cover the prompt once, in order; every mask-1 token is in a shown run.
    runs = prompt_runs(view, 8)
    assert [r[0] for r in runs[1:]] == [r[1] for r in runs[:-1]]
    assert (runs[0][0], runs[-1][1]) == (0, sample.prompt_len)
    hidden = [i for start, end, shown in runs if not shown for i in range(start, end)]
    assert hidden and not any(sample.loss_mask[i] for i in hidden)
    assert runs[-1][2] and runs[-1][1] - runs[-1][0] >= 8


def test_inspect_html_carries_the_conversation_and_the_shown_prompt_runs(turn1):
    k25, sample = turn1
    view = build_view(sample, k25.tok, markers=k25.markers)
    page = render_page([view], k25.tok, title="t", source="x.parquet")
    blob = page.split('<script id="data" type="application/json">')[1].split("</script>")[0]
    data = json.loads(blob.replace("<\\/", "</"))["samples"][0]
    assert data["conversation"] == "c1 · user turn 1 · the conversation stopped: end"
    assert (data["facts"]["conversation_id"], data["facts"]["user_turn"],
            data["facts"]["stop_reason"]) == ("c1", 1, "end")
    shown = {i for start, end, on in data["prompt_runs"] if on for i in range(start, end)}
    generated = {i for i in range(sample.prompt_len) if sample.loss_mask[i]}
    assert generated and generated <= shown
    assert "prompt tokens, loss mask 0 (click)" in page


def test_a_single_turn_sample_keeps_the_plain_prompt_tail():
    k25 = KimiK25(get_tokenizer("mini"))
    plan = plan_conversation(weather_conversation())
    t0 = conversation_samples(plan, walk(plan, k25, lambda b, k, j: K25_ANSWERS[(k, j)]),
                              k25)[0]
    # Turn 0's first request had no earlier answer; a sample without a conversation id has
    # no conversation facts.
    from dataclasses import replace

    single = replace(t0, conversation_id=None, user_turn=None, stop_reason=None,
                     loss_mask=[0] * t0.prompt_len + list(t0.loss_mask[t0.prompt_len:]))
    view = build_view(single, k25.tok, markers=k25.markers)
    assert prompt_runs(view, 8) == [(0, single.prompt_len - 8, False),
                                    (single.prompt_len - 8, single.prompt_len, True)]
    text = _printed(render_sample(view, k25.tok, prompt_tokens=8))
    assert "conversation" not in text and "earlier answers" not in text


def test_report_spend_leaves_out_the_request_refused_by_the_context_check(tmp_path):
    def fits(prompt, body):  # a context check by request size
        return None if len(body["messages"]) <= 4 else "over the context"

    server = model_server()
    log_dir = tmp_path / "log"
    summary = run([conversation("grows", "call a b"), conversation("short", "hello")],
                  RawLog(log_dir), server, followup_check=fits)
    assert summary.conversation_stops == {"length": 1, "end": 1}
    records = [json.loads(line) for f in log_dir.rglob("part-*.jsonl")
               for line in f.read_text().splitlines()]
    assert any(r.get("error_class") == "context_length" for r in records)
    spend = rawlog_spend(log_dir)
    # What the server was sent, and nothing failed: the refusal stopped its conversation.
    assert spend["requests_sent"] == len(server.bodies) == summary.requests_sent == 3
    assert (spend["ok"], spend["failed"]) == (3, 0)


def test_reconstruction_progress_counts_a_conversation_once():
    # A chunk of 24 conversations: 27 samples (3 with a second user turn), one conversation
    # without any sample (missing), one sample an error.
    counts = {"ok": 25, "flagged": 1, "error": 1, "conversations": 24,
              "conversation_samples": 27, "conversations_without_sample": 1, "missing": 1,
              "completion_tokens": 900}
    assert prompts_rebuilt(counts) == (23, 1)
    # Single-turn prompts: one sample each.
    assert prompts_rebuilt({"ok": 8, "flagged": 1, "error": 1, "missing": 2}) == (9, 3)


def _printed(renderable) -> str:
    console = Console(record=True, width=400, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def test_the_demo_emulator_knows_the_demos_whole_conversations(tmp_path):
    import yaml

    from flows.demo import DEMO_CONFIG, demo_emulator_config, write_demo_conversations
    from specregen.emulator.conversations import ConversationBook

    path = write_demo_conversations(tmp_path)
    whole = [d for d in yaml.safe_load(DEMO_CONFIG.read_text())["datasets"]
             if d.get("turns") == "all"]
    assert [d["source"] for d in whole] == ["bundled:B1_glaive"]
    book = ConversationBook.load(path)
    # Every bundled row the adapter keeps is a conversation the emulator can follow.
    assert book.size == 24 and book.rejected == []
    assert demo_emulator_config(path).conversations == path
    assert demo_emulator_config().conversations is None
