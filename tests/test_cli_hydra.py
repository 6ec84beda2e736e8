"""Tier 1: the command line as a Hydra user types it: -m sweeps, --help, --cfg, --info (no Ray, no JAX)."""

import itertools
import json
import os
import shutil

import pytest
import yaml
from drivers import ROOT, run_cli

from orchestrator.__main__ import main
from orchestrator.cli.args import NO_HYDRA_NODE, Args, compose, parse_args, search_dirs
from orchestrator.cli.help import help_text, summary, switches
from orchestrator.config.grid import expand, points
from orchestrator.config.load import CONF_DIR, GROUPS, group_option, load
from orchestrator.plan import cluster_model, memory


def _run(capsys, argv: list[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _one_error(err: str) -> str:
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return errors[0]


def test_flags_go_anywhere_and_take_their_values():
    a = parse_args(
        ["strategy=ring,usp", "-m", "--cfg", "job", "context_length=1", "--resolve", "-p", "model"]
    )
    assert a == Args(
        ("strategy=ring,usp", "context_length=1"), multirun=True, cfg="job", resolve=True, package="model"
    )
    assert parse_args(["--multirun", "-c=all"]) == Args(multirun=True, cfg="all")
    assert parse_args(["--info"]).info == "all"  # Hydra's --info alone
    assert parse_args(["--info", "defaults-tree", "x=1"]) == Args(("x=1",), info="defaults-tree")
    assert parse_args(["-i", "x=1"]) == Args(("x=1",), info="all")  # an override is not its value
    assert parse_args(["-h", "model=nope"]).help


def test_multirun_axes_keep_their_types():
    tree = compose(
        parse_args(["-m", "strategy=ring,usp", "context_length=1024,2048", "train.lr=1e-3,3e-3"])
    ).tree
    sweep = tree["sweep"]
    axes = {"strategy": ["ring", "usp"], "context_length": [1024, 2048], "train.lr": [1e-3, 3e-3]}
    assert sweep == {"name": "cli", "id": "", "axes": axes, "zip": [], "set": {}}
    assert [type(v) for v in sweep["axes"]["context_length"]] == [int, int]
    assert points(sweep)[0] == (("strategy", "ring"), ("context_length", 1024), ("train.lr", 1e-3))
    assert (
        tree["strategy"]["name"] == "ring" and tree["context_length"] == 2048
    )  # the base point is untouched


def test_multirun_plans_the_same_trials_as_the_sweep_file(tmp_path, capsys):
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    (conf / "sweep" / "t.yaml").write_text(
        "name: t\nid: ''\naxes:\n  strategy: [ring, usp]\n  context_length: [1024, 2048]\nzip: []\nset: {}\n"
    )
    from_file = expand(load(["+sweep=t"], conf), conf)
    code, out, err = _run(
        capsys, ["-m", "strategy=ring,usp", "context_length=1024,2048", "dry_run=true", "output=json"]
    )
    assert code == 0, err
    planned = json.loads(out)
    assert [r["trial_id"] for r in planned] == [s.trial_id for s in from_file]
    assert len({s.trial_id for s in from_file}) == 4
    assert [(r["strategy"], r["context_length"]) for r in planned] == [
        ("ring", 1024),
        ("ring", 2048),
        ("usp", 1024),
        ("usp", 2048),
    ]
    # the +sweep.axes form composes the same grid
    inline = load(
        [
            "+sweep=smoke",
            "sweep.axes.strategy=[ring,usp]",
            "sweep.axes.context_length=[1024,2048]",
            "~sweep.set",
        ]
    )
    assert [s.trial_id for s in expand(inline)] == [s.trial_id for s in from_file]


def test_multirun_adds_to_and_replaces_a_sweep_files_axes():
    argv = ["+sweep=smoke", "+sweep.axes.train.steps=[4]", "-m", "strategy=ring,usp", "train.steps=2,3"]
    tree = compose(parse_args(argv)).tree
    assert tree["sweep"]["name"] == "smoke" and tree["sweep"]["set"] == {"train.steps": 4}
    # strategy replaced in its place, the nested train.steps replaced by the dotted one, context_length kept
    assert tree["sweep"]["axes"] == {
        "strategy": ["ring", "usp"],
        "context_length": [512, 1024],
        "train.steps": [2, 3],
    }
    specs = expand(tree)
    assert len(specs) == 8 and {s.train.steps for s in specs} == {2, 3}
    fixed = compose(parse_args(["-m", "+sweep.id=fixed", "train.seed=0,1"]))
    assert fixed.tree["sweep"]["id"] == "fixed" and fixed.options.sweep.id == "fixed"


@pytest.mark.parametrize(
    "argv",
    [["+sweep=smoke", "strategy.block_q=128"], ["-m", "strategy=ring,usp", "strategy.block_q=128"]],
    ids=" ".join,
)
def test_a_key_inside_a_group_axis_holds_for_every_option(argv):
    """Each point loads its strategy's file whole; a command-line key inside that group must survive it."""
    specs = expand(compose(parse_args(argv)).tree)
    assert len({s.strategy.name for s in specs}) == 2
    assert {s.strategy.block_q for s in specs} == {128}


def test_the_command_line_wins_over_the_sweep_files_set():
    """smoke's `set` has train.steps: 4; a command-line train.steps is the user's last word, as for any key."""
    specs = expand(compose(parse_args(["+sweep=smoke", "train.steps=3"])).tree)
    assert len(specs) == 4 and {s.train.steps for s in specs} == {3}
    assert {s.train.steps for s in expand(compose(parse_args(["+sweep=smoke"])).tree)} == {4}


def test_a_nested_sweep_set_changes_one_key_not_its_section():
    specs = expand(compose(parse_args(["+sweep=smoke", "+sweep.set.train.steps=3", "train.lr=0.01"])).tree)
    assert {(s.train.steps, s.train.lr) for s in specs} == {(3, 0.01)}


def test_hydra_sweep_syntax():
    args = [
        "-m",
        "train.seed=range(0,3)",
        "strategy=glob(*ring)",
        "mesh=choice(auto,cp8)",
        "train.dtype='float32',bfloat16",
    ]
    axes = compose(parse_args(args)).tree["sweep"]["axes"]
    assert axes == {
        "train.seed": [0, 1, 2],
        "strategy": ["double_ring", "ring"],
        "mesh": ["auto", "cp8"],
        "train.dtype": ["float32", "bfloat16"],
    }


def test_help_lists_groups_switches_examples_and_exit_codes(capsys):
    code, out, _ = _run(capsys, ["--help", "model=nope"])  # --help wins, as in Hydra
    text = help_text()
    assert code == 0 and out == text + "\n"
    lines = text.splitlines()
    assert all(len(ln) <= 110 for ln in lines)
    for g in GROUPS:
        opts = sorted(p.stem for p in (CONF_DIR / g).glob("*.yaml"))
        at = next(
            i
            for i, ln in enumerate(lines)
            if ln.lstrip().startswith(("+" if g == "sweep" else "") + f"{g}=NAME")
        )
        # a long option list wraps onto lines indented under its first option
        more = itertools.takewhile(lambda ln: ln.startswith(" " * 22) and ln.strip(), lines[at + 1 :])
        row = " ".join([lines[at], *(ln.strip() for ln in more)])
        assert [o.rstrip("*") for o in row.split(maxsplit=1)[1].split("  (")[0].split(", ")] == opts
    assert "tiny*" in text and "ring*" in text and "(none by default)" in text
    # every switch, with its declared default and the first sentence of its declared meaning
    listed = switches()
    assert {"retries.failure", "gate.max_drop", "aot_topology", "search.batch"} <= set(listed)
    assert "  dry_run=false " in text and "  retries.preemption=3 " in text and '  aot_topology="" ' in text
    for k, key in listed.items():
        at = next(i for i, ln in enumerate(lines) if ln.startswith(f"  {k}="))
        more = itertools.takewhile(lambda ln: ln.startswith(" " * 28) and ln[28] != " ", lines[at + 1 :])
        meaning = " ".join([lines[at][28:], *(ln.strip() for ln in more)])
        assert meaning == summary(key.doc) and "`" not in meaning and meaning.endswith((".", ")"))
    assert summary("Plan it; e.g. `x`. Then more.") == "Plan it; e.g. x."
    for section in ("Config groups", "Driver switches", "Flags:", "Examples:", "Exit codes:"):
        assert section in text
    examples = [
        ln.split("python -m orchestrator ")[1] for ln in lines if ln.startswith("  python -m orchestrator ")
    ]
    assert len(examples) == 3 and all(parse_args(e.split()).overrides for e in examples)
    codes = lines[lines.index("Exit codes:") + 1 :]
    assert [ln.split()[0] for ln in codes] == ["0", "1", "2", "3"]
    assert (
        "failed" in codes[1]
        and "tracking" in codes[1]
        and "bad input" in codes[2]
        and "regression" in codes[3]
    )


def test_cfg_job_single_trial_is_resolved_yaml(capsys):
    code, out, _ = _run(capsys, ["--cfg", "job", "train.steps=3", "--resolve"])
    tree = yaml.safe_load(out)
    assert code == 0 and tree["train"]["steps"] == 3 and tree["model"]["name"] == "tiny"
    assert "sweep" not in tree and "hydra" not in tree and "${" not in out
    code, out, _ = _run(capsys, ["-c", "job", "-p", "strategy", "strategy=usp"])
    assert out.startswith("# @package strategy\n") and yaml.safe_load(out)["name"] == "usp"
    code, out, _ = _run(capsys, ["--cfg", "hydra"])
    assert code == 0 and out == NO_HYDRA_NODE
    code, out, _ = _run(capsys, ["--cfg", "all"])
    assert out.endswith(NO_HYDRA_NODE) and yaml.safe_load(out)["context_length"] == 2048


def test_cfg_job_with_a_sweep_shows_the_base_and_the_grid(capsys):
    code, out, _ = _run(capsys, ["--cfg", "job", "+sweep=smoke", "-m", "train.lr=0.1,0.2"])
    tree = yaml.safe_load(out)
    assert code == 0 and tree["train"]["steps"] == 4  # sweep.set applied: what every trial gets
    sweep = tree["sweep"]
    assert sweep["name"] == "smoke" and sweep["size"] == 8 == len(sweep["points"])
    assert sweep["axes"] == {
        "strategy": ["all_gather", "ring"],
        "context_length": [512, 1024],
        "train.lr": [0.1, 0.2],
    }
    assert sweep["points"][:2] == [
        {"strategy": "all_gather", "context_length": 512, "train.lr": 0.1},
        {"strategy": "all_gather", "context_length": 512, "train.lr": 0.2},
    ]
    code, out, _ = _run(capsys, ["--cfg", "job", "+sweep=cp_scaling"])  # ${cp_strategies:} resolved
    assert yaml.safe_load(out)["sweep"]["axes"]["strategy"][0] == "all_gather"


def test_info_shows_search_path_groups_and_defaults(capsys):
    code, out, _ = _run(capsys, ["--info", "+sweep=smoke", "strategy=usp", "-m", "context_length=1,2"])
    assert code == 0
    rows = [[c.strip() for c in ln.split("|")[1:-1]] for ln in out.split("Config groups")[0].splitlines()]
    assert ["main", str(CONF_DIR)] in rows and ["hydra", "pkg://hydra.conf"] in rows
    assert "  strategy: all_gather, double_ring, none, ring, ulysses, [usp]" in out
    assert "  sweep: cp_scaling, families, multislice, quickstart, [smoke]" in out
    tree = out.split("Defaults tree\n")[1].split("\n\n")[0].splitlines()
    leaves = [
        "model_keys",
        "model: tiny",
        "strategy: usp",
        "mesh: auto",
        "cluster: local",
        "tracking: local",
        "_self_",
        "train_keys",
        "run_keys",
        "switches",
        "sweep: smoke",
    ]
    assert tree == ["<root>:", "  config:", *(f"    {ln}" for ln in leaves)]
    listed = [
        ln.split("|")[1].strip() for ln in out.split("Defaults list")[1].splitlines() if ln.startswith("| ")
    ]
    assert listed[1:] == [
        "model_keys",
        "model/tiny",
        "strategy/usp",
        "mesh/auto",
        "cluster/local",
        "tracking/local",
        "config",
        "train_keys",
        "run_keys",
        "switches",
        "sweep/smoke",
    ]
    assert yaml.safe_load(out.split("\nConfig\n")[1])["sweep"]["axes"]["context_length"] == [1, 2]
    code, out, _ = _run(capsys, ["--info", "searchpath"])
    assert out.startswith("Config search path") and "Defaults" not in out


@pytest.fixture(scope="module")
def no_jax_ray_mlflow(tmp_path_factory):
    """A PYTHONPATH whose `jax`, `ray` and `mlflow` fail on import: showing the config needs none of them."""
    root = tmp_path_factory.mktemp("poison")
    for name in ("jax", "ray", "mlflow"):
        (root / name).mkdir()
        (root / name / "__init__.py").write_text(
            f"raise ImportError('{name} imported by a show-only flag')\n"
        )
    return {"PYTHONPATH": f"{root}{os.pathsep}{ROOT}"}


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["-m", "strategy=ring,usp", "context_length=1024,2048", "--cfg", "job"],
        ["--info"],
        ["strategy=ring,usp"],
    ],
    ids=" ".join,
)
def test_real_cli_shows_and_starts_nothing(tmp_path, no_jax_ray_mlflow, argv):
    res = run_cli(argv, cwd=tmp_path, timeout=120, env=no_jax_ray_mlflow)
    assert "Traceback" not in res.stdout + res.stderr
    assert not (tmp_path / "mlflow.db").exists() and not list(tmp_path.iterdir())
    if argv == ["strategy=ring,usp"]:
        assert res.returncode == 2 and "add -m (or --multirun)" in _one_error(res.stderr)
        return
    assert res.returncode == 0, res.stderr
    if "--cfg" in argv:
        assert yaml.safe_load(res.stdout)["sweep"]["axes"] == {
            "strategy": ["ring", "usp"],
            "context_length": [1024, 2048],
        }
    else:
        assert ("Exit codes:" if argv == ["--help"] else "Defaults tree") in res.stdout


@pytest.fixture
def my_conf(tmp_path):
    """A user's own config directory beside conf/: cluster/mine.yaml, v5e_256 with 1 GiB of HBM a chip."""
    conf = tmp_path / "my_conf"
    (conf / "cluster").mkdir(parents=True)
    mine = group_option("cluster", "v5e_256") | {"name": "mine", "hbm_bytes_per_device": 2**30}
    (conf / "cluster" / "mine.yaml").write_text(yaml.safe_dump(mine))
    return conf


def test_config_dir_joins_the_search_path_after_conf(my_conf):
    """Hydra's --config-dir DIR: the hydra.searchpath override the compose API reads, DIR ahead of the entries
    the user named there and after conf/ (whose own options win a name clash)."""
    a = parse_args(["cluster=mine", "-cd", str(my_conf), "hydra.searchpath=[pkg://elsewhere]"])
    assert a.overrides == ("cluster=mine", f'hydra.searchpath=["file://{my_conf}","pkg://elsewhere"]')
    assert search_dirs(a) == (CONF_DIR, my_conf)
    assert compose(a).tree["cluster"]["name"] == "mine"


@pytest.mark.parametrize("how", ["--config-dir", "hydra.searchpath"])
def test_a_users_cluster_file_is_planned_by_its_own_constants(capsys, my_conf, how):
    """cluster=mine from the user's directory, with --config-dir or hydra.searchpath: the plan holds the point to
    mine's 1 GiB (on v5e_256's 15.7 GiB it runs), and so does every later reader of the cluster's model (the
    report, the AOT limits: cluster_model.model_of), since conf/ has no mine.yaml."""
    where = (
        ["--config-dir", str(my_conf)] if how == "--config-dir" else [f"hydra.searchpath=[file://{my_conf}]"]
    )
    point = ["model=llama3_1_8b", "context_length=131072", "dry_run=true", "output=json"]
    code, out, err = _run(capsys, [*where, "-m", "cluster=mine,v5e_256", *point])
    assert code == 0, err
    rows = json.loads(out)
    assert [(r["cluster"], r["verdict"]) for r in rows] == [("mine", "infeasible"), ("v5e_256", "run")]
    v5e = memory.gib(cluster_model.load("v5e_256")[1].hbm_bytes_per_device)
    assert "has 1.0 GiB" in rows[0]["reason"] and f"of {v5e}" in rows[1]["reason"], rows
    args = parse_args([*where, "cluster=mine"])
    (spec,) = expand(compose(args).tree, search_dirs(args))
    assert cluster_model.model_of(spec.cluster).hbm_bytes_per_device == 2**30
    code, out, _ = _run(capsys, [*where, "--info", "searchpath"])
    assert code == 0 and str(my_conf) in out
