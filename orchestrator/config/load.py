"""Compose the Hydra config once, turn config errors into one clear line, and show what composed (--info)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.default_element import DefaultsTreeNode, GroupDefault, InputDefault
from hydra.core.global_hydra import GlobalHydra
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from jobs import fields, strategies
from jobs.spec import ModelSpec, RunSpec, TrainSpec
from orchestrator import REPO
from orchestrator.config import keys
from orchestrator.config.schema import ConfigError, Options

__all__ = [
    "CONF_DIR",
    "GROUPS",
    "Loaded",
    "compose_tree",
    "group_option",
    "info",
    "load",
    "load_typed",
    "section_defaults",
    "switch_defaults",
    "typed",
]

CONF_DIR = REPO / "conf"
GROUPS = ("model", "strategy", "mesh", "cluster", "tracking", "sweep")
SWITCHES = "switches"  # the config node of the switches' defaults, in conf/config.yaml's defaults list
# likewise a trial section's declared defaults, each merged under its section: model_keys before the chosen model
# file (so a model file need not list every key), train_keys and run_keys after conf/config.yaml's own keys
SECTION_KEYS = {
    "model_keys": ("model", ModelSpec),
    "train_keys": ("train", TrainSpec),
    "run_keys": ("run", RunSpec),
}


# `${cp_strategies:}` in a sweep: every CP strategy of the registry, so a new one joins the sweeps by itself.
OmegaConf.register_new_resolver("cp_strategies", lambda: list(strategies.CP_NAMES), replace=True)


def _plain(v: Any) -> Any:
    """A default as a composed config holds it: a section as a mapping, a tuple as a list."""
    if dataclasses.is_dataclass(v):
        return {f.name: _plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
    return list(v) if isinstance(v, tuple) else v


def switch_defaults() -> dict[str, Any]:
    """The driver's switches (Options' fields that are no config group) at their declared defaults, in the
    composed config's form: what the `switches` node of conf/config.yaml's defaults list composes in."""
    return {f.name: _plain(fields.default(f)) for f in dataclasses.fields(Options) if f.name not in GROUPS}


def section_defaults(section: type) -> dict[str, Any]:
    """A trial section's keys that have a declared default (jobs/spec.py), at it, in the composed config's form:
    what a `*_keys` node of conf/config.yaml's defaults list composes in under its section."""
    found = {f.name: fields.default(f) for f in dataclasses.fields(section)}
    return {k: _plain(v) for k, v in found.items() if v is not fields.MISSING}


# The defaults are their declarations' (jobs/spec.py, orchestrator/config/schema.py), never restated in YAML:
# Hydra reads each as a config of its own (the schema provider, structured://), so an override sets a key of
# one as it sets any YAML key, and `model.sinks=true` sets a key the model file left at its default.
def _store_defaults() -> None:
    store = ConfigStore.instance()
    store.store(name=SWITCHES, node=switch_defaults())
    for name, (package, section) in SECTION_KEYS.items():
        store.store(name=name, node=section_defaults(section), package=package)


_store_defaults()


@dataclass(frozen=True)
class Loaded:
    """A composed config, resolved once: the tree grid.expand_points turns into trials, the driver's switches
    typed, and the plain overrides it was composed from."""

    tree: dict[str, Any]
    options: Options
    overrides: tuple[str, ...] = ()


def typed(tree: dict[str, Any], overrides: Iterable[str] = ()) -> Loaded:
    """Check a resolved config's top-level options against the schema (the first problem raises) and type
    them; trial keys are checked per grid point by grid.expand_points."""
    return Loaded(tree, keys.check_options(tree), tuple(overrides))


def compose_tree(overrides: Iterable[str], conf_dir: Path = CONF_DIR) -> dict[str, Any]:
    """`config.yaml` composed with command-line overrides (Hydra's own grammar) and resolved, as plain data."""
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
            cfg = compose(config_name="config", overrides=list(overrides))
        return OmegaConf.to_container(cfg, resolve=True)
    except Exception as e:  # hydra raises several types; all mean "bad input"
        raise ConfigError(_one_line(e, overrides)) from e


def load_typed(overrides: list[str], conf_dir: Path = CONF_DIR) -> Loaded:
    """Compose, resolve, then check and type the driver's options: once."""
    return typed(compose_tree(overrides, conf_dir), overrides)


def load(overrides: list[str], conf_dir: Path = CONF_DIR) -> DictConfig:
    """load_typed's tree, checked the same, as an OmegaConf config: for callers that expand it into trials or
    read a section by attribute."""
    return OmegaConf.create(load_typed(overrides, conf_dir).tree)


def _one_line(e: Exception, overrides: Iterable[str]) -> str:
    msg = " ".join(str(e).split())
    for g in GROUPS:
        if f"'{g}'" in msg and ("Could not find" in msg or "not found" in msg):
            opts = sorted(p.stem for p in (CONF_DIR / g).glob("*.yaml"))
            return f"{msg.split('Available options')[0].strip()} — choose {g} from: {', '.join(opts)}"
    if "Key '" in msg and "not in struct" in msg:
        return f"{msg.split(' full_key')[0]} — check the key name, or add it with '+key=value'"
    return msg


def group_option(group: str, name: str, conf_dir: Path | Sequence[Path] = CONF_DIR) -> dict:
    """One option of a config group (conf/<group>/<name>.yaml) as a plain dict, read as the driver composes
    it (OmegaConf: YAML 1.1 would read `9.0e10` as a string). The one reader of a group option: the grid
    (once per axis value, not per point), the planner's published rows, tests and benchmarks. Several
    directories (conf/ and a user's, cli.args.search_dirs) are searched in order, as Hydra searches them."""
    dirs = [Path(conf_dir)] if isinstance(conf_dir, str | Path) else [Path(d) for d in conf_dir]
    for d in dirs:
        if (path := d / group / f"{name}.yaml").exists():
            return OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    opts = sorted({p.stem for d in dirs for p in (d / group).glob("*.yaml")})
    raise ConfigError(f"unknown {group} {name!r} in the sweep grid — choose from: {', '.join(opts)}")


def info(overrides: Iterable[str], what: str = "all", conf_dir: Path = CONF_DIR) -> str:
    """What Hydra's `--info` shows, from the compose API's config loader: the search path, the config groups,
    the defaults tree and list (composition order). Hydra's own `hydra/` configs are left out: nothing here
    uses them (no run dir, launcher or sweeper)."""
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
            loader = GlobalHydra.instance().config_loader()
            found = loader.compute_defaults_list("config", list(overrides), RunMode.RUN)
            # the path composing searched: the loader's own, with a hydra.searchpath override's (--config-dir)
            used = compose("config", list(overrides), return_hydra_config=True).hydra.runtime.config_sources
            search = [(c.provider, c.path if c.schema == "file" else f"{c.schema}://{c.path}") for c in used]
            groups = {g: loader.get_group_options(g) for g in loader.list_groups("") if g != "hydra"}
    except Exception as e:
        raise ConfigError(_one_line(e, overrides)) from e
    choices = found.overrides.known_choices
    listed = "".join(
        f"  {g}: {', '.join(f'[{o}]' if choices.get(g) == o else o for o in opts)}\n"
        for g, opts in groups.items()
    )
    rows = [
        (d.config_path or "", d.package or "", str(d.is_self), d.parent or "")
        for d in found.defaults
        if not (d.config_path or "").startswith("hydra/")
    ]
    parts = {
        "searchpath": _table("Config search path", ("Provider", "Search path"), search),
        "groups": f"Config groups (the chosen option in [])\n{listed}",
        "defaults-tree": "Defaults tree\n" + "".join(f"{ln}\n" for ln in _tree(found.defaults_tree)),
        "defaults": _table("Defaults list", ("Config path", "Package", "_self_", "Parent"), rows),
        "plugins": "Plugins: not applicable: trials run on Ray, not through a Hydra launcher or sweeper\n",
    }
    order = {
        "all": ("searchpath", "groups", "defaults-tree", "defaults"),
        "config": ("searchpath", "defaults-tree", "defaults"),
    }.get(what, (what,))
    return "\n".join(parts[k] for k in order)


def _table(title: str, head: tuple[str, ...], rows: list[tuple]) -> str:
    cells = [head, *[tuple(str(c) for c in r) for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"
    rule = "-" * len(line(head))
    return "\n".join([title, rule, line(head), rule, *map(line, cells[1:]), rule]) + "\n"


def _tree(node: DefaultsTreeNode | InputDefault, depth: int = 0) -> list[str]:
    """Hydra's defaults tree as indented lines, without its own hydra/config branch."""
    here = node.node if isinstance(node, DefaultsTreeNode) else node
    if isinstance(here, GroupDefault):
        label = f"{here.get_override_key()}: {here.get_name()}"
    else:
        label = here.get_config_path()
    if label.startswith("hydra/"):
        return []
    kids = (node.children or []) if isinstance(node, DefaultsTreeNode) else []
    lines = [f"{'  ' * depth}{label}{':' if kids else ''}"]
    for child in kids:
        lines += _tree(child, depth + 1)
    return lines
