"""Tier 1: the generated config reference and the MLflow layout page cannot drift from the code.

docs/reference/config.md is the output of `python docs/gen/reference_pages.py`; every key is declared with a meaning
(jobs.fields.key), and every key conf/ sets is declared. docs/reference/mlflow.md is written by hand, so every
name it lists is checked against the code, and the names the code writes are checked against the page.
"""

from __future__ import annotations

import ast
import dataclasses
import shutil
from collections import defaultdict
from dataclasses import dataclass, field

import pytest
from drivers import ROOT

from docs.gen import reference_pages
from jobs.fields import key
from jobs.spec import MemorySpec
from orchestrator.config.grid import expand
from orchestrator.config.load import CONF_DIR, load
from orchestrator.tracking.mlflow_names import FINAL, STEP_METRICS, trial_params

MLFLOW_PAGE = ROOT / "docs" / "reference" / "mlflow.md"
SOURCES = list((ROOT / "orchestrator").rglob("*.py"))
SOURCES.append(ROOT / "jobs" / "train.py")  # the start, step and summary records
# Record keys that never become MLflow metrics (not numbers, or the step itself).
NOT_METRICS = {
    "kind",
    "trial_id",
    "platform",
    "peak_source",
    "dcn_processes",
    "kernel_fallbacks",
    "steps",
    "step",
    "t_ms",
}


# --- config reference ---------------------------------------------------------------------------------------
def test_every_key_is_declared_with_a_meaning_and_every_conf_key_is_declared():
    keys = reference_pages.schema()
    assert "train.memory.save" in keys and "cluster.call_overhead_s" in keys and "sweep.axes" in keys
    missing = reference_pages.undocumented()
    assert not missing, f"declare these with jobs.fields.key(..., doc=...): {', '.join(missing)}"
    unknown = reference_pages.undeclared(reference_pages.yaml_keys())
    assert not unknown, f"conf/ sets keys no dataclass declares: {', '.join(unknown)}"


@dataclass(frozen=True)
class _Knobs:
    depth: int = 1
    width: int = key(2, doc="  ")  # blank: no meaning


@dataclass(frozen=True)
class _FakeRoot:
    context_length: int = key(doc="Tokens per sequence.")
    knobs: _Knobs = field(default_factory=_Knobs)


def test_an_undocumented_or_undeclared_key_is_caught(tmp_path):
    assert reference_pages.undocumented((_FakeRoot,)) == ["knobs", "knobs.depth", "knobs.width"]
    conf = shutil.copytree(CONF_DIR, tmp_path / "conf")
    (conf / "config.yaml").write_text((conf / "config.yaml").read_text() + "\nnew_switch: true\n")
    tiny = conf / "model" / "tiny.yaml"
    tiny.write_text(tiny.read_text() + "new_width: 3\n")
    assert reference_pages.undeclared(reference_pages.yaml_keys(conf)) == ["new_switch", "model.new_width"]


def test_the_committed_config_page_is_the_generators_output():
    want = reference_pages.render_config()
    have = reference_pages.CONFIG_PAGE.read_text() if reference_pages.CONFIG_PAGE.exists() else ""
    pairs = zip(have.splitlines(), want.splitlines(), strict=False)  # a line added or dropped: the first
    diff = next(
        (f"line {i + 1}: {a!r} != {b!r}" for i, (a, b) in enumerate(pairs) if a != b), "lengths differ"
    )
    assert have == want, (
        f"docs/reference/config.md is stale ({diff}): run `python docs/gen/reference_pages.py`"
    )


def test_the_committed_cli_page_is_the_help_text():
    from orchestrator.cli.help import help_text

    have = reference_pages.CLI_PAGE.read_text() if reference_pages.CLI_PAGE.exists() else ""
    assert have == reference_pages.render_cli(), (
        "docs/reference/cli.md is stale: run `python docs/gen/reference_pages.py`"
    )
    assert help_text().splitlines()[0] in have


def test_the_page_marks_what_enters_the_trial_id():
    ids = reference_pages.identity_keys()
    assert {"context_length", "mesh.dcn", "train.memory.save", "train.data.path", "model.vocab"} <= ids
    assert not {k for k in ids if k.split(".")[0] in ("cluster", "run", "tracking", "sweep")}
    assert "| `cluster.kind` | `local` | one of `local`, `local_multihost`" in reference_pages.render_config()


# --- MLflow layout ----------------------------------------------------------------------------------------
def page_names() -> dict[tuple[str, str], set[str]]:
    """(## heading, ### heading) -> the names in the first column of that part's tables."""
    out: dict[tuple[str, str], set[str]] = defaultdict(set)
    h2 = h3 = ""
    for line in MLFLOW_PAGE.read_text().splitlines():
        if line.startswith("## "):
            h2, h3 = line[3:], ""
        elif line.startswith("### "):
            h3 = line[4:]
        elif line.startswith("| `"):
            out[h2, h3].add(line.split("`")[1])
    return out


def literals() -> set[str]:
    return {
        n.value
        for p in SOURCES
        for n in ast.walk(ast.parse(p.read_text()))
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


def dict_keys(path, *functions: str) -> set[str]:
    """String keys of the dict literals (and `d["k"] = ...` targets) inside these functions of a module."""
    keys = set()
    for fn in ast.walk(ast.parse(path.read_text())):
        if isinstance(fn, ast.FunctionDef) and fn.name in functions:
            for n in ast.walk(fn):
                if isinstance(n, ast.Dict):
                    keys |= {k.value for k in n.keys if isinstance(k, ast.Constant)}
                elif isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Store):
                    keys |= {n.slice.value} if isinstance(n.slice, ast.Constant) else set()
    return keys


def spec_with_memory():
    """The base trial with train.memory set, so trial_params gives its memory_* params too."""
    (spec,) = expand(load([]))
    memory = MemorySpec(save=("attn_out",), offload=("layer_input",), host=("optimizer",))
    return dataclasses.replace(spec, train=dataclasses.replace(spec.train, memory=memory))


def base(name: str) -> str:
    return name.removesuffix("/<strategy>").removesuffix("/<bucket>")


@pytest.fixture(scope="module")
def planned_names(tmp_path_factory) -> dict[str, set[str]]:
    """What planned.record writes for a small plan (with compiles), read back from a real store, as
    "parent tags", "child metrics", ... -> names."""
    from types import SimpleNamespace

    import mlflow_lookup

    from orchestrator.plan import aot, plan
    from orchestrator.results import planned
    from orchestrator.tracking.store import MlflowTracker

    specs = expand(load(["+sweep=smoke"]))
    rows = plan(specs)
    uri = f"sqlite:///{tmp_path_factory.mktemp('planned') / 'mlflow.db'}"
    tracker = MlflowTracker(uri, "planned", str(tmp_path_factory.mktemp("artifacts")))
    result = aot.CompileResult(peak_bytes=1, compiler_peak_bytes=1)
    compiled = {s.trial_id: SimpleNamespace(result=result) for s in specs}  # trial id -> aot.Comparison
    planned.record(tracker, "smoke", "x", specs, rows, compiled)
    assert tracker.finish(timeout=120) == 0
    client = mlflow_lookup.client(uri)
    out: dict[str, set[str]] = defaultdict(set)
    for r in client.search_runs([tracker.experiment_id()]):
        run = "parent" if r.data.tags["kind"] == "sweep" else "child"
        # MLflow's own tags but the parent link are not the layout's
        out[f"{run} tags"] |= {
            t for t in r.data.tags if not t.startswith("mlflow.") or t == "mlflow.parentRunId"
        }
        out[f"{run} params"] |= set(r.data.params)
        out[f"{run} metrics"] |= {base_of_planned(m) for m in r.data.metrics}
        out[f"{run} artifacts"] |= {a.path for a in mlflow_lookup.artifact_files(client, r.info.run_id)}
    return out


def base_of_planned(metric: str) -> str:
    head, _, strategy = metric.partition("/")
    return f"{head}/<strategy>" if strategy else head


def test_the_planned_runs_on_the_page_are_what_planned_record_writes(planned_names):
    names = page_names()
    parent = names["Planned parent run", "Tags"] | names["Planned parent run", "Metrics"]
    assert parent | names["Planned parent run", "Artifacts"] == (
        planned_names["parent tags"] | planned_names["parent metrics"] | planned_names["parent artifacts"]
    )
    trial = names["Child run (trial)", "Tags"] | names["Child run (trial)", "Params"]
    mine = names["Planned child run", "Tags"] | names["Planned child run", "Metrics"]
    wrote = planned_names["child tags"] | planned_names["child params"] | planned_names["child metrics"]
    assert mine <= wrote, f"the page lists planned names the code does not write: {mine - wrote}"
    missing = wrote - mine - trial - {"trial_spec.json"}
    assert not missing, f"planned child runs get names docs/reference/mlflow.md does not list: {missing}"
    assert planned_names["child artifacts"] == {"trial_spec.json"}


def test_every_name_on_the_mlflow_page_is_written_by_the_code(planned_names):
    known = literals() | {f"final_{k}" for k in FINAL} | {base(n) for v in planned_names.values() for n in v}
    plots = {
        f"plots/{k}.png" for k in dict_keys(ROOT / "orchestrator" / "results" / "report.py", "make_figures")
    }
    known |= plots | set(trial_params(spec_with_memory()))
    listed = {n for names in page_names().values() for n in names}
    unknown = sorted(n for n in listed if base(n) not in known)
    assert not unknown, f"docs/reference/mlflow.md lists names the code never writes: {unknown}"


def test_every_name_the_trial_runs_get_is_on_the_mlflow_page():
    names = page_names()
    metrics = names["Child run (trial)", "Metrics"]
    records = dict_keys(ROOT / "jobs" / "train.py", "train", "memory_record", "slice_record") - NOT_METRICS
    want = set(STEP_METRICS) | {f"final_{k}" for k in FINAL} | records - set(FINAL)
    assert not want - metrics, f"add to docs/reference/mlflow.md's trial metrics: {sorted(want - metrics)}"
    assert names["Child run (trial)", "Params"] == set(trial_params(spec_with_memory()))
    parent = {base(n) for n in names["Parent run (sweep)", "Metrics"]}
    assert parent == dict_keys(ROOT / "orchestrator" / "launch" / "executor.py", "summary_metrics")
    plots = {n for n in names["Parent run (sweep)", "Artifacts"] if n.startswith("plots/")}
    assert plots == {
        f"plots/{k}.png" for k in dict_keys(ROOT / "orchestrator" / "results" / "report.py", "make_figures")
    }
