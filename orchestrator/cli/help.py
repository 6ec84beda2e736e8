"""`python -m orchestrator --help`: read from conf/ without composing; docs/reference/cli.md shows it."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from orchestrator.cli.args import INFO_CHOICES, flat_keys
from orchestrator.config.load import CONF_DIR, GROUPS
from orchestrator.config.schema import TRIAL_KEYS

# The driver's switches (conf/config.yaml holds their defaults; tests/test_cli_hydra.py keeps both in step).
SWITCHES = {
    "dry_run": "plan every point and print the plan; start nothing",
    "output": "table | json: how dry_run prints the plan",
    "aot": "with dry_run: compile the valid points for the cluster's TPU topology too (.[tpu])",
    "aot_topology": "with aot: compile for this topology instead of the cluster's, e.g. 2x2x1",
    "aot_workers": "with aot: compiles at once as Ray tasks (0: one per CPU)",
    "aot_cache": "with aot: the shared compile cache, a directory or gs://bucket/prefix",
    "aot_draws": "with aot: compiles per point, each in its own process; the worst draw decides",
    "record": "with dry_run: log the plan to MLflow as planned runs (tag planned=true), plots",
    "skip_invalid": "launch the valid points even if some are invalid (else nothing starts)",
    "progress": "auto | rich | plain: the live display of the sweep",
    "recommend": "one point: the fastest strategy x mesh x memory policy, with command lines",
    "top": "with recommend: how many configurations to list",
    "search.batch": "with recommend: global batches it may pick, e.g. [1,2,4] (empty: train.batch)",
    "search.grad_accum": "with recommend: microbatch counts it may pick, e.g. [1,2]",
    "retries.preemption": "relaunches of a trial whose host was lost (preempted, node died)",
    "retries.failure": "relaunches of a trial that raised; a separate budget: a lost host is not a bug",
    "gate.enabled": "after the sweep, compare each trial with its previous finished run (same trial id)",
    "gate.max_drop": "an MFU or tokens/s drop past this fraction tags the sweep regression=true: exit 3",
    "gate.window": "the baseline: the median of this many earlier finished runs of each trial",
    "gate.noise_k": "the band widens to this many times those runs' spread, (max-min)/(2 median)",
    "budget.chip_hours": "refuse (exit 2) a sweep the planner prices above this many chip-hours (0: none)",
}
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


def switch_defaults(conf_dir: Path = CONF_DIR) -> dict[str, Any]:
    """conf/config.yaml's driver switches (top-level keys, neither trial keys nor groups): dotted key -> default."""
    tree = OmegaConf.to_container(OmegaConf.load(conf_dir / "config.yaml"))
    keep = {k: v for k, v in tree.items() if k not in {"defaults", *TRIAL_KEYS, *GROUPS}}
    return flat_keys(keep)


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
    shown = {
        k: "true" if v is True else "false" if v is False else '""' if v == "" else v
        for k, v in switch_defaults(conf_dir).items()
    }
    switches = [f"  {f'{k}={v}':<26}{SWITCHES.get(k, '')}" for k, v in shown.items()]
    flags = [
        ("-h, --help", "this help"),
        ("-m, --multirun", "sweep overrides key=a,b (or range(1,4), choice(a,b), glob(*)) become grid"),
        ("", "axes, crossed as in a sweep file; with +sweep=NAME they add to or replace its axes"),
        ("-c, --cfg job|hydra|all", "print the config a trial gets (resolved) and the grid; start nothing"),
        ("--resolve", "accepted: --cfg always resolves interpolations"),
        ("-p, --package KEY", "with --cfg: only that part of the config, e.g. -p model"),
        ("-i, --info [WHAT]", "the config search path, groups, defaults tree and list; start nothing"),
        ("", f"WHAT: {'|'.join(INFO_CHOICES)}"),
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
            *switches,
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
