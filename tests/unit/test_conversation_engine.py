"""The engine on whole conversations (issue 10): turn-by-turn requests, durability before the
next request, a full window across conversations, resume without paying twice, stop reasons.

The fake model below answers from the request alone (like a real one): on a user turn whose
text starts with "call" it calls `lookup` for each word after it (parallel calls), with ids in
K2.5's `functions.NAME:IDX` form counted over the conversation; after tool results, or on any
other user turn, it writes text. "wrong" in the text makes it call with other arguments.
"""

from __future__ import annotations

import asyncio
import json
import random

from specregen.client.engine import run_inference
from specregen.conversation import STOP_REASONS
from specregen.records import Prompt
from specregen.store.rawlog import RawLog
from tests.unit.test_client_support import (
    GATED_TIMEOUTS,
    SECRET_KEY,
    FakeServer,
    GatedServer,
    completion,
    gated_run,
    json_response,
    make_cfg,
)

LOOKUP = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}


def conversation(cid: str, first: str, second: str = "thanks") -> Prompt:
    """Turn 0: `first`; when it starts with "call", the dataset calls lookup per word (in
    reverse order: matching is by multiset), gets results, answers; turn 1: `second` -> text."""
    messages: list[dict] = [{"role": "system", "content": "sys"},
                            {"role": "user", "content": first}]
    words = first.split()[1:] if first.startswith("call") else []
    if words:
        calls = [{"id": f"d{n}", "type": "function",
                  "function": {"name": "lookup", "arguments": json.dumps({"q": w})}}
                 for n, w in reversed(list(enumerate(words)))]
        messages.append({"role": "assistant", "content": "", "tool_calls": calls})
        messages += [{"role": "tool", "tool_call_id": f"d{n}", "content": f"result of {w}"}
                     for n, w in enumerate(words)]
    messages.append({"role": "assistant", "content": "dataset answer"})
    messages += [{"role": "user", "content": second},
                 {"role": "assistant", "content": "dataset bye"}]
    return Prompt(cid, messages, tools=[LOOKUP], turns="all")


def model_answer(body: dict) -> dict:
    messages = body["messages"]
    last = messages[-1]
    history = sum(len(m.get("tool_calls") or ()) for m in messages if m["role"] == "assistant")
    if last["role"] == "user" and last["content"].startswith("call"):
        words = last["content"].split()[1:]
        if "wrong" in words:
            words = [w + "!" for w in words]
        calls = [{"id": f"functions.lookup:{history + n}", "type": "function",
                  "function": {"name": "lookup", "arguments": json.dumps({"q": w})}}
                 for n, w in enumerate(words)]
        return completion("", "I should look.", "tool_calls", tool_calls=calls)
    if last["role"] == "user" and last["content"].startswith("long"):
        return completion("cut sh", "hmm", "length")
    return completion(f"answer {len(messages)}", "Done thinking.")


def model_server(latency=lambda: 0.0, fail=lambda body: False):
    async def respond(request, body):
        await asyncio.sleep(latency())
        if fail(body):
            return json_response({"error": {"code": 400, "message": "bad request"}}, 400)
        return json_response(model_answer(body))

    return FakeServer(respond)


def run(prompts, log, server, cfg=None, **kwargs):
    async def main():
        async with log:
            return await run_inference(prompts, cfg or make_cfg(), log, api_key=SECRET_KEY,
                                       transport=server.transport, **kwargs)

    return asyncio.run(main())


def finals(log) -> dict[str, dict]:
    return {r["sample_id"]: r for r in log.iter_records() if r["final"]}


def test_a_conversation_goes_turn_by_turn_on_the_models_own_answers(tmp_path):
    log = RawLog(tmp_path)
    summary = run([conversation("c", "call a b")], log, model_server())
    records = finals(log)
    assert sorted(records) == ["c/t0/s0", "c/t0/s1", "c/t1/s0"]
    assert [records[k]["conversation"] for k in sorted(records)] == [
        {"id": "c", "user_turn": 0, "step": 0}, {"id": "c", "user_turn": 0, "step": 1},
        {"id": "c", "user_turn": 1, "step": 0}]
    assert records["c/t0/s0"]["request"]["messages"] == [
        {"role": "system", "content": "sys"}, {"role": "user", "content": "call a b"}]
    assert records["c/t0/s1"]["request"]["messages"][2:] == [
        # the model's own call turn, with its reasoning and ids (not the dataset's d0/d1)
        {"role": "assistant", "content": "", "reasoning": "I should look.",
         "reasoning_content": "I should look.",
         "tool_calls": [
             {"id": "functions.lookup:0", "type": "function",
              "function": {"name": "lookup", "arguments": '{"q": "a"}'}},
             {"id": "functions.lookup:1", "type": "function",
              "function": {"name": "lookup", "arguments": '{"q": "b"}'}}]},
        # both parallel calls answered, re-addressed, in the model's order
        {"role": "tool", "tool_call_id": "functions.lookup:0", "content": "result of a"},
        {"role": "tool", "tool_call_id": "functions.lookup:1", "content": "result of b"},
    ]
    assert records["c/t1/s0"]["request"]["messages"][5:] == [
        {"role": "assistant", "content": "answer 5", "reasoning": "Done thinking.",
         "reasoning_content": "Done thinking."},
        {"role": "user", "content": "thanks"}]
    assert records["c/t1/s0"]["request"]["tools"] == [LOOKUP]
    assert (summary.conversations, summary.ok, summary.requests_sent) == (1, 3, 3)
    assert summary.conversation_stops == {"end": 1}


def test_each_stop_reason_from_the_engine(tmp_path):
    prompts = [
        conversation("end", "call x"),
        conversation("differ", "call wrong"),
        Prompt(
            "model-called", [{"role": "user", "content": "call x"},
                             {"role": "assistant", "content": "no tools here"}],
            tools=[LOOKUP], turns="all"),
        Prompt(
            "model-answered", [{"role": "user", "content": "hello"},
                               {"role": "assistant", "content": "", "tool_calls": [
                                   {"id": "z", "type": "function",
                                    "function": {"name": "lookup", "arguments": "{}"}}]},
                               {"role": "tool", "tool_call_id": "z", "content": "r"}],
            tools=[LOOKUP], turns="all"),
        conversation("length", "long story"),
        conversation("error", "doomed"),
    ]
    log = RawLog(tmp_path)
    server = model_server(fail=lambda body: body["messages"][-1]["content"] == "doomed")
    summary = run(prompts, log, server)
    assert summary.conversation_stops == {
        "end": 1, "calls_differ": 1, "model_called_dataset_answered": 1,
        "model_answered_dataset_called": 1, "length": 1, "error": 1}
    assert set(summary.conversation_stops) == set(STOP_REASONS)
    records = finals(log)
    assert records["error/t0/s0"]["status"] == "failed"
    assert records["length/t0/s0"]["status"] == "truncated"
    # a conversation stops at its stop: nothing after it was requested
    assert sorted(k for k in records if k.startswith("differ/")) == ["differ/t0/s0"]


def test_a_conversation_that_cannot_be_walked_is_rejected_and_the_run_goes_on(tmp_path):
    bad = Prompt("bad", [{"role": "user", "content": "hi"},
                         {"role": "tool", "tool_call_id": "x", "content": "?"}], turns="all")
    summary = run([bad, conversation("ok", "hi")], RawLog(tmp_path), model_server())
    assert summary.rejects == [{"v": 1, "line": None, "sample_id": "bad",
                                "reason": "messages[1] is a tool message that answers no "
                                          "assistant tool call",
                                "created_at": summary.rejects[0]["created_at"]}]
    assert summary.conversation_stops == {"end": 1}


class SlowDurableLog(RawLog):
    """A raw log whose records become durable only some time after they are queued, noting
    which request ids are durable (the next request of a conversation must wait for them)."""

    def __init__(self, root, delay: float) -> None:
        super().__init__(root)
        self.delay = delay
        self.durable: set[str] = set()

    def submit(self, record):
        inner = super().submit(record)
        loop = asyncio.get_running_loop()
        outer = loop.create_future()

        def later(_):
            def resolve():
                self.durable.add(record.sample_id)
                outer.set_result(None)
            loop.call_later(self.delay, resolve)

        inner.add_done_callback(later)
        self._unresolved.add(outer)
        outer.add_done_callback(self._unresolved.discard)
        return outer


def test_the_next_request_waits_until_the_previous_answer_is_durable(tmp_path):
    log = SlowDurableLog(tmp_path, delay=0.03)
    early: list[str] = []

    async def respond(request, body):
        messages = body["messages"]
        cid = messages[1]["content"]
        answered = sum(m["role"] == "assistant" for m in messages)
        done = {s for s in log.durable if s.startswith(cid.replace(" ", "_") + "/")}
        if len(done) < answered:
            early.append(f"{cid}: {answered} answers in the request, {len(done)} durable")
        await asyncio.sleep(0.005)
        return json_response(model_answer(body))

    prompts = [conversation(f"call_{i}", f"call {i}") for i in range(12)]
    summary = run(prompts, log, FakeServer(respond), make_cfg(concurrency=4))
    assert early == []
    assert summary.conversation_stops == {"end": 12} and summary.requests_sent == 36


def test_the_window_stays_full_across_conversations(tmp_path):
    """While the input still holds conversations, the window is full: a conversation waiting
    for its answer to be durable never holds a slot, and no turn waits for other
    conversations' turns. The server holds every request until the test answers it; the test
    answers one at a time (never the oldest) and each answer must bring exactly one new
    request -- the same conversation's next one or a new conversation's first -- so `window`
    are in flight again, until the last conversation has started (a per-turn barrier over the
    window sends nothing until all its turns are answered). Order and state, not time."""
    window, n = 6, 30
    server = GatedServer(lambda body: json_response(model_answer(body)))
    rng = random.Random(3)
    prompts = [conversation(f"c{i}", f"call {i} {i + 1}" if i % 2 else "hello")
               for i in range(n)]

    def started():  # first requests: the system prompt and the first user turn
        return sum(len(body["messages"]) == 2 for body in server.bodies)

    async def steps():
        await server.until(lambda: server.in_flight == window, f"{window} requests in flight")
        while started() < n:
            arrived = len(server.bodies)
            server.release(rng.randrange(1, len(server.held)))  # any but the oldest
            await server.arrival(arrived, f"a new request after request {arrived}")
            assert len(server.bodies) == arrived + 1 and server.in_flight == window, (
                server.state())

    async def main():
        log = RawLog(tmp_path)
        async with log:
            return await gated_run(server, run_inference(
                prompts, make_cfg(concurrency=window, timeouts=GATED_TIMEOUTS), log,
                api_key=SECRET_KEY, transport=server.transport), steps)

    summary = asyncio.run(main())
    assert summary.conversation_stops == {"end": n}
    assert summary.requests_sent == n // 2 * 3 + n // 2 * 2
    assert summary.peak_in_flight == window == server.peak


def test_a_stopped_run_resumes_every_conversation_and_pays_nothing_twice(tmp_path):
    prompts = [conversation(f"c{i}", f"call {i} x" if i % 3 else "call wrong", "bye")
               for i in range(40)]
    whole = model_server()
    reference = run(prompts, RawLog(tmp_path / "whole"), whole, make_cfg(concurrency=6))

    first = model_server()
    stopped = run(prompts, RawLog(tmp_path / "split"), first, make_cfg(concurrency=6),
                  should_stop=lambda: "test" if len(first.bodies) >= 37 else None)
    assert stopped.stopped_reason == "test" and stopped.conversations_open > 0
    second = model_server()
    resumed = run(prompts, RawLog(tmp_path / "split"), second, make_cfg(concurrency=6))
    assert resumed.stopped_reason is None
    # every request paid once: the stop let the ones in flight finish and be logged
    assert len(first.bodies) + len(second.bodies) == len(whole.bodies)
    assert resumed.skipped == len(first.bodies)
    assert resumed.conversation_stops == reference.conversation_stops == {
        "end": 26, "calls_differ": 14}
    split = finals(RawLog(tmp_path / "split"))
    same = finals(RawLog(tmp_path / "whole"))
    assert sorted(split) == sorted(same)
    assert all(split[k]["fingerprint"] == same[k]["fingerprint"] for k in same)
    # a third run has nothing left to pay for
    third = model_server()
    again = run(prompts, RawLog(tmp_path / "split"), third, make_cfg(concurrency=6))
    assert third.bodies == [] and again.conversation_stops == reference.conversation_stops


def test_retry_failed_requests_a_failed_turn_again_and_the_conversation_goes_on(tmp_path):
    log_dir = tmp_path / "log"
    flaky = {"fail": True}
    server = model_server(fail=lambda body: flaky["fail"] and len(body["messages"]) > 2)
    summary = run([conversation("c", "call a")], RawLog(log_dir), server)
    assert summary.conversation_stops == {"error": 1} and summary.failed == 1
    again = run([conversation("c", "call a")], RawLog(log_dir), model_server())
    assert again.conversation_stops == {"error": 1} and again.requests_sent == 0
    flaky["fail"] = False
    retried = run([conversation("c", "call a")], RawLog(log_dir), model_server(),
                  retry_failed=True)
    assert retried.conversation_stops == {"end": 1} and retried.requests_sent == 2


def test_a_conversation_that_outgrows_the_context_stops_with_length_in_every_run(tmp_path):
    """A later request that fails the context check is not sent; its final record (nothing
    paid) stops the conversation with `length`, so a rerun, the replay and the samples reach
    the same stop without the check; --retry-failed checks it again."""
    from specregen.client.driver import history_format
    from specregen.conversation import conversation_answers, plan_conversation
    from specregen.conversation.samples import conversation_finals, stop_reason_of
    from specregen.progress import Progress, engine_observer

    def fits(limit):
        # A check like the context check: by the size of the request it is given.
        def check(prompt, body):
            n = len(body["messages"])
            return None if n <= limit else f"{n} messages exceed the context of {limit}"
        return check

    prompts = [conversation("grows", "call a b"), conversation("short", "hello")]
    log_dir = tmp_path / "log"
    server = model_server()
    snaps = []
    summary = run(prompts, RawLog(log_dir), server, followup_check=fits(4),
                  progress=snaps.append)
    # grows: t0/s0 (2 messages) sent; t0/s1 (5 messages: + call turn + 2 results) refused.
    # short: t0/s0, then t1/s0 (4 messages) fits.
    assert summary.conversation_stops == {"length": 1, "end": 1}
    assert (summary.requests_sent, summary.failed, summary.rejected) == (3, 0, 0)
    assert summary.conversations_open == 0
    assert [len(b["messages"]) for b in server.bodies].count(5) == 0
    records = finals(RawLog(log_dir))
    refused = records["grows/t0/s1"]
    assert (refused["status"], refused["error_class"], refused["error_message"]) == (
        "failed", "context_length", "5 messages exceed the context of 4")
    assert refused["conversation"] == {"id": "grows", "user_turn": 0, "step": 1}
    assert len(refused["request"]["messages"]) == 5 and refused.get("cost_usd") is None
    # Progress: two conversations, both done.
    last = snaps[-1]
    assert (last.conversations, last.conversations_done, last.skipped) == (2, 2, 0)

    # The replay (what the samples use) reads the same stop from the log alone.
    fmt = history_format("kimi-k2.5")
    plan = plan_conversation(prompts[0])
    log_finals = conversation_finals(RawLog(log_dir).iter_records())
    assert stop_reason_of(plan, conversation_answers(plan, log_finals, fmt)) == "length"

    # A rerun with the same check pays nothing, writes nothing, and ends the same way; its
    # progress counts conversations, not the requests taken from the log.
    before = len(list(RawLog(log_dir).iter_records()))
    again_server = model_server()
    progress = Progress("infer", total=2)
    again = run(prompts, RawLog(log_dir), again_server, followup_check=fits(4),
                progress=engine_observer(progress))
    assert again_server.bodies == [] and again.conversation_stops == summary.conversation_stops
    assert len(list(RawLog(log_dir).iter_records())) == before
    assert again.skipped == 4  # 3 answers + 1 refusal taken from the log
    assert (progress.done, progress.skipped) == (2, 0)

    # --retry-failed checks it again: with room now, the conversation goes on to the end.
    retried = run(prompts, RawLog(log_dir), model_server(), followup_check=fits(10),
                  retry_failed=True)
    assert retried.conversation_stops == {"end": 2} and retried.requests_sent == 2
