"""The compile pool's progress: a rich bar on a terminal, one plain line per finished compile otherwise (cron, CI,
pipes); the auto | rich | plain choice of orchestrator.progress."""

from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from orchestrator.plan.aot.result import CompileResult


def _clock(s: float) -> str:
    s = int(s)
    return f"{s // 60:02d}:{s % 60:02d}"


class CompileBar:
    """Compiles done / total, cache hits, failed, and running (submitted and not back: Ray may still hold one
    of them for memory)."""

    def __init__(self, total: int, slots: int, mode: str = "auto", console: Console | None = None):
        self.total, self.slots = total, slots
        self.done = self.hits = self.failed = self.running = 0
        self.console = console or Console()
        self.rich = mode == "rich" or (mode == "auto" and sys.stdout.isatty())
        self.t0 = time.monotonic()
        self._bar: Progress | None = None
        self._task = None

    def __enter__(self) -> CompileBar:
        if self.rich:
            self._bar = Progress(
                TextColumn("aot compiles"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[counts]}"),
                TimeElapsedColumn(), console=self.console,
            )  # fmt: skip
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
        self.console.print(f"[{_clock(time.monotonic() - self.t0)}] aot: {text}", markup=False, highlight=False,
                           soft_wrap=True)  # fmt: skip

    def set_running(self, n: int) -> None:
        self.running = n
        if self._bar is not None:
            self._bar.update(self._task, counts=self._counts())

    def finished(self, label: str, got: CompileResult, hit: bool) -> None:
        """One compile back: counted, and in plain mode a line saying what it was."""
        self.done += 1
        self.hits += hit
        self.failed += got.status == "failed"
        self.running = max(self.running - 1, 0)
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, counts=self._counts())
            return
        self._print(f"{self.done}/{self.total} {label}: {self._what(got, hit)}  [{self._counts()}]")

    @staticmethod
    def _what(got: CompileResult, hit: bool) -> str:
        if hit:
            return f"{got.status} (cache hit)"
        return f"failed: {got.error}" if got.status == "failed" else f"{got.status} in {got.compile_s:.0f} s"
