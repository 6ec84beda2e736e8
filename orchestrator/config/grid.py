"""Expand a sweep into its grid points: one compose, each axis option loaded once, points built in memory.

A point is its frozen TrialSpec (what the hosts run) and its cluster as the planner prices it (ClusterModel:
the same cluster section's capacities, link rates and step-time constants, which never reach a host)."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping
from typing import Any, NamedTuple

from omegaconf import DictConfig, OmegaConf

from jobs import strategies
from jobs.spec import MeshSpec, ModelSpec, RunSpec, StrategySpec, TrainSpec, TrialSpec
from orchestrator.config import keys
from orchestrator.config.load import CONF_DIR, group_option
from orchestrator.config.schema import ConfigError, MeshConfig
from orchestrator.plan.cluster_model import ClusterModel, split

GROUP_AXES = ("model", "strategy", "mesh", "cluster")  # axis values name a config group option


class GridPoint(NamedTuple):
    """One point: the trial as its hosts run it, and its cluster as the planner prices it."""

    spec: TrialSpec
    cluster: ClusterModel


def _set(d: dict, dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for p in parents:
        if not isinstance(d.get(p), dict):
            raise ConfigError(
                f"sweep key {dotted!r} is not a config key — check the name against conf/config.yaml"
            )
        d = d[p]
    if leaf not in d:
        raise ConfigError(
            f"sweep key {dotted!r} is not a config key — check the name against conf/config.yaml"
        )
    d[leaf] = value


def _flatten(tree: dict, prefix: str = "") -> dict[str, list]:
    """Axes may nest (`train: {steps: [..]}`, as `+sweep.axes.train.steps=[..]` writes them) or be dotted."""
    out: dict[str, list] = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out |= _flatten(v, f"{prefix}{k}.")
        elif isinstance(v, list | tuple):
            out[f"{prefix}{k}"] = list(v)
        else:
            raise ConfigError(f"sweep axis {prefix}{k!r} must be a list of values, got {v!r}")
    return out


def _dotted(tree: dict, prefix: str = "") -> dict[str, Any]:
    """`set` may nest (`+sweep.set.train.steps=4` writes {train: {steps: 4}}): one dotted key per leaf, so a
    nested set changes that key, not its whole section."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        out |= _dotted(v, f"{prefix}{k}.") if isinstance(v, dict) and v else {f"{prefix}{k}": v}
    return out


def points(sweep: dict | None) -> list[tuple[tuple[str, Any], ...]]:
    """The grid's points as ((axis, value), ...): zipped groups move together, the rest are crossed."""
    if not sweep:
        return [()]
    axes = _flatten(sweep.get("axes") or {})
    for name, values in axes.items():
        if not values:
            raise ConfigError(f"sweep {sweep.get('name')!r}: axis {name!r} has no values — the grid is empty")
    zipped = [list(z) for z in (sweep.get("zip") or [])]
    for z in zipped:
        missing = [a for a in z if a not in axes]
        if missing:
            raise ConfigError(f"sweep zip names unknown axes {missing}; axes are {list(axes)}")
        lens = {a: len(axes[a]) for a in z}
        if len(set(lens.values())) != 1:
            raise ConfigError(f"sweep zip {z} needs equal-length axes, got {lens}")
    in_zip = {a for z in zipped for a in z}
    factors = [[tuple((a, axes[a][i]) for a in z) for i in range(len(axes[z[0]]))] for z in zipped]
    factors += [[((a, v),) for v in axes[a]] for a in axes if a not in in_zip]
    return [tuple(kv for f in combo for kv in f) for combo in itertools.product(*factors)]


def resolve_mesh(mesh: dict, strategy: str, model: dict, devices: int) -> MeshSpec:
    """Fill "auto" axes: every device not on data/fsdp/tensor goes to the strategy's context axes, split as
    its registry entry says (usp: the largest Ulysses degree the KV heads allow, keeping a ring of 2)."""
    m = MeshConfig(**mesh)  # the schema's defaults for the axes a mesh option leaves out
    fixed = m.data * m.fsdp * m.tensor
    hq, hkv = model["q_heads"] // m.tensor, max(model["kv_heads"] // m.tensor, 1)
    c, u = strategies.get(strategy).resolve_mesh(
        max(devices // fixed, 1), m.context, m.context_ulysses, hq, hkv
    )
    return MeshSpec(data=m.data, fsdp=m.fsdp, context=c, context_ulysses=u, tensor=m.tensor, dcn=m.dcn)


def expand(cfg: Mapping[str, Any], conf_dir=CONF_DIR) -> list[TrialSpec]:
    """Every point's TrialSpec, in grid order."""
    return [p.spec for p in expand_points(cfg, conf_dir)]


def expand_points(cfg: Mapping[str, Any], conf_dir=CONF_DIR) -> list[GridPoint]:
    """Every point of the sweep (or the single base point), in grid order, from the resolved config
    (config.load.Loaded.tree; an OmegaConf config is resolved here). A point asking `train.remat=auto` keeps it:
    the planner chooses (orchestrator/plan/auto.py)."""
    base = (
        OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else copy.deepcopy(dict(cfg))
    )
    sweep = base.pop("sweep", None)
    sets = _dotted((sweep or {}).get("set") or {})
    for dotted, value in sets.items():
        keys.check_sweep_key(dotted, "sweep.set key")
        _set(base, dotted, value)
    grid = points(sweep)
    for axis in _flatten((sweep or {}).get("axes") or {}):
        keys.check_sweep_key(axis, "sweep axis")
    options: dict[tuple[str, str], dict] = {}  # each group option read once
    specs, bad = [], []
    for point in grid:
        d = _point_tree(base, point, sets, options, conf_dir)
        found = keys.check_point(d)
        if found:  # keep going: the message says how many other points fail too
            bad.append((point, found[0]))
        elif not bad:
            specs.append(build(d, point))
    if bad:
        point, problem = bad[0]
        where = f"grid point {' '.join(f'{k}={v}' for k, v in point)}" if point else "the single trial"
        more = f"; {len(bad) - 1} more of {len(grid)} grid points fail too" if len(bad) > 1 else ""
        raise ConfigError(problem.line(where + more))
    return specs


def _point_tree(base: dict, point: tuple, sets: dict, options: dict, conf_dir) -> dict:
    """The base config with one grid point's values in place: a group axis swaps in its option (read once into
    `options`), with the sweep's set keys inside that group applied again; any other axis sets its key."""
    d = copy.deepcopy(base)
    for axis, value in point:
        if axis not in GROUP_AXES:
            _set(d, axis, value)
            continue
        key = (axis, str(value))
        if key not in options:
            options[key] = group_option(axis, str(value), conf_dir)
        d[axis] = copy.deepcopy(options[key])
        for dotted, v in sets.items():  # a set key inside the group holds for every option
            if dotted.startswith(f"{axis}."):
                _set(d, dotted, copy.deepcopy(v))
    return d


def build(d: dict, point: tuple = ()) -> GridPoint:
    """One point from a resolved config dict that passed keys.check_point, each section as its dataclass."""
    cluster, model = split(d["cluster"])
    spec = TrialSpec(
        model=keys.make(ModelSpec, d["model"]),
        mesh=resolve_mesh(d["mesh"], d["strategy"]["name"], d["model"], cluster.devices),
        strategy=keys.make(StrategySpec, d["strategy"]),
        context_length=d["context_length"],
        train=keys.make(TrainSpec, d["train"]),
        cluster=cluster,
        run=keys.make(RunSpec, d["run"]),
        # a list value (an axis over train.memory.save) as a tuple: specs are hashed (planner caches)
        axes=tuple((axis, tuple(v) if isinstance(v, list) else v) for axis, v in point),
    )
    return GridPoint(spec, model)
