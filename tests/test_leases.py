"""Trial leases and race-safe run creation on a real MLflow store (sqlite, and PostgreSQL as deployed)."""

import subprocess
import sys
import threading
import time

import pytest
from mlflow import MlflowClient

from orchestrator.tracking.leases import Leases, driver_token
from orchestrator.tracking.runs import find_or_create


def _race(n: int, fn) -> list:
    """fn(i) on n threads released together; their results in thread order."""
    gate, out = threading.Barrier(n), [None] * n

    def go(i: int) -> None:
        gate.wait()
        out[i] = fn(i)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def _sweep(client: MlflowClient, trials: int = 1) -> dict[str, str]:
    exp = client.create_experiment("leases")
    parent = client.create_run(exp, tags={"kind": "sweep"}).info.run_id
    return {"sweep": parent, **{f"t{i}": client.create_run(exp).info.run_id for i in range(trials)}}


def test_drivers_racing_to_create_a_run_end_with_one(sql_store, tmp_path, monkeypatch):
    """Ten races of two openers released at once for a parent run (the older candidate wins), and ten of three
    for a child run (settled on the parent): every opener ends on the same run, the others are deleted."""
    monkeypatch.chdir(tmp_path)
    client = MlflowClient(sql_store)
    exp = client.create_experiment("race")
    for k in range(10):
        ident = {"sweep_id": f"s{k}", "kind": "sweep"}
        got = _race(2, lambda i, ident=ident: find_or_create(client, exp, ident, {}, "sweep")[0])
        assert len(set(got)) == 1, got
        assert [r.info.run_id for r in client.search_runs([exp], f"tags.sweep_id = 's{k}'")] == got[:1]
        ident = {"sweep_id": f"s{k}", "trial_id": "t"}
        anchor = (got[0], "t")
        got = _race(3, lambda i, ident=ident, a=anchor: find_or_create(client, exp, ident, {}, "t", a)[0])
        assert len(set(got)) == 1, got
        live = client.search_runs([exp], f"tags.sweep_id = 's{k}' and tags.trial_id = 't'")
        assert [r.info.run_id for r in live] == got[:1]
        assert client.get_run(anchor[0]).data.params["run.t"] == got[0]


def test_one_holder_at_a_time_and_the_lease_passes_when_its_driver_exits(sql_store, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    client = MlflowClient(sql_store)
    ids = _sweep(client, trials=10)
    a, b = Leases(client, ids), Leases(client, ids)
    a.start(), b.start()
    # racing claims: exactly one driver gets each trial
    for t in [k for k in ids if k != "sweep"]:
        ours = _race(2, lambda i, t=t: (a, b)[i].claim(t).ours)
        assert sorted(ours) == [False, True], (t, ours)
    first = a.claim("t0")
    holder, other = (a, b) if first.ours else (b, a)
    assert not other.claim("t0").ours and other.claim("t0").holder == holder.token
    holder.close()  # a driver that exits frees its leases at once
    assert other.claim("t0").ours
    params = client.get_run(ids["t0"]).data.params
    assert params["lease_1"] == holder.token and params["lease_2"] == other.token
    other.close()


def test_a_settled_trial_is_its_drivers_result(sql_store, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    client = MlflowClient(sql_store)
    ids = _sweep(client)
    a, b = Leases(client, ids), Leases(client, ids)
    a.start(), b.start()
    assert a.claim("t0").ours
    client.set_tag(ids["t0"], "status", "finished")
    a.close()
    c = b.claim("t0", settled=("finished", "failed"))
    assert not c.ours and c.status == "finished" and c.holder == a.token
    # a failed trial of a driver that exited: its result for a driver that waited on it, but a rerun's to retry
    client.set_tag(ids["t0"], "status", "failed")
    assert not b.claim("t0", settled=("finished", "failed")).ours
    assert b.claim("t0").ours
    b.close()


def test_dead_holders_lose_their_leases(sql_store, tmp_path, monkeypatch):
    """A holder on this host whose process is gone (a SIGKILLed driver) at once; one elsewhere after the TTL."""
    monkeypatch.chdir(tmp_path)
    client = MlflowClient(sql_store)
    ids = _sweep(client, trials=3)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    host = driver_token().rpartition("-")[0].rpartition("-")[0]
    now = int(time.time())
    holders = {
        "t0": (f"{host}-{gone.pid}-dead00", now),
        "t1": ("elsewhere-1-aaaaaa", now - 3600),
        "t2": ("elsewhere-2-bbbbbb", now),
    }
    for t, (token, beat) in holders.items():
        client.log_param(ids[t], "lease_1", token)
        client.set_tag(ids["sweep"], f"driver.{token}", str(beat))
    me = Leases(client, ids)
    me.start()
    assert me.claim("t0").ours and me.claim("t1").ours  # dead here; silent past the TTL
    live = me.claim("t2")
    assert not live.ours and live.holder == "elsewhere-2-bbbbbb"  # heard from just now
    me.close()


def test_a_reservation_whose_run_was_never_created_is_taken_up_by_its_owner(sql_store, tmp_path, monkeypatch):
    """The parent's name was reserved, then the create failed before reaching the store: the write queue's retry
    by the same tracker (its owner id) creates the run instead of waiting on its own reservation."""
    monkeypatch.chdir(tmp_path)
    client = MlflowClient(sql_store)
    exp = client.create_experiment("lost")
    real, calls = client.create_run, []

    def flaky(*a, **k):
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("the request never reached the store")
        return real(*a, **k)

    monkeypatch.setattr(client, "create_run", flaky)
    ident = {"sweep_id": "s", "kind": "sweep"}
    with pytest.raises(ConnectionError):
        find_or_create(client, exp, ident, {}, "s", owner="me")
    rid, found, _ = find_or_create(client, exp, ident, {}, "s", owner="me")
    assert not found and [r.info.run_id for r in client.search_runs([exp], "tags.sweep_id = 's'")] == [rid]
    assert find_or_create(client, exp, ident, {}, "s", owner="other")[:2] == (rid, True)
