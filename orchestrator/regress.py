"""Regression gate: each finished trial of a sweep against the previous finished run of the same trial id.

Because the trial id hashes only what changes the result, the same grid point in an earlier sweep (a cron
re-run, the last release) is its baseline. A drop in MFU or tokens/s beyond `max_drop` tags the parent run
`regression: true` and makes the CLI exit with EXIT_REGRESSION.

    python -m orchestrator.regress SWEEP_ID [--uri URI] [--experiment NAME] [--max-drop 0.10] [--no-tag]
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field

from mlflow import MlflowClient
from rich.console import Console
from rich.table import Table

EXIT_REGRESSION = 3
GATED = ("final_mfu", "final_tokens_per_s")  # higher is better; a drop beyond max_drop trips the gate
SHOWN = {"final_mfu": "MFU", "final_tokens_per_s": "tokens/s", "final_step_time_median_s": "step s",
         "memory_bytes_per_device": "GiB/dev"}  # fmt: skip


@dataclass
class Change:
    """One trial against its baseline: metric -> (baseline, now), and the gated metrics that dropped."""

    trial_id: str
    label: str
    baseline_sweep: str
    values: dict[str, tuple[float, float]] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)

    def delta(self, metric: str) -> float:
        old, new = self.values.get(metric, (float("nan"), float("nan")))
        return new / old - 1 if old else float("nan")


@dataclass
class GateResult:
    sweep_id: str
    max_drop: float
    changes: list[Change]
    new: list[str] = field(default_factory=list)  # finished trials with no earlier run to compare with

    @property
    def regressions(self) -> list[Change]:
        return [c for c in self.changes if c.dropped]

    def summary(self) -> str:
        if not self.changes:
            return f"no baseline: none of the {len(self.new)} trials has an earlier finished run"
        if not self.regressions:
            return f"no drop beyond {self.max_drop:.0%} in {len(self.changes)} compared trials"
        parts = [f"{c.label}: " + ", ".join(f"{SHOWN[m]} {c.delta(m):+.0%}" for m in c.dropped)
                 for c in self.regressions]  # fmt: skip
        return (
            f"{len(self.regressions)} of {len(self.changes)} trials dropped > {self.max_drop:.0%}: "
            + "; ".join(parts)
        )


def _label(run) -> str:
    p = run.data.params
    return f"{p.get('strategy', '?')} L={p.get('context_length', '?')} {p.get('mesh', '')}".strip()


def compare(client: MlflowClient, experiment_id: str, sweep_id: str, max_drop: float = 0.10) -> GateResult:
    """Compare each finished trial of `sweep_id` with the latest earlier finished run of its trial id."""
    mine = client.search_runs(
        [experiment_id], f"tags.sweep_id = '{sweep_id}' and tags.kind = 'trial' and tags.status = 'finished'",
        max_results=5000,
    )  # fmt: skip
    result = GateResult(sweep_id, max_drop, [])
    for run in sorted(
        mine, key=lambda r: (r.data.params.get("strategy", ""), int(r.data.params.get("context_length", 0)))
    ):
        tid = run.data.tags["trial_id"]
        # same trial id on the same cluster: the id deliberately ignores where it ran, speed does not
        cluster = run.data.params.get("cluster")
        same_cluster = f" and params.cluster = '{cluster}'" if cluster else ""
        prev = client.search_runs(
            [experiment_id],
            f"tags.trial_id = '{tid}' and tags.status = 'finished' and tags.sweep_id != '{sweep_id}' "
            f"and attributes.start_time < {run.info.start_time}{same_cluster}",
            order_by=["attributes.start_time DESC"],
            max_results=1,
        )
        if not prev:
            result.new.append(_label(run))
            continue
        base = prev[0]
        change = Change(tid, _label(run), base.data.tags.get("sweep_id", "?"))
        for m in SHOWN:
            if m in run.data.metrics and m in base.data.metrics:
                change.values[m] = (base.data.metrics[m], run.data.metrics[m])
        change.dropped = [m for m in GATED if m in change.values and -change.delta(m) > max_drop]
        result.changes.append(change)
    return result


def render(result: GateResult, console: Console | None = None) -> None:
    """Print the table of changes (red: a gated drop beyond the threshold); new trials get one line."""
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
    table = Table(
        title=f"regression gate: sweep {result.sweep_id} vs previous runs (max drop {result.max_drop:.0%})"
    )
    for col in ("trial", "baseline sweep", *SHOWN.values(), "verdict"):
        table.add_column(col, justify="left" if col in ("trial", "baseline sweep", "verdict") else "right")
    for c in result.changes:
        cells = []
        for m in SHOWN:
            if m not in c.values:
                cells.append("-")
                continue
            old, new = c.values[m]
            scale = 2**30 if m.endswith("bytes_per_device") else 1
            colour = "red" if m in c.dropped else ""
            text = f"{old / scale:.4g} → {new / scale:.4g} ({c.delta(m):+.1%})"
            cells.append(f"[{colour}]{text}[/]" if colour else text)
        verdict = "[red]REGRESSED[/]" if c.dropped else "[green]ok[/]"
        table.add_row(c.label, c.baseline_sweep, *cells, verdict)
    console.print(table)
    if result.new:
        n = len(result.new)
        console.print(
            f"{n} new {'trial' if n == 1 else 'trials'} not compared: no earlier run, a baseline from now on"
        )
    console.print(result.summary())


def gate(
    uri: str,
    experiment: str,
    sweep_id: str,
    max_drop: float = 0.10,
    tag: bool = True,
    console: Console | None = None,
) -> int:
    """Compare, print, tag the sweep's parent run; 0, or EXIT_REGRESSION when a gated metric dropped."""
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise ValueError(f"no experiment {experiment!r} in {uri}")
    result = compare(client, exp.experiment_id, sweep_id, max_drop)
    render(result, console)
    if tag:
        parents = client.search_runs(
            [exp.experiment_id], f"tags.sweep_id = '{sweep_id}' and tags.kind = 'sweep'", max_results=1
        )
        for p in parents:
            client.set_tag(p.info.run_id, "regression", str(bool(result.regressions)).lower())
            client.set_tag(p.info.run_id, "regression_summary", result.summary()[:5000])
    return EXIT_REGRESSION if result.regressions else 0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m orchestrator.regress", description=__doc__.splitlines()[0])
    ap.add_argument("sweep_id")
    ap.add_argument("--uri", default=os.environ.get("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db"))
    ap.add_argument("--experiment", default="cp_scaling")
    ap.add_argument("--max-drop", type=float, default=0.10)
    ap.add_argument("--no-tag", action="store_true", help="only print; leave the parent run untouched")
    a = ap.parse_args(argv)
    return gate(a.uri, a.experiment, a.sweep_id, a.max_drop, tag=not a.no_tag)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
