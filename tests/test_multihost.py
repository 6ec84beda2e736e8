"""Two JAX processes x 4 CPU devices (jax.distributed, gloo) train exactly like one process with 8 devices."""

import mlflow_lookup
import pytest

from jobs.train import train
from orchestrator.config.grid import expand
from orchestrator.config.load import load

GRID = [
    "+sweep=smoke",
    "sweep.axes.strategy=[ring,ulysses]",
    "sweep.axes.context_length=[512]",
    "~sweep.set",
    "train.steps=3",
    "train.dtype=float32",
    "progress=plain",
]


@pytest.mark.slow
def test_local_multihost_matches_local_loss_curves(tmp_path, local_ray, store, cli):
    res = cli([*GRID, "cluster=local_multihost", "sweep.id=mh"], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    # both processes of every multi-host attempt were placed and reported in
    assert res.stdout.count(", 1=pid ") == 2, res.stdout
    client = mlflow_lookup.client(tmp_path)
    multi = {
        r.data.tags["trial_id"]: mlflow_lookup.values(client, r)
        for r in mlflow_lookup.runs(client, "mh", "trial")
    }
    # the reference: the same grid on one process with 8 devices (this one), no Ray; the cluster is
    # execution, not identity, so its trials have the multi-host ones' ids
    single = {
        s.trial_id: [r.loss for r in train(s) if r.kind == "step"]
        for s in expand(load([*GRID, "cluster=local"]))
    }
    assert set(single) == set(multi) and len(single) == 2
    for tid, curve in single.items():
        assert len(curve) == 3 and len(multi[tid]) == 3
        # fp32; cross-process (gloo) reductions may sum in another order than in-process ones
        assert multi[tid] == pytest.approx(curve, rel=1e-5, abs=1e-6), (tid, curve, multi[tid])
