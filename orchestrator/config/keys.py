"""Hold a composed config against its declarations (orchestrator/config/schema.py): each bad key as one line
(what, where, allowed, fix).

Each key on its own (type, then the range or names its `key()` declares), unknown and missing keys, and two
rules across trial keys that are bad input rather than an invalid point (train.memory with train.remat=auto,
run.profile_steps within train.steps) and one of the model's own (its layer pattern against its layers); the
other rules across keys and against the cluster or model are orchestrator/plan/validity.py's, whether the data can
be read is orchestrator/config/data.py's.
Driver options are checked once at compose time (`check_options`, from config.load); trial keys per grid point
(`check_point`, from grid.expand), since a sweep may set any of them. Nothing here imports Ray, JAX or MLflow.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass
from functools import cache
from typing import Any

from jobs import fields
from jobs.fields import MISSING, Rule
from jobs.profile import steps_problem
from jobs.spec import ModelSpec, pattern_problem
from orchestrator.config import data
from orchestrator.config.schema import TRIAL_KEYS, ConfigError, Options, PointConfig, Problem


@cache
def hints(cls: type) -> dict[str, Any]:
    """A dataclass's field types, resolved."""
    return typing.get_type_hints(cls)


def section(hint: Any) -> type | None:
    """The dataclass a field holds (also through `X | None`), else None."""
    return next((h for h in (hint, *typing.get_args(hint)) if dataclasses.is_dataclass(h)), None)


def scalar(hint: Any) -> Any:
    """A field's type without its alternative: `int | str` is an int key that also takes "auto"."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return next(h for h in typing.get_args(hint) if h is not type(None))
    return hint


@dataclass(frozen=True)
class Key:
    """One dotted config key as its dataclass field declares it."""

    key: str
    hint: Any
    field: dataclasses.Field

    @property
    def default(self) -> Any:
        return fields.default(self.field)

    @property
    def doc(self) -> str:
        return fields.doc(self.field)

    @property
    def rule(self) -> Rule:
        return fields.rule(self.field)

    @property
    def section(self) -> type | None:
        return section(self.hint)


def declared(*roots: type) -> dict[str, Key]:
    """Every key under these dataclasses, sections included ("train", "train.data"), in field order."""
    out: dict[str, Key] = {}

    def walk(cls: type, prefix: str) -> None:
        for f in dataclasses.fields(cls):
            k = out[prefix + f.name] = Key(prefix + f.name, hints(cls)[f.name], f)
            if k.section is not None:
                walk(k.section, k.key + ".")

    for cls in roots:
        walk(cls, "")
    return out


def allowed(hint: Any, rule: Rule) -> str:
    """What a scalar key accepts, in words (the "allowed:" part of its error message)."""
    if rule.choices:
        return ", ".join(c or '""' for c in rule.choices) + (" or auto" if rule.auto else "")  # "": unset
    word = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(hint, str(hint))
    if rule.nonempty:
        word = "a non-empty string"
    bounds = [f"{op} {b:g}" for op, b in ((">=", rule.ge), (">", rule.gt), ("<=", rule.le)) if b is not None]
    return " ".join([word, " and ".join(bounds)]).strip() + (' or "auto"' if rule.auto else "")


def names_allowed(rule: Rule) -> str:
    """What a list of names accepts: distinct names (train.memory.*), or a sequence (rule.repeats)."""
    if rule.repeats:
        return f"a non-empty list of {', '.join(rule.choices)} (in order, each as often as needed)"
    return f"a list of {', '.join(rule.choices)} (each at most once)"


def _names(key: str, v: Any, rule: Rule) -> Problem | None:
    """A list of names from rule.choices: distinct (train.memory.*) or, with rule.repeats, a non-empty
    sequence (model.attention_pattern)."""
    allowed = names_allowed(rule)
    if not isinstance(v, list | tuple) or not all(isinstance(n, str) for n in v):
        return Problem(
            key, v, "is not a list of names", allowed, f"e.g. {key}=[{v if v in rule.choices else ''}]"
        )
    good = [n for n in (v if rule.repeats else dict.fromkeys(v)) if n in rule.choices]
    fix = f"e.g. {key}=[{','.join(good)}]" if good else f"fix the spelling, or drop {key}"
    if bad := [n for n in v if n not in rule.choices]:
        return Problem(key, v, f"names {', '.join(map(repr, bad))}, not an allowed value", allowed, fix)
    if rule.repeats and not v:
        return Problem(key, v, "is empty", allowed, f"e.g. {key}=[{rule.choices[0]}]")
    if not rule.repeats and len(set(v)) < len(v):
        return Problem(key, v, "names a value twice", allowed, fix)
    return None


_ITEMS = {int: ("integers", "[1,2,4]"), float: ("numbers", "[0.7,0.3]"), str: ("strings", "[a,b]")}


def list_allowed(item: type, rule: Rule) -> str:
    """What a list key (tuple[int, ...], tuple[float, ...], tuple[str, ...]) accepts."""
    words = allowed(item, rule).removeprefix({int: "an integer", float: "a number", str: "a string"}[item])
    return f"a list of {'' if item is float else 'distinct '}{_ITEMS[item][0]}{words}"


def _list(key: str, v: Any, item: type, rule: Rule) -> Problem | None:
    """A list of distinct values of one type, each in the rule's range (search.batch, train.data.sources)."""
    words = list_allowed(item, rule)
    ok = isinstance(v, list | tuple) and all(_value(key, n, item, MISSING, rule) is None for n in v)
    if not ok or len(set(v)) < len(v) and item is not float:
        return Problem(key, v, f"is not {words}", words, f"e.g. {key}={_ITEMS[item][1]}")
    return None


def _mapping(key: str, v: Any, allowed: str = "a mapping of names to strings") -> Problem | None:
    """A mapping of names to strings (cluster.env): an environment holds strings, and YAML's 1 is not."""
    if not isinstance(v, dict):
        return Problem(key, v, "is not a mapping", allowed, f"e.g. +{key}.NAME=value")
    bad = next(((n, x) for n, x in v.items() if not (isinstance(n, str) and isinstance(x, str))), None)
    return bad and Problem(
        f"{key}.{bad[0]}",
        bad[1],
        "is not a string",
        allowed,
        f'quote it: {key}.{bad[0]}=\'"{bad[1]}"\' on the command line, "{bad[1]}" in YAML',
    )


def _value(key: str, v: Any, hint: Any, default: Any, rule: Rule) -> Problem | None:
    """Type first (bool is not an int here, NaN is not a number), then choices, emptiness, range."""
    hint = scalar(hint)
    if rule.auto and v == "auto":
        return None
    if typing.get_origin(hint) is tuple and rule.choices:
        return _names(key, v, rule)
    if typing.get_origin(hint) is tuple and typing.get_args(hint)[0] in _ITEMS:
        return _list(key, v, typing.get_args(hint)[0], rule)
    if typing.get_origin(hint) is dict:
        return _mapping(key, v)
    if hint not in (bool, int, float, str):
        return None  # containers (sweep axes, zip, set): grid.points checks their shape
    if (wrong := _wrong(v, hint, rule)) is None:
        return None
    # The words and the fix only for a bad value: a sweep checks every key of every point.
    words = allowed(hint, rule)
    good_default = default is not MISSING and _value(key, default, hint, MISSING, rule) is None
    shown = '""' if default == "" else default  # an unset string key, as the command line writes it
    fix = f"e.g. {key}={shown}" if good_default else f"set {key} to {words}"
    return Problem(key, v, wrong, words, fix)


def _wrong(v: Any, hint: type, rule: Rule) -> str | None:
    """What is wrong with a scalar value (None: nothing)."""
    number = isinstance(v, int | float) and not isinstance(v, bool)
    typed = {
        bool: isinstance(v, bool),
        int: number and isinstance(v, int),
        str: isinstance(v, str),
        float: number and math.isfinite(v),
    }[hint]
    if not typed:
        return "has the wrong type"
    if rule.choices and v not in rule.choices:
        return "is not an allowed value"
    if rule.nonempty and not v:
        return "is empty"
    low = (rule.ge is not None and v < rule.ge) or (rule.gt is not None and v <= rule.gt)
    if low or (rule.le is not None and v > rule.le):
        return "is out of range"
    return None


def _walk(cls: type, d: Any, prefix: str, out: list[Problem]) -> None:
    """Unknown keys (rejected, never dropped), missing required keys, then every value by its declaration."""
    known = {f.name: f for f in dataclasses.fields(cls)}
    where = prefix.rstrip(".") or "config"
    if not isinstance(d, dict):
        out.append(Problem(where, d, "is not a section", ", ".join(known), f"set {where}.KEY=VALUE"))
        return
    for k in d:
        if k not in known:
            out.append(
                Problem(
                    f"{prefix}{k}",
                    MISSING,
                    f"is not a {where} key",
                    ", ".join(known),
                    "remove it or fix its spelling",
                )
            )
    for name, f in known.items():
        key, hint = f"{prefix}{name}", hints(cls)[name]
        if name not in d:
            if f.default is MISSING and f.default_factory is MISSING:
                words = allowed(scalar(hint), fields.rule(f))
                out.append(Problem(key, MISSING, "is missing", words, f"add it with +{key}=VALUE"))
        elif (sub := section(hint)) is not None:
            if d[name] is not None or type(None) not in typing.get_args(hint):
                _walk(sub, d[name], f"{key}.", out)
        elif (p := _value(key, d[name], hint, f.default, fields.rule(f))) is not None:
            out.append(p)


def make(cls: type, d: dict) -> Any:
    """A checked section as its frozen dataclass: sections as theirs, lists as tuples where a tuple is declared."""
    out = {}
    for k, v in d.items():
        hint = scalar(hints(cls)[k])
        if (sub := section(hint)) is not None and v is not None:
            v = make(sub, v)
        elif typing.get_origin(hint) is tuple and isinstance(v, list):
            v = tuple(v)
        out[k] = v
    return cls(**out)


def check_point(d: dict) -> list[Problem]:
    """Every bad key of one grid point (a resolved config dict); then, the keys good, whether its data reads."""
    out: list[Problem] = []
    _walk(PointConfig, {k: d[k] for k in TRIAL_KEYS if k in d}, "", out)
    if not out:
        _auto_memory(d, out)
        _profile_steps(d, out)
        _layer_pattern(d, out)
    return out or data.problems(d)


def _layer_pattern(d: dict, out: list[Problem]) -> None:
    """model.attention_pattern against model.layers, window and chunk (the model's own rule,
    jobs.spec.pattern_problem), before a ModelSpec is built or anything launches."""
    m = {f.name: fields.default(f) for f in dataclasses.fields(ModelSpec)} | d["model"]
    pattern = tuple(m["attention_pattern"])
    if p := pattern_problem(m["layers"], pattern, m["partial_pattern"], m["window"], m["chunk"]):
        key, value, wrong, allowed, fix = p
        out.append(Problem(f"model.{key}", value, wrong, allowed, fix))


def _profile_steps(d: dict, out: list[Problem]) -> None:
    """run.profile_steps within the trial (the job's own rule, jobs.profile.steps_problem)."""
    steps = list((d.get("run") or {}).get("profile_steps") or ())
    if why := steps_problem(steps, int(d["train"]["steps"])):
        out.append(Problem("run.profile_steps", steps, *why))


def _auto_memory(d: dict, out: list[Problem]) -> None:
    """train.remat=auto chooses train.memory as well: a list given with it would be silently replaced."""
    train = d.get("train") or {}
    given = {k: v for k, v in (train.get("memory") or {}).items() if v}
    if train.get("remat") == "auto" and given:
        k = next(iter(given))
        out.append(
            Problem(
                f"train.memory.{k}",
                list(given[k]),
                "is set with train.remat=auto, which chooses train.memory itself",
                "train.memory with a named train.remat preset",
                f"drop train.memory.{k}, or name a preset instead of auto",
            )
        )


def check_options(cfg: dict) -> Options:
    """The top-level keys and the driver's switches, once at compose time: the first problem raises."""
    known = {f.name for f in dataclasses.fields(Options)}
    out = [
        Problem(
            k,
            MISSING,
            "is not a config key",
            ", ".join(sorted(known | set(TRIAL_KEYS))),
            "remove it or fix its spelling",
        )
        for k in cfg
        if k not in known | set(TRIAL_KEYS)
    ]
    options = {k: v for k, v in cfg.items() if k in known}
    _walk(Options, options, "", out)
    if out:
        raise ConfigError(out[0].line("top-level option, one value for the whole sweep"))
    return make(Options, options)


def check_sweep_key(dotted: str, what: str) -> None:
    """A sweep sets trial keys only: a driver option set per grid point would be silently ignored."""
    if dotted.split(".")[0] in {f.name for f in dataclasses.fields(Options)}:
        raise ConfigError(
            f"{what} {dotted!r} is a driver option, not a trial key (a sweep sets only "
            f"{', '.join(TRIAL_KEYS)}); set it once on the command line, e.g. {dotted}=VALUE"
        )
