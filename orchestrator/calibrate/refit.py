"""Refit a cluster's step-time constants on a finished sweep's own trials, holding out its longest lengths, and
write them as a cluster config the planner loads (`python -m orchestrator.calibrate --from-sweep ID`): every
trial before and after, the error summaries, a verdict, and the config with the fitted constants.

Each finished trial's spec (its `trial_spec.json`) is priced at the peak the trial measured itself, so the model
and the run divide by the same rate; the fit moves only the constants these trials tell apart
(`constrained`), with the published fit's coordinate search (orchestrator/calibrate/fit.py).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from jobs.spec import TrialSpec
from orchestrator import provenance
from orchestrator.calibrate import fit
from orchestrator.calibrate.fit import Knob, Measured
from orchestrator.calibrate.published_tpu import CONF
from orchestrator.plan import cluster_model
from orchestrator.plan.cluster_model import model_of
from orchestrator.plan.steptime import SETTLED, step_time
from orchestrator.provenance import Provenance
from orchestrator.tracking.finished import SPEC_ARTIFACT, finished_runs, run_spec

# What a sweep of one cluster may refit, with bounds wide enough for a CPU host (its blockwise kernel reaches
# ~20 % of the matmul probe's rate). The family's head_dim and replay constants stay as the base has them: a
# sweep of one model and one remat policy cannot tell them apart.
BOUNDS = {
    "matmul_efficiency": (0.01, 1.0),
    "attention_efficiency": (0.01, 1.0),
    "call_overhead_s": (0.0, 0.05),
    "layer_overhead_s": (0.0, 0.5),
    "collective_efficiency": (0.01, 1.0),
    "collective_latency_s": (0.0, 0.05),
    "step_overhead_s": (0.0, 5.0),
}
CANDIDATES = tuple(BOUNDS)
KEPT = ("attention_head_dim_half", "attention_recompute", "offload_exposed")
SEPARABLE = 0.1  # smallest singular value of the kept constants' unit sensitivity columns
COMMAND = "python -m orchestrator.calibrate"
NAN = float("nan")


@dataclass(frozen=True)
class Trial:
    """One finished trial: its spec at the rate it ran at, its measured median step, the sweep's predictions."""

    run_id: str
    spec: TrialSpec  # cluster.peak_tflops_per_device: the run's own measured peak (on CPU)
    measured_s: float
    predicted_s: float  # logged at plan time, at the planner's peak (NaN: not logged)
    at_run_peak_s: float  # the same model at the trial's own peak (NaN: not logged)

    @property
    def label(self) -> str:
        return f"{self.spec.strategy.name} L={self.spec.context_length} {self.spec.mesh.label()}"


def read_sweep(uri: str, sweep_id: str, experiment: str = "cp_scaling") -> tuple[list[Trial], list[str]]:
    """The sweep's finished trials, by context length; and the finished runs left out, with why."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    from mlflow import MlflowClient  # only this path needs mlflow; the published table does not

    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        raise LookupError(f"no tracking store at {uri} (pass the sweep's with --uri)")
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise LookupError(f"no experiment {experiment!r} in {uri} (--experiment names it)")
    trials, skipped = [], []
    for r in finished_runs(client, exp.experiment_id, sweep_id):
        m, rid = r.data.metrics, r.info.run_id
        measured = m.get("final_step_time_median_s", NAN)
        if not measured > 0:
            skipped.append(f"{rid}: no final_step_time_median_s")
            continue
        try:  # a spec an older (or newer) TrialSpec wrote may not load
            spec = run_spec(client, rid)
        except (OSError, TypeError, ValueError, KeyError) as e:
            skipped.append(f"{rid}: {SPEC_ARTIFACT} does not load ({type(e).__name__}: {e})")
            continue
        # a spec-sheet peak is what the run divided by; peak 0 (CPU) means the run measured its own
        peak = spec.cluster.peak_tflops_per_device or m.get("peak_tflops_per_device", NAN)
        if not peak > 0:
            skipped.append(f"{rid}: no peak_tflops_per_device")
            continue
        spec = replace(spec, cluster=replace(spec.cluster, peak_tflops_per_device=float(peak)))
        got = (m.get("predicted_step_time_s", NAN), m.get("predicted_step_time_at_run_peak_s", NAN))
        trials.append(Trial(rid, spec, float(measured), *got))
    if not trials:
        raise LookupError(
            f"sweep {sweep_id!r} has no finished trial with a step time in {experiment!r} at {uri}"
        )
    return sorted(trials, key=lambda t: (t.spec.context_length, t.label)), skipped


def constrained(
    rows: Sequence[Measured], keys: Sequence[str] = CANDIDATES
) -> tuple[list[str], dict[str, str]]:
    """The constants these trials pin down, and why each other one of `keys` is left as it was.

    A constant's column is d log(step)/d constant over the trials. Two constants whose columns are parallel move
    every trial's step in the same proportion, so no fit can tell them apart: taken in order of the share of
    the step each controls (|d log step / d log constant|), a constant is kept only while the kept columns,
    scaled to unit length, stay independent (smallest singular value >= SEPARABLE), and one per trial at most."""
    cols, share = {}, {}
    for k in keys:
        lo, hi = BOUNDS[k]
        v = float(getattr(model_of(rows[0][0].cluster), k))
        h = 1e-3 * (hi - lo) * (1 if v < hi else -1)
        col = [_log_step(s, {k: v + h}) - _log_step(s, {k: v}) for s, _ in rows]
        cols[k], share[k] = np.array(col) / h, abs(v) * float(np.mean(np.abs(col))) / abs(h)
    kept: list[str] = []
    why: dict[str, str] = {}
    for k in sorted(keys, key=lambda k: (-share[k], keys.index(k))):
        norm = float(np.linalg.norm(cols[k]))
        if norm < 1e-9:
            why[k] = "no trial's step depends on it"
            continue
        unit = {j: cols[j] / np.linalg.norm(cols[j]) for j in [*kept, k]}
        sv = np.linalg.svd(np.stack(list(unit.values()), axis=1), compute_uv=False)
        if len(kept) == len(rows):
            why[k] = f"{len(rows)} trials pin down {len(rows)} constants at most"
        elif sv[-1] < SEPARABLE:
            near = max(kept, key=lambda j: abs(float(unit[j] @ unit[k])))
            why[k] = f"moves these trials' steps as {near} does (not separable)"
        else:
            kept.append(k)
    return [k for k in keys if k in kept], why


def with_constants(spec: TrialSpec, params: dict[str, float]) -> cluster_model.ClusterModel:
    """The trial's cluster as the planner prices it, with these step-time constants replaced."""
    return replace(model_of(spec.cluster), **params)


def _log_step(spec: TrialSpec, params: dict[str, float]) -> float:
    return float(np.log(step_time(spec, model=with_constants(spec, params)).step_s))


@dataclass(frozen=True)
class Refit:
    """A sweep's trials with the constants it ran with (before) and refitted on its shorter lengths (after)."""

    sweep_id: str
    uri: str
    cluster: str  # the base config, conf/cluster/<cluster>.yaml
    hold_out_from: int  # trials of this context length and longer are never fitted on
    trials: tuple[Trial, ...]
    fitted: dict[
        str, float
    ]  # the constants fitted (and the band): new values, 4 significant figures, as written
    base: dict[str, float]  # every constant of BOUNDS and the band as the sweep ran with it
    left: dict[str, str]  # the constants not fitted, and why
    before: tuple[float, ...]  # predicted step per trial, s
    after: tuple[float, ...]

    def held(self, t: Trial) -> bool:
        return t.spec.context_length >= self.hold_out_from

    def errors(self, held: bool, after: bool) -> list[tuple[float, Trial]]:
        pred = self.after if after else self.before
        return [
            (p / t.measured_s - 1, t) for t, p in zip(self.trials, pred, strict=True) if self.held(t) == held
        ]


def refit(
    trials: Sequence[Trial], sweep_id: str = "", uri: str = "", hold_out_from: int | None = None
) -> Refit:
    """Fit the constants the trials below `hold_out_from` (default: the sweep's longest length) constrain."""
    names = sorted({t.spec.cluster.name for t in trials})
    if len(names) != 1:
        raise ValueError(f"the sweep ran on {len(names)} clusters ({', '.join(names)}): one fit per cluster")
    lengths = sorted({t.spec.context_length for t in trials})
    if hold_out_from is None:  # a one-length sweep holds nothing out: every trial is fitted on
        hold_out_from = lengths[-1] if len(lengths) > 1 else lengths[-1] + 1
    rows = [(t.spec, t.measured_s) for t in trials if t.spec.context_length < hold_out_from]
    if not rows:
        raise ValueError(f"no trial below --hold-out-from {hold_out_from} to fit on (lengths: {lengths})")
    keys, left = constrained(rows)
    left |= {
        k: "the family's, fitted on published runs; a sweep of one model and policy cannot move it"
        for k in KEPT
    }
    model = model_of(rows[0][0].cluster)
    base = {k: float(getattr(model, k)) for k in (*CANDIDATES, *KEPT, *BAND)}
    measured = [Measured(f"{s.trial_id}", "sweep", names[0], s, m) for s, m in rows]
    knobs = [Knob(k, *BOUNDS[k], per_chip=True) for k in keys]
    found = fit.fit(measured, knobs, {names[0]: model})[names[0]] if knobs else {}
    fitted = {k: float(f"{v:.4g}") for k, v in found.items() if k in keys}  # as the config will hold them
    before = tuple(step_time(t.spec).step_s for t in trials)
    after_st = [step_time(t.spec, model=with_constants(t.spec, fitted)) for t in trials]
    after = tuple(st.step_s for st in after_st)
    held = [(t, st) for t, st in zip(trials, after_st, strict=True) if t.spec.context_length >= hold_out_from]
    fitted |= _band(held, model)
    return Refit(sweep_id, uri, names[0], hold_out_from, tuple(trials), fitted, base, left, before, after)


BAND = ("step_band_low", "step_band_high", "fixed_band_low", "fixed_band_high")


def _band(held: list, model: cluster_model.ClusterModel) -> dict[str, float]:
    """The band from the sweep's own held-out trials under the refit (measured over predicted, each regime's
    range); a regime without held-out trials keeps the base's. Few trials give the range they span, not a
    coverage the published fit's quantiles claim: the band says what this sweep has measured."""
    out = {}
    for regime, keep in (
        ("step", lambda st: st.settled >= SETTLED),
        ("fixed", lambda st: st.settled < SETTLED),
    ):
        ratios = [t.measured_s / st.step_s for t, st in held if keep(st)]
        if ratios:
            out[f"{regime}_band_low"] = float(f"{min(min(ratios), 1.0):.4g}")
            out[f"{regime}_band_high"] = float(f"{max(max(ratios), 1.0):.4g}")
    return out


def add_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("refit from a sweep (orchestrator/calibrate/refit.py)")
    g.add_argument(
        "--from-sweep", metavar="SWEEP_ID", help="refit the sweep's cluster on its finished trials"
    )
    g.add_argument(
        "--uri", default="sqlite:///mlflow.db", help="the sweep's tracking store (default: %(default)s)"
    )
    g.add_argument("--experiment", default="cp_scaling", help="its MLflow experiment (default: %(default)s)")
    g.add_argument(
        "--hold-out-from",
        type=int,
        metavar="LENGTH",
        help="never fit on trials this long or longer (default: the sweep's longest length)",
    )
    g.add_argument(
        "--out", metavar="PATH", help="the cluster config to write (default conf/cluster/<cluster>_fit.yaml)"
    )


def main(a: argparse.Namespace, argv: list[str]) -> int:
    """--from-sweep: print the refit, write the config; a sweep that cannot be refitted is one error: line."""
    try:
        trials, skipped = read_sweep(a.uri, a.from_sweep, a.experiment)
        r = refit(trials, a.from_sweep, a.uri, a.hold_out_from)
        out = Path(a.out) if a.out else CONF / "cluster" / f"{r.cluster}_fit.yaml"
        text = cluster_yaml(r, out.stem, provenance.current(COMMAND, argv))
    except (LookupError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(report(r, skipped))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    use = "" if out.resolve().parent == (CONF / "cluster").resolve() else "copy it to conf/cluster/, then "
    print(f"\nwrote {out}: {use}python -m orchestrator cluster={out.stem} ... plans with these constants")
    return 0


def _mean(errors: list[tuple[float, Trial]]) -> float:
    return sum(abs(e) for e, _ in errors) / len(errors)


def summary(r: Refit, held: bool) -> str:
    """Mean |error| and the worst trial, before -> after, for the held-out (or calibration) trials."""
    role = f"held out (L >= {r.hold_out_from:,})" if held else f"calibration (L < {r.hold_out_from:,})"
    n = len(r.errors(held, after=False))
    if n == 0:
        return f"{role}: no trials"
    parts = []
    for after in (False, True):
        e = r.errors(held, after)
        worst = max(e, key=lambda x: abs(x[0]))
        parts.append((f"{_mean(e):.0%}", f"{worst[0]:+.0%} ({worst[1].label})"))
    (m0, w0), (m1, w1) = parts
    return f"{role}, {n} trials: mean |error| {m0} before, {m1} after; worst {w0} before, {w1} after"


def verdict(r: Refit) -> str:
    """Whether to plan with the refit: the held-out trials decide (a fit always improves its own trials)."""
    if not r.errors(held=True, after=False):
        return "nothing held out, so nothing shows the refit extrapolates: check it with --hold-out-from"
    before, after = (_mean(r.errors(held=True, after=a)) for a in (False, True))
    fmt = ".0%" if f"{before:.0%}" != f"{after:.0%}" else ".1%"  # a change under a point still shows
    said = f"({before:{fmt}} -> {after:{fmt}} mean |error|)"
    if after < before:
        return f"the refit predicts the held-out trials better {said}: plan with it"
    one = len({t.spec.context_length for t in r.trials if not r.held(t)}) == 1
    why = (
        ": its trials span one context length, where a fixed cost per step and the attention kernel's rate "
        "move every step alike, so the fit cannot tell which grows with the length"
        if one
        else ""
    )
    return (
        f"the refit predicts the held-out trials worse {said}{why}; keep conf/cluster/{r.cluster}.yaml, or "
        "refit on a sweep with more lengths below the held-out ones"
    )


def report(r: Refit, skipped: Sequence[str] = ()) -> str:
    """What was fitted and why, every trial before and after, both error summaries and the verdict."""
    moved = ", ".join(f"{k} {r.base[k]:.4g} -> {v:.4g}" for k, v in r.fitted.items())
    lines = [
        f"sweep {r.sweep_id} (cluster={r.cluster}, {len(r.trials)} finished trials; store {r.uri})",
        f"fitted on the trials below L={r.hold_out_from:,}: {moved or 'nothing'}",
        *(f"not fitted: {k} ({why}), kept at {r.base[k]:.4g}" for k, why in r.left.items()),
        *(f"left out: {s}" for s in skipped),
        "",
        "| trial | role | measured s | predicted before s | predicted after s | error before | error after |",
        "|---|---|---|---|---|---|---|",
    ]
    for t, b, a in zip(r.trials, r.before, r.after, strict=True):
        role = "held out" if r.held(t) else "calibration"
        lines.append(
            f"| {t.label} | {role} | {t.measured_s:.3f} | {b:.3f} | {a:.3f} | "
            f"{b / t.measured_s - 1:+.0%} | {a / t.measured_s - 1:+.0%} |"
        )
    drift = [t.label for t, b in zip(r.trials, r.before, strict=True) if abs(b / t.at_run_peak_s - 1) > 0.01]
    if drift:  # "before" is today's model at the trial's peak; the sweep logged an older model's figure
        lines += ["", f"note: predicted before is not the logged at-run-peak figure for {', '.join(drift)}"]
    return "\n".join([*lines, "", summary(r, held=False), summary(r, held=True), f"verdict: {verdict(r)}"])


def _num(v: float) -> str:
    """A float OmegaConf reads back as one (YAML 1.1 reads `1e-05`, without a dot, as a string)."""
    s = repr(float(v))
    return s.replace("e", ".0e") if "e" in s and "." not in s else s


def _points(trials: list[Trial]) -> str:
    names = ", ".join(sorted({t.spec.strategy.name for t in trials}))
    return f"{names} at " + ", ".join(f"{n:,}" for n in sorted({t.spec.context_length for t in trials}))


def cluster_yaml(r: Refit, name: str, made: Provenance) -> str:
    """conf/cluster/<base>.yaml with `name` and the fitted constants replaced, under a header that says where
    they came from. The base's full-line comments after its first key go: they describe the base's own fit."""
    cal, held = [t for t in r.trials if not r.held(t)], [t for t in r.trials if r.held(t)]
    head = [
        f"cluster={name}: conf/cluster/{r.cluster}.yaml with its step-time constants refitted on a sweep's own "
        "trials, each priced at the peak it measured itself; every other key is the base's.",
        f"Sweep {r.sweep_id}, tracking URI {r.uri}.",
        f"Made by `{made.command}` on {made.date} at commit {made.commit}.",
        f"Fitted on {len(cal)} trials ({_points(cal)}): "
        + ", ".join(f"{k} {r.base[k]:.4g} -> {v:.4g}" for k, v in r.fitted.items())
        + ".",
        f"Held out {len(held)} trials" + (f" ({_points(held)})." if held else "."),
        f"Errors (predicted / measured step - 1): {summary(r, held=False)}; {summary(r, held=True)}.",
        "Not fitted: " + "; ".join(f"{k} ({why})" for k, why in r.left.items()) + ".",
        f"Verdict: {verdict(r)}.",
    ]
    wrap = dict(width=112, subsequent_indent="#   ", break_long_words=False, break_on_hyphens=False)
    out = [line for item in head for line in textwrap.wrap(item, initial_indent="# ", **wrap)]
    base = CONF / "cluster" / f"{r.cluster}.yaml"
    if not base.exists():
        raise LookupError(f"the sweep ran on cluster {r.cluster!r}, which has no {base} to refit")
    keep_continuation, seen_key, missing = False, False, dict(r.fitted)
    for line in base.read_text().splitlines():
        key = re.match(r"^(\w+):", line)
        if key is None:
            if (line.startswith(" ") and keep_continuation) or (not seen_key and line.strip()):
                out.append(line)  # a kept key's wrapped comment, or the base's opening description
            continue
        k, seen_key = key.group(1), True
        keep_continuation = k not in r.fitted and k != "name"
        if k == "name":
            out.append(f"name: {name}")
        elif k in r.fitted:
            out.append(f"{k}: {_num(missing.pop(k))}  # fitted ({r.cluster}: {r.base[k]:.4g})")
        else:
            out.append(line)
    out += [f"{k}: {_num(v)}  # fitted ({r.cluster}: {r.base[k]:.4g})" for k, v in missing.items()]
    text = "\n".join(out) + "\n"
    cluster_model.split(OmegaConf.to_container(OmegaConf.create(text)))  # fails here, not at the next sweep
    return text
