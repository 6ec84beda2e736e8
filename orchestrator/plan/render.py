"""Tables for people: the plan (rich or markdown) and the AOT comparison, cells formatted in one place."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.plan import memory

if TYPE_CHECKING:
    from orchestrator.plan import PlanRow
    from orchestrator.plan.aot import Comparison

HEADER = [
    "cluster",
    "strategy",
    "mesh",
    "context",
    "verdict",
    "HBM/device",
    "step s",
    "MFU",
    "MFU ≤ (roofline)",
    "TFLOP/dev",
    "reason",
]
# Every verdict, in the plan's order (orchestrator.plan.VERDICTS), with its colour.
COLOURS = {"run": "green", "infeasible": "yellow", "invalid": "red"}


def _cells(r: PlanRow, dcn: bool = False) -> list[str]:
    hbm = (
        memory.gib(r.predicted_hbm_bytes_per_device) if r.predicted_hbm_bytes_per_device is not None else "-"
    )
    step = f"{r.predicted_step_s:,.3g}" if r.predicted_step_s is not None else "-"
    mfu = f"{r.predicted_mfu:.2f}" if r.predicted_mfu is not None else "-"
    bound = f"{r.roofline_mfu:.2f}" if r.roofline_mfu is not None else "-"
    cells = [r.cluster, r.strategy, r.mesh, f"{r.context_length:,}", r.verdict, hbm, step, mfu, bound,
             f"{r.tflops_per_device_per_step:,.4g}", r.reason]  # fmt: skip
    if dcn:
        cells.insert(7, f"{r.dcn_exposed_s:,.3g}" if r.dcn_exposed_s is not None else "-")
    return cells


def _header(rows: list[PlanRow]) -> tuple[list[str], bool]:
    """The columns, with "DCN s" (exposed slice-crossing time) only when some point spans slices."""
    dcn = any("/dcn:" in r.mesh for r in rows)
    return (HEADER[:7] + ["DCN s"] + HEADER[7:] if dcn else HEADER), dcn


def render_table(rows: list[PlanRow], console: Any = None, title: str = "plan") -> None:
    """Print the plan as a rich table (verdicts coloured)."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title=title, show_lines=False)
    header, dcn = _header(rows)
    for h in header:
        table.add_column(
            h,
            overflow="fold",
            justify="right" if h in ("context", "step s", "DCN s", "MFU", "MFU ≤ (roofline)") else "left",
        )
    for r in rows:
        cells = _cells(r, dcn)
        cells[4] = f"[{COLOURS[r.verdict]}]{r.verdict}[/]"
        table.add_row(*cells)
    console.print(table)
    counts = {v: sum(r.verdict == v for r in rows) for v in COLOURS}
    console.print(", ".join(f"{n} {v}" for v, n in counts.items()))


def to_markdown(rows: list[PlanRow]) -> str:
    header, dcn = _header(rows)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in _cells(r, dcn)) + " |" for r in rows]
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
            r.strategy, r.mesh, f"{r.context_length:,}", r.remat, r.topology,
            f"{r.analytic_bytes / 2**30:,.1f} GiB", compiled_cell(r), peak_cell(r), ratio_cell(r), r.verdict,
            r.reason,
        )  # fmt: skip
    console.print(table)
