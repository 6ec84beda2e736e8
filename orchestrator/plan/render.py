"""Tables for people: the plan (to fit the terminal, wide, or markdown) and the AOT comparison, cells formatted
in one place."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING, Any

from orchestrator.plan import memory
from orchestrator.plan.cost import total

if TYPE_CHECKING:
    from orchestrator.plan import PlanRow
    from orchestrator.plan.aot import Comparison

HEADER = [
    "cluster",
    "strategy",
    "mesh",
    "policy",
    "context",
    "verdict",
    "HBM/device",
    "step s",
    "step s band",
    "MFU",
    "MFU ≤ (roofline)",
    "TFLOP/dev",
    "chip-h",
    "reason",
]
VERDICT, AFTER_STEP, AFTER_HOURS = 5, 9, 13  # where the verdict is, and where the optional columns go
RIGHT = ("context", "step s", "step s band", "DCN s", "MFU", "MFU ≤ (roofline)", "chip-h", "cost")
# Every verdict, in the plan's order (orchestrator.plan.VERDICTS), with its colour.
COLOURS = {"run": "green", "infeasible": "yellow", "invalid": "red"}


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def seconds(v: float | None) -> str:
    """A step time: 3 significant figures below 100 s, whole seconds with thousands separators above."""
    if v is None:
        return "-"
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def band(low: float | None, high: float | None) -> str:
    return "-" if low is None or high is None else f"{seconds(low)}-{seconds(high)}"


def step_band(step: float | None, low: float | None, high: float | None) -> str:
    """'4,318 (3,670-4,966)': a step time and its band; the step alone where the cluster has no fitted band
    (low = high, as on cluster=local)."""
    if step is None:
        return "-"
    if low is None or high is None or low == high:
        return seconds(step)
    return f"{seconds(step)} ({band(low, high)})"


def mfu_band(value: float, low: float | None, high: float | None, digits: int = 2) -> str:
    """'0.27 (0.23-0.31)', or the MFU alone without a band."""
    if low is None or high is None or low == high:
        return f"{value:.{digits}f}"
    return f"{value:.{digits}f} ({low:.2f}-{high:.2f})"


def mfu(r: PlanRow) -> float | None:
    """The MFU a reader takes for one: with packed documents the useful one (their own attention), never the
    causal row's count, which a document mask lets exceed 1 (both are in the reason and the JSON)."""
    return r.useful_mfu if r.useful_mfu is not None else r.predicted_mfu


def roofline_mfu(r: PlanRow) -> float | None:
    """The roofline bound in the same FLOP count as `mfu`."""
    if r.roofline_mfu is None or r.useful_mfu is None or not r.predicted_mfu:
        return r.roofline_mfu
    return r.roofline_mfu * r.useful_mfu / r.predicted_mfu


def _cells(r: PlanRow, dcn: bool = False, cost: bool = False) -> list[str]:
    hbm = (
        memory.gib(r.predicted_hbm_bytes_per_device) if r.predicted_hbm_bytes_per_device is not None else "-"
    )
    cells = [
        r.cluster,
        r.strategy,
        r.mesh,
        r.policy,
        f"{r.context_length:,}",
        r.verdict,
        hbm,
        seconds(r.predicted_step_s),
        band(r.predicted_step_low_s, r.predicted_step_high_s),
        _num(mfu(r), ".2f"),
        _num(roofline_mfu(r), ".2f"),
        f"{r.tflops_per_device_per_step:,.4g}",
        _num(r.chip_hours, ",.3g"),
        r.reason,
    ]
    if cost:
        cells.insert(AFTER_HOURS, _num(r.cost, ",.2f"))
    if dcn:
        cells.insert(AFTER_STEP, _num(r.dcn_exposed_s, ",.3g"))
    return cells


def _header(rows: list[PlanRow]) -> tuple[list[str], bool, bool]:
    """The columns, with "DCN s" (exposed slice-crossing time) only when some point spans slices, and "cost"
    only when the cluster has a price."""
    dcn = any("/dcn:" in r.mesh for r in rows)
    cost = any(r.cost is not None for r in rows)
    header = list(HEADER)
    if cost:
        header.insert(AFTER_HOURS, "cost")
    if dcn:
        header.insert(AFTER_STEP, "DCN s")
    return header, dcn, cost


def summary(rows: list[PlanRow]) -> str:
    """The verdict counts and what the runnable points would cost."""
    counts = {v: sum(r.verdict == v for r in rows) for v in COLOURS}
    line = ", ".join(f"{n} {v}" for v, n in counts.items())
    hours = total(rows)
    money = sum(r.cost or 0.0 for r in rows if r.verdict == "run")
    line += f"; the runnable points: {hours:,.4g} chip-hours predicted"
    return line + (f", cost {money:,.2f}" if any(r.cost is not None for r in rows) else "")


def render_table(rows: list[PlanRow], console: Any = None, title: str = "plan", wide: bool = False) -> None:
    """Print the plan: every column in one rich table (`wide`), or to fit the console, a line of figures per
    point with its policy and reason on the lines below it."""
    from rich.console import Console

    console = console or Console()
    if wide:
        _wide(rows, console, title)
    else:
        _compact(rows, console, title)
    console.print(summary(rows), markup=False, highlight=False)


def _wide(rows: list[PlanRow], console: Any, title: str) -> None:
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    header, dcn, cost = _header(rows)
    for h in header:
        table.add_column(h, overflow="fold", justify="right" if h in RIGHT else "left")
    for r in rows:
        cells = [escape(c) for c in _cells(r, dcn, cost)]  # a policy's [names] are not markup
        cells[VERDICT] = f"[{COLOURS[r.verdict]}]{r.verdict}[/]"
        table.add_row(*cells)
    console.print(table)


COMPACT = ("strategy", "mesh", "context", "verdict", "HBM/dev", "step s (band)", "MFU")


def _compact(rows: list[PlanRow], console: Any, title: str) -> None:
    from rich.text import Text

    width = max(console.width, 40)
    lines = [
        [
            r.strategy,
            r.mesh,
            f"{r.context_length:,}",
            r.verdict,
            memory.gib(r.predicted_hbm_bytes_per_device)
            if r.predicted_hbm_bytes_per_device is not None
            else "-",
            step_band(r.predicted_step_s, r.predicted_step_low_s, r.predicted_step_high_s),
            _num(mfu(r), ".2f"),
        ]
        for r in rows
    ]
    heads, right = list(COMPACT), {2, 4, 5, 6}
    widths = [max(len(h), *(len(x[i]) for x in lines)) for i, h in enumerate(heads)]
    mesh_apart = sum(widths) + 2 * (len(widths) - 1) > width  # a long mesh label: on the detail line instead
    keep = [i for i in range(len(heads)) if not (mesh_apart and i == 1)]

    def fmt(cells: list[str]) -> str:
        return "  ".join(cells[i].rjust(widths[i]) if i in right else cells[i].ljust(widths[i]) for i in keep)

    several_models = len({r.model for r in rows}) > 1  # a sweep over models: each point's on its detail line
    clusters = ", ".join(sorted({r.cluster for r in rows}))
    console.print(f"{title} on {clusters} (every column: wide=true; all of it: output=json)", markup=False)
    console.print(Text(fmt(heads), style="bold"), soft_wrap=True)
    at = sum(widths[i] + 2 for i in keep if i < 3)  # where the verdict column starts
    for r, cells in zip(rows, lines, strict=True):
        line = Text(fmt(cells))
        line.stylize(COLOURS.get(r.verdict, ""), at, at + widths[3])
        console.print(line, soft_wrap=True)
        detail = [f"model {r.model}"] * several_models + [f"mesh {r.mesh}"] * mesh_apart
        detail += [f"policy {r.policy}"] if r.policy else []
        text = "; ".join([*detail, r.reason])
        for part in textwrap.wrap(text, width=width - 4, break_on_hyphens=False):
            console.print(f"    {part}", markup=False, highlight=False, style="dim", soft_wrap=True)


def to_markdown(rows: list[PlanRow]) -> str:
    header, dcn, cost = _header(rows)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in _cells(r, dcn, cost)) + " |" for r in rows]
    return "\n".join(lines)


def compiled_cell(r: Comparison) -> str:
    """memory_analysis's sum in GiB; "≥ N" where the compiler refused (N: what it said it needed)."""
    if r.compiled_bytes is None:
        return "-"
    return ("≥ " if r.status == "rejected" else "") + f"{r.compiled_bytes / 2**30:,.1f} GiB"


def peak_cell(r: Comparison) -> str:
    """The compiler's own peak; "-" for compiles cached before it was recorded, and for refusals."""
    if not r.result.compiler_peak_bytes:
        return "-"
    host = " (host)" if r.result.host_temp_bytes else ""  # arguments + pinned-host temporaries
    return f"{r.result.compiler_peak_bytes / 2**30:,.1f} GiB{host}"


def ratio_cell(r: Comparison) -> str:
    return f"{r.ratio:.2f}" if r.ratio is not None else "-"


def render_comparison(rows: list[Comparison], console: Any = None) -> None:
    """Print aot.compare's rows as a rich table: analytic vs compiled, the compiler's peak, the verdict."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title="analytic vs TPU-compiled memory per device")
    heads = "strategy mesh context remat topology analytic compiled compiler-peak ratio verdict reason"
    for h in heads.split():
        table.add_column(h, overflow="fold")
    for r in rows:
        table.add_row(
            r.strategy,
            r.mesh,
            f"{r.context_length:,}",
            r.remat,
            r.topology,
            f"{r.analytic_bytes / 2**30:,.1f} GiB",
            compiled_cell(r),
            peak_cell(r),
            ratio_cell(r),
            r.verdict,
            r.reason,
        )
    console.print(table)
