"""aot=true on a Ray pool: the same answers as one compile after another, a rerun served by the cache alone, a
gs:// cache shared between runs (GCS emulator: gcsfs writes, google-cloud-storage looks), and the host memory each
compile reserves."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from jobs import storage
from jobs.spec import MeshSpec, ModelSpec, StrategySpec, TrainSpec, TrialSpec
from orchestrator.config.load import group_option
from orchestrator.launch import cluster
from orchestrator.plan import aot, cluster_model
from orchestrator.plan.aot import cache, pool
from orchestrator.plan.aot.target import FLOOR_BYTES, GIB, compile_host_bytes
from tests.servers import gcs_client, start_gcs_emulator

ROOT = Path(__file__).resolve().parent.parent
BUCKET = "aot-cache"
RING8 = MeshSpec(context=8)


def small(strategy: str = "ring", mesh: MeshSpec = RING8, length: int = 2048, **model) -> TrialSpec:
    """The tiny model on a tpu7x 2x2x1 slice (8 devices); address "" so join_or_start starts a local Ray and
    never joins one another test left running (the trial id leaves the cluster out: same cache entry)."""
    c = replace(cluster_model.load("tpu7x_128")[0], topology="2x2x1", address="")
    s = replace(StrategySpec(**group_option("strategy", strategy)), block_q=256, block_kv=256)
    return TrialSpec(
        model=replace(ModelSpec(**group_option("model", "tiny")), **model),
        mesh=mesh,
        strategy=s,
        context_length=length,
        train=TrainSpec(remat="full"),
        cluster=c,
    )


def broken() -> TrialSpec:
    """A point with no TPU topology: its compile raises before jax loads."""
    spec = small()
    return replace(spec, cluster=replace(spec.cluster, accelerator="cpu"))


@pytest.fixture
def fresh_ray(no_ray, monkeypatch):
    """No Ray before the test (it starts its own, as the command line does: launch/cluster.py), none after;
    PYTHONPATH as it was."""
    import ray

    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", str(ROOT)))
    return ray


@pytest.fixture
def gcs(monkeypatch):
    """A GCS emulator with one bucket; gcsfs (jobs.storage, and the pool's workers) on it."""
    url, stop = start_gcs_emulator(bucket=BUCKET)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", url)
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "test")
    yield url
    stop()


def without_time(row: aot.Comparison) -> aot.Comparison:
    return replace(row, result=replace(row.result, compile_s=0.0))


def entries(where: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in where.glob("*.json")}


@pytest.mark.slow
def test_pool_answers_as_the_serial_path_and_a_rerun_compiles_nothing(tmp_path, local_ray):
    """On the session's local Ray, as on any Ray started elsewhere: the pool compiles on the one it finds."""
    pytest.importorskip("libtpu")
    specs = [small(), broken(), small("usp", MeshSpec(context=4, context_ulysses=2))]
    serial = aot.compare(specs, cache=str(tmp_path / "serial"))  # workers=None: here, one after another
    pooled = aot.compare(specs, workers=2, cache=str(tmp_path / "pool"), progress="plain")
    assert [r.status for r in pooled] == ["compiled", "failed", "compiled"], pooled
    assert [without_time(r) for r in pooled] == [without_time(r) for r in serial]
    assert "no TPU topology" in pooled[1].reason  # the broken point is a row, the others still answered
    first = entries(tmp_path / "pool")
    assert sorted(first) == sorted(entries(tmp_path / "serial")) and len(first) == 2  # one program hash

    again = pool.compile_all(specs, workers=2, cache_at=str(tmp_path / "pool"), progress="plain")
    assert [hit for _, hit in again] == [True, False, True]  # the failed one was not cached: tried again
    assert [got for got, _ in again] == [r.result for r in pooled]  # compile_s too: read back, not compiled
    assert entries(tmp_path / "pool") == first  # nothing rewritten


@pytest.mark.slow
def test_draws_compile_in_their_own_processes_and_the_worst_judges(tmp_path, local_ray):
    pytest.importorskip("libtpu")
    spec, where = small(), tmp_path / "draws"
    [row] = aot.compare([spec], workers=2, cache=str(where), progress="plain", draws=2)
    stem = f"{spec.trial_id}-tpu7x_2x2x1-{row.result.program}"
    assert sorted(entries(where)) == [f"{stem}.draw2.json", f"{stem}.json"]  # one entry per draw
    each = [cache.read(where / n) for n in (f"{stem}.json", f"{stem}.draw2.json")]
    assert row.result.draw_bytes == tuple(d.device_peak for d in each)
    assert row.result.device_peak == max(row.result.draw_bytes)  # judged by the worst draw
    assert "2 draws" in row.reason and row.verdict == "run"
    again = pool.compile_all([spec], workers=2, cache_at=str(where), progress="plain", draws_per_point=2)
    assert again == [(row.result, True)]  # every draw read back: nothing compiled


def test_the_pool_compiles_on_the_ray_it_is_given_and_starts_none(fresh_ray):
    """One Ray starter (launch/cluster.py): without a Ray up, the pool says so instead of starting one."""
    with pytest.raises(RuntimeError, match="join_or_start"):
        pool.compile_all([small()], workers=1, progress="plain")
    assert not fresh_ray.is_initialized()


@pytest.mark.slow
def test_a_gs_cache_is_shared_between_runs(tmp_path, monkeypatch, gcs, fresh_ray):
    pytest.importorskip("libtpu")
    uri, spec = f"gs://{BUCKET}/team/aot", small()
    cluster.join_or_start(spec.cluster, 1)
    [(got, hit)] = pool.compile_all([spec], workers=1, cache_at=uri, progress="plain")
    assert got.status == "compiled" and not hit, got
    [blob] = gcs_client(gcs).list_blobs(BUCKET)
    assert blob.name == f"team/aot/{spec.trial_id}-tpu7x_2x2x1-{got.program}.json"
    assert aot.CompileResult.from_json(blob.download_as_text()) == got

    # a fresh local state: another Ray, another working directory, an empty local cache
    fresh_ray.shutdown()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(cache.ENV, str(tmp_path / "local"))
    cluster.join_or_start(spec.cluster, 1)
    [(again, hit)] = pool.compile_all([spec], workers=1, cache_at=uri, progress="plain")
    assert hit and again == got
    assert not (tmp_path / "local").exists()
    with cache.using(uri):
        assert aot.cached_any(spec)  # the driver's listing reads the bucket too


def test_the_cache_reads_and_lists_a_bucket(monkeypatch, gcs):
    """cache_path, read, write, cached_any and cached_caps on gs:// (the program hash, a lowering, stubbed)."""
    monkeypatch.setattr(cache, "program_version", lambda spec, topology=None: "abcd1234")
    spec = small()
    got = aot.CompileResult(
        trial_id=spec.trial_id, topology="tpu7x:2x2x1", peak_bytes=123, program="abcd1234"
    )
    with cache.using(f"gs://{BUCKET}/shared/"):
        path = aot.cache_path(spec)
        assert path == f"gs://{BUCKET}/shared/{spec.trial_id}-tpu7x_2x2x1-abcd1234.json"
        assert not aot.cached_any(spec) and cache.read(path) is None
        cache.write(path, got)
        cache.write(aot.cache_path(spec, cap_mib=4096), replace(got, cap_mib=4096))
        storage.write_text(f"gs://{BUCKET}/shared/deeper/{spec.trial_id}-x.json", "{}")  # not in this prefix
        assert aot.cached_any(spec) and aot.cached_caps(spec) == [4096]
        assert cache.read(path) == got and aot.compiled_memory(spec) == got
        assert not aot.cached_any(replace(spec, context_length=4096))
    names = storage.list_names(f"gs://{BUCKET}/shared", spec.trial_id)
    assert names == [f"{spec.trial_id}-tpu7x_2x2x1-abcd1234.cap4096.json", Path(path).name]


def test_workers_get_the_cache_and_libtpus_switch(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_tpu_scoped_vmem_limit_kib=65536")
    env = pool.worker_env("rel/aot")
    assert env[cache.ENV] == str(tmp_path / "rel" / "aot")  # absolute: a worker has its own working directory
    assert env["ALLOW_MULTIPLE_LIBTPU_LOAD"] == "1" and env["JAX_PLATFORMS"] == "cpu"
    assert env["LIBTPU_INIT_ARGS"] == "--xla_tpu_scoped_vmem_limit_kib=65536"
    assert pool.worker_env("gs://b/p/")[cache.ENV] == "gs://b/p"
    monkeypatch.setenv(cache.ENV, "somewhere")
    assert pool.worker_env("")[cache.ENV] == str(tmp_path / "somewhere")  # "": the driver's own cache


def test_the_host_memory_estimate_grows_with_context_length_and_is_capped():
    lengths = [2048, 65_536, 1_048_576, 14_680_064]
    tiny = [compile_host_bytes(small(length=n)) for n in lengths]
    wide = [compile_host_bytes(small(length=n, embed=4096)) for n in lengths]
    assert tiny == sorted(tiny) and wide == sorted(wide) and wide[-1] > wide[0]
    assert all(FLOOR_BYTES <= t <= w for t, w in zip(tiny, wide, strict=True))
    # over every measured compile: the tiny model's 1.9 GiB at 1M tokens, Llama widths' 8.2 GiB at 14M
    assert 1.9 * GIB < tiny[2] < 3 * GIB and 8.2 * GIB < wide[-1] < 10 * GIB
    assert compile_host_bytes(small(length=14_680_064, embed=4096), cap=4 * GIB) == 4 * GIB
    assert compile_host_bytes(small(), cap=100 * GIB) == tiny[0]  # a cap above the need changes nothing
