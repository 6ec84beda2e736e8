"""End-of-sweep plots from the finished trials' records (the driver's own, or read back from their runs): MFU,
memory and step time vs context length, loss curves, loss and recall by position, and where the step went,
measured against predicted (its bars: results/measured_vs_predicted.py).

Figures are built with matplotlib's object API (no pyplot), so no GUI backend or global figure state is involved:
the PNG is rendered by Agg when saved.
"""

from __future__ import annotations

import io
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from matplotlib.figure import Figure

from jobs.data.buckets import bucket_labels, position_buckets
from jobs.records import ProfileRecord, Record, StartRecord, StepRecord, SummaryRecord, parse_known
from jobs.spec import TrialSpec
from orchestrator.plan.cluster_model import model_of
from orchestrator.results import measured_vs_predicted
from orchestrator.tracking import Tracker
from orchestrator.tracking.mlflow_names import GIB, memory_bytes


@dataclass(frozen=True)
class TrialResult:
    """One finished trial as the report sees it: its spec, summary record and loss curve."""

    spec: TrialSpec
    summary: SummaryRecord
    losses: list[tuple[int, float]] = field(default_factory=list)
    predicted_bytes: int | None = None
    peak_source: str = ""
    predicted_step_s: float | None = None  # the planner's step-time model (orchestrator/plan/steptime.py)
    # The same model at the matmul rate the trial itself measured (CPU: the host's load moves between plan
    # time and run time; this separates the model's error from the load's).
    predicted_step_at_run_s: float | None = None
    by_position: dict[str, float] = field(default_factory=dict)  # loss per position bucket, last steps' mean
    by_distance: dict[str, float] = field(
        default_factory=dict
    )  # recall: accuracy per distance bucket, the same
    profile: ProfileRecord | None = None  # process 0's first traced window (run.profile_steps), no files
    peak_at_run: float | None = None  # the peak its last attempt divided its MFU by
    # the planner's step-time terms (a StepTime) as the trial ran: re-priced at peak_at_run where that is not
    # the plan's peak (CPU), else the plan's own
    terms: Any = None
    # the 10th and 90th percentile of its timed steps' times (None: too few): the plots' error bars
    step_spread: tuple[float, float] | None = None

    @property
    def measured_bytes(self) -> float | None:
        return memory_bytes(self.summary)


def collect(
    specs: Iterable[TrialSpec],
    records_of: Callable[[str], list[Record] | list[Mapping[str, Any]]],
    rows: Mapping[str, Any] | None = None,
) -> list[TrialResult]:
    """TrialResults for the specs whose records (typed, or their dict form) include a summary (finished
    trials). `rows`: trial id -> its PlanRow (orchestrator/plan), whose predictions the report draws."""
    out = []
    for spec in specs:
        recs = parse_known(records_of(spec.trial_id))
        summary = next((r for r in reversed(recs) if isinstance(r, SummaryRecord)), None)
        if summary is None:
            continue
        # the attempt the summary comes from: the last one
        start = next((r for r in reversed(recs) if isinstance(r, StartRecord)), StartRecord())
        losses = [(r.step, float(r.loss)) for r in recs if isinstance(r, StepRecord)]
        row = (rows or {}).get(spec.trial_id)
        at_run = _at_run_peak(spec, start)
        out.append(
            TrialResult(
                spec,
                summary,
                losses,
                getattr(row, "predicted_hbm_bytes_per_device", None),
                start.peak_source,
                getattr(row, "predicted_step_s", None),
                at_run.step_s if at_run else None,
                _last_steps(recs),
                _last_steps(recs, "accuracy_by_distance"),
                next((r for r in recs if isinstance(r, ProfileRecord) and r.seconds), None),
                start.peak_tflops_per_device,
                at_run or getattr(row, "step", None),
                _spread(recs, summary),
            )
        )
    return out


def _spread(recs: list[Record], summary: SummaryRecord) -> tuple[float, float] | None:
    """(p10, p90) of the step times the summary's median is over (its timed steps, no traced one)."""
    lo, hi = summary.timed_from_step, summary.timed_to_step
    times = sorted(
        r.step_time_s
        for r in recs
        if isinstance(r, StepRecord)
        and not r.profiled
        and r.step_time_s == r.step_time_s
        and (lo is None or r.step >= lo)
        and (hi is None or r.step <= hi)
    )
    if len(times) < 3:
        return None
    pick = lambda q: times[min(len(times) - 1, round(q * (len(times) - 1)))]
    return pick(0.1), pick(0.9)


def _last_steps(recs: list[Record], key: str = "loss_by_position", last: int = 3) -> dict[str, float]:
    """Each bucket's value (a StepRecord's `key`) over the trial's last `last` steps that counted a token
    there (less step noise)."""
    seen: dict[str, list[float]] = defaultdict(list)
    for r in recs:
        if isinstance(r, StepRecord):
            for k, v in (getattr(r, key) or {}).items():
                seen[k].append(v)
    return {k: sum(v[-last:]) / len(v[-last:]) for k, v in seen.items()}


def _at_run_peak(spec: TrialSpec, start: StartRecord) -> Any:
    """The step-time model at the peak the trial measured where the plan priced it at another (CPU: the host's
    load moves between plan time and run time), else None: the plan's terms stand."""
    from orchestrator.plan.steptime import run_peak, step_time

    peak = run_peak(spec, start.peak_tflops_per_device)
    return step_time(spec, peak=peak) if peak else None


def _series(trials: list[TrialResult]) -> dict[str, list[TrialResult]]:
    """Trials grouped per strategy (and mesh, where one strategy ran on several; and model, where the sweep ran
    several), sorted by context length."""
    meshes = defaultdict(set)
    for t in trials:
        meshes[t.spec.strategy.name].add(t.spec.mesh.label())
    several_models = len({t.spec.model.name for t in trials}) > 1
    groups: dict[str, list[TrialResult]] = defaultdict(list)
    for t in trials:
        name = t.spec.strategy.name
        name = name if len(meshes[name]) == 1 else f"{name} {t.spec.mesh.label()}"
        groups[f"{t.spec.model.name} {name}" if several_models else name].append(t)
    return {k: sorted(v, key=lambda t: t.spec.context_length) for k, v in sorted(groups.items())}


def _palette(trials: list[TrialResult]) -> dict[str, str]:
    """One colour per series, the same in every figure of the sweep (tab10, in the series' sorted order)."""
    return {name: f"C{i % 10}" for i, name in enumerate(_series(trials))}


# Per series in the panels where strategies should coincide (loss): a style and width each, so curves that lie
# on one another all stay visible, the first drawn widest.
DASHES = ("-", "--", "-.", ":", (0, (5, 1, 1, 1, 1, 1)))


def _style(i: int) -> dict[str, Any]:
    return {"ls": DASHES[i % len(DASHES)], "lw": max(0.8, 3.2 - 0.6 * i)}


def _error(ts: list[TrialResult], scale) -> list[list[float]] | None:
    """matplotlib's yerr ([below], [above]) from each trial's step spread mapped by `scale(trial, step_s)`;
    None where no trial has a spread."""
    if not any(t.step_spread for t in ts):
        return None
    below, above = [], []
    for t in ts:
        mid = scale(t, t.summary.step_time_median_s)
        ends = sorted(scale(t, s) for s in t.step_spread) if t.step_spread else (mid, mid)
        below.append(max(0.0, mid - ends[0]))
        above.append(max(0.0, ends[1] - mid))
    return [below, above]


def _grid(n: int, title: str, width: float = 4.5, height: float = 3.6):
    """A figure of n panels, at most three to a row, and its axes in reading order."""
    cols = min(3, n)
    rows = -(-n // cols)
    fig = Figure(figsize=(width * cols, height * rows + 0.6))
    axes = fig.subplots(rows, cols, squeeze=False, sharey=True).ravel()
    for ax in axes[n:]:
        ax.set_visible(False)
    fig.suptitle(title)
    return fig, list(axes[:n])


def context_axes(title: str, ylabel: str, logy: bool = False):
    """A figure of one panel against context length (log2 axis), and its axes."""
    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    return fig, ax


def finish(fig: Figure, ax) -> Figure:
    """The legend (beside the axes when it is long) and a tight layout."""
    labels = ax.get_legend_handles_labels()[1]
    if len(labels) > 6:  # measured, predicted, ... per strategy: beside the axes, not over the lines
        fig.set_size_inches(10, 4.5)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    elif labels:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _where(trials: list[TrialResult]) -> str:
    models = ", ".join(sorted({t.spec.model.name for t in trials}))
    return f"{models} on {trials[0].spec.cluster.name}"


def _predicted(ax, xs: list[int], values: list[float | None], colour: str, label: str) -> None:
    """The planner's forecast per trial, dashed in its series' colour; no line where it gave none."""
    ys = [float("nan") if v is None else v for v in values]
    if any(y == y for y in ys):
        ax.plot(xs, ys, ls="--", marker="x", color=colour, alpha=0.7, label=label)


def _lines(trials: list[TrialResult]) -> Iterator[tuple[str, list[TrialResult], str, list[int]]]:
    """(name, trials, colour, their context lengths) of each series, for a figure against context length."""
    colours = _palette(trials)
    for name, ts in _series(trials).items():
        yield name, ts, colours[name], [t.spec.context_length for t in ts]


def mfu_figure(trials: list[TrialResult]) -> Figure:
    source = next((t.peak_source for t in trials if t.peak_source), "")
    label = "MFU" + (f" (peak: {source})" if source else "")
    fig, ax = context_axes(f"MFU vs context length — {_where(trials)}", label)
    for name, ts, colour, xs in _lines(trials):
        ys = [t.summary.mfu for t in ts]
        ax.plot(xs, ys, marker="o", color=colour, label=name)
        # MFU is inverse in the step time: its spread is the steps' (p10..p90), bars where there is one
        err = _error(ts, lambda t, s: t.summary.mfu * t.summary.step_time_median_s / s)
        if err:
            ax.errorbar(xs, ys, yerr=err, fmt="none", ecolor=colour, capsize=3, alpha=0.8)
    ax.set_ylim(bottom=0)
    return finish(fig, ax)


def memory_figure(trials: list[TrialResult]) -> Figure:
    fig, ax = context_axes(
        f"Memory per device vs context length — {_where(trials)}", "GiB per device", logy=True
    )
    for name, ts, colour, xs in _lines(trials):
        # the program's own peak (the compiler's, TPU), else its compiled size; the runtime's counter beside it
        # where the backend keeps one: on TPU it misses the program's temporaries, so it is never the figure
        comp = [(memory_bytes(t.summary) or float("nan")) / GIB for t in ts]
        ax.plot(xs, comp, marker="o", color=colour, label=f"{name} program")
        if any(t.summary.runtime_peak_bytes for t in ts):
            run = [(t.summary.runtime_peak_bytes or float("nan")) / GIB for t in ts]
            ax.plot(xs, run, marker="s", ls=":", color=colour, label=f"{name} runtime counter")
        pred = [None if t.predicted_bytes is None else t.predicted_bytes / GIB for t in ts]
        _predicted(ax, xs, pred, colour, f"{name} predicted")
    hbm = model_of(trials[0].spec.cluster).hbm_bytes_per_device
    if hbm:
        ax.axhline(hbm / GIB, color="red", ls=":", label=f"HBM per device ({hbm / GIB:g} GiB)")
    return finish(fig, ax)


def step_time_figure(trials: list[TrialResult]) -> Figure:
    fig, ax = context_axes(
        f"Step time vs context length — {_where(trials)}", "median step time (s)", logy=True
    )
    for name, ts, c, xs in _lines(trials):
        ys = [t.summary.step_time_median_s for t in ts]
        ax.plot(xs, ys, marker="o", color=c, label=f"{name} measured")
        if err := _error(ts, lambda t, s: s):  # the timed steps' p10..p90
            ax.errorbar(xs, ys, yerr=err, fmt="none", ecolor=c, capsize=3, alpha=0.8)
        _predicted(ax, xs, [t.predicted_step_s for t in ts], c, f"{name} predicted")
        at_run = [t.predicted_step_at_run_s or float("nan") for t in ts]
        if any(p == p for p in at_run):
            ax.plot(xs, at_run, ls=":", color=c, alpha=0.7, label=f"{name} predicted at run-time rate")
    return finish(fig, ax)


def _by_length(trials: list[TrialResult]) -> dict[int, list[tuple[str, TrialResult]]]:
    """context length -> (series name, trial) of every series that ran it, lengths ascending."""
    out: dict[int, list[tuple[str, TrialResult]]] = defaultdict(list)
    for name, ts in _series(trials).items():
        for t in ts:
            out[t.spec.context_length].append((name, t))
    return dict(sorted(out.items()))


def loss_figure(trials: list[TrialResult]) -> Figure:
    """One panel per context length, one curve per strategy in its sweep-wide colour: at one length every
    strategy trains the same model on the same tokens, so their curves should lie on one another."""
    colours = _palette(trials)
    lengths = _by_length(trials)
    fig, axes = _grid(len(lengths), f"Loss curves — {_where(trials)}")
    order = list(colours)
    for ax, (length, here) in zip(axes, lengths.items(), strict=True):
        for name, t in here:
            if t.losses:
                style = _style(order.index(name))
                ax.plot(*zip(*t.losses, strict=True), color=colours[name], label=name, **style)
        ax.set_title(f"L={length:,}")
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("loss")
    _legend(fig, axes)
    return fig


def _legend(fig: Figure, axes: list) -> None:
    """One legend for the whole grid (every panel shares the series' colours), below the suptitle."""
    seen: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(label, handle)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    if seen:
        fig.legend(list(seen.values()), list(seen), loc="lower center", fontsize=9, ncols=min(len(seen), 6))


XLABEL = {
    "by_position": "position bucket's end (in the document when packed)",
    "by_distance": "distance bucket's end (query to its key, tokens)",
}


def position_figure(trials: list[TrialResult], attr: str = "by_position") -> Figure | None:
    """One panel per context length: loss by position bucket (or, attr="by_distance", the recall task's
    accuracy by distance to the key), one line per strategy in its sweep-wide colour (None: no buckets)."""
    colours = _palette(trials)
    lengths = {L: [(n, t) for n, t in here if getattr(t, attr)] for L, here in _by_length(trials).items()}
    lengths = {L: here for L, here in lengths.items() if here}
    if not lengths:
        return None
    what = "Loss by position" if attr == "by_position" else "Recall accuracy by distance"
    fig, axes = _grid(len(lengths), f"{what} — {_where(trials)}")
    for ax, (L, here) in zip(axes, lengths.items(), strict=True):
        ends = [*position_buckets(L)[1:], L]  # each bucket at its far end
        for name, t in here:
            got = getattr(t, attr)
            xy = [(e, got[k]) for k, e in zip(bucket_labels(L), ends, strict=True) if k in got]
            style = _style(list(colours).index(name))
            ax.plot(*zip(*xy, strict=True), marker="o", color=colours[name], label=name, **style)
        ax.set_title(f"L={L:,}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel(XLABEL[attr])
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("loss, last steps" if attr == "by_position" else "accuracy, last steps")
    _legend(fig, axes)
    return fig


def make_figures(trials: list[TrialResult]) -> dict[str, Figure]:
    """name -> Figure for the parent run; empty when no trial finished."""
    if not trials:
        return {}
    figs = {
        "mfu_vs_context": mfu_figure(trials),
        "memory_vs_context": memory_figure(trials),
        "step_time_vs_context": step_time_figure(trials),
        "loss_curves": loss_figure(trials),
    }
    if fig := position_figure(trials):
        figs["loss_by_position"] = fig
    if fig := position_figure(trials, "by_distance"):  # the recall task
        figs["accuracy_by_distance"] = fig
    if fig := breakdown_figure(trials):
        figs["measured_vs_predicted"] = fig
    return figs


def breakdown_figure(trials: list[TrialResult]) -> Figure | None:
    """Predicted vs measured step breakdown of every profiled trial whose step-time terms are known."""
    rows = []
    for name, ts in _series([t for t in trials if t.profile is not None and t.terms is not None]).items():
        for t in ts:
            predicted = measured_vs_predicted.predicted_groups(t.terms)
            measured = measured_vs_predicted.measured_groups(t.profile)  # type: ignore[arg-type]
            rows.append((f"{name} {t.spec.context_length:,}", predicted, measured))
    return measured_vs_predicted.figure(rows, _where(trials)) if rows else None


def png(fig: Figure) -> bytes:
    """The figure as the PNG the parent run and the HTML page both hold."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return buf.getvalue()


def publish(
    tracker: Tracker,
    specs: Iterable[TrialSpec],
    rows: Mapping[str, Any] | None = None,
    records_of: Callable[[str], list[Record]] | None = None,
) -> tuple[list[TrialResult], dict[str, bytes]]:
    """Make the figures for the finished trials (records: `records_of`, else the tracker's own; `rows`: trial
    id -> PlanRow) and queue them on the parent run as plots/NAME.png. Returns the trials the plots cover and
    the plots (name -> PNG)."""
    trials = collect(specs, records_of or tracker.records, rows)
    for t in trials:  # next to predicted_step_time_s, which the driver logged at plan time
        if t.predicted_step_at_run_s is not None:
            tracker.log_metrics(
                t.spec.trial_id, {"predicted_step_time_at_run_peak_s": t.predicted_step_at_run_s}
            )
    pngs = {name: png(fig) for name, fig in make_figures(trials).items()}
    for name, data in pngs.items():
        tracker.log_artifact("sweep", data, f"plots/{name}.png")
    return trials, pngs
