"""One self-contained HTML page per sweep: the grid's verdicts and reasons, per context length what the planner
recommends and what ran against what it predicted (with the bands), the plots, and links to every child run.

No template engine and no external asset: the figures are embedded PNGs, the style a few lines of CSS, so the
page opens from the parent run's artifacts, from the file next to the store, or attached to a message.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1200px; padding: 0 1em; color: #222 }
h1 { font-size: 1.5em } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd }
table { border-collapse: collapse; margin: .5em 0 1em; font-size: 13px }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top }
th { background: #f4f4f4 } td.num { text-align: right; font-variant-numeric: tabular-nums }
.run { color: #1a7f37 } .infeasible { color: #9a6700 } .invalid, .failed { color: #cf222e }
.reason { color: #555; max-width: 42em } .note { background: #fff8c5; padding: .6em 1em; border-radius: 4px }
figure { margin: 1em 0 } figure img { max-width: 100%; border: 1px solid #eee } figcaption { color: #555 }
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


def _num(v: float | None, fmt: str) -> str:
    return "–" if v is None or v != v else format(v, fmt)


def _band(p: Point) -> str:
    if p.predicted_step_s is None:
        return "–"
    if p.step_low_s and p.step_high_s:
        return f"{p.predicted_step_s:,.3g} ({p.step_low_s:,.3g}–{p.step_high_s:,.3g})"
    return f"{p.predicted_step_s:,.3g}"


def _within(p: Point) -> str:
    """Whether the measured step fell inside the band."""
    if p.measured_step_s is None or not (p.step_low_s and p.step_high_s):
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


def grid_table(points: Sequence[Point]) -> str:
    rows = [
        [
            _link(p, p.strategy),
            html.escape(p.mesh),
            f"{p.context_length:,}",
            html.escape(p.policy),
            f'<span class="{html.escape(p.verdict)}">{html.escape(p.verdict)}</span>',
            f'<span class="reason">{html.escape(p.reason)}</span>',
        ]
        for p in points
    ]
    return _table(["strategy", "mesh", "context", "policy", "verdict", "reason"], rows, numeric=(2,))


def lengths_table(points: Sequence[Point]) -> str:
    """Per context length: the planner's pick among the sweep's runnable points, then every point that ran,
    predicted against measured."""
    out = []
    for length in sorted({p.context_length for p in points}):
        here = [p for p in points if p.context_length == length]
        runnable = [
            p for p in here if p.predicted_step_s is not None and p.verdict not in ("invalid", "infeasible")
        ]
        pick = min(runnable, key=lambda p: p.predicted_step_s, default=None)
        ran = [p for p in here if p.measured_step_s is not None]
        fastest = min(ran, key=lambda p: p.measured_step_s, default=None)
        said = (
            f"recommended: <b>{html.escape(pick.strategy)}</b> on {html.escape(pick.mesh)} "
            f"({html.escape(pick.policy)}), predicted {_band(pick)} s"
            if pick
            else "nothing the planner expects to run here"
        )
        if fastest is not None:
            said += (
                f"; fastest measured: <b>{html.escape(fastest.strategy)}</b> {fastest.measured_step_s:,.3g} s"
            )
        rows = [
            [
                _link(p, p.strategy),
                html.escape(p.mesh),
                _band(p),
                _num(p.measured_step_s, ",.3g")
                + (f" ±{p.measured_step_spread / 2:.0%}" if p.measured_step_spread else ""),
                _within(p),
                _num(p.predicted_mfu, ".3f"),
                _num(p.measured_mfu, ".3f"),
                _num(p.predicted_gib, ",.2f"),
                _num(p.measured_gib, ",.2f"),
            ]
            for p in (ran or runnable)
        ]
        head = [
            "strategy",
            "mesh",
            "predicted step s (band)",
            "measured step s",
            "in band",
            "predicted MFU",
            "measured MFU",
            "predicted GiB/device",
            "measured GiB/device",
        ]
        out.append(
            f"<h3>{length:,} tokens</h3><p>{said}</p>" + _table(head, rows, numeric=(2, 3, 5, 6, 7, 8))
        )
    return "".join(out)


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
        f'<figure><img alt="{html.escape(name)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'
        f"<figcaption>{html.escape(name)}</figcaption></figure>"
        for name, png in figures.items()
    )
    note = "".join(f'<p class="note">{html.escape(n)}</p>' for n in notes)
    lines = "".join(f"<li>{html.escape(s)}</li>" for s in summary)
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>{note}<ul>{lines}</ul>"
        f"<h2>Per context length: recommended, predicted and measured</h2>{lengths_table(points)}"
        f"<h2>Plots</h2>{figs or '<p>no trial finished: nothing to plot</p>'}"
        f"<h2>The grid</h2>{grid_table(points)}</body></html>"
    )
