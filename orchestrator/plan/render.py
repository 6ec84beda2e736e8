"""Tables for people: the plan (rich or markdown) and the AOT comparison, cells formatted in one place."""

from __future__ import annotations

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
    "MFU",
    "MFU ≤ (roofline)",
    "TFLOP/dev",
    "chip-h",
    "reason",
]
VERDICT, AFTER_STEP, AFTER_HOURS = 5, 8, 12  # where the verdict is, and where the optional columns go
RIGHT = ("context", "step s", "DCN s", "MFU", "MFU ≤ (roofline)", "chip-h", "cost")
# Every verdict, in the plan's order (orchestrator.plan.VERDICTS), with its colour.
COLOURS = {"run": "green", "infeasible": "yellow", "invalid": "red"}


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


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
        _num(r.predicted_step_s, ",.3g"),
        _num(r.predicted_mfu, ".2f"),
        _num(r.roofline_mfu, ".2f"),
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


def render_table(rows: list[PlanRow], console: Any = None, title: str = "plan") -> None:
    """Print the plan as a rich table (verdicts coloured)."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title=title, show_lines=False)
    header, dcn, cost = _header(rows)
    for h in header:
        table.add_column(h, overflow="fold", justify="right" if h in RIGHT else "left")
    from rich.markup import escape

    for r in rows:
        cells = [escape(c) for c in _cells(r, dcn, cost)]  # a policy's [names] are not markup
        cells[VERDICT] = f"[{COLOURS[r.verdict]}]{r.verdict}[/]"
        table.add_row(*cells)
    console.print(table)
    console.print(summary(rows))


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
