"""Progress on the terminal for a long wait: the sweep's trials, the AOT compile pool (and any other: a `Bar`
counts items towards a total). Each display keeps its tasks in one rich.progress.Progress, drawn live on an
interactive terminal, or written as log lines stamped with the time since it opened (cron, CI, pipes), under
one auto | rich | plain choice and one clock."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Self

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, Task, TaskID, TextColumn
from rich.table import Column, Table
from rich.text import Text

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


def clock(seconds: float) -> str:
    """mm:ss, h:mm:ss from an hour on: every elapsed time and estimate shown."""
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60:02d}:{s % 60:02d}"


class Cell(ProgressColumn):
    """A column with a header whose cell is one value of the task, as text (never read as rich markup)."""

    def __init__(self, header: str, value: Callable[[Task], str | Text]):
        super().__init__(table_column=Column(header=header))
        self.value = value

    def render(self, task: Task) -> Text:
        got = self.value(task)
        return got if isinstance(got, Text) else Text(got)


def elapsed_column() -> Cell:
    """The time a task has run (since it started, up to when it stopped), on the one clock."""
    return Cell("elapsed", lambda task: "" if task.elapsed is None else clock(task.elapsed))


class Display:
    """One long wait. Its tasks live in a rich Progress (`progress_class`, on `console`, timed by `get_time`),
    drawn live when `mode` is rich, or auto on an interactive terminal; otherwise `line` writes `[mm:ss] text`
    lines."""

    def __init__(
        self,
        columns: Sequence[ProgressColumn],
        mode: str = "auto",
        console: Console | None = None,
        progress_class: type[Progress] = Progress,
        get_time: Callable[[], float] | None = None,
        **progress: Any,
    ):
        self.console = console or Console()
        self.rich = mode == "rich" or (mode == "auto" and self.console.is_interactive)
        self.progress = progress_class(
            *columns,
            console=self.console,
            refresh_per_second=4,
            disable=not self.rich,
            get_time=get_time,  # None: the console's, time.monotonic
            **progress,
        )
        self.whole = self.progress.add_task("elapsed", visible=False)  # started now: the display's clock

    def __enter__(self) -> Self:
        self.progress.start()  # a no-op unless rich
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def task(self, task_id: TaskID) -> Task:
        return self.progress.tasks[task_id]  # ids count from 0 in order of adding, and none is removed

    def elapsed(self) -> str:
        return clock(self.task(self.whole).elapsed or 0.0)

    def line(self, text: str) -> None:
        """Plain mode: one log line, stamped with the time since the display opened."""
        if not self.rich:
            self.console.print(
                f"[{self.elapsed()}] {text}", markup=False, highlight=False, emoji=False, soft_wrap=True
            )


class Bar(Display):
    """Items done towards a total: `title`, a bar, done/total, `counts` (a line of the caller's counts) and
    the time so far; in plain mode a line per item, `tag: done/total what`."""

    def __init__(
        self,
        title: str,
        tag: str,
        total: int,
        mode: str = "auto",
        console: Console | None = None,
        get_time: Callable[[], float] | None = None,
    ):
        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[counts]}"),
            elapsed_column(),
        )
        super().__init__(columns, mode, console, get_time=get_time)
        self.tag = tag
        self.bar = self.progress.add_task(title, total=total, counts="")

    @property
    def done(self) -> int:
        return int(self.task(self.bar).completed)

    @property
    def total(self) -> int:
        return int(self.task(self.bar).total or 0)

    def say(self, text: str) -> None:
        self.line(f"{self.tag}: {text}")

    def counts(self, text: str) -> None:
        self.progress.update(self.bar, counts=text)

    def advance(self, what: str, counts: str = "") -> None:
        """One item done (`what`: which, and how it went)."""
        self.progress.update(self.bar, advance=1, counts=counts)
        self.say(f"{self.done}/{self.total} {what}")


class CompileBar(Bar):
    """Compiles done / total, cache hits, failed, and running (submitted and not back: Ray may still hold one
    of them for memory)."""

    def __init__(
        self,
        total: int,
        slots: int,
        mode: str = "auto",
        console: Console | None = None,
        get_time: Callable[[], float] | None = None,
    ):
        super().__init__("aot compiles", "aot", total, mode, console, get_time)
        self.slots = slots
        self.hits = self.failed = self.running = 0
        self.counts(self._counts())

    def __enter__(self) -> Self:
        super().__enter__()
        self.say(f"{self.total} to compile, {self.slots} at once")
        return self

    def __exit__(self, *exc) -> None:
        self.say(f"done: {self._counts()}")
        super().__exit__(*exc)

    def _counts(self) -> str:
        return f"{self.hits} cache hits  {self.failed} failed  {self.running} running"

    def set_running(self, n: int) -> None:
        self.running = n
        self.counts(self._counts())

    def finished(self, label: str, what: str, failed: bool, hit: bool) -> None:
        """One compile back (`what`: its outcome in words): counted, and in plain mode a line saying so."""
        self.hits += hit
        self.failed += failed
        self.running = max(self.running - 1, 0)
        self.advance(f"{label}: {what}  [{self._counts()}]", self._counts())


def _state(task: Task) -> Text:
    state = task.fields["state"]
    return Text(state, style=COLORS.get(state, "white"))


def _steps(task: Task) -> str:
    return f"{int(task.completed)}/{int(task.total or 0)}"


def _step(task: Task) -> str:
    return _steps(task) if task.fields["state"] == "running" else ""


def _loss(task: Task) -> str:
    return f"{task.fields['loss']:.4f}" if task.fields["loss"] == task.fields["loss"] else ""


def _tokens_per_s(task: Task) -> str:
    return f"{task.fields['tokens_per_s']:,.0f}" if task.fields["tokens_per_s"] else ""


def sweep_columns() -> tuple[ProgressColumn, ...]:
    return (
        Cell("trial", lambda task: task.description),
        Cell("state", _state),
        Cell("step", _step),
        Cell("loss", _loss),
        Cell("tokens/s", _tokens_per_s),
        elapsed_column(),
        Cell("retries", lambda task: str(task.fields["retries"] or "")),
        Cell("note", lambda task: task.fields["note"][:70]),
    )


class _TitledTable(Progress):
    """The tasks as a table with a header row, under a title line (`title` of the tasks, at each refresh)."""

    def __init__(self, *columns: ProgressColumn, title: Callable[[list[Task]], str], **kw: Any):
        self.title = title  # before rich's constructor, which renders once
        super().__init__(*columns, **kw)

    def make_tasks_table(self, tasks: list[Task]) -> Table:
        columns = (c.get_table_column().copy() for c in self.columns)
        table = Table(*columns, title=self.title(tasks) if tasks else None, expand=False)
        for task in tasks:
            if task.visible:
                table.add_row(*(column(task) for column in self.columns))
        return table


class SweepProgress(Display):
    """The sweep's table: one row per trial (state, step, loss, tokens/s, time, retries, note), under the
    sweep's elapsed time, rich's estimate of the time left and the number of trials in each state."""

    def __init__(
        self, mode: str = "auto", console: Console | None = None, get_time: Callable[[], float] | None = None
    ):
        # the estimate's rate: over the whole sweep (a long compile between steps slows it, as it should)
        super().__init__(
            sweep_columns(),
            mode,
            console,
            _TitledTable,
            get_time,
            title=self._title,
            speed_estimate_period=float("inf"),
        )
        self.progress.update(self.whole, total=1.0)  # the sweep's fraction done (_estimate)
        self.keys: dict[str, TaskID] = {}

    def add(self, key: str, label: str, steps: int, state: str = "queued", note: str = "") -> None:
        self.keys[key] = self.progress.add_task(
            label,
            total=steps,
            start=False,
            state=state,
            loss=float("nan"),
            tokens_per_s=0.0,
            retries=0,
            note=note,
            last_print=0.0,
        )

    def update(self, key: str, **kw) -> None:
        """Set a trial's figures (state, step, loss, tokens_per_s, retries, note); in plain mode a line for a
        new state, and for a step at most every PLAIN_STEP_EVERY_S."""
        tid = self.keys[key]
        task = self.task(tid)
        old, old_step = task.fields["state"], task.completed
        step = kw.pop("step", None)
        self.progress.update(tid, completed=step, **kw)
        state = task.fields["state"]
        if state in ("starting", "queued") and old != state:  # a new attempt: its clock starts when it runs
            self.progress.update(tid, completed=0, tokens_per_s=0.0)
            task.start_time = task.stop_time = None
        if state == "running" and task.start_time is None:
            self.progress.start_task(tid)
        if state in TERMINAL and task.start_time is not None and task.stop_time is None:
            self.progress.stop_task(tid)
        self._estimate()
        if state != old or state in TERMINAL[:3]:
            note = task.fields["note"]
            self._say(task, f"{state}{self._figures(task)}" + (f" ({note})" if note else ""))
        elif task.completed != old_step and self._since_said(task) >= PLAIN_STEP_EVERY_S:
            self._say(task, f"step {_steps(task)}{self._figures(task)}")

    def event(self, key: str, text: str) -> None:
        """Something worth a line of its own (where a trial landed, a retry): the note in the table."""
        tid = self.keys[key]
        self.progress.update(tid, note=text)
        self._say(self.task(tid), text)

    def _since_said(self, task: Task) -> float:
        return self.progress.get_time() - task.fields["last_print"]

    def _say(self, task: Task, text: str) -> None:
        if not self.rich:
            task.fields["last_print"] = self.progress.get_time()
            self.line(f"{task.description}: {text}")

    @staticmethod
    def _figures(task: Task) -> str:
        loss, tokens_per_s = task.fields["loss"], task.fields["tokens_per_s"]
        out = f" loss={loss:.4f}" if loss == loss else ""
        return out + (
            f" {tokens_per_s:,.0f} tok/s" if tokens_per_s and task.fields["state"] == "running" else ""
        )

    def _trials(self) -> list[Task]:
        return [t for t in self.progress.tasks if t.id != self.whole]

    def _estimate(self) -> None:
        """The sweep's fraction done, as the clock task's progress (rich estimates the time left from its
        rate): finished trials and running trials' step fraction, over the trials that run (those ruled out
        before they started do not count)."""
        ruled_out = ("invalid", "skipped", "infeasible")
        todo = [t for t in self._trials() if t.fields["state"] not in ruled_out or t.started]
        done = sum(1.0 if t.fields["state"] in TERMINAL else t.percentage / 100 for t in todo)
        self.progress.update(self.whole, completed=done / len(todo) if todo else 0.0)

    def _eta(self) -> str:
        whole = self.task(self.whole)
        left = whole.time_remaining
        return "-" if left is None or whole.finished else clock(left)

    def _title(self, tasks: list[Task]) -> str:  # drawn once the display has opened: tasks are there
        counts: dict[str, int] = {}
        for t in self._trials():
            counts[t.fields["state"]] = counts.get(t.fields["state"], 0) + 1
        summary = "  ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        return f"sweep  elapsed {self.elapsed()}  eta {self._eta()}  |  {summary}"
