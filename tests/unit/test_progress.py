"""Live progress: the numbers (rates, time left, projected spend), throttling, and both views."""

from __future__ import annotations

import io

from rich.console import Console

from specregen.progress import LogLines, Progress, TerminalView, format_line, live_progress


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_rates_time_left_and_projected_spend_from_counters():
    clock = FakeClock()
    progress = Progress("infer", total=1000, clock=clock)
    clock.now += 10.0
    # 100 done and 20 failed in 10 s: 720 per minute; 600 tokens a second.
    progress.set(done=100, failed=20, in_flight=30, tokens=6000, cost_usd=1.2)
    state = progress.state()
    assert state.finished == 120
    assert state.remaining == 880
    assert abs(state.requests_per_min - 720.0) < 1e-9
    assert abs(state.tokens_per_min - 36_000.0) < 1e-9
    # 880 left at 12 a second.
    assert abs(state.eta_s - 880 / 12) < 1e-9
    # $0.01 per paid request so far, 880 more to go.
    assert abs(state.projected_cost_usd - (1.2 + 0.01 * 880)) < 1e-9
    assert abs(state.fraction - 0.12) < 1e-9


def test_rates_follow_the_trailing_window_so_a_stall_shows():
    clock = FakeClock()
    progress = Progress("reconstruct", total=10_000, clock=clock)
    for _ in range(10):
        clock.now += 5.0
        progress.advance(done=500)
        progress.state()
    assert progress.state().requests_per_min > 5000
    # Nothing more for 30 s: the window (20 s) holds no progress any more.
    for _ in range(6):
        clock.now += 5.0
        progress.state()
    stalled = progress.state()
    assert stalled.requests_per_min == 0.0
    assert stalled.eta_s is None  # unknowable at a standstill, not infinite or zero


def test_skipped_items_do_not_inflate_the_rate_or_the_projection():
    clock = FakeClock()
    progress = Progress("infer", total=100, clock=clock)
    progress.advance(skipped=50)
    clock.now += 60.0
    progress.advance(done=10, cost_usd=0.5)
    state = progress.state()
    assert state.requests_per_min == 10.0
    assert state.remaining == 40
    assert abs(state.projected_cost_usd - (0.5 + 0.05 * 40)) < 1e-9


def test_unknown_total_gives_no_time_left_and_no_projection():
    progress = Progress("infer")
    progress.advance(done=3, cost_usd=0.3)
    state = progress.state()
    assert state.remaining is None and state.eta_s is None and state.projected_cost_usd is None
    assert "3, 3 done" in format_line(state) and "? left" in format_line(state)
    # At the end the total is what was finished.
    assert progress.close().total == 3


def test_observers_are_told_at_most_once_per_interval_and_once_at_the_end():
    clock = FakeClock()
    seen = []
    progress = Progress("gate", total=10_000, interval=1.0, clock=clock, observers=[seen.append])
    for _ in range(10_000):
        clock.now += 0.001  # 10 s of work in all
        progress.advance(done=1)
    progress.close()
    progress.close()  # a second close tells nobody again
    assert 9 <= len(seen) <= 11
    assert seen[-1].final and seen[-1].done == 10_000 and seen[-1].in_flight == 0
    assert not any(s.final for s in seen[:-1])


def test_log_lines_write_one_line_per_interval_plus_the_final_line():
    clock = FakeClock()
    lines: list[str] = []
    logger = LogLines(lines.append, every=30.0, clock=clock)
    progress = Progress("gate", total=600, interval=1.0, clock=clock, observers=[logger])
    for _ in range(600):
        clock.now += 0.5  # 300 s
        progress.advance(done=1, tokens=100, cost_usd=0.001)
    progress.close()
    assert 10 <= len(lines) <= 12
    assert lines[-1].startswith("gate: 600/600 (100.0%), 600 done, 0 failed")
    assert "took 5m00s" in lines[-1]
    assert "$0.6000 spent" in lines[-1]
    middle = lines[len(lines) // 2]
    assert "left" in middle and "tok/min" in middle and "projected" in middle


def test_terminal_view_shows_every_number_and_the_final_state():
    console = Console(record=True, force_terminal=True, width=120, file=io.StringIO())
    clock = FakeClock()
    view = TerminalView(console)
    progress = Progress("infer", total=2000, interval=0.5, clock=clock, observers=[view])
    clock.now += 30.0
    progress.set(done=1000, failed=7, in_flight=120, tokens=500_000, cost_usd=2.5)
    clock.now += 30.0
    progress.set(done=1500, failed=9, in_flight=100, tokens=750_000, cost_usd=3.75)
    view.stop()
    text = console.export_text()
    for header in ("done", "failed", "in flight", "req/min", "tok/min", "spent $",
                   "projected $", "left"):
        assert header in text
    assert "1,509/2,000" in text and "1,500" in text
    assert "3.7500" in text  # spent
    # Projected: $3.75 over 1,509 paid requests, 491 to go.
    assert f"{3.75 + 3.75 / 1509 * 491:,.4f}" in text


def test_live_progress_is_quiet_but_logs_when_not_a_terminal():
    out = io.StringIO()
    console = Console(file=out, force_terminal=False)
    with live_progress("reconstruct", total=5, console=console, log_every=3600) as progress:
        for _ in range(5):
            progress.advance(done=1, tokens=10)
    lines = out.getvalue().splitlines()
    # The first line when it starts, the final one: no repainting, no control codes.
    assert len(lines) <= 2
    assert lines[-1].startswith("reconstruct: 5/5 (100.0%), 5 done")
    assert "\x1b" not in out.getvalue()


def test_stages_published_in_the_process_show_on_one_board():
    from specregen.progress import Board, publish, subscribed

    clock = FakeClock()
    console = Console(record=True, force_terminal=True, width=140, file=io.StringIO())
    board = Board(console, interval=0.5, clock=clock)
    gate_a = Progress("gate A", total=100, clock=clock, interval=0.0, observers=[publish],
                      names=("accepted", "quarantined"))
    infer_b = Progress("infer B", total=50, clock=clock, interval=0.0, observers=[publish])
    with subscribed(board):
        clock.now += 1.0
        gate_a.advance(done=40, failed=2)
        clock.now += 1.0
        infer_b.set(done=10, in_flight=20, cost_usd=0.1)
        gate_a.close()
    board.stop()
    infer_b.advance(done=1)  # after the block: nobody listens, nothing breaks
    text = console.export_text()
    assert "gate A" in text and "infer B" in text
    assert "42/100" in text and "10/50" in text
    assert board.states["gate A"].final


def test_board_in_logs_prints_only_the_stages_that_moved():
    from specregen.progress import Board

    clock = FakeClock()
    out = io.StringIO()
    board = Board(Console(file=out, force_terminal=False), every=10.0, clock=clock)
    a = Progress("a", total=10, clock=clock, interval=0.0, observers=[board])
    b = Progress("b", total=10, clock=clock, interval=0.0, observers=[board])
    a.advance(done=1)  # first call shows at once
    b.advance(done=1)  # within the interval: held back
    clock.now += 11
    b.advance(done=1)
    lines = out.getvalue().splitlines()
    assert [line.split(":")[0] for line in lines] == ["a", "b"]
    assert lines[1].startswith("b: 2/10")


def test_the_final_state_gives_averages_over_the_whole_stage():
    clock = FakeClock()
    progress = Progress("gate", total=300, clock=clock)
    clock.now += 0.5  # a short stage: no trailing window worth the name
    progress.advance(done=300, tokens=3000)
    assert progress.state().requests_per_min == 0.0
    final = progress.close()
    assert abs(final.requests_per_min - 36_000.0) < 1e-6
    assert abs(final.tokens_per_min - 360_000.0) < 1e-6


def test_the_inference_engine_feeds_progress_through_its_snapshots(tmp_path):
    import asyncio

    from specregen.client.engine import run_inference
    from specregen.progress import engine_observer
    from specregen.store.rawlog import RawLog
    from tests.unit.test_client_support import (
        SECRET_KEY,
        FakeServer,
        completion,
        make_cfg,
        make_prompts,
        ok_handler,
    )

    body = completion(usage={"prompt_tokens": 10, "completion_tokens": 7, "cost": 0.002})
    server = FakeServer(ok_handler(delay=0.01, body=body))
    seen = []
    progress = Progress("infer", total=30, interval=0.0, observers=[seen.append])

    async def main():
        async with RawLog(tmp_path) as log:
            return await run_inference(make_prompts(30), make_cfg(), log, api_key=SECRET_KEY,
                                       transport=server.transport,
                                       progress=engine_observer(progress),
                                       progress_interval=0.01)

    summary = asyncio.run(main())
    final = progress.close()
    assert (final.done, final.failed, final.remaining) == (30, 0, 0)
    assert abs(final.cost_usd - summary.cost_usd) < 1e-12 and abs(final.cost_usd - 0.06) < 1e-9
    assert final.projected_cost_usd == final.cost_usd
    assert final.tokens == summary.completion_tokens == 30 * 7
    # While it ran, some snapshots saw requests in flight.
    assert any(s.in_flight > 0 for s in seen[:-1])


def test_a_broken_view_is_dropped_and_the_stage_goes_on(caplog):
    seen = []

    def broken(_state):
        raise ConnectionError("the Prefect API went away")

    progress = Progress("gate", total=3, interval=0.0, observers=[broken, seen.append])
    for _ in range(3):
        progress.advance(done=1)
    progress.close()
    assert len(seen) == 4 and seen[-1].final
    assert progress.observers == [seen.append]
    assert sum("failed and is dropped" in r.getMessage() for r in caplog.records) == 1
