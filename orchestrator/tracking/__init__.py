"""What a sweep asks of a tracking store (the Tracker protocol, whose bodies record nothing), and the factory.

`tracking=none` (conf/tracking/none.yaml, `tracking.uri: none`) gives the NullTracker, the protocol's own no-op
bodies: a quick local debug run that writes no MLflow store, no journal and no plots, and never imports mlflow.
Any other uri gives the MLflow tracker (orchestrator/tracking/store.py), which implements the protocol
structurally: a method it lacks fails loudly instead of falling back to a no-op.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from jobs.records import Record
from jobs.spec import TrialSpec
from orchestrator.tracking.leases import Leases, SoleLeases

NONE_URI = "none"


@runtime_checkable
class Tracker(Protocol):
    """What the driver, the executor, results/ and the CLI's record=true write and read, by run `key` ("sweep"
    for the parent run, a trial id for a child run).

    Levanter's Tracker logs a run's hyperparameters, metrics, summary and artifacts. A sweep needs those for a
    tree of runs (a parent per sweep, a child per trial, `start_sweep` / `open_trial` / `end`), plus what
    running one sweep with many drivers, killed and restarted, takes:

    - writes: `log_metrics`, `set_tags` (the summary), `log_artifact`; a trial's hyperparameters are its grid
      axes, written when it is described (`open_trial` with a status); `log_records` turns a job's typed
      records into metrics, and `set_status` moves a trial through its states (queued ... finished);
    - resuming: `resume` (what earlier drivers of the sweep finished and logged), `refresh` (what the store
      has of a trial taken over from a dead driver), `leases` (one driver per trial), `records` (a finished
      trial's records, for the plots), `run_id`;
    - where to look: `run_url`, `dashboard_hint`, `report_dir`;
    - delivery: writes never wait for the store (opening a run does); `finish` is where a caller waits.

    These bodies are the NullTracker's: every write dropped, nothing finished before, everything delivered."""

    def start_sweep(self, name: str, sweep_id: str, cluster: str, tags: dict[str, str] | None = None) -> None:
        """Open the sweep's parent run (or reopen it, for a resumed sweep id)."""

    def open_trial(self, spec: TrialSpec, sweep_id: str, status: str = "", reason: str = "") -> None:
        """Open the trial's child run; with a `status`, also describe it (grid axes as params, the spec as an
        artifact, the status tag and `reason`). A runnable trial is opened at once and described once its
        lease is this driver's."""

    def end(self, key: str, status: str = "FINISHED") -> None:
        """The run's MLflow status (FINISHED, FAILED, KILLED)."""

    def log_metrics(self, key: str, values: dict[str, float | None], step: int = 0) -> None:
        """Metric points at `step`; a value that is None or NaN is left out."""

    def set_tags(self, key: str, tags: dict[str, str]) -> None:
        """Tags on the run: its summary (status, counts, limiters, the gate's verdict)."""

    def log_artifact(self, key: str, data: str | bytes, path: str) -> None:
        """`data` (text as UTF-8) as the run's artifact `path`."""

    def log_records(self, key: str, records: list[Record], attempt: int = 1) -> None:
        """A trial's job records as metrics and tags (a step already logged is dropped) and in its trial log."""

    def set_status(self, key: str, status: str, reason: str = "", terminal: str | None = None) -> None:
        """A trial's status tag (queued, running, retrying, finished, failed, infeasible, invalid, cancelled)
        and why; `terminal`: the MLflow status its run ends with."""

    def resume(self, sweep_id: str) -> dict[str, str]:
        """Take the sweep up where its earlier drivers left it, before any write: deliver what a killed one
        never did, and learn which steps its unfinished trials logged (so none is logged twice). Returns the
        trials it finished: trial id -> run id."""
        return {}

    def refresh(self, key: str) -> None:
        """Re-read what the store has of trial `key` (steps, attempts): before going on with another driver's."""

    def leases(self) -> Leases | SoleLeases:
        """This driver's trial leases (orchestrator/tracking/leases.py); without a store, every trial is its own."""
        return SoleLeases()

    def records(self, key: str, run_id: str = "") -> list[Record]:
        """A trial's records: as this driver logged them, or, given `run_id` (a trial an earlier or another
        driver finished), as its run's trial log holds them."""
        return []  # so the end-of-sweep report has nothing to plot, and renders nothing

    def run_id(self, key: str) -> str | None:
        """The run this driver opened for `key`, if any."""
        return None

    def run_url(self, run_id: str) -> str:
        """The run's page in the store's UI ("": none)."""
        return ""

    def dashboard_hint(self) -> str:
        """Where a person sees the sweep, as the driver prints it."""
        return "nothing was recorded (tracking=none)"

    def report_dir(self) -> str:
        """Where the sweep's HTML page is written."""
        return "reports"

    def finish(self, timeout: float = 0.0) -> int:
        """Wait up to `timeout` s for every write to reach the store; returns how many have not (0: all did)."""
        return 0


class NullTracker(Tracker):
    """Records nothing: the Tracker protocol's own bodies."""


def recording(tracking: Any) -> bool:
    """Whether these tracking options name a store at all (the regression gate needs one to compare with)."""
    return str(tracking.uri) != NONE_URI


def open_tracker(tracking: Any) -> Tracker:
    """The tracker for the `tracking` options (schema.Tracking, or the composed config's `tracking` node)."""
    if not recording(tracking):
        return NullTracker()
    from orchestrator.tracking.store import MlflowTracker  # imports mlflow (~1 s): only when it records

    return MlflowTracker(tracking.uri, tracking.experiment, getattr(tracking, "artifact_location", "") or "")
