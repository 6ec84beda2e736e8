"""The answer for one point: every strategy x layout x mesh x memory policy (x batch x grad_accum where the
user allows them), the fastest few with the command lines that run them, and why the rest lose.

strategy.kernel is not searched: no planner term reads it (memory, work and steptime price the attention by
head_dim and hop length alone), so every kernel the platform allows gets the same figures; `auto` stands for all.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from jobs import strategies
from jobs.spec import ClusterSpec, ModelSpec, StrategySpec, TrainSpec, TrialSpec
from orchestrator.plan import PlanRow, auto, memory, plan_one, policies, steptime, validate
from orchestrator.plan.recommend import candidate_meshes


@dataclass(frozen=True)
class Choice:
    """One feasible configuration: its plan row, its policy and the command line that runs it."""

    spec: TrialSpec
    row: PlanRow
    policy: policies.Policy
    command: str


@dataclass(frozen=True)
class Answer:
    """The ranked answer for one point; `top` empty means nothing fits, and `closest` says what comes nearest."""

    top: tuple[Choice, ...]
    losers: tuple[str, ...]
    closest: str
    searched: int  # strategy x layout x mesh x policy (x batch x grad_accum) combinations considered


def command(spec: TrialSpec, policy: policies.Policy, tail: list[str], sized: bool = False) -> str:
    """`python -m orchestrator ...` selecting exactly this spec; `tail` names the model, cluster and length;
    `sized`: the search chose train.batch and train.grad_accum too, so the line sets them."""
    m, t = spec.mesh, spec.train
    words = [f"strategy={spec.strategy.name}", f"strategy.layout={spec.strategy.layout}"]
    words += [f"mesh.{a}={getattr(m, a)}" for a in ("context", "context_ulysses", "fsdp", "tensor", "data")]
    words += [f"mesh.dcn={m.dcn}"] if m.dcn else []
    words += [f"train.batch={t.batch}", f"train.grad_accum={t.grad_accum}"] if sized else []
    return " ".join(["python -m orchestrator", *words, *policy.words(), *tail])


def sizes(
    train: TrainSpec, batch: tuple[int, ...] = (), grad_accum: tuple[int, ...] = ()
) -> list[tuple[int, int]]:
    """(batch, grad_accum) pairs to try, smallest microbatch first: the point's own values unless widened."""
    pairs = {(b, a) for b in batch or (train.batch,) for a in grad_accum or (train.grad_accum,) if b % a == 0}
    return sorted(pairs, key=lambda ba: (ba[0] // ba[1], ba[0], ba[1]))


def search(
    model: ModelSpec,
    cluster: ClusterSpec,
    context_length: int,
    train: TrainSpec | None = None,
    top: int = 5,
    tail: list[str] | None = None,
    batch: tuple[int, ...] = (),
    grad_accum: tuple[int, ...] = (),
) -> Answer:
    """Every strategy x layout x mesh x memory policy, and each (batch, grad_accum) the user allows; the `top`
    fastest feasible (strategy, mesh) pairs, each under its fastest layout, policy and size, and a line per
    losing strategy and policy family.

    Ranked by predicted seconds per token (step time at the point's own batch when the batch is not searched):
    a larger batch is worth it only if it raises throughput. Pruned so a 14M point plans in well under a
    second: a mesh is validated once per size (its rules do not depend on the policy), sized under every policy
    by the memory model alone (cheap), only the policies that fit get a step time, and a mesh whose leanest
    policy is over HBM at one microbatch is not tried at a larger one."""
    train, tail = train or TrainSpec(), tail or []
    limit, budget = int(cluster.hbm_bytes_per_device), float(cluster.max_step_seconds)
    cands = policies.candidates(cluster.platform)
    fits: dict[tuple, list] = {}  # (strategy, mesh) -> (per-token step, hbm, spec, policy) of each that fits
    lean: dict[str, tuple[int, TrialSpec, policies.Policy]] = {}  # strategy or family -> leanest seen
    fast: dict[str, tuple[float, TrialSpec, policies.Policy]] = {}  # policy family -> its fastest anywhere
    invalid: dict[str, str] = {}
    over: dict[tuple, int] = {}  # (strategy, layout, mesh) -> smallest microbatch where nothing fit
    searched, sized = 0, bool(batch or grad_accum)
    for b, a in sizes(train, batch, grad_accum):
        tr, scale = replace(train, batch=b, grad_accum=a), train.batch / b  # to seconds per point-sized step
        for name in strategies.CP_NAMES:
            s = strategies.get(name)
            for layout in sorted(s.layouts, key=lambda lay: lay != s.default_layout):
                strat = StrategySpec(name=name, layout=layout)
                for mesh in candidate_meshes(name, cluster.devices, b, slices=cluster.slices_per_trial):
                    if over.get((name, layout, mesh), b // a + 1) <= b // a:
                        continue
                    spec0 = TrialSpec(model, mesh, strat, context_length, train=tr, cluster=cluster)
                    probs = [p for p in validate.problems(spec0) if p.rule != "memory policy"]
                    if probs:
                        invalid.setdefault(name, f"{probs[0].rule}: {probs[0].message}")
                        continue
                    fitted = False
                    for p in cands:
                        searched += 1
                        spec = replace(spec0, train=p.apply(tr))
                        hbm = memory.peak(memory.breakdown(spec))
                        for k in (name, p.family):
                            if k not in lean or hbm < lean[k][0]:
                                lean[k] = (hbm, spec, p)
                        if limit and hbm > limit:
                            continue
                        fitted = True
                        step = steptime.step_time(spec).step_s
                        if budget > 0 and step > budget:
                            continue
                        t = step * scale
                        if p.family not in fast or t < fast[p.family][0]:
                            fast[p.family] = (t, spec, p)
                        fits.setdefault((name, mesh), []).append((t, hbm, spec, p))
                    if not fitted:
                        over[(name, layout, mesh)] = b // a
    # each mesh under its own best layout, size and policy; across meshes a tie also goes to the leaner one
    ranked = [(t, s, p) for t, _, s, p in auto.rank([auto.pick(runs) for runs in fits.values()])]
    chosen = tuple(Choice(s, plan_one(s, []), p, command(s, p, tail, sized)) for _, s, p in ranked[:top])
    if not chosen:
        return Answer((), (), _closest(model, cluster, context_length, lean, invalid), searched)
    return Answer(
        chosen, _losers(ranked, lean, fast, invalid, limit, train.batch if sized else 0), "", searched
    )


def _leanest_words(hbm: int, spec: TrialSpec, p: policies.Policy, limit: int) -> str:
    cap = f" of {memory.gib(limit)}" if limit else ""
    return (
        f"the leanest ({spec.strategy.name} on {spec.mesh.label()}, {p.label()}) needs {memory.gib(hbm)}{cap}"
    )


def _losers(ranked: list, lean: dict, fast: dict, invalid: dict, limit: int, base: int) -> tuple[str, ...]:
    """Why each other strategy and each other policy family loses to the winner (ranked[0]); `base`: the point's
    own batch when the search chose sizes (their per-token times are scaled to it), else 0."""
    (t0, win, win_policy), out = ranked[0], []
    for name in strategies.CP_NAMES:
        if name == win.strategy.name:
            continue
        mine = next(((t, s, p) for t, s, p in ranked if s.strategy.name == name), None)
        if mine:
            t, s, p = mine
            step = t * s.train.batch / base if base else t
            out.append(
                f"{name}: {_behind(t / t0)} (its best: {_where(s, base)}, {p.label()}, {step:,.3g} s/step)"
            )
        elif name in lean:
            out.append(f"{name}: does not fit: {_leanest_words(*lean[name], limit)}")
        else:
            out.append(f"{name}: invalid: {invalid.get(name, 'no candidate mesh')}")
    for fam in sorted({p.family for _, _, p in lean.values()} | set(fast)):
        if fam == win_policy.family:
            continue
        if fam in fast:
            t, s, p = fast[fam]
            out.append(
                f"policy {fam}: {_behind(t / t0)} at best ({p.label()}, {s.strategy.name} on {_where(s, base)})"
            )
        elif fam in lean:
            out.append(f"policy {fam}: does not fit: {_leanest_words(*lean[fam], limit)}")
    return tuple(out)


def _where(s: TrialSpec, sized: int) -> str:
    """A loser's mesh, with its layout when not the strategy's default, and its size when the search chose it."""
    words = [s.mesh.label()]
    if s.strategy.layout != strategies.get(s.strategy.name).default_layout:
        words.append(f"layout {s.strategy.layout}")
    if sized:
        words.append(f"batch {s.train.batch}" + (f"/{s.train.grad_accum}" if s.train.grad_accum > 1 else ""))
    return " ".join(words)


def _behind(r: float) -> str:
    """How a loser's step compares with the winner's: a tie (within TIE, lost on HBM) or slower by a factor."""
    if r < 1 + auto.TIE:
        return f"a tie within the model's precision ({abs(r - 1) * 100:.2f}% apart), lost on HBM"
    return f"slower by {r:.2f}x"


def _closest(model: ModelSpec, cluster: ClusterSpec, length: int, lean: dict, invalid: dict) -> str:
    why = f"nothing fits {model.name} at {length:,} tokens on {cluster.name}"
    sized = [v for k, v in lean.items() if k in strategies.CP_NAMES]
    if sized:
        return f"{why}: {_leanest_words(*min(sized, key=lambda v: v[0]), int(cluster.hbm_bytes_per_device))}"
    return f"{why}: every layout is invalid, e.g. " + next(iter(invalid.values()), "no candidate mesh")
