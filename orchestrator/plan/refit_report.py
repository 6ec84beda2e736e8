"""What a sweep's refit (orchestrator/plan/refit.py) prints and writes: every trial before and after, the error
summaries and a verdict, and the cluster config with the fitted constants."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence
from typing import TYPE_CHECKING

from omegaconf import OmegaConf

from jobs.spec import ClusterSpec
from orchestrator.plan.published import CONF
from orchestrator.provenance import Provenance

if TYPE_CHECKING:
    from orchestrator.plan.refit import Refit, Trial


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
    said = f"({before:.0%} -> {after:.0%} mean |error|)"
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
        lines.append(f"| {t.label} | {role} | {t.measured_s:.3f} | {b:.3f} | {a:.3f} | "
                     f"{b / t.measured_s - 1:+.0%} | {a / t.measured_s - 1:+.0%} |")  # fmt: skip
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
        + ", ".join(f"{k} {r.base[k]:.4g} -> {v:.4g}" for k, v in r.fitted.items()) + ".",
        f"Held out {len(held)} trials" + (f" ({_points(held)})." if held else "."),
        f"Errors (predicted / measured step - 1): {summary(r, held=False)}; {summary(r, held=True)}.",
        "Not fitted: " + "; ".join(f"{k} ({why})" for k, why in r.left.items()) + ".",
        f"Verdict: {verdict(r)}.",
    ]  # fmt: skip
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
    ClusterSpec(**OmegaConf.to_container(OmegaConf.create(text)))  # fails here, not at the next sweep
    return text
