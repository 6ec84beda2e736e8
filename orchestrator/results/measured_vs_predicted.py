"""Where a trial's step went, predicted against measured: the planner's step-time terms and a profile's
seconds per step, both folded into the same five groups, as stacked bars side by side per trial."""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure

from jobs.records import ProfileRecord

# group -> (the planner's StepTime fields, the trace's categories)
GROUPS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "matmuls": (("matmul_s",), ("matmul",)),
    "attention kernel": (("attention_s",), ("attention",)),
    "collectives": (
        ("exposed_ring_s", "collectives_s", "exposed_fsdp_s", "tensor_s", "dcn_exposed_s"),
        ("all_gather", "all_to_all", "collective_permute", "reduce_scatter", "all_reduce"),
    ),
    "host transfers": (("exposed_offload_s",), ("host_transfer",)),
    "other, idle, overhead": (("overhead_s",), ("other_compute", "idle")),
}
COLOURS = ("tab:blue", "tab:orange", "tab:red", "tab:purple", "tab:gray")


def predicted_groups(terms: Any) -> dict[str, float]:
    """A StepTime's terms folded into GROUPS (seconds)."""
    return {g: sum(float(getattr(terms, f)) for f in fields) for g, (fields, _) in GROUPS.items()}


def measured_groups(p: ProfileRecord) -> dict[str, float]:
    """A profile's seconds per step folded into GROUPS."""
    return {g: sum(p.seconds.get(c, 0.0) for c in cats) for g, (_, cats) in GROUPS.items()}


def figure(rows: list[tuple[str, dict[str, float], dict[str, float]]], where: str) -> Figure:
    """rows: (trial label, predicted groups, measured groups), in the order drawn."""
    fig = Figure(figsize=(max(7.0, 0.9 * len(rows) + 2), 4.8))
    ax = fig.add_subplot()
    width = 0.38
    for i, (_, pred, meas) in enumerate(rows):
        for x, values, hatch in ((i - width / 2, pred, "//"), (i + width / 2, meas, "")):
            bottom = 0.0
            for g, colour in zip(GROUPS, COLOURS, strict=True):
                ax.bar(
                    x,
                    values[g],
                    width,
                    bottom=bottom,
                    color=colour,
                    hatch=hatch,
                    edgecolor="white",
                    label=g if i == 0 and not hatch else None,
                )
                bottom += values[g]
    ax.set_xticks(range(len(rows)), [label for label, _, _ in rows], rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("seconds per step")
    ax.set_title(f"Step time: predicted (hatched, left) vs measured (right) — {where}")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
