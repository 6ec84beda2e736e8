"""`python -m orchestrator --help`: the config groups read from conf/ without composing, the driver's switches
from their declarations (orchestrator/config/schema.py); docs/reference/cli.md shows it."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from omegaconf import OmegaConf

from orchestrator.cli.args import INFO_CHOICES
from orchestrator.config import keys
from orchestrator.config.load import CONF_DIR, GROUPS
from orchestrator.config.schema import Options

EXAMPLES = (
    ("+sweep=smoke", "4 tiny trials on local Ray, tracked in ./mlflow.db (about a minute)"),
    ("recommend=true model=llama3_1_8b_long cluster=tpu7x_128 context_length=14680064", "the fastest fit"),
    ("+sweep=cp_scaling cluster=tpu7x_128 --cfg job", "the config and the grid of a sweep; nothing starts"),
)
EXIT_CODES = (
    (0, "done: no trial failed (with dry_run: no point invalid, or skip_invalid=true)"),
    (1, "some trials failed, or tracking never came back (writes journaled for a rerun)"),
    (
        2,
        "bad input (also no tracking server, no Ray head, no gs:// credentials): one error line, nothing started",
    ),
    (3, "the regression gate tripped"),
)


def summary(doc: str) -> str:
    """A key's meaning as one `--help` line: its first sentence, without Markdown's code marks."""
    return re.split(r"(?<=\.)\s+(?=[A-Z])", doc, maxsplit=1)[0].replace("`", "")


def switches() -> dict[str, keys.Key]:
    """The driver's switches as --help lists them: every key under Options' fields that are no config group,
    dotted (`gate.max_drop`)."""
    return {
        k: v for k, v in keys.declared(Options).items() if v.section is None and k.split(".")[0] not in GROUPS
    }


def _shown(v: object) -> object:
    """A default as one would type it on the command line."""
    return (
        "true"
        if v is True
        else "false"
        if v is False
        else '""'
        if v == ""
        else list(v)
        if isinstance(v, tuple)
        else v
    )


def help_text(conf_dir: Path = CONF_DIR) -> str:
    """`python -m orchestrator --help`, read from conf/ without composing (docs/reference/cli.md shows it)."""
    listed = OmegaConf.to_container(OmegaConf.load(conf_dir / "config.yaml"))["defaults"]
    defaults = {k: v for d in listed if isinstance(d, dict) for k, v in d.items()}
    groups = []
    for g in GROUPS:
        names = sorted(p.stem for p in (conf_dir / g).glob("*.yaml"))
        opts = [f"{o}*" if o == defaults.get(g) else o for o in names]
        none = "" if g in defaults else "  (none by default)"
        # long option lists wrap under themselves, so the help stays within 110 columns
        head = f"  {('+' if g == 'sweep' else '') + g + '=NAME':<20}"
        groups += textwrap.wrap(
            ", ".join(opts) + none,
            110,
            initial_indent=head,
            subsequent_indent=" " * len(head),
            break_on_hyphens=False,
        )
    lines = []
    for k, key in switches().items():
        lines += textwrap.wrap(
            summary(key.doc),
            110,
            initial_indent=f"  {f'{k}={_shown(key.default)}':<26}",
            subsequent_indent=" " * 28,
            break_on_hyphens=False,
        )
    flags = [
        ("-h, --help", "this help"),
        ("-m, --multirun", "sweep overrides key=a,b (or range(1,4), choice(a,b), glob(*)) become grid"),
        ("", "axes, crossed as in a sweep file; with +sweep=NAME they add to or replace its axes"),
        ("-c, --cfg job|hydra|all", "print the config a trial gets (resolved) and the grid; start nothing"),
        ("--resolve", "accepted: --cfg always resolves interpolations"),
        ("-p, --package KEY", "with --cfg: only that part of the config, e.g. -p model"),
        ("-i, --info [WHAT]", "the config search path, groups, defaults tree and list; start nothing"),
        ("", f"WHAT: {'|'.join(INFO_CHOICES)}"),
        (
            "-cd, --config-dir DIR",
            "one more config directory, searched after conf/: e.g. DIR/cluster/mine.yaml",
        ),
        ("", "makes cluster=mine (as hydra.searchpath=[file://DIR] does)"),
    ]
    return "\n".join(
        [
            "usage: python -m orchestrator [-m] [+sweep=NAME] [group=NAME ...] [key=value ...] [flags]",
            "",
            "Compose the Hydra config in conf/ once, expand the sweep's grid into trials, validate and plan",
            "every point (memory, communication, fit on the cluster), then run the runnable ones on Ray,",
            "tracked in MLflow (a parent run per sweep, a child run per trial). No sweep: one trial.",
            "Overrides are Hydra's: key=value sets, +key=value adds, ~key deletes, group=NAME picks a config.",
            "",
            "Config groups (* the default; a grid axis of model, strategy, mesh or cluster takes these names):",
            *groups,
            "",
            "Driver switches (one value for the whole sweep, never part of a trial id):",
            *lines,
            "",
            "Flags:",
            *(f"  {f:<26}{what}" for f, what in flags),
            "",
            "Examples:",
            *(f"  python -m orchestrator {a}\n      {what}" for a, what in EXAMPLES),
            "",
            "Exit codes:",
            *(f"  {c}  {what}" for c, what in EXIT_CODES),
        ]
    )
