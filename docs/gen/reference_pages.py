"""Generate docs/reference/config.md and cli.md from the code, so the reference cannot drift from it.

Keys, types, ranges, meanings and the switches' defaults come from each key's one declaration (its dataclass
field: jobs/spec.py, orchestrator/plan/cluster_model.py, orchestrator/config/schema.py), the trial keys' defaults
from conf/, the trial-id marks from TrialSpec.identity() itself, and the command line page from the CLI's own
--help text.

    python docs/gen/reference_pages.py           # rewrite docs/reference/config.md and cli.md
    python docs/gen/reference_pages.py --check   # exit 1 when a committed page differs from the code
"""

from __future__ import annotations

import dataclasses
import sys
import typing
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from jobs.spec import DataSpec, MemorySpec, MeshSpec, ModelSpec, StrategySpec, TrialSpec
from orchestrator.cli.help import help_text
from orchestrator.config import keys
from orchestrator.config.keys import Key
from orchestrator.config.load import CONF_DIR, GROUPS
from orchestrator.config.schema import TRIAL_KEYS, Options, PointConfig

ROOTS: tuple[type, ...] = (PointConfig, Options)  # the trial's keys, then the driver's
CONFIG_PAGE = CONF_DIR.parent / "docs" / "reference" / "config.md"
ORDER = (
    "",
    "model",
    "strategy",
    "mesh",
    "cluster",
    "train",
    "train.data",
    "train.memory",
    "run",
    "tracking",
    "retries",
    "gate",
    "sweep",
)
MISSING = dataclasses.MISSING
HYDRA_KEYS = ("defaults",)  # Hydra's defaults lists (config.yaml, a group option's): not config keys


def schema(roots: Iterable[type] = ROOTS) -> dict[str, Key]:
    """Every declared key, sections included ("train", "train.data"), in field order."""
    return keys.declared(*roots)


def _flat(d: Mapping, prefix: str, sections: set[str]) -> Iterator[str]:
    for k, v in d.items():
        yield prefix + str(k)
        if isinstance(v, Mapping) and prefix + str(k) in sections:  # not into values (sweep axes, set)
            yield from _flat(v, f"{prefix}{k}.", sections)


def _load(path: Path) -> dict:
    """A YAML file unresolved: an interpolation (`${oc.env:...}`) shows as written, not as this machine's value."""
    return OmegaConf.to_container(OmegaConf.load(path), resolve=False)


def yaml_keys(conf_dir: Path = CONF_DIR, roots: Iterable[type] = ROOTS) -> list[str]:
    """Every dotted key set in conf/config.yaml and in each conf/<group>/<option>.yaml."""
    sections = {k for k, v in schema(roots).items() if v.section is not None}
    base = {k: v for k, v in _load(conf_dir / "config.yaml").items() if k not in HYDRA_KEYS}
    found = list(_flat(base, "", sections))
    for g in GROUPS:
        for path in sorted((conf_dir / g).glob("*.yaml")):
            found += _flat({k: v for k, v in _load(path).items() if k not in HYDRA_KEYS}, f"{g}.", sections)
    return list(dict.fromkeys(found))


def undocumented(roots: Iterable[type] = ROOTS) -> list[str]:
    """Keys declared without a meaning (a plain dataclass field, not jobs.fields.key)."""
    return [k for k, v in schema(roots).items() if not v.doc.strip()]


def undeclared(conf_keys: Iterable[str], roots: Iterable[type] = ROOTS) -> list[str]:
    """Keys a conf/ file sets that no dataclass declares."""
    known = schema(roots)
    return [k for k in dict.fromkeys(conf_keys) if k not in known]


def identity_keys() -> set[str]:
    """Dotted keys that enter the trial id, asked of TrialSpec.identity() (with every key at a value it keeps)."""
    model = ModelSpec(**{f.name: 1 for f in dataclasses.fields(ModelSpec) if f.default is MISSING})
    # the keys after tie_embeddings enter the id only off their defaults: every one of them off it
    model = dataclasses.replace(
        model,
        attention_pattern=("local", "chunked"),
        partial_pattern=True,
        window=2,
        chunk=2,
        local_rope_theta=2.0,
        global_rope=False,
        sinks=True,
        qk_norm=True,
        mlp_activation="gelu",
        embed_scale=True,
    )
    spec = TrialSpec(model, MeshSpec(dcn="data"), StrategySpec(), 1)
    data = DataSpec(kind="documents", sources=("x",), weights=(1.0,), pack="concat", long_docs="truncate")
    train = dataclasses.replace(spec.train, memory=MemorySpec(save=("x",)), data=data)
    spec = dataclasses.replace(spec, train=train)

    def flat(d: dict, prefix: str) -> Iterator[str]:
        for k, v in d.items():
            yield prefix + k
            if isinstance(v, dict):
                yield from flat(v, f"{prefix}{k}.")

    return set(flat(spec.identity(), ""))


# --- rendering --------------------------------------------------------------------------------------------
def value(v: Any, key: str = "") -> str:
    """A YAML value as it is written on the command line (bytes also in GiB)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, int):
        gib = f" ({v / 2**30:g} GiB)" if "bytes" in key and "per_s" not in key and v >= 2**30 else ""
        return f"{v}{gib}"
    if isinstance(v, list | tuple):
        return "[" + ", ".join(value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{" + ", ".join(f"{k}: {value(x)}" for k, x in v.items()) + "}"
    return str(v) if v != "" else '""'


def code(s: str) -> str:
    return f"`{s}`"


def allowed(k: Key) -> str:
    """The "allowed:" text of checks.py's error messages; names as code, containers by what they hold."""
    rule, hint = k.rule, keys.scalar(k.hint)
    origin = typing.get_origin(hint) or hint
    if origin is tuple and not rule.choices:
        return keys.list_allowed(typing.get_args(hint)[0], rule)
    if origin is tuple:
        return keys.names_allowed(dataclasses.replace(rule, choices=tuple(map(code, rule.choices))))
    if origin in (dict, list):
        return "a mapping" if origin is dict else "a list"
    if rule.choices:
        return "one of " + ", ".join(code(value(c)) for c in rule.choices)
    return keys.allowed(hint, rule)


def row(cells: Iterable[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [row(header), row(["---"] * len(header)), *map(row, rows), ""]


def _leading_comment(path: Path) -> str:
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("# ").strip())
    return " ".join(lines)


def _values(x: Any) -> str:
    """An axis's values: all of a short list, the ends and the count of a long one, an interpolation as written."""
    if not isinstance(x, list):
        return code(str(x))
    if len(x) <= 4:
        return ", ".join(code(value(v)) for v in x)
    return f"{code(value(x[0]))} … {code(value(x[-1]))} ({len(x)} values)"


def _sweep_cell(key: str, v: Any) -> str:
    """Sweep options in a few words: axis names with their value counts, zipped groups, set keys."""
    if key == "sweep.axes":
        return "; ".join(f"{code(a)}: {_values(x)}" for a, x in v.items())
    if key == "sweep.zip":
        return "; ".join(" + ".join(map(code, z)) for z in v) or "—"
    if key == "sweep.set":
        return ", ".join(code(f"{a}={value(x)}") for a, x in v.items()) or "—"
    return code(value(v))


def _section(
    name: str, doc: str, part: list[Key], conf_dir: Path, base: dict, defaults: dict, ids: set[str]
) -> list[str]:
    title = name or "Top level"
    out = [f"## {title}", ""]
    if name:
        out += [doc, ""]
    else:
        out += [
            "The trial's length, and the driver's switches: one value for the whole sweep, never part "
            "of a trial.",
            "",
        ]
    options: dict[str, dict] = {}
    if name in GROUPS:
        default = defaults.get(name)
        found = {p.stem: _load(p) for p in (conf_dir / name).glob("*.yaml")}
        options = {o: found[o] for o in sorted(found, key=lambda o: (o != default, o))}  # the default first
        pick = f"`{name}=NAME`, default `{default}`" if default else f"`+{name}=NAME`, none by default"
        out += [f"Config group `conf/{name}/`, chosen with {pick}. Options:", ""]
        for opt in options:
            note = _leading_comment(conf_dir / name / f"{opt}.yaml")
            out.append(f"- `{opt}`" + (f": {note}" if note else ""))
        out.append("")
    # defaults: the default option's values in a group, conf/config.yaml's elsewhere, else the declaration's
    src = options.get(defaults.get(name, ""), {}) if name in GROUPS else base
    for step in name.split(".") if name not in GROUPS and name else ():
        src = src.get(step, {})
    rows = []
    for k in part:
        v = src.get(k.key.rsplit(".", 1)[-1], k.default)
        shown = "—" if v is MISSING else code(value(v, k.key))
        rows.append([code(k.key), shown, allowed(k), "✓" if k.key in ids else "", k.doc])
    head = f"default (`{defaults[name]}`)" if name in defaults else "default"
    out += table(["key", head, "allowed", "in trial id", "meaning"], rows)
    if options:
        out += _per_option(name, part, options)
    return out


def _cell(section: str, key: str, v: Any) -> str:
    if v is MISSING:
        return "—"
    return _sweep_cell(key, v) if section == "sweep" else code(value(v, key))


def _per_option(name: str, part: list[Key], options: dict[str, dict]) -> list[str]:
    """Key x option, for the keys whose value differs between options (an absent key: its declared default)."""
    names = list(options)
    rows = []
    for k in part:
        leaf = k.key.rsplit(".", 1)[-1]
        vals = [options[o].get(leaf, k.default) for o in names]
        if name != "sweep" and all(v == vals[0] for v in vals):
            continue
        rows.append([code(k.key), *(_cell(name, k.key, v) for v in vals)])
    if not rows:
        return []
    note = "" if name == "sweep" else " (keys not listed have the same value in every option)"
    return [f"Values per option{note}:", "", *table(["key", *map(code, names)], rows)]


def render_config(conf_dir: Path = CONF_DIR) -> str:
    """The whole page, as committed at docs/reference/config.md."""
    declared = schema()
    raw = _load(conf_dir / "config.yaml")
    defaults = {k: v for d in raw.get("defaults", []) if isinstance(d, dict) for k, v in d.items()}
    base = {k: v for k, v in raw.items() if k not in HYDRA_KEYS}
    ids = identity_keys()
    out = [
        "# Configuration reference",
        "",
        "> Generated by `python docs/gen/reference_pages.py` from each key's declaration, its dataclass field "
        "(`jobs/spec.py`, `orchestrator/plan/cluster_model.py`, `orchestrator/config/schema.py`: type, range, "
        "meaning, the switches' defaults), and `conf/` (the trial keys' defaults). Do not edit this page by hand: "
        "change those and run the generator; `tests/test_reference_pages.py` fails while the page is stale.",
        "",
        "Set any key on the command line in Hydra's grammar: `train.steps=50`, a group option with "
        f"`cluster=v5p_128`, a sweep with `+sweep=cp_scaling`. Trial keys ({', '.join(map(code, TRIAL_KEYS))}"
        " and the keys under them) may differ per grid point and a sweep may set them; the driver's switches (the "
        "rest) take one value per sweep. Keys marked *in trial id* enter the hash "
        "that identifies a trial across sweeps and clusters (resume, regression baselines). A bad value stops "
        "the sweep before anything starts, with the *allowed* text below in the message. What a sweep "
        "records in MLflow: [MLflow layout](mlflow.md).",
        "",
    ]
    # ORDER first, then any section it does not name (in schema order): a new section is never left out
    rank = {s: i for i, s in enumerate(ORDER)}
    names = sorted(
        ["", *(k for k, v in declared.items() if v.section)], key=lambda s: rank.get(s, len(ORDER))
    )
    for name in names:
        part = [k for k in declared.values() if k.key.rpartition(".")[0] == name and k.section is None]
        doc = declared[name].doc if name else ""
        out += _section(name, doc, part, conf_dir, base, defaults, ids)
    return "\n".join(out).rstrip() + "\n"


CLI_PAGE = CONF_DIR.parent / "docs" / "reference" / "cli.md"


def render_cli() -> str:
    """docs/reference/cli.md: the CLI's own --help text, so the page says what the command does."""
    return "\n".join(
        [
            "# Command line",
            "",
            "> Generated by `python docs/gen/reference_pages.py` from `python -m orchestrator --help`"
            " (`orchestrator/cli/help.py`). Do not edit this page by hand.",
            "",
            "```text",
            help_text().rstrip(),
            "```",
            "",
            "Other entry points:",
            "",
            "| command | what it does |",
            "| --- | --- |",
            "| `python -m jobs.train trial_spec.json` | one trial from its spec (a child run's `trial_spec.json`), "
            "no Ray and no MLflow; records as JSON lines |",
            "| `python -m orchestrator.results.gate SWEEP_ID [--uri URI] [--max-drop 0.1] [--window 5] [--noise-k 1.5] "
            "[--no-tag]` | the regression gate on its own, for any sweep id (same exit codes) |",
            "| `python -m orchestrator.calibrate [--fit]` | the step-time model against published runs |",
            "| `python -m orchestrator.calibrate --from-sweep SWEEP_ID [--uri URI] [--out PATH]` | refit a "
            "cluster's step-time constants on a finished sweep's trials; writes a cluster config |",
            "| `python docs/gen/reference_pages.py [--check]` | regenerate (or check) the config and CLI reference |",
            "",
            "Every key an override may set: [config keys](config.md); exit codes: [exit codes](exit-codes.md).",
            "",
        ]
    )


def main(argv: list[str]) -> int:
    pages = {CONFIG_PAGE: render_config(), CLI_PAGE: render_cli()}
    stale = [p for p, text in pages.items() if not p.exists() or p.read_text() != text]
    if "--check" in argv:
        for p in stale:
            print(f"{p} is stale: run `python docs/gen/reference_pages.py`", file=sys.stderr)
        return 1 if stale else 0
    for p, text in pages.items():
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        print(f"wrote {p.relative_to(CONF_DIR.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
