"""Progress on the terminal: the live sweep table and the AOT compile pool's bar (rich on a terminal, plain log
lines otherwise: cron, CI, pipes), under one auto | rich | plain choice."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as Bar
from rich.table import Table

TERMINAL = ("done", "failed", "infeasible", "invalid", "skipped", "cancelled")
COLORS = {
    "running": "cyan",
    "starting": "cyan",
    "done": "green",
    "failed": "red",
    "invalid": "red",
    "infeasible": "yellow",
    "cancelled": "magenta",
    "skipped": "dim",
}
PLAIN_STEP_EVERY_S = 30.0  # plain mode: a step line per trial at most this often (cron logs stay short)


def _clock(s: float) -> str:
    s = int(s)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60:02d}:{s % 60:02d}"


@dataclass
class Row:
    label: str
    state: str = "queued"
    step: int = 0
    steps: int = 0
    loss: float = float("nan")
    tokens_per_s: float = 0.0
    retries: int = 0
    note: str = ""
    started: float | None = None  # monotonic time the current attempt started running
    ended: float | None = None
    last_print: float = 0.0


class SweepProgress:
    """The sweep's live table: one row per trial (state, step, loss, tokens/s, time, retries, note)."""

    def __init__(self, mode: str = "auto", console: Console | None = None):
        self.console = console or Console(stderr=False)
        self.rich = mode == "rich" or (mode == "auto" and sys.stdout.isatty())
        self.rows: dict[str, Row] = {}
        self.t0 = time.monotonic()
        self.live: Live | None = None

    def __enter__(self) -> SweepProgress:
        if self.rich:
            self.live = Live(self._table(), console=self.console, refresh_per_second=4, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.live:
            self.live.update(self._table())
            self.live.__exit__(*exc)

    def add(self, key: str, label: str, steps: int, state: str = "queued", note: str = "") -> None:
        self.rows[key] = Row(label, state=state, steps=steps, note=note)

    def update(self, key: str, **kw) -> None:
        row = self.rows[key]
        old, old_step = row.state, row.step
        for k, v in kw.items():
            setattr(row, k, v)
        now = time.monotonic()
        if row.state in ("starting", "queued") and old != row.state:
            row.started, row.ended, row.step, row.tokens_per_s = None, None, 0, 0.0
        if row.state == "running" and row.started is None:
            row.started = now
        if row.state in TERMINAL and row.ended is None:
            row.ended = now
        if self.live:
            self.live.update(self._table())
        elif row.state != old or row.state in TERMINAL[:3]:
            self._print(row, f"{row.state}{self._figures(row)}{f' ({row.note})' if row.note else ''}")
        elif row.step != old_step and now - row.last_print >= PLAIN_STEP_EVERY_S:
            self._print(row, f"step {row.step}/{row.steps}{self._figures(row)}")

    def event(self, key: str, text: str) -> None:
        """Something worth a line of its own (where a trial landed, a retry): the note in the table."""
        row = self.rows[key]
        row.note = text
        if self.live:
            self.live.update(self._table())
        else:
            self._print(row, text)

    def _print(self, row: Row, text: str) -> None:
        row.last_print = time.monotonic()
        print(f"[{_clock(time.monotonic() - self.t0)}] {row.label}: {text}", flush=True)

    @staticmethod
    def _figures(row: Row) -> str:
        out = f" loss={row.loss:.4f}" if row.loss == row.loss else ""
        return out + (
            f" {row.tokens_per_s:,.0f} tok/s" if row.tokens_per_s and row.state == "running" else ""
        )

    def _eta(self) -> str:
        """Remaining time from the sweep's progress so far: finished trials plus running trials' step fraction."""
        todo = [
            r for r in self.rows.values() if r.state not in ("invalid", "skipped", "infeasible") or r.started
        ]
        if not todo:
            return "-"
        frac = sum(1.0 if r.state in TERMINAL else r.step / r.steps if r.steps else 0.0 for r in todo) / len(
            todo
        )
        if frac <= 0 or frac >= 1:
            return "-"
        return _clock((time.monotonic() - self.t0) * (1 - frac) / frac)

    def _table(self) -> Table:
        counts: dict[str, int] = {}
        for r in self.rows.values():
            counts[r.state] = counts.get(r.state, 0) + 1
        summary = "  ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        title = f"sweep  elapsed {_clock(time.monotonic() - self.t0)}  eta {self._eta()}  |  {summary}"
        t = Table(title=title, expand=False)
        for c in ("trial", "state", "step", "loss", "tokens/s", "elapsed", "retries", "note"):
            t.add_column(c)
        now = time.monotonic()
        for r in self.rows.values():
            t.add_row(
                r.label,
                f"[{COLORS.get(r.state, 'white')}]{r.state}[/]",
                f"{r.step}/{r.steps}" if r.state == "running" else "",
                f"{r.loss:.4f}" if r.loss == r.loss else "",
                f"{r.tokens_per_s:,.0f}" if r.tokens_per_s else "",
                _clock((r.ended or now) - r.started) if r.started else "",
                str(r.retries or ""),
                r.note[:70],
            )
        return t


class CompileBar:
    """Compiles done / total, cache hits, failed, and running (submitted and not back: Ray may still hold one
    of them for memory)."""

    def __init__(self, total: int, slots: int, mode: str = "auto", console: Console | None = None):
        self.total, self.slots = total, slots
        self.done = self.hits = self.failed = self.running = 0
        self.console = console or Console()
        self.rich = mode == "rich" or (mode == "auto" and sys.stdout.isatty())
        self.t0 = time.monotonic()
        self._bar: Bar | None = None
        self._task = None

    def __enter__(self) -> CompileBar:
        if self.rich:
            self._bar = Bar(
                TextColumn("aot compiles"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[counts]}"),
                TimeElapsedColumn(),
                console=self.console,
            )
            self._bar.__enter__()
            self._task = self._bar.add_task("aot", total=self.total, counts=self._counts())
        else:
            self._print(f"{self.total} to compile, {self.slots} at once")
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)
        else:
            self._print(f"done: {self._counts()}")

    def _counts(self) -> str:
        return f"{self.hits} cache hits  {self.failed} failed  {self.running} running"

    def _print(self, text: str) -> None:
        # on the bar's console (stderr where the caller keeps stdout for JSON), never as rich markup
        self.console.print(
            f"[{_clock(time.monotonic() - self.t0)}] aot: {text}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )

    def set_running(self, n: int) -> None:
        self.running = n
        if self._bar is not None:
            self._bar.update(self._task, counts=self._counts())

    def finished(self, label: str, what: str, failed: bool, hit: bool) -> None:
        """One compile back (`what`: its outcome in words): counted, and in plain mode a line saying so."""
        self.done += 1
        self.hits += hit
        self.failed += failed
        self.running = max(self.running - 1, 0)
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, counts=self._counts())
            return
        self._print(f"{self.done}/{self.total} {label}: {what}  [{self._counts()}]")
