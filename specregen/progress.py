"""Live progress of a stage: done / in flight / failed, rates, spend and what is left.

A stage owns a `Progress` and updates its counters (`advance` per item, or `set` from a
snapshot of the inference engine). Observers are plain callables taking a `ProgressState`; they
are called at most once per `interval` seconds and once more when the stage ends, so the cost of
watching does not grow with the item rate. Two observers come with it: `TerminalView` (a rich
live panel, for a terminal) and `LogLines` (one summary line per interval, for logs and pipes);
`live_progress` picks between them the way a person expects: live in a terminal, quiet otherwise.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

Observer = Callable[["ProgressState"], Any]
log = logging.getLogger(__name__)

# Rates are measured over this trailing window, so a stall shows within it.
RATE_WINDOW_S = 20.0


@dataclass(frozen=True, slots=True)
class ProgressState:
    """What a stage has done so far; rates are per minute over the trailing window."""

    stage: str
    total: int | None
    done: int
    failed: int
    in_flight: int
    skipped: int
    tokens: int
    cost_usd: float
    elapsed_s: float
    requests_per_min: float
    tokens_per_min: float
    final: bool = False
    # What "done" and "failed" mean for this stage, e.g. ("accepted", "quarantined").
    names: tuple[str, str] = ("done", "failed")

    @property
    def finished(self) -> int:
        return self.done + self.failed + self.skipped

    @property
    def remaining(self) -> int | None:
        if self.total is None:
            return None
        return max(0, self.total - self.finished)

    @property
    def fraction(self) -> float | None:
        if not self.total:
            return None
        return min(1.0, self.finished / self.total)

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the current rate; None while it cannot be known."""
        remaining = self.remaining
        if remaining is None:
            return None
        if remaining == 0:
            return 0.0
        if self.requests_per_min <= 0:
            return None
        return remaining / self.requests_per_min * 60.0

    @property
    def projected_cost_usd(self) -> float | None:
        """Spend at the end if the rest costs what the finished requests cost on average."""
        paid = self.done + self.failed
        remaining = self.remaining
        if remaining is None:
            return None
        if remaining == 0:
            return self.cost_usd
        if paid == 0:
            return None
        return self.cost_usd + self.cost_usd / paid * remaining


@dataclass
class Progress:
    """Counters of one stage and the observers watching it."""

    stage: str
    total: int | None = None
    interval: float = 1.0
    observers: list[Observer] = field(default_factory=list)
    clock: Callable[[], float] = time.monotonic
    done: int = 0
    failed: int = 0
    in_flight: int = 0
    skipped: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    names: tuple[str, str] = ("done", "failed")

    def __post_init__(self) -> None:
        self.started = self.clock()
        self._last_emit = self.started
        self._window: deque[tuple[float, int, int]] = deque([(self.started, 0, 0)])
        self._closed = False

    def subscribe(self, observer: Observer) -> None:
        self.observers.append(observer)

    def advance(
        self, *, done: int = 0, failed: int = 0, skipped: int = 0, tokens: int = 0,
        cost_usd: float = 0.0,
    ) -> None:
        self.done += done
        self.failed += failed
        self.skipped += skipped
        self.tokens += tokens
        self.cost_usd += cost_usd
        self.tick()

    def set(self, **values: Any) -> None:
        """Absolute counters, e.g. from an engine snapshot (`done=`, `in_flight=`, ...)."""
        for name, value in values.items():
            if name not in _COUNTERS:
                raise TypeError(f"Progress has no counter {name!r}")
            if value is not None:
                setattr(self, name, value)
        self.tick()

    def tick(self) -> None:
        """Tell the observers, when an interval has passed since they were last told."""
        if self.observers and self.clock() - self._last_emit >= self.interval:
            self.emit()

    def emit(self, *, final: bool = False) -> ProgressState:
        state = self.state(final=final)
        self._last_emit = self.clock()
        for observer in list(self.observers):
            try:
                observer(state)
            except Exception:
                # Watching must never stop the work: a broken view (a closed terminal, an
                # unreachable Prefect API) is dropped, said once, and the stage goes on.
                log.warning("progress view %r failed and is dropped; the %s stage goes on",
                            observer, self.stage, exc_info=True)
                self.observers.remove(observer)
        return state

    def close(self) -> ProgressState:
        """The last state, sent to every observer once (closing twice sends nothing new)."""
        if self._closed:
            return self.state(final=True)
        self._closed = True
        self.in_flight = 0
        return self.emit(final=True)

    def state(self, *, final: bool = False) -> ProgressState:
        now = self.clock()
        finished = self.done + self.failed + self.skipped
        # Skipped items cost no time: rates count what was worked on.
        worked = self.done + self.failed
        window = self._window
        window.append((now, worked, self.tokens))
        while len(window) > 2 and now - window[1][0] >= RATE_WINDOW_S:
            window.popleft()
        then, worked_then, tokens_then = window[0]
        if final:  # the last word: averages over the whole stage
            then, worked_then, tokens_then = self.started, 0, 0
        span = now - then
        # Under a second of history a rate is noise (a burst of 10 reads as 36,000 a minute),
        # unless the stage is over and that second was all of it.
        per_min = 60.0 / span if span >= 1.0 or (final and span > 0) else 0.0
        return ProgressState(
            stage=self.stage,
            total=self.total if self.total is not None else (finished if final else None),
            done=self.done,
            failed=self.failed,
            in_flight=self.in_flight,
            skipped=self.skipped,
            tokens=self.tokens,
            cost_usd=self.cost_usd,
            elapsed_s=now - self.started,
            requests_per_min=(worked - worked_then) * per_min,
            tokens_per_min=(self.tokens - tokens_then) * per_min,
            final=final,
            names=self.names,
        )


_COUNTERS = frozenset({"done", "failed", "in_flight", "skipped", "tokens", "cost_usd", "total"})


# --- rendering ----------------------------------------------------------------------------------


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def format_line(state: ProgressState) -> str:
    """One plain line with every number, for logs."""
    of = f"/{state.total:,}" if state.total is not None else ""
    share = f" ({state.fraction:.1%})" if state.fraction is not None else ""
    done, failed = state.names
    parts = [
        f"{state.stage}: {state.finished:,}{of}{share}",
        f"{state.done:,} {done}",
        f"{state.failed:,} {failed}",
        f"{state.in_flight:,} in flight",
    ]
    if state.skipped:
        parts.append(f"{state.skipped:,} skipped")
    parts.append(f"{state.requests_per_min:,.0f}/min")
    if state.tokens:
        parts.append(f"{state.tokens_per_min:,.0f} tok/min")
    if state.cost_usd or state.projected_cost_usd:
        projected = state.projected_cost_usd
        parts.append(f"${state.cost_usd:,.4f} spent"
                     + (f", ~${projected:,.4f} projected" if projected is not None else ""))
    if state.final:
        parts.append(f"took {format_duration(state.elapsed_s)}")
    else:
        parts.append(f"{format_duration(state.eta_s)} left")
    return ", ".join(parts)


def render(state: ProgressState) -> Any:
    """The rich renderable of a state: a bar and a table of the numbers."""
    from rich.console import Group
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    projected = state.projected_cost_usd
    cells = {
        "finished": f"{state.finished:,}"
        + (f"/{state.total:,}" if state.total is not None else ""),
        state.names[0]: f"{state.done:,}",
        state.names[1]: f"[red]{state.failed:,}[/red]" if state.failed else "0",
        "in flight": f"{state.in_flight:,}",
        "req/min": f"{state.requests_per_min:,.0f}",
        "tok/min": f"{state.tokens_per_min:,.0f}",
        "spent $": f"{state.cost_usd:,.4f}",
        "projected $": f"{projected:,.4f}" if projected is not None else "?",
        "elapsed": format_duration(state.elapsed_s),
        "left": "done" if state.final else format_duration(state.eta_s),
    }
    if not state.cost_usd:  # a stage that pays nothing: no money columns
        del cells["spent $"], cells["projected $"]
    table = Table(box=None, show_header=True, header_style="bold", pad_edge=False)
    for name in cells:
        table.add_column(name, justify="right")
    table.add_row(*cells.values())
    fraction = state.fraction
    title = Text(f"{state.stage}" + (f"  {fraction:.1%}" if fraction is not None else ""),
                 style="bold")
    bar = ProgressBar(total=1.0 if fraction is not None else None,
                      completed=fraction or 0.0, width=50)
    # A grid row ends its line; a bare ProgressBar does not, and the table would run on.
    head = Table.grid(padding=(0, 2))
    head.add_row(bar, title)
    return Group(head, table)


class TerminalView:
    """A live panel on a terminal console, repainted only when told (no refresh thread)."""

    def __init__(self, console: Any) -> None:
        from rich.live import Live

        self.console = console
        self.live = Live(console=console, auto_refresh=False, transient=False)
        self.started = False

    def __call__(self, state: ProgressState) -> None:
        if not self.started:
            self.live.start()
            self.started = True
        self.live.update(render(state), refresh=True)

    def stop(self) -> None:
        if self.started:
            self.live.stop()
            self.started = False


class LogLines:
    """One summary line per `every` seconds (and the final one), through `write`."""

    def __init__(self, write: Callable[[str], Any], every: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.write = write
        self.every = every
        self.clock = clock
        self._last: float | None = None

    def __call__(self, state: ProgressState) -> None:
        now = self.clock()
        if state.final or self._last is None or now - self._last >= self.every:
            self._last = now
            self.write(format_line(state))


def count_lines(path: str | Any) -> int | None:
    """Non-empty lines of a local file (the total of a JSONL input), or None when it is not
    a local file (a folder, a URL): the total is then unknown, not guessed."""
    from pathlib import Path

    try:
        target = Path(path)
        if not target.is_file():
            return None
        with target.open("rb") as handle:
            return sum(1 for line in handle if line.strip())
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def live_progress(
    stage: str,
    total: int | None = None,
    *,
    console: Any = None,
    log_every: float = 30.0,
    interval: float | None = None,
    observers: tuple[Observer, ...] = (),
    names: tuple[str, str] = ("done", "failed"),
) -> Iterator[Progress]:
    """A Progress shown live when `console` is a terminal, else logged one line per interval.

    The final state is always shown, also when the stage raises.
    """
    from rich.console import Console

    console = console if console is not None else Console(stderr=True)
    view: TerminalView | None = None
    if console.is_terminal:
        view = TerminalView(console)
        watcher: Observer = view
    else:
        watcher = LogLines(lambda line: print(line, file=console.file or sys.stderr, flush=True),
                           every=log_every)
    rate = interval if interval is not None else (0.5 if view is not None else 1.0)
    progress = Progress(stage, total=total, interval=rate, observers=[watcher, *observers],
                        names=names)
    try:
        yield progress
    finally:
        progress.close()
        if view is not None:
            view.stop()


def parquet_rows(path: Any) -> int | None:
    """Rows of a parquet file from its footer (no data read), or None when unreadable."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path).metadata.num_rows
    except (OSError, pa.ArrowException, ValueError, TypeError):
        return None


def engine_observer(progress: Progress) -> Callable[[Any], None]:
    """A callback for the inference engine's snapshots (`client.engine.ProgressSnapshot`)
    that feeds `progress`; its counters are absolute, so a missed snapshot loses nothing."""

    def observe(snap: Any) -> None:
        # A whole conversation is one item: done when it stopped (a failed request stops it
        # with `error`, so it is not also failed); single-turn answers count one each.
        conversation_answers = getattr(snap, "conversation_requests_done", 0)
        whole = getattr(snap, "conversations", 0) > 0
        progress.set(done=snap.done - conversation_answers + getattr(snap, "conversations_done", 0),
                     failed=0 if whole else snap.failed, in_flight=snap.in_flight,
                     skipped=snap.skipped, cost_usd=snap.cost_usd,
                     tokens=getattr(snap, "completion_tokens", None))

    return observe


# --- many stages at once (`specregen run`) -------------------------------------------------------
# Stages running in this process (Prefect tasks of a local flow run) publish their states here;
# the command that started the run shows them all, one row per stage.
_SUBSCRIBERS: list[Observer] = []


def publish(state: ProgressState) -> None:
    """An observer that hands a stage's state to whoever watches this process's stages."""
    for subscriber in list(_SUBSCRIBERS):
        subscriber(state)


@contextlib.contextmanager
def subscribed(observer: Observer) -> Iterator[None]:
    _SUBSCRIBERS.append(observer)
    try:
        yield
    finally:
        _SUBSCRIBERS.remove(observer)


class Board:
    """The latest state of every stage, one table row each; shown live on a terminal, else as
    one line per stage and interval. Thread-safe enough: a dict update per state."""

    def __init__(self, console: Any, *, every: float = 30.0, interval: float = 0.5,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.console = console
        self.states: dict[str, ProgressState] = {}
        self.clock = clock
        self.interval = interval if console.is_terminal else every
        self._last = -float("inf")
        self._live: Any = None
        self._changed: set[str] = set()

    def __call__(self, state: ProgressState) -> None:
        self.states[state.stage] = state
        self._changed.add(state.stage)
        now = self.clock()
        if state.final or now - self._last >= self.interval:
            self._last = now
            self.show()

    def table(self) -> Any:
        from rich.table import Table

        table = Table(box=None, header_style="bold", pad_edge=False)
        for name in ("stage", "finished", "done", "failed", "in flight", "req/min", "tok/min",
                     "spent $", "projected $", "left"):
            table.add_column(name, justify="left" if name == "stage" else "right")
        for s in self.states.values():
            projected = s.projected_cost_usd
            table.add_row(
                s.stage, f"{s.finished:,}" + (f"/{s.total:,}" if s.total is not None else ""),
                f"{s.done:,}", f"{s.failed:,}", f"{s.in_flight:,}", f"{s.requests_per_min:,.0f}",
                f"{s.tokens_per_min:,.0f}", f"{s.cost_usd:,.4f}",
                f"{projected:,.4f}" if projected is not None else "?",
                "done" if s.final else format_duration(s.eta_s))
        return table

    def show(self) -> None:
        if not self.console.is_terminal:
            # Logs: a line for each stage that moved since the last lines.
            for name in [n for n in self.states if n in self._changed]:
                print(format_line(self.states[name]), file=self.console.file, flush=True)
            self._changed.clear()
            return
        if self._live is None:
            from rich.live import Live

            self._live = Live(console=self.console, auto_refresh=False)
            self._live.start()
        self._live.update(self.table(), refresh=True)

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


@contextlib.contextmanager
def watching_stages(console: Any = None) -> Iterator[Board]:
    """Show every stage that publishes in this process while the block runs."""
    from rich.console import Console

    board = Board(console if console is not None else Console(stderr=True))
    try:
        with subscribed(board):
            yield board
    finally:
        board.stop()
