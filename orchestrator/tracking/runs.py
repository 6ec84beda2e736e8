"""Find or create an MLflow run by its identity tags, with one winner when drivers race to create it.

A search then a create is not atomic: drivers of one sweep started together can all find nothing and all
create the run. The store's unique keys decide instead. A child run is settled on its parent: the param
`run.<key>` names it, and a param cannot change once logged, so one candidate wins however many race (the
others delete theirs). A parent has nothing above it, so its creator first reserves the name
`<experiment>.runs/<identity>` as an experiment (names are unique): the one driver that reserved it creates
the run and leaves its id as the reservation's tag (then deletes the reservation, which keeps the name but
hides it); every other driver reads the id from there.
"""

from __future__ import annotations

import uuid
from typing import Any, NamedTuple

from tenacity import RetryError, Retrying, retry_if_result, stop_after_delay, wait_fixed

WAIT_S = 60.0  # for the driver that reserved a parent run to create it


class Opened(NamedTuple):
    run_id: str
    found: bool  # it existed already (a resumed sweep's, another driver's, or ours whose answer was lost)
    start_time: int  # ms, MLflow's start time of the run (the regression gate's "earlier")


def _oldest(runs: list) -> Any:
    return min(runs, key=lambda r: (r.info.start_time, r.info.run_id))


def _opened(client: Any, run_id: str, found: bool, known: Any = None) -> Opened:
    """`known`: the run when we hold it already (searched or created); another driver's is read."""
    run = known if known is not None and known.info.run_id == run_id else client.get_run(run_id)
    return Opened(run_id, found, run.info.start_time)


def log_param_once(client: Any, run_id: str, key: str, value: str) -> str:
    """Log `key` = `value` unless the run has `key` already; returns the value that stands. Params cannot
    change once logged, so of several writers racing on one key exactly one wins (the store's primary key)."""
    from mlflow.exceptions import MlflowException

    try:
        client.log_param(run_id, key, value)
        return value
    except MlflowException as e:
        if e.error_code != "INVALID_PARAMETER_VALUE":
            raise
        return client.get_run(run_id).data.params[key]


def _settle_child(client: Any, anchor: str, key: str, candidate: str) -> str:
    """The child run recorded on the parent for `key`: `candidate`, unless another was recorded first."""
    return log_param_once(client, anchor, f"run.{key}", candidate)


def _reserved(
    client: Any, exp_id: str, identity: dict[str, str], tags: dict, name: str, owner: str
) -> Opened:
    """A parent run created by exactly one driver: the one whose reservation experiment was created.
    `owner` marks the reservation ours, so a retry after a lost answer goes on with it."""
    from mlflow.exceptions import MlflowException

    owner = owner or uuid.uuid4().hex  # no id given: only this call can tell the reservation its own
    exp = client.get_experiment(exp_id).name
    key = f"{exp}.runs/" + ",".join(f"{k}={v}" for k, v in sorted(identity.items()))
    try:
        res = client.create_experiment(key, tags={"owner": owner})
    except MlflowException as e:
        if e.error_code != "RESOURCE_ALREADY_EXISTS":
            raise

        def settled() -> tuple[str, str] | None:
            """("run", its id) once the reserving driver made it; ("ours", the reservation) when the
            reservation is our own whose answer was lost; None while another driver is creating the run."""
            found = client.get_experiment_by_name(key)
            marks = found.tags if found else {}
            if marks.get("run"):
                return "run", marks["run"]
            return ("ours", found.experiment_id) if marks.get("owner") == owner else None

        wait = Retrying(
            retry=retry_if_result(lambda got: got is None),
            stop=stop_after_delay(WAIT_S),
            wait=wait_fixed(0.2),
        )
        try:
            what, res = wait(settled)
        except RetryError:
            raise RuntimeError(f"{key} was reserved but no run was created in {WAIT_S:.0f} s") from None
        if what == "run":
            return _opened(client, res, True)
    mine = client.create_run(exp_id, tags={**identity, **tags}, run_name=name)
    client.set_experiment_tag(res, "run", mine.info.run_id)
    client.delete_experiment(res)
    return _opened(client, mine.info.run_id, False, mine)


def find_or_create(
    client: Any,
    exp_id: str,
    identity: dict[str, str],
    tags: dict[str, str],
    name: str,
    anchor: tuple[str, str] | None = None,
    owner: str = "",
) -> Opened:
    """The run with these identity tags, created (with `tags`) when there is none.
    `anchor`: (parent run id, key) for a child run, settled on the parent; `owner`: this opener's id."""
    filt = " and ".join(f"tags.{k} = '{v}'" for k, v in identity.items())
    found = client.search_runs([exp_id], filt, max_results=50)
    if not anchor:
        if found:
            return _opened(client, _oldest(found).info.run_id, True, _oldest(found))
        return _reserved(client, exp_id, identity, tags, name, owner)
    if found:
        oldest = _oldest(found)
        return _opened(client, _settle_child(client, *anchor, oldest.info.run_id), True, oldest)
    mine = client.create_run(exp_id, tags={**identity, **tags}, run_name=name)
    winner = _settle_child(client, *anchor, mine.info.run_id)
    if winner != mine.info.run_id:  # another driver created it too, and recorded its own first
        client.delete_run(mine.info.run_id)
    return _opened(client, winner, winner != mine.info.run_id, mine)
