"""Live sweep progress: a rich table on a terminal, plain log lines otherwise (cron, CI, pipes)."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from rich.console import Console
from rich.live import Live
from rich.table import Table


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


class Progress:
    def __init__(self, mode: str = "auto", console: Console | None = None):
        self.console = console or Console(stderr=False)
        self.rich = mode == "rich" or (mode == "auto" and sys.stdout.isatty())
        self.rows: dict[str, Row] = {}
        self.t0 = time.monotonic()
        self.live: Live | None = None

    def __enter__(self) -> Progress:
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
        old = row.state
        for k, v in kw.items():
            setattr(row, k, v)
        if self.live:
            self.live.update(self._table())
        elif row.state != old or row.state in ("done", "failed", "infeasible"):
            extra = f" loss={row.loss:.4f}" if row.loss == row.loss else ""
            note = f" ({row.note})" if row.note else ""
            print(f"[{self._elapsed()}] {row.label}: {row.state}{extra}{note}", flush=True)

    def _elapsed(self) -> str:
        s = int(time.monotonic() - self.t0)
        return f"{s // 60:02d}:{s % 60:02d}"

    def _eta(self) -> str:
        done = sum(r.state in ("done", "failed", "infeasible", "invalid", "skipped") for r in self.rows.values())
        total = len(self.rows)
        if not done or done == total:
            return "-"
        s = int((time.monotonic() - self.t0) / done * (total - done))
        return f"{s // 60:02d}:{s % 60:02d}"

    def _table(self) -> Table:
        t = Table(title=f"sweep  elapsed {self._elapsed()}  eta {self._eta()}", expand=False)
        for c in ("trial", "state", "step", "loss", "tokens/s", "retries", "note"):
            t.add_column(c)
        colors = {"running": "cyan", "done": "green", "failed": "red", "infeasible": "yellow", "invalid": "red"}
        for r in self.rows.values():
            t.add_row(
                r.label,
                f"[{colors.get(r.state, 'white')}]{r.state}[/]",
                f"{r.step}/{r.steps}" if r.state == "running" else "",
                f"{r.loss:.4f}" if r.loss == r.loss else "",
                f"{r.tokens_per_s:,.0f}" if r.tokens_per_s else "",
                str(r.retries or ""),
                r.note[:60],
            )
        return t
