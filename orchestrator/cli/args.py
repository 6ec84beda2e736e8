"""The command line as a Hydra user expects it: overrides, `-m` sweeps, --help, --cfg, --info, --config-dir.

Hydra's `@hydra.main` is not the entry point (the driver composes once and Ray is the executor:
docs/explanation/architecture.md, "Compose once"), so its flags are handled here: `-m key=a,b` becomes a grid axis
of `sweep`, exactly as a sweep file's `axes`.
Bad input of any kind is a ConfigError: one line, exit 2, nothing started.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Glob, Override, QuotedString, ValueType
from omegaconf import OmegaConf

from orchestrator.config import keys
from orchestrator.config.grid import GROUP_AXES, points
from orchestrator.config.load import CONF_DIR, Loaded, compose_tree, group_option, info, typed
from orchestrator.config.schema import ConfigError

CFG_CHOICES = ("job", "hydra", "all")
INFO_CHOICES = ("all", "config", "defaults", "defaults-tree", "searchpath", "plugins")
_FLAGS = {  # Hydra's flags, short and long, and the option each sets
    flag: name
    for short, long, name in (
        ("-h", "--help", "help"),
        ("-m", "--multirun", "multirun"),
        ("", "--resolve", "resolve"),
        ("-c", "--cfg", "cfg"),
        ("-p", "--package", "package"),
        ("-i", "--info", "info"),
        ("-cd", "--config-dir", "config_dir"),
    )
    for flag in (short, long)
    if flag
}
_SWITCHES = ("help", "multirun", "resolve")
ALLOWED = (
    f"-h/--help, -m/--multirun, -c/--cfg {'|'.join(CFG_CHOICES)}, --resolve, -p/--package KEY, "
    f"-i/--info [{'|'.join(INFO_CHOICES)}], -cd/--config-dir DIR"
)
_EXAMPLE_VALUE = {"cfg": "job", "package": "model", "config_dir": "./my_conf"}
SEARCHPATH = "hydra.searchpath"  # the override Hydra's config loader reads its extra config directories from
NO_HYDRA_NODE = (
    "# hydra: not applicable: conf/ is composed with Hydra's compose API and trials run on Ray, "
    "so no hydra node (run dir, launcher, sweeper, logging) is used\n"
)


@dataclass(frozen=True)
class Args:
    """The parsed command line: Hydra overrides (their own grammar) and the flags."""

    overrides: tuple[str, ...] = ()
    multirun: bool = False  # sweep overrides (key=a,b) become grid axes
    help: bool = False
    cfg: str = ""  # job | hydra | all: print the config instead of running
    resolve: bool = False  # accepted as Hydra has it: --cfg always resolves (a trial never sees `${...}`)
    package: str = ""  # with --cfg: only this part of the config
    info: str = ""  # one of INFO_CHOICES: what Hydra's --info shows


def parse_args(argv: list[str]) -> Args:
    """Flags anywhere on the line, like Hydra's; anything not starting with `-` is an override. `--config-dir
    DIR` becomes the `hydra.searchpath` override (with_config_dir), so everything after sees one form."""
    found: dict[str, Any] = {}
    overrides: list[str] = []
    rest = list(argv)
    while rest:
        token = rest.pop(0)
        if not token.startswith("-"):
            overrides.append(token)
            continue
        name, value = _flag(token, rest)
        found[name] = value
    for name, choices in (("cfg", CFG_CHOICES), ("info", INFO_CHOICES)):
        if name in found and found[name] not in choices:
            raise ConfigError(f"--{name} takes one of {', '.join(choices)}, got {found[name]!r}")
    if "config_dir" in found:
        overrides = with_config_dir(overrides, found.pop("config_dir"))
    return Args(overrides=tuple(overrides), **found)


def with_config_dir(overrides: list[str], config_dir: str) -> list[str]:
    """Hydra's `--config-dir DIR`: DIR joins the config search path after conf/ and before any entry of a
    `hydra.searchpath=[...]` override, so a group option conf/ lacks (DIR/cluster/mine.yaml) can be chosen, and
    conf/'s own win a name clash. Written as that override, the one form the compose API reads."""
    path = Path(config_dir).expanduser().resolve()
    if not path.is_dir():
        raise ConfigError(f"--config-dir {config_dir!r}: no such directory ({path})")
    entries, rest = [f"file://{path}"], []
    for text in overrides:
        if text.split("=", 1)[0] == SEARCHPATH:
            entries += _searchpath(text)
        else:
            rest.append(text)
    quoted = ",".join('"' + e.replace("\\", "\\\\").replace('"', '\\"') + '"' for e in entries)
    return [*rest, f"{SEARCHPATH}=[{quoted}]"]


def _searchpath(text: str) -> list[str]:
    """The entries of a `hydra.searchpath=[...]` override, as Hydra parses them."""
    try:
        value = OverridesParser.create().parse_override(text).value()
    except Exception as e:  # Hydra's grammar error, already naming the override
        raise ConfigError(" ".join(str(e).split())) from e
    if not isinstance(value, list):
        raise ConfigError(f"{text!r}: {SEARCHPATH} takes a list, e.g. {SEARCHPATH}=[file://DIR]")
    return [str(_plain(v)) for v in value]


def search_dirs(args: Args, conf_dir: Path = CONF_DIR) -> tuple[Path, ...]:
    """The config directories a group option is looked up in, in Hydra's order: conf/, then each `file://`
    entry of the `hydra.searchpath` override (where `--config-dir` went). What a grid axis over `cluster` or a
    sweep file's `cluster` axis reads an option from, as composing reads the chosen one."""
    entries = [e for t in args.overrides if t.split("=", 1)[0] == SEARCHPATH for e in _searchpath(t)]
    return (conf_dir, *(Path(e.removeprefix("file://")) for e in entries if e.startswith("file://")))


def _flag(token: str, rest: list[str]) -> tuple[str, Any]:
    """(field name, value) of one flag token, taking its value from `rest` when it is the next word."""
    flag, eq, value = token.partition("=")
    name = _FLAGS.get(flag)
    if name is None:
        raise ConfigError(f"unknown flag {token!r}; allowed: {ALLOWED}, then overrides key=value")
    if name in _SWITCHES:
        if eq:
            raise ConfigError(f"{flag} takes no value, got {token!r}")
        return name, True
    if name == "info":  # its value is optional, as in Hydra: --info alone is --info all
        return name, value or (rest.pop(0) if rest and rest[0] in INFO_CHOICES else "all")
    if not eq:
        if not rest or rest[0].startswith("-"):
            raise ConfigError(f"{flag} needs a value, e.g. {flag} {_EXAMPLE_VALUE[name]}")
        value = rest.pop(0)
    return name, value


def split_sweeps(
    args: Args, dirs: Sequence[Path] = (CONF_DIR,)
) -> tuple[list[tuple[str, Override]], dict[str, list]]:
    """(the plain overrides as typed and as Hydra parsed them, the grid axes from `-m` sweep overrides, typed as
    Hydra parsed them): the command line parsed once. `dirs`: where a group axis's options are (search_dirs)."""
    try:
        parsed = OverridesParser.create().parse_overrides(list(args.overrides))
    except Exception as e:  # Hydra's grammar error, already naming the override
        raise ConfigError(" ".join(str(e).split())) from e
    plain: list[tuple[str, Override]] = []
    axes: dict[str, list] = {}
    for text, o in zip(args.overrides, parsed, strict=True):
        if not o.is_sweep_override():
            plain.append((text, o))
        elif not args.multirun:
            key, value = o.get_key_element(), o.get_value_string()
            simple = o.value_type == ValueType.SIMPLE_CHOICE_SWEEP  # a,b: the list and string forms are plain
            ways = f"write {key}=[{value}] for a list, {key}='{value}' for a string, or " if simple else ""
            raise ConfigError(
                f"ambiguous value for argument {text!r}: {ways}add -m (or --multirun) to sweep over it"
            )
        else:
            axes[o.key_or_group] = _axis_values(o, text, dirs)
    return plain, axes


def _axis_values(o: Override, text: str, dirs: Sequence[Path]) -> list:
    key = o.key_or_group
    if key == "sweep":
        raise ConfigError(
            f"{text!r}: one sweep file per run; pick one +sweep=NAME and add axes with -m key=a,b"
        )
    if o.package or o.is_hydra_override():
        raise ConfigError(
            f"{text!r} cannot be a grid axis: sweep a trial key or one of {', '.join(GROUP_AXES)}"
        )
    if o.is_interval_sweep():
        raise ConfigError(
            f"{text!r} is a continuous interval (for a sampler); a grid needs listed values, "
            f"e.g. {key}=a,b, {key}=range(1,4) or {key}=choice(a,b)"
        )
    keys.check_sweep_key(key, "sweep axis")
    value = o.value()
    if isinstance(value, Glob):
        if key not in GROUP_AXES:
            raise ConfigError(f"{text!r}: glob() picks options of a config group ({', '.join(GROUP_AXES)})")
        values: list = value.filter(sorted({p.stem for d in dirs for p in (d / key).glob("*.yaml")}))
    else:
        values = [_plain(v) for v in o.sweep_iterator()]
    if key in GROUP_AXES:
        for v in values:
            group_option(key, str(v), dirs)  # an unknown option fails here, as in a sweep file
    return values


def _plain(v: Any) -> Any:
    """A parsed element as YAML would give it: quoted strings as str, inside lists and dicts too."""
    if isinstance(v, QuotedString):
        return v.text
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {_plain(k): _plain(x) for k, x in v.items()}
    return v


def compose(args: Args, conf_dir: Path = CONF_DIR) -> Loaded:
    """Compose the plain overrides, resolve once, type the options once; `-m` axes join `+sweep=NAME`'s
    (replacing an axis of the same key) or make a sweep named "cli" (a fixed `+sweep.id=...` still resumes it)."""
    plain, axes = split_sweeps(args, search_dirs(args, conf_dir))
    tree = compose_tree([text for text, _ in plain], conf_dir)
    sweep = tree.get("sweep") or {}
    merged = flat_keys(sweep.get("axes") or {}) | axes  # dict order: a replaced axis keeps its place
    # `strategy.block_q=128` with a strategy axis: each point loads its option whole, so the key goes to the
    # sweep's `set`, which grid.expand applies on top of every option it loads
    cli_keys = _cli_keys([o for _, o in plain])
    groups = {a for a in merged if a in GROUP_AXES}
    kept = {k: v for k, v in cli_keys.items() if "." in k and k.split(".")[0] in groups}
    # and a key the sweep file's `set` also names: the command line wins, as for any other key
    sweep_set = flat_keys(sweep.get("set") or {})
    kept |= {k: v for k, v in cli_keys.items() if k in sweep_set}
    if axes or kept:
        tree["sweep"] = {
            "name": sweep.get("name") or "cli",
            "id": sweep.get("id") or "",
            "axes": merged,
            "zip": sweep.get("zip") or [],
            "set": sweep_set | kept,
        }
    return typed(tree, [text for text, _ in plain])


def _cli_keys(plain: list[Override]) -> dict[str, Any]:
    """The plain overrides that set a trial key (not the sweep itself, not Hydra's), as dotted key -> value."""
    return {
        o.key_or_group: _plain(o.value())
        for o in plain
        if not (o.is_delete() or o.is_hydra_override() or o.key_or_group.split(".")[0] == "sweep")
    }


def flat_keys(tree: dict, prefix: str = "") -> dict:
    """Nested axes (as `+sweep.axes.train.steps=[..]` writes them) as dotted keys, so `-m` replaces them."""
    out: dict = {}
    for k, v in tree.items():
        out |= flat_keys(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v}
    return out


def show(loaded: Loaded, args: Args, conf_dir: Path = CONF_DIR) -> str:
    """--info or --cfg output; starts nothing."""
    if args.info:
        text = info(loaded.overrides, args.info, conf_dir)
        if args.info in ("all", "config"):
            text += "\nConfig\n" + cfg_text(loaded, Args(cfg="job"))
        return text
    return cfg_text(loaded, args)


def cfg_text(loaded: Loaded, args: Args) -> str:
    """The config a trial gets, as YAML, resolved; with a sweep, the base (`sweep.set` applied), the grid."""
    if args.cfg == "hydra":
        return NO_HYDRA_NODE
    tree = copy.deepcopy(loaded.tree)
    sweep = tree.pop("sweep", None) or {}
    base = OmegaConf.create(tree)
    OmegaConf.set_struct(base, True)  # a `set` key that is not in the config fails, as in grid.expand
    for dotted, value in (sweep.get("set") or {}).items():
        keys.check_sweep_key(dotted, "sweep.set key")
        try:
            OmegaConf.update(base, dotted, value, merge=False)
        except Exception as e:
            raise ConfigError(
                f"sweep.set key {dotted!r} is not a config key — check the name against conf/config.yaml"
            ) from e
    if args.package:
        node = OmegaConf.select(base, args.package)
        if node is None:
            raise ConfigError(
                f"package {args.package!r} not found in the config; top-level keys: {', '.join(base)}"
            )
        body = OmegaConf.to_yaml(node) if OmegaConf.is_config(node) else f"{node}\n"
        text = f"# @package {args.package}\n{body}"
    else:
        text = OmegaConf.to_yaml(base)
        if sweep:
            grid = points(sweep)
            shown = {"sweep": {**sweep, "size": len(grid), "points": [dict(p) for p in grid]}}
            text += "# the grid: each point is a trial of the config above with its axes set\n"
            text += yaml.safe_dump(shown, default_flow_style=None, sort_keys=False, width=110)
    return text + (NO_HYDRA_NODE if args.cfg == "all" else "")
