"""The answer for one point: every strategy x layout x mesh x memory policy (x batch x grad_accum where the
user allows them), the fastest few with the command lines that run them, and why the rest lose.

strategy.kernel is not searched: no planner term reads it (memory, work and steptime price the attention by
head_dim and hop length alone), so every kernel the platform allows gets the same figures; `auto` stands for all.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from jobs import strategies
from jobs.spec import ClusterSpec, MeshSpec, ModelSpec, StrategySpec, TrainSpec, TrialSpec
from jobs.strategies import rules
from orchestrator.plan import PlanRow, auto, memory, plan, plan_one, policies, resources, steptime, validity
from orchestrator.plan.cluster_model import ClusterModel, model_of
from orchestrator.plan.render import seconds


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
    words += [f"strategy.local={spec.strategy.local}"] if spec.strategy.local else []
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


@dataclass
class _Tally:
    """What the search has seen so far: per (strategy, mesh) the choices that fit, per strategy and policy
    family the leanest, per family its fastest and its first over host RAM, and why a strategy was invalid."""

    limit: int
    host_limit: int
    budget: float
    cm: ClusterModel
    fits: dict[tuple, list] = field(
        default_factory=dict
    )  # (strategy, mesh) -> (per-token step, hbm, spec, policy)
    lean: dict[str, tuple[int, TrialSpec, policies.Policy]] = field(default_factory=dict)
    fast: dict[str, tuple[float, TrialSpec, policies.Policy]] = field(default_factory=dict)
    host_over: dict[str, tuple[int, TrialSpec, policies.Policy]] = field(default_factory=dict)
    invalid: dict[str, str] = field(default_factory=dict)
    over: dict[tuple, int] = field(
        default_factory=dict
    )  # (strategy, layout, mesh) -> microbatch where none fit
    searched: int = 0

    def lost_before(self, key: tuple, micro: int) -> bool:
        """Whether this (strategy, layout, mesh) fitted under no policy at a microbatch no larger than this."""
        return self.over.get(key, micro + 1) <= micro

    def mesh(self, spec0: TrialSpec, cands: list[policies.Policy], scale: float) -> bool:
        """Try every policy on one valid mesh; whether any fitted HBM. `scale` turns a step into a point-sized one."""
        fitted = False
        for p in cands:
            self.searched += 1
            spec = replace(spec0, train=p.apply(spec0.train))
            mem = memory.breakdown(spec)
            hbm = memory.peak(mem)
            for k in (spec.strategy.name, p.family):
                if k not in self.lean or hbm < self.lean[k][0]:
                    self.lean[k] = (hbm, spec, p)
            if self.limit and hbm > self.limit:
                continue
            fitted = True
            self.priced(spec, p, mem, hbm, scale)
        return fitted

    def priced(
        self, spec: TrialSpec, p: policies.Policy, mem: dict[str, int], hbm: int, scale: float
    ) -> None:
        """A choice that fits HBM: checked against host RAM and the step budget, then kept with its step."""
        host = resources.host_memory_bytes(spec, mem) if self.host_limit else 0
        if host > self.host_limit:
            self.host_over.setdefault(p.family, (host, spec, p))
            return
        step = steptime.step_time(spec, model=self.cm).step_s
        if self.budget > 0 and step > self.budget:
            return
        t = step * scale
        if p.family not in self.fast or t < self.fast[p.family][0]:
            self.fast[p.family] = (t, spec, p)
        self.fits.setdefault((spec.strategy.name, spec.mesh), []).append((t, hbm, spec, p))


def search(
    model: ModelSpec,
    cluster: ClusterSpec,
    context_length: int,
    train: TrainSpec | None = None,
    top: int = 5,
    tail: list[str] | None = None,
    batch: tuple[int, ...] = (),
    grad_accum: tuple[int, ...] = (),
    cluster_model: ClusterModel | None = None,
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
    cm = cluster_model or model_of(cluster)
    host_limit = int(cm.host_memory_bytes) if cluster.platform != "cpu" else 0
    tally = _Tally(int(cm.hbm_bytes_per_device), host_limit, float(cm.max_step_seconds), cm)
    cands, sized = policies.candidates(cluster.platform), bool(batch or grad_accum)
    for b, a in sizes(train, batch, grad_accum):
        tr, scale = replace(train, batch=b, grad_accum=a), train.batch / b  # to seconds per point-sized step
        for spec0 in _layouts(model, cluster, context_length, tr):
            key = (spec0.strategy.name, spec0.strategy.layout, spec0.strategy.local, spec0.mesh)
            if tally.lost_before(key, b // a):
                continue
            probs = [p for p in validity.problems(spec0) if p.rule != "memory policy"]
            if probs:
                tally.invalid.setdefault(spec0.strategy.name, f"{probs[0].rule}: {probs[0].message}")
            elif not tally.mesh(spec0, cands, scale):
                tally.over[key] = b // a
    # each mesh under its own best layout, size and policy; across meshes a tie also goes to the leaner one
    limit = tally.limit
    ranked = [
        (t, s, p) for t, _, s, p in auto.rank([auto.pick(runs, limit) for runs in tally.fits.values()], limit)
    ]
    chosen = tuple(Choice(s, plan_one(s, cm, []), p, command(s, p, tail, sized)) for _, s, p in ranked[:top])
    if not chosen:
        closest = _closest(model, cluster, context_length, tally.lean, tally.invalid, limit)
        return Answer((), (), closest, tally.searched)
    base = train.batch if sized else 0
    mix = _mix_line(ranked, base, cm)
    return Answer(chosen, _losers(ranked, tally, base) + ((mix,) if mix else ()), "", tally.searched)


def _layouts(model: ModelSpec, cluster: ClusterSpec, length: int, train: TrainSpec) -> list[TrialSpec]:
    """Every strategy under each of its layouts (its default first) on every candidate mesh, at one size; for a
    model with local or chunked layers, also each other strategy for those layers that shares the mesh and
    token order (strategy.local)."""
    out = []
    windowed = {"local", "chunked"} & set(model.attention_pattern)
    for name in strategies.CP_NAMES:
        s = strategies.get(name)
        for layout in sorted(s.layouts, key=lambda lay: lay != s.default_layout):
            for mesh in candidate_meshes(name, cluster.devices, train.batch, slices=cluster.slices_per_trial):
                shape = mesh.shape()
                locals_ = [""] + [
                    other
                    for other in strategies.CP_NAMES
                    if windowed
                    and other != name
                    and layout in strategies.get(other).layouts
                    and rules.mix_problem(name, other, shape, layout) is None
                ]
                for local in locals_:
                    strat = StrategySpec(name=name, layout=layout, local=local)
                    out.append(TrialSpec(model, mesh, strat, length, train=train, cluster=cluster))
    return out


def _leanest_words(hbm: int, spec: TrialSpec, p: policies.Policy, limit: int) -> str:
    cap = f" of {memory.gib(limit)}" if limit else ""
    return (
        f"the leanest ({spec.strategy.name} on {spec.mesh.label()}, {p.label()}) needs {memory.gib(hbm)}{cap}"
    )


def _losers(ranked: list, tally: _Tally, base: int) -> tuple[str, ...]:
    """Why each other strategy and each other policy family loses to the winner (ranked[0]); `base`: the point's
    own batch when the search chose sizes (their per-token times are scaled to it), else 0. Slower means beyond
    both bands: a loser whose band overlaps the winner's is a tie, lost on the tie-break."""
    (t0, win, win_policy), out = ranked[0], []
    lean, fast, invalid, limit, cm = tally.lean, tally.fast, tally.invalid, tally.limit, tally.cm
    for name in strategies.CP_NAMES:
        if name == win.strategy.name:
            continue
        mine = next(((t, s, p) for t, s, p in ranked if s.strategy.name == name), None)
        if mine:
            t, s, p = mine
            step = t * s.train.batch / base if base else t
            out.append(
                f"{name}: {_behind(t / t0, s, win, cm)} (its best: {_where(s, base)}, {p.label()}, {seconds(step)} s/step)"
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
                f"policy {fam}: {_behind(t / t0, s, win, cm)} at best ({p.label()}, {s.strategy.name} on "
                f"{_where(s, base)})"
            )
        elif fam in tally.host_over:
            used, s, p = tally.host_over[fam]
            out.append(
                f"policy {fam}: does not fit host RAM: {p.label()} ({s.strategy.name} on {s.mesh.label()}) needs "
                f"{memory.gib(used)} a host, the host has {memory.gib(tally.host_limit)}"
            )
        elif fam in lean:
            out.append(f"policy {fam}: does not fit: {_leanest_words(*lean[fam], limit)}")
    return tuple(out)


def _mix_line(ranked: list, base: int, cm: ClusterModel) -> str:
    """For a model with local or chunked layers: whether a strategy per layer type (strategy.local) pays, as
    the best candidate of the other kind against the winner ("" when no candidate mixes)."""
    t0, win, _ = ranked[0]
    mixed = bool(win.strategy.local)
    other = next(((t, s, p) for t, s, p in ranked if bool(s.strategy.local) != mixed), None)
    if other is None:
        return ""
    t, s, p = other
    step = t * s.train.batch / base if base else t
    what = "one strategy for every layer" if mixed else "a strategy per layer type"
    local = f" (local layers: {s.strategy.local})" if s.strategy.local else ""
    return (
        f"{what}: {_behind(t / t0, s, win, cm)} (its best: {s.strategy.name}{local} on {_where(s, base)}, "
        f"{p.label()}, {seconds(step)} s/step)"
    )


def _where(s: TrialSpec, sized: int) -> str:
    """A loser's mesh, with its layout when not the strategy's default, and its size when the search chose it."""
    words = [s.mesh.label()]
    if s.strategy.layout != strategies.get(s.strategy.name).default_layout:
        words.append(f"layout {s.strategy.layout}")
    if sized:
        words.append(f"batch {s.train.batch}" + (f"/{s.train.grad_accum}" if s.train.grad_accum > 1 else ""))
    return " ".join(words)


def _behind(r: float, loser: TrialSpec, winner: TrialSpec, cm: ClusterModel) -> str:
    """How a loser compares with the winner (`r`: its step over the winner's, per token): a tie when their bands
    overlap, else slower by its margin."""
    if overlap(winner, loser, r, cm):
        return f"a tie: {abs(r - 1) * 100:.1f}% apart, within the bands (lost on the tie-break: leaner or simpler)"
    return f"slower by {r:.2f}x, beyond the bands"


def overlap(winner: TrialSpec, loser: TrialSpec, r: float, cm: ClusterModel) -> bool:
    """Whether the loser's band reaches into the winner's: the winner's slow end at or past the loser's fast end
    (`r`: the loser's predicted step over the winner's, in the same units)."""
    w, lo = steptime.step_time(winner, model=cm), steptime.step_time(loser, model=cm)
    high = w.step_high_s / w.step_s if w.step_s else 1.0
    low = lo.step_low_s / lo.step_s if lo.step_s else 1.0
    return high >= r * low


def _closest(
    model: ModelSpec, cluster: ClusterSpec, length: int, lean: dict, invalid: dict, limit: int
) -> str:
    why = f"nothing fits {model.name} at {length:,} tokens on {cluster.name}"
    sized = [v for k, v in lean.items() if k in strategies.CP_NAMES]
    if sized:
        return f"{why}: {_leanest_words(*min(sized, key=lambda v: v[0]), limit)}"
    return f"{why}: every layout is invalid, e.g. " + next(iter(invalid.values()), "no candidate mesh")


@dataclass(frozen=True)
class Recommendation:
    spec: TrialSpec | None  # None: nothing fits
    row: PlanRow | None
    reason: str
    candidates: tuple[PlanRow, ...]
    dcn: str = ""  # the mesh axis the winner lays across slices ("" on one slice)


def _pow2_divisors(n: int) -> list[int]:
    return [d for d in (2**i for i in range(n.bit_length())) if n % d == 0]


def dcn_choices(strategy: str, mesh: MeshSpec, slices: int) -> list[str]:
    """Axes to lay across slices: the strategy's allowed ones whose size the slices divide. None fitting: its
    first sequence axis anyway, so the plan says why it may not cross (ulysses' all-to-all)."""
    if slices <= 1:
        return [""]
    s = strategies.get(strategy)
    ok = [a for a in s.dcn_axes if getattr(mesh, a) % slices == 0]
    return ok or list(s.axes[:1])


def candidate_meshes(
    strategy: str, devices: int, batch: int, max_tensor: int = 8, slices: int = 1
) -> list[MeshSpec]:
    """Every power-of-two split of the devices into fsdp (dividing the batch), tensor and the context axes;
    across slices, once per axis that may cross them."""
    out = []
    for fsdp in _pow2_divisors(min(devices, batch) if batch > 0 else 1):
        if batch % fsdp:
            continue
        for tensor in _pow2_divisors(devices // fsdp):
            if tensor > max_tensor:
                continue
            cp = devices // (fsdp * tensor)
            if cp < 2:
                continue
            for c, u in strategies.get(strategy).mesh_splits(cp):
                mesh = MeshSpec(fsdp=fsdp, tensor=tensor, context=c, context_ulysses=u)
                out += [replace(mesh, dcn=a) for a in dcn_choices(strategy, mesh, slices)]
    return out


def candidates(
    model: ModelSpec, cluster: ClusterSpec, context_length: int, train: TrainSpec | None = None
) -> list[TrialSpec]:
    train = train or TrainSpec()
    out = []
    for name in strategies.CP_NAMES:
        strat = StrategySpec(name=name, layout=strategies.get(name).default_layout)
        for mesh in candidate_meshes(name, cluster.devices, train.batch, slices=cluster.slices_per_trial):
            out.append(TrialSpec(model, mesh, strat, context_length, train=train, cluster=cluster))
    return out


def recommend(
    model: ModelSpec,
    cluster: ClusterSpec,
    context_length: int,
    train: TrainSpec | None = None,
    cluster_model: ClusterModel | None = None,
) -> Recommendation:
    """Plan every candidate; pick the fastest step the model predicts among the `run` verdicts, and say why.

    Ranked by the calibrated step-time model (steptime.py), not the roofline: the roofline prices attention
    at peak, so it cannot see that a small ring hop or a head_dim of 128 costs a layout its lead."""
    specs = candidates(model, cluster, context_length, train)
    cm = cluster_model or model_of(cluster)
    rows = plan(specs, [cm] * len(specs))
    ok = [(r, s) for r, s in zip(rows, specs, strict=True) if r.verdict == "run"]
    if not ok:
        fitting = [r for r in rows if r.predicted_hbm_bytes_per_device is not None]
        least = min(fitting, key=lambda r: r.predicted_hbm_bytes_per_device, default=None)
        why = f"nothing fits {model.name} at {context_length:,} tokens on {cluster.name}"
        if least is not None:
            why += f"; the leanest is {least.strategy} on {least.mesh}: {least.reason}"
        return Recommendation(None, None, why, tuple(rows))
    ok.sort(key=lambda rs: rs[0].predicted_step_s)
    best, spec = ok[0]
    hbm = memory.gib(best.predicted_hbm_bytes_per_device)
    why = (
        f"{best.strategy} on {best.mesh}: fastest of {len(ok)} feasible layouts, predicted {best.predicted_step_s:,.3g} s"
        f"/step at MFU {best.predicted_mfu:.2f} (roofline ≤ {best.roofline_mfu:.2f}) using {hbm}/device; "
        f"limited by {best.limiter}"
    )
    others = {}
    for r, _ in ok[1:]:
        others.setdefault(r.strategy, r)  # each other strategy's own best
    if others:
        why += "; next: " + ", ".join(
            f"{r.strategy} {r.mesh} {r.predicted_step_s / best.predicted_step_s:.2f}x slower"
            for r in others.values()
        )
    missing = [n for n in strategies.CP_NAMES if n != best.strategy and n not in others]
    for name in missing:
        mine = [r for r in rows if r.strategy == name]
        top = min(
            mine,
            key=lambda r: (r.verdict != "infeasible", r.predicted_hbm_bytes_per_device or 0),
            default=None,
        )
        if top is not None:
            why += f"; {name} never {'fits' if top.verdict == 'infeasible' else 'is valid'}: {top.reason}"
    if cluster.slices_per_trial > 1:
        rivals = [next(rs for rs in ok if rs[0] is r) for r in others.values() if r.strategy != best.strategy]
        why += "; " + _across_slices(cluster.slices_per_trial, [(best, spec), *rivals])
    return Recommendation(spec, best, why, tuple(rows), dcn=spec.mesh.dcn)


def _across_slices(slices: int, ranked: list[tuple[PlanRow, TrialSpec]]) -> str:
    """Which axis crosses the slices and why, for the winner and each other strategy's best layout."""
    words = []
    for r, s in ranked:
        what = strategies.get(s.strategy.name).dcn_words(s.mesh.shape(), s.mesh.dcn)
        words.append(f"{r.strategy} with dcn={s.mesh.dcn}: {what}, exposed {r.dcn_exposed_s:,.3g} s/step")
    return f"across {slices} slices, {words[0]}" + "".join(f"; {w}" for w in words[1:])
