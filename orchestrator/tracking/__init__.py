"""What the driver asks of a tracking store (the Tracker protocol), a no-op one, and the factory that picks one.

`tracking=none` (conf/tracking/none.yaml, `tracking.uri: none`) gives the NullTracker: a quick local debug run
that writes no MLflow store, no journal and no plots, and never imports mlflow. Any other uri gives the MLflow
tracker (orchestrator/tracking/store.py).
"""

from __future__ import annotations

from collections.abc import Sized
from typing import Any, Protocol, runtime_checkable

from jobs.records import Record
from jobs.spec import TrialSpec

NONE_URI = "none"


@runtime_checkable
class Tracker(Protocol):
    """The writes and reads the driver, the executor, results/planned.py and results/report.py make. Opening a
    run (start_sweep, open_trial, start_trial) waits for the store; no other write does: `flush` is where a
    caller waits for them."""

    @property
    def ops(self) -> Sized:
        """The writes not yet delivered."""
        ...

    def flush(self, timeout: float = 0.0) -> bool: ...
    def use_journal(self, sweep_id: str) -> int: ...
    def close_journal(self) -> None: ...
    def finished_trials(self, sweep_id: str) -> dict[str, str]: ...
    def resume(self, sweep_id: str) -> None: ...
    def refresh(self, key: str) -> None: ...
    def leases(self) -> Any: ...  # orchestrator/tracking/leases.py: Leases, or SoleLeases without a store
    def open_trial(self, spec: TrialSpec, sweep_id: str) -> None: ...
    def start_sweep(
        self, name: str, sweep_id: str, cluster: str, tags: dict[str, str] | None = None
    ) -> None: ...
    def start_trial(
        self,
        spec: TrialSpec,
        sweep_id: str,
        status: str = "queued",
        reason: str = "",
        predicted_bytes: int | None = None,
    ) -> None: ...
    def set_status(self, key: str, status: str, reason: str = "", terminal: str | None = None) -> None: ...
    def log_records(self, key: str, records: list[Record], attempt: int = 1) -> None: ...
    def log_metrics(self, key: str, values: dict[str, float], step: int = 0) -> None: ...
    def log_text(self, key: str, text: str, path: str) -> None: ...
    def log_bytes(self, key: str, data: bytes, path: str) -> None: ...
    def log_figure(self, key: str, fig: Any, path: str) -> None: ...
    def set_tags(self, key: str, tags: dict[str, str]) -> None: ...
    def end(self, key: str, status: str = "FINISHED") -> None: ...
    def records(self, key: str) -> list[Record]: ...
    def stored_records(self, run_id: str) -> list[Record]: ...
    def run_id(self, key: str) -> str | None: ...
    def dashboard_hint(self) -> str: ...
    def run_url(self, run_id: str) -> str: ...
    def report_dir(self) -> str: ...


class NullTracker:
    """Records nothing: every write is dropped, nothing has finished before, every flush has delivered."""

    ops: tuple = ()

    def flush(self, timeout: float = 0.0) -> bool:
        return True

    def use_journal(self, sweep_id: str) -> int:
        return 0

    def close_journal(self) -> None:
        pass

    def finished_trials(self, sweep_id: str) -> dict[str, str]:
        return {}

    def resume(self, sweep_id: str) -> None:
        pass

    def refresh(self, key: str) -> None:
        pass

    def leases(self) -> Any:
        from orchestrator.tracking.leases import SoleLeases

        return SoleLeases()

    def open_trial(self, spec: TrialSpec, sweep_id: str) -> None:
        pass

    def start_sweep(self, name: str, sweep_id: str, cluster: str, tags: dict[str, str] | None = None) -> None:
        pass

    def start_trial(
        self,
        spec: TrialSpec,
        sweep_id: str,
        status: str = "queued",
        reason: str = "",
        predicted_bytes: int | None = None,
    ) -> None:
        pass

    def set_status(self, key: str, status: str, reason: str = "", terminal: str | None = None) -> None:
        pass

    def log_records(self, key: str, records: list[Record], attempt: int = 1) -> None:
        pass

    def log_metrics(self, key: str, values: dict[str, float], step: int = 0) -> None:
        pass

    def log_text(self, key: str, text: str, path: str) -> None:
        pass

    def log_bytes(self, key: str, data: bytes, path: str) -> None:
        pass

    def log_figure(self, key: str, fig: Any, path: str) -> None:
        pass

    def set_tags(self, key: str, tags: dict[str, str]) -> None:
        pass

    def end(self, key: str, status: str = "FINISHED") -> None:
        pass

    def records(self, key: str) -> list[Record]:
        return []  # so the end-of-sweep report has nothing to plot, and renders nothing

    def stored_records(self, run_id: str) -> list[Record]:
        return []

    def run_id(self, key: str) -> str | None:
        return None

    def dashboard_hint(self) -> str:
        return "nothing was recorded (tracking=none)"

    def run_url(self, run_id: str) -> str:
        return ""

    def report_dir(self) -> str:
        return "reports"


def recording(tracking: Any) -> bool:
    """Whether these tracking options name a store at all (the regression gate needs one to compare with)."""
    return str(tracking.uri) != NONE_URI


def open_tracker(tracking: Any) -> Tracker:
    """The tracker for the `tracking` options (schema.Tracking, or the composed config's `tracking` node)."""
    if not recording(tracking):
        return NullTracker()
    from orchestrator.tracking.store import MlflowTracker  # imports mlflow (~1 s): only when it records

    return MlflowTracker(tracking.uri, tracking.experiment, getattr(tracking, "artifact_location", "") or "")
