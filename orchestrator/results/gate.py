"""Regression gate: each finished trial of a sweep against the median of its last finished runs in other sweeps.

Because the trial id hashes only what changes the result, the same grid point in earlier sweeps (cron re-runs,
the last release) is its baseline: the median of the last `window` finished runs of that trial id on the same
cluster, one per earlier sweep. Identical reruns on a busy CPU host move tokens/s by ±15 %, so the drop allowed
(the band) widens with the noise those runs showed: band = max(max_drop, noise_k × (max − min) / (2 × median)).
A drop in MFU or tokens/s beyond its band tags the parent run `regression: true` and makes the CLI exit with
EXIT_REGRESSION.

    python -m orchestrator.results.gate SWEEP_ID [--uri URI] [--experiment NAME] [--max-drop 0.10] [--window 5]
                                   [--noise-k 1.5] [--no-tag]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from orchestrator.config.schema import Gate
from orchestrator.tracking.finished import finished_runs
from orchestrator.tracking.mlflow_names import GIB, memory_bytes, trial_label, trial_params

if TYPE_CHECKING:
    from mlflow import MlflowClient

    from orchestrator.results.report import TrialResult

EXIT_REGRESSION = 3
DEFAULT = Gate()  # the defaults of the library calls and of the CLI flags are the config's
GATED = ("final_mfu", "final_tokens_per_s")  # higher is better; a drop beyond the band trips the gate
SHOWN = {
    "final_mfu": "MFU",
    "final_tokens_per_s": "tokens/s",
    "final_step_time_median_s": "step s",
    "memory_bytes_per_device": "GiB/dev",
}


@dataclass(frozen=True)
class Measured:
    """One finished trial of the sweep being gated: what the driver holds of it (or, from the command line,
    what its run in the store says)."""

    trial_id: str
    sweep_id: str
    strategy: str
    context_length: int
    mesh: str
    cluster: str  # the `cluster` param: baselines come from the same cluster
    start_time: int  # its run's MLflow start time (ms): baselines started before it
    metrics: dict[str, float]  # final_mfu, final_tokens_per_s, ..., peak_tflops_per_device

    @property
    def label(self) -> str:
        return trial_label(self.strategy, self.context_length, self.mesh).strip()


def from_run(run: Any) -> Measured:
    """A finished trial as its child run in the store has it."""
    p, tags = run.data.params, run.data.tags
    return Measured(
        tags["trial_id"],
        tags["sweep_id"],
        p.get("strategy", "?"),
        int(p.get("context_length", 0)),
        p.get("mesh", ""),
        p.get("cluster", ""),
        run.info.start_time,
        dict(run.data.metrics),
    )


def from_trial(t: TrialResult, sweep_id: str, start_time: int) -> Measured:
    """A finished trial as the driver holds it: its summary and the peak its last attempt measured, named as
    its run's params name it (an axis may rename the mesh or cluster)."""
    p, s = trial_params(t.spec), t.summary
    values = {
        "final_mfu": s.mfu,
        "final_tokens_per_s": s.tokens_per_s,
        "final_step_time_median_s": s.step_time_median_s,
        "memory_bytes_per_device": memory_bytes(s),
        "peak_tflops_per_device": t.peak_at_run,
    }
    metrics = {k: float(v) for k, v in values.items() if v is not None and not math.isnan(v)}
    L = int(p["context_length"])
    return Measured(t.spec.trial_id, sweep_id, p["strategy"], L, p["mesh"], p["cluster"], start_time, metrics)


def band(history: Sequence[float], max_drop: float, noise_k: float) -> tuple[float, float]:
    """(noise, band) of one metric's baseline runs: their ± spread about the median, (max − min) / (2 median),
    and the drop a new run may take, max(max_drop, noise_k × noise). One run shows no spread: max_drop."""
    med = statistics.median(history)
    noise = (max(history) - min(history)) / (2 * med) if len(history) > 1 and med > 0 else 0.0
    return noise, max(max_drop, noise_k * noise)


@dataclass
class Change:
    """One trial against its baseline: metric -> (median of the baseline runs, now), the gated metrics that
    dropped beyond their band, and which runs the baseline is made of."""

    trial_id: str
    label: str
    baseline_sweep: str  # the newest of baseline_sweeps
    values: dict[str, tuple[float, float]] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)
    baseline_sweeps: tuple[str, ...] = ()  # one run per sweep, newest first
    noise: dict[str, float] = field(default_factory=dict)  # gated metric -> ± spread of its baseline runs
    bands: dict[str, float] = field(default_factory=dict)  # gated metric -> the drop it may take
    unpegged: bool = False  # MFU not gated: the runs divided by peaks measured each time (CPU)

    def __post_init__(self) -> None:
        if not self.baseline_sweeps and self.baseline_sweep:
            self.baseline_sweeps = (self.baseline_sweep,)

    def delta(self, metric: str) -> float:
        old, new = self.values.get(metric, (float("nan"), float("nan")))
        return new / old - 1 if old else float("nan")

    def baseline(self) -> str:
        """Which runs the baseline is: "median of 3 runs (sweeps s3, s2, s1)", or the one run."""
        n, sweeps = len(self.baseline_sweeps), ", ".join(self.baseline_sweeps)
        return f"median of {n} runs (sweeps {sweeps})" if n > 1 else f"1 run (sweep {sweeps}, band max_drop)"

    def drops(self) -> str:
        """The gated drops beyond their band: "tokens/s -30% (band 23%)"."""
        return ", ".join(f"{SHOWN[m]} {self.delta(m):+.0%} (band {self.bands[m]:.0%})" for m in self.dropped)

    def band_text(self) -> str:
        """The bands of the gated metrics, one figure when they agree (MFU and tokens/s move together)."""
        shown = {f"{b:.1%}" for b in self.bands.values()}
        if len(shown) == 1:
            return shown.pop()
        return " / ".join(f"{SHOWN[m]} {b:.1%}" for m, b in self.bands.items())


@dataclass
class GateResult:
    sweep_id: str
    max_drop: float
    changes: list[Change]
    new: list[str] = field(default_factory=list)  # finished trials with no earlier run to compare with
    window: int = DEFAULT.window
    noise_k: float = DEFAULT.noise_k

    @property
    def regressions(self) -> list[Change]:
        return [c for c in self.changes if c.dropped]

    def _bands(self) -> str:
        every = [b for c in self.changes for b in c.bands.values()] or [self.max_drop]
        lo, hi = min(every), max(every)
        return f"{lo:.0%}" if f"{lo:.0%}" == f"{hi:.0%}" else f"{lo:.0%}–{hi:.0%}"

    def _baselines(self) -> str:
        """Which runs were compared, grouped: most sweeps compare every trial with the same earlier sweeps."""
        groups = Counter(c.baseline() for c in self.changes)
        if len(groups) == 1:
            return f"each vs the {next(iter(groups))}"
        return "; ".join(f"{n} {'trial' if n == 1 else 'trials'} vs the {b}" for b, n in groups.items())

    def summary(self, detail: bool = True) -> str:
        """The verdict in one line; `detail` adds each trial's median and band (the parent-run tag has room)."""
        if not self.changes:
            return f"no baseline: none of the {len(self.new)} trials has an earlier finished run"
        n = len(self.changes)
        if not self.regressions:
            head = f"no drop beyond {self._bands()} in {n} compared trials"
        else:
            parts = "; ".join(f"{c.label}: {c.drops()}" for c in self.regressions)
            head = f"{len(self.regressions)} of {n} trials dropped beyond {self._bands()}: {parts}"
        text = f"{head}; {self._baselines()}; band = max({self.max_drop:.0%}, {self.noise_k:g} × ± spread)"
        if detail:
            m = "final_tokens_per_s"
            text += "; per trial, tokens/s median and band: " + ", ".join(
                f"{c.label} {c.values[m][0]:.4g} {c.bands[m]:.1%}" for c in self.changes if m in c.bands
            )
        return text


def history(client: MlflowClient, experiment_id: str, trial: Measured, window: int) -> list:
    """The last `window` finished runs of the trial's id on its cluster that started before it, one per
    earlier sweep, newest first."""
    # same trial id on the same cluster: the id deliberately ignores where it ran, speed does not
    same_cluster = f" and params.cluster = '{trial.cluster}'" if trial.cluster else ""
    found = client.search_runs(
        [experiment_id],
        f"tags.trial_id = '{trial.trial_id}' and tags.status = 'finished' and tags.sweep_id != "
        f"'{trial.sweep_id}' and attributes.start_time < {trial.start_time}{same_cluster}",
        order_by=["attributes.start_time DESC"],
        max_results=max(50, 4 * window),  # room for the runs skipped below
    )
    out, seen = [], set()
    for r in found:
        sid = r.data.tags.get("sweep_id", "?")
        # A planned run is a prediction, never a measurement; a sweep that was resumed or retried may hold
        # several finished runs of one trial, and one noisy sweep must not fill the window: its newest counts.
        if r.data.tags.get("planned") == "true" or sid in seen:
            continue
        seen.add(sid)
        out.append(r)
        if len(out) == window:
            break
    return out


def same_peak(trial: Measured, base: list) -> bool:
    """Whether every run's MFU divides by one peak: on CPU the peak is a matmul probed at each trial's start, and
    its noise (the host's load during one matmul) halved MFU with tokens/s unchanged. Shown, not gated."""
    key = "peak_tflops_per_device"
    return len({trial.metrics.get(key), *(r.data.metrics.get(key) for r in base)}) == 1


def compare(
    client: MlflowClient,
    experiment_id: str,
    sweep_id: str,
    max_drop: float = DEFAULT.max_drop,
    window: int = DEFAULT.window,
    noise_k: float = DEFAULT.noise_k,
    measured: list[Measured] | None = None,
) -> GateResult:
    """Compare each finished trial of `sweep_id` with the median of its last `window` earlier finished runs.
    `measured`: the sweep's finished trials as the driver holds them; None reads them from the store."""
    if measured is None:
        measured = [from_run(r) for r in finished_runs(client, experiment_id, sweep_id)]
    result = GateResult(sweep_id, max_drop, [], window=window, noise_k=noise_k)
    for trial in sorted(measured, key=lambda t: (t.strategy, t.context_length)):
        base = history(client, experiment_id, trial, window)
        if not base:
            result.new.append(trial.label)
            continue
        sweeps = tuple(b.data.tags.get("sweep_id", "?") for b in base)
        change = Change(trial.trial_id, trial.label, sweeps[0], baseline_sweeps=sweeps)
        change.unpegged = not same_peak(trial, base)
        for m in SHOWN:
            runs = [b.data.metrics[m] for b in base if m in b.data.metrics]
            if m in trial.metrics and runs:
                change.values[m] = (statistics.median(runs), trial.metrics[m])
                if m in GATED and not (m == "final_mfu" and change.unpegged):
                    change.noise[m], change.bands[m] = band(runs, max_drop, noise_k)
        change.dropped = [m for m in GATED if m in change.bands and -change.delta(m) > change.bands[m]]
        result.changes.append(change)
    return result


def render(result: GateResult, console: Console | None = None) -> None:
    """Print the table of changes (red: a gated drop beyond its band); new trials get one line."""
    if console is None:
        console = Console()
        if not console.is_terminal:  # cron and CI logs: no 80-column wrapping of the table
            console = Console(width=160)
    if not result.changes:  # a first sweep: an empty table and every trial's name would say nothing
        n = len(result.new)
        which = "its one trial" if n == 1 else f"any of the {n} trials"
        console.print(
            f"regression gate: no earlier run of {which} to compare with; this sweep is the baseline"
            if n
            else f"regression gate: sweep {result.sweep_id} has no finished trial to compare"
        )
        return
    # Most sweeps compare every trial with the same earlier sweeps: name them once, under the table.
    sets = {c.baseline_sweeps for c in result.changes}
    common = next(iter(sets)) if len(sets) == 1 else None
    table = Table(
        title=f"regression gate: sweep {result.sweep_id} vs the median of each trial's last {result.window} "
        f"runs (band: max({result.max_drop:.0%}, {result.noise_k:g} × their ± spread))",
        caption=f"baseline runs, newest first: {', '.join(common)}" if common else None,
    )
    for col in ("trial", "runs", *SHOWN.values(), "band", "verdict"):
        table.add_column(col, justify="left" if col in ("trial", "runs", "verdict") else "right")
    for c in result.changes:
        cells = []
        for m in SHOWN:
            if m not in c.values:
                cells.append("-")
                continue
            old, new = c.values[m]
            scale = GIB if m.endswith("bytes_per_device") else 1
            colour = "red" if m in c.dropped else ""
            text = f"{old / scale:.4g} → {new / scale:.4g} ({c.delta(m):+.1%})"
            cells.append(f"[{colour}]{text}[/]" if colour else text)
        n = len(c.baseline_sweeps)
        runs = str(n) if common else f"{n}: {', '.join(c.baseline_sweeps)}"
        why = "1 run" if n == 1 else f"±{max(c.noise.values(), default=0.0):.1%}"
        verdict = "[red]REGRESSED[/]" if c.dropped else "[green]ok[/]"
        table.add_row(c.label, runs, *cells, f"{c.band_text()} ({why})", verdict)
    console.print(table)
    if result.new:
        n = len(result.new)
        console.print(
            f"{n} new {'trial' if n == 1 else 'trials'} not compared: no earlier run, a baseline from now on"
        )
    if n := sum(c.unpegged for c in result.changes):
        console.print(
            f"MFU not gated for {n} trials: each run measured its own peak (CPU); tokens/s is gated"
        )
    console.print(result.summary(detail=False))


def gate(
    uri: str,
    experiment: str,
    sweep_id: str,
    max_drop: float = DEFAULT.max_drop,
    tag: bool = True,
    console: Console | None = None,
    window: int = DEFAULT.window,
    noise_k: float = DEFAULT.noise_k,
) -> int:
    """Compare the sweep's finished trials in the store, print, tag its parent run; 0, or EXIT_REGRESSION when a
    gated metric dropped."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise ValueError(f"no experiment {experiment!r} in {uri}")
    result = compare(client, exp.experiment_id, sweep_id, max_drop, window, noise_k)
    render(result, console)
    if tag:
        parents = client.search_runs(
            [exp.experiment_id], f"tags.sweep_id = '{sweep_id}' and tags.kind = 'sweep'", max_results=1
        )
        for p in parents:
            for k, v in tags(result).items():
                client.set_tag(p.info.run_id, k, v)
    return exit_code(result)


def tags(result: GateResult) -> dict[str, str]:
    """What the verdict sets on the sweep's parent run."""
    return {
        "regression": str(bool(result.regressions)).lower(),
        "regression_summary": result.summary()[:5000],
    }


def exit_code(result: GateResult) -> int:
    return EXIT_REGRESSION if result.regressions else 0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m orchestrator.results.gate", description=__doc__.splitlines()[0]
    )
    ap.add_argument("sweep_id")
    ap.add_argument("--uri", default=os.environ.get("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db"))
    ap.add_argument("--experiment", default="cp_scaling")
    ap.add_argument("--max-drop", type=float, default=DEFAULT.max_drop)
    ap.add_argument("--window", type=int, default=DEFAULT.window, help="baseline: median of this many runs")
    ap.add_argument("--noise-k", type=float, default=DEFAULT.noise_k, help="band: this many ± spreads")
    ap.add_argument("--no-tag", action="store_true", help="only print; leave the parent run untouched")
    a = ap.parse_args(argv)
    if a.window < 1 or a.noise_k < 0:
        ap.error("--window must be at least 1 and --noise-k at least 0")
    return gate(a.uri, a.experiment, a.sweep_id, a.max_drop, not a.no_tag, window=a.window, noise_k=a.noise_k)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
