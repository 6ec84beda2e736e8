"""Run a planned sweep: record every point in MLflow, launch the runnable ones on Ray, stream their metrics."""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from tenacity import Retrying, retry_if_result, wait_fixed

from jobs.spec import TrialSpec
from orchestrator.config.schema import Options, sweep_identity
from orchestrator.launch.cluster import concurrency, connect
from orchestrator.launch.executor import execute
from orchestrator.results import gate, html, report
from orchestrator.tracking import mlflow_names, open_tracker, profiles, recording
from orchestrator.tracking.leases import SoleLeases
from orchestrator.ui.progress import SweepProgress

log = logging.getLogger(__name__)
WAIT_POLL_S = 5.0  # how often a driver looks at the leases another driver holds


def run(options: Options, specs: list[TrialSpec], rows: list) -> int:
    """Record every planned point, launch the runnable ones, and return the exit code. `options`: the driver's
    typed options (config.Loaded.options)."""
    name, sweep_id = sweep_identity(options)
    cluster = specs[0].cluster
    tracker = open_tracker(options.tracking)
    # what an earlier driver never delivered lands first; what it finished is skipped, what it logged kept
    done = tracker.resume(sweep_id)
    tracker.start_sweep(name, sweep_id, cluster.name)

    with SweepProgress(options.progress) as progress:
        runnable = _open_points(tracker, progress, specs, rows, done, sweep_id)
        _log_grid(tracker, specs, rows, done)
        outcomes, todo, by_other = _run_leased(options, cluster, tracker, progress, sweep_id, runnable)
    failed = [t for t, o in outcomes.items() if o not in ("finished", "infeasible")]
    ran = {s.trial_id for s in todo if outcomes.get(s.trial_id) == "finished"}
    plotted: list[report.TrialResult] = []
    page = ""
    try:  # a plot must never cost a sweep its exit code
        stored = {**done, **{t: tracker.run_id(t) for t in by_other}}
        plotted, page = _report(tracker, name, sweep_id, specs, rows, ran, stored, outcomes)
    except Exception:
        log.exception("sweep report failed")
    verdict, code = None, 0
    if recording(options.tracking) and options.gate.enabled:  # tracking=none: no store holds a baseline
        settled = ran | set(done) | {t for t, status in by_other.items() if status == "finished"}
        verdict, code = _gate(options, tracker, sweep_id, [t for t in plotted if t.spec.trial_id in settled])
    tracker.set_tags(
        "sweep", {"status": "failed" if failed else "finished", "trials_failed": str(len(failed))}
    )
    tracker.end("sweep", "FAILED" if failed else "FINISHED")
    if left := tracker.finish(timeout=300):  # the journal goes once all is delivered; else a rerun replays it
        log.error(
            "tracking store unreachable: %d writes not delivered (journaled for a rerun of sweep %s)",
            left,
            sweep_id,
        )
        return 1
    others = f", {len(by_other)} run by another driver" if by_other else ""
    print(
        f"sweep {sweep_id}: {sum(o == 'finished' for o in outcomes.values())} finished, "
        f"{len(failed)} failed, {len(done)} skipped (already finished){others}"
    )
    print(f"dashboard: {tracker.dashboard_hint()}")
    if verdict is not None:
        gate.render(verdict)
    if page:
        print(f"report: {page}", flush=True)
    return 1 if failed else code


def _open_points(
    tracker, progress: SweepProgress, specs: list[TrialSpec], rows: list, done: dict[str, str], sweep_id: str
) -> list[tuple[TrialSpec, Any]]:
    """Each distinct point on the progress display and in the store: one finished earlier is skipped, one
    the planner rejected recorded with its reason and closed; returns the runnable (spec, plan row)s."""
    runnable: list[tuple[TrialSpec, Any]] = []
    seen: set[str] = set()
    for spec, row in zip(specs, rows, strict=True):
        tid = spec.trial_id
        if tid in seen:
            continue
        seen.add(tid)
        label = mlflow_names.spec_label(spec, "column")
        if tid in done:
            progress.add(tid, label, spec.train.steps, "skipped", "finished earlier in this sweep")
        elif row.verdict != "run":
            progress.add(tid, label, spec.train.steps, row.verdict, row.reason)
            tracker.open_trial(spec, sweep_id, row.verdict, row.reason)
            tracker.log_metrics(tid, {"predicted_bytes_per_device": row.predicted_hbm_bytes_per_device})
            tracker.end(tid, "FINISHED")
        else:
            progress.add(tid, label, spec.train.steps)
            tracker.open_trial(spec, sweep_id)  # described once its lease is ours
            runnable.append((spec, row))
    return runnable


def _log_grid(tracker, specs: list[TrialSpec], rows: list, done: dict[str, str]) -> None:
    """grid.json on the parent run: the grid's table, each point's plan row and the child run holding its spec
    (trial_spec.json), so no spec is stored twice."""
    grid = []
    for spec, row in zip(specs, rows, strict=True):
        rid = tracker.run_id(spec.trial_id) or done.get(spec.trial_id)
        grid.append({"spec": f"runs:/{rid}/trial_spec.json" if rid else "", "plan": row.as_dict()})
    tracker.log_artifact("sweep", json.dumps(grid, indent=1), "grid.json")


def _report(
    tracker,
    name: str,
    sweep_id: str,
    specs: list[TrialSpec],
    rows: list,
    ran: set[str],
    stored: dict,
    outcomes: dict[str, str],
) -> tuple[list[report.TrialResult], str]:
    """The sweep's plots over every trial it has finished: those this driver ran (from its own records) and
    those an earlier or another driver of this sweep settled (`stored`: trial id -> run id, read back); then
    its HTML page (results/html.py) on the parent run and next to the store. Returns the trials the plots cover
    and the page's path."""
    by_id = {s.trial_id: r for s, r in zip(specs, rows, strict=True)}
    finished = list({s.trial_id: s for s in specs if s.trial_id in ran or stored.get(s.trial_id)}.values())

    def records_of(tid: str) -> list:
        return tracker.records(tid) if tid in ran else tracker.records(tid, stored[tid])

    trials, pngs = report.publish(tracker, finished, by_id, records_of)
    tracker.set_tags("sweep", {"plots_trials": str(len(trials))})

    def link_of(tid: str) -> str:
        rid = tracker.run_id(tid) or stored.get(tid)
        return tracker.run_url(rid) if rid else ""

    settled = {**{t: "finished" for t in stored}, **outcomes}
    points = html.points(list(by_id.values()), trials, settled, link_of)
    cluster = specs[0].cluster
    summary = [
        html.counts(points),
        f"{specs[0].model.name} on {cluster.name} ({cluster.platform}); sweep id {sweep_id}",
        f"dashboard: {tracker.dashboard_hint()}",
    ]
    notes = [html.CPU_NOTE] if cluster.platform == "cpu" else []
    text = html.page(f"sweep {name} · {sweep_id}", summary, points, pngs, notes)
    tracker.log_artifact("sweep", text, "report.html")
    path = os.path.join(tracker.report_dir(), f"{sweep_id}.html")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    return trials, path


def _describe(tracker, spec: TrialSpec, row, sweep_id: str) -> None:
    """A trial this driver holds: its params, spec, status and predictions on its child run."""
    tracker.open_trial(spec, sweep_id, "queued")
    tracker.log_metrics(spec.trial_id, {"predicted_bytes_per_device": row.predicted_hbm_bytes_per_device})
    if row.step is not None:  # the plan's terms: next to the measured final_step_time_median_s and a profile
        tracker.log_metrics(
            spec.trial_id, {"predicted_step_time_s": row.step.step_s, **profiles.band_metrics(row)}
        )
        profiles.log_predicted(tracker, spec.trial_id, row.step)


def _run_leased(options: Options, cluster, tracker, progress: SweepProgress, sweep_id: str, runnable: list):
    """Claim the runnable trials' leases (orchestrator/tracking/leases.py), run this driver's, then wait for those
    another driver holds. Returns (trial id -> outcome, the specs run here, trial id -> the status another driver
    settled it with)."""
    outcomes: dict[str, str] = {}
    ran: list[TrialSpec] = []

    def launch(batch: list[TrialSpec]) -> None:
        connect(cluster)
        outcomes.update(execute(batch, tracker, progress, concurrency(cluster), options.retries, sweep_id))
        ran.extend(batch)

    leases = tracker.leases()
    try:
        leases.start()
    except Exception as e:  # noqa: BLE001 - the store went away after the preflight: run, unguarded
        log.warning(
            "trial leases unavailable (%s: %s): this driver runs its trials without them",
            type(e).__name__,
            str(e)[:200],
        )
        leases = SoleLeases()
    try:
        mine, held = _claim(leases, runnable, progress, tracker)
        for spec, row in mine:
            _describe(tracker, spec, row, sweep_id)
        if mine:
            launch([spec for spec, _ in mine])
        by_other = _wait_for_others(leases, held, tracker, progress, sweep_id, launch, outcomes)
    finally:
        leases.close()
    return outcomes, ran, by_other


def _claim(leases, runnable: list, progress: SweepProgress, tracker) -> tuple[list, dict]:
    """Claim in grid order. Once a trial is held by a live driver, claim no more: that driver is running this
    sweep, so the rest are left to it (two drivers started together do not split a sweep)."""
    mine, held, holder = [], {}, ""
    for spec, row in runnable:
        claim = None if holder else _try_claim(leases, spec.trial_id)
        if claim is not None and claim.ours:
            if claim.epoch > 1:  # taken from a driver that died: what it logged since resume() is known too
                _refresh(tracker, spec.trial_id)
            mine.append((spec, row))
            continue
        holder = holder or claim.holder
        held[spec.trial_id] = (spec, row)
        progress.event(spec.trial_id, f"left to driver {holder}, which holds this sweep: waiting")
    return mine, held


def _refresh(tracker, tid: str) -> None:
    try:
        tracker.refresh(tid)
    except Exception as e:  # noqa: BLE001 - resume()'s reading stands
        log.warning("trial %s: its steps could not be re-read (%s)", tid, type(e).__name__)


def _try_claim(leases, tid: str):
    """A claim; a store that fails it (an outage since the heartbeat) leaves the trial to this driver."""
    try:
        return leases.claim(tid)
    except Exception as e:  # noqa: BLE001
        log.warning("trial %s: lease not claimed (%s: %s); running it unguarded", tid, type(e).__name__, e)
        return SoleLeases().claim(tid)


def _wait_for_others(
    leases, held: dict, tracker, progress, sweep_id: str, launch, outcomes: dict
) -> dict[str, str]:
    """Until every trial another driver holds is settled. What it finished or failed is its result (reported,
    not rerun); a trial whose driver died first is claimed and run here. Returns trial id -> the status the
    other driver settled it with."""
    by_other: dict[str, str] = {}

    def look() -> int:
        """One look at the held trials' leases; how many are still held by another driver."""
        taken = []
        for tid, (spec, row) in list(held.items()):
            claim = _look_at(leases, tracker, tid)
            if claim is None or not (claim.ours or claim.status in ("finished", "failed")):
                continue  # still held, or unreadable: look again at the next poll
            if claim.ours:
                _describe(tracker, spec, row, sweep_id)
                taken.append(spec)
                progress.event(tid, "its driver is gone: taken over")
            else:
                by_other[tid] = claim.status
                progress.update(tid, state="skipped", note=f"{claim.status} by driver {claim.holder}")
            del held[tid]
        if taken:
            launch(taken)
        return len(held)

    def waiting(left: int) -> bool:
        return left > 0 and "cancelled" not in outcomes.values()

    try:
        if held:
            Retrying(retry=retry_if_result(waiting), wait=wait_fixed(WAIT_POLL_S))(look)
    except KeyboardInterrupt:
        print(f"interrupted: {len(held)} trials held by another driver are left to it", flush=True)
    return by_other


def _look_at(leases, tracker, tid: str):
    """A held trial's lease, claimed if its driver is gone (then the steps that driver logged are read, so they
    are not logged again); None when the store is away."""
    try:
        claim = leases.claim(tid, settled=("finished", "failed"))
        if claim.ours:
            tracker.refresh(tid)
        return claim
    except Exception as e:  # noqa: BLE001 - the store is away: look again at the next poll
        log.warning("trial %s: its lease could not be read (%s); waiting", tid, type(e).__name__)
        return None


def _gate(options: Options, tracker, sweep_id: str, finished: list) -> tuple[Any, int]:
    """(the regression gate's verdict, 0 or gate.EXIT_REGRESSION) over the trials this sweep finished, as
    this driver holds them (`tracker`: the MLflow one); the store is asked only for their baselines. (None, 1)
    when it cannot answer."""
    g = options.gate
    measured = [gate.from_trial(t, sweep_id, tracker.started[t.spec.trial_id]) for t in finished]
    try:
        args = (g.max_drop, g.window, g.noise_k, measured)
        result = tracker.call(gate.compare, tracker.client, tracker.experiment_id(), sweep_id, *args)
    except Exception:
        log.exception("regression gate could not read the tracking store")
        return None, 1
    tracker.set_tags("sweep", gate.tags(result))
    return result, gate.exit_code(result)
