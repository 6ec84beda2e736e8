"""A sweep read back from its MLflow store, through MLflow's own client, as the tests check it: the runs of a
sweep by kind, a run's metric history by step, its artifacts."""

from __future__ import annotations

from pathlib import Path

from mlflow import MlflowClient
from mlflow.entities import FileInfo, Run

EXPERIMENT = "cp_scaling"  # the experiment a driver writes into (conf/tracking/*.yaml)


def client(store: str | Path) -> MlflowClient:
    """A client of `store`: a tracking URI, or the folder whose ./mlflow.db a driver with tracking=local wrote
    (the test's tmp_path, which is also the `store` fixture's)."""
    return MlflowClient(f"sqlite:///{Path(store) / 'mlflow.db'}" if isinstance(store, Path) else store)


def experiment_id(c: MlflowClient, experiment: str = EXPERIMENT) -> str:
    """The id of the experiment a sweep wrote into (the regression gate and the refit take it)."""
    return c.get_experiment_by_name(experiment).experiment_id


def runs(
    c: MlflowClient, sweep_id: str | None = None, kind: str | None = None, experiment: str = EXPERIMENT
) -> list[Run]:
    """The experiment's runs (up to MLflow's 1,000 a page), of one sweep and of one kind ("sweep": the parent,
    "trial": a child) where given; none before the experiment exists."""
    exp = c.get_experiment_by_name(experiment)
    if exp is None:
        return []
    tags = {"sweep_id": sweep_id, "kind": kind}
    where = " and ".join(f"tags.{k} = '{v}'" for k, v in tags.items() if v is not None)
    return c.search_runs([exp.experiment_id], where, max_results=1000)


def sweep_runs(
    c: MlflowClient, sweep_id: str | None = None, experiment: str = EXPERIMENT
) -> tuple[list[Run], list[Run]]:
    """(the parent runs, the trial runs) of the sweep, or of every sweep in the experiment."""
    return runs(c, sweep_id, "sweep", experiment), runs(c, sweep_id, "trial", experiment)


def trial(c: MlflowClient, sweep_id: str | None = None) -> Run:
    """The one trial run (of the sweep, where given); fails if there are none or several."""
    (run,) = runs(c, sweep_id, "trial")
    return run


def history(c: MlflowClient, run: Run | str, key: str = "loss") -> list[tuple[int, float]]:
    """A run's (step, value) points of metric `key`, by step."""
    run_id = run if isinstance(run, str) else run.info.run_id
    return sorted((m.step, m.value) for m in c.get_metric_history(run_id, key))


def steps(c: MlflowClient, run: Run | str, key: str = "loss") -> list[int]:
    """The steps a run logged metric `key` at, in order (a step twice is there twice)."""
    return [s for s, _ in history(c, run, key)]


def values(c: MlflowClient, run: Run | str, key: str = "loss") -> list[float]:
    """A run's values of metric `key`, by step."""
    return [v for _, v in history(c, run, key)]


def artifact_text(c: MlflowClient, run: Run, path: str, dest: Path) -> str:
    """The text of a run's artifact, downloaded under `dest`."""
    with open(c.download_artifacts(run.info.run_id, path, str(dest))) as f:
        return f.read()


def artifact_files(c: MlflowClient, run_id: str, path: str | None = None) -> list[FileInfo]:
    """Every file among a run's artifacts (under `path` where given), folders walked."""
    found = c.list_artifacts(run_id, path)
    return [f for a in found for f in (artifact_files(c, run_id, a.path) if a.is_dir else [a])]
