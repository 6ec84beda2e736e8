"""The recommender against the published runs: at each published context-parallel point, what
orchestrator.plan.search.search picks, the planner's prediction for the recipe's own layout and policy, and
the published MFU (no device, no jax):

    python benchmarks/published.py          # the table, as markdown
    python benchmarks/published.py --page   # docs/results/published.md, through orchestrator.provenance

A point is (cluster, model, context length, devices, global batch) of orchestrator/calibrate/published_tpu.py's rows
with a CP strategy; rows sharing one (PR #4836's layouts at one length) are one point, a recipe a line each.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace

from benchmarks import page
from jobs.spec import REMAT_NAMES, REMAT_PRESETS, MemorySpec, TrainSpec, TrialSpec
from orchestrator import provenance
from orchestrator.calibrate import published_tpu
from orchestrator.calibrate.tpu import check
from orchestrator.plan import PlanRow, plan_one, steptime
from orchestrator.plan.auto import TIE
from orchestrator.plan.memory import gib
from orchestrator.plan.policies import Policy
from orchestrator.plan.search import Answer, Choice, search

PROG = "python benchmarks/published.py"
K = 1024


def recipe_policy(row: published_tpu.Published) -> Policy:
    """The recipe's remat and host offload as one of the recommender's policies. calibration.check prices a row
    with `offload` overriding the host traffic only; here it goes into train.memory, so the memory model sees it
    too. MaxText's custom remat with `context` offloaded is save_attn with the attention output moved to host:
    train.remat=full plus train.memory.offload (validate refuses save_attn + offload of what it saves)."""
    saved, moved = REMAT_PRESETS.get(row.remat, ((), ()))
    names = [n for n in REMAT_NAMES if n in row.offload]
    if row.remat == "none" or not set(names) & set(saved):
        return Policy(row.remat, MemorySpec(offload=tuple(n for n in names if n not in moved)))
    keep = tuple(n for n in saved if n not in names)
    return Policy("full", MemorySpec(save=keep, offload=tuple(names)))


def recipe_spec(row: published_tpu.Published) -> TrialSpec:
    s = row.spec
    return replace(s, train=recipe_policy(row).apply(s.train))


@dataclass(frozen=True)
class Recipe:
    """One published row at its point: the planner on its own configuration, and what it measured."""

    row: published_tpu.Published
    spec: TrialSpec
    policy: Policy
    plan: PlanRow
    published: float  # MFU: the range's midpoint, or from the published step time
    calibrated: float  # calibration.check's prediction for the row (plan.predicted_mfu must equal it)


@dataclass(frozen=True)
class Point:
    key: tuple  # (cluster, model, length, devices, batch)
    recipes: tuple[Recipe, ...]
    answer: Answer

    @property
    def pick(self) -> Choice | None:
        return self.answer.top[0] if self.answer.top else None


def point_key(r: published_tpu.Published) -> tuple:
    return (r.cluster, r.model, r.length, r.chips_devices, r.batch)


def recipe(r: published_tpu.Published) -> Recipe:
    spec, c = recipe_spec(r), check(r)
    return Recipe(r, spec, recipe_policy(r), plan_one(spec), c.published, c.predicted)


def points(rows: list[published_tpu.Published] | None = None) -> list[Point]:
    """A point per distinct (cluster, model, length, devices, batch) of the CP rows, in ROWS order."""
    groups: dict[tuple, list[published_tpu.Published]] = {}
    for r in published_tpu.ROWS if rows is None else rows:
        if r.strategy != "none":
            groups.setdefault(point_key(r), []).append(r)
    out = []
    for key, rs in groups.items():
        cluster, model, length, devices, batch = key
        answer = search(
            published_tpu.model(model),
            published_tpu.cluster(cluster, devices),
            length,
            TrainSpec(batch=batch),
            top=1,
        )
        out.append(Point(key, tuple(recipe(r) for r in rs), answer))
    return out


def _terms(spec: TrialSpec) -> dict[str, float]:
    t = steptime.step_time(spec)
    return {
        "matmuls": t.matmul_s,
        "attention kernel": t.attention_s,
        "exposed ring transfer": t.exposed_ring_s,
        "K/V collectives": t.collectives_s,
        "exposed FSDP gathers": t.exposed_fsdp_s,
        "tensor all-reduces": t.tensor_s,
        "offload bandwidth": t.exposed_offload_s,
        "exposed DCN transfer": t.dcn_exposed_s,
        "fixed per-step cost": t.overhead_s,
    }


def differ(c: Choice, x: Recipe) -> list[str]:
    a, b = c.spec, x.spec
    return [
        w
        for w, d in (
            ("strategy", a.strategy.name != b.strategy.name),
            ("layout", a.strategy.layout != b.strategy.layout),
            ("mesh", a.mesh != b.mesh),
            ("policy", c.policy.key != x.policy.key),
        )
        if d
    ]


def same(c: Choice, x: Recipe) -> bool:
    return not differ(c, x)


def _words(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def why(c: Choice, x: Recipe) -> str:
    """One computed sentence: why the model prefers the pick to this recipe (or that they are the same)."""
    names, p = differ(c, x), x.plan
    if not names:
        return "same as the recipe"
    if p.verdict != "run":
        return f"the recipe is {p.verdict} per the planner: {p.reason}"
    head = f"differs in {_words(names)}"
    hbm = f"HBM {gib(c.row.predicted_hbm_bytes_per_device)} vs the recipe's {gib(p.predicted_hbm_bytes_per_device)}"
    ratio = p.predicted_step_s / c.row.predicted_step_s
    if ratio < 1 + TIE:  # the recommender's tie: the simplest policy that leaves 20 % of HBM free wins
        return f"{head}; a tie (step {1 / ratio - 1:+.2%} vs the recipe's; ties go to the simplest policy leaving 20 % HBM free): {hbm}"
    mine, theirs = _terms(c.spec), _terms(x.spec)
    term = max(mine, key=lambda k: theirs[k] - mine[k])
    fast = f"{ratio - 1:.1%}" if ratio < 1.1 else f"{ratio:.2f}x"
    text = f"{head}; {fast} faster step, largest saving {term} {theirs[term]:,.3g} s → {mine[term]:,.3g} s"
    if max(mine, key=mine.get) != max(theirs, key=theirs.get):
        text += f"; limited by {c.row.limiter.split(' (')[0]}, the recipe by {p.limiter.split(' (')[0]}"
    return f"{text}; {hbm}"


def _layout(spec: TrialSpec, policy: Policy) -> str:
    return f"{spec.strategy.name} {spec.strategy.layout} {spec.mesh.label()}, `{policy.label()}`"


def configs(pt: Point) -> list[list[Recipe]]:
    """The point's recipes grouped by configuration (a rerun of the same layout and policy is one line)."""
    out: dict[tuple, list[Recipe]] = {}
    for x in pt.recipes:
        s = x.spec
        out.setdefault((s.strategy.name, s.strategy.layout, s.mesh, x.policy.key), []).append(x)
    return list(out.values())


def _recipe_cells(xs: list[Recipe]) -> tuple[str, str, str]:
    x, p = xs[0], xs[0].plan
    own = (
        f"{p.predicted_mfu:.1%}, {gib(p.predicted_hbm_bytes_per_device)} ({p.verdict})"
        if (p.predicted_mfu is not None and p.predicted_hbm_bytes_per_device is not None)
        else f"— ({p.verdict})"
    )
    pubs = " / ".join(f"{y.published:.1%}" + (" **excluded**" if y.row.excluded else "") for y in xs)
    return _layout(x.spec, x.policy), own, pubs


HEAD = [
    "point",
    "recipe (layout, policy)",
    "planner on the recipe (MFU, HBM/device, verdict)",
    "published MFU",
    "recommender's pick",
    "pick: MFU, HBM/device",
    "why the pick",
]


def cells(pt: Point) -> list[str]:
    """One table row per point; a point's recipes one per line within their cells."""
    cluster, model, length, devices, batch = pt.key
    sources = ", ".join(dict.fromkeys(x.row.source for x in pt.recipes))
    where = f"{cluster} ×{devices}, {model}, {length // K:,}K tokens, batch {batch} ({sources})"
    groups = configs(pt)
    per = [_recipe_cells(xs) for xs in groups]
    c = pt.pick
    if c is None:
        pick, fig, reasons = "nothing fits", "—", [pt.answer.closest]
    else:
        pick = _layout(c.spec, c.policy)
        fig = f"{c.row.predicted_mfu:.1%}, {gib(c.row.predicted_hbm_bytes_per_device)}"
        reasons = [why(c, xs[0]) for xs in groups]
        if len(groups) > 1:
            reasons = [
                f"vs {xs[0].row.strategy} {xs[0].spec.mesh.label()}: {w}"
                for xs, w in zip(groups, reasons, strict=True)
            ]
    col = lambda i: "<br>".join(r[i] for r in per)  # noqa: E731
    return [where, col(0), col(1), col(2), pick, fig, "<br>".join(reasons)]


def markdown(pts: list[Point]) -> str:
    return page.table(HEAD, (cells(p) for p in pts))


NOTE = """\
The recommender (`orchestrator/plan/search.py`'s `search`: every CP strategy x mesh x memory policy, top 1)
at each point of a published TPU run with a context-parallel strategy (orchestrator/calibrate/published_tpu.py, with its
source; the [step-time calibration](calibration.md) sets the model against the same rows). A point is a cluster,
model, context length, device count and global batch; where several published layouts share one, each is a line
of its cells (a rerun of one configuration is one line, with both published figures).

Columns: *recipe* is the published layout (strategy, load-balancing layout, mesh) and its memory policy as
`train.*` overrides (a recipe's host offload of the attention output is `train.remat=full` plus
`train.memory.offload`). *Planner on the recipe* is `plan_one` on that configuration: predicted MFU, predicted
peak HBM per device and verdict (`run`, `infeasible` or `invalid`). *Published MFU* is the source's (the
midpoint of a range, or model FLOPs / (its step time × peak)); **excluded** marks rows no fit sees (the model
has no term for what made them differ; every other row is judged by the fit that never saw its table, on the
calibration page). *Recommender's pick* and *pick: MFU, HBM/device* are what `search` ranks first and the planner's
figures for it. *Why the pick* is computed: "same as the recipe" where strategy, layout, mesh and policy all
match; otherwise what differs, the ratio of predicted step times with the step-time term that accounts for most
of the gap (a tie within 0.5 % goes to the simplest policy that leaves 20 % of HBM free), the limiters where they differ, and both HBM figures; or the
planner's verdict and reason where the recipe does not run. Predictions, not measurements: a pick is only as
good as the model (its held-out errors and bands: the calibration page); it checks HBM and host RAM."""


def page_body(pts: list[Point] | None = None) -> str:
    pts = points() if pts is None else pts
    held = [x.row for p in pts for x in p.recipes if x.row.excluded]
    picked = [(p.pick, p.recipes) for p in pts if p.pick]
    full = sum(any(same(c, x) for x in xs) for c, xs in picked)
    layout = sum(any(set(differ(c, x)) <= {"policy"} for x in xs) for c, xs in picked)
    return f"""\
{markdown(pts)}

{len(pts)} points; the pick is a recipe's own configuration at {full}, and a recipe's strategy, layout and mesh
under another memory policy at {layout - full}.

## Excluded rows

""" + "\n".join(f"- {r.label}: {r.excluded}" for r in held)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    page.add_argument(ap, "published")
    a = ap.parse_args(argv)
    pts = points()
    made = provenance.current(PROG, argv)
    page.publish(
        a.page, "Recommender vs published runs", made, NOTE, page_body(pts) if a.page else markdown(pts)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
