"""The engine: full window, sharding, retries, fatal stop, budget, rpm, resume, duplicates."""

from __future__ import annotations

import asyncio
import random
import time
import uuid

import pytest

from specregen.client import engine as engine_module
from specregen.client.config import RetryPolicy
from specregen.client.engine import (
    FatalAPIError,
    RateLimiter,
    backoff_delay,
    response_cost,
    run_inference,
)
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
    make_prompts,
    ok_handler,
)


def run(prompts, cfg, log, server, **kwargs):
    async def main():
        async with log:
            return await run_inference(
                prompts,
                cfg,
                log,
                api_key=kwargs.pop("api_key", SECRET_KEY),
                transport=server.transport,
                **kwargs,
            )

    return asyncio.run(main())


def finals(log):
    return [r for r in log.iter_records() if r["final"]]


def test_all_samples_done_and_logged(tmp_path):
    server = FakeServer(ok_handler())
    log = RawLog(tmp_path)
    summary = run(make_prompts(20), make_cfg(), log, server)
    assert (summary.ok, summary.failed, summary.requests_sent) == (20, 0, 20)
    assert summary.prompt_tokens == 200 and summary.completion_tokens == 100
    records = finals(log)
    assert sorted(r["sample_id"] for r in records) == sorted(f"s{i}" for i in range(20))
    assert all(r["status"] == "ok" and r["attempt"] == 1 for r in records)
    assert records[0]["request"]["messages"][0]["role"] == "user"
    assert records[0]["response"]["choices"][0]["message"]["content"] == "Hello!"
    assert records[0]["provider"] == "FakeProvider"


def test_window_stays_full_until_the_input_runs_dry(tmp_path):
    """A request starts as soon as one ends, with no batch and no barrier. The server holds
    every request until the test answers it; the test answers one at a time, never the oldest
    (a design that waits for a whole batch, or for its slowest or first request, sends nothing
    then), and each answer must bring exactly one new request, so `window` are in flight again
    before the next answer, until the input runs dry. Order and state only: how long anything
    takes (a loaded machine) does not matter; the waits only guard against a hang."""
    window, n = 8, 48
    server = GatedServer()
    rng = random.Random(7)
    cfg = make_cfg(concurrency=window, timeouts=GATED_TIMEOUTS)
    log = RawLog(tmp_path)

    async def steps():
        await server.until(lambda: server.in_flight == window, f"{window} requests in flight")
        while len(server.bodies) < n:
            arrived = len(server.bodies)
            server.release(rng.randrange(1, len(server.held)))  # any but the oldest
            await server.arrival(arrived, f"a new request after answer {arrived - window + 1}")
            assert len(server.bodies) == arrived + 1 and server.in_flight == window, (
                server.state())
        # The input ran dry: the server opens, the tail drains.

    async def main():
        async with log:
            return await gated_run(server, run_inference(
                make_prompts(n), cfg, log, api_key=SECRET_KEY, transport=server.transport),
                steps)

    summary = asyncio.run(main())
    assert summary.ok == n and summary.requests_sent == n
    assert summary.peak_in_flight == window == server.peak


def test_clients_are_sharded_by_connections_per_shard(tmp_path, monkeypatch):
    made = []

    class Recording(engine_module.HTTPClient):
        def __init__(self, **kwargs):
            made.append(kwargs["limits"])
            super().__init__(**kwargs)

    monkeypatch.setattr(engine_module, "HTTPClient", Recording)
    server = FakeServer(ok_handler())
    cfg = make_cfg(concurrency=250, connections_per_shard=100)
    run(make_prompts(10), cfg, RawLog(tmp_path), server)
    assert len(made) == 3 == cfg.shards
    assert all(limits.max_connections == 100 for limits in made)


def test_retry_after_is_honoured(tmp_path):
    async def respond(request, body):
        if len(server.bodies) == 1:
            return json_response(
                {"error": {"code": 429, "message": "slow"}}, 429, {"Retry-After": "0.4"}
            )
        return json_response(completion())

    server = FakeServer(respond)
    log = RawLog(tmp_path)
    summary = run(make_prompts(1), make_cfg(), log, server)
    assert summary.ok == 1 and summary.retries == 1
    gap = server.starts[1] - server.starts[0]
    assert 0.4 <= gap < 1.0  # base delay is 1 ms: the wait is the server's
    attempts = list(log.iter_records())
    assert [(r["attempt"], r["status"], r["final"], r["error_class"]) for r in attempts] == [
        (1, "failed", False, "rate_limited"),
        (2, "ok", True, None),
    ]


def test_backoff_is_exponential_capped_and_jittered():
    policy = RetryPolicy(base_delay=1, max_delay=5, jitter=False, max_retry_after=30)
    assert [backoff_delay(n, policy) for n in range(1, 7)] == [1, 2, 4, 5, 5, 5]
    assert backoff_delay(2, policy, retry_after=12) == 12
    assert backoff_delay(2, policy, retry_after=1e6) == 30
    jittered = RetryPolicy(base_delay=1, max_delay=5)
    rng = random.Random(1)
    delays = [backoff_delay(n, jittered, rng=rng) for n in range(1, 200)]
    assert all(0 <= d <= 5 for d in delays) and len(set(delays)) > 100
    assert backoff_delay(1000, jittered, rng=rng) <= 5


def test_retries_end_in_a_permanent_failure_with_the_last_error(tmp_path):
    async def respond(request, body):
        return json_response({"error": {"code": 503, "message": f"down {len(server.bodies)}"}}, 503)

    server = FakeServer(respond)
    log = RawLog(tmp_path)
    summary = run(make_prompts(1), make_cfg(retry={"max_attempts": 4}), log, server)
    assert (summary.ok, summary.failed, summary.requests_sent, summary.retries) == (0, 1, 4, 3)
    records = list(log.iter_records())
    assert [r["final"] for r in records] == [False, False, False, True]
    last = records[-1]
    assert (last["status"], last["error_class"], last["error_message"]) == (
        "failed",
        "server_error",
        "HTTP 503: 503 down 4",
    )
    assert last["request"]["model"] == "moonshotai/kimi-k2.5"


def test_400_fails_only_that_sample(tmp_path):
    async def respond(request, body):
        if body["messages"][0]["content"] == "q3":
            return json_response({"error": {"code": 400, "message": "bad input"}}, 400)
        return json_response(completion())

    server = FakeServer(respond)
    log = RawLog(tmp_path)
    summary = run(make_prompts(10), make_cfg(), log, server)
    assert (summary.ok, summary.failed, summary.requests_sent) == (9, 1, 10)
    (failed,) = [r for r in finals(log) if r["sample_id"] == "s3"]
    assert failed["status"] == "failed" and failed["error_class"] == "bad_request"
    assert log.final_index()[("s3", failed["fingerprint"])] == "failed"


@pytest.mark.parametrize(("status", "words"), [(401, "rejected the key"), (402, "cannot pay")])
def test_fatal_status_stops_the_run_fast(tmp_path, status, words):
    async def respond(request, body):
        await asyncio.sleep(0.01)
        return json_response({"error": {"code": status, "message": "no"}}, status)

    server = FakeServer(respond)
    log = RawLog(tmp_path)
    cfg = make_cfg(concurrency=8, api_key_env="MY_KEY_VAR")
    started = time.monotonic()
    with pytest.raises(FatalAPIError) as caught:
        run(make_prompts(1000), cfg, log, server)
    assert time.monotonic() - started < 2
    assert len(server.bodies) <= 8  # only the first window went out
    message = str(caught.value)
    assert "$MY_KEY_VAR" in message and words in message
    assert SECRET_KEY not in message and SECRET_KEY not in repr(caught.value)
    assert caught.value.summary.stopped_reason == "fatal"
    assert caught.value.summary.fatal >= 1
    # Nothing final: a rerun with a good key requests these samples again.
    assert finals(log) == [] and len(list(log.iter_records())) == len(server.bodies)


def test_fatal_lets_requests_in_flight_finish_and_logs_them(tmp_path):
    async def respond(request, body):
        if body["messages"][0]["content"] == "q0":
            await asyncio.sleep(0.05)  # the others are in flight by now
            return json_response({"error": {"code": 401, "message": "bad key"}}, 401)
        await asyncio.sleep(0.2)
        return json_response(completion())

    server = FakeServer(respond)
    log = RawLog(tmp_path)
    with pytest.raises(FatalAPIError) as caught:
        run(make_prompts(50), make_cfg(concurrency=4), log, server)
    assert caught.value.summary.ok == 3  # the three already in flight
    assert len(server.bodies) == 4
    assert len(finals(log)) == 3


def test_no_key_and_401_says_the_variable_is_not_set(tmp_path):
    server = FakeServer(lambda r, b: _async(json_response({"error": {"code": 401}}, 401)))
    with pytest.raises(FatalAPIError, match=r"\$OPENROUTER_API_KEY is not set"):
        run(make_prompts(3), make_cfg(), RawLog(tmp_path), server, api_key=None)
    assert "authorization" not in server.headers[0]


async def _async(value):
    return value


def test_budget_stops_launching_and_lets_in_flight_finish(tmp_path):
    async def respond(request, body):
        await asyncio.sleep(0.01)
        return json_response(
            completion(usage={"prompt_tokens": 10, "completion_tokens": 5, "cost": 0.01})
        )

    server = FakeServer(respond)
    log = RawLog(tmp_path)
    summary = run(make_prompts(200), make_cfg(concurrency=4, budget_usd=0.1), log, server)
    assert summary.stopped_reason == "budget"
    assert summary.cost_usd <= 0.1 + 1e-9
    assert 6 <= summary.ok < 200
    assert summary.ok == len(finals(log)) == summary.requests_sent


def test_budget_just_enough_for_the_input_is_a_completed_run(tmp_path):
    answer = completion(usage={"prompt_tokens": 1, "completion_tokens": 1, "cost": 0.01})
    server = FakeServer(ok_handler(body=answer))
    cfg = make_cfg(concurrency=1, budget_usd=0.035)
    summary = run(make_prompts(3), cfg, RawLog(tmp_path), server)
    assert (summary.ok, summary.stopped_reason, summary.abandoned) == (3, None, 0)


def test_budget_projection_before_any_answer_uses_max_tokens_and_price(tmp_path):
    server = FakeServer(ok_handler(delay=0.05))
    # 1000 tokens at $10/M = $0.01 per request: at most 3 may be in flight for $0.035.
    cfg = make_cfg(
        concurrency=8,
        budget_usd=0.035,
        sampling={"max_tokens": 1000},
        prices={"prompt_per_million": 0, "completion_per_million": 10},
    )
    run(make_prompts(3), cfg, RawLog(tmp_path), server)
    assert len(server.bodies) == 3
    assert max(count for _, count in server.timeline) == 3


def test_requests_per_minute_limit(tmp_path, monkeypatch):
    # 600/min = one every 0.1 s: the k-th request (from 0) reaches the server no sooner than
    # k intervals after the limiter was first asked. A late wake-up only delays, so this holds
    # on any machine; the gap between two arrivals does not (a late one followed by an on-time
    # one arrive closer than 0.1 s, and the provider still saw no more than its rate).
    asked: list[float] = []

    class Recording(RateLimiter):
        async def acquire(self):
            asked.append(time.monotonic())
            await super().acquire()

    monkeypatch.setattr(engine_module, "RateLimiter", Recording)
    server = FakeServer(ok_handler())
    summary = run(
        make_prompts(6), make_cfg(concurrency=6, requests_per_minute=600), RawLog(tmp_path), server
    )
    assert summary.ok == 6 and len(asked) == 6
    early = [(k, round(t - asked[0], 4)) for k, t in enumerate(server.starts)
             if t - asked[0] < k * 0.1 - 1e-3]
    assert early == [], f"(request, seconds after the first was asked) over 600/min: {early}"


def test_rate_limiter_with_a_fake_clock():
    now = [0.0]
    slept = []

    async def sleep(seconds):
        slept.append(seconds)
        now[0] += seconds

    limiter = RateLimiter(120, burst=2, clock=lambda: now[0], sleep=sleep)

    async def main():
        for _ in range(4):
            await limiter.acquire()

    now[0] = 100.0
    asyncio.run(main())
    assert slept == [0.5, 0.5]  # two at once (burst), then one every 0.5 s


def test_resume_sends_only_what_has_no_final_record(tmp_path):
    server = FakeServer(ok_handler())
    run(make_prompts(5), make_cfg(), RawLog(tmp_path), server)
    assert len(server.bodies) == 5
    again = FakeServer(ok_handler())
    summary = run(make_prompts(12), make_cfg(), RawLog(tmp_path), again)
    assert (summary.skipped, summary.ok, len(again.bodies)) == (5, 7, 7)
    assert sorted(again.sample_ids()) == sorted(f"q{i}" for i in range(5, 12))
    # A changed request (another max_tokens) is another fingerprint: requested again.
    changed = FakeServer(ok_handler())
    run(make_prompts(2), make_cfg(sampling={"max_tokens": 99}), RawLog(tmp_path), changed)
    assert len(changed.bodies) == 2


def test_stream_flag_does_not_change_the_fingerprint(tmp_path):
    server = FakeServer(ok_handler())
    run(make_prompts(3), make_cfg(stream=False), RawLog(tmp_path), server)
    streaming = FakeServer(ok_handler())  # answers JSON even to stream requests
    summary = run(make_prompts(3), make_cfg(stream=True), RawLog(tmp_path), streaming)
    assert (summary.skipped, len(streaming.bodies)) == (3, 0)


def test_permanently_failed_samples_rerun_only_with_retry_failed(tmp_path):
    async def bad(request, body):
        return json_response({"error": {"code": 422, "message": "no"}}, 422)

    run(make_prompts(2), make_cfg(), RawLog(tmp_path), FakeServer(bad))
    plain = FakeServer(ok_handler())
    summary = run(make_prompts(2), make_cfg(), RawLog(tmp_path), plain)
    assert (summary.skipped, len(plain.bodies)) == (2, 0)
    retry = FakeServer(ok_handler())
    summary = run(make_prompts(2), make_cfg(), RawLog(tmp_path), retry, retry_failed=True)
    assert (summary.ok, len(retry.bodies)) == (2, 2)
    assert set(RawLog(tmp_path).final_index().values()) == {"ok"}


def test_crash_loses_at_most_the_requests_in_flight(tmp_path):
    server = FakeServer(ok_handler(delay=0.03))
    log = RawLog(tmp_path)
    cfg = make_cfg(concurrency=5)

    async def crashing():
        task = asyncio.ensure_future(
            run_inference(
                make_prompts(100), cfg, log, api_key=SECRET_KEY, transport=server.transport
            )
        )
        while len(server.bodies) < 30:
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await log.aclose()

    asyncio.run(crashing())
    done_before = {r["sample_id"] for r in finals(RawLog(tmp_path))}
    assert 20 <= len(done_before) < 100
    assert len(server.bodies) - len(done_before) <= 5  # lost: the window in flight
    rerun = FakeServer(ok_handler())
    summary = run(make_prompts(100), cfg, RawLog(tmp_path), rerun)
    assert len(rerun.bodies) == 100 - len(done_before) == summary.ok
    assert summary.skipped == len(done_before)
    ids = [r["sample_id"] for r in finals(RawLog(tmp_path))]
    assert len(ids) == len(set(ids)) == 100


class _CountingLog(RawLog):
    """An object-store raw log that counts the records it has put (durable)."""

    committed = 0

    def _commit_object(self, lines):
        super()._commit_object(lines)
        self.committed += len(lines)


@pytest.mark.parametrize("roll_records", [8, 2_000], ids=["part-per-window", "part-too-big"])
def test_paid_but_not_durable_answers_stay_within_the_window(roll_records):
    """A worker's slot is held until its answer is durable, so a crash loses at most a window
    of paid answers, also on an object store that commits a part per window. The timer is set
    far beyond the test's time limit: with every worker waiting, the part must be put by the
    count rule (a window waits) or, when parts are larger than the window, because nothing
    is in flight any more, never by a deadlock broken only by the timer."""
    window, n = 8, 120
    log = _CountingLog(f"memory://durable-{uuid.uuid4().hex}", roll_records=roll_records,
                       roll_seconds=300.0)
    answered = 0
    worst = 0

    async def respond(request, body):
        nonlocal answered, worst
        await asyncio.sleep(random.uniform(0.002, 0.01))
        answered += 1
        worst = max(worst, answered - log.committed)
        return json_response(completion())

    server = FakeServer(respond)

    async def main():
        async with log:
            return await asyncio.wait_for(
                run_inference(make_prompts(n), make_cfg(concurrency=window), log,
                              api_key=SECRET_KEY, transport=server.transport), 30)

    summary = asyncio.run(main())
    assert summary.ok == n and log.committed == n
    assert worst <= window, f"{worst} paid answers not durable at once, window {window}"
    assert summary.peak_in_flight == window  # the window was used


def test_duplicate_sample_ids_are_processed_once(tmp_path):
    prompts = make_prompts(3) + make_prompts(3) + make_prompts(1)
    server = FakeServer(ok_handler())
    summary = run(prompts, make_cfg(), RawLog(tmp_path), server)
    assert (summary.ok, summary.duplicates, len(server.bodies)) == (3, 4, 3)


def test_progress_snapshots_are_rate_limited(tmp_path):
    snaps = []
    server = FakeServer(ok_handler(delay=0.02))
    summary = run(
        make_prompts(60),
        make_cfg(concurrency=3),
        RawLog(tmp_path),
        server,
        progress=snaps.append,
        progress_interval=0.1,
    )
    assert summary.wall_s > 0.3
    assert 2 <= len(snaps) <= summary.wall_s / 0.1 + 2
    last = snaps[-1]
    assert (last.done, last.failed, last.in_flight) == (60, 0, 0)
    assert last.requests_per_s > 0 and last.tokens_per_s > 0
    assert max(s.in_flight for s in snaps) <= 3


def test_response_cost_prefers_usage_cost():
    prices = make_cfg(prices={"prompt_per_million": 1, "completion_per_million": 2}).prices
    assert response_cost({"usage": {"cost": 0.5, "prompt_tokens": 9}}, prices) == 0.5
    assert (
        response_cost({"usage": {"prompt_tokens": 1_000_000, "completion_tokens": 500_000}}, prices)
        == 2.0
    )
    assert response_cost({"usage": {"prompt_tokens": 5}}, None) is None
    assert response_cost(None, prices) is None


def test_token_ids_are_lifted_into_the_record(tmp_path):
    body = completion(extra_choice={"token_ids": [5, 6, 7]}, prompt_token_ids=[1, 2])
    server = FakeServer(ok_handler(body=body))
    log = RawLog(tmp_path)
    run(make_prompts(1), make_cfg(dialect="vllm", return_token_ids=True), log, server)
    assert server.bodies[0]["return_token_ids"] is True
    record = finals(log)[0]
    assert record["reference_completion_ids"] == [5, 6, 7]
    assert record["prompt_token_ids"] == [1, 2]
    assert "token_ids" not in record["response"]["choices"][0]
    (sample,) = log.iter_final_samples()
    assert sample["reference_completion_ids"] == [5, 6, 7]


def test_a_failing_raw_log_stops_the_run(monkeypatch):
    from specregen.store import rawlog as rawlog_module
    from specregen.store.rawlog import RawLogError

    monkeypatch.setattr(rawlog_module, "PUT_ATTEMPTS", 1)
    log = RawLog("memory://engine-failing-log", roll_records=1)

    def refuse(*args, **kwargs):
        raise OSError("bucket is gone")

    monkeypatch.setattr(log.fs, "pipe_file", refuse)
    server = FakeServer(ok_handler(delay=0.01))
    with pytest.raises(RawLogError, match="bucket is gone"):
        run(make_prompts(200), make_cfg(concurrency=4), log, server)
    assert len(server.bodies) < 20  # stopped launching once a write failed
