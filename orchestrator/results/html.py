"""One self-contained HTML page per sweep: the grid's verdicts and reasons, per context length what the planner
recommends and what ran against what it predicted (with the bands), the plots, and links to every child run.

No template engine and no external asset: the figures are embedded PNGs, the style a few lines of CSS, so the
page opens from the parent run's artifacts, from the file next to the store, or attached to a message.
"""

from __future__ import annotations

import base64
import html
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

GIB = 2**30
CPU_NOTE = (
    "This sweep ran on CPU, JAX simulating the mesh's devices in one process: its MFU is against this host's "
    "own measured matmul rate, and its step times are a CPU's. Neither says what a TPU or GPU would reach. "
    "What does carry over: which grid points are valid and fit, that every strategy's loss agrees at one "
    "length (the same model on the same tokens), the compiled memory's growth with the context, and how "
    "the planner's predictions track a real run. Plan a TPU's answer with plan=true cluster=<a TPU cluster>."
)

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1200px; padding: 0 1em; color: #222 }
h1 { font-size: 1.5em } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd }
table { border-collapse: collapse; margin: .5em 0 1em; font-size: 13px }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top }
th { background: #f4f4f4 } td.num { text-align: right; font-variant-numeric: tabular-nums }
.run { color: #1a7f37 } .infeasible { color: #9a6700 } .invalid, .failed { color: #cf222e }
.reason { color: #555; max-width: 42em } .note { background: #fff8c5; padding: .6em 1em; border-radius: 4px }
.plots { display: grid; grid-template-columns: repeat(auto-fill, minmax(540px, 1fr)); gap: 1em }
figure { margin: 0 } figure img { width: 100%; border: 1px solid #eee } figcaption { color: #555 }
figure.wide { grid-column: 1 / -1 }
"""


@dataclass(frozen=True)
class Point:
    """One grid point: what the planner said, and what ran (None: nothing measured)."""

    strategy: str
    mesh: str
    context_length: int
    policy: str
    verdict: str  # run | infeasible | invalid, or how the trial ended (finished, failed, ...)
    reason: str
    predicted_step_s: float | None = None
    step_low_s: float | None = None
    step_high_s: float | None = None
    predicted_mfu: float | None = None
    predicted_gib: float | None = None
    measured_step_s: float | None = None
    measured_step_spread: float | None = None  # (p90 - p10) / median of the trial's steps
    measured_mfu: float | None = None
    measured_gib: float | None = None  # the runtime's peak (None where the backend keeps no counters)
    link: str = ""  # the child run in the dashboard
    model: str = ""


def _num(v: float | None, fmt: str) -> str:
    return "–" if v is None or v != v else format(v, fmt)


def _band(p: Point) -> str:
    if p.predicted_step_s is None:
        return "–"
    if _has_band(p):
        return f"{p.predicted_step_s:,.3g} ({p.step_low_s:,.3g}–{p.step_high_s:,.3g})"
    return f"{p.predicted_step_s:,.3g}"


def _has_band(p: Point) -> bool:
    """A band the cluster's fit gives (conf/cluster step_band_low/high); a cluster without one has low = high."""
    return bool(p.step_low_s and p.step_high_s and p.step_low_s < p.step_high_s)


def _within(p: Point) -> str:
    """Whether the measured step fell inside the band."""
    if p.measured_step_s is None or not _has_band(p):
        return ""
    return "inside" if p.step_low_s <= p.measured_step_s <= p.step_high_s else "outside"


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], numeric: Sequence[int] = ()) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = []
    for row in rows:
        cells = []
        for i, c in enumerate(row):
            cls = ' class="num"' if i in numeric else ""
            cells.append(f"<td{cls}>{c}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{th}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _link(p: Point, text: str) -> str:
    return f'<a href="{html.escape(p.link)}">{html.escape(text)}</a>' if p.link else html.escape(text)


def _models(points: Sequence[Point]) -> list[str]:
    """The sweep's models, where it ran more than one (a one-model page names none)."""
    models = sorted({p.model for p in points})
    return models if len(models) > 1 else []


def grid_table(points: Sequence[Point]) -> str:
    several = bool(_models(points))
    rows = [
        [html.escape(p.model)] * several
        + [
            _link(p, p.strategy),
            html.escape(p.mesh),
            f"{p.context_length:,}",
            html.escape(p.policy),
            f'<span class="{html.escape(p.verdict)}">{html.escape(p.verdict)}</span>',
            f'<span class="reason">{html.escape(p.reason)}</span>',
        ]
        for p in points
    ]
    head = ["model"] * several + ["strategy", "mesh", "context", "policy", "verdict", "reason"]
    return _table(head, rows, numeric=(2 + several,))


def lengths_table(points: Sequence[Point], tag: str = "h3") -> str:
    """Per context length (and model, where the sweep ran several): the planner's pick among the sweep's
    runnable points, then every point that ran, predicted against measured. Lengths where nothing ran or
    could run share one line."""
    models = _models(points)
    if models:
        return "".join(
            f"<h3>model {html.escape(m)}</h3>" + lengths_table([p for p in points if p.model == m], "h4")
            for m in models
        )
    out, idle = [], []
    banded = any(_has_band(p) for p in points)
    for length in sorted({p.context_length for p in points}):
        here = [p for p in points if p.context_length == length]
        runnable = [
            p for p in here if p.predicted_step_s is not None and p.verdict not in ("invalid", "infeasible")
        ]
        ran = [p for p in here if p.measured_step_s is not None]
        if not (ran or runnable):
            idle.append(here)
            continue
        out.append(_length(length, runnable, ran, banded, tag))
    if idle:
        first, last = idle[0][0].context_length, idle[-1][0].context_length
        span = f"{first:,}" if first == last else f"{first:,} to {last:,}"
        verdicts = Counter(p.verdict for here in idle for p in here)
        said = ", ".join(f"{n} {v}" for v, n in verdicts.items())
        out.append(
            f"<{tag}>{span} tokens</{tag}><p>nothing the planner expects to run here ({said}; the reasons are in "
            f"the grid below), e.g. {html.escape(idle[0][0].reason)}</p>"
        )
    return "".join(out)


def _length(length: int, runnable: list[Point], ran: list[Point], banded: bool, tag: str) -> str:
    pick = min(runnable, key=lambda p: p.predicted_step_s, default=None)
    fastest = min(ran, key=lambda p: p.measured_step_s, default=None)
    said = (
        f"recommended: <b>{html.escape(pick.strategy)}</b> on {html.escape(pick.mesh)} "
        f"({html.escape(pick.policy)}), predicted {_band(pick)} s"
        if pick
        else "nothing the planner expects to run here"
    )
    if fastest is not None:
        said += f"; fastest measured: <b>{html.escape(fastest.strategy)}</b> {fastest.measured_step_s:,.3g} s"
    head = ["strategy", "mesh", "predicted step s" + (" (band)" if banded else ""), "measured step s"]
    head += ["in band"] * banded
    head += ["predicted MFU", "measured MFU", "predicted GiB/device", "measured GiB/device"]
    rows = []
    for p in ran or runnable:
        measured = _num(p.measured_step_s, ",.3g")
        if p.measured_step_spread:
            measured += f" ±{p.measured_step_spread / 2:.0%}"
        row = [_link(p, p.strategy), html.escape(p.mesh), _band(p), measured] + [_within(p)] * banded
        row += [_num(p.predicted_mfu, ".3f"), _num(p.measured_mfu, ".3f")]
        row += [_num(p.predicted_gib, ",.3g"), _num(p.measured_gib, ",.3g")]
        rows.append(row)
    numeric = [i for i, h in enumerate(head) if h not in ("strategy", "mesh", "in band")]
    return f"<{tag}>{length:,} tokens</{tag}><p>{said}</p>" + _table(head, rows, numeric=numeric)


def points(
    rows: Sequence[Any],
    trials: Sequence[Any],
    outcomes: Mapping[str, str],
    link_of: Callable[[str], str],
) -> list[Point]:
    """The page's points: each PlanRow (orchestrator/plan) with what ran of it. `trials`: the report's
    TrialResults (results/report.py); `outcomes`: trial id -> how a runnable point ended; `link_of`: trial id ->
    its child run's page ("" when it has none)."""
    ran = {t.spec.trial_id: t for t in trials}
    out = []
    for r in rows:
        t = ran.get(r.trial_id)
        spread = None
        if t is not None and t.step_spread and t.summary.step_time_median_s:
            spread = (t.step_spread[1] - t.step_spread[0]) / t.summary.step_time_median_s
        measured = t.measured_bytes if t is not None else None
        out.append(
            Point(
                r.strategy,
                r.mesh,
                r.context_length,
                r.policy,
                outcomes.get(r.trial_id, r.verdict) if r.verdict == "run" else r.verdict,
                r.reason,
                r.predicted_step_s,
                r.predicted_step_low_s,
                r.predicted_step_high_s,
                r.predicted_mfu,
                r.predicted_hbm_bytes_per_device / GIB if r.predicted_hbm_bytes_per_device else None,
                t.summary.step_time_median_s if t is not None else None,
                spread,
                t.summary.mfu if t is not None else None,
                measured / GIB if measured else None,
                link_of(r.trial_id),
                r.model,
            )
        )
    return out


def counts(points: Sequence[Point]) -> str:
    """'12 grid points: 6 finished, 4 infeasible, 2 invalid' (verdicts in the order first met)."""
    seen = Counter(p.verdict for p in points)
    return f"{len(points)} grid points: " + ", ".join(f"{n} {v}" for v, n in seen.items())


# the plots drawn as a grid of panels (one per context length), given the page's whole width
WIDE = ("loss_curves", "loss_by_position", "accuracy_by_distance", "measured_vs_predicted")


def page(
    title: str,
    summary: Sequence[str],
    points: Sequence[Point],
    figures: Mapping[str, bytes],
    notes: Sequence[str] = (),
) -> str:
    """The whole page; `figures`: name -> PNG bytes, shown in order; `notes`: what a reader may and may not
    conclude (a CPU sweep's MFU is not a TPU's), above everything else."""
    figs = "".join(
        f'<figure class="{"wide" if name in WIDE else ""}"><img alt="{html.escape(name)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'
        f"<figcaption>{html.escape(name)}</figcaption></figure>"
        for name, png in figures.items()
    )
    note = "".join(f'<p class="note">{html.escape(n)}</p>' for n in notes)
    lines = "".join(f"<li>{html.escape(s)}</li>" for s in summary)
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>{note}<ul>{lines}</ul>"
        f"<h2>Per context length: recommended, predicted and measured</h2>{lengths_table(points)}"
        f"<h2>Plots</h2>{f'<div class=plots>{figs}</div>' if figs else '<p>no trial finished: nothing to plot</p>'}"
        f"<h2>The grid</h2>{grid_table(points)}</body></html>"
    )
