"""A sweep's finished trial runs, read back from MLflow with the TrialSpec each one ran (its spec artifact)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from jobs.spec import TrialSpec

SPEC_ARTIFACT = "trial_spec.json"  # the trial's spec as its run logs it (tracking.store)


def search_filter(sweep_id: str) -> str:
    """MLflow's filter string for the finished trial runs of `sweep_id`."""
    return f"tags.sweep_id = '{sweep_id}' and tags.kind = 'trial' and tags.status = 'finished'"


def finished_runs(client: Any, experiment_id: str, sweep_id: str) -> list:
    """The finished trial runs of `sweep_id` (MLflow Run objects)."""
    return client.search_runs([experiment_id], search_filter(sweep_id), max_results=5000)


def run_spec(client: Any, run_id: str) -> TrialSpec:
    """The spec the run logged; raises what TrialSpec.from_json raises where an older (or newer) job wrote it."""
    with tempfile.TemporaryDirectory() as tmp:
        return TrialSpec.from_json(Path(client.download_artifacts(run_id, SPEC_ARTIFACT, tmp)).read_text())
